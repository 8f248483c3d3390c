"""Structural preprocessing and collation speed, cache size and batch memory, on one CPU core.

    python benchmarks/preprocess.py               # molecules, then PROTEINS-sized graphs
    python benchmarks/preprocess.py --proteins    # PROTEINS-sized graphs only
    python benchmarks/preprocess.py --tu-cache    # dataset=tu setup, first run vs cached

Prints graphs/second for our batched preprocessing and for a straightforward per-graph reference
(scipy's BFS with predecessors plus a Python path walk, the usual way to write it), the cost of
collating 256-graph batches for ours and for a per-graph padding collator that builds the
``[B, N, N, hops, F_e]`` int64 edge-feature tensor Hugging Face's port builds, bytes cached per graph
and the memory of a 256-molecule batch. Molecules: rdkit's NCI set (4,991 that parse).

PROTEINS-sized graphs (issue #17): 1,113 graphs as TU's PROTEINS has, mean ~39 nodes, the largest
620, ~3.7 directed edges per node (a chain of neighbours plus local contacts, as protein contact
graphs are), made with a fixed seed; graphs/s and the peak memory (tracemalloc) of the batched
structural preprocessing, and the structural cache's size.

``--tu-cache``: the setup of ``dataset=tu`` (reading TU's raw text files, flattening, structural
features) on 1,113 PROTEINS-like graphs (:func:`graphormer.testing.protein_like_graphs`, written
in TU's layout), on a first run (empty cache) and on a second run (the disk cache of issue #17).
"""

from __future__ import annotations

import argparse
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import torch
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import shortest_path

sys.path.insert(0, str(Path(__file__).parent))
from torch_geometric.data import Data  # noqa: E402

from graphormer.data import (
    GraphormerCollator,
    SizeGroupedBatchSampler,
    StructuralFeatures,
    structural_features,
)  # noqa: E402

from common import best_of, nci_graphs, single_thread, to_data  # noqa: E402

MAX_HOPS = 5
BATCH = 256


def reference_preprocess(graph: dict, max_hops: int = MAX_HOPS):
    """Per-graph scipy BFS (unweighted Dijkstra) with predecessors, then walk every pair's path."""
    n = graph["num_nodes"]
    src, dst = graph["edge_index"]
    edge_id = {(int(a), int(b)): e for e, (a, b) in enumerate(zip(src, dst, strict=True))}
    adjacency = csr_matrix((np.ones(len(src)), (src, dst)), shape=(n, n))
    dist, pred = shortest_path(adjacency, unweighted=True, return_predecessors=True)
    spatial = np.where(np.isinf(dist), -1, dist).astype(np.int64)
    path = np.full((n, n, max_hops), -1, dtype=np.int64)
    for i in range(n):
        for j in range(n):
            d = spatial[i, j]
            if d <= 0:
                continue
            nodes = [j]
            while nodes[-1] != i:
                nodes.append(pred[i, nodes[-1]])
            nodes.reverse()
            for k in range(min(d, max_hops)):
                path[i, j, k] = edge_id[(nodes[k], nodes[k + 1])]
    return spatial, path


def reference_collate(items: list[tuple[Data, np.ndarray, np.ndarray]], max_hops: int = MAX_HOPS):
    """A per-graph padding collator in the style of the reference implementations."""
    n_max = max(d.num_nodes for d, _, _ in items)
    xs, spatial, edge_input, masks = [], [], [], []
    for data, sp, ep in items:
        n = data.num_nodes
        x = torch.zeros(n_max, data.x.size(1), dtype=torch.long)
        x[:n] = data.x
        xs.append(x)
        s = torch.full((n_max, n_max), -1, dtype=torch.long)
        s[:n, :n] = torch.from_numpy(sp)
        spatial.append(s)
        # [N, N, hops, F_e] int64 edge features along each path, as the reference collators build.
        feats = torch.zeros(n_max, n_max, max_hops, data.edge_attr.size(1), dtype=torch.long)
        ep_t = torch.from_numpy(ep)
        valid = ep_t >= 0
        block = torch.zeros(n, n, max_hops, data.edge_attr.size(1), dtype=torch.long)
        block[valid] = data.edge_attr[ep_t[valid]] + 1
        feats[:n, :n] = block
        edge_input.append(feats)
        m = torch.zeros(n_max, dtype=torch.bool)
        m[:n] = True
        masks.append(m)
    return torch.stack(xs), torch.stack(spatial), torch.stack(edge_input), torch.stack(masks)


def proteins_like(num_graphs: int = 1113, seed: int = 0) -> list[tuple[int, np.ndarray]]:
    """``(num_nodes, edge_index)`` of PROTEINS-sized graphs: lognormal sizes (mean ~39, at least
    4), one of 620 nodes; each node linked to the next (a chain) and to one or two random nodes
    within 6 positions (contacts), both directions."""
    rng = np.random.default_rng(seed)
    sizes = np.clip(rng.lognormal(3.5, 0.6, num_graphs).astype(int), 4, 620)
    sizes[0] = 620
    graphs = []
    for n in sizes:
        chain = np.stack([np.arange(n - 1), np.arange(1, n)])
        source = np.repeat(np.arange(n), rng.integers(0, 3, n))
        target = np.clip(source + rng.integers(2, 7, len(source)), 0, n - 1)
        contacts = np.stack([source, target])[:, source != target]
        edges = np.unique(np.concatenate([chain, contacts], axis=1), axis=1)
        graphs.append((int(n), np.concatenate([edges, edges[::-1]], axis=1)))
    return graphs


def proteins_benchmark() -> None:
    graphs = proteins_like()
    sizes = np.array([n for n, _ in graphs])
    num_edges = np.array([e.shape[1] for _, e in graphs])
    edge_index = np.concatenate([e for _, e in graphs], axis=1)
    print(
        f"\nPROTEINS-sized graphs: {len(graphs)}, mean nodes {sizes.mean():.1f}, max {sizes.max()}, "
        f"directed edges per node {num_edges.sum() / sizes.sum():.2f}"
    )
    seconds = best_of(
        lambda: structural_features(edge_index, sizes, num_edges, MAX_HOPS), repeats=3
    )
    tracemalloc.start()
    feats = structural_features(edge_index, sizes, num_edges, MAX_HOPS)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    cache = sum(nbytes(feats[k]) for k in ("spatial_pos", "edge_path", "in_degree", "out_degree"))
    print(
        f"  graphormer, whole dataset batched, one core : {len(graphs) / seconds:>8,.0f} graphs/s "
        f"({seconds * 1e3:.0f} ms for {len(graphs)})"
    )
    print(f"  peak memory of the preprocessing (tracemalloc): {peak / 2**20:,.0f} MiB")
    print(
        f"  structural cache: {cache / 2**20:,.1f} MiB ({cache / len(graphs) / 1024:,.1f} KiB per "
        f"graph; the 620-node graph alone {620 * 620 * (2 + 2 * MAX_HOPS) / 2**20:.1f} MiB)"
    )


def tu_cache_benchmark(repeats: int = 3) -> None:
    import shutil
    import tempfile

    from graphormer.data import build_source
    from graphormer.testing import protein_like_graphs, write_tu_layout

    graphs, labels = protein_like_graphs(1113, seed=0)
    with tempfile.TemporaryDirectory() as folder:
        write_tu_layout(Path(folder), "PROTEINS_LIKE", graphs, labels)
        settings = {"source": "tu", "name": "PROTEINS_LIKE", "root": folder}
        processed = Path(folder) / "PROTEINS_LIKE" / "processed"

        def setup() -> float:
            start = time.perf_counter()
            source = build_source(settings)
            source.task_info()
            source.load(StructuralFeatures(MAX_HOPS))
            return time.perf_counter() - start

        first, second = [], []
        for _ in range(repeats):
            shutil.rmtree(processed, ignore_errors=True)
            first.append(setup())
            second.append(setup())
        size = sum(f.stat().st_size for f in processed.rglob("*.pt"))
    sizes = np.array([g.num_nodes for g in graphs])
    print(
        f"\ndataset=tu setup, {len(graphs)} PROTEINS-like graphs (mean nodes {sizes.mean():.1f}, "
        f"max {sizes.max()}), best of {repeats}, one core:"
    )
    print(
        f"  first run (raw text, flattening, structural features, cache written): {min(first):.2f} s"
    )
    print(
        f"  second run (read from the disk cache)                               : {min(second):.2f} s"
    )
    print(f"  cache on disk: {size / 2**20:.1f} MiB")


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proteins", action="store_true", help="PROTEINS-sized graphs only")
    parser.add_argument("--tu-cache", action="store_true", help="dataset=tu setup: cold vs cached")
    args = parser.parse_args()
    single_thread()
    if args.tu_cache:
        tu_cache_benchmark()
        return
    if args.proteins:
        proteins_benchmark()
        return
    graphs = nci_graphs()
    count = len(graphs)
    sizes = np.array([g["num_nodes"] for g in graphs])
    print(
        f"molecules: {count} (rdkit NCI first_5K.smi, parsed), mean atoms {sizes.mean():.1f}, "
        f"max {sizes.max()}, mean N^2 {np.mean(sizes**2):.0f}"
    )
    num_edges = np.array([g["edge_index"].shape[1] for g in graphs])
    edge_index = np.concatenate([g["edge_index"] for g in graphs], axis=1)

    ours = best_of(lambda: structural_features(edge_index, sizes, num_edges, MAX_HOPS), repeats=5)
    datas = [to_data(g) for g in graphs]
    transform = StructuralFeatures(MAX_HOPS)
    per_graph = best_of(lambda: [transform(d.clone()) for d in datas[:1000]], repeats=2)
    subset = graphs[:500]
    reference = best_of(lambda: [reference_preprocess(g) for g in subset], repeats=1)

    print("\npreprocessing (shortest paths + 5-hop edge paths + degrees), one core")
    print(
        f"  graphormer, whole dataset batched : {count / ours:>10,.0f} graphs/s "
        f"({ours * 1e3:.0f} ms for {count})"
    )
    print(f"  graphormer, per-graph transform   : {1000 / per_graph:>10,.0f} graphs/s")
    print(f"  reference, scipy BFS + path walk  : {len(subset) / reference:>10,.0f} graphs/s")
    print(
        f"  speed-up (batched / reference)    : {(count / ours) / (len(subset) / reference):>10.1f}x"
    )

    # Collation of 256-graph batches from cached features.
    cached = [transform(d.clone()) for d in datas]
    collate = GraphormerCollator(max_hops=MAX_HOPS, pad_to_multiple=8)
    rng = np.random.default_rng(0)
    batches = [rng.choice(count, BATCH, replace=False).tolist() for _ in range(20)]
    start = time.perf_counter()
    for idx in batches:
        batch = collate([cached[i] for i in idx])
    ours_ms = (time.perf_counter() - start) / len(batches) * 1e3
    grouped = list(SizeGroupedBatchSampler(torch.as_tensor(sizes), BATCH, seed=0))[:20]
    start = time.perf_counter()
    for idx in grouped:
        collate([cached[i] for i in idx])
    grouped_ms = (time.perf_counter() - start) / len(grouped) * 1e3
    plain = [datas[i] for i in range(count)]
    start = time.perf_counter()
    for idx in batches:
        collate([plain[i] for i in idx])
    fly_ms = (time.perf_counter() - start) / len(batches) * 1e3
    ref_items = [
        (
            d,
            d.spatial_pos.view(d.num_nodes, -1).long().numpy(),
            d.edge_path.view(d.num_nodes, d.num_nodes, -1).long().numpy(),
        )
        for d in cached
    ]
    start = time.perf_counter()
    for idx in batches[:5]:
        ref_batch = reference_collate([ref_items[i] for i in idx])
    ref_ms = (time.perf_counter() - start) / 5 * 1e3
    print(f"\ncollation of {BATCH}-graph batches, one core")
    rows = [
        ("graphormer, random batches, cached features", ours_ms),
        ("graphormer, size-grouped batches (as training draws them)", grouped_ms),
        ("graphormer, random batches, on the fly (features per batch)", fly_ms),
        ("reference, random batches, per-graph padding", ref_ms),
    ]
    for label, ms in rows:
        print(f"  {label:<62}: {ms:>7.1f} ms/batch ({BATCH / ms * 1e3:>8,.0f} graphs/s)")

    # Bytes on disk / in memory per cached graph.
    feature_bytes = (
        sum(
            nbytes(d[k])
            for d in cached
            for k in ("spatial_pos", "edge_path", "in_degree", "out_degree")
        )
        / count
    )
    graph_bytes = (
        sum(nbytes(d.x) + nbytes(d.edge_index) + nbytes(d.edge_attr) for d in datas) / count
    )
    pair_bytes = sum(nbytes(d.spatial_pos) + nbytes(d.edge_path) for d in cached) / np.sum(sizes**2)
    print("\ncache size")
    print(
        f"  structural features : {feature_bytes:>8,.0f} bytes/graph "
        f"({pair_bytes:.0f} bytes per node pair: int16 distance + {MAX_HOPS} int16 edge ids)"
    )
    print(
        f"  OGB graph itself    : {graph_bytes:>8,.0f} bytes/graph (x, edge_index, edge_attr as OGB "
        "stores them, int64)"
    )
    # molhiv: 41,127 graphs, mean 25.5 atoms; E[N^2] = mean^2 + var, std about 12 atoms.
    molhiv_pairs = 41_127 * (25.5**2 + 12.0**2)
    print(
        f"  projected molhiv structural cache: {molhiv_pairs * pair_bytes / 2**20:,.0f} MiB "
        "(41,127 graphs, mean 25.5 atoms, std ~12 assumed)"
    )

    total = sum(nbytes(v) for v in vars(batch).values() if isinstance(v, torch.Tensor))
    ref_total = sum(nbytes(t) for t in ref_batch)
    print(f"\nmemory of one {BATCH}-molecule batch (N padded to {batch.x.size(1)})")
    print(
        f"  graphormer batch tensors : {total / 2**20:>8.1f} MiB "
        f"(edge_path [B,N,N,{MAX_HOPS}] {batch.edge_path.dtype} "
        f"{nbytes(batch.edge_path) / 2**20:.1f} MiB)"
    )
    print(
        f"  reference batch tensors  : {ref_total / 2**20:>8.1f} MiB "
        f"(edge_input [B,N,N,{MAX_HOPS},3] int64 {nbytes(ref_batch[2]) / 2**20:.1f} MiB)"
    )
    proteins_benchmark()


if __name__ == "__main__":
    main()
