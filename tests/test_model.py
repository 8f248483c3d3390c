import pytest
import torch
import torch.nn.functional as F

from graphormer.data import GraphormerCollator, StructuralFeatures
from graphormer.models import Graphormer, GraphormerConfig

from helpers import model_preset, nci_graphs, to_data


def tiny(**overrides) -> Graphormer:
    config = GraphormerConfig(
        num_layers=2, hidden_dim=32, ffn_dim=48, num_heads=4, num_tasks=2, **overrides
    )
    torch.manual_seed(0)
    model = Graphormer(config).eval()
    with torch.no_grad():  # lift the N(0, 0.02) init so the structural terms really matter
        for p in model.attn_bias.parameters():
            p.normal_()
    return model


def batch_of(graphs, pad=1):
    return GraphormerCollator(max_hops=5, pad_to_multiple=pad)(
        [StructuralFeatures(5)(g.clone()) for g in graphs]
    )


def molecules(indices):
    graphs = nci_graphs(400)
    return [to_data(graphs[i], 0.0) for i in indices]


@pytest.mark.parametrize(
    "name, target",
    [("graphormer_slim", 0.49e6), ("graphormer_small", 12.5e6), ("graphormer_base", 47e6)],
)
def test_preset_parameter_counts(name, target):
    model = Graphormer(GraphormerConfig(**model_preset(name)))
    count = sum(p.numel() for p in model.parameters())
    assert abs(count - target) / target < 0.05, count


def test_config_checks():
    with pytest.raises(ValueError, match="divisible"):
        GraphormerConfig(hidden_dim=30, num_heads=4)
    with pytest.raises(ValueError, match="unknown model option"):
        GraphormerConfig.from_dict({"hidden_size": 3})
    with pytest.raises(ValueError, match="edge_encoding"):
        GraphormerConfig(edge_encoding="three_hop")


def test_output_and_attention_shapes():
    model = tiny()
    batch = batch_of(molecules(range(4)), pad=8)
    out, attention = model(batch, return_attention=True)
    n = batch.x.size(1)
    assert out.shape == (4, 2)
    assert len(attention) == 2 and attention[0].shape == (4, 4, n + 1, n + 1)
    # No attention mass on padded keys, rows are distributions.
    pad_keys = torch.nn.functional.pad(~batch.node_mask, (1, 0), value=False)
    for weights in attention:
        assert weights.masked_select(pad_keys[:, None, None, :]).abs().max() == 0
        torch.testing.assert_close(weights.sum(-1), torch.ones_like(weights.sum(-1)))
    torch.testing.assert_close(model(batch), out)


@pytest.mark.parametrize("pre_layernorm", [True, False])
@pytest.mark.parametrize("edge_encoding", ["multi_hop", "single_hop"])
def test_padding_invariance(pre_layernorm, edge_encoding):
    model = tiny(pre_layernorm=pre_layernorm, edge_encoding=edge_encoding)
    graphs = molecules([0, 3, 7, 120, 250])
    together = model(batch_of(graphs, pad=8))
    for i, g in enumerate(graphs):
        alone = model(batch_of([g]))
        torch.testing.assert_close(alone[0], together[i], atol=1e-5, rtol=0)


def test_node_permutation_invariance():
    model = tiny()
    graph = molecules([42])[0]
    n = graph.num_nodes
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(1))
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(n)
    permuted = graph.clone()
    permuted.x = graph.x[perm]
    permuted.edge_index = inverse[graph.edge_index]
    torch.testing.assert_close(
        model(batch_of([graph])), model(batch_of([permuted])), atol=1e-5, rtol=0
    )


def naive_bias(model: Graphormer, graph) -> torch.Tensor:
    """The paper's attention bias for one graph with plain Python loops over pairs and hops."""
    enc = model.attn_bias
    data = StructuralFeatures(5)(graph.clone())
    n, heads = data.num_nodes, enc.num_heads
    spatial = data.spatial_pos.view(n, n).long()
    paths = data.edge_path.view(n, n, 5).long()
    offsets = enc.edge.offsets
    bias = torch.zeros(heads, n + 1, n + 1)
    for i in range(n):
        for j in range(n):
            d = int(spatial[i, j])
            row = (
                d
                if 0 <= d <= enc.max_distance
                else (enc.max_distance + 1 if d > 0 else enc.max_distance + 2)
            )
            value = enc.spatial.weight[row].clone()
            if enc.edge_encoding == "multi_hop" and d > 0:
                hops = min(d, enc.multi_hop_max_dist)
                total = torch.zeros(heads)
                for k in range(hops):
                    e = int(paths[i, j, k])
                    emb = enc.edge.embedding.weight[data.edge_attr[e] + offsets].mean(0)
                    total += emb @ enc.hop_weight[k]
                value += total / hops
            if enc.edge_encoding == "single_hop" and d == 1:
                e = int(paths[i, j, 0])
                value += enc.edge.embedding.weight[data.edge_attr[e] + offsets].mean(0)
            bias[:, i + 1, j + 1] = value
    bias[:, 0, :] += enc.graph_token_distance[:, None]
    bias[:, 1:, 0] += enc.graph_token_distance[:, None]
    return bias


@pytest.mark.parametrize("edge_encoding", ["multi_hop", "single_hop"])
def test_vectorised_bias_equals_naive_loops(edge_encoding):
    model = tiny(edge_encoding=edge_encoding, max_distance=6)
    graphs = molecules([1, 11, 57, 190])  # includes pairs farther than max_distance
    batch = batch_of(graphs, pad=8)
    with torch.no_grad():
        bias = model.attn_bias(batch.spatial_pos, batch.edge_path, batch.edge_attr)
        for b, g in enumerate(graphs):
            n = g.num_nodes
            expected = naive_bias(model, g)
            torch.testing.assert_close(bias[b, :, : n + 1, : n + 1], expected, atol=1e-5, rtol=1e-5)


def test_path_sum_is_embedding_bag_with_its_gradient():
    from graphormer.models.encoders import path_sum

    torch.manual_seed(0)
    rows, hops, heads = 300, 5, 8
    index = torch.randint(0, rows, (4000, hops))
    index[:, 2:][torch.rand(4000, hops - 2) < 0.6] = rows  # paths shorter than K: the pad row
    table = torch.randn(rows + 1, heads, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(4000, heads, dtype=torch.float64)
    ours = path_sum(index, table, rows)
    ours.backward(grad)
    ours_grad, table.grad = table.grad, None
    theirs = F.embedding_bag(index, table, mode="sum", padding_idx=rows)
    theirs.backward(grad)
    assert torch.equal(ours, theirs)  # the forward is embedding_bag's own
    # Only the order of the sums differs from embedding_bag's backward (which sorts).
    torch.testing.assert_close(ours_grad, table.grad, rtol=1e-12, atol=1e-12)
    assert ours_grad[rows].abs().sum() == 0 and ours_grad[:rows].abs().sum() > 0
    small = torch.randn(7, 3, dtype=torch.float64, requires_grad=True)
    paths = torch.tensor([[0, 1, 6], [2, 6, 6], [5, 5, 4], [3, 0, 1]])
    assert torch.autograd.gradcheck(lambda t: path_sum(paths, t, 6), (small,))


def test_the_edge_encodings_gradients_are_embedding_bags(monkeypatch):
    """A molecule batch's structural bias trains as it did with PyTorch's embedding_bag."""
    from graphormer.models import encoders

    grads = []
    for use_bag in (False, True):
        if use_bag:
            monkeypatch.setattr(
                encoders,
                "path_sum",
                lambda index, table, pad: F.embedding_bag(
                    index, table, mode="sum", padding_idx=pad
                ),
            )
        model = tiny().train()
        batch = batch_of(molecules(range(24)), pad=8)
        bias = model.attn_bias(batch.spatial_pos, batch.edge_path, batch.edge_attr)
        (bias * torch.linspace(-1, 1, bias.numel()).view_as(bias)).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.attn_bias.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-4, atol=1e-4)
    assert grads[0]["hop_weight"].abs().sum() > 0


def test_unreachable_pairs_and_far_pairs_use_their_own_entries():
    from ogb.utils import smiles2graph

    model = tiny(max_distance=2)
    salt = to_data(smiles2graph("CCCC.[Na+]"), 0.0)  # a 4-chain (distance 3 > 2) and an ion
    batch = batch_of([salt])
    index = model.attn_bias.spatial_index(batch.spatial_pos[0])
    assert index[0, 3] == 3  # farther than max_distance
    assert index[0, 4] == 4  # unreachable
    assert index[1, 2] == 1


def test_gradients_flow_to_every_parameter():
    model = tiny().train()
    batch = batch_of(molecules(range(6)), pad=8)
    model(batch).sum().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert not missing


def test_bf16_autocast_masks_padding_and_stays_close():
    model = tiny()
    batch = batch_of(molecules(range(6)), pad=8)
    reference = model(batch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, attention = model(batch, return_attention=True)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), reference, atol=5e-2, rtol=5e-2)
    pad_keys = torch.nn.functional.pad(~batch.node_mask, (1, 0), value=False)
    assert attention[0].float().masked_select(pad_keys[:, None, None, :]).abs().max() == 0


# -- options that make the model Microsoft's (issue 7 and 8) ----------------------------------


def test_default_options_build_the_same_network():
    """The new options default to today's model: same tensors, same initial values."""
    model = tiny()
    names = [n for n, _ in model.named_parameters()]
    assert "head.bias" in names and "head_bias" not in names
    assert not any(n.startswith("final_norm") for n in names)
    assert isinstance(model.final_norm, torch.nn.Identity)
    assert isinstance(model.input_norm, torch.nn.LayerNorm)  # follows pre_layernorm
    assert isinstance(tiny(pre_layernorm=False).input_norm, torch.nn.Identity)
    assert model.attn_bias.spatial.num_embeddings == 20 + 3


@pytest.mark.parametrize("pre_layernorm", [True, False])
def test_embedding_layernorm_is_independent_of_the_layer_type(pre_layernorm):
    on = tiny(pre_layernorm=pre_layernorm, embedding_layernorm=True)
    off = tiny(pre_layernorm=pre_layernorm, embedding_layernorm=False)
    assert isinstance(on.input_norm, torch.nn.LayerNorm)
    assert isinstance(off.input_norm, torch.nn.Identity)
    with torch.no_grad():
        on.input_norm.weight.normal_()
    batch = batch_of(molecules(range(4)), pad=8)
    assert not torch.allclose(on(batch), off(batch))


def test_final_layernorm_normalises_the_last_layer_output():
    model = tiny(final_layernorm=True)
    with torch.no_grad():
        model.final_norm.weight.normal_()
        model.final_norm.bias.normal_()
    batch = batch_of(molecules(range(3)))
    h, _ = model.encode(batch)
    norm, model.final_norm = model.final_norm, torch.nn.Identity()
    raw, _ = model.encode(batch)
    real = F.pad(batch.node_mask, (1, 0), value=True)  # graph tokens and nodes
    torch.testing.assert_close(h[real], norm(raw[real]))
    assert not torch.allclose(h[real], raw[real])
    assert h[~real].abs().max() == 0  # padding rows are zeros


def test_shared_head_bias_is_one_scalar_added_to_every_output():
    model = tiny(head_bias="shared")
    assert model.head.bias is None and model.head_bias.shape == (1,)
    batch = batch_of(molecules(range(3)))
    before = model(batch)
    with torch.no_grad():
        model.head_bias.fill_(0.75)
    torch.testing.assert_close(model(batch), before + 0.75)
    with pytest.raises(ValueError, match="head_bias"):
        GraphormerConfig(head_bias="per_head")


def test_unreachable_as_far_shares_the_far_entry():
    model = tiny(max_distance=2, unreachable_as_far=True)
    assert model.attn_bias.spatial.num_embeddings == 4  # distances 0..2, then "far"
    index = model.attn_bias.spatial_index(torch.tensor([0, 2, 3, 9, -1]))
    assert index.tolist() == [0, 2, 3, 3, 3]


def test_attention_max_distance_stops_far_pairs_attending():
    model = tiny(attention_max_distance=2)
    graphs = molecules([11, 57])
    batch = batch_of(graphs, pad=8)
    _, attention = model(batch, return_attention=True)
    spatial = torch.nn.functional.pad(batch.spatial_pos.long(), (1, 0, 1, 0), value=0)
    far = (spatial > 2) | (spatial < 0)  # unreachable and padding too; never the graph token
    far[:, 0, :] = far[:, :, 0] = False
    for weights in attention:
        assert weights.masked_select(far[:, None]).abs().max() == 0
        near = weights.masked_select(~far[:, None] & batch.node_mask.any(-1)[:, None, None, None])
        assert near.sum() > 0
    # Each graph alone gives the same outputs (the mask does not depend on padding).
    together = model(batch)
    for i, g in enumerate(graphs):
        torch.testing.assert_close(model(batch_of([g]))[0], together[i], atol=1e-5, rtol=0)


@pytest.mark.parametrize("pre_layernorm", [True, False])
def test_packed_layers_equal_the_padded_layers(monkeypatch, pre_layernorm):
    # The layers run on the real tokens only; running them on the whole padded batch (padding
    # included: the branch for batches with little padding) gives the same states and gradients.
    import graphormer.models.graphormer as graphormer_module

    no_dropout = {"dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0}
    model = tiny(pre_layernorm=pre_layernorm, final_layernorm=True, **no_dropout).train()
    batch = batch_of(molecules([0, 5, 9, 40]))  # mixed sizes: most rows are padding
    real = F.pad(batch.node_mask, (1, 0), value=True)
    assert (~real).sum() > real.sum() / 4

    def run():
        model.zero_grad()
        h, _ = model.encode(batch)
        h[real].square().sum().backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        return h[real].detach(), [g.clone() for g in grads]

    packed, packed_grads = run()
    assert len(packed_grads) > 20  # every layer's and encoder's parameters
    monkeypatch.setattr(graphormer_module, "_PACK_BELOW", 0.0)  # the padded branch
    padded, padded_grads = run()
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=1e-5)
    for a, b in zip(packed_grads, padded_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_hooks_and_swapped_modules_see_packed_batches():
    # Packed batches still go through the modules' __call__: hooks fire, a wrapped q_proj is used.
    model = tiny().train()
    batch = batch_of(molecules([0, 5, 9, 40]))  # mixed sizes: packed
    seen = []
    model.layers[0].register_forward_hook(lambda *_: seen.append("layer"))
    model.layers[0].attn.q_proj.register_forward_hook(lambda *_: seen.append("q_proj"))
    before = model(batch)
    assert seen == ["q_proj", "layer"]
    model.layers[0].attn.q_proj = torch.nn.Sequential(model.layers[0].attn.q_proj, torch.nn.ReLU())
    assert not torch.allclose(model(batch), before)


def test_model_settings_are_checked_before_anything_is_allocated():
    """Issue 20: bad model values (from the command line or a checkpoint) are one message naming
    the key, the value and what is allowed; a network that cannot fit is refused unbuilt."""
    cases = {
        "model.num_heads=0 is not allowed: an integer >= 1": {"num_heads": 0},
        "model.num_heads='abc' is not allowed": {"num_heads": "abc"},
        "model.dropout=nan is not allowed: a rate in [0, 1]": {"dropout": float("nan")},
        "model.atom_feature_dims=[0] is not allowed": {"atom_feature_dims": [0]},
        "model.pre_layernorm='yes' is not allowed": {"pre_layernorm": "yes"},
        "model.hidden_dim=10000000 is not allowed: the network would hold about": {
            "hidden_dim": 10_000_000
        },
        "model.num_layers=1000000000 is not allowed": {"num_layers": 10**9},
        "model.max_degree=20000000 is not allowed": {"max_degree": 20_000_000},
    }
    for message, values in cases.items():
        with pytest.raises(ValueError) as caught:
            GraphormerConfig(**values)
        assert str(caught.value).startswith(message), (values, str(caught.value))
    with pytest.raises(ValueError, match="did you mean model.hidden_dim"):
        GraphormerConfig.from_dict({"hiden_dim": 3})
    # The presets' sizes are counted exactly.
    for name in ("graphormer_tiny", "graphormer_slim", "graphormer_base"):
        config = GraphormerConfig.from_dict(model_preset(name))
        real = sum(p.numel() for p in Graphormer(config).parameters())
        assert config.estimated_parameters() == real, name


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"pre_layernorm": False},  # no input LayerNorm
        {"pre_layernorm": False, "embedding_layernorm": True},
        {"final_layernorm": True},
        {"edge_encoding": "single_hop"},  # no hop weights
        {"node_continuous_dim": 5, "edge_continuous_dim": 3},
        {"atom_feature_dims": [], "bond_feature_dims": []},  # learned constant inputs
        {"atom_feature_dims": [], "node_continuous_dim": 4},
        {"bond_feature_dims": [], "edge_continuous_dim": 2},
        {"feature_stride": 128},
        {"num_tasks": 2, "head_bias": "shared"},  # one scalar for every output
        {"num_tasks": 3, "readout": "token_mean", "atom_tasks": 2, "bond_tasks": 1},
        {"molecule_features_dim": 7, "molecule_features_at": "token"},
    ],
)
def test_the_parameter_estimate_is_exact(options):
    config = GraphormerConfig(num_layers=2, hidden_dim=16, ffn_dim=24, num_heads=4, **options)
    assert config.estimated_parameters() == sum(p.numel() for p in Graphormer(config).parameters())


def test_a_zero_readout_init_starts_every_atom_contribution_at_zero():
    batch = batch_of(molecules([0, 5, 9]))
    normal = tiny(readout="token_sum")
    zero = tiny(readout="token_sum", readout_init="zero")
    assert zero.readout.weight.abs().sum() == 0 and normal.readout.weight.abs().sum() > 0
    with torch.no_grad():
        h, _ = zero.encode(batch)
        assert zero.atom_contributions(h, batch).abs().sum() == 0
        # the rest of the network is initialised as before: only the atoms' sum differs
        head = normal.head(normal.head_inputs(*normal.encode(batch)[:1], batch)[0])
        torch.testing.assert_close(zero(batch), head)
        assert not torch.allclose(normal(batch), head)
    with pytest.raises(ValueError, match="readout_init must be 'normal' or 'zero'"):
        GraphormerConfig(readout="token_sum", readout_init="ones")
    with pytest.raises(ValueError, match="model.readout=token has none"):
        GraphormerConfig(readout="token", readout_init="zero")
