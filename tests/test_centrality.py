"""model.centrality_cutoff, model.centrality_gates and model.centrality_basis: the 3D centrality
summed over near pairs only (faded smoothly), each pair's kernels gated by its pair of atom types,
and a fixed Gaussian grid summed in place of the learned kernels. The sum against a pair-by-pair
reference, the gates' start at ones, invariance, periodic wrapping, smoothness at the cutoff,
gradient forces through the grid, and the settings' checks."""

import math

import pytest
import torch

from graphormer.models import GaussianDistanceEncoding, Graphormer, GraphormerConfig

from helpers import (
    assert_forces_are_energy_gradients,
    assert_placements_agree,
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
    return small_3d_model(**{"centrality_cutoff": 3.0, "centrality_gates": True, **settings})


@torch.no_grad()
def test_the_centrality_sums_gated_kernels_of_the_pairs_within_the_cutoff_pair_by_pair():
    torch.manual_seed(0)
    encoding = GaussianDistanceEncoding(2, 6, 5, 4, centrality_cutoff=2.5, centrality_gates=True)
    encoding = encoding.double()
    with torch.no_grad():
        encoding.gates.weight.normal_()
    pos = torch.tensor([[[0.0, 0, 0], [1.2, 0, 0], [0, 2.0, 0], [4.0, 0, 0], [0, 0, 0]]]).double()
    atom_type = torch.tensor([[1, 2, 3, 1, 0]])  # the last atom is padding
    mask = atom_type > 0
    _, atoms, _, (batch, i, j, psi, distance, _) = encoding.encode(pos, atom_type, mask)
    expected = torch.zeros(5, 4, dtype=torch.float64)
    for p in range(len(i)):
        a, b = int(i[p]), int(j[p])
        d = float(distance[p])  # the encoding's own (a tiny epsilon keeps 0 differentiable)
        assert abs(float((pos[0, a] - pos[0, b]).norm()) - d) < 1e-5
        if d < 2.5:  # the atom with itself included: distance 0, switch 1
            gate = encoding.gates.weight[int(atom_type[0, a]) * 5 + int(atom_type[0, b])]
            expected[a] += psi[p] * gate * (0.5 * (math.cos(math.pi * d / 2.5) + 1))
    reference = encoding.centrality(expected) * mask[0].unsqueeze(-1)
    torch.testing.assert_close(atoms[0], reference, rtol=1e-12, atol=1e-12)
    # atom 3 sits 2.8 A and more from every other atom: its sum is its own kernels alone
    own = encoding.gates.weight[1 * 5 + 1] * psi[(i == 3) & (j == 3)][0]
    torch.testing.assert_close(atoms[0, 3], encoding.centrality(own), rtol=1e-12, atol=1e-12)


@torch.no_grad()
def test_gates_start_at_ones_and_each_option_changes_the_function():
    graphs = positioned_graphs()
    plain = _model(centrality_cutoff=None, centrality_gates=False)
    fresh = Graphormer(GraphormerConfig(**{**plain.config.to_dict(), "centrality_gates": True}))
    fresh = fresh.double().eval()
    assert torch.equal(fresh.geometry.gates.weight, torch.ones_like(fresh.geometry.gates.weight))
    fresh.load_state_dict(plain.state_dict(), strict=False)  # all but the gates
    batch = float64_batch(graphs)
    torch.testing.assert_close(fresh(batch), plain(batch), rtol=1e-12, atol=1e-12)
    # the cutoff and the gates each change the function
    far = _model(centrality_cutoff=None, centrality_gates=True)
    near = _model(centrality_cutoff=2.0, centrality_gates=True)
    near.load_state_dict(far.state_dict())
    assert not torch.allclose(near(batch), far(batch), atol=1e-4)
    fresh.geometry.gates.weight.mul_(torch.rand_like(fresh.geometry.gates.weight) + 0.5)
    assert not torch.allclose(fresh(batch), plain(batch), atol=1e-4)


@torch.no_grad()
def test_energies_keep_invariant_and_an_atom_crossing_the_cutoff_changes_them_smoothly():
    model = _model(atom_vector_tasks=1)
    rotated_levels(model, proper_rotation(3), torch.tensor([1.5, -2.0, 0.5], dtype=torch.float64))
    # two atoms pulled apart through the 3 A cutoff: no jump at it
    (pair,) = positioned_graphs(smiles=["O.O"])
    energies = []
    for gap in (2.9999, 3.0, 3.0001):
        g = pair.clone()
        g.pos = pair.pos.clone()
        g.pos[1] = g.pos[0] + torch.tensor([gap, 0.0, 0.0]).double()  # two O atoms
        energies.append(float(model(float64_batch([g]))))
    assert abs(energies[0] - energies[1]) < 1e-5 and abs(energies[2] - energies[1]) < 1e-5


@pytest.mark.parametrize("basis", ["kernels", "grid"])
@torch.no_grad()
def test_periodic_wrapping_keeps_the_energy(basis):
    pytest.importorskip("ase")
    atoms, placements = copper_placements(seed=1, outside=4, fraction=0.2, axis=1)
    settings = dict(atom_feature_dims=[119], bond_feature_dims=[1], cutoff=3.0)
    model = _model(**settings, centrality_basis=basis)
    assert_placements_agree(model, atoms, placements)


def test_settings_are_checked_and_counted():
    with pytest.raises(ValueError, match="model.centrality_cutoff=0 is not allowed"):
        GraphormerConfig(channels="3d", centrality_cutoff=0)
    with pytest.raises(ValueError, match="model.centrality_cutoff=inf is not allowed"):
        GraphormerConfig(channels="3d", centrality_cutoff=float("inf"))
    with pytest.raises(ValueError, match="model.centrality_gates='yes' is not allowed"):
        GraphormerConfig(channels="3d", centrality_gates="yes")
    with pytest.raises(ValueError, match="set model.centrality_cutoff at most model.cutoff"):
        GraphormerConfig(channels="3d", cutoff=4.0, centrality_cutoff=5.0)
    for key, value in (("centrality_cutoff", 5.0), ("centrality_gates", True)):
        with pytest.raises(ValueError, match=f"model.{key}=.*set model.channels=3d or both"):
            GraphormerConfig(**{key: value})
    config = GraphormerConfig(num_layers=2, hidden_dim=16, ffn_dim=16, num_heads=2)
    config.channels, config.centrality_gates, config.centrality_cutoff = "both", True, 4
    config.__post_init__()
    assert config.centrality_cutoff == 4.0 and isinstance(config.centrality_cutoff, float)
    model = Graphormer(config)
    actual = sum(p.numel() for p in model.parameters())
    assert model.geometry.gates.weight.numel() > 0.1 * actual
    assert config.estimated_parameters() == actual
    assert Graphormer(GraphormerConfig(channels="3d")).geometry.gates is None


def test_fine_tuning_takes_the_centrality_with_the_architecture():
    from graphormer.training.pretrained import architecture

    stored = {"num_layers": 2, "centrality_cutoff": 5.0, "centrality_gates": True, "dropout": 0.1}
    assert architecture(stored) == {
        "num_layers": 2,
        "centrality_cutoff": 5.0,
        "centrality_gates": True,
    }


@torch.no_grad()
def test_the_grid_centrality_sums_the_fixed_grid_of_the_pairs_within_the_cutoff():
    torch.manual_seed(0)
    settings = dict(centrality_cutoff=2.5, centrality_gates=True)
    encoding = GaussianDistanceEncoding(2, 6, 5, 4, **settings, centrality_basis="grid").double()
    with torch.no_grad():
        encoding.gates.weight.normal_()
    kernels = GaussianDistanceEncoding(2, 6, 5, 4, **settings).double()
    kernels.load_state_dict(encoding.state_dict())
    pos = torch.tensor([[[0.0, 0, 0], [1.2, 0, 0], [0, 2.0, 0], [4.0, 0, 0], [0, 0, 0]]]).double()
    atom_type = torch.tensor([[1, 2, 3, 1, 0]])  # the last atom is padding
    mask = atom_type > 0
    bias, atoms, _, (batch, i, j, psi, distance, _) = encoding.encode(pos, atom_type, mask)
    expected = torch.zeros(5, 4, dtype=torch.float64)
    for p in range(len(i)):
        a, b, d = int(i[p]), int(j[p]), float(distance[p])
        if d < 2.5:
            gate = encoding.gates.weight[int(atom_type[0, a]) * 5 + int(atom_type[0, b])]
            grid = torch.exp(
                -0.5 * ((d - torch.linspace(0, 2.5, 4, dtype=torch.float64)) / (2.5 / 3)) ** 2
            )
            expected[a] += grid * gate * (0.5 * (math.cos(math.pi * d / 2.5) + 1))
    reference = encoding.centrality(expected) * mask[0].unsqueeze(-1)
    torch.testing.assert_close(atoms[0], reference, rtol=1e-12, atol=1e-12)
    # the attention bias and the kernels handed on are the learned ones either way
    bias_k, atoms_k, _, pairs_k = kernels.encode(pos, atom_type, mask)
    torch.testing.assert_close(bias, bias_k, rtol=0, atol=0)
    torch.testing.assert_close(psi, pairs_k[3], rtol=0, atol=0)
    assert not torch.allclose(atoms, atoms_k, atol=1e-3)


@torch.no_grad()
def test_the_grid_centrality_keeps_energies_invariant_and_smooth_at_the_cutoff():
    model = _model(atom_vector_tasks=1, centrality_basis="grid")
    rotated_levels(model, proper_rotation(4), torch.tensor([0.5, 1.0, -3.0], dtype=torch.float64))
    (pair,) = positioned_graphs(smiles=["O.O"])
    energies = []
    for gap in (2.9999, 3.0, 3.0001):
        g = pair.clone()
        g.pos = pair.pos.clone()
        g.pos[1] = g.pos[0] + torch.tensor([gap, 0.0, 0.0]).double()
        energies.append(float(model(float64_batch([g]))))
    assert abs(energies[0] - energies[1]) < 1e-5 and abs(energies[2] - energies[1]) < 1e-5


def test_gradient_forces_differentiate_through_the_grid_centrality():
    pytest.importorskip("ase")
    settings = {**slab_gradient_settings(), "centrality_cutoff": 5.0, "centrality_gates": False}
    model = _model(**settings, centrality_basis="grid")
    assert_forces_are_energy_gradients(model, slab_batch(2, seed=3))
    # and a loss on the forces trains the centrality through the grid (a second derivative)
    model.train()
    model.forward_levels(slab_batch(2, seed=3))["atom_vector"].square().sum().backward()
    assert model.geometry.centrality.weight.grad.abs().max() > 0


def test_the_grid_centrality_settings_are_checked_and_kept():
    from graphormer.training.pretrained import architecture

    with pytest.raises(ValueError, match="model.centrality_basis='fixed' is not allowed"):
        GraphormerConfig(channels="3d", centrality_cutoff=5.0, centrality_basis="fixed")
    with pytest.raises(ValueError, match="set model.centrality_cutoff .Angstrom. as well"):
        GraphormerConfig(channels="3d", centrality_basis="grid")
    with pytest.raises(ValueError, match="set model.num_kernels at least 2"):
        GraphormerConfig(
            channels="3d", centrality_cutoff=5.0, centrality_basis="grid", num_kernels=1
        )
    with pytest.raises(ValueError, match="give the cutoff"):
        GaussianDistanceEncoding(2, 6, 5, 4, centrality_basis="grid")
    with pytest.raises(ValueError, match="at least 2 kernels"):
        GaussianDistanceEncoding(2, 6, 5, 1, centrality_cutoff=3.0, centrality_basis="grid")
    assert GraphormerConfig(channels="3d").centrality_basis == "kernels"  # keys absent: as before
    stored = {"centrality_cutoff": 5.0, "centrality_basis": "grid", "dropout": 0.1}
    assert architecture(stored) == {"centrality_cutoff": 5.0, "centrality_basis": "grid"}


def test_train_and_predict_with_the_grid_centrality(tmp_path):
    pytest.importorskip("ase")
    assert_run_keeps_setting(tmp_path, "centrality_basis", "grid", "model.centrality_cutoff=4.0")
