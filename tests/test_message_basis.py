"""model.message_basis: the distance messages' filters read the distance encoding's learned
kernels, or SchNet's fixed Gaussian grid. The grid's values, what the message blocks receive
(padded and packed), that the attention bias keeps its kernels, invariance and gradient forces
through the grid, the settings' checks, and a run of the commands."""

import math

import pytest
import torch

from graphormer.models import Graphormer, GraphormerConfig, gaussian_grid

from helpers import (
    assert_forces_are_energy_gradients,
    assert_run_keeps_setting,
    float64_batch,
    positioned_graphs,
    proper_rotation,
    rotated_levels,
    slab_batch,
    slab_gradient_settings,
    small_3d_model,
)


def _model(dtype=torch.float64, **settings) -> Graphormer:
    values = {"distance_messages": True, "message_cutoff": 3.0, "message_basis": "grid"}
    return small_3d_model(dtype, **{**values, **settings})


def test_the_grid_spaces_unit_gaussians_from_zero_to_the_cutoff():
    d = torch.tensor([0.0, 0.5, 1.25, 5.0], dtype=torch.float64)
    grid = gaussian_grid(d, 5.0, 5)  # centres 0, 1.25, 2.5, 3.75, 5; width 1.25
    assert grid.shape == (4, 5) and grid.dtype == torch.float64
    centres = torch.tensor([0.0, 1.25, 2.5, 3.75, 5.0], dtype=torch.float64)
    expected = torch.exp(-0.5 * ((d[:, None] - centres) / 1.25) ** 2)
    torch.testing.assert_close(grid, expected, rtol=0, atol=1e-15)
    assert float(grid[0, 0]) == 1.0 and float(grid[3, 4]) == 1.0  # peak 1 at each end
    assert math.isclose(float(grid[2, 0]), math.exp(-0.5), rel_tol=1e-12)  # one width away
    assert int(grid[1].argmax()) == 0 and int(grid[2].argmax()) == 1
    # its slope and curvature in the distance (gradient forces and their training)
    inside = torch.tensor([0.3, 1.7, 4.2], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: gaussian_grid(x, 5.0, 5), (inside,))
    assert torch.autograd.gradgradcheck(lambda x: gaussian_grid(x, 5.0, 5), (inside,))
    with pytest.raises(ValueError, match="at least 2 centres"):
        gaussian_grid(d, 5.0, 1)


@pytest.mark.parametrize("packed", [True, False])
@torch.no_grad()
def test_the_message_blocks_read_the_grid_of_each_pairs_distance(packed):
    model = _model()
    smiles = ["CC(=O)Nc1ccc(OCC)cc1", "C", "CO"] if packed else ["CCOc1ccccc1", "CCOc1ccccc1C"]
    batch = float64_batch(positioned_graphs(smiles=smiles))
    seen = {}

    def spy(module, args):
        seen["rows"], seen["target"], seen["source"], seen["psi"] = args[:4]

    model.messages[0].register_forward_pre_hook(spy)
    model(batch)
    # each pair's padded rows, whether the batch ran padded or packed
    length = batch.pos.size(1) + 1
    target, source = seen["target"], seen["source"]
    if packed:
        real = torch.nn.functional.pad(batch.node_mask, (1, 0), value=True).reshape(-1)
        tokens = real.nonzero().squeeze(1)
        assert seen["rows"].size(0) == tokens.numel() < batch.pos.size(0) * length
        target, source = tokens[target], tokens[source]
    else:
        assert seen["rows"].size(0) == batch.pos.size(0) * length
    graph, i, j = target // length, target % length - 1, source % length - 1
    distance = (batch.pos[graph, i] - batch.pos[graph, j]).norm(dim=-1)
    assert target.numel() > 10 and bool((distance < 3.0).all())
    torch.testing.assert_close(seen["psi"], gaussian_grid(distance, 3.0, 8), rtol=0, atol=1e-9)


@torch.no_grad()
def test_the_basis_changes_the_messages_only_and_keeps_energies_invariant():
    model = _model(atom_vector_tasks=1)
    kernels = _model(atom_vector_tasks=1, message_basis="kernels")
    kernels.load_state_dict(model.state_dict())  # the same tensors: no parameter changes
    batch = float64_batch(positioned_graphs())
    # the attention bias reads the learned kernels either way; the states differ
    (h, _, bias, _), (h_kernels, _, bias_kernels, _) = model._encode(batch), kernels._encode(batch)
    torch.testing.assert_close(bias, bias_kernels, rtol=0, atol=0)
    assert not torch.allclose(h, h_kernels, atol=1e-4)
    shift = torch.tensor([2.0, -4.0, 1.0], dtype=torch.float64)
    rotated_levels(model, proper_rotation(2), shift)


@pytest.mark.parametrize("vectors", [False, True])
def test_gradient_forces_differentiate_through_the_grid(vectors):
    pytest.importorskip("ase")
    model = _model(**slab_gradient_settings(), vector_messages=vectors)
    assert_forces_are_energy_gradients(model, slab_batch(2, seed=7))
    # and a loss on the forces reaches the messages' filters (a second derivative)
    model.train()
    model.forward_levels(slab_batch(2, seed=7))["atom_vector"].square().sum().backward()
    assert model.messages[0].filter[0].weight.grad.abs().max() > 0


def test_settings_are_checked_and_the_parameter_count_does_not_change():
    with pytest.raises(ValueError, match="model.message_basis='schnet' is not allowed"):
        GraphormerConfig(channels="3d", distance_messages=True, message_basis="schnet")
    with pytest.raises(ValueError, match="set model.distance_messages=true as well"):
        GraphormerConfig(channels="3d", message_basis="grid")
    with pytest.raises(ValueError, match="set model.num_kernels at least 2"):
        GraphormerConfig(channels="3d", distance_messages=True, message_basis="grid", num_kernels=1)
    values = dict(num_layers=2, hidden_dim=16, ffn_dim=16, num_heads=2, channels="3d")
    grid = GraphormerConfig(**values, distance_messages=True, message_basis="grid")
    kernels = GraphormerConfig(**values, distance_messages=True)
    assert kernels.message_basis == "kernels"  # the default: checkpoints without the key
    counts = [sum(p.numel() for p in Graphormer(c).parameters()) for c in (grid, kernels)]
    assert counts[0] == counts[1]


def test_fine_tuning_takes_the_basis_with_the_architecture():
    from graphormer.training.pretrained import architecture

    stored = {"distance_messages": True, "message_basis": "grid", "dropout": 0.1}
    assert architecture(stored) == {"distance_messages": True, "message_basis": "grid"}


def test_train_and_predict_with_the_grid(tmp_path):
    pytest.importorskip("ase")
    assert_run_keeps_setting(tmp_path, "message_basis", "grid", "model.distance_messages=true")
