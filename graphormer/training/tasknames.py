"""The names of a checkpoint's tasks, as its dataset source names them: what prediction tables
and evaluation reports label their columns with."""

from __future__ import annotations

from typing import Any

from graphormer.data.sources import Source, build_source
from graphormer.data.tasks import ATOM, BOND, Level
from graphormer.errors import ConfigError

__all__ = [
    "level_task_names",
    "read_atom_task_names",
    "read_bond_task_names",
    "read_task_names",
    "stored_source",
]


def read_task_names(module: Any) -> list[str]:
    """The names of a checkpoint's tasks, as its dataset source names them (a SMILES-CSV
    model's target columns, an OGB model's label columns); ``task_i`` when it cannot."""
    num_tasks = module.task.num_tasks
    source = stored_source(module)
    names = source.task_names() if source is not None else None
    if names is None or len(names) != num_tasks or len(set(names)) != num_tasks:
        names = [f"task_{i}" for i in range(num_tasks)]
    return names


def read_atom_task_names(module: Any) -> list[str]:
    """The names of a checkpoint's atom targets (issue #18), its source's atom target columns;
    ``atom_i`` when it cannot tell."""
    return level_task_names(module, ATOM)


def read_bond_task_names(module: Any) -> list[str]:
    """The names of a checkpoint's bond targets (issue #18), its source's bond target columns;
    ``bond_i`` when it cannot tell."""
    return level_task_names(module, BOND)


def level_task_names(module: Any, level: Level) -> list[str]:
    """``level``'s target names from the stored source, or numbered (``atom_0``)."""
    count = level.tasks(module.task)
    source = stored_source(module)
    names = getattr(source, f"{level.name}_task_names")() if source is not None else []
    if len(names) != count or len(set(names)) != count:
        names = [f"{level.name}_{i}" for i in range(count)]
    return names


def stored_source(module: Any) -> Source | None:
    """The dataset source a checkpoint's settings describe; None when it records none (a
    converted checkpoint) or one graphormer cannot build (prediction needs no dataset)."""
    dataset = module.run_record.dataset
    if not dataset:
        return None
    try:
        return build_source(dataset)
    except ConfigError:
        return None
