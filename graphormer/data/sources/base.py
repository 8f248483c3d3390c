"""The contract every dataset source keeps: :class:`Source`, and the :class:`LoadedDataset` it
loads.

A source is what the ``dataset=`` config group describes. It knows its task cheaply, without
reading data (the model is built from it on every rank), loads its graphs with their official or
configured split, and answers every question about its dataset that training, evaluation and
prediction ask, so that they never name a concrete dataset.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch.utils.data import Dataset

from graphormer.data.structure import StructuralFeatures
from graphormer.data.tasks import TaskInfo

if TYPE_CHECKING:
    from graphormer.data.descriptors import MoleculeFeatures

__all__ = ["LoadedDataset", "Source"]


@dataclass
class LoadedDataset:
    dataset: Dataset  # a PyG InMemoryDataset, or PCQM4Mv2's compact graphs
    split: dict[str, torch.Tensor]  # "train" / "valid" / "test" (or PCQM4Mv2's) -> indices
    task: TaskInfo
    # The splits with labels (metrics); the others (PCQM4Mv2's test-dev) only get predictions.
    labelled: tuple[str, ...] = ("train", "valid", "test")
    # The splits eval.py's split=all scores, each on its own (OC20's validation folders).
    evaluated: tuple[str, ...] = ("valid", "test")


class Source(ABC):
    """A dataset source. Subclasses take plain values (strings, numbers, booleans, lists of them)
    as constructor arguments, so that :func:`~graphormer.data.build_source` can rebuild them from
    the settings a checkpoint stores; they set :attr:`name` and :attr:`root`.

    Attributes:
        name (str): the label used in outputs and lock files.
        root (str): the folder holding the dataset and its caches.
    """

    name: str
    root: str
    # The dataset's own split that published results are compared on (a phrase naming it), or
    # None when the split is the user's to choose: cross-validation refuses to resample it.
    official_split: str | None = None
    _task: TaskInfo

    def task_info(self) -> TaskInfo:
        """The task (type, number of targets, metric), without reading the data: by default the
        one the constructor decided (``_task``); a source that learns it from its files
        overrides this."""
        return self._task

    def _keep_split(
        self,
        split: str,
        split_ratios: Sequence[float],
        split_seed: int,
        split_file: str | None,
        split_column: str | None = None,
    ) -> None:
        """Keep the user's split settings (``dataset.split``, ``split_ratios``, ``split_seed``,
        ``split_file``, ``split_column``), checked by the caller, under the names :meth:`load`
        reads, for a source whose split is the user's to choose."""
        self.split = split
        self.split_ratios = tuple(split_ratios)
        self.split_seed = split_seed
        self.split_file = split_file
        self.split_column = split_column

    @abstractmethod
    def load(self, pre_transform: StructuralFeatures | None = None) -> LoadedDataset:
        """The graphs and their split; ``pre_transform`` is cached with them where the source
        caches structural features."""

    def feature_dims(self) -> tuple[list[int], list[int]] | None:
        """Vocabulary sizes of the categorical node and edge feature columns (an empty list: no
        categorical column); None for OGB's featurisation (the model's default tables)."""
        return None

    def categorical_columns(
        self,
        counts: tuple[int, int] | None = None,  # noqa: ARG002
    ) -> tuple[list[int] | None, list[int] | None]:
        """Which columns of a graph's ``x`` and ``edge_attr`` are categorical when a user gives
        graphs to predict (``Predictor.predict_graphs``); None: every column (OGB's layout).
        ``counts``: the model's numbers of categorical node and edge columns (from its
        checkpoint), for sources that would otherwise have to read their data to tell."""
        return None, None

    def continuous_dims(self) -> tuple[int, int]:
        """Widths of the continuous node and edge features (``x_continuous``,
        ``edge_attr_continuous`` of each graph; 0: none)."""
        return 0, 0

    def node_counts(self, dataset: Dataset) -> torch.Tensor:
        """``[G]`` nodes of each graph of ``dataset`` (what :meth:`load` returned), without
        building the graphs. By default from a collated PyG storage's node slices."""
        ptr = dataset.slices["x"]
        return ptr[1:] - ptr[:-1]

    def task_names(self) -> list[str] | None:
        """One name per task (the label columns), or None when the source cannot tell without
        its data."""
        return None

    def atom_task_names(self) -> list[str]:
        """One name per atom-level target (issue #18); empty when the source has none."""
        return []

    def bond_task_names(self) -> list[str]:
        """One name per bond-level (edge-level) target (issue #18); empty when none."""
        return []

    def atom_vector_task_names(self) -> list[str]:
        """One name per per-atom 3-vector target (forces); empty when none."""
        return []

    def writes_predictions(self, split: str) -> bool:  # noqa: ARG002
        """Whether predictions for the unlabelled ``split`` have a file format of their own
        (:meth:`write_predictions`)."""
        return False

    def write_predictions(self, split: str, y_pred: torch.Tensor, folder: Path) -> Path:
        """Writes predictions ``[n, T]`` for the unlabelled ``split`` (in the split's order) into
        ``folder``; returns the file."""
        raise NotImplementedError(f"{type(self).__name__} writes no predictions for {split}")

    def split_groups(self, dataset: Dataset) -> list[str] | None:
        """Keys of graphs that must stay in one fold when resampling (Bemis-Murcko scaffolds for
        molecules), one per graph of ``dataset``; None when graphs are independent."""
        return None

    def input_rows(self, dataset: Dataset) -> torch.Tensor:
        """``[G]`` what a ``split_file`` calls each graph of ``dataset`` (what :meth:`load`
        returned): by default its position, 0-based (a graph file's list, a TU dataset's ids
        less one)."""
        return torch.arange(len(dataset))

    def smiles_column(self) -> str | None:
        """The column of the training file that holds SMILES, which prediction reads from a
        user's file by default; None when the source has no such file."""
        return None

    def molecule_features(self) -> MoleculeFeatures | None:
        """The molecule-level input features its graphs carry as ``molecule_features``
        ``[1, D]`` (a :class:`~graphormer.data.descriptors.MoleculeFeatures`), or None."""
        return None

    def resolves_on_load(self) -> bool:
        """Whether :meth:`load` chooses settings from the data (``auto`` values), so that the
        model can be sized only after it. False by default."""
        return False

    def resolved_settings(self) -> dict:
        """Dataset settings that :meth:`load` resolved from the data (``auto`` values), as
        ``{key: value}``; a run saves them over the ones it was given, so that evaluation and
        prediction rebuild exactly these inputs. Empty by default."""
        return {}

    def has_positions(self) -> bool:
        """Whether its graphs carry atom positions ``pos`` ``[num_nodes, 3]`` (what models with
        ``model.channels=3d`` read)."""
        return False

    def periodic_cutoff(self) -> float | None:
        """The distance (Angstrom) within which its periodic structures' images join as nodes
        (:mod:`graphormer.data.periodic`), which structure files read for prediction must use
        too; None for a source without periodic structures."""
        return None

    def periodic_around(self) -> str:
        """Which atoms anchor its periodic structures' images (``adsorbate`` or ``all``,
        :mod:`graphormer.data.periodic`), for structure files read for prediction."""
        return "adsorbate"

    def prediction_conformers(self) -> int:
        """Conformers to embed per SMILES when a model trained on this source predicts (its
        graphs' positions came from SMILES: the same method, seed and count); 0: none."""
        return 0

    def smiles_refusal(self) -> str | None:
        """Why a model trained on this source cannot predict from SMILES (the text follows
        "checkpoint <path> "), or None when it can: its graphs are featurised as SMILES are."""
        return None
