"""Intervals and calibrated values of a prediction, from the run's calibration (conformal
radii of regression residuals, scaled by the spread of an ensemble, MC dropout or a
mean-variance / evidential head where the calibration was fitted with one)."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphormer.errors import ConfigError
from graphormer.portable.calibration import Calibration, conformal_radius

__all__ = ["calibrated", "check_interval", "interval_levels", "item_intervals"]


def interval_levels(task: Any) -> list:
    """The item levels of ``task`` that get intervals: its regression atom (bond) levels of one
    value an item (per-atom vectors have none yet)."""
    return [v for v in task.item_levels if v.task_type(task) == "regression" and v.components == 1]


def check_interval(
    task: Any, calibration: Calibration | None, interval: Any, mc_dropout: int = 0
) -> None:
    """Raises :class:`ConfigError` naming ``interval`` (and the fix) when a model of ``task``
    with ``calibration`` cannot give intervals at that level (of its regression molecule
    targets, and of each regression atom or bond level)."""
    molecules = task.num_tasks > 0 and not (task.is_classification or task.is_multiclass)
    levels = interval_levels(task)
    if not molecules and not levels:
        raise ConfigError(
            f"interval={interval} is for regression models; this one predicts "
            "probabilities (calibrated with the run's calibration, if it has one)"
        )
    found = [calibration.level(v.name) if calibration is not None else None for v in levels]
    if calibration is None or (molecules and calibration.residual is None) or None in found:
        raise ConfigError(
            f"interval={interval} needs the run's calibration (calibration.json beside "
            "checkpoints/, written at the end of training, for these very weights): give "
            "ckpt= the run folder or a checkpoint inside its checkpoints/ folder"
        )
    if isinstance(interval, bool) or not isinstance(interval, int | float):
        raise ConfigError(f"interval={interval!r} is not allowed: a level in (0, 1), e.g. 0.9")
    passes = calibration.mc_passes
    if mc_dropout and passes is not None and mc_dropout != passes:
        # The spread of K passes is another estimator for each K: the intervals' coverage
        # holds for the number of passes they were calibrated with.
        raise ConfigError(
            f"interval={interval} with mc_dropout={mc_dropout}: the run's intervals "
            f"were calibrated with {passes} MC-dropout passes; give mc_dropout={passes}, or "
            "drop mc_dropout for intervals from the plain residuals"
        )
    # Too few validation molecules (atoms, bonds) for this level: said before anything runs.
    for scores in [
        *(calibration.residual[:1] if molecules else []),
        *(f.residual[0] for f in found),
    ]:
        conformal_radius(np.asarray(scores), float(interval))


def item_intervals(
    result: Any, task: Any, calibration: Calibration | None, interval: float, spread: str | None
) -> None:
    """Adds each regression atom (bond) level's intervals at ``interval`` to ``result``'s
    ``item_extras`` (``lower``, ``upper``: one ``[n_items, T]`` array per molecule), from that
    level's validation scores (normalised by the spread where they were fitted with one)."""
    for level in task.item_levels:
        fitted = calibration.level(level.name) if calibration is not None else None
        if fitted is None:
            continue
        extras = result.item_extras.setdefault(level.name, {})
        spreads = extras.get("std") or [None] * len(result.errors)
        lower, upper = [], []
        for values, std in zip(getattr(result, f"{level.name}s"), spreads, strict=True):
            if values is None:
                lower.append(None)
                upper.append(None)
                continue
            low, high = fitted.intervals(values, std, interval, spread if std is not None else None)
            lower.append(low.astype(np.float32))
            upper.append(high.astype(np.float32))
        extras["lower"], extras["upper"] = lower, upper


def calibrated(
    values: np.ndarray,
    std: np.ndarray | None,
    calibration: Calibration | None,
    interval: float | None,
    spread: str | None,
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
    """``values`` with the run's calibration applied (binary probabilities), and the intervals
    ``(lower, upper)`` at level ``interval`` (regression; None when not asked for), float32."""
    if interval is not None and calibration.task_type == "regression":
        lower, upper = calibration.intervals(values, std, interval, spread)
        bounds = (lower.astype(np.float32), upper.astype(np.float32))
    else:
        bounds = None
    if calibration is not None and calibration.calibrates_probabilities:
        values = calibration.calibrate(values).astype(np.float32)
    return values, bounds
