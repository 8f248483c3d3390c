import networkx as nx
import numpy as np
import pytest
import torch

from graphormer.data import batched_shortest_paths, shortest_paths

from helpers import nci_graphs


def undirected(edges):
    both = [(a, b) for a, b in edges] + [(b, a) for a, b in edges]
    return torch.tensor(both, dtype=torch.long).t().reshape(2, -1)


def check_paths(edge_index: np.ndarray, spatial_pos: np.ndarray, edge_path: np.ndarray) -> None:
    """Every stored path starts at i, chains, has the right length and (if complete) ends at j."""
    n, _, hops = edge_path.shape
    src, dst = edge_index
    for i in range(n):
        for j in range(n):
            d = spatial_pos[i, j]
            k = min(max(d, 0), hops)
            assert (edge_path[i, j, k:] == -1).all()
            node = i
            for h in range(k):
                e = edge_path[i, j, h]
                assert src[e] == node
                node = dst[e]
            if 0 < d <= hops:
                assert node == j


def test_path_graph_known_answer():
    # 0 - 1 - 2 - 3
    edge_index = undirected([(0, 1), (1, 2), (2, 3)])
    spatial_pos, edge_path = shortest_paths(edge_index, 4, max_hops=2)
    expected = torch.tensor([[0, 1, 2, 3], [1, 0, 1, 2], [2, 1, 0, 1], [3, 2, 1, 0]])
    assert torch.equal(spatial_pos, expected)
    assert spatial_pos.dtype == torch.long and edge_path.dtype == torch.long
    # Edge columns: 0:(0,1) 1:(1,2) 2:(2,3) 3:(1,0) 4:(2,1) 5:(3,2)
    assert edge_path[0, 3].tolist() == [0, 1]  # first two of the three edges 0->1->2->3
    assert edge_path[3, 0].tolist() == [5, 4]
    assert edge_path[1, 2].tolist() == [1, -1]
    assert edge_path[2, 2].tolist() == [-1, -1]
    check_paths(edge_index.numpy(), spatial_pos.numpy(), edge_path.numpy())


def test_directed_edges_are_followed_as_given():
    edge_index = torch.tensor([[0, 1], [1, 2]])  # 0 -> 1 -> 2 only
    spatial_pos, edge_path = shortest_paths(edge_index, 3, max_hops=3)
    assert spatial_pos.tolist() == [[0, 1, 2], [-1, 0, 1], [-1, -1, 0]]
    assert edge_path[0, 2].tolist() == [0, 1, -1]
    assert edge_path[2, 0].tolist() == [-1, -1, -1]


def test_disconnected_graph_and_ring():
    # A 6-ring plus an isolated pair (a salt-like molecule).
    ring = [(i, (i + 1) % 6) for i in range(6)]
    edge_index = undirected(ring + [(6, 7)])
    spatial_pos, edge_path = shortest_paths(edge_index, 8, max_hops=5)
    assert spatial_pos[0, 3] == 3
    assert spatial_pos[0, 5] == 1
    assert spatial_pos[0, 6] == -1 and spatial_pos[7, 2] == -1
    assert spatial_pos[6, 7] == 1
    assert (edge_path[0, 6] == -1).all()
    check_paths(edge_index.numpy(), spatial_pos.numpy(), edge_path.numpy())


@pytest.mark.parametrize("num_nodes", [1, 3])
def test_graphs_without_edges(num_nodes):
    edge_index = torch.zeros(2, 0, dtype=torch.long)
    spatial_pos, edge_path = shortest_paths(edge_index, num_nodes, max_hops=4)
    expected = torch.full((num_nodes, num_nodes), -1)
    expected.fill_diagonal_(0)
    assert torch.equal(spatial_pos.long(), expected)
    assert edge_path.shape == (num_nodes, num_nodes, 4)
    assert (edge_path == -1).all()


def test_paths_longer_than_max_hops_are_truncated():
    n = 10
    edge_index = undirected([(i, i + 1) for i in range(n - 1)])
    spatial_pos, edge_path = shortest_paths(edge_index, n, max_hops=3)
    assert spatial_pos[0, 9] == 9
    assert (edge_path[0, 9] >= 0).all()
    check_paths(edge_index.numpy(), spatial_pos.numpy(), edge_path.numpy())


def test_rejects_bad_edge_index():
    with pytest.raises(ValueError, match="outside"):
        shortest_paths(torch.tensor([[0], [5]]), 3, max_hops=2)
    with pytest.raises(ValueError, match=r"\[2, E\]"):
        shortest_paths(torch.zeros(3, 2, dtype=torch.long), 3, max_hops=2)


def test_single_graph_api_equals_batched():
    graphs = nci_graphs(50)
    for g in graphs[:10]:
        sp, ep = shortest_paths(torch.from_numpy(g["edge_index"]), g["num_nodes"], 5)
        dist, path, layout = batched_shortest_paths(
            g["edge_index"], [g["num_nodes"]], [g["edge_index"].shape[1]], 5
        )
        assert np.array_equal(sp.numpy().reshape(-1), dist)
        assert np.array_equal(ep.numpy().reshape(-1, 5), path)


def test_all_nci_molecules_match_networkx():
    """Every one of rdkit's NCI molecules (4,991 parse): distances equal networkx's, and every edge
    path is a valid shortest path, disconnected salts included."""
    graphs = nci_graphs(None)
    assert len(graphs) > 4900
    num_nodes = np.array([g["num_nodes"] for g in graphs])
    num_edges = np.array([g["edge_index"].shape[1] for g in graphs])
    edge_index = np.concatenate([g["edge_index"] for g in graphs], axis=1)
    hops = 5
    dist, path, layout = batched_shortest_paths(edge_index, num_nodes, num_edges, hops)
    disconnected = 0
    for gi, g in enumerate(graphs):
        n = g["num_nodes"]
        pairs = slice(layout.pair_ptr[gi], layout.pair_ptr[gi + 1])
        sp = dist[pairs].reshape(n, n)
        graph = nx.DiGraph()
        graph.add_nodes_from(range(n))
        graph.add_edges_from(g["edge_index"].T.tolist())
        expected = np.full((n, n), -1)
        for i, lengths in nx.all_pairs_shortest_path_length(graph):
            for j, d in lengths.items():
                expected[i, j] = d
        assert np.array_equal(sp, expected), f"molecule {gi}"
        disconnected += bool((sp < 0).any())

    # Path validity for all pairs of all molecules at once, hop by hop.
    pair_graph = np.repeat(np.arange(len(graphs)), num_nodes**2)
    edge_start = np.concatenate([[0], np.cumsum(num_edges)[:-1]])[pair_graph]
    within = np.arange(layout.num_pairs) - layout.pair_ptr[pair_graph]
    n_of = num_nodes[pair_graph]
    node, target = within // n_of, within % n_of
    length = np.minimum(np.maximum(dist.astype(np.int64), 0), hops)
    for h in range(hops):
        on_path = h < length
        assert (path[~on_path, h] == -1).all()
        e = path[on_path, h].astype(np.int64) + edge_start[on_path]
        assert (edge_index[0, e] == node[on_path]).all()
        node[on_path] = edge_index[1, e]
    complete = (dist > 0) & (dist <= hops)
    assert (node[complete] == target[complete]).all()
    assert disconnected > 50  # salts and mixtures are really exercised
