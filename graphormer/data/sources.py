"""Dataset sources: what the ``dataset=`` config group describes.

A source knows its task (cheaply, without reading data: the model is built from it on every
rank) and loads its graphs with their official or configured split. Sources are chosen by name
from :data:`SOURCES`, a fixed table of this package's own classes, never by a class path read
from a config or a checkpoint: a checkpoint is data, and must never choose code to run.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset

from graphormer.data.ogb import OGBGraphDataset, ogb_task_info
from graphormer.data.pcqm4mv2 import PCQM4Mv2Source
from graphormer.data.smiles import SmilesCsvDataset, group_split, random_split
from graphormer.data.tasks import TaskInfo
from graphormer.data.transforms import StructuralFeatures
from graphormer.data.zinc import ZINCSource
from graphormer.errors import ConfigError, DataError

__all__ = [
    "SOURCES",
    "LoadedDataset",
    "OGBSource",
    "PCQM4Mv2Source",
    "SmilesCsvSource",
    "ZINCSource",
    "build_source",
]


@dataclass
class LoadedDataset:
    dataset: Dataset  # a PyG InMemoryDataset, or PCQM4Mv2's compact graphs
    split: dict[str, torch.Tensor]  # "train" / "valid" / "test" (or PCQM4Mv2's) -> indices
    task: TaskInfo
    # The splits with labels (metrics); the others (PCQM4Mv2's test-dev) only get predictions.
    labelled: tuple[str, ...] = ("train", "valid", "test")


class OGBSource:
    """An OGB graph-property dataset with its official split.

    Args:
        name (str): e.g. ``ogbg-molhiv``.
        root (str, optional): folder holding datasets. (default: :obj:`"data"`)
    """

    def __init__(self, name: str, root: str = "data") -> None:
        self.name = name
        self.root = root
        self._task = ogb_task_info(name)

    def task_info(self) -> TaskInfo:
        return self._task

    def load(self, pre_transform: StructuralFeatures | None) -> LoadedDataset:
        dataset = OGBGraphDataset(self.name, self.root, pre_transform=pre_transform)
        split = dataset.get_idx_split()
        return LoadedDataset(dataset, {k: split[k] for k in ("train", "valid", "test")}, self._task)


class SmilesCsvSource:
    """A CSV of SMILES and targets, featurised like OGB, with a scaffold or random split.

    Args:
        path (str): the CSV file.
        targets (Sequence[str]): target columns.
        task_type (str): ``"binary"`` (0/1 targets, BCE, ROC-AUC) or ``"regression"`` (MSE, RMSE).
        smiles_column (str, optional): (default: :obj:`"smiles"`)
        split (str, optional): ``"scaffold"`` or ``"random"``. (default: :obj:`"scaffold"`)
        split_ratios (Sequence[float], optional): train/valid/test fractions.
        split_seed (int, optional): seed of the random split. (default: :obj:`0`)
        metric (str | None, optional): OGB metric name; default ``rocauc`` / ``rmse``.
        root (str, optional): cache folder. (default: :obj:`"data"`)
        name (str, optional): label used in outputs. (default: :obj:`"smiles_csv"`)
        columns (Sequence[str] | None, optional): column names for a CSV without a header row.
        comment (str | None, optional): skip lines starting with this character.
    """

    _TASK_TYPES = {"binary": "binary classification", "regression": "regression"}
    _METRICS = {"binary": ("rocauc", "ap"), "regression": ("rmse",)}

    def __init__(
        self,
        path: str,
        targets: Sequence[str],
        task_type: str = "regression",
        smiles_column: str = "smiles",
        split: str = "scaffold",
        split_ratios: Sequence[float] = (0.8, 0.1, 0.1),
        split_seed: int = 0,
        metric: str | None = None,
        root: str = "data",
        name: str = "smiles_csv",
        columns: Sequence[str] | None = None,
        comment: str | None = None,
    ) -> None:
        if task_type not in self._TASK_TYPES:
            raise ConfigError(
                f"dataset.task_type must be 'binary' or 'regression', got {task_type!r}"
            )
        if split not in ("scaffold", "random"):
            raise ConfigError(f"dataset.split must be 'scaffold' or 'random', got {split!r}")
        if isinstance(targets, str):
            targets = [targets]
        metric = metric or self._METRICS[task_type][0]
        if metric not in self._METRICS[task_type]:
            raise ConfigError(
                f"dataset.metric={metric!r} does not fit task_type={task_type!r}; choose one of "
                f"{list(self._METRICS[task_type])}"
            )
        self.path = path
        self.targets = list(targets)
        self.smiles_column = smiles_column
        self.split = split
        self.split_ratios = tuple(split_ratios)
        self.split_seed = split_seed
        self.root = root
        self.columns = list(columns) if columns else None
        self.comment = comment
        self._task = TaskInfo(name, self._TASK_TYPES[task_type], len(self.targets), metric)

    def task_info(self) -> TaskInfo:
        return self._task

    def load(self, pre_transform: StructuralFeatures | None) -> LoadedDataset:
        dataset = SmilesCsvDataset(
            self.path,
            self.smiles_column,
            self.targets,
            self.root,
            pre_transform=pre_transform,
            columns=self.columns,
            comment=self.comment,
        )
        if self._task.is_classification:
            _check_binary_labels(dataset, self.targets, self.path)
        if self.split == "scaffold":
            split = group_split(dataset.scaffolds, self.split_ratios)
        else:
            split = random_split(len(dataset), self.split_ratios, self.split_seed)
        return LoadedDataset(dataset, split, self._task)


def _check_binary_labels(dataset: SmilesCsvDataset, targets: list[str], path: str) -> None:
    y = dataset.y.view(len(dataset), -1)
    bad = ~(torch.isnan(y) | (y == 0) | (y == 1))
    if bad.any():
        column = int(bad.any(0).nonzero()[0])
        graphs = bad[:, column].nonzero().view(-1)
        rows = dataset.row.view(-1)[graphs].tolist()
        values = sorted({float(v) for v in y[graphs, column].tolist()})[:5]
        raise DataError(
            f"target column {targets[column]!r} of {path} holds values other than 0 and 1 "
            f"({values}) at rows {rows[:5]}{' and more' if len(rows) > 5 else ''} (0-based, "
            "header excluded), but dataset.task_type=binary: use 0/1 labels (empty = missing), "
            "or dataset.task_type=regression"
        )


# The dataset sources a config or a checkpoint may name (``dataset.source``).
SOURCES: dict[str, type] = {
    "ogb": OGBSource,
    "smiles_csv": SmilesCsvSource,
    "pcqm4mv2": PCQM4Mv2Source,
    "zinc": ZINCSource,
}

# Class paths that checkpoints of graphormer 0.1 stored as ``_target_``: read as the names above.
_LEGACY_TARGETS = {
    "graphormer.data.OGBSource": "ogb",
    "graphormer.data.sources.OGBSource": "ogb",
    "graphormer.data.SmilesCsvSource": "smiles_csv",
    "graphormer.data.sources.SmilesCsvSource": "smiles_csv",
}

_PLAIN = (str, int, float, bool, type(None))


def build_source(settings: Mapping[str, Any]):
    """The dataset source that ``settings`` (the ``dataset`` config) describes.

    ``settings["source"]`` names an entry of :data:`SOURCES`; the other keys are that class's
    arguments and must be plain values (strings, numbers, booleans, lists of them). Anything
    else (an unknown source, a Hydra ``_target_`` naming another callable, ``_args_``, an unknown
    argument, a nested object) raises :class:`~graphormer.errors.ConfigError`.
    """
    settings = dict(settings)
    target = settings.pop("_target_", None)
    kind = settings.pop("source", None)
    if target is not None:
        if target not in _LEGACY_TARGETS:
            raise ConfigError(
                f"dataset._target_={target!r} is not a dataset source of graphormer: datasets are "
                f"chosen by name with dataset.source (one of {sorted(SOURCES)})"
            )
        legacy = _LEGACY_TARGETS[target]
        if kind is not None and kind != legacy:
            raise ConfigError(f"dataset.source={kind!r} contradicts dataset._target_={target!r}")
        kind = legacy
    if kind not in SOURCES:
        raise ConfigError(
            f"dataset.source={kind!r} is not a dataset source; choose one of {sorted(SOURCES)}"
        )
    cls = SOURCES[kind]
    special = sorted(k for k in settings if str(k).startswith("_"))
    if special:
        raise ConfigError(f"dataset settings may not hold {special}: they are not arguments")
    accepted = set(inspect.signature(cls).parameters)
    unknown = sorted(set(settings) - accepted)
    if unknown:
        raise ConfigError(
            f"dataset.source={kind} does not take {unknown}; its settings are {sorted(accepted)}"
        )
    for key, value in settings.items():
        values = value if isinstance(value, list | tuple) else [value]
        if not all(isinstance(v, _PLAIN) for v in values):
            raise ConfigError(
                f"dataset.{key} must be a plain value or a list of plain values, got "
                f"{type(value).__name__}"
            )
    try:
        return cls(**settings)
    except ConfigError:
        raise
    except (TypeError, ValueError) as error:
        # A missing argument, or a value of the wrong type (a string for a number, ...).
        raise ConfigError(f"dataset settings for source={kind} are not usable: {error}") from error
