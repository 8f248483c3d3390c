"""Node and edge inputs of any graph (issue #17): categorical, continuous, both or absent."""

import pytest
import torch

from graphormer.data import GraphormerCollator, StructuralFeatures
from graphormer.data.features import split_columns, vocabulary_sizes
from graphormer.errors import DataError
from graphormer.models import Graphormer, GraphormerConfig

from helpers import nci_graphs, to_data


def model_for(**overrides) -> Graphormer:
    config = GraphormerConfig(num_layers=2, hidden_dim=32, ffn_dim=48, num_heads=4, **overrides)
    torch.manual_seed(0)
    model = Graphormer(config).eval()
    with torch.no_grad():  # every input path must matter, not hide under the N(0, 0.02) init
        for p in model.parameters():
            p.normal_()
    return model


def continuous_graphs(indices, categorical_nodes=True):
    """Real molecules whose atom and bond ids also serve as float vectors (plus noise)."""
    source = nci_graphs(300)
    generator = torch.Generator().manual_seed(3)
    graphs = []
    for i in indices:
        g = to_data(source[i], 0.0)
        g.x_continuous = g.x[:, :4].float() + torch.randn(g.num_nodes, 4, generator=generator)
        g.edge_attr_continuous = g.edge_attr.float() * 0.5
        g.x = g.x[:, :2] if categorical_nodes else g.x[:, :0]
        g.edge_attr = g.edge_attr[:, :0]
        graphs.append(g)
    return graphs


def batch_of(graphs, pad=1):
    collate = GraphormerCollator(max_hops=5, pad_to_multiple=pad)
    return collate([StructuralFeatures(5)(g.clone()) for g in graphs])


KINDS = {
    "both nodes, continuous edges": dict(
        atom_feature_dims=[120, 10], bond_feature_dims=[], node_continuous_dim=4,
        edge_continuous_dim=3,
    ),
    "continuous only": dict(
        atom_feature_dims=[], bond_feature_dims=[], node_continuous_dim=4, edge_continuous_dim=3
    ),
    "absent": dict(atom_feature_dims=[], bond_feature_dims=[]),
}  # fmt: skip


def graphs_for(kind, indices):
    graphs = continuous_graphs(indices, categorical_nodes=kind.startswith("both"))
    if kind == "absent":
        for g in graphs:
            del g.x_continuous, g.edge_attr_continuous
    return graphs


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_kind_of_input_is_padding_and_permutation_invariant(kind):
    model = model_for(**KINDS[kind])
    graphs = graphs_for(kind, [0, 3, 7, 120, 250])
    together = model(batch_of(graphs, pad=8))
    for i, g in enumerate(graphs):
        torch.testing.assert_close(model(batch_of([g]))[0], together[i], atol=1e-4, rtol=0)
    graph = graphs[2]
    perm = torch.randperm(graph.num_nodes, generator=torch.Generator().manual_seed(1))
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(graph.num_nodes)
    permuted = graph.clone()
    permuted.x = graph.x[perm]
    if "x_continuous" in graph:
        permuted.x_continuous = graph.x_continuous[perm]
    permuted.edge_index = inverse[graph.edge_index]
    torch.testing.assert_close(
        model(batch_of([graph])), model(batch_of([permuted])), atol=1e-4, rtol=0
    )
    # Different graphs give different outputs: the inputs (or, absent them, the structure) count.
    assert together.std(0).min() > 1e-3


def test_absent_features_use_one_learned_embedding_and_the_structure():
    model = model_for(**KINDS["absent"])
    assert model.node_encoder.atom is None and model.node_encoder.continuous is None
    assert model.node_encoder.node_embedding.shape == (32,)
    assert model.attn_bias.edge_embedding.shape == (4,)
    a, b = graphs_for("absent", [10, 11])
    assert not torch.allclose(model(batch_of([a])), model(batch_of([b])))


def test_continuous_inputs_count_and_are_standardised():
    model = model_for(**KINDS["continuous only"])
    graphs = graphs_for("continuous only", [5, 6])
    before = model(batch_of(graphs))
    changed = [g.clone() for g in graphs]
    changed[0].x_continuous = changed[0].x_continuous + 1.0
    assert not torch.allclose(model(batch_of(changed))[0], before[0])
    # Statistics shift and scale the inputs; the projection sees (v - mean) / std.
    projection = model.node_encoder.continuous
    projection.set_statistics(torch.full((4,), 1.0), torch.tensor([2.0, 0.0, 1.0, 1.0]))
    values = torch.tensor([[3.0, 5.0, 1.0, 0.0]])
    expected = projection.linear(torch.tensor([[1.0, 4.0, 0.0, -1.0]]))  # zero spread -> 1
    torch.testing.assert_close(projection(values), expected)


def test_multi_hop_encoding_reads_the_projected_edge_vectors():
    model = model_for(**KINDS["continuous only"])
    enc = model.attn_bias
    graph = StructuralFeatures(5)(graphs_for("continuous only", [42])[0])
    batch = batch_of([graph])
    bias = enc.edge_bias(
        batch.spatial_pos, batch.edge_path, batch.edge_attr, batch.edge_attr_continuous
    )[0]
    n = graph.num_nodes
    spatial = graph.spatial_pos.view(n, n).long()
    paths = graph.edge_path.view(n, n, 5).long()
    edge_vectors = enc.edge_continuous(graph.edge_attr_continuous)  # [E, H]
    for i, j in [(0, 1), (0, n - 1), (2, 5), (n - 1, 3)]:
        d = int(spatial[i, j])
        hops = min(d, enc.multi_hop_max_dist)
        total = sum(edge_vectors[int(paths[i, j, k])] @ enc.hop_weight[k] for k in range(hops))
        torch.testing.assert_close(bias[i, j], total / hops, atol=1e-4, rtol=1e-4)


def test_a_batch_without_the_models_continuous_columns_is_refused():
    model = model_for(**KINDS["continuous only"])
    graphs = graphs_for("continuous only", [1])
    graphs[0].x_continuous = graphs[0].x_continuous[:, :3]
    with pytest.raises(ValueError, match="3 continuous node feature column.*reads 4"):
        model(batch_of(graphs))


def test_molecule_models_keep_their_tensors():
    """Defaults build exactly today's network: no new tensor in an existing checkpoint's model."""
    names = set(Graphormer(GraphormerConfig(num_layers=1)).state_dict())
    assert not [n for n in names if "continuous" in n or n.endswith("_embedding")]


def test_columns_are_split_and_checked():
    values = torch.tensor([[0.0, 1.5, 2.0], [3.0, -0.5, 1.0], [1.0, 0.0, 0.0]])
    graph = torch.tensor([0, 0, 1])
    categorical, continuous = split_columns(values, [0, 2], graph, "node", "g.pt", "key")
    assert categorical.dtype == torch.long and categorical.tolist() == [[0, 2], [3, 1], [1, 0]]
    torch.testing.assert_close(continuous, values[:, 1:2])
    assert vocabulary_sizes(categorical) == [4, 3]
    assert split_columns(values, [], graph, "node", "g.pt", "key")[0].shape == (3, 0)
    with pytest.raises(DataError, match=r"graph 0 has 1.5 in categorical node column 1"):
        split_columns(values, [1], graph, "node", "g.pt", "key")
    with pytest.raises(DataError, match=r"names column\(s\) \[3\]"):
        split_columns(values, [3], graph, "node", "g.pt", "key")
    values[2, 1] = float("nan")
    with pytest.raises(DataError, match=r"g.pt: graph 1 has a nan in node feature column 1"):
        split_columns(values, [0], graph, "node", "g.pt", "key")
