"""What ``graphormer-train`` runs (#19): one run, an ensemble (``ensemble.size``), or a
resampling (``cv.folds``, ``cv.replicates``) of either, each run ending with its calibration."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from graphormer.data.sources import build_source
from graphormer.errors import ConfigError
from graphormer.training.crossval import cross_validate
from graphormer.training.ensemble import train_calibrated, train_ensemble
from graphormer.training.settings import RunSettings

__all__ = ["fit"]


def fit(
    settings: RunSettings, loggers_for: Callable[[Path], list[Any]] | None = None
) -> dict[str, Any]:
    """Trains as ``settings`` say; returns what the top ``metrics.json`` (or
    ``cv_metrics.json``) holds. ``loggers_for(folder)`` builds the loggers of a run folder.

    The dataset's source is built once here and passed down to the run (or the ensemble's
    members); a cross-validation's folds each have a split of their own, and so a source."""
    source = build_source(settings.dataset)
    if settings.calibration != "none":
        task = source.task_info()
        if not task.is_classification:
            raise ConfigError(
                f"calibration={settings.calibration} calibrates binary probabilities, but "
                f"{task.name} is a {task.task_type} task: drop calibration= (regression runs "
                "always store their conformal intervals' calibration)"
            )
    if settings.cv.enabled:
        return cross_validate(settings, lambda one: fit(one, loggers_for), source)
    if settings.ensemble.size > 1:
        return train_ensemble(settings, loggers_for, source=source)
    loggers = loggers_for(Path(settings.output_dir)) if loggers_for else None
    return train_calibrated(settings, loggers, source=source)
