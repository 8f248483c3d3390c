"""A user's own graphs: a list of ``torch_geometric.data.Data`` saved with ``torch.save``
(``dataset=pyg_file dataset.path=graphs.pt``; issue #17).

Each graph holds ``edge_index`` ``[2, E]``, ``x`` ``[N, F]`` (or none: then ``num_nodes``, and
the absent-feature path), an optional ``edge_attr`` ``[E, F_e]``, ``y`` (its targets) and an
optional ``split`` string (``train``, ``valid`` or ``test``). Which columns of ``x`` and
``edge_attr`` are categorical is declared (``dataset.categorical_node_columns``, ...); the others
are continuous. The file is read as data, never code: ``torch.load(weights_only=True)`` with only
PyG's data classes allowed.

Node- and edge-level targets (issue #18): with ``dataset.y_level=node`` each graph's ``y`` is
``[num_nodes, T]`` (or ``[num_nodes]``), one row per node (the atom level of molecules); an
``edge_y`` ``[num_edges, T]`` (or ``[num_edges]``) holds one row per edge of ``edge_index`` (the
bond level), read whenever the graphs carry it. NaN marks a missing label.
"""

from __future__ import annotations

import os.path as osp
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch_geometric.data import Data, InMemoryDataset

from graphormer.data.features import CONTINUOUS_KEYS, split_columns, vocabulary_sizes
from graphormer.data.sources.base import LoadedDataset, Source
from graphormer.data.sources.graph_cache import GraphCache, input_digest
from graphormer.data.splits import file_split, random_split
from graphormer.data.structure import StructuralFeatures
from graphormer.data.tasks import (
    TaskInfo,
    check_class_labels,
    user_task,
    warn_absent_classes,
    with_accuracy,
)
from graphormer.errors import ConfigError, DataError
from graphormer.safe_io import PYG_DATA, load_data, unpickling_reason, unsafe_globals

__all__ = ["GraphFile", "InMemoryGraphs", "PygFileSource", "read_graph_file", "read_graphs"]

SPLITS = ("train", "valid", "test")


@dataclass
class GraphFile:
    """The graphs of a file, checked and flattened: one storage for all of them.

    Attributes:
        data: ``x`` ``[N_total, k]`` long (categorical columns), ``x_continuous`` (if any),
            ``edge_index`` (local ids), ``edge_attr`` ``[E_total, k_e]`` long,
            ``edge_attr_continuous`` (if any), ``y`` ``[G, T]`` float (NaN = missing), ``pos``
            ``[N_total, 3]`` float atom positions when the graphs carry them.
        slices: PyG ``InMemoryDataset`` slices of ``data``.
        splits: each graph's ``split`` string, or None when no graph has one.
        node_dims, edge_dims: vocabulary sizes of the categorical columns.
        node_width, edge_width: widths of the continuous features.
    """

    data: Data
    slices: dict[str, Tensor]
    splits: list[str] | None
    node_dims: list[int]
    edge_dims: list[int]
    node_width: int
    edge_width: int

    @property
    def num_graphs(self) -> int:
        return len(self.slices["x"]) - 1

    @classmethod
    def of_parts(
        cls, data: Data, slices: dict[str, Tensor], splits: list[str] | None, parts: dict
    ) -> GraphFile:
        """The graphs of ``data``, their sizes read from its feature ``parts`` (``x`` and
        ``edge_attr`` categorical, ``*_continuous`` when present)."""
        return cls(
            data,
            slices,
            splits,
            vocabulary_sizes(parts["x"]),
            vocabulary_sizes(parts["edge_attr"]),
            parts["x_continuous"].size(1) if "x_continuous" in parts else 0,
            parts["edge_attr_continuous"].size(1) if "edge_attr_continuous" in parts else 0,
        )


def read_graph_file_exists(path: str, key: str = "dataset.path") -> None:
    """Raises the :class:`DataError` that names ``key`` when there is no file ``path``."""
    if not osp.isfile(path):
        raise DataError(
            f"{key}={path} does not exist; give a file written with "
            "torch.save(list_of_torch_geometric_Data, path)"
        )


def read_graph_file(path: str, key: str = "dataset.path") -> list[Data]:
    """The list of graphs ``path`` holds, read as data only (``key`` names the setting in
    messages).

    Raises:
        DataError: the file is missing, names anything but tensors and PyG's data classes, or
            does not hold a list of ``Data``.
    """
    read_graph_file_exists(path, key)
    try:
        graphs = load_data(path, [PYG_DATA])
    except Exception as error:  # refused globals, a truncated file, not a torch file ...
        names = unsafe_globals(path, [PYG_DATA])
        reason = f"it names {', '.join(names[:5])}" if names else unpickling_reason(error)
        raise DataError(
            f"{key}={path} is not read: it holds more than tensors and PyG Data objects "
            f"({reason}), or is not a torch.save file. A graph file is data, "
            "never code: save a plain list of torch_geometric.data.Data whose attributes are "
            "tensors (and a `split` string)"
        ) from error
    if isinstance(graphs, Data):
        graphs = [graphs]
    if not isinstance(graphs, list | tuple) or not graphs:
        raise DataError(
            f"{key}={path} holds a {type(graphs).__name__}, not a non-empty list of "
            "torch_geometric.data.Data"
        )
    wrong = [i for i, g in enumerate(graphs) if not isinstance(g, Data)]
    if wrong:
        raise DataError(
            f"{key}={path}: item {wrong[0]} is a {type(graphs[wrong[0]]).__name__}, "
            "not a torch_geometric.data.Data"
        )
    return list(graphs)


def _features(graphs: list[Data], key: str, counts: Tensor, where: str, kind: str) -> Tensor | None:
    """``key`` of every graph concatenated ``[rows, F]`` (None when no graph has it)."""
    present = [g.get(key) is not None for g in graphs]
    if not any(present):
        return None
    if not all(present):
        missing = present.index(False)
        raise DataError(f"{where}: graph {missing} has no {key} but others have one")
    values = []
    width = None
    for i, g in enumerate(graphs):
        value = g[key]
        if not isinstance(value, Tensor):
            raise DataError(f"{where}: graph {i}'s {key} is a {type(value).__name__}, not a tensor")
        value = value.view(-1, 1) if value.dim() == 1 else value
        if value.dim() != 2 or value.size(0) != int(counts[i]):
            raise DataError(
                f"{where}: graph {i}'s {key} has shape {list(value.shape)}; expected "
                f"[{int(counts[i])}, F] (one row per {kind})"
            )
        if width is None:
            width = value.size(1)
        elif value.size(1) != width:
            raise DataError(
                f"{where}: graph {i}'s {key} has {value.size(1)} columns, graph 0's {width}: "
                "every graph needs the same feature columns"
            )
        values.append(value)
    return torch.cat(values)


def read_graphs(
    graphs: list[Data],
    where: str,
    categorical_node_columns: Sequence[int] = (),
    categorical_edge_columns: Sequence[int] = (),
    with_labels: bool = True,
    y_level: str = "graph",
) -> GraphFile:
    """Checks and flattens ``graphs`` (see :class:`GraphFile`); ``where`` names them in errors.
    With labels, ``y_level="node"`` reads ``y`` as node-level targets (``y_atom``), and an
    ``edge_y`` of the graphs as edge-level targets (``y_bond``, one per edge: ``bond_edge``)."""
    num_nodes, num_edges, edge_index = [], [], []
    for i, g in enumerate(graphs):
        ei = g.get("edge_index")
        if not isinstance(ei, Tensor) or ei.dim() != 2 or ei.size(0) != 2:
            shape = list(ei.shape) if isinstance(ei, Tensor) else type(ei).__name__
            raise DataError(f"{where}: graph {i}'s edge_index is {shape}, not a [2, E] tensor")
        if ei.is_floating_point() or ei.dtype == torch.bool:
            raise DataError(f"{where}: graph {i}'s edge_index holds {ei.dtype}, not integers")
        x = g.get("x")
        n = x.size(0) if isinstance(x, Tensor) and x.dim() >= 1 else g.num_nodes
        if not n:
            raise DataError(f"{where}: graph {i} has no nodes (give x, or num_nodes)")
        if ei.numel() and (int(ei.min()) < 0 or int(ei.max()) >= n):
            raise DataError(
                f"{where}: graph {i}'s edge_index refers to node {int(ei.max())} (or below 0) "
                f"but the graph has {n} nodes (ids 0..{n - 1})"
            )
        num_nodes.append(int(n))
        num_edges.append(ei.size(1))
        edge_index.append(ei.long())
    nodes = torch.tensor(num_nodes)
    edges = torch.tensor(num_edges)
    node_graph = torch.arange(len(graphs)).repeat_interleave(nodes)
    edge_graph = torch.arange(len(graphs)).repeat_interleave(edges)
    parts = {}
    for kind, key, count, graph_of, columns in (
        ("node", "x", nodes, node_graph, categorical_node_columns),
        ("edge", "edge_attr", edges, edge_graph, categorical_edge_columns),
    ):
        values = _features(graphs, key, count, where, kind)
        setting = f"dataset.categorical_{kind}_columns"
        if values is None:
            if columns:
                raise DataError(
                    f"{setting}={list(columns)} but the graphs of {where} have no {key}"
                )
            parts[key] = torch.zeros(int(count.sum()), 0, dtype=torch.long)
            continue
        categorical, continuous = split_columns(values, columns, graph_of, kind, where, setting)
        parts[key] = categorical
        if continuous is not None:
            parts[CONTINUOUS_KEYS[kind]] = continuous
    data = Data(edge_index=torch.cat(edge_index, dim=1), **parts)
    node_ptr = torch.cat([torch.zeros(1, dtype=torch.long), nodes.cumsum(0)])
    edge_ptr = torch.cat([torch.zeros(1, dtype=torch.long), edges.cumsum(0)])
    slices = {"x": node_ptr, "edge_index": edge_ptr, "edge_attr": edge_ptr.clone()}
    if "x_continuous" in parts:
        slices["x_continuous"] = node_ptr.clone()
    if "edge_attr_continuous" in parts:
        slices["edge_attr_continuous"] = edge_ptr.clone()
    pos = _features(graphs, "pos", nodes, where, "node")
    if pos is not None:  # atom positions (PyG's QM9, MD17): what a 3D model reads
        if pos.size(1) != 3 or not torch.isfinite(pos).all():
            raise DataError(
                f"{where}: pos holds {pos.size(1)} column(s) or a non-finite value; atom "
                "positions are [num_nodes, 3] finite coordinates (Angstrom)"
            )
        data.pos = pos.float()
        slices["pos"] = node_ptr.clone()
    if with_labels:
        _level_labels(graphs, where, y_level, data, slices, nodes, edges)
    splits = _splits(graphs, where)
    return GraphFile.of_parts(data, slices, splits, parts)


def _level_labels(
    graphs: list[Data],
    where: str,
    y_level: str,
    data: Data,
    slices: dict[str, Tensor],
    nodes: Tensor,
    edges: Tensor,
) -> None:
    """The targets of every level into ``data`` and ``slices``: ``y`` ``[G, T]`` per graph (``[G,
    0]`` when the graphs' labels are per node or per edge alone), ``y_atom`` ``[N_total, T_node]``
    with ``y_level="node"``, ``y_bond`` ``[E_total, T_edge]`` and ``bond_edge`` (each graph's
    edge ids) when the graphs carry ``edge_y``."""
    has_edge_y = any(g.get("edge_y") is not None for g in graphs)
    if y_level == "node":
        data.y_atom = _per_item(graphs, "y", nodes, where, "node")
        slices["y_atom"] = torch.cat([torch.zeros(1, dtype=torch.long), nodes.cumsum(0)])
        data.y = torch.zeros(len(graphs), 0)
    elif has_edge_y and all(g.get("y") is None for g in graphs):
        data.y = torch.zeros(len(graphs), 0)  # edge targets alone
    else:
        data.y = _labels(graphs, where)
    slices["y"] = torch.arange(len(graphs) + 1)
    if has_edge_y:
        edge_ptr = torch.cat([torch.zeros(1, dtype=torch.long), edges.cumsum(0)])
        data.y_bond = _per_item(graphs, "edge_y", edges, where, "edge")
        data.bond_edge = torch.cat([torch.arange(int(e)) for e in edges])
        slices["y_bond"] = edge_ptr
        slices["bond_edge"] = edge_ptr.clone()


def _per_item(graphs: list[Data], key: str, counts: Tensor, where: str, kind: str) -> Tensor:
    """The per-node (per-edge) labels ``key`` of every graph, ``[rows, T]`` float (NaN =
    missing): one row per node (edge), the same width everywhere."""
    rows = []
    for i, g in enumerate(graphs):
        value = g.get(key)
        if not isinstance(value, Tensor):
            raise DataError(
                f"{where}: graph {i} has no {key} tensor, but the graphs' {kind}-level labels "
                f"are read from {key}: give every graph one ([{kind}s, T], NaN = missing)"
            )
        value = value.view(-1, 1) if value.dim() == 1 else value
        if value.dim() != 2 or value.size(0) != int(counts[i]):
            raise DataError(
                f"{where}: graph {i}'s {key} has shape {list(value.shape)}, but it has "
                f"{int(counts[i])} {kind}s: {kind}-level labels are [{kind}s, T], one row per "
                f"{kind}"
                + (" (graph-level labels: leave dataset.y_level=graph)" if key == "y" else "")
            )
        rows.append(value.double())
    return _stacked(rows, counts, where, f"{kind}-level targets ({key})", "", f"{key} label")


def _labels(graphs: list[Data], where: str) -> Tensor:
    rows = []
    for i, g in enumerate(graphs):
        y = g.get("y")
        if isinstance(y, int | float) and not isinstance(y, bool):
            y = torch.tensor([float(y)])
        if not isinstance(y, Tensor) or y.numel() == 0:
            raise DataError(f"{where}: graph {i} has no label y (a tensor of its targets)")
        rows.append(y.double().reshape(1, -1))
    hint = "; a y of one row per node: dataset.y_level=node"
    return _stacked(rows, torch.ones(len(rows), dtype=torch.long), where, "targets", hint, "label")


def _stacked(
    rows: list[Tensor], counts: Tensor, where: str, targets: str, hint: str, label: str
) -> Tensor:
    """Graph i's label rows ``rows[i]`` (``[counts[i], T]``: one per node, per edge, or its one
    row) as one ``[sum(counts), T]`` float tensor; NaN (missing) stays, while graphs of different
    widths T or an infinite label are refused, naming the graph.

    Raises:
        DataError: ``{where}: graphs hold [...] {targets} each; ...{hint})`` or
            ``{where}: graph G has an infinite {label}``.
    """
    widths = {r.size(1) for r in rows}
    if len(widths) != 1:
        raise DataError(
            f"{where}: graphs hold {sorted(widths)} {targets} each; every graph needs the same "
            f"number (NaN for a missing one{hint})"
        )
    values = torch.cat(rows)
    if torch.isinf(values).any():
        row = int(torch.isinf(values).any(-1).nonzero()[0])
        graph = int(torch.searchsorted(counts.cumsum(0), row, right=True))
        raise DataError(f"{where}: graph {graph} has an infinite {label}")
    return values.float()


def _splits(graphs: list[Data], where: str) -> list[str] | None:
    values = [g.get("split") for g in graphs]
    if all(v is None for v in values):
        return None
    bad = [i for i, v in enumerate(values) if v not in SPLITS]
    if bad:
        raise DataError(
            f"{where}: graph {bad[0]}'s split is {values[bad[0]]!r}; when graphs carry a split "
            f"every one names {' | '.join(SPLITS)}"
        )
    return values


class InMemoryGraphs(InMemoryDataset):
    """The flattened graphs, in memory (PyG's storage: ``dataset[i]`` is one ``Data``)."""

    def __init__(self, graphs: GraphFile) -> None:
        super().__init__(None, log=False)
        self.data, self.slices = graphs.data, graphs.slices

    @classmethod
    def structured(
        cls, graphs: GraphFile, cache: GraphCache, pre_transform: StructuralFeatures | None
    ) -> InMemoryGraphs:
        """``graphs`` as a dataset, with ``pre_transform``'s structure computed once and kept in
        ``cache`` beside them (keyed by the file's content: a changed file is read again)."""
        if pre_transform is not None:
            cache.add_structure(graphs, pre_transform)
        return cls(graphs)


class PygFileSource(Source):
    """A user's own graphs from a ``torch.save`` file of PyG ``Data``.

    Args:
        path (str): the file.
        task_type (str, optional): ``regression`` (RMSE, or ``mae``), ``binary`` (0/1 labels,
            ROC-AUC or ``ap``) or ``multiclass`` (class ids, accuracy or ``f1``).
            (default: :obj:`"regression"`)
        metric (str | None, optional): see ``task_type``; None for its first. (default: None)
        categorical_node_columns, categorical_edge_columns (Sequence[int], optional): the
            columns of ``x`` / ``edge_attr`` holding class ids (embedding tables); the others are
            continuous (a standardised linear projection). (default: none)
        num_classes (int | None, optional): classes of a multi-class task; None: the largest
            label + 1.
        split_ratios (Sequence[float], optional): train/valid/test fractions of the seeded
            random split, for graphs without a ``split``. (default: :obj:`(0.8, 0.1, 0.1)`)
        split_seed (int, optional): its seed. (default: :obj:`0`)
        split_file (str | None, optional): a JSON file ``{"train": [graphs], "valid": [...],
            "test": [...]}`` of 0-based positions in the file's list; it replaces the graphs'
            own ``split`` and the random split (``cv.folds`` writes one per fold). (default: None)
        root (str, optional): folder for the cache of the graphs and their structural
            features, and lock files. (default: :obj:`"data"`)
        name (str, optional): label used in outputs. (default: :obj:`"pyg_file"`)
        y_level (str, optional): ``graph`` (``y`` holds each graph's targets) or ``node``
            (``y`` is ``[num_nodes, T]``: node-level targets, issue #18). (default:
            :obj:`"graph"`)
        node_task_type, edge_task_type (str, optional): ``regression`` or ``binary``, of the
            node-level ``y`` and of the edge-level ``edge_y``. (default: :obj:`"regression"`)
    """

    def __init__(
        self,
        path: str,
        task_type: str = "regression",
        metric: str | None = None,
        categorical_node_columns: Sequence[int] = (),
        categorical_edge_columns: Sequence[int] = (),
        num_classes: int | None = None,
        split_ratios: Sequence[float] = (0.8, 0.1, 0.1),
        split_seed: int = 0,
        root: str = "data",
        name: str = "pyg_file",
        y_level: str = "graph",
        node_task_type: str = "regression",
        edge_task_type: str = "regression",
        split_file: str | None = None,
    ) -> None:
        if y_level not in ("graph", "node"):
            raise ConfigError(f"dataset.y_level must be graph | node, got {y_level!r}")
        for key, value in (("node_task_type", node_task_type), ("edge_task_type", edge_task_type)):
            if value not in ("regression", "binary"):
                raise ConfigError(f"dataset.{key} must be regression | binary, got {value!r}")
        self.y_level = y_level
        self.node_task_type = node_task_type
        self.edge_task_type = edge_task_type
        for key, columns in (
            ("categorical_node_columns", categorical_node_columns),
            ("categorical_edge_columns", categorical_edge_columns),
        ):
            if not isinstance(columns, list | tuple) or not all(
                isinstance(c, int) and not isinstance(c, bool) for c in columns
            ):
                raise ConfigError(
                    f"dataset.{key} must be a list of column numbers, got {columns!r}"
                )
        if num_classes is not None and (
            isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2
        ):
            raise ConfigError(f"dataset.num_classes must be an integer >= 2, got {num_classes!r}")
        # Checked now (before the file is read): an unknown type or a metric that does not fit.
        user_task(name, task_type, metric, 1, 2)
        self.path = str(path)
        self.task_type = task_type
        self.metric = metric
        self.categorical_node_columns = [int(c) for c in categorical_node_columns]
        self.categorical_edge_columns = [int(c) for c in categorical_edge_columns]
        self.num_classes = num_classes
        self._keep_split(
            "file" if split_file is not None else "random", split_ratios, split_seed, split_file
        )
        self.root = root
        self.name = name
        self._graphs: GraphFile | None = None
        self._task: TaskInfo | None = None
        self._graph_cache: GraphCache | None = None

    def graphs(self) -> GraphFile:
        """The file's graphs, read and checked once (from the cache when an earlier run read
        this file's content with these settings)."""
        if self._graphs is None:
            self._graphs, _ = self._cache().graphs(self._read, GraphFile)
        return self._graphs

    def _read(self) -> tuple[GraphFile, dict]:
        graphs = read_graphs(
            read_graph_file(self.path),
            f"dataset.path={self.path}",
            self.categorical_node_columns,
            self.categorical_edge_columns,
            y_level=self.y_level,
        )
        return graphs, {}

    def _cache(self) -> GraphCache:
        """The cache of the file's graphs, ``root/pyg_file/<stem>_<digest>/``: keyed by the
        file's content and every setting :meth:`_read` passes to :func:`read_graphs`."""
        if self._graph_cache is None:
            read_graph_file_exists(self.path)
            settings = [self.categorical_node_columns, self.categorical_edge_columns, self.y_level]
            settings.append("pos")  # caches written before positions were kept are read again
            digest = input_digest([self.path], settings)
            stem = osp.splitext(osp.basename(self.path))[0]
            self._graph_cache = GraphCache(osp.join(self.root, "pyg_file", f"{stem}_{digest}"))
        return self._graph_cache

    def task_info(self) -> TaskInfo:
        # Targets and classes come from the file: read once (a user's file is small next to
        # the training it feeds).
        if self._task is None:
            y = self.graphs().data.y
            where = f"dataset.path={self.path}"
            if not y.size(1) and self.task_type != "regression":
                raise ConfigError(
                    f"dataset.task_type={self.task_type} is of graph-level labels, and these "
                    "graphs hold node- or edge-level labels alone: leave "
                    "dataset.task_type=regression and set dataset.node_task_type / "
                    "dataset.edge_task_type"
                )
            classes = None
            if self.task_type == "multiclass":
                classes = check_class_labels(y, self.num_classes, where)
            elif self.task_type == "binary":
                bad = ~(torch.isnan(y) | (y == 0) | (y == 1))
                if bad.any():
                    graph = int(bad.any(-1).nonzero()[0])
                    raise DataError(
                        f"{where}: graph {graph} has label {y[graph].tolist()}, but "
                        "dataset.task_type=binary takes 0/1 labels (NaN = missing); use "
                        "dataset.task_type=multiclass or regression"
                    )
            data = self.graphs().data
            levels = {}
            for level, key, task_type in (
                ("atom", "y_atom", self.node_task_type),
                ("bond", "y_bond", self.edge_task_type),
            ):
                labels = data.get(key)
                if labels is None:
                    continue
                levels[f"{level}_tasks"] = labels.size(1)
                levels[f"{level}_task_type"] = task_type
                _check_binary_items(labels, task_type, key, where)
            if not y.size(1) and not levels:
                raise DataError(f"{where}: the graphs hold no targets (y, or edge_y)")
            task = user_task(self.name, self.task_type, self.metric, y.size(1), classes, **levels)
            self._task = with_accuracy(task)  # binary: accuracy reported beside the metric
        return self._task

    def feature_dims(self) -> tuple[list[int], list[int]]:
        graphs = self.graphs()
        return graphs.node_dims, graphs.edge_dims

    def categorical_columns(
        self,
        counts: tuple[int, int] | None = None,  # noqa: ARG002
    ) -> tuple[list[int], list[int]]:
        return self.categorical_node_columns, self.categorical_edge_columns

    def continuous_dims(self) -> tuple[int, int]:
        graphs = self.graphs()
        return graphs.node_width, graphs.edge_width

    def load(self, pre_transform: StructuralFeatures | None = None) -> LoadedDataset:
        graphs = self.graphs()
        task = self.task_info()
        dataset = InMemoryGraphs.structured(graphs, self._cache(), pre_transform)
        if self.split_file is not None:
            n = graphs.num_graphs
            split = file_split(self.split_file, n, range(n), unit="graph")
        elif graphs.splits is None:
            split = random_split(graphs.num_graphs, self.split_ratios, self.split_seed)
        else:
            names = graphs.splits
            split = {
                s: torch.tensor([i for i, v in enumerate(names) if v == s], dtype=torch.long)
                for s in SPLITS
            }
        if task.is_multiclass:
            warn_absent_classes(graphs.data.y[split["train"]], task.num_classes, self.name)
        return LoadedDataset(dataset, split, task)

    def has_positions(self) -> bool:
        """Whether the file's graphs carry ``pos`` (all of them, or a read error says which)."""
        return "pos" in self.graphs().slices

    def smiles_refusal(self) -> str:
        return (
            f"was trained on graphs from a file ({self.path}), not on molecules featurised from "
            "SMILES: predict graphs with predict.py input=graphs.pt, or Predictor.predict_graphs"
        )


def _check_binary_items(labels: Tensor, task_type: str, key: str, where: str) -> None:
    """Binary node (edge) labels are 0/1 (NaN = missing)."""
    bad = ~(torch.isnan(labels) | (labels == 0) | (labels == 1))
    if task_type == "binary" and bad.any():
        level = "node" if key == "y_atom" else "edge"
        raise DataError(
            f"{where}: a {level}-level label is {float(labels[bad][0])}, but "
            f"dataset.{level}_task_type=binary takes 0/1 labels (NaN = missing); use "
            f"dataset.{level}_task_type=regression"
        )
