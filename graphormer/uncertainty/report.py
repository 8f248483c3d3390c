"""How sure a model's predictions were, on a labelled split: interval coverage and width,
Spearman's correlation of the spread with the error, and the ECE of probabilities before and
after calibration. Any estimator's spread (ensemble, MC dropout, a mean-variance or
evidential head) is reported the same way."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from graphormer.errors import ConfigError
from graphormer.portable.calibration import expected_calibration_error

__all__ = ["REPORTED_LEVELS", "coverage", "spearman", "uncertainty_report"]

# Interval levels eval.py reports (coverage and mean width on the test split).
REPORTED_LEVELS = (0.8, 0.9, 0.95)


def coverage(y: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> float:
    """The fraction of labelled ``y`` (NaN: unlabelled) inside ``[lower, upper]``."""
    keep = ~np.isnan(y)
    if not keep.any():
        return float("nan")
    return float(((y[keep] >= lower[keep]) & (y[keep] <= upper[keep])).mean())


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's rank correlation (average ranks for ties)."""
    import pandas as pd

    ra = pd.Series(a).rank().to_numpy()
    rb = pd.Series(b).rank().to_numpy()
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def uncertainty_report(
    task: Any,
    task_names: Sequence[str],
    y: np.ndarray,
    mean: np.ndarray,
    std: np.ndarray | None,
    calibration: Any | None,
    spread: str | None,
) -> dict[str, Any]:
    """How sure the predictions of one split were: regression, each task's interval coverage and
    mean width at :data:`REPORTED_LEVELS` (with a calibration) and Spearman's correlation of the
    spread with the absolute error (with a spread); binary, each task's ECE before and after the
    run's calibration."""
    found: dict[str, Any] = {}
    if task.is_multiclass:
        return found  # no intervals or calibration for class probabilities
    if task.is_classification:
        after = calibration.calibrate(mean) if calibration is not None else None
        found["calibration"] = calibration.method if calibration is not None else "none"
        found["ece_before"] = {}
        found["ece_after"] = {}
        for t, name in enumerate(task_names):
            found["ece_before"][name] = expected_calibration_error(mean[:, t], y[:, t])
            if after is not None:
                found["ece_after"][name] = expected_calibration_error(after[:, t], y[:, t])
        if after is None:
            del found["ece_after"]
        return found
    if std is not None:
        found["std_error_spearman"] = {}
        for t, name in enumerate(task_names):
            keep = ~np.isnan(y[:, t])
            error = np.abs(y[keep, t] - mean[keep, t])
            found["std_error_spearman"][name] = spearman(std[keep, t], error)
    if calibration is not None:
        found["interval_scores"] = calibration.interval_kind(spread)
        found["intervals"] = {}
        for level in REPORTED_LEVELS:
            try:
                lower, upper = calibration.intervals(mean, std, level, spread)
            except ConfigError:  # too few validation molecules for this level
                continue
            entry = {}
            for t, name in enumerate(task_names):
                keep = ~np.isnan(y[:, t])
                inside = (y[keep, t] >= lower[keep, t]) & (y[keep, t] <= upper[keep, t])
                entry[name] = {
                    "coverage": float(inside.mean()) if keep.any() else float("nan"),
                    "mean_width": float((upper[keep, t] - lower[keep, t]).mean()),
                }
            found["intervals"][str(level)] = entry
    return found
