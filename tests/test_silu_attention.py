"""model.attention_activation=silu: unnormalised attention weights (TorchMD-Net's), each the SiLU
of its score and bias, masked pairs at zero, faded to zero at model.cutoff in 3D. The module
against the formula, padded and packed batches, invariance, smoothness at the cutoff, gradient
forces, the settings' checks and a run of the commands."""

import math

import pytest
import torch
import torch.nn.functional as F

from graphormer.models import Graphormer, GraphormerConfig
from graphormer.models.attention import BiasedMultiheadAttention

from helpers import (
    assert_forces_are_energy_gradients,
    assert_reflection_and_order_invariant,
    assert_run_keeps_setting,
    energy_at,
    float64_batch,
    positioned_graphs,
    proper_rotation,
    rotated_levels,
    small_3d_model,
)


def _model(dtype=torch.float64, **settings) -> Graphormer:
    return small_3d_model(dtype, **{"attention_activation": "silu", **settings})


def test_the_weights_are_the_silu_of_each_score_times_the_gate_unnormalised():
    torch.manual_seed(0)
    attention = BiasedMultiheadAttention(12, 3, activation="silu").double()
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    bias = torch.randn(2, 3, 5, 5, dtype=torch.float64)
    gate = torch.rand(2, 1, 5, 5, dtype=torch.float64)
    padding = torch.tensor([[False] * 5, [False, False, False, True, True]])
    out, weights = attention(
        x,
        attn_bias=bias,
        key_padding_mask=padding,
        attn_gate=gate,
        need_weights=True,
        average_attn_weights=False,
    )
    q, k, v = attention.project(x)
    expected = F.silu(q @ k.transpose(-2, -1) / math.sqrt(4) + bias) * gate
    expected[1, :, :, 3:] = 0.0  # padded keys weigh nothing
    torch.testing.assert_close(weights, expected)
    mixed = (expected @ v).transpose(1, 2).reshape(2, 5, 12)
    torch.testing.assert_close(out, attention.out_proj(mixed))
    # not a softmax: a row's weights do not sum to one
    assert (weights.sum(-1) - 1).abs().max() > 0.1


def test_masked_keys_leave_the_gradient_finite_and_get_none_of_it():
    torch.manual_seed(0)
    attention = BiasedMultiheadAttention(8, 2, activation="silu")
    x = torch.randn(2, 4, 8, requires_grad=True)
    padding = torch.tensor([[False] * 4, [False, False, True, True]])
    out, _ = attention(x, key_padding_mask=padding)
    out[1, :2].sum().backward()
    assert torch.isfinite(x.grad).all()
    assert (x.grad[1, 2:] == 0).all()  # the padded atoms reach no real one


def test_softmax_modules_take_no_gate_and_silu_ones_have_no_torch_equivalent():
    x = torch.randn(1, 3, 8)
    with pytest.raises(ValueError, match="attn_gate"):
        BiasedMultiheadAttention(8, 2)(x, attn_gate=torch.ones(1, 1, 3, 3))
    with pytest.raises(ValueError, match="softmax"):
        BiasedMultiheadAttention(8, 2, activation="silu").to_torch()
    with pytest.raises(ValueError, match="activation='relu'"):
        BiasedMultiheadAttention(8, 2, activation="relu")
    with pytest.raises(ValueError, match="model.attention_activation='tanh'"):
        GraphormerConfig(attention_activation="tanh")


@torch.no_grad()
def test_energies_are_invariant_and_vectors_equivariant_and_differ_from_softmax():
    model = _model(atom_vector_tasks=1, cutoff=4.0)
    before = rotated_levels(model, proper_rotation(3), torch.tensor([1.0, 2.0, -3.0]).double())
    assert_reflection_and_order_invariant(model)
    softmax = _model(atom_vector_tasks=1, cutoff=4.0, attention_activation="softmax")
    softmax.load_state_dict(model.state_dict())
    after = softmax.forward_levels(float64_batch(positioned_graphs()))
    assert not torch.allclose(after["molecule"], before["molecule"], atol=1e-3)


@torch.no_grad()
def test_a_molecule_alone_equals_the_same_in_a_padded_or_packed_batch():
    model = _model(torch.float32, cutoff=4.0)
    graphs = positioned_graphs(smiles=["CC(=O)Nc1ccc(OCC)cc1", "C", "O", "N", "CO", "CC"])
    together = model(float64_batch(graphs, torch.float32))  # mostly padding: packed
    similar = positioned_graphs(smiles=["CC(=O)Nc1ccc(OCC)cc1", "CC(=O)Nc1ccc(OC)cc1"])
    padded = model(float64_batch(similar, torch.float32))  # little padding: not packed
    for index in (0, 4, 5):
        alone = model(float64_batch([graphs[index]], torch.float32))
        torch.testing.assert_close(alone[0], together[index], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(
        model(float64_batch(similar[1:], torch.float32))[0], padded[1], atol=1e-4, rtol=1e-4
    )


def _ion_across(cutoff: float, offsets):
    """A water oxygen and a sodium ion (no hydrogens) and, for each offset, positions with the
    ion ``cutoff`` plus that offset from the oxygen: the ion moving across the cutoff."""
    graph = positioned_graphs(smiles=["[Na+].O"])[0]
    batch = float64_batch([graph])
    sodium = int((graph.x[:, 0] == 10).nonzero())  # atomic number 11, zero-based 10
    positions = []
    for offset in offsets:
        pos = torch.zeros_like(batch.pos)
        pos[0, sodium, 0] = cutoff + offset
        positions.append(pos)
    return batch, positions


@torch.no_grad()
def test_the_weights_fade_to_zero_at_the_cutoff_so_the_energy_does_not_jump():
    """With softmax weights the cutoff is a mask: an atom crossing it changes the energy by a
    step. SiLU weights fade to zero there, so with the centrality faded too the energy is
    continuous (the change over 2e-6 A is of that order)."""
    cutoff = 4.0
    jumps = {}
    for activation in ("silu", "softmax"):
        model = _model(cutoff=cutoff, centrality_cutoff=cutoff, attention_activation=activation)
        batch, positions = _ion_across(cutoff, (-1e-6, 1e-6))
        inside, outside = (float(energy_at(model, batch, pos)[0]) for pos in positions)
        jumps[activation] = abs(inside - outside)
    assert jumps["silu"] < 1e-7
    assert jumps["softmax"] > 1e-4


def test_gradient_forces_are_the_energys_slope_through_the_faded_weights():
    model = _model(cutoff=4.0, atom_vector_tasks=1, forces="gradient")
    assert_forces_are_energy_gradients(model, float64_batch(positioned_graphs()), atom=1)


def test_a_2d_model_with_silu_weights_trains_and_differs_from_softmax():
    config = dict(num_layers=2, hidden_dim=16, ffn_dim=16, num_heads=2, dropout=0.0)
    torch.manual_seed(0)
    silu = Graphormer(GraphormerConfig(attention_activation="silu", **config))
    softmax = Graphormer(GraphormerConfig(**config))
    softmax.load_state_dict(silu.state_dict())
    batch = float64_batch(positioned_graphs(), torch.float32)
    out = silu(batch)
    assert not torch.allclose(out, softmax(batch), atol=1e-4)
    out.sum().backward()
    assert all(p.grad is not None for p in silu.layers[0].attn.parameters())


def test_a_run_with_silu_attention_keeps_the_setting_and_predicts(tmp_path):
    pytest.importorskip("ase")
    assert_run_keeps_setting(tmp_path, "attention_activation", "silu")
