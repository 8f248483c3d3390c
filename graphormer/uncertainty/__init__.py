"""Uncertainty in one place: the spread of ensembles and MC-dropout passes (run by
:mod:`graphormer.runner`), calibration (temperature, isotonic) and conformal intervals, and the
report of how sure predictions were (coverage, Spearman, ECE)."""

from graphormer.portable.calibration import (
    CALIBRATION_FILE,
    CALIBRATIONS,
    Calibration,
    conformal_radius,
    expected_calibration_error,
    fit_isotonic,
    fit_temperature,
)
from graphormer.uncertainty.calibration import calibration_of
from graphormer.uncertainty.intervals import calibrated, check_interval
from graphormer.uncertainty.report import (
    REPORTED_LEVELS,
    coverage,
    spearman,
    uncertainty_report,
)

__all__ = [
    "CALIBRATIONS",
    "CALIBRATION_FILE",
    "REPORTED_LEVELS",
    "Calibration",
    "calibrated",
    "calibration_of",
    "check_interval",
    "conformal_radius",
    "coverage",
    "expected_calibration_error",
    "fit_isotonic",
    "fit_temperature",
    "spearman",
    "uncertainty_report",
]
