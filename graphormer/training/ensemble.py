"""Ensembles (#19): members that differ only in seed, trained into one run folder, and scored
together (the mean of regression outputs, the mean of probabilities, and their spread).

An ensemble's folder::

    RUN/ensemble.json       size, seeds, each member's folder, the members that failed
    RUN/members/<i>/        member i: an ordinary run folder (checkpoints/, metrics.json, ...)
    RUN/metrics.json        the ensemble's metrics and each member's
    RUN/calibration.json    fitted on the validation split with the ensemble's predictions

``eval.py ckpt=RUN`` and ``predict.py ckpt=RUN`` use every member
(:func:`~graphormer.training.members.resolve_members`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from graphormer.console import command, quietly, report
from graphormer.errors import ConfigError, UserFacingError
from graphormer.outputs import atomic_path
from graphormer.portable.calibration import CALIBRATION_FILE
from graphormer.rundir import is_first_process, newest_checkpoint
from graphormer.training.evaluation import calibration_lines, score_members
from graphormer.training.members import ENSEMBLE_FILE, MEMBERS_DIR, best_checkpoint
from graphormer.training.run import train

__all__ = ["score_ensemble", "train_calibrated", "train_ensemble"]


def train_calibrated(
    settings: Any, loggers: list[Any] | None = None, source: Any | None = None
) -> dict[str, Any]:
    """One run (:func:`~graphormer.training.train`), then its calibration fitted on the
    validation split with the best checkpoint: ``calibration.json`` beside ``checkpoints/``.
    ``source``: the dataset's source, when the caller built it already."""
    results = train(settings, loggers=loggers, source=source)
    if not is_first_process():  # the other ranks of a launch: the first one calibrates
        return results
    with quietly():  # the data again: the run's results stay its last lines
        found = score_members(
            [Path(results["best_checkpoint"])],
            splits=[],
            accelerator=settings.trainer.accelerator,
            fit_calibration=settings.calibration,
            calibration_dir=Path(settings.output_dir),
        )
    results["calibration"] = found.get("calibration")  # None: a multi-class task has none
    for line in calibration_lines(results["calibration"]):
        report(line)
    path = Path(settings.output_dir) / "metrics.json"
    _write_json(path, results)
    return results


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


def _finished(member: Any) -> dict[str, Any] | None:
    """A member's results when it trained to the end (``metrics.json`` not interrupted, its best
    checkpoint and its calibration there); None when it must train or resume."""
    folder = Path(member.output_dir)
    try:
        found = json.loads((folder / "metrics.json").read_text())
    except (OSError, ValueError):
        return None
    best = best_checkpoint(folder)
    if found.get("interrupted") or best is None or "calibration" not in found:
        return None  # no "calibration" entry: the run's end (calibration) has not been reached
    if found["calibration"] is not None and not (folder / CALIBRATION_FILE).is_file():
        return None
    found["best_checkpoint"] = str(best.resolve())  # the folder may have moved
    return found


def _write_member_configs(output_dir: Path, members: list[Any]) -> None:
    """Each member's composed config (``members/<i>/.hydra/config.yaml``: the run's, with the
    member's seed), so that ``train.py ckpt_path=RUN/members/<i>/checkpoints/last.ckpt``
    resumes that member exactly, as any run."""
    config = output_dir / ".hydra" / "config.yaml"
    if not config.is_file():  # called as a library function: no composed config to copy
        return
    import yaml  # the composed config is plain YAML (read as data, never instantiated)

    stored = yaml.safe_load(config.read_text()) or {}
    for member in members:
        values = {**stored, "seed": member.seed}
        values["ensemble"] = {**(stored.get("ensemble") or {}), "size": 1, "parallel": False}
        target = Path(member.output_dir) / ".hydra" / "config.yaml"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(yaml.safe_dump(values, sort_keys=False))


def _train_member(settings: Any, device: int | None) -> dict[str, Any]:
    """One member in a process of its own (``ensemble.parallel``), on GPU ``device``."""
    if device is not None:
        trainer = dataclasses.replace(settings.trainer, accelerator="gpu", devices=[device])
        settings = dataclasses.replace(settings, trainer=trainer)
    return train_calibrated(settings)


def train_ensemble(
    settings: Any,
    loggers_for: Callable[[Path], list[Any]] | None = None,
    resume: bool = False,
    source: Any | None = None,
) -> dict[str, Any]:
    """Trains ``settings.ensemble.size`` members (seeds ``seed``, ``seed + 1``, ...) into
    ``output_dir/members/<i>``, one after another (or at once, one GPU each, with
    ``ensemble.parallel``), then scores the ensemble on the validation and test splits, fits its
    calibration and writes the top ``metrics.json``; returns what it holds.

    A member that fails is reported and recorded in ``ensemble.json``; the others still train,
    and the ensemble is scored without it only with ``ensemble.allow_missing``. With ``resume``
    (``train.py ckpt_path=RUN``), finished members are kept, interrupted ones continue from
    their newest checkpoint (exactly, as any resume) and the others train. ``source``: the
    dataset's source (the members share it), when the caller built it already.
    """
    output_dir = Path(settings.output_dir)
    size = settings.ensemble.size
    visible = torch.cuda.device_count()
    if settings.ensemble.parallel and visible < size:
        raise ConfigError(
            f"ensemble.parallel=true trains each member on a GPU of its own: {size} members "
            f"need {size} visible GPUs, found {visible}; leave ensemble.parallel=false (members "
            "train one after another)"
        )
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
            if resume:
                finished = _finished(member)
                if finished is not None:
                    report(f"ensemble member {i} finished before: kept")
                    results[i] = finished
                    continue
                last = newest_checkpoint(member.output_dir)
                if last is not None:
                    report(f"ensemble member {i}: resuming {last}")
                    member = dataclasses.replace(member, ckpt_path=str(last))
            try:
                loggers = loggers_for(member.output_dir) if loggers_for else None
                results[i] = train_calibrated(member, loggers=loggers, source=source)
            except (UserFacingError, RuntimeError) as error:
                first = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
                state["failed"][str(i)] = first
                report(f"WARNING: ensemble member {i} failed: {first}")
    _write_json(output_dir / ENSEMBLE_FILE, state)
    if len(state["failed"]) == size:
        first = next(iter(state["failed"].values()))
        raise ConfigError(f"every ensemble member failed (member 0: {first}): nothing to score")
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
    paths = [Path(r["best_checkpoint"]) for r in results if r is not None]
    scored = score_members(
        paths,
        splits=["valid", "test"],
        accelerator=settings.trainer.accelerator,
        fit_calibration=settings.calibration,
        calibration_dir=output_dir,
    )
    for line in calibration_lines(scored.get("calibration")):
        report(line)
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
    report(f"evaluate with: {command('eval')} ckpt={output_dir.resolve()}")
    return found
