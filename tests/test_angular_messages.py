"""model.angular_messages: each message block adds sums over pairs of neighbours of the powers of
the cosine of the angle between them (the atomic cluster expansion's three-body terms), and with
model.directional_messages sends each atom the angles its bonds make at their other end. The
direction powers, the block against a triplet-by-triplet reference, invariance, the angle
reaching the states, periodic wrapping, gradient forces through the angles, the settings'
checks, and a training run that keeps the setting."""

import math

import pytest
import torch

from graphormer.models import AngularMessages, Graphormer, GraphormerConfig
from graphormer.models.geometry import direction_powers

from helpers import (
    assert_forces_are_energy_gradients,
    assert_placements_agree,
    assert_reflection_and_order_invariant,
    assert_run_keeps_setting,
    copper_placements,
    float64_batch,
    positioned_graphs,
    proper_rotation,
    rotated_levels,
    slab_batch,
    slab_gradient_settings,
    small_3d_model,
)


def _model(dtype=torch.float64, **settings) -> Graphormer:
    values = {"distance_messages": True, "message_cutoff": 3.0, "angular_messages": 3}
    return small_3d_model(dtype, **{**values, **settings})


def _block(degree: int = 3, seed: int = 1, directional: bool = False) -> AngularMessages:
    torch.manual_seed(seed)
    block = AngularMessages(5, 8, degree, directional).double()
    with torch.no_grad():
        for p in block.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return block


def _pairs():
    torch.manual_seed(0)
    target = torch.tensor([0, 0, 1, 3, 3, 3, 2, 0])
    source = torch.tensor([1, 2, 0, 4, 5, 0, 3, 3])
    psi = torch.rand(8, 5, dtype=torch.float64)
    switch = torch.tensor([1.0, 0.5, 0.2, 0.0, 0.9, 1.0, 0.7, 0.6], dtype=torch.float64)
    unit = torch.nn.functional.normalize(torch.randn(8, 3, dtype=torch.float64), dim=-1)
    return target, source, psi, switch, unit


def test_direction_powers_give_the_powers_of_the_cosine():
    torch.manual_seed(0)
    unit = torch.nn.functional.normalize(torch.randn(7, 3, dtype=torch.float64), dim=-1)
    for degree in range(1, 6):
        powers = direction_powers(unit, degree)
        assert powers.shape == (7, (degree + 1) * (degree + 2) // 2)
        torch.testing.assert_close(powers @ powers.T, (unit @ unit.T) ** degree)


@torch.no_grad()
def test_the_block_sums_every_pair_of_neighbours_as_written():
    block = _block()
    d = 8
    h = torch.randn(6, d, dtype=torch.float64)
    target, source, psi, switch, unit = _pairs()
    out = block(h, target, source, psi, switch, unit)

    x = block.inp(block.norm(h))
    gates = block.filter(psi) * switch[:, None]
    found = []
    for level in range(1, 4):
        value = x[source] * gates[:, (level - 1) * d : level * d]  # [P, d]
        mixed = value @ block.mix[level - 1].weight.T
        sums = torch.zeros(6, d, dtype=torch.float64)
        for a in range(len(target)):
            for b in range(len(target)):
                if target[a] == target[b]:  # a pair of neighbours of one atom, itself twice too
                    cosine = float(unit[a] @ unit[b])
                    sums[target[a]] += cosine**level * value[a] * mixed[b]
        found.append(sums)
    expected = h + block.out(block.out_norm(torch.cat(found, dim=-1)))
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)
    # a lone atom (rows 4 and 5 receive nothing) adds the output layer of zero sums
    lonely = h[4] + block.out(block.out_norm(torch.zeros(1, 3 * d, dtype=torch.float64)))[0]
    torch.testing.assert_close(out[4], lonely)
    assert (out[0] - lonely + h[4] - h[0]).abs().max() > 1e-3


@torch.no_grad()
def test_directional_messages_send_each_bonds_angles_at_its_other_end_as_written():
    block = _block(directional=True)
    d = 8
    h = torch.randn(6, d, dtype=torch.float64)
    target, source, psi, switch, unit = _pairs()
    out = block(h, target, source, psi, switch, unit)
    without = block.edge_mlp
    block.edge_mlp = None  # the same block without its directional messages
    base = block(h, target, source, psi, switch, unit)
    block.edge_mlp = without

    x = block.inp(block.norm(h))
    gates = block.filter(psi) * switch[:, None]
    along = []
    for level in range(1, 4):
        mixed = (x[source] * gates[:, (level - 1) * d : level * d]) @ block.mix[level - 1].weight.T
        sums = torch.zeros(len(target), d, dtype=torch.float64)
        for a in range(len(target)):  # the pair (target j, source i)
            for b in range(len(target)):  # each neighbour k of j, i itself included
                if target[a] == target[b]:
                    sums[a] += float(unit[a] @ unit[b]) ** level * mixed[b]
        along.append(sums)
    edge = block.edge_mlp(torch.cat(along, dim=-1)) * block.edge_filter(psi) * switch[:, None]
    sent = torch.zeros(6, d, dtype=torch.float64)
    for a in range(len(target)):
        sent[source[a]] += edge[a]
    torch.testing.assert_close(out, base + block.edge_out(sent), rtol=1e-10, atol=1e-12)
    assert (out - base).abs().max() > 1e-3


@torch.no_grad()
@pytest.mark.parametrize("directional", [False, True])
def test_the_block_keeps_its_output_under_rotations_and_reflections(directional):
    block = _block(degree=4, seed=2, directional=directional)
    h = torch.randn(6, 8, dtype=torch.float64)
    target, source, psi, switch, unit = _pairs()
    out = block(h, target, source, psi, switch, unit)
    for turn in (proper_rotation(3), torch.diag(torch.tensor([1.0, -1.0, 1.0]).double())):
        torch.testing.assert_close(block(h, target, source, psi, switch, unit @ turn.T), out)


@torch.no_grad()
def test_the_angle_between_neighbours_reaches_the_state_where_distances_do_not():
    """Three identical neighbours at one distance from a centre, in a plane at 120 degrees or
    along three orthogonal axes: each power of the cosine tells them apart; with the first
    power alone the sum of the unit vectors does too (zero in the plane), and a centre
    with the same neighbours at 90 and 180 degrees differs from one at 90 and 90 from the
    second power on."""
    block = _block(degree=2, seed=4)
    d = 8
    target, source = torch.tensor([0, 0, 0]), torch.tensor([1, 2, 3])
    psi = torch.rand(1, 5, dtype=torch.float64).expand(3, 5)
    switch = torch.ones(3, dtype=torch.float64)
    h = torch.zeros(4, d, dtype=torch.float64)
    h[1:] = torch.randn(d, dtype=torch.float64)
    planar = torch.tensor([[1.0, 0, 0], [-0.5, math.sqrt(0.75), 0], [-0.5, -math.sqrt(0.75), 0]])
    axes = torch.eye(3)
    bent = torch.tensor([[1.0, 0, 0], [0, 1.0, 0], [-1.0, 0, 0]])
    states = [block(h, target, source, psi, switch, u.double())[0] for u in (planar, axes, bent)]
    assert (states[0] - states[1]).abs().max() > 1e-3
    assert (states[1] - states[2]).abs().max() > 1e-3


@torch.no_grad()
@pytest.mark.parametrize("directional", [False, True])
def test_the_model_changes_and_stays_invariant(directional):
    plain = small_3d_model(distance_messages=True, message_cutoff=3.0, atom_vector_tasks=1)
    if directional:  # against the angular messages alone
        plain = _model(atom_vector_tasks=1)
    model = _model(atom_vector_tasks=1, directional_messages=directional)
    graphs = positioned_graphs()
    batch = float64_batch(graphs)
    assert not torch.allclose(model(batch), plain(batch), atol=1e-4)
    rotated_levels(model, proper_rotation(5), torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64))
    assert_reflection_and_order_invariant(model)
    # with vector messages too: each layer runs both blocks
    both = _model(vector_messages=True, atom_vector_tasks=1, directional_messages=directional)
    rotated_levels(both, proper_rotation(6), torch.tensor([0.5, 0.0, -1.0], dtype=torch.float64))


@torch.no_grad()
@pytest.mark.parametrize("directional", [False, True])
def test_the_layout_is_computed_once_per_batch_and_changes_nothing(directional, monkeypatch):
    block = _block(directional=directional)
    h = torch.randn(6, 8, dtype=torch.float64)
    pairs = _pairs()
    layout = AngularMessages.layout(pairs[0], pairs[4], 6, 3)
    assert layout.width == 3 and [s.shape for s in layout.slots] == [
        (6, 3, 3),
        (6, 3, 6),
        (6, 3, 10),
    ]
    # a given layout gives exactly what the block computes for itself
    assert torch.equal(block(h, *pairs, None, layout), block(h, *pairs))
    model = _model(directional_messages=directional, num_layers=3)
    batch = float64_batch(positioned_graphs())
    expected = model(batch)
    calls = []
    original = AngularMessages.layout

    def counted(*args):
        calls.append(args)
        return original(*args)

    monkeypatch.setattr(AngularMessages, "layout", staticmethod(counted))
    assert torch.equal(model(batch), expected)
    assert len(calls) == 1  # one layout for the three layers' blocks


@torch.no_grad()
@pytest.mark.parametrize("directional", [False, True])
def test_a_molecule_alone_equals_the_same_in_a_packed_batch(directional):
    model = _model(torch.float32, directional_messages=directional)
    graphs = positioned_graphs(smiles=["CC(=O)Nc1ccc(OCC)cc1", "C", "O", "N", "CO", "CC"])
    together = model(float64_batch(graphs, torch.float32))
    for index in (0, 4):
        alone = model(float64_batch(graphs[index : index + 1], torch.float32))
        torch.testing.assert_close(alone[0], together[index], atol=1e-4, rtol=1e-4)


@torch.no_grad()
@pytest.mark.parametrize("directional", [False, True])
def test_periodic_wrapping_keeps_the_energy(directional):
    pytest.importorskip("ase")
    atoms, placements = copper_placements(seed=1, outside=4, fraction=0.2, axis=1)
    settings = {"atom_feature_dims": [119], "bond_feature_dims": [1], "cutoff": 3.0}
    model = _model(**settings, directional_messages=directional)
    assert_placements_agree(model, atoms, placements)


@pytest.mark.parametrize("directional", [False, True])
def test_gradient_forces_differentiate_through_the_angles(directional):
    pytest.importorskip("ase")
    settings = {**slab_gradient_settings(), "angular_messages": 2}
    model = _model(**settings, directional_messages=directional)
    assert_forces_are_energy_gradients(model, slab_batch(2, seed=5))
    # a loss on the forces trains the channel mixes of the angle sums (a second derivative)
    model.train()
    model.forward_levels(slab_batch(2, seed=5))["atom_vector"].square().sum().backward()
    for block in model.angular:
        assert block.mix[1].weight.grad.abs().max() > 0
        if directional:
            assert block.edge_mlp[0].weight.grad.abs().max() > 0


def test_settings_are_checked_counted_and_kept():
    from graphormer.training.pretrained import architecture

    with pytest.raises(ValueError, match="set model.distance_messages=true as well"):
        GraphormerConfig(channels="3d", angular_messages=2)
    with pytest.raises(ValueError, match="model.angular_messages"):
        GraphormerConfig(channels="3d", distance_messages=True, angular_messages=-1)
    with pytest.raises(ValueError, match="model.angular_messages"):
        GraphormerConfig(channels="3d", distance_messages=True, angular_messages=1.5)
    with pytest.raises(ValueError, match="set model.angular_messages to 1 or more as well"):
        GraphormerConfig(channels="3d", distance_messages=True, directional_messages=True)
    counts = {}
    for vectors, directional in ((False, False), (True, False), (True, True)):
        config = GraphormerConfig(
            num_layers=3,
            hidden_dim=16,
            ffn_dim=16,
            num_heads=2,
            channels="both",
            distance_messages=True,
            vector_messages=vectors,
            angular_messages=3,
            directional_messages=directional,
        )
        model = Graphormer(config)
        assert len(model.angular) == 3 and model.angular[0].degree == 3
        assert (model.angular[0].edge_mlp is not None) == directional
        actual = sum(p.numel() for p in model.parameters())
        assert config.estimated_parameters() == actual
        counts[vectors, directional] = (config.estimated_parameters(), actual)
    # the directional messages' parameters are counted exactly
    (estimate, actual), (estimate_with, actual_with) = counts[True, False], counts[True, True]
    assert estimate_with - estimate == actual_with - actual > 0
    assert Graphormer(GraphormerConfig(channels="3d", distance_messages=True)).angular is None
    assert architecture({"angular_messages": 2, "dropout": 0.1}) == {"angular_messages": 2}
    assert architecture({"directional_messages": True}) == {"directional_messages": True}
    # a 2D step of a model of bonds and positions gives the blocks a zero gradient, not none
    model = model.double().train()
    model.config.channel_probs = [1.0, 0.0, 0.0]
    model(float64_batch(positioned_graphs())).sum().backward()
    for weight in (model.angular[0].mix[0].weight, model.angular[0].edge_mlp[0].weight):
        assert torch.equal(weight.grad, torch.zeros_like(weight))


def test_a_run_with_angular_messages_keeps_the_setting_and_predicts(tmp_path):
    pytest.importorskip("ase")
    assert_run_keeps_setting(tmp_path, "angular_messages", 2, "model.distance_messages=true")


def test_a_run_with_directional_messages_keeps_the_setting_and_predicts(tmp_path):
    pytest.importorskip("ase")
    assert_run_keeps_setting(
        tmp_path,
        "directional_messages",
        True,
        "model.distance_messages=true",
        "model.angular_messages=2",
    )
