"""Graphormer-3D's distance encoding and vector head (model.channels, model.cutoff,
model.atom_vector_tasks): invariance of energies, equivariance of vectors, padding, the cutoff,
and the 2D / 3D / both channels."""

import math

import pytest
import torch

from graphormer.data.collate import GraphormerCollator
from graphormer.data.featurize import featurize_smiles
from graphormer.errors import DataError
from graphormer.models import GaussianDistanceEncoding, Graphormer, GraphormerConfig

from helpers import float64_batch, moved_graphs, positioned_graphs, proper_rotation

SMILES = ["CCO", "c1ccccc1O", "CC(=O)Nc1ccc(OCC)cc1", "[Na+]"]


def _model(dtype=torch.float64, **settings) -> Graphormer:
    torch.manual_seed(0)
    values = dict(num_layers=2, hidden_dim=16, ffn_dim=16, num_heads=2, dropout=0.0)
    values.update(attention_dropout=0.0, activation_dropout=0.0, channels="3d", num_kernels=8)
    config = GraphormerConfig(**{**values, **settings})
    model = Graphormer(config).to(dtype).eval()
    with torch.no_grad():  # away from the initialisation's near-zero weights
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


def _permuted(g, perm):
    h = g.clone()
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(len(perm))
    h.x, h.pos = g.x[perm], g.pos[perm]
    h.edge_index = inverse[g.edge_index]
    return h


@torch.no_grad()
def test_energies_unchanged_by_rotation_translation_and_permutation():
    model = _model(readout="token_sum")
    graphs = positioned_graphs()
    before = model(float64_batch(graphs))
    moved = model(
        float64_batch(moved_graphs(graphs, proper_rotation(), torch.tensor([3.0, -1.0, 7.5])))
    )
    torch.testing.assert_close(moved, before, rtol=1e-9, atol=1e-9)
    perm = torch.randperm(graphs[2].num_nodes, generator=torch.Generator().manual_seed(2))
    shuffled = model(float64_batch([_permuted(graphs[2], perm)]))
    torch.testing.assert_close(shuffled, before[2:3], rtol=1e-9, atol=1e-9)
    # and the positions matter: another conformation is another energy
    assert not torch.allclose(model(float64_batch(positioned_graphs(seed=5))), before, atol=1e-3)


@torch.no_grad()
def test_vectors_rotate_with_the_input_and_follow_a_permutation():
    model = _model(atom_vector_tasks=2)
    graphs = positioned_graphs()
    rotation = proper_rotation()
    before = model.forward_levels(float64_batch(graphs))["atom_vector"]  # [B, N, 2, 3]
    assert before.shape[-2:] == (2, 3) and before.abs().max() > 1e-3
    after = model.forward_levels(float64_batch(moved_graphs(graphs, rotation, torch.ones(3))))[
        "atom_vector"
    ]
    torch.testing.assert_close(after, before @ rotation.T, rtol=1e-9, atol=1e-9)
    perm = torch.randperm(graphs[2].num_nodes, generator=torch.Generator().manual_seed(3))
    shuffled = model.forward_levels(float64_batch([_permuted(graphs[2], perm)]))["atom_vector"]
    n = graphs[2].num_nodes
    torch.testing.assert_close(shuffled[0, :n], before[2, :n][perm], rtol=1e-9, atol=1e-9)
    # padding rows are zeros
    assert before[3, 1:].abs().max() == 0


@torch.no_grad()
def test_a_molecule_alone_equals_the_same_in_a_padded_batch_in_float32():
    model = _model(torch.float32, atom_vector_tasks=1, readout="token_sum")
    graphs = positioned_graphs()
    batch = float64_batch(graphs, torch.float32)
    together = model.forward_levels(batch)
    for i, g in enumerate(graphs):
        alone = model.forward_levels(float64_batch([g], torch.float32))
        torch.testing.assert_close(
            alone["molecule"][0], together["molecule"][i], atol=1e-4, rtol=1e-4
        )
        n = g.num_nodes
        torch.testing.assert_close(
            alone["atom_vector"][0, :n], together["atom_vector"][i, :n], atol=1e-4, rtol=1e-4
        )


def test_the_kernels_follow_the_formula_and_padding_and_cutoff_mask_pairs():
    torch.manual_seed(0)
    encoding = GaussianDistanceEncoding(num_heads=2, hidden_dim=4, num_atom_types=5, num_kernels=3)
    with torch.no_grad():
        encoding.gamma.weight[1 * 5 + 2] = 2.0  # pair type (1, 2) only: ordered pairs
        encoding.beta.weight[1 * 5 + 2] = 0.5
    pos = torch.tensor([[[0.0, 0, 0], [0, 0, 1.5], [0, 0, 0]]])
    types = torch.tensor([[1, 2, 0]])
    mask = torch.tensor([[True, True, False]])
    dist = torch.tensor([[[0.0, 1.5, 0.0], [1.5, 0.0, 0.0], [0.0, 0.0, 0.0]]])
    pair_mask = mask.unsqueeze(2) & mask.unsqueeze(1)
    psi = encoding.kernels(dist, types, pair_mask)
    mu, sigma = encoding.means[0].item(), abs(encoding.stds[0].item()) + 1e-5

    def gauss(x: float) -> float:
        return math.exp(-0.5 * ((x - mu) / sigma) ** 2) / (math.sqrt(2 * math.pi) * sigma)

    assert psi[0, 0, 1, 0].item() == pytest.approx(gauss(2.0 * 1.5 + 0.5), rel=1e-5)
    assert psi[0, 1, 0, 0].item() == pytest.approx(gauss(1.5), rel=1e-5)
    assert psi[0, 2].abs().max() == 0 and psi[0, :, 2].abs().max() == 0  # padding
    _, atoms, far = encoding(pos, types, mask)
    assert atoms[0, 2].abs().max() == 0 and not far.any()
    encoding.cutoff = 1.0
    _, atoms_cut, far = encoding(pos, types, mask)
    assert far[0, 0, 1] and far[0, 1, 0] and not far[0, 0, 0] and not far[0, 2].any()
    # beyond the cutoff the neighbour no longer enters the 3D centrality
    alone = encoding.centrality(encoding.kernels(dist, types, torch.eye(3, dtype=torch.bool)[None]))
    torch.testing.assert_close(atoms_cut[0, :2], alone.sum(2)[0, :2])


@torch.no_grad()
def test_cutoff_keeps_far_atoms_from_attending_to_each_other():
    # Two molecules 100 A apart in one graph: with a cutoff, moving one leaves the other's
    # outputs unchanged only because no attention crosses the gap.
    model = _model(channels="3d", cutoff=5.0, atom_vector_tasks=1, readout="token_sum")
    [g] = featurize_smiles(["CCO.CCN"]).graphs
    g.pos = torch.randn(g.num_nodes, 3, generator=torch.Generator().manual_seed(0)).double()
    g.pos[3:] += 100.0
    before = model.forward_levels(float64_batch([g]))["atom_vector"]
    h = g.clone()
    h.pos = g.pos.clone()
    h.pos[3:] = (g.pos[3:] - 100.0) @ proper_rotation(4).T + 100.0  # turn the far molecule only
    after = model.forward_levels(float64_batch([h]))["atom_vector"]
    torch.testing.assert_close(after[0, :3], before[0, :3], rtol=1e-9, atol=1e-9)
    uncut = _model(channels="3d", atom_vector_tasks=1, readout="token_sum")
    changed = uncut.forward_levels(float64_batch([h]))["atom_vector"][0, :3]
    assert not torch.allclose(
        changed, uncut.forward_levels(float64_batch([g]))["atom_vector"][0, :3]
    )


@torch.no_grad()
def test_channels_2d_ignores_positions_and_builds_no_3d_tensors():
    model = _model(channels="2d")
    assert model.geometry is None
    plain = GraphormerConfig(num_layers=2, hidden_dim=16, ffn_dim=16, num_heads=2)
    assert set(model.state_dict()) == set(Graphormer(plain).state_dict())
    graphs = positioned_graphs()
    torch.testing.assert_close(
        model(float64_batch(graphs)), model(float64_batch(positioned_graphs(seed=9)))
    )
    without = GraphormerCollator(max_hops=5)(featurize_smiles(SMILES).graphs)
    assert without.pos is None
    torch.testing.assert_close(model(without), model(float64_batch(graphs)))


@torch.no_grad()
def test_channels_both_predicts_from_bonds_alone_and_3d_needs_positions():
    model = _model(channels="both", readout="token_sum")
    batch = GraphormerCollator(max_hops=5)(featurize_smiles(SMILES).graphs)
    out = model.double()(batch)
    assert torch.isfinite(out).all()
    assert model.channels(batch) == (True, False)
    assert model.channels(float64_batch(positioned_graphs())) == (
        True,
        True,
    )  # evaluation reads both
    three = _model(channels="3d")
    positions = float64_batch(positioned_graphs())
    assert three.channels(positions) == (False, True)
    assert three.train().channels(positions) == (False, True)  # never draws: 3D only
    three.eval()
    with pytest.raises(DataError, match="model.channels=3d reads atom positions"):
        three(batch)


def test_channels_both_draws_each_channel_in_training_and_trains_from_smiles_alone():
    model = _model(torch.float32, channels="both", channel_probs=[0.3, 0.3, 0.4]).train()
    batch = float64_batch(positioned_graphs(), torch.float32)
    torch.manual_seed(0)
    draws = {model.channels(batch) for _ in range(60)}
    assert draws == {(True, False), (False, True), (True, True)}
    # a step on SMILES alone (no positions) trains; the 3D tensors get zero gradients, not None
    plain = GraphormerCollator(max_hops=5)(featurize_smiles(SMILES).graphs)
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-2)
    target = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    losses = []
    for _ in range(15):
        loss = (model(plain) - target).pow(2).mean()
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    assert all(p.grad is not None for p in model.geometry.parameters())
    assert all(p.grad.abs().max() == 0 for p in model.geometry.parameters())


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"channels": "4d"}, "model.channels must be one of 2d, 3d, both"),
        ({"channels": "both", "channel_probs": [0.5, 0.6, 0.1]}, "model.channel_probs"),
        ({"cutoff": -1.0}, "model.cutoff=-1.0 is not allowed"),
        ({"channels": "2d", "atom_vector_tasks": 1}, "needs atom positions"),
        ({"atom_feature_dims": [], "node_continuous_dim": 2}, "first categorical atom feature"),
        ({"num_kernels": 0}, "model.num_kernels=0"),
    ],
)
def test_settings_of_the_3d_channel_are_checked(settings, message):
    with pytest.raises(ValueError, match=message):
        GraphormerConfig(**{"channels": "3d", **settings})


def test_the_parameter_estimate_counts_the_3d_tensors():
    for settings in ({"channels": "3d", "atom_vector_tasks": 2}, {"channels": "both"}):
        config = GraphormerConfig(num_layers=2, hidden_dim=16, ffn_dim=16, num_heads=2, **settings)
        actual = sum(p.numel() for p in Graphormer(config).parameters())
        assert config.estimated_parameters() == actual
