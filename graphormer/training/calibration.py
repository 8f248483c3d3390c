"""Calibration of a trained run's outputs: its home is :mod:`graphormer.uncertainty.calibration`
(on the numpy core of :mod:`graphormer.portable.calibration`); this module keeps the names
importable where they have always been."""

from graphormer.uncertainty.calibration import *  # noqa: F403 (the names, re-exported)
from graphormer.uncertainty.calibration import __all__  # noqa: F401
