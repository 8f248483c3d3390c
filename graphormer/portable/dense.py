"""The dense, padded inputs of a Graphormer network in numpy: the arrays
:class:`graphormer.data.collate.GraphormerCollator` builds for molecule graphs, in the fixed
integer types of an exported network's inputs (tested equal to the collator's)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from graphormer.portable.paths import batched_shortest_paths, degrees

__all__ = ["INPUT_NAMES", "dense_inputs"]

# The exported network's inputs, in order (GraphormerBatch's fields of a molecule batch).
INPUT_NAMES = (
    "x",
    "in_degree",
    "out_degree",
    "spatial_pos",
    "edge_path",
    "edge_attr",
    "node_mask",
)


def dense_inputs(graphs: Sequence[dict], max_hops: int, pad_to_multiple: int = 1) -> dict:
    """The padded batch of OGB molecule graphs (``smiles2graph``'s dicts), as the collator pads it.

    Args:
        graphs (Sequence[dict]): ``node_feat`` ``[n, F]``, ``edge_index`` ``[2, e]`` (local ids),
            ``edge_feat`` ``[e, F_e]`` of each graph.
        max_hops (int): path edges per pair.
        pad_to_multiple (int, optional): the attention length (nodes + graph token) is padded to
            a multiple of it. (default: :obj:`1`)

    Returns:
        ``x`` ``[B, N, F]``, ``in_degree`` / ``out_degree`` ``[B, N]``, ``spatial_pos``
        ``[B, N, N]`` (-1 unreachable or padding), ``edge_path`` ``[B, N, N, max_hops]`` (rows of
        ``edge_attr``, -1 past the path), ``edge_attr`` ``[E, F_e]``, all int64, and
        ``node_mask`` ``[B, N]`` bool.
    """
    if not len(graphs):
        raise ValueError("cannot batch an empty list of graphs")
    sizes = np.array([g["node_feat"].shape[0] for g in graphs], dtype=np.int64)
    edges = np.array([g["edge_index"].shape[1] for g in graphs], dtype=np.int64)
    edge_index = np.concatenate([g["edge_index"] for g in graphs], axis=1).astype(np.int64)
    dist, path, _ = batched_shortest_paths(edge_index, sizes, edges, max_hops)
    in_degree, out_degree = degrees(edge_index, sizes, edges)
    batch = len(graphs)
    # The collator's padded_length: nodes + graph token rounded up to the multiple, less the token.
    n_max = int((sizes.max() + pad_to_multiple) // pad_to_multiple * pad_to_multiple) - 1

    node_graph = np.repeat(np.arange(batch), sizes)
    node_local = np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    node_dest = node_graph * n_max + node_local
    x = np.concatenate([g["node_feat"] for g in graphs]).astype(np.int64)
    x_pad = np.zeros((batch * n_max, x.shape[1]), dtype=np.int64)
    x_pad[node_dest] = x
    mask = np.zeros(batch * n_max, dtype=bool)
    mask[node_dest] = True
    in_pad = np.zeros(batch * n_max, dtype=np.int64)
    in_pad[node_dest] = in_degree
    out_pad = np.zeros(batch * n_max, dtype=np.int64)
    out_pad[node_dest] = out_degree

    pairs = sizes * sizes
    pair_graph = np.repeat(np.arange(batch), pairs)
    within = np.arange(int(pairs.sum())) - np.repeat(np.cumsum(pairs) - pairs, pairs)
    row, col = np.divmod(within, np.repeat(sizes, pairs))
    pair_dest = (pair_graph * n_max + row) * n_max + col
    spatial = np.full(batch * n_max * n_max, -1, dtype=np.int64)
    spatial[pair_dest] = dist
    # Edge ids are local to each graph: shifted to rows of the batch's edge_attr (-1 stays -1).
    path = path.astype(np.int64)
    shift = (np.cumsum(edges) - edges)[pair_graph][:, None]
    edge_path = np.full((batch * n_max * n_max, max_hops), -1, dtype=np.int64)
    edge_path[pair_dest] = path + shift * (path >= 0)
    edge_attr = np.concatenate([g["edge_feat"] for g in graphs]).astype(np.int64)
    return {
        "x": x_pad.reshape(batch, n_max, -1),
        "in_degree": in_pad.reshape(batch, n_max),
        "out_degree": out_pad.reshape(batch, n_max),
        "spatial_pos": spatial.reshape(batch, n_max, n_max),
        "edge_path": edge_path.reshape(batch, n_max, n_max, max_hops),
        "edge_attr": edge_attr.reshape(len(edge_attr), -1),
        "node_mask": mask.reshape(batch, n_max),
    }
