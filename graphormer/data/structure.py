"""Graphormer's structural features: the degrees, hop distances and path edges of graphs, as
torch tensors (computed once and cached with the dataset, or per batch by the collator). The
shortest paths themselves are computed in numpy by :mod:`graphormer.portable.paths`, which the
ONNX predictor shares without torch.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.transforms import BaseTransform

from graphormer.portable.paths import PairLayout, batched_shortest_paths, degrees

__all__ = [
    "STRUCTURAL_KEYS",
    "PairLayout",
    "StructuralFeatures",
    "add_structural_features",
    "batched_shortest_paths",
    "max_useful_hops",
    "shortest_paths",
    "structural_features",
]


def max_useful_hops(max_nodes: int) -> int:
    """The most path edges a graph of at most ``max_nodes`` nodes can fill: a shortest path
    visits each node once, so it has at most ``max_nodes - 1`` edges. Every node pair stores
    ``max_hops`` edge ids whatever its path's length, so hops beyond this cost memory (GBs at
    ``max_hops`` in the thousands) and are never read."""
    return max(1, int(max_nodes) - 1)


def shortest_paths(edge_index: Tensor, num_nodes: int, max_hops: int) -> tuple[Tensor, Tensor]:
    """All-pairs shortest-path distances and one shortest path's edges for a single graph.

    Edges are followed as directed, exactly as given (OGB molecules list every bond both ways).

    Args:
        edge_index (Tensor): ``[2, E]`` edge list.
        num_nodes (int): number of nodes ``N`` (may be 1, and the graph may have no edges).
        max_hops (int): number of path edges to keep per pair.

    Returns:
        ``spatial_pos`` ``[N, N]`` long: hop count from ``i`` to ``j``, 0 on the diagonal, -1 when ``j``
        is unreachable from ``i``. ``edge_path`` ``[N, N, max_hops]`` long: ``edge_path[i, j, k]`` is the
        column in ``edge_index`` of the ``k``-th edge of a shortest ``i -> j`` path for
        ``k < min(spatial_pos[i, j], max_hops)``, else -1.
    """
    edge_index = torch.as_tensor(edge_index).cpu()
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError(f"edge_index must have shape [2, E], got {tuple(edge_index.shape)}")
    num_edges = edge_index.size(1)
    if num_edges and (int(edge_index.min()) < 0 or int(edge_index.max()) >= num_nodes):
        raise ValueError(f"edge_index refers to nodes outside [0, {num_nodes})")
    dist, path, _ = batched_shortest_paths(
        edge_index.numpy(), np.array([num_nodes]), np.array([num_edges]), max_hops
    )
    spatial_pos = torch.from_numpy(dist.astype(np.int64)).view(num_nodes, num_nodes)
    edge_path = torch.from_numpy(path.astype(np.int64)).view(num_nodes, num_nodes, max_hops)
    return spatial_pos, edge_path


# -- the structural features of a graph --------------------------------------------------------

# Bump when the stored layout changes, so that old caches are rebuilt rather than misread.
FORMAT_VERSION = 2  # 2: shortest paths chosen as Floyd–Warshall chooses them (Microsoft, HF)

STRUCTURAL_KEYS = ("in_degree", "out_degree", "spatial_pos", "edge_path")


def structural_features(
    edge_index: Tensor | np.ndarray,
    num_nodes: Tensor | np.ndarray,
    num_edges: Tensor | np.ndarray,
    max_hops: int,
) -> dict[str, Tensor]:
    """Degrees, hop distances and shortest-path edges of many graphs, in compact integer types.

    Args:
        edge_index: ``[2, E_total]`` edges of all graphs, node ids local to each graph.
        num_nodes: ``[G]`` nodes per graph.
        num_edges: ``[G]`` edges per graph.
        max_hops (int): path edges kept per pair.

    Returns:
        ``in_degree``/``out_degree`` ``[N_total]`` int16; ``spatial_pos`` ``[P]`` and ``edge_path``
        ``[P, max_hops]`` (int16, or int32 for very large graphs) in the flat row-major pair layout
        (``P = sum N_g^2``); ``pair_ptr`` ``[G + 1]`` int64 pair offsets.
    """
    edge_index = np.asarray(edge_index, dtype=np.int64)
    num_nodes = np.asarray(num_nodes, dtype=np.int64)
    num_edges = np.asarray(num_edges, dtype=np.int64)
    dist, edge_path, layout = batched_shortest_paths(edge_index, num_nodes, num_edges, max_hops)
    in_degree, out_degree = degrees(edge_index, num_nodes, num_edges)
    return {
        "in_degree": torch.from_numpy(in_degree),
        "out_degree": torch.from_numpy(out_degree),
        "spatial_pos": torch.from_numpy(dist),
        "edge_path": torch.from_numpy(np.ascontiguousarray(edge_path)),
        "pair_ptr": torch.from_numpy(layout.pair_ptr),
    }


class StructuralFeatures(BaseTransform):
    r"""Adds Graphormer's structural features to a graph (Ying et al., 2021,
    `arXiv:2106.05234 <https://arxiv.org/abs/2106.05234>`_, Sec. 3.1).

    Adds ``in_degree`` and ``out_degree`` ``[N]`` (centrality encoding), ``spatial_pos`` ``[N * N]``
    (hop distance, -1 when unreachable; spatial encoding) and ``edge_path`` ``[N * N, max_hops]``
    (edge ids of one shortest path, -1 past its end; multi-hop edge encoding). Pair tensors are stored
    flattened row-major so that PyG can concatenate graphs of different sizes along dim 0; view them
    as ``[N, N]`` / ``[N, N, max_hops]``. Integer types are int16 wherever the values fit.

    Use it as a dataset's ``pre_transform`` so that the work is done once and cached on disk;
    :attr:`cache_key` names the settings, so a change of ``max_hops`` never reuses a stale cache.

    Args:
        max_hops (int, optional): shortest-path edges stored per pair; the model's
            ``multi_hop_max_dist`` must not exceed it. (default: :obj:`5`)
    """

    def __init__(self, max_hops: int = 5) -> None:
        if max_hops < 1:
            raise ValueError(f"max_hops must be >= 1, got {max_hops}")
        self.max_hops = max_hops

    @property
    def cache_key(self) -> str:
        return f"structural_v{FORMAT_VERSION}_hops{self.max_hops}"

    def forward(self, data: Data) -> Data:
        num_nodes = int(data.num_nodes)
        edge_index = data.edge_index
        feats = structural_features(edge_index, [num_nodes], [edge_index.size(1)], self.max_hops)
        for key in STRUCTURAL_KEYS:
            data[key] = feats[key]
        return data

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(max_hops={self.max_hops}, version={FORMAT_VERSION})"


def add_structural_features(data: Data, slices: dict, transform: StructuralFeatures) -> None:
    """Adds ``transform``'s features to a collated ``InMemoryDataset`` storage, all graphs at once.

    The collated storage already holds every graph's ``edge_index`` with local node ids, which is
    exactly what the batched shortest-path search takes: no per-graph ``Data`` is ever built.
    """
    node_ptr = slices["x"] if "x" in slices else None
    if node_ptr is None:
        raise ValueError("graphs need node features `x` for Graphormer")
    edge_ptr = slices["edge_index"]
    num_nodes = (node_ptr[1:] - node_ptr[:-1]).numpy()
    num_edges = (edge_ptr[1:] - edge_ptr[:-1]).numpy()
    feats = structural_features(data.edge_index, num_nodes, num_edges, transform.max_hops)
    for key in STRUCTURAL_KEYS:
        data[key] = feats[key]
    slices["in_degree"] = node_ptr.clone()
    slices["out_degree"] = node_ptr.clone()
    slices["spatial_pos"] = feats["pair_ptr"].clone()
    slices["edge_path"] = feats["pair_ptr"].clone()
