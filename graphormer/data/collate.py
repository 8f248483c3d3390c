"""Dense, padded batches for Graphormer, built with a fixed number of vectorised tensor ops."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Data

from graphormer.batch import GraphormerBatch
from graphormer.data.periodic import ATOM_INTEGER_KEYS
from graphormer.data.structure import STRUCTURAL_KEYS, structural_features

__all__ = ["GraphormerBatch", "GraphormerCollator", "padded_length"]


def padded_length(num_nodes: int | Tensor, pad_to_multiple: int) -> int | Tensor:
    """The attention length of a dense batch whose largest graph has ``num_nodes`` nodes: the
    nodes plus Graphormer's graph token, rounded up to a multiple of ``pad_to_multiple``.

    The one rule for both the collator's padding and the datamodule's token budget
    (``datamodule.max_tokens``), so that the budget counts exactly what a batch holds.

    Args:
        num_nodes (int | torch.Tensor): node counts (elementwise for a tensor).
        pad_to_multiple (int): the padding multiple.
    """
    return (num_nodes + pad_to_multiple) // pad_to_multiple * pad_to_multiple


class GraphormerCollator:
    """Collates PyG graphs into a :class:`GraphormerBatch`, padding to the largest graph.

    Graphs carry the features of :class:`~graphormer.data.StructuralFeatures` (the cached mode);
    graphs without them have them computed here for the whole batch at once (the on-the-fly mode,
    for datasets too large to cache). Items may be ``Data`` or ``(dataset_index, Data)`` pairs.

    Args:
        max_hops (int, optional): path edges per pair in the batch. (default: :obj:`5`)
        pad_to_multiple (int, optional): pad so that the attention length, the nodes plus
            Graphormer's graph token, is a multiple of this (8 suits tensor cores and the fused
            attention kernels' alignment). (default: :obj:`1`)
    """

    def __init__(self, max_hops: int = 5, pad_to_multiple: int = 1) -> None:
        if max_hops < 1:
            raise ValueError(f"max_hops must be >= 1, got {max_hops}")
        if pad_to_multiple < 1:
            raise ValueError(f"pad_to_multiple must be >= 1, got {pad_to_multiple}")
        self.max_hops = max_hops
        self.pad_to_multiple = pad_to_multiple

    def __call__(self, items: Sequence[Data | tuple[int, Data]]) -> GraphormerBatch:
        if len(items) == 0:
            raise ValueError("cannot collate an empty list of graphs")
        if isinstance(items[0], tuple):
            index = torch.tensor([i for i, _ in items], dtype=torch.long)
            graphs = [g for _, g in items]
        else:
            index, graphs = None, list(items)
        # One shallow dict per graph: PyG's attribute access costs ~10 us a call, which would
        # dominate the collation of a large batch.
        stores = [g.to_dict() for g in graphs]

        x = torch.cat([s["x"] for s in stores]).long()
        if x.dim() == 1:
            x = x.unsqueeze(-1)
        num_nodes = torch.tensor([s["x"].size(0) for s in stores], dtype=torch.long)
        num_edges = torch.tensor([s["edge_index"].size(1) for s in stores], dtype=torch.long)
        feats = self._structure(stores, num_nodes, num_edges)

        batch_size = len(stores)
        # Nodes + graph token = a multiple of `pad_to_multiple`.
        n_max = padded_length(int(num_nodes.max()), self.pad_to_multiple) - 1
        graph_ids = torch.arange(batch_size)

        # Destination of every node in the flattened [B * N] padded layout.
        node_ptr = torch.cumsum(num_nodes, 0) - num_nodes
        node_graph = graph_ids.repeat_interleave(num_nodes)
        node_local = torch.arange(int(num_nodes.sum())) - node_ptr[node_graph]
        node_dest = node_graph * n_max + node_local

        x_pad = x.new_zeros(batch_size * n_max, x.size(-1)).index_copy_(0, node_dest, x)
        x_continuous = _continuous(stores, "x_continuous")
        if x_continuous is not None:
            x_continuous = (
                x_continuous.new_zeros(batch_size * n_max, x_continuous.size(-1))
                .index_copy_(0, node_dest, x_continuous)
                .view(batch_size, n_max, x_continuous.size(-1))
            )
        node_mask = torch.zeros(batch_size * n_max, dtype=torch.bool)
        node_mask[node_dest] = True
        in_degree = torch.zeros(batch_size * n_max, dtype=torch.long)
        in_degree[node_dest] = feats["in_degree"].long()
        out_degree = torch.zeros(batch_size * n_max, dtype=torch.long)
        out_degree[node_dest] = feats["out_degree"].long()

        # Destination of every pair (i, j) in the flattened [B * N * N] padded layout. Index
        # arithmetic on these small integer arrays is several times faster in numpy than in torch.
        sizes = num_nodes.numpy()
        pairs_per_graph = sizes * sizes
        pair_graph = np.repeat(np.arange(batch_size), pairs_per_graph)
        within = np.arange(int(pairs_per_graph.sum())) - np.repeat(
            np.cumsum(pairs_per_graph) - pairs_per_graph, pairs_per_graph
        )
        n_of_pair = np.repeat(sizes, pairs_per_graph)
        row, col = np.divmod(within, n_of_pair)
        pair_dest = torch.from_numpy((pair_graph * n_max + row) * n_max + col)

        # Compact integer types: the padded pair tensors are the largest part of a batch.
        spatial_pos = torch.full((batch_size * n_max * n_max,), -1, dtype=torch.int16)
        spatial_pos[pair_dest] = feats["spatial_pos"].to(torch.int16)

        # Edge ids are local to each graph; shift them to rows of the batch's edge_attr.
        edges = num_edges.numpy()
        path_type = np.int16 if int(edges.sum()) < 2**15 else np.int32
        path = feats["edge_path"][:, : self.max_hops].numpy().astype(path_type, copy=False)
        shift = (np.cumsum(edges) - edges).astype(path_type)[pair_graph][:, None]
        path = path + shift * (path >= 0)  # -1 (no edge) stays -1
        edge_path = torch.full(
            (batch_size * n_max * n_max, self.max_hops), -1, dtype=torch.from_numpy(path).dtype
        )
        edge_path[pair_dest] = torch.from_numpy(path)

        edge_attr = _edge_features(stores)
        y = None
        if all(s.get("y") is not None for s in stores):
            y = torch.cat([s["y"] for s in stores]).float()
            # reshape, not view(B, -1): a graph may hold no molecule target (atoms alone).
            y = y.reshape(batch_size, y.numel() // batch_size)
        y_atom = None
        if all(s.get("y_atom") is not None for s in stores):
            labels = torch.cat([s["y_atom"] for s in stores]).float()  # [nodes, T_atom]
            y_atom = torch.full(
                (batch_size * n_max, labels.size(-1)), float("nan"), dtype=labels.dtype
            )
            y_atom = y_atom.index_copy_(0, node_dest, labels).view(batch_size, n_max, -1)
        bonds = _bonds(stores, num_edges, batch_size)
        pos = _continuous(stores, "pos")
        if pos is not None:
            pos = pos.new_zeros(batch_size * n_max, 3).index_copy_(0, node_dest, pos)
            pos = pos.view(batch_size, n_max, 3)
        y_atom_vector = None
        if all(s.get("y_atom_vector") is not None for s in stores):
            vectors = torch.cat([s["y_atom_vector"] for s in stores]).float()  # [nodes, T, 3]
            y_atom_vector = vectors.new_full((batch_size * n_max, *vectors.shape[1:]), float("nan"))
            y_atom_vector = y_atom_vector.index_copy_(0, node_dest, vectors)
            y_atom_vector = y_atom_vector.view(batch_size, n_max, *vectors.shape[1:])
        tags, image_of = (
            _node_integers(stores, key, node_dest, batch_size * n_max, fill)
            for key, fill in zip(ATOM_INTEGER_KEYS, (0, -1), strict=True)
        )
        return GraphormerBatch(
            x=x_pad.view(batch_size, n_max, x.size(-1)),
            in_degree=in_degree.view(batch_size, n_max),
            out_degree=out_degree.view(batch_size, n_max),
            spatial_pos=spatial_pos.view(batch_size, n_max, n_max),
            edge_path=edge_path.view(batch_size, n_max, n_max, self.max_hops),
            edge_attr=edge_attr,
            node_mask=node_mask.view(batch_size, n_max),
            y=y,
            index=index,
            x_continuous=x_continuous,
            edge_attr_continuous=_continuous(stores, "edge_attr_continuous"),
            y_atom=y_atom,
            **bonds,
            molecule_features=_continuous(stores, "molecule_features"),
            pos=pos,
            y_atom_vector=y_atom_vector,
            tags=None if tags is None else tags.view(batch_size, n_max),
            image_of=None if image_of is None else image_of.view(batch_size, n_max),
        )

    def _structure(
        self, stores: list[dict], num_nodes: Tensor, num_edges: Tensor
    ) -> dict[str, Tensor]:
        cached = ["spatial_pos" in s for s in stores]
        if all(cached):
            stored_hops = stores[0]["edge_path"].size(-1)
            if stored_hops < self.max_hops:
                raise ValueError(
                    f"the dataset's cached edge paths hold {stored_hops} hops but {self.max_hops} "
                    "are asked for: rebuild the cache with max_hops >= the model's "
                    "multi_hop_max_dist (set datamodule.max_hops)"
                )
            return {key: torch.cat([s[key] for s in stores]) for key in STRUCTURAL_KEYS}
        if any(cached):
            raise ValueError("some graphs carry cached structural features and some do not")
        edge_index = torch.cat([s["edge_index"] for s in stores], dim=1)
        return structural_features(edge_index, num_nodes, num_edges, self.max_hops)


def _bonds(stores: list[dict], num_edges: Tensor, batch_size: int) -> dict[str, Tensor]:
    """The bonds that carry bond-level targets (issue #18), padded to the batch's most bonds
    ``M``: ``bond_atoms`` ``[B, M, 2]``, ``bond_edge`` ``[B, M]`` (rows of the batch's
    ``edge_attr``), ``bond_mask`` ``[B, M]`` and, when the graphs carry labels, ``y_bond``
    ``[B, M, T_bond]`` (NaN at padding). Each graph lists its bonds as ``bond_edge``: ids of its
    own edges (a molecule's bond ``k`` is its edge ``2k``, see ``molecule_bond_edges``). Empty
    when the graphs carry no bonds."""
    present = [s.get("bond_edge") is not None for s in stores]
    if not any(present):
        return {}
    if not all(present):
        raise ValueError("some graphs of the batch carry bond_edge and some do not")
    local = torch.cat([s["bond_edge"].view(-1) for s in stores]).long()  # [bonds]
    counts = torch.tensor([s["bond_edge"].numel() for s in stores], dtype=torch.long)
    graph = torch.arange(batch_size).repeat_interleave(counts)
    edge_ptr = torch.cumsum(num_edges, 0) - num_edges
    rows = local + edge_ptr[graph]  # rows of the batch's edge_attr
    # edge_index holds each graph's own node ids: the atoms' positions in the padded layout.
    ends = torch.cat([s["edge_index"] for s in stores], dim=1).long()[:, rows].t()  # [bonds, 2]
    m_max = max(int(counts.max()), 1)
    dest = (
        graph * m_max + torch.arange(int(counts.sum())) - (torch.cumsum(counts, 0) - counts)[graph]
    )
    bond_atoms = torch.zeros(batch_size * m_max, 2, dtype=torch.long).index_copy_(0, dest, ends)
    bond_edge = torch.zeros(batch_size * m_max, dtype=torch.long).index_copy_(0, dest, rows)
    bond_mask = torch.zeros(batch_size * m_max, dtype=torch.bool)
    bond_mask[dest] = True
    out = {
        "bond_atoms": bond_atoms.view(batch_size, m_max, 2),
        "bond_edge": bond_edge.view(batch_size, m_max),
        "bond_mask": bond_mask.view(batch_size, m_max),
    }
    if all(s.get("y_bond") is not None for s in stores):
        labels = torch.cat([s["y_bond"] for s in stores]).float()  # [bonds, T_bond]
        labels = labels.view(len(local), -1)
        y_bond = torch.full((batch_size * m_max, labels.size(-1)), float("nan"), dtype=labels.dtype)
        out["y_bond"] = y_bond.index_copy_(0, dest, labels).view(batch_size, m_max, -1)
    return out


def _node_integers(
    stores: list[dict], key: str, node_dest: Tensor, size: int, fill: int
) -> Tensor | None:
    """The per-node integers ``key`` (atom tags, image sources) of all graphs in the flat padded
    layout ``[B * N]`` (``fill`` at padding), or None when no graph has them. A batch mixing
    graphs with and without them (periodic and molecular frames of one file) gives those
    without the value of a real atom without a tag: ``fill``."""
    if all(s.get(key) is None for s in stores):
        return None
    values = torch.cat(
        [
            s[key].long().view(-1)
            if s.get(key) is not None
            else torch.full((s["x"].size(0),), fill, dtype=torch.long)
            for s in stores
        ]
    )
    return torch.full((size,), fill, dtype=torch.long).index_copy_(0, node_dest, values)


def _continuous(stores: list[dict], key: str) -> Tensor | None:
    """The float features ``key`` of all graphs, concatenated ``[rows, F]``; None when no graph
    has them (every graph of a dataset has them or none does)."""
    present = [s.get(key) is not None for s in stores]
    if not any(present):
        return None
    if not all(present):
        raise ValueError(f"some graphs of the batch carry {key} and some do not")
    values = torch.cat([s[key] for s in stores]).float()
    return values.unsqueeze(-1) if values.dim() == 1 else values


def _edge_features(stores: list[dict]) -> Tensor:
    missing = [i for i, s in enumerate(stores) if s.get("edge_attr") is None]
    if missing:
        # Never substitute made-up edge features (Hugging Face's port silently used all-ones).
        raise ValueError(
            f"graph {missing[0]} of the batch has no edge_attr: Graphormer's edge encoding needs "
            "categorical edge features [E, F_e] stored as `edge_attr`"
        )
    edge_attr = torch.cat([s["edge_attr"] for s in stores]).long()
    return edge_attr.unsqueeze(-1) if edge_attr.dim() == 1 else edge_attr
