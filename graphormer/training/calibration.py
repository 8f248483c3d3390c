"""Calibration of a trained run's outputs: its home is :mod:`graphormer.uncertainty` (on the
numpy core of :mod:`graphormer.portable.calibration`); this module keeps the names importable
where they have always been, looked up there (one list of them, the package's)."""

from typing import Any

import graphormer.uncertainty as _home

__all__ = list(_home.__all__)


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(_home, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
