"""The members a ``ckpt=`` names (#19): one checkpoint, a run folder, an ensemble's folder or a
list, checked to fit together, and how sure their combined predictions were.

An ensemble's folder::

    RUN/ensemble.json       size, seeds, each member's folder and state (trained, failed)
    RUN/members/<i>/        member i: an ordinary run folder (checkpoints/, metrics.json, ...)
    RUN/metrics.json        the ensemble's metrics and each member's
    RUN/calibration.json    fitted on the validation split with the ensemble's predictions

``eval.py ckpt=RUN`` and ``predict.py ckpt=RUN`` use every member (:func:`resolve_members`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graphormer.checkpoint import CheckpointError
from graphormer.console import report
from graphormer.data.sources import with_source_defaults
from graphormer.errors import ConfigError
from graphormer.rundir import ENSEMBLE_FILE, run_dir_of

# The report lives in graphormer.uncertainty; the names stay importable here.
from graphormer.uncertainty.report import REPORTED_LEVELS, spearman, uncertainty_report

__all__ = [
    "ENSEMBLE_FILE",
    "MEMBERS_DIR",
    "REPORTED_LEVELS",
    "Members",
    "best_checkpoint",
    "check_members",
    "resolve_members",
    "spearman",
    "uncertainty_report",
]

log = logging.getLogger(__name__)

MEMBERS_DIR = "members"


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
        return Members([path], folder=run_dir_of(path))
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


# Dataset settings that change how members trained, not what they predict or from which data.
_TRAINING_ONLY_DATA = frozenset({"auxiliary_atom_descriptors"})


def check_members(records: Sequence[Any], modules: Sequence[Any]) -> None:
    """Members are combined only when they predict the same tasks from the same featurisation:
    same task, same model inputs, same structural settings."""
    first = modules[0]
    for record, module in zip(records[1:], modules[1:], strict=True):
        # Auxiliary atom targets (issue #22) are trained, never predicted: members with and
        # without them predict the same molecules.
        if not module.task.without_auxiliary().same_task(first.task.without_auxiliary()):
            raise CheckpointError(
                f"checkpoint {record.path} predicts {module.task}, but {records[0].path} "
                f"predicts {first.task}: an ensemble's members share one task"
            )
        hops = [m.run_record.max_hops for m in (first, module)]
        if hops[0] != hops[1]:
            raise CheckpointError(
                f"checkpoint {record.path} reads paths of {hops[1]} hops but {records[0].path} "
                f"of {hops[0]}: an ensemble's members share the structural settings"
            )
        inputs = [{k: m.run_record.model.get(k) for k in _INPUT_KEYS} for m in (first, module)]
        if inputs[0] != inputs[1]:
            keys = [k for k in _INPUT_KEYS if inputs[0][k] != inputs[1][k]]
            raise CheckpointError(
                f"checkpoint {record.path} reads other inputs than {records[0].path} (model."
                f"{keys[0]}: {inputs[1][keys[0]]} vs {inputs[0][keys[0]]}): an ensemble's "
                "members read the same features"
            )
        data = [
            {
                k: v
                for k, v in with_source_defaults(m.run_record.dataset or {}).items()
                if k not in _TRAINING_ONLY_DATA
            }
            for m in (first, module)
        ]
        differ = sorted(k for k in set(data[0]) | set(data[1]) if data[0].get(k) != data[1].get(k))
        if differ:
            # Another split (a cross-validation's folds) would score members on molecules some
            # of them trained on.
            raise CheckpointError(
                f"checkpoint {record.path} was trained on other data settings than "
                f"{records[0].path} (dataset.{differ[0]}: {data[1].get(differ[0])!r} vs "
                f"{data[0].get(differ[0])!r}): an ensemble's members share one dataset and split; "
                "evaluate each on its own (a cross-validation's folds are scored in cv_metrics.json)"
            )


# Model settings that fix what a member reads: members must agree on them.
_INPUT_KEYS = (
    "atom_feature_dims",
    "bond_feature_dims",
    "node_continuous_dim",
    "edge_continuous_dim",
    "molecule_features_dim",
    "channels",
)
