"""ogbg-ppa (Hu et al., 2020, Open Graph Benchmark): protein-protein association neighbourhoods
from 1,581 species, 37 taxonomic groups to classify (``dataset=ogbg-ppa``; issue #17).

Read through OGB's own loader (:class:`~graphormer.data.sources.ogb.OGBGraphDataset`: its raw
files, labels and official ``species`` split), scored by accuracy with OGB's ``Evaluator``. Its
graphs have no node features (every node starts from one learned embedding, plus centrality)
and 7 float edge features (association scores), which the model projects (continuous inputs).
"""

from __future__ import annotations

import torch
from torch_geometric.data import Data

from graphormer.data.features import check_finite
from graphormer.data.sources.base import LoadedDataset, Source
from graphormer.data.sources.ogb import OGBGraphDataset, ogb_task_info
from graphormer.data.structure import StructuralFeatures
from graphormer.data.tasks import warn_absent_classes
from graphormer.errors import ConfigError, DataError

__all__ = ["PPA_EDGE_FEATURES", "PPADataset", "PPASource"]

PPA_EDGE_FEATURES = 7
_NAME = "ogbg-ppa"


class PPADataset(OGBGraphDataset):
    """OGB's ogbg-ppa with each graph's edge features moved to ``edge_attr_continuous`` and empty
    categorical ``x`` / ``edge_attr`` (the absent-feature path), before OGB saves it once."""

    def __init__(self, root: str = "data", pre_transform: StructuralFeatures | None = None):
        super().__init__(_NAME, root, pre_transform=pre_transform)

    def collate(self, data_list: list[Data]) -> tuple[Data, dict]:
        for i, graph in enumerate(data_list):
            features = graph.edge_attr
            if features is None or features.dim() != 2 or features.size(1) != PPA_EDGE_FEATURES:
                shape = None if features is None else list(features.shape)
                raise DataError(
                    f"{self.root}: graph {i} has edge features {shape}, not ogbg-ppa's "
                    f"[E, {PPA_EDGE_FEATURES}]; restore the dataset's raw/edge-feat.csv.gz"
                )
            features = features.float()
            check_finite(features, torch.zeros(len(features), dtype=torch.long) + i, "edge", _NAME)
            graph.edge_attr_continuous = features
            graph.edge_attr = torch.zeros(features.size(0), 0, dtype=torch.long)
            graph.x = torch.zeros(graph.num_nodes, 0, dtype=torch.long)
        return super().collate(data_list)


class PPASource(Source):
    """ogbg-ppa with its official species split.

    Args:
        root (str, optional): the folder holding ``ogbg_ppa/``. (default: :obj:`"data"`)
        name (str, optional): ``ogbg-ppa``, the one dataset this source reads (the config
            names it, as every dataset's does, for the run folder). (default: :obj:`"ogbg-ppa"`)
    """

    official_split = "OGB's official species split (the one its leaderboard compares)"

    def __init__(self, root: str = "data", name: str = _NAME) -> None:
        if name != _NAME:
            raise ConfigError(
                f"dataset.name={name!r}: dataset=ogbg-ppa reads OGB's {_NAME} only; drop "
                "dataset.name (other OGB graph sets: dataset=ogbg-mol...)"
            )
        self.name = _NAME
        self.root = root
        self._task = ogb_task_info(_NAME)

    def feature_dims(self) -> tuple[list[int], list[int]]:
        return [], []  # no categorical node or edge feature

    def continuous_dims(self) -> tuple[int, int]:
        return 0, PPA_EDGE_FEATURES

    def categorical_columns(self) -> tuple[list[int], list[int]]:
        return [], []

    def load(self, pre_transform: StructuralFeatures | None = None) -> LoadedDataset:
        dataset = PPADataset(self.root, pre_transform=pre_transform)
        split = {k: dataset.get_idx_split()[k] for k in ("train", "valid", "test")}
        labels = dataset.y.view(-1).float()[split["train"]]
        warn_absent_classes(labels, self._task.num_classes, self.name)
        return LoadedDataset(dataset, split, self._task)

    def smiles_refusal(self) -> str:
        return (
            "was trained on ogbg-ppa (protein association graphs), not on molecules: predict "
            "graphs with predict.py input=graphs.pt, or Predictor.predict_graphs"
        )
