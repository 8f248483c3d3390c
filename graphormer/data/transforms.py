"""Graphormer's structural features as a PyG transform, computed once and cached with the dataset."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.transforms import BaseTransform

from graphormer.data.shortest_paths import batched_shortest_paths

__all__ = ["STRUCTURAL_KEYS", "StructuralFeatures", "structural_features"]

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
    total_nodes = int(layout.node_ptr[-1])
    node_shift = np.repeat(layout.node_ptr[:-1], num_edges)
    degree_type = np.int16 if int(num_nodes.max(initial=0)) < 2**15 else np.int32
    out_degree = np.bincount(edge_index[0] + node_shift, minlength=total_nodes)
    in_degree = np.bincount(edge_index[1] + node_shift, minlength=total_nodes)
    return {
        "in_degree": torch.from_numpy(in_degree.astype(degree_type)),
        "out_degree": torch.from_numpy(out_degree.astype(degree_type)),
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
