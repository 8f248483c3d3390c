"""Dataset sources: what the ``dataset=`` config group instantiates.

A source knows its task (cheaply, without reading data: the model is built from it on every
rank) and loads its graphs with their official or configured split.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch_geometric.data import InMemoryDataset

from graphormer.data.ogb import OGBGraphDataset, ogb_task_info
from graphormer.data.smiles import SmilesCsvDataset, group_split, random_split
from graphormer.data.tasks import TaskInfo
from graphormer.data.transforms import StructuralFeatures

__all__ = ["LoadedDataset", "OGBSource", "SmilesCsvSource"]


@dataclass
class LoadedDataset:
    dataset: InMemoryDataset
    split: dict[str, torch.Tensor]  # "train" / "valid" / "test" -> dataset indices
    task: TaskInfo


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
        task_type (str): ``"binary"`` (0/1 targets, BCE, ROC-AUC) or ``"regression"`` (L1, RMSE).
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
            raise ValueError(
                f"dataset.task_type must be 'binary' or 'regression', got {task_type!r}"
            )
        if split not in ("scaffold", "random"):
            raise ValueError(f"dataset.split must be 'scaffold' or 'random', got {split!r}")
        if isinstance(targets, str):
            targets = [targets]
        metric = metric or self._METRICS[task_type][0]
        if metric not in self._METRICS[task_type]:
            raise ValueError(
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
        if self.split == "scaffold":
            split = group_split(dataset.scaffolds, self.split_ratios)
        else:
            split = random_split(len(dataset), self.split_ratios, self.split_seed)
        return LoadedDataset(dataset, split, self._task)
