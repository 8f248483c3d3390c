"""What ``graphormer-train`` runs (#19): one run, an ensemble (``ensemble.size``), or a
resampling (``cv.folds``, ``cv.replicates``) of either, each run ending with its calibration."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from graphormer.data.sources import build_source
from graphormer.data.tasks import TaskInfo
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
    if settings.ensemble.size > 1:
        _refuse_atom_targets(source.task_info())
    if settings.cv.enabled:
        return cross_validate(settings, lambda one: fit(one, loggers_for))
    if settings.ensemble.size > 1:
        return train_ensemble(settings, loggers_for, source=source)
    loggers = loggers_for(Path(settings.output_dir)) if loggers_for else None
    return train_calibrated(settings, loggers, source=source)


def _refuse_atom_targets(task: TaskInfo) -> None:
    """Ensembles score molecule predictions (#19); atom and bond targets (#18) are trained one
    model at a time, so far (a cross-validation's folds are single models: it takes them)."""
    # Auxiliary atom targets (issue #22) serve the molecule targets: every member trains them.
    task = task.without_auxiliary()
    if task.item_levels:
        level = task.item_levels[0].name
        raise ConfigError(
            f"ensemble.size > 1 trains molecule targets only: a model of {level} targets "
            f"(dataset.{level}_targets) is trained one at a time; set ensemble.size=1 (cv.* "
            "resamples such a model)"
        )
