"""Calibration of a run's outputs: temperature scaling and isotonic regression of binary
probabilities, conformal intervals of regression values. The numpy core lives in
:mod:`graphormer.portable.calibration` (torch-free, so that the ONNX predictor reads a run's
calibration without torch; :mod:`graphormer.uncertainty` re-exports it); this module adds what
reads a run's calibration beside its checkpoints."""

from __future__ import annotations

from pathlib import Path

from graphormer.console import report
from graphormer.portable.calibration import CALIBRATION_FILE, Calibration

__all__ = ["calibration_of"]


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
