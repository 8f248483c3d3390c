"""Ensembles (#19): members that differ only in seed, trained into one run folder, and scored or
applied together (the mean of regression outputs, the mean of probabilities, and their spread).

An ensemble's folder::

    RUN/ensemble.json       size, seeds, each member's folder and state (trained, failed)
    RUN/members/<i>/        member i: an ordinary run folder (checkpoints/, metrics.json, ...)
    RUN/metrics.json        the ensemble's metrics and each member's
    RUN/calibration.json    fitted on the validation split with the ensemble's predictions

``eval.py ckpt=RUN`` and ``predict.py ckpt=RUN`` use every member (:func:`resolve_members`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from graphormer.checkpoint import CheckpointError
from graphormer.console import report
from graphormer.errors import ConfigError
from graphormer.outputs import atomic_path

__all__ = [
    "ENSEMBLE_FILE",
    "MEMBERS_DIR",
    "Members",
    "best_checkpoint",
    "check_members",
    "member_outputs",
    "resolve_members",
    "spearman",
    "train_ensemble",
    "uncertainty_report",
]

log = logging.getLogger(__name__)

MEMBERS_DIR = "members"
ENSEMBLE_FILE = "ensemble.json"
# Interval levels eval.py reports (coverage and mean width on the test split).
REPORTED_LEVELS = (0.8, 0.9, 0.95)


@dataclass
class Members:
    """The checkpoints a ``ckpt=`` names.

    Attributes:
        paths: one best checkpoint per member found (one for a plain run).
        folder: the run or ensemble folder (where ``calibration.json`` lives); None for a list of
            checkpoint files.
        missing: what is wrong with each member that is not there.
    """

    paths: list[Path]
    folder: Path | None = None
    missing: list[str] = field(default_factory=list)


def best_checkpoint(run_dir: Path) -> Path | None:
    """A run folder's best checkpoint: the one its ``metrics.json`` names (looked up in its own
    ``checkpoints/``, so that a moved folder still works), else its newest ``best-*.ckpt``."""
    folder = run_dir / "checkpoints"
    metrics = run_dir / "metrics.json"
    if metrics.is_file():
        try:
            named = json.loads(metrics.read_text()).get("best_checkpoint")
        except (ValueError, AttributeError):
            named = None
        if isinstance(named, str) and (folder / Path(named).name).is_file():
            return folder / Path(named).name
    found = sorted(folder.glob("best-*.ckpt"), key=lambda p: p.stat().st_mtime_ns)
    return found[-1] if found else None


def resolve_members(ckpt: Any, allow_missing: bool = False) -> Members:
    """The checkpoints ``ckpt`` names: a checkpoint file, a list of them, a run folder (its best
    checkpoint) or an ensemble's folder (each member's best checkpoint). A member without a
    checkpoint (failed, interrupted, deleted) is named, and refused unless ``allow_missing``."""
    if isinstance(ckpt, list | tuple):
        if not ckpt:
            raise ConfigError("ckpt=[] names no checkpoint: give a file, a run folder or a list")
        if len(ckpt) == 1:
            return resolve_members(ckpt[0], allow_missing)
        paths = [Path(str(p)).expanduser() for p in ckpt]
        folders = [p for p in paths if p.is_dir()]
        if folders:
            raise ConfigError(
                f"ckpt=[...] lists the folder {folders[0]}: a list names checkpoint files; give a "
                "run folder alone as ckpt=FOLDER"
            )
        return Members(paths)
    path = Path(str(ckpt)).expanduser()
    if not path.is_dir():
        return Members([path], folder=_run_dir_of(path))
    description = path / ENSEMBLE_FILE
    if not description.is_file():
        best = best_checkpoint(path)
        if best is None:
            raise CheckpointError(
                f"ckpt={path} is a folder without a best checkpoint (checkpoints/best-*.ckpt) or "
                f"an ensemble ({ENSEMBLE_FILE}): give a run folder train.py wrote, or a file"
            )
        return Members([best], folder=path)
    try:
        size = int(json.loads(description.read_text())["size"])
    except (ValueError, KeyError, TypeError) as error:
        raise CheckpointError(f"{description} cannot be read ({error}): it was damaged") from error
    paths, missing = [], []
    for i in range(size):
        member = path / MEMBERS_DIR / str(i)
        best = best_checkpoint(member) if member.is_dir() else None
        if best is None:
            missing.append(f"member {i} ({member}) has no best checkpoint")
        else:
            paths.append(best)
    if missing and (not allow_missing or not paths):
        advice = (
            "ensemble.allow_missing=true scores the others"
            if paths
            else "no member is left to score"
        )
        raise CheckpointError(
            f"ensemble {path}: {'; '.join(missing)} (it failed, was interrupted or was "
            f"removed): train it again, or {advice}"
        )
    for text in missing:
        report(f"WARNING: ensemble {path}: {text}; scoring the other {len(paths)} member(s)")
    return Members(paths, folder=path, missing=missing)


def _run_dir_of(path: Path) -> Path | None:
    from graphormer.rundir import run_dir_of

    return run_dir_of(path)


def check_members(records: Sequence[Any], modules: Sequence[Any]) -> None:
    """Members are combined only when they predict the same tasks from the same featurisation:
    same task, same model inputs, same structural settings."""
    first = modules[0]
    for record, module in zip(records[1:], modules[1:], strict=True):
        if module.task != first.task:
            raise CheckpointError(
                f"checkpoint {record.path} predicts {module.task}, but {records[0].path} "
                f"predicts {first.task}: an ensemble's members share one task"
            )
        hops = [
            (m.hparams.get("data") or {}).get("datamodule", {}).get("max_hops")
            for m in (first, module)
        ]
        if hops[0] != hops[1]:
            raise CheckpointError(
                f"checkpoint {record.path} reads paths of {hops[1]} hops but {records[0].path} "
                f"of {hops[0]}: an ensemble's members share the structural settings"
            )


def member_outputs(
    modules: Sequence[Any],
    datamodule: Any,
    split: str,
    trainer: Any,
    mc_passes: int = 0,
    seed: int = 0,
) -> np.ndarray:
    """``[M, n, T]`` predictions of every member (probabilities for binary tasks) for ``split``,
    in its order; with ``mc_passes`` K, each member contributes K passes with dropout on."""
    from graphormer.training.evaluation import predict_split

    outputs = []
    for module in modules:
        for k in range(max(1, mc_passes)):
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed + k)
                pred = predict_split(trainer, module, datamodule, split, dropout=mc_passes > 0)
            if module.task.is_classification:
                pred = torch.sigmoid(pred)
            outputs.append(pred.float().numpy())
    return np.stack(outputs)


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
    if task.is_classification:
        after = calibration.calibrate(mean) if calibration is not None else None
        found["calibration"] = calibration.method if calibration is not None else "none"
        found["ece_before"] = {}
        found["ece_after"] = {}
        from graphormer.training.calibration import expected_calibration_error

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


# -- training -------------------------------------------------------------------------------


def _member_settings(settings: Any, i: int) -> Any:
    from graphormer.training.settings import EnsembleSettings

    return dataclasses.replace(
        settings,
        output_dir=Path(settings.output_dir) / MEMBERS_DIR / str(i),
        seed=settings.seed + i,
        ensemble=EnsembleSettings(),
    )


def _write_json(path: Path, values: dict[str, Any]) -> None:
    with atomic_path(path) as partial:
        partial.write_text(json.dumps(values, indent=2) + "\n")


def _write_member_configs(output_dir: Path, members: list[Any]) -> None:
    """Each member's composed config (``members/<i>/.hydra/config.yaml``: the run's, with the
    member's seed), so that ``train.py ckpt_path=RUN/members/<i>/checkpoints/last.ckpt``
    resumes that member exactly, as any run."""
    config = output_dir / ".hydra" / "config.yaml"
    if not config.is_file():  # called as a library function: no composed config to copy
        return
    from omegaconf import OmegaConf

    stored = OmegaConf.load(config)
    for member in members:
        values = OmegaConf.merge(
            stored, {"seed": member.seed, "ensemble": {"size": 1, "parallel": False}}
        )
        target = Path(member.output_dir) / ".hydra" / "config.yaml"
        target.parent.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(values, target)


def _train_member(settings: Any, device: int | None) -> dict[str, Any]:
    """One member in a process of its own (``ensemble.parallel``), on GPU ``device``."""
    from graphormer.training.run import train

    if device is not None:
        trainer = dataclasses.replace(settings.trainer, accelerator="gpu", devices=[device])
        settings = dataclasses.replace(settings, trainer=trainer)
    return train(settings)


def train_ensemble(
    settings: Any, loggers_for: Callable[[Path], list[Any]] | None = None
) -> dict[str, Any]:
    """Trains ``settings.ensemble.size`` members (seeds ``seed``, ``seed + 1``, ...) into
    ``output_dir/members/<i>``, one after another (or at once, one GPU each, with
    ``ensemble.parallel``), then scores the ensemble on the validation and test splits, fits its
    calibration and writes the top ``metrics.json``; returns what it holds.

    A member that fails is reported and recorded in ``ensemble.json``; the others still train,
    and the ensemble is scored without it only with ``ensemble.allow_missing``.
    """
    from graphormer.errors import UserFacingError
    from graphormer.training.run import train

    output_dir = Path(settings.output_dir)
    size = settings.ensemble.size
    members = [_member_settings(settings, i) for i in range(size)]
    state: dict[str, Any] = {
        "size": size,
        "seeds": [m.seed for m in members],
        "members": [f"{MEMBERS_DIR}/{i}" for i in range(size)],
        "failed": {},
    }
    output_dir.mkdir(parents=True, exist_ok=True)
    _write_json(output_dir / ENSEMBLE_FILE, state)
    _write_member_configs(output_dir, members)
    results: list[dict[str, Any] | None] = [None] * size
    if settings.ensemble.parallel:
        results = _train_parallel(members, state)
    else:
        for i, member in enumerate(members):
            report(f"ensemble member {i + 1} of {size} (seed {member.seed}): {member.output_dir}")
            try:
                loggers = loggers_for(member.output_dir) if loggers_for else None
                results[i] = train(member, loggers=loggers)
            except (UserFacingError, RuntimeError) as error:
                first = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
                state["failed"][str(i)] = first
                report(f"WARNING: ensemble member {i} failed: {first}")
    _write_json(output_dir / ENSEMBLE_FILE, state)
    if state["failed"] and not settings.ensemble.allow_missing:
        failed = ", ".join(f"{i} ({why})" for i, why in state["failed"].items())
        raise ConfigError(
            f"ensemble member(s) {failed} failed; the others are in {output_dir / MEMBERS_DIR}. "
            "Fix the cause and train again, or pass ensemble.allow_missing=true to score the "
            "members that trained"
        )
    return score_ensemble(output_dir, settings, results, state)


def _train_parallel(members: list[Any], state: dict[str, Any]) -> list[dict[str, Any] | None]:
    import concurrent.futures
    import multiprocessing

    visible = torch.cuda.device_count()
    if visible < len(members):
        raise ConfigError(
            f"ensemble.parallel=true trains each member on a GPU of its own: {len(members)} "
            f"members need {len(members)} visible GPUs, found {visible}; leave "
            "ensemble.parallel=false (members train one after another)"
        )
    results: list[dict[str, Any] | None] = [None] * len(members)
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(len(members), mp_context=context) as pool:
        futures = {pool.submit(_train_member, m, i): i for i, m in enumerate(members)}
        for future in concurrent.futures.as_completed(futures):
            i = futures[future]
            try:
                results[i] = future.result()
            except Exception as error:  # reported per member, as in the sequential case
                first = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
                state["failed"][str(i)] = first
                report(f"WARNING: ensemble member {i} failed: {first}")
    return results


def score_ensemble(
    output_dir: Path, settings: Any, results: list[dict[str, Any] | None], state: dict[str, Any]
) -> dict[str, Any]:
    """The ensemble's metrics on valid and test, its calibration (``calibration.json``) and the
    top ``metrics.json``."""
    from graphormer.training.evaluation import score_members

    paths = [Path(r["best_checkpoint"]) for r in results if r is not None]
    scored = score_members(
        paths,
        splits=["valid", "test"],
        accelerator=settings.trainer.accelerator,
        fit_calibration=settings.calibration,
        calibration_dir=output_dir,
    )
    metric = scored["metric"]
    member_rows = []
    for i, r in enumerate(results):
        row: dict[str, Any] = {
            "member": i,
            "folder": f"{MEMBERS_DIR}/{i}",
            "seed": state["seeds"][i],
        }
        if r is None:
            row["failed"] = state["failed"].get(str(i), "missing")
        else:
            row.update(valid=r["valid"], test=r["test"], best_checkpoint=r["best_checkpoint"])
        member_rows.append(row)
    trained = [r for r in results if r is not None]
    members_mean = {
        split: (
            {metric: float(np.mean([r[split][metric] for r in trained]))}
            if all(r.get(split) for r in trained)
            else None
        )
        for split in ("valid", "test")
    }
    found = {
        "dataset": scored["dataset"],
        "metric": metric,
        "ensemble_size": state["size"],
        "valid": scored.get("valid"),
        "test": scored.get("test"),
        "members_mean": members_mean,
        "members": member_rows,
        "uncertainty": scored.get("uncertainty"),
        "calibration": scored.get("calibration"),
        "run_dir": str(output_dir.resolve()),
    }
    _write_json(output_dir / "metrics.json", found)
    test = found["test"][metric] if found["test"] else math.nan
    mean_test = members_mean["test"][metric] if members_mean["test"] else math.nan
    report(f"metrics: {(output_dir / 'metrics.json').resolve()}")
    report(
        f"ensemble of {len(trained)}: valid {metric} {found['valid'][metric]:.4f}  test {metric} "
        f"{test:.4f} (members' mean {mean_test:.4f})"
    )
    report(f"evaluate with: python scripts/eval.py ckpt={output_dir.resolve()}")
    return found
