"""Calibration of a run's outputs: temperature scaling and isotonic regression of binary
probabilities, conformal intervals of regression values. The numpy core lives in
:mod:`graphormer.portable.calibration` (torch-free, so that the ONNX predictor reads a run's
calibration without torch); this is its home in the uncertainty package."""

from __future__ import annotations

from pathlib import Path

from graphormer.console import report
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
    "calibration_of",
    "conformal_radius",
    "expected_calibration_error",
    "fit_isotonic",
    "fit_temperature",
]


def calibration_of(folder: Path | None, records: list) -> Calibration | None:
    """The run's ``calibration.json`` when it was fitted for exactly these weights."""
    if folder is None or not (folder / CALIBRATION_FILE).is_file():
        return None
    found = Calibration.load(folder / CALIBRATION_FILE)
    digests = [r.meta.get("weights_sha256") for r in records]
    if not found.fits(digests):
        report(
            f"WARNING: {folder / CALIBRATION_FILE} was fitted for other weights (other or fewer "
            "members): not used"
        )
        return None
    return found
