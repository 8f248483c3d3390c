"""Calibration of a trained run's outputs: its home is :mod:`graphormer.uncertainty.calibration`
(on the numpy core of :mod:`graphormer.portable.calibration`); this module keeps the names
importable where they have always been."""

from graphormer.uncertainty.calibration import (
    CALIBRATION_FILE,
    CALIBRATIONS,
    Calibration,
    calibration_of,
    conformal_radius,
    expected_calibration_error,
    fit_isotonic,
    fit_temperature,
)

__all__ = [
    "CALIBRATIONS",
    "CALIBRATION_FILE",
    "Calibration",
    "calibration_of",
    "conformal_radius",
    "expected_calibration_error",
    "fit_isotonic",
    "fit_temperature",
]
