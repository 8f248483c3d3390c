import pytest
import torch

from graphormer.data import GraphormerCollator, StructuralFeatures, shortest_paths

from helpers import nci_graphs, to_data


def molecules(n=12):
    return [to_data(g, y=float(i)) for i, g in enumerate(nci_graphs(200)[:n])]


def test_transform_adds_compact_features():
    data = StructuralFeatures(max_hops=4)(molecules(1)[0])
    n, e = data.num_nodes, data.edge_index.size(1)
    assert data.spatial_pos.shape == (n * n,)
    assert data.edge_path.shape == (n * n, 4)
    assert data.in_degree.shape == (n,) and data.out_degree.shape == (n,)
    assert data.spatial_pos.dtype == torch.int16 and data.edge_path.dtype == torch.int16
    assert torch.equal(data.in_degree.long(), torch.bincount(data.edge_index[1], minlength=n))
    sp, ep = shortest_paths(data.edge_index, n, 4)
    assert torch.equal(data.spatial_pos.view(n, n).long(), sp.long())
    assert torch.equal(data.edge_path.view(n, n, 4).long(), ep.long())
    assert int(data.edge_path.max()) < e


def test_cache_key_names_the_settings():
    assert StructuralFeatures(5).cache_key != StructuralFeatures(3).cache_key
    assert "max_hops=3" in repr(StructuralFeatures(3))


def test_cached_and_on_the_fly_batches_are_identical():
    graphs = molecules()
    cached = [StructuralFeatures(5)(g.clone()) for g in graphs]
    collate = GraphormerCollator(max_hops=5)
    a, b = collate(cached), collate(graphs)
    for name in ("x", "in_degree", "out_degree", "spatial_pos", "edge_path", "edge_attr", "y"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


def test_batch_layout_and_reindexed_edge_paths():
    graphs = [StructuralFeatures(5)(g) for g in molecules()]
    batch = GraphormerCollator(max_hops=5, pad_to_multiple=8)(
        [(100 + i, g) for i, g in enumerate(graphs)]
    )
    sizes = [g.num_nodes for g in graphs]
    n_max = batch.x.size(1)
    # Nodes plus the graph token fill a multiple of 8.
    assert (n_max + 1) % 8 == 0 and n_max >= max(sizes) and n_max - max(sizes) < 8
    assert batch.edge_path.dim() == 4  # [B, N, N, K]: never [B, N, N, K, F_e]
    assert batch.edge_path.dtype == torch.int16 and batch.spatial_pos.dtype == torch.int16
    assert batch.index.tolist() == list(range(100, 112))
    assert batch.y[:, 0].tolist() == [float(i) for i in range(12)]
    offset = 0
    for b, g in enumerate(graphs):
        n = g.num_nodes
        assert batch.node_mask[b].sum() == n and batch.node_mask[b, :n].all()
        assert torch.equal(batch.x[b, :n], g.x)
        assert (batch.spatial_pos[b, n:] == -1).all() and (batch.spatial_pos[b, :, n:] == -1).all()
        assert torch.equal(batch.spatial_pos[b, :n, :n].long(), g.spatial_pos.view(n, n).long())
        local = g.edge_path.view(n, n, 5).long()
        glob = batch.edge_path[b, :n, :n].long()
        assert torch.equal(glob == -1, local == -1)
        assert torch.equal(glob[local >= 0], local[local >= 0] + offset)
        # The re-indexed rows of the batch's edge_attr are the graph's own edge features.
        assert torch.equal(batch.edge_attr[glob[local >= 0]], g.edge_attr[local[local >= 0]])
        offset += g.edge_index.size(1)
    assert batch.edge_attr.size(0) == offset


def test_single_atom_and_disconnected_molecules_collate():
    from ogb.utils import smiles2graph

    graphs = [to_data(smiles2graph(s), 0.0) for s in ["C", "[Na+].[Cl-]", "CCO"]]
    batch = GraphormerCollator(max_hops=5)(graphs)
    assert batch.spatial_pos[0, 0, 0] == 0
    assert batch.spatial_pos[1, 0, 1] == -1


def test_errors_name_the_problem():
    graphs = [StructuralFeatures(3)(g) for g in molecules(2)]
    with pytest.raises(ValueError, match="max_hops"):
        GraphormerCollator(max_hops=5)(graphs)
    plain = molecules(1)[0]
    del plain.edge_attr
    with pytest.raises(ValueError, match="edge_attr"):
        GraphormerCollator(max_hops=5)([plain])
    with pytest.raises(ValueError, match="empty"):
        GraphormerCollator()([])
