"""model.angle_cutoff: each atom's input adds a smooth histogram of the angles between pairs of
its neighbours (a three-body term, as ANI's angular symmetry functions). The sum against a
triplet-by-triplet reference, the pairs of neighbours, invariance (the angle histogram of a
reflected structure too), smoothness at the cutoff, periodic wrapping, gradient forces through
the angles, the settings' checks, and a training run that keeps the setting."""

import math

import pytest
import torch

from graphormer.models import AngularCentrality, Graphormer, GraphormerConfig
from graphormer.models.geometry import GaussianDistanceEncoding, neighbour_pairs

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


def _model(**settings) -> Graphormer:
    return small_3d_model(**{"angle_cutoff": 3.0, **settings})


def test_neighbour_pairs_are_every_unordered_pair_within_each_centre():
    centre = torch.tensor([0, 0, 0, 2, 3, 3, 5, 5, 5, 5])
    first, second = neighbour_pairs(centre, 7)
    found = sorted(zip(first.tolist(), second.tolist(), strict=True))
    expected = sorted(
        (a, b)
        for a in range(len(centre))
        for b in range(a + 1, len(centre))
        if centre[a] == centre[b]
    )
    assert found == expected and len(found) == 3 + 0 + 1 + 6
    empty = neighbour_pairs(torch.zeros(0, dtype=torch.long), 3)
    assert empty[0].numel() == 0 and empty[1].numel() == 0


@torch.no_grad()
def test_the_angle_histogram_sums_each_pair_of_neighbours_angle_legs_and_elements():
    torch.manual_seed(0)
    encoding = GaussianDistanceEncoding(2, 6, 5, 4).double()
    angles = AngularCentrality(6, 5, cutoff=2.5).double()
    pos = torch.tensor(
        [[[0.0, 0, 0], [1.2, 0, 0], [0, 2.0, 0], [0.3, 0.4, 1.1], [4.0, 0, 0], [0, 0, 0]]]
    ).double()
    atom_type = torch.tensor([[1, 2, 3, 2, 1, 0]])  # the last atom is padding
    mask = atom_type > 0
    pairs = encoding.encode(pos, atom_type, mask)[3]
    atoms = angles(pairs, atom_type, mask)

    def grid(x, top, count):
        centres = torch.linspace(0, top, count, dtype=torch.float64)
        return torch.exp(-0.5 * ((x - centres) / (top / (count - 1))) ** 2)

    def switch(d):
        return 0.5 * (math.cos(math.pi * d / 2.5) + 1) if d < 2.5 else 0.0

    expected = torch.zeros(6, 16 * 4 * 8, dtype=torch.float64)
    real = range(5)
    for i in real:
        for j in real:
            for k in real:
                if len({i, j, k}) < 3 or k <= j:
                    continue
                rij, rik = pos[0, j] - pos[0, i], pos[0, k] - pos[0, i]
                dij, dik = float(rij.norm()), float(rik.norm())
                weight = switch(dij) * switch(dik)
                if weight == 0:
                    continue
                cos = float(rij @ rik) / (dij * dik)
                shape = torch.outer(grid(cos + 1, 2.0, 16), grid((dij + dik) / 2, 2.5, 4))
                species = (
                    angles.elements.weight[atom_type[0, j]]
                    * angles.elements.weight[atom_type[0, k]]
                )
                expected[i] += weight * torch.outer(shape.flatten(), species).flatten()
    reference = angles.out(expected) * mask[0].unsqueeze(-1)
    torch.testing.assert_close(atoms[0], reference, rtol=1e-9, atol=1e-12)
    # atom 4 has no neighbour within 2.5 A: no angle, its sum is zero
    torch.testing.assert_close(atoms[0, 4], angles.out.bias, rtol=0, atol=1e-15)
    assert not torch.allclose(atoms[0, 0], angles.out.bias)


@torch.no_grad()
def test_the_angles_change_the_function_and_keep_it_invariant():
    plain = small_3d_model(atom_vector_tasks=1)
    model = _model(atom_vector_tasks=1)
    graphs = positioned_graphs()
    batch = float64_batch(graphs)
    assert not torch.allclose(model(batch), plain(batch), atol=1e-4)
    rotated_levels(model, proper_rotation(5), torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64))
    assert_reflection_and_order_invariant(model)


@torch.no_grad()
def test_a_neighbour_crossing_the_angle_cutoff_changes_the_energy_smoothly():
    torch.manual_seed(0)
    encoding = GaussianDistanceEncoding(2, 6, 5, 4).double()
    angles = AngularCentrality(6, 5, cutoff=3.0).double()
    atom_type = torch.tensor([[1, 2, 3]])
    mask = atom_type > 0
    outputs = []
    for gap in (2.999, 3.0, 3.001):  # the third atom leaves the first atom's cutoff
        pos = torch.tensor([[[0.0, 0, 0], [1.0, 0, 0], [0.0, gap, 0]]], dtype=torch.float64)
        outputs.append(angles(encoding.encode(pos, atom_type, mask)[3], atom_type, mask)[0, 0])
    # the switch's slope is zero at the cutoff: a step of 1e-3 moves the sum by ~1e-6 of it
    torch.testing.assert_close(outputs[2], angles.out.bias, rtol=0, atol=0)
    change = (outputs[0] - outputs[1]).abs().max()
    assert 0 < change < 1e-5 * angles.out.weight.abs().sum(1).max()
    model = _model()
    (trio,) = positioned_graphs(smiles=["O.O.O"])
    trio.pos = torch.tensor([[0.0, 0, 0], [1.0, 0, 0], [0, 0, 0]], dtype=torch.float64)
    # within the cutoff the angle itself moves the energy, beyond what the distances do
    trio.pos[2] = torch.tensor([0.0, 1.0, 0.0]).double()
    square = float(model(float64_batch([trio])))
    trio.pos[2] = torch.tensor([-1.0, 0.0, 0.0]).double()
    straight = float(model(float64_batch([trio])))
    without = small_3d_model()
    without.load_state_dict(model.state_dict(), strict=False)
    trio.pos[2] = torch.tensor([0.0, 1.0, 0.0]).double()
    square_without = float(without(float64_batch([trio])))
    trio.pos[2] = torch.tensor([-1.0, 0.0, 0.0]).double()
    straight_without = float(without(float64_batch([trio])))
    assert abs((square - straight) - (square_without - straight_without)) > 1e-4


@torch.no_grad()
def test_periodic_wrapping_keeps_the_energy():
    pytest.importorskip("ase")
    atoms, placements = copper_placements(seed=1, outside=4, fraction=0.2, axis=1)
    model = _model(atom_feature_dims=[119], bond_feature_dims=[1], cutoff=3.0)
    assert_placements_agree(model, atoms, placements)


def test_gradient_forces_differentiate_through_the_angles():
    pytest.importorskip("ase")
    model = _model(**{**slab_gradient_settings(), "angle_cutoff": 3.5})
    assert_forces_are_energy_gradients(model, slab_batch(2, seed=3))
    # and a loss on the forces trains the element vectors through the angles (a second
    # derivative)
    model.train()
    model.forward_levels(slab_batch(2, seed=3))["atom_vector"].square().sum().backward()
    assert model.angles.elements.weight.grad.abs().max() > 0
    assert model.angles.out.weight.grad.abs().max() > 0


def test_settings_are_checked_counted_and_kept():
    from graphormer.training.pretrained import architecture

    with pytest.raises(ValueError, match="model.angle_cutoff=0 is not allowed"):
        GraphormerConfig(channels="3d", angle_cutoff=0)
    with pytest.raises(ValueError, match="model.angle_cutoff=3.0 shapes the 3D centrality"):
        GraphormerConfig(angle_cutoff=3.0)
    with pytest.raises(ValueError, match="set model.angle_cutoff at most model.cutoff"):
        GraphormerConfig(channels="3d", cutoff=3.0, angle_cutoff=4.0)
    config = GraphormerConfig(
        num_layers=2, hidden_dim=16, ffn_dim=16, num_heads=2, channels="both", angle_cutoff=3
    )
    assert config.angle_cutoff == 3.0 and isinstance(config.angle_cutoff, float)
    model = Graphormer(config)
    actual = sum(p.numel() for p in model.parameters())
    assert config.estimated_parameters() == actual
    assert Graphormer(GraphormerConfig(channels="3d")).angles is None
    assert architecture({"angle_cutoff": 3.0, "dropout": 0.1}) == {"angle_cutoff": 3.0}
    # a 2D step of a model of bonds and positions gives the angles a zero gradient, not none
    model.train()
    batch = float64_batch(positioned_graphs())
    model = model.double()
    model.config.channel_probs = [1.0, 0.0, 0.0]
    model(batch).sum().backward()
    assert torch.equal(model.angles.out.weight.grad, torch.zeros_like(model.angles.out.weight))


def test_a_run_with_angles_keeps_the_setting_and_predicts(tmp_path):
    pytest.importorskip("ase")
    assert_run_keeps_setting(tmp_path, "angle_cutoff", 3.5)
