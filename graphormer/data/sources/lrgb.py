"""The Long Range Graph Benchmark's peptide sets (Dwivedi et al., 2022, "Long Range Graph
Benchmark", https://arxiv.org/abs/2206.08164): ``dataset=lrgb dataset.name=Peptides-func``
(10 functions, multi-label, average precision) or ``Peptides-struct`` (11 structural properties,
regression, MAE), with the official split (issue #17).

The raw files are PyG's ``LRGBDataset`` layout and URLs, ``<root>/peptides-func/raw/{train,val,
test}.pt``: lists of ``(x, edge_attr, edge_index, y)`` tuples of tensors, the peptides featurised
the OGB way (9 atom and 3 bond columns, the model's default tables). They are read with
``torch.load(weights_only=True)``; PyG's own loader would fall back to a full unpickle.
"""

from __future__ import annotations

import os.path as osp

import torch
from torch import Tensor
from torch_geometric.data import Data, InMemoryDataset

from graphormer.data.sources.base import LoadedDataset, Source
from graphormer.data.sources.folders import fetch_zip
from graphormer.data.sources.graph_cache import GraphCache, input_digest
from graphormer.data.sources.pyg_file import GraphFile
from graphormer.data.structure import StructuralFeatures
from graphormer.data.tasks import TaskInfo
from graphormer.errors import ConfigError, DataError
from graphormer.safe_io import load_data, unpickling_reason

__all__ = ["LRGB_URLS", "LRGBSource"]

# PyG's LRGBDataset URLs, and the folder each zip holds.
LRGB_URLS = {
    "peptides-func": "https://www.dropbox.com/s/ycsq37q8sxs1ou8/peptidesfunc.zip?dl=1",
    "peptides-struct": "https://www.dropbox.com/s/zgv4z8fcpmknhs8/peptidesstruct.zip?dl=1",
}
_ZIP_FOLDERS = {"peptides-func": "peptidesfunc", "peptides-struct": "peptidesstruct"}
_TASKS = {
    "peptides-func": ("binary classification", 10, "ap"),
    "peptides-struct": ("regression", 11, "mae"),
}
SPLITS = {"train": "train", "valid": "val", "test": "test"}  # ours -> LRGB's file names


def _read_split(path: str, url: str) -> list[tuple[Tensor, Tensor, Tensor, Tensor]]:
    try:
        graphs = load_data(path)
    except Exception as error:
        raise DataError(
            f"{path} is not read ({unpickling_reason(error)}): a dataset file is data, never "
            f"code; replace it with the file from {url}"
        ) from error
    if not isinstance(graphs, list | tuple) or not all(
        isinstance(g, tuple | list) and len(g) == 4 and all(isinstance(t, Tensor) for t in g)
        for g in graphs
    ):
        raise DataError(f"{path} does not hold a list of (x, edge_attr, edge_index, y) tensors")
    return list(graphs)


class _Peptides(InMemoryDataset):
    def __init__(self, data: Data, slices: dict[str, Tensor]) -> None:
        super().__init__(None, log=False)
        self.data, self.slices = data, slices


class LRGBSource(Source):
    """Peptides-func or Peptides-struct with the official split (``val`` is our ``valid``).

    Args:
        name (str): ``Peptides-func`` or ``Peptides-struct`` (any case).
        root (str, optional): the folder holding ``peptides-*/raw/``. (default: :obj:`"data"`)
    """

    official_split = "LRGB's official split (the benchmark's)"

    def __init__(self, name: str, root: str = "data") -> None:
        key = str(name).lower()
        if key not in _TASKS:
            raise ConfigError(
                f"dataset.name={name!r} is not an LRGB graph-level dataset; choose Peptides-func "
                "or Peptides-struct"
            )
        self.name = name
        self.key = key
        self.root = root
        task_type, num_tasks, metric = _TASKS[key]
        self._task = TaskInfo(name, task_type, num_tasks, metric)

    @property
    def raw_dir(self) -> str:
        return osp.join(self.root, self.key, "raw")

    def _download(self) -> None:
        files = [osp.join(self.raw_dir, f"{s}.pt") for s in SPLITS.values()]
        if all(osp.isfile(f) for f in files):
            return
        url = LRGB_URLS[self.key]
        fetch_zip(
            url,
            self.root,
            _ZIP_FOLDERS[self.key],
            self.raw_dir,
            lacks="some of train.pt, val.pt, test.pt",
            what=self.name,
            fix=f"download {url} on a machine with network access, unzip it and put its "
            f"train.pt, val.pt and test.pt into {osp.abspath(self.raw_dir)}, or point "
            f"dataset.root= at the folder that holds {self.key}/raw/",
            leftover=osp.join(self.root, self.key),
        )

    def _read(self) -> tuple[GraphFile, dict]:
        """The three split files' graphs, flattened, and each split's size."""
        parts: dict[str, list[Tensor]] = {"x": [], "edge_attr": [], "edge_index": [], "y": []}
        sizes = []
        num_tasks = self._task.num_tasks
        for theirs in SPLITS.values():
            path = osp.join(self.raw_dir, f"{theirs}.pt")
            graphs = _read_split(path, LRGB_URLS[self.key])
            for i, (x, edge_attr, edge_index, y) in enumerate(graphs):
                if x.dim() != 2 or x.size(1) != 9 or edge_attr.dim() != 2 or y.numel() != num_tasks:
                    raise DataError(
                        f"{path}: graph {i} has x {list(x.shape)}, edge_attr "
                        f"{list(edge_attr.shape)} and {y.numel()} targets; {self.name} graphs "
                        f"have [N, 9], [E, 3] and {num_tasks}"
                    )
                parts["x"].append(x.long())
                parts["edge_attr"].append(edge_attr.long())
                parts["edge_index"].append(edge_index.long())
                parts["y"].append(y.float().view(1, -1))
            sizes.append(len(graphs))
        nodes = torch.tensor([len(x) for x in parts["x"]])
        edges = torch.tensor([e.size(1) for e in parts["edge_index"]])
        node_ptr = torch.cat([torch.zeros(1, dtype=torch.long), nodes.cumsum(0)])
        edge_ptr = torch.cat([torch.zeros(1, dtype=torch.long), edges.cumsum(0)])
        data = Data(
            **{k: torch.cat(v, dim=1 if k == "edge_index" else 0) for k, v in parts.items()}
        )
        slices = {
            "x": node_ptr,
            "edge_index": edge_ptr,
            "edge_attr": edge_ptr.clone(),
            "y": torch.arange(len(nodes) + 1),
        }
        flat = {"x": data.x, "edge_attr": data.edge_attr}
        return GraphFile.of_parts(data, slices, None, flat), {"sizes": sizes}

    def _cache(self) -> GraphCache:
        """``root/peptides-*/processed/<digest>/``, keyed by the split files' contents."""
        files = [osp.join(self.raw_dir, f"{s}.pt") for s in SPLITS.values()]
        digest = input_digest(files, {"name": self.key})
        return GraphCache(osp.join(self.root, self.key, "processed", digest))

    def load(self, pre_transform: StructuralFeatures | None = None) -> LoadedDataset:
        self._download()
        cache = self._cache()
        graphs, extra = cache.graphs(self._read, GraphFile)
        if pre_transform is not None:
            cache.add_structure(graphs, pre_transform)
        bounds = torch.tensor([0, *extra["sizes"]]).cumsum(0)
        split = {
            ours: torch.arange(int(bounds[i]), int(bounds[i + 1])) for i, ours in enumerate(SPLITS)
        }
        return LoadedDataset(_Peptides(graphs.data, graphs.slices), split, self._task)
