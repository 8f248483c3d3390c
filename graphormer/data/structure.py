"""Graphormer's structural features: all-pairs shortest paths and shortest-path edge sequences,
vectorised over many graphs, and the degrees, hop distances and path edges made of them (computed
once and cached with the dataset, or per batch by the collator).

Graphormer's spatial encoding needs the hop distance between every pair of nodes, and its multi-hop
edge encoding needs the edges along one shortest path of each pair (Ying et al., 2021, Sec. 3.1.2-3).
Microsoft's reference runs Floyd-Warshall plus a Python path rebuild per graph and epoch; here one
breadth-first search per target node runs for *all* targets of *all* graphs at once, as flat numpy
array operations, so the Python overhead is paid once per BFS level rather than per graph or pair.

How it works: a BFS from target ``t`` over the reversed edges reaches each source ``s`` through an
edge ``s -> u`` with ``dist(u, t) = dist(s, t) - 1``, i.e. the first edge of a shortest path from ``s``
to ``t``; ``u`` was reached one level earlier, so its own path to ``t`` is already complete, and the
path of ``(s, t)`` is that edge followed by the first ``max_hops - 1`` edges of ``u``'s path: one
row copy per pair. Graphs are processed in chunks whose pair arrays stay in cache.

Which path, when several are shortest: the one Floyd-Warshall (Microsoft's and Hugging Face's
``algos.floyd_warshall`` + ``gen_edge_input``) reconstructs, so that a converted model sees the same
edges. Floyd-Warshall's ``path[i][j]`` is the first intermediate node ``k`` (in index order) through
which ``i -> j`` reaches its final distance, and the path is rebuilt recursively through it; that is
the shortest path whose set of intermediate nodes, read as a bit mask (bit ``v`` for node ``v``), is
the smallest number. The choice is suffix-consistent (the rest of the path after ``s -> u`` is ``u``'s
own), so the BFS keeps each pair's mask and, where several edges reach a pair on the same level,
takes the one whose ``mask(u, t) | bit(u)`` is smallest.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.transforms import BaseTransform

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


class PairLayout:
    """Flat row-major layout of the ``N_g x N_g`` pair matrices of many graphs.

    Pair ``(s, t)`` of graph ``g`` lives at ``pair_ptr[g] + s * N_g + t`` (local node ids).

    Args:
        num_nodes (np.ndarray): ``[G]`` node counts.
    """

    def __init__(self, num_nodes: np.ndarray) -> None:
        num_nodes = np.asarray(num_nodes, dtype=np.int64)
        self.num_nodes = num_nodes
        self.node_ptr = np.zeros(len(num_nodes) + 1, dtype=np.int64)
        np.cumsum(num_nodes, out=self.node_ptr[1:])
        self.pair_ptr = np.zeros(len(num_nodes) + 1, dtype=np.int64)
        np.cumsum(num_nodes * num_nodes, out=self.pair_ptr[1:])
        graph_of_node = np.repeat(np.arange(len(num_nodes)), num_nodes)
        local = np.arange(self.node_ptr[-1]) - self.node_ptr[graph_of_node]
        # pair(s, t) = row_base[s] + col[t] for global node ids s, t of the same graph.
        self.col = local
        self.row_base = self.pair_ptr[graph_of_node] + local * num_nodes[graph_of_node]

    @property
    def num_pairs(self) -> int:
        return int(self.pair_ptr[-1])


def max_useful_hops(max_nodes: int) -> int:
    """The most path edges a graph of at most ``max_nodes`` nodes can fill: a shortest path
    visits each node once, so it has at most ``max_nodes - 1`` edges. Every node pair stores
    ``max_hops`` edge ids whatever its path's length, so hops beyond this cost memory (GBs at
    ``max_hops`` in the thousands) and are never read."""
    return max(1, int(max_nodes) - 1)


def batched_shortest_paths(
    edge_index: np.ndarray | Tensor,
    num_nodes: np.ndarray | Tensor,
    num_edges: np.ndarray | Tensor,
    max_hops: int,
) -> tuple[np.ndarray, np.ndarray, PairLayout]:
    """Shortest-path distances and edge paths of many graphs at once.

    Args:
        edge_index (np.ndarray | Tensor): ``[2, E_total]`` edges of all graphs concatenated, node ids
            *local* to each graph (PyG's ``InMemoryDataset`` storage layout).
        num_nodes (np.ndarray | Tensor): ``[G]`` nodes per graph.
        num_edges (np.ndarray | Tensor): ``[G]`` edges per graph (columns of ``edge_index``).
        max_hops (int): how many edges of each path to return.

    Returns:
        ``(spatial_pos, edge_path, layout)``: ``spatial_pos`` ``[P]`` hop distances (``-1`` when
        unreachable) and ``edge_path`` ``[P, max_hops]`` *local* edge ids (``-1`` past the path),
        both in the flat pair layout ``layout`` (``P = sum N_g^2``), in the smallest integer type
        that holds them (int16 unless a graph has 32,767 nodes or edges or more, then int32).
    """
    if max_hops < 0:
        raise ValueError(f"max_hops must be >= 0, got {max_hops}")
    edge_index = np.asarray(edge_index, dtype=np.int64)
    num_nodes = np.asarray(num_nodes, dtype=np.int64)
    num_edges = np.asarray(num_edges, dtype=np.int64)
    layout = PairLayout(num_nodes)
    max_nodes = int(num_nodes.max(initial=0))
    max_edges = int(num_edges.max(initial=0))
    dist = np.full(layout.num_pairs, -1, dtype=_small_int(max_nodes))
    # One spare column: a path row is written as [first edge, rest of the row of its successor].
    buffer = np.full((layout.num_pairs, max_hops + 1), -1, dtype=_small_int(max_edges))

    edge_ptr = np.zeros(len(num_edges) + 1, dtype=np.int64)
    np.cumsum(num_edges, out=edge_ptr[1:])
    # Chunks of graphs small enough for their pair arrays to stay in cache.
    start = 0
    while start < len(num_nodes):
        stop = int(np.searchsorted(layout.pair_ptr, layout.pair_ptr[start] + _CHUNK_PAIRS, "right"))
        stop = min(max(stop - 1, start + 1), len(num_nodes))
        pairs = slice(layout.pair_ptr[start], layout.pair_ptr[stop])
        _bfs_chunk(
            edge_index[:, edge_ptr[start] : edge_ptr[stop]],
            num_nodes[start:stop],
            num_edges[start:stop],
            dist[pairs],
            buffer[pairs],
        )
        start = stop
    return dist, buffer[:, :max_hops], layout


# Pairs per chunk: a few MB of distances and paths, so that the random accesses hit cache.
_CHUNK_PAIRS = 1 << 16


def _small_int(max_value: int) -> np.dtype:
    return np.dtype(np.int16 if max_value < np.iinfo(np.int16).max else np.int32)


def _row_view(buffer: np.ndarray, first: int, width: int) -> np.ndarray:
    """Columns ``[first, first + width)`` of each row of a C-contiguous 2-D array as one opaque
    item per row, so that copying rows is one fancy-indexed memcpy per row instead of a
    mixed advanced/slice index (several times slower in numpy)."""
    item = buffer.dtype.itemsize
    return np.ndarray(
        shape=(buffer.shape[0],),
        dtype=np.dtype((np.void, width * item)),
        buffer=buffer,
        offset=first * item,
        strides=(buffer.strides[0],),
    )


def _bfs_chunk(
    edge_index: np.ndarray,
    num_nodes: np.ndarray,
    num_edges: np.ndarray,
    dist: np.ndarray,
    buffer: np.ndarray,
) -> None:
    """BFS from every node over reversed edges; fills ``dist`` and the path ``buffer`` in place."""
    layout = PairLayout(num_nodes)
    total_nodes = int(layout.node_ptr[-1])
    node_shift = np.repeat(layout.node_ptr[:-1], num_edges)
    src = edge_index[0] + node_shift
    dst = edge_index[1] + node_shift
    edge_starts = np.zeros(len(num_edges), dtype=np.int64)
    np.cumsum(num_edges[:-1], out=edge_starts[1:])
    edge_local = (np.arange(edge_index.shape[1]) - np.repeat(edge_starts, num_edges)).astype(
        buffer.dtype
    )

    # Incoming edges of each node as a dense [nodes, max in-degree] table (-1 padded): molecules
    # have in-degrees of at most 6 or so, which makes a dense gather cheaper than CSR expansion.
    in_degree = np.bincount(dst, minlength=total_nodes)
    width = int(in_degree.max(initial=0))
    order = np.argsort(dst, kind="stable")
    slot = np.arange(len(order)) - np.repeat(np.cumsum(in_degree) - in_degree, in_degree)
    width = max(width, 1)
    in_edges = np.full((total_nodes, width), -1, dtype=np.int64)
    in_edges[dst[order], slot] = order

    hops = buffer.shape[1] - 1
    path_head = buffer[:, 0]
    copy_to = _row_view(buffer, 1, hops)
    copy_from = _row_view(buffer, 0, hops)
    # Masks of intermediate nodes: one uint64 array per 64 nodes of the chunk's largest graph
    # (bit v of word w is node 64 * w + v); node_bits[w][n] is node n's own mask.
    words = max(1, -(-int(num_nodes.max(initial=1)) // 64))
    bit = np.left_shift(np.uint64(1), (layout.col % 64).astype(np.uint64))
    node_bits = [np.where(layout.col // 64 == w, bit, np.uint64(0)) for w in range(words)]
    unset = np.iinfo(np.uint64).max
    lowest = np.full(len(dist), unset, dtype=np.uint64)  # scratch, one entry per pair
    contested = np.zeros(len(dist), dtype=bool)  # scratch, one entry per pair

    # Frontier entries: (column of target t, node u reached from t, pair (u, t), mask of the
    # intermediate nodes of u's path). Level 0: u = t, no intermediate node.
    col = layout.col
    reached = np.arange(total_nodes)
    reached_pair = layout.row_base + col
    reached_masks = [np.zeros(total_nodes, dtype=np.uint64) for _ in range(words)]
    dist[reached_pair] = 0
    level = 0
    while len(reached):
        level += 1
        # The mask of s -> u -> ... -> t for every source s: u's own, plus u unless u = t.
        through = reached_masks
        if level > 1:
            through = [m | bits[reached] for m, bits in zip(reached_masks, node_bits, strict=True)]
        candidates = np.take(in_edges, reached, axis=0).reshape(-1)  # [F * width], -1 padded
        valid = np.flatnonzero(candidates >= 0)
        edge, owner = candidates[valid], valid // width
        pair = layout.row_base[src[edge]] + col[owner]
        new = np.flatnonzero(dist[pair] < 0)
        edge, owner, pair = edge[new], owner[new], pair[new]
        dist[pair] = level
        local = edge_local[edge]
        path_head[pair] = local
        # Several edges may reach the same pair at this level (rings): whichever write won is
        # the first edge of a valid shortest path, and keeping only the winner de-duplicates the
        # frontier. Where there was a choice, keep instead the candidate of smallest mask (most
        # significant word first): Floyd-Warshall's (see the module docstring).
        won = path_head[pair] == local
        if not won.all():
            contested[pair[~won]] = True
            keep = np.flatnonzero(contested[pair])  # every candidate of a contested pair
            contested[pair[keep]] = False
            won[keep] = False
            for mask in reversed(through):
                at, value = pair[keep], mask[owner[keep]]
                np.minimum.at(lowest, at, value)
                keep = keep[value == lowest[at]]
                lowest[at] = unset
            # Equal masks (parallel edges) remain: whichever write wins.
            path_head[pair[keep]] = local[keep]
            won[keep] = path_head[pair[keep]] == local[keep]
        winner = np.flatnonzero(won)
        pair, owner, edge = pair[winner], owner[winner], edge[winner]
        if hops:
            # s -> u is followed by u's own path to t, complete since the previous level.
            copy_to[pair] = copy_from[reached_pair[owner]]
        col = col[owner]
        reached, reached_pair = src[edge], pair
        reached_masks = [m[owner] for m in through]


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
