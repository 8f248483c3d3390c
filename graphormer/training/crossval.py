"""Resampling (#19): K-fold cross-validation (``cv.folds``) and N seeded random splits
(``cv.replicates``), each an ordinary run (or ensemble) in ``RUN/folds/<k>/``, summarised in
``RUN/cv_metrics.json``.

Folds keep each Bemis-Murcko scaffold whole (the source's :meth:`split_groups`) and, for binary
and multi-class tasks, spread the positives (each class) evenly where the groups allow. Fold ``k`` is the test split, fold
``k + 1`` the validation split and the others train; the split is written as the run's
``split.json`` (``dataset.split_file``), so each fold is a normal run that ``eval.py`` rebuilds.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from graphormer.console import report
from graphormer.data.sources import build_source
from graphormer.errors import ConfigError, DataError
from graphormer.outputs import atomic_path

__all__ = ["CV_FILE", "assign_folds", "cross_validate", "format_cv_table"]

CV_FILE = "cv_metrics.json"
FOLDS_DIR = "folds"


def assign_folds(
    groups: Sequence[str], folds: int, positives: np.ndarray | None = None
) -> np.ndarray:
    """The fold of each item: whole groups, the largest first, each to the fold that is
    furthest below its share of items (and of positives, when ``positives`` ``[n]`` marks them;
    of each class, when ``positives`` ``[n, C]`` marks the classes)."""
    if positives is not None and positives.ndim == 2:
        return _assign_folds_by_class(groups, folds, positives)
    members: dict[str, list[int]] = defaultdict(list)
    for i, key in enumerate(groups):
        members[key].append(i)
    ordered = sorted(members.values(), key=lambda g: (-len(g), g[0]))
    n = len(groups)
    total_pos = float(positives.sum()) if positives is not None else 0.0
    size = np.zeros(folds)
    pos = np.zeros(folds)
    fold_of = np.empty(n, dtype=np.int64)
    for group in ordered:
        fill = size / (n / folds)
        if positives is not None and total_pos > 0:
            fill = fill + pos / (total_pos / folds)
        f = int(np.argmin(fill))
        fold_of[group] = f
        size[f] += len(group)
        if positives is not None:
            pos[f] += positives[group].sum()
    return fold_of


def _assign_folds_by_class(groups: Sequence[str], folds: int, classes: np.ndarray) -> np.ndarray:
    """:func:`assign_folds` with classes ``[n, C]`` (one-hot): each fold gets about its share
    of every class (stratified folds of a multi-class task)."""
    members: dict[str, list[int]] = defaultdict(list)
    for i, key in enumerate(groups):
        members[key].append(i)
    ordered = sorted(members.values(), key=lambda g: (-len(g), g[0]))
    share = np.maximum(classes.sum(0), 1.0) / folds  # [C]
    size = np.zeros(folds)
    count = np.zeros((folds, classes.shape[1]))
    fold_of = np.empty(len(groups), dtype=np.int64)
    for group in ordered:
        group_classes = classes[group].sum(0)  # [C]
        # Fill after adding the group, in the classes it holds, plus the fold's size.
        fill = size / (len(groups) / folds) + ((count + group_classes) / share) @ (
            group_classes > 0
        )
        f = int(np.argmin(fill))
        fold_of[group] = f
        size[f] += len(group)
        count[f] += group_classes
    return fold_of


def _check_resampled(settings: Any, source: Any) -> None:
    """Refuses a cross-validation of a dataset whose split cannot (or must not) change."""
    cv = settings.cv
    key = "cv.folds" if cv.folds is not None else "cv.replicates"
    if source.official_split is not None:
        raise ConfigError(
            f"{key} resamples the split, but {source.name} has {source.official_split}: results "
            "on other splits are not comparable with published ones. Train on the official split "
            "(leave cv out), or use ensemble.size=N for several seeds on it"
        )
    accepted = set(inspect.signature(type(source)).parameters)
    needed = "split_file" if cv.folds is not None else "split_seed"
    if needed not in accepted:
        raise ConfigError(
            f"{key}: dataset.source={settings.dataset.get('source')} cannot take another split "
            f"(it has no dataset.{needed}); cross-validate a smiles_csv, tu or pyg_file dataset"
        )


def _fold_splits(settings: Any, source: Any, folder: Path) -> tuple[list[dict[str, Any]], bool]:
    """Each fold's dataset settings (its split written as ``folds/<k>/split.json``), and whether
    the folds keep groups (scaffolds) whole."""
    from graphormer.training.run import build_datamodule

    datamodule = build_datamodule(settings.dataset, settings.datamodule, settings.seed)
    datamodule.prepare_data()
    datamodule.setup("fit")
    dataset = datamodule.loaded.dataset
    groups = source.split_groups(dataset)
    grouped = groups is not None
    groups = groups if grouped else [str(i) for i in range(len(dataset))]
    task = datamodule.task
    positives = None
    if task.is_classification and task.num_tasks == 1:
        positives = (dataset.y.view(len(dataset), -1)[:, 0] == 1).numpy()
    elif task.is_multiclass:  # stratified: each class spread over the folds
        y = dataset.y.view(len(dataset), -1)[:, 0]
        labels = torch.nan_to_num(y, nan=-1).long()
        positives = (labels[:, None] == torch.arange(task.num_classes)).double().numpy()
    k = settings.cv.folds
    fold_of = assign_folds(groups, k, positives)
    if (np.bincount(fold_of, minlength=k) == 0).any():
        kept = f"{len(set(groups))} scaffold groups (each kept whole)" if grouped else ""
        raise ConfigError(
            f"cv.folds={k} is more than {task.name} allows: its {len(groups)} graphs form "
            f"{kept or f'{len(groups)} items'}, so some folds would be empty; give cv.folds <= "
            f"{len(set(groups))}, or use cv.replicates=N"
        )
    rows = source.input_rows(dataset).numpy()
    out = []
    for f in range(k):
        test, valid = f, (f + 1) % k
        split = {
            "train": sorted(int(r) for r in rows[(fold_of != test) & (fold_of != valid)]),
            "valid": sorted(int(r) for r in rows[fold_of == valid]),
            "test": sorted(int(r) for r in rows[fold_of == test]),
        }
        file = folder / FOLDS_DIR / str(f) / "split.json"
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(json.dumps(split) + "\n")
        values = {**settings.dataset, "split_file": str(file.resolve())}
        if "split" in inspect.signature(type(source)).parameters:
            values["split"] = "file"
        values.pop("split_column", None)
        out.append(values)
    for f, values in enumerate(out):
        _check_fold(settings, values, f)
    return out, grouped


def _check_fold(settings: Any, dataset: dict[str, Any], fold: int) -> None:
    """Reads fold (or replicate) ``fold``'s data as its run will, so that a split that cannot
    train or score (a class or a target missing from a small fold) fails before any fold
    trains, not hours later when its turn comes."""
    from graphormer.training.run import build_datamodule

    try:
        datamodule = build_datamodule(dataset, settings.datamodule, settings.seed)
        datamodule.prepare_data()
        datamodule.setup("fit")
    except DataError as error:
        cv = settings.cv
        if cv.folds is not None:
            key, fix = (
                f"cv.folds={cv.folds}",
                "Lower cv.folds (larger folds), or use cv.replicates=N",
            )
        else:
            key, fix = f"cv.replicates={cv.replicates}", "Change dataset.split_ratios or the data"
        raise ConfigError(
            f"{key}: fold {fold} cannot be trained and scored, so no fold was: {error}. {fix}"
        ) from error


def cross_validate(
    settings: Any, fit: Callable[[Any], dict[str, Any]], source: Any | None = None
) -> dict[str, Any]:
    """Trains one run (or ensemble) per fold or replicate into ``output_dir/folds/<k>`` with
    ``fit`` (settings -> metrics) and writes ``cv_metrics.json``: each fold's metrics, their
    mean and standard deviation. ``source``: the dataset's source, when the caller built it
    already (each fold builds its own, with its split)."""
    from graphormer.training.settings import CrossValidationSettings

    output_dir = Path(settings.output_dir)
    source = source if source is not None else build_source(settings.dataset)
    _check_resampled(settings, source)
    cv = settings.cv
    if cv.folds is not None:
        datasets, grouped = _fold_splits(settings, source, output_dir)
        kind = f"{cv.folds}-fold cross-validation ({'scaffold-grouped' if grouped else 'random'})"
    else:
        base = int(settings.dataset.get("split_seed") or 0)
        accepted = set(inspect.signature(type(source)).parameters)
        datasets = []
        for i in range(cv.replicates):
            values = {**settings.dataset, "split_seed": base + i}
            if "split" in accepted and values.get("split") not in ("random", "stratified"):
                values["split"] = "random"  # a seeded split (TU's stratified one stays)
            for key in ("split_column", "split_file"):
                values.pop(key, None)
            _check_fold(settings, values, i)
            datasets.append(values)
        kind = f"{cv.replicates} seeded random splits"
    report(f"{kind}: {len(datasets)} runs in {output_dir / FOLDS_DIR}")
    rows = []
    for f, dataset in enumerate(datasets):
        run = dataclasses.replace(
            settings,
            dataset=dataset,
            output_dir=output_dir / FOLDS_DIR / str(f),
            cv=CrossValidationSettings(),
        )
        report(f"fold {f + 1} of {len(datasets)}: {run.output_dir}")
        found = fit(run)
        rows.append(
            {
                "fold": f,
                "folder": f"{FOLDS_DIR}/{f}",
                "valid": found["valid"],
                "test": found["test"],
            }
        )
    # Every level's metrics: the first (the molecule metric, or an atom or bond model's first
    # level metric) heads the table, the others are reported beside it. Auxiliary atom targets
    # (issue #22) are trained, never a result.
    task = source.task_info().without_auxiliary()
    metric, *beside = task.level_metrics
    summary: dict[str, Any] = {"kind": kind, "metric": metric, "folds": rows}
    for split in ("valid", "test"):
        found = _mean_std([r[split].get(metric) for r in rows if r.get(split)])
        if found:
            summary[split] = found
    # Metrics reported beside the main one (accuracy of a binary TU task, issue #17).
    reported = {}
    for name in beside:
        splits = {}
        for split in ("valid", "test"):
            found = _mean_std([r[split].get(name) for r in rows if r.get(split)])
            if found:
                splits[split] = found
        if splits:
            reported[name] = splits
    if reported:
        summary["reported"] = reported
    path = output_dir / CV_FILE
    with atomic_path(path) as partial:
        partial.write_text(json.dumps(summary, indent=2) + "\n")
    report(format_cv_table(summary))
    report(f"cross-validation: {path.resolve()}")
    return summary


def _mean_std(values: list[float | None]) -> dict[str, float] | None:
    """Mean, sample std and count of the folds' values (folds without one left out)."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {
        "mean": float(np.mean(values)),
        "std": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
        "n": len(values),
    }


def format_cv_table(summary: dict[str, Any]) -> str:
    """Each fold's valid and test metric, then mean ± std."""
    metric = summary["metric"]
    lines = [f"{'fold':<10}{'valid ' + metric:>18}{'test ' + metric:>18}"]
    for row in summary["folds"]:
        valid = row["valid"][metric] if row.get("valid") else math.nan
        test = row["test"][metric] if row.get("test") else math.nan
        lines.append(f"{row['fold']:<10}{valid:>18.4f}{test:>18.4f}")
    cells = []
    for split in ("valid", "test"):
        found = summary.get(split)
        cells.append(f"{found['mean']:.4f} ± {found['std']:.4f}" if found else "-")
    lines.append(f"{'mean ± std':<10}{cells[0]:>18}{cells[1]:>18}")
    for name, splits in summary.get("reported", {}).items():
        cells = [
            f"{splits[split]['mean']:.4f} ± {splits[split]['std']:.4f}" if split in splits else "-"
            for split in ("valid", "test")
        ]
        lines.append(f"{name:<10}{cells[0]:>18}{cells[1]:>18}")
    return "\n".join(lines)
