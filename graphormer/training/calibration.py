"""Calibration of a trained run's outputs: its home is :mod:`graphormer.portable.calibration`
(numpy only, so that the ONNX predictor reads a run's calibration without torch); this module
keeps the names importable where they have always been."""

from graphormer.portable.calibration import (
    CALIBRATION_FILE,
    CALIBRATIONS,
    Calibration,
    conformal_radius,
    expected_calibration_error,
    fit_isotonic,
    fit_temperature,
)

__all__ = [
    "CALIBRATIONS",
    "CALIBRATION_FILE",
    "Calibration",
    "conformal_radius",
    "expected_calibration_error",
    "fit_isotonic",
    "fit_temperature",
]
