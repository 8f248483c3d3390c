"""TU datasets (Morris et al., 2020, "TUDataset: A collection of benchmark datasets for learning
with graphs", https://chrsmrrs.github.io/datasets/): PROTEINS, ENZYMES, NCI1, MUTAG, IMDB-BINARY,
COLLAB, ... (``dataset=tu dataset.name=NAME``; issue #17).

The raw files are PyG's ``TUDataset`` layout, ``<root>/<NAME>/raw/<NAME>_A.txt`` (1-based edges,
both directions), ``_graph_indicator``, ``_graph_labels`` (or ``_graph_attributes``: regression),
and optional ``_node_labels``, ``_node_attributes``, ``_edge_labels``, ``_edge_attributes``, parsed
by PyG's own ``read_tu_data``. PyG's ``TUDataset`` class itself is not used: its processed file
is read back with a full-unpickling fallback, and it keeps node labels only as one-hot columns.
Here node and edge labels are categorical (embedding tables), attributes continuous (a
standardised projection), and graphs without either take the absent-feature path.
"""

from __future__ import annotations

import os
import os.path as osp
from collections.abc import Sequence

import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.io.tu import read_file, read_tu_data

from graphormer.data.features import check_finite
from graphormer.data.sources.base import LoadedDataset, Source
from graphormer.data.sources.folders import fetch_zip
from graphormer.data.sources.graph_cache import GraphCache, input_digest
from graphormer.data.sources.pyg_file import GraphFile, InMemoryGraphs
from graphormer.data.splits import (
    file_split,
    file_split_setting,
    random_split,
    stratified_split,
)
from graphormer.data.structure import StructuralFeatures
from graphormer.data.tasks import TaskInfo, user_task, warn_absent_classes, with_accuracy
from graphormer.errors import ConfigError, DataError

__all__ = ["TU_URL", "TUSource", "read_tu_graphs"]

TU_URL = "https://www.chrsmrrs.com/graphkerneldatasets"


def _labels_as_ids(one_hot: Tensor, raw: Tensor) -> Tensor:
    """Class ids ``[rows, k]`` back from PyG's one-hot columns: one block per raw label column,
    each as wide as that column's range (as ``read_tu_data`` built them)."""
    raw = raw.view(raw.size(0), -1)
    widths = (raw.max(0).values - raw.min(0).values + 1).tolist()
    blocks = one_hot.split(widths, dim=-1)
    return torch.stack([b.argmax(-1) for b in blocks], dim=-1)


def read_tu_graphs(
    folder: str, name: str, use_node_attr: bool = True, use_edge_attr: bool = True
) -> tuple[GraphFile, bool]:
    """The graphs of a TU dataset's raw ``folder``, flattened (see :class:`GraphFile`), and
    whether its targets are regression values (``_graph_attributes``)."""
    where = f"{name} ({folder})"
    batch = _check_files(folder, name)
    try:
        data, slices, sizes = read_tu_data(folder, name)
    except (RuntimeError, IndexError, ValueError) as error:  # what the counts do not show
        reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise DataError(
            f"{where}: its files cannot be read as one TU dataset ({type(error).__name__}: "
            f"{reason}); {_RESTORE}"
        ) from error
    num_graphs = int(batch.max()) + 1
    node_ptr = torch.zeros(num_graphs + 1, dtype=torch.long)
    node_ptr[1:] = torch.bincount(batch, minlength=num_graphs).cumsum(0)
    edge_ptr = slices["edge_index"]
    parts: dict[str, Tensor] = {"edge_index": data.edge_index}
    total_nodes, total_edges = int(node_ptr[-1]), data.edge_index.size(1)
    node_graph = torch.arange(num_graphs).repeat_interleave(node_ptr[1:] - node_ptr[:-1])
    edge_graph = torch.arange(num_graphs).repeat_interleave(edge_ptr[1:] - edge_ptr[:-1])
    # PyG numbers each graph's nodes from 0 and keeps an edge to a node no graph holds.
    local = data.edge_index
    if local.numel() and bool(((local < 0) | (local >= node_ptr.diff()[edge_graph])).any()):
        raise _inconsistent(
            folder,
            name,
            f"{name}_A.txt joins nodes of different graphs, or names nodes that "
            f"{name}_graph_indicator.txt does not ({total_nodes} nodes)",
        )

    attributes, labels = sizes["num_node_attributes"], sizes["num_node_labels"]
    x = data.x if data.x is not None else torch.zeros(total_nodes, 0)
    parts["x"] = torch.zeros(total_nodes, 0, dtype=torch.long)
    if labels:
        # Nodes keep their order in read_tu_data: the raw labels are the ids (from 0).
        raw = read_file(folder, name, "node_labels", torch.long).view(total_nodes, -1)
        parts["x"] = raw - raw.min(0).values
    if attributes and use_node_attr:
        parts["x_continuous"] = x[:, :attributes].float()
        check_finite(parts["x_continuous"], node_graph, "node", where)

    attributes, labels = sizes["num_edge_attributes"], sizes["num_edge_labels"]
    edge_attr = data.edge_attr if data.edge_attr is not None else torch.zeros(total_edges, 0)
    parts["edge_attr"] = torch.zeros(total_edges, 0, dtype=torch.long)
    if labels:
        # Edges were reordered (coalesced): their ids come back from PyG's one-hot columns.
        raw = read_file(folder, name, "edge_labels", torch.long)
        parts["edge_attr"] = _labels_as_ids(edge_attr[:, attributes:], raw)
    if attributes and use_edge_attr:
        parts["edge_attr_continuous"] = edge_attr[:, :attributes].float()
        check_finite(parts["edge_attr_continuous"], edge_graph, "edge", where)

    if data.y is None:
        raise DataError(f"{where} has neither {name}_graph_labels.txt nor _graph_attributes.txt")
    regression = osp.isfile(osp.join(folder, f"{name}_graph_attributes.txt"))
    y = data.y.float().view(num_graphs, -1)
    if regression:
        check_finite(y, torch.arange(num_graphs), "graph attribute", where)
    storage = Data(**parts, y=y)
    new_slices = {"x": node_ptr, "edge_index": edge_ptr, "edge_attr": edge_ptr.clone()}
    new_slices["y"] = torch.arange(num_graphs + 1)
    if "x_continuous" in parts:
        new_slices["x_continuous"] = node_ptr.clone()
    if "edge_attr_continuous" in parts:
        new_slices["edge_attr_continuous"] = edge_ptr.clone()
    graphs = GraphFile.of_parts(storage, new_slices, None, parts)
    return graphs, regression


_RESTORE = "restore the files from the dataset's zip (or delete the folder to download it again)"


def _inconsistent(folder: str, name: str, problem: str) -> DataError:
    return DataError(
        f"{name} ({folder}): {problem}; the files must describe the same graphs: {_RESTORE}"
    )


def _check_files(folder: str, name: str) -> Tensor:
    """The graph of each node (0-based, from ``_graph_indicator``), once the files are known to
    describe the same graphs: one line per node in the node files, per edge in the edge files,
    per graph in the graph files, nodes numbered graph by graph. PyG's reader would stop on a
    mismatch with a shape error naming no file, or read it silently."""

    def lines(kind: str) -> int | None:
        path = osp.join(folder, f"{name}_{kind}.txt")
        if not osp.isfile(path):
            return None
        with open(path, "rb") as f:
            return sum(1 for line in f if line.strip())

    indicator = f"{name}_graph_indicator.txt"
    if lines("graph_indicator") is None:
        raise _inconsistent(folder, name, f"{indicator} is missing")
    try:
        batch = read_file(folder, name, "graph_indicator", torch.long).view(-1) - 1
    except (RuntimeError, ValueError) as error:
        raise _inconsistent(
            folder, name, f"{indicator} is not one graph number per line ({error})"
        ) from error
    if not len(batch) or int(batch.min()) < 0 or bool((batch[1:] < batch[:-1]).any()):
        raise _inconsistent(
            folder,
            name,
            f"{indicator} does not number the nodes' graphs 1, 1, ..., 2, ... in order",
        )
    counts = {"node": len(batch), "graph": int(batch.max()) + 1, "edge": lines("A")}
    for kind, unit in (
        ("node_labels", "node"),
        ("node_attributes", "node"),
        ("edge_labels", "edge"),
        ("edge_attributes", "edge"),
        ("graph_labels", "graph"),
        ("graph_attributes", "graph"),
    ):
        found = lines(kind)
        if found is not None and counts[unit] is not None and found != counts[unit]:
            source = f"{name}_A.txt" if unit == "edge" else indicator
            raise _inconsistent(
                folder,
                name,
                f"{name}_{kind}.txt has {found} lines, but {source} gives {counts[unit]} "
                f"{unit}s (one line per {unit})",
            )
    return batch


class TUSource(Source):
    """A TU dataset: node/edge labels categorical, attributes continuous; task from the labels
    (two classes: binary, ROC-AUC, with accuracy reported beside it; more: multi-class,
    accuracy; graph attributes: regression, RMSE); a seeded split, stratified by class or random.

    Args:
        name (str): the TU name (``PROTEINS``, ``NCI1``, ...).
        root (str, optional): the folder holding ``<name>/raw/``. (default: :obj:`"data"`)
        split (str, optional): ``stratified``, ``random`` or ``file`` (the graphs ``split_file``
            lists). (default: :obj:`"stratified"`)
        split_ratios (Sequence[float], optional): train/valid/test fractions.
        split_seed (int, optional): the split's seed. (default: :obj:`0`)
        use_node_attr, use_edge_attr (bool, optional): read node / edge attributes when the
            dataset has them. (default: :obj:`True`)
        metric (str | None, optional): binary ``rocauc`` | ``ap``; multi-class ``acc`` | ``f1``;
            regression ``rmse`` | ``mae``; None for the first. (default: :obj:`None`)
        split_file (str | None, optional): a JSON file ``{"train": [graphs], "valid": [...],
            "test": [...]}`` of 0-based graph numbers (TU's graph ids less one); given alone it
            implies ``split="file"``; ``cv.folds`` writes one per fold. (default: None)
    """

    def __init__(
        self,
        name: str,
        root: str = "data",
        split: str = "stratified",
        split_ratios: Sequence[float] = (0.8, 0.1, 0.1),
        split_seed: int = 0,
        use_node_attr: bool = True,
        use_edge_attr: bool = True,
        metric: str | None = None,
        split_file: str | None = None,
    ) -> None:
        if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
            raise ConfigError(
                f"dataset.name must be a TU dataset name (e.g. PROTEINS), got {name!r}"
            )
        split = file_split_setting(split, split_file, default="stratified")
        if split not in ("stratified", "random", "file"):
            raise ConfigError(
                f"dataset.split must be 'stratified', 'random' or 'file', got {split!r}"
            )
        for key, value in (("use_node_attr", use_node_attr), ("use_edge_attr", use_edge_attr)):
            if not isinstance(value, bool):
                raise ConfigError(f"dataset.{key} must be true or false, got {value!r}")
        self.name = name
        self.root = root
        self._keep_split(split, split_ratios, split_seed, split_file)
        self.use_node_attr = use_node_attr
        self.use_edge_attr = use_edge_attr
        self.metric = metric
        self._graphs: GraphFile | None = None
        self._task: TaskInfo | None = None
        self._graph_cache: GraphCache | None = None

    @property
    def raw_dir(self) -> str:
        return osp.join(self.root, self.name, "raw")

    def graphs(self) -> GraphFile:
        if self._graphs is None:
            self._download()
            self._graphs, extra = self._cache().graphs(self._read, GraphFile)
            regression = extra["regression"]
            y = self._graphs.data.y
            if regression:
                kind, classes = "regression", None
            else:
                classes = int(y.max()) + 1  # read_tu_data numbers the labels 0..C-1
                kind = "binary" if classes == 2 else "multiclass"
            if classes is not None and classes < 2:
                raise DataError(f"{self.name}: every graph has the same label; nothing to learn")
            task = user_task(self.name, kind, self.metric, y.size(1), classes)
            self._task = with_accuracy(task)
        return self._graphs

    def _read(self) -> tuple[GraphFile, dict]:
        graphs, regression = read_tu_graphs(
            self.raw_dir, self.name, self.use_node_attr, self.use_edge_attr
        )
        return graphs, {"regression": regression}

    def _cache(self) -> GraphCache:
        """The cache of this dataset's graphs: keyed by its raw files' contents and the
        attributes read (``root/NAME/processed/<digest>/``)."""
        if self._graph_cache is None:
            files = sorted(
                osp.join(self.raw_dir, f)
                for f in os.listdir(self.raw_dir)
                if f.startswith(f"{self.name}_") and f.endswith(".txt")
            )
            settings = {"use_node_attr": self.use_node_attr, "use_edge_attr": self.use_edge_attr}
            digest = input_digest(files, settings)
            self._graph_cache = GraphCache(osp.join(self.root, self.name, "processed", digest))
        return self._graph_cache

    def _download(self) -> None:
        if osp.isfile(osp.join(self.raw_dir, f"{self.name}_A.txt")):
            return
        url = f"{TU_URL}/{self.name}.zip"
        folder = osp.join(self.root, self.name)
        fetch_zip(
            url,
            folder,
            self.name,
            self.raw_dir,
            lacks=f"{self.name}_A.txt",
            what=f"TU dataset {self.name}",
            fix=f"download {url} on a machine with network access and unzip its {self.name}/ "
            f"folder's files into {osp.abspath(self.raw_dir)}, or point dataset.root= at the "
            f"folder that holds {self.name}/raw/",
            leftover=folder,
        )

    def task_info(self) -> TaskInfo:
        self.graphs()
        return self._task

    def feature_dims(self) -> tuple[list[int], list[int]]:
        graphs = self.graphs()
        return graphs.node_dims, graphs.edge_dims

    def categorical_columns(
        self, counts: tuple[int, int] | None = None
    ) -> tuple[list[int], list[int]]:
        """Graphs given to predict hold the labels first, then the attributes: ``x`` =
        ``[node labels | node attributes]``, likewise ``edge_attr``. With ``counts`` (the
        model's), the dataset itself is not read (prediction needs no training data)."""
        if counts is not None:
            return list(range(counts[0])), list(range(counts[1]))
        graphs = self.graphs()
        return list(range(len(graphs.node_dims))), list(range(len(graphs.edge_dims)))

    def continuous_dims(self) -> tuple[int, int]:
        graphs = self.graphs()
        return graphs.node_width, graphs.edge_width

    def load(self, pre_transform: StructuralFeatures | None = None) -> LoadedDataset:
        graphs = self.graphs()
        task = self._task
        dataset = InMemoryGraphs.structured(graphs, self._cache(), pre_transform)
        y = graphs.data.y.view(-1)
        if self.split == "file":
            n = graphs.num_graphs
            split = file_split(self.split_file, n, range(n), unit="graph")
        elif self.split == "stratified":
            if task.task_type == "regression":
                raise ConfigError(
                    f"dataset.split=stratified needs class labels, but {self.name} is a "
                    "regression dataset: set dataset.split=random"
                )
            split = stratified_split(y, self.split_ratios, self.split_seed)
        else:
            split = random_split(graphs.num_graphs, self.split_ratios, self.split_seed)
        if task.is_multiclass:
            warn_absent_classes(y[split["train"]], task.num_classes, self.name)
        return LoadedDataset(dataset, split, task)

    def smiles_refusal(self) -> str:
        return (
            f"was trained on the TU dataset {self.name}, not on molecules featurised from "
            "SMILES: predict graphs with predict.py input=graphs.pt, or Predictor.predict_graphs"
        )
