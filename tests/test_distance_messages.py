"""model.distance_messages: SchNet-style messages through continuous distance filters before
each layer. The block against a pair-by-pair reference, the cosine switch, invariance and
equivariance, padded and packed batches, periodic images, gradient forces through the messages,
the settings' checks, and a run of the commands."""

import math

import pytest
import torch

from graphormer.models import DistanceMessages, Graphormer, GraphormerConfig, cosine_switch

from helpers import (
    assert_forces_are_energy_gradients,
    assert_placements_agree,
    assert_predicts_energies,
    copper_placements,
    emt_run,
    float64_batch,
    periodic_batch,
    periodic_graph,
    positioned_graphs,
    proper_rotation,
    rotated_levels,
    slab_batch,
    slab_gradient_settings,
    small_3d_model,
)


def _model(dtype=torch.float64, **settings) -> Graphormer:
    return small_3d_model(dtype, **{"distance_messages": True, "message_cutoff": 3.0, **settings})


def test_the_cosine_switch_is_one_at_zero_and_fades_smoothly_to_zero_at_the_cutoff():
    d = torch.tensor([0.0, 1.0, 2.0, 3.999999, 4.0, 7.0], dtype=torch.float64, requires_grad=True)
    c = cosine_switch(d, 4.0)
    expected = [1.0, 0.5 * (math.cos(math.pi / 4) + 1), 0.5, 0.0, 0.0, 0.0]
    torch.testing.assert_close(c, torch.tensor(expected, dtype=torch.float64), atol=1e-10, rtol=0)
    (slope,) = torch.autograd.grad(c.sum(), d)
    assert abs(float(slope[0])) < 1e-12 and abs(float(slope[3])) < 1e-5  # flat at both ends
    assert float(slope[2]) < -0.3 and (slope[4:] == 0).all()


def test_the_block_sums_filtered_neighbour_states_pair_by_pair():
    torch.manual_seed(0)
    block = DistanceMessages(num_kernels=5, hidden_dim=8).double()
    h = torch.randn(6, 8, dtype=torch.float64)
    target = torch.tensor([0, 0, 1, 3, 3, 3])
    source = torch.tensor([1, 2, 0, 4, 5, 0])
    psi = torch.rand(6, 5, dtype=torch.float64)
    switch = torch.tensor([1.0, 0.5, 0.2, 0.0, 0.9, 1.0], dtype=torch.float64)
    out = block(h, target, source, psi, switch)
    x = block.inp(block.norm(h))
    summed = torch.zeros_like(x)
    for t, s, k, c in zip(target.tolist(), source.tolist(), psi, switch, strict=True):
        summed[t] += c * block.filter(k) * x[s]
    torch.testing.assert_close(out, h + block.out(summed))
    # a pair whose switch is zero (at or beyond the cutoff) passes nothing
    moved = h.clone()
    moved[4] += 1.0  # atom 4 reaches atom 3 through a zero switch only
    torch.testing.assert_close(block(moved, target, source, psi, switch)[3], out[3])


@torch.no_grad()
def test_messages_keep_energies_invariant_and_vectors_equivariant():
    model = _model(atom_vector_tasks=1)
    graphs = positioned_graphs()
    shift = torch.tensor([2.0, -4.0, 1.0], dtype=torch.float64)
    before = rotated_levels(model, proper_rotation(1), shift)
    # the messages are part of the function: without them the energies differ
    plain = _model(atom_vector_tasks=1, distance_messages=False)
    plain.load_state_dict(model.state_dict(), strict=False)
    assert not torch.allclose(plain(float64_batch(graphs)), before["molecule"], atol=1e-4)


@torch.no_grad()
def test_a_molecule_alone_equals_the_same_in_a_padded_or_packed_batch():
    model = _model(torch.float32)
    graphs = positioned_graphs(smiles=["CC(=O)Nc1ccc(OCC)cc1", "C", "O", "N", "CO", "CC"])
    together = model(float64_batch(graphs, torch.float32))  # mostly padding: packed
    similar = positioned_graphs(smiles=["CC(=O)Nc1ccc(OCC)cc1", "CC(=O)Nc1ccc(OC)cc1"])
    padded = model(float64_batch(similar, torch.float32))  # little padding: not packed
    for i, g in enumerate(graphs[:1] + graphs[4:]):
        alone = model(float64_batch([g], torch.float32))
        index = 0 if i == 0 else i + 3
        torch.testing.assert_close(alone[0], together[index], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(
        model(float64_batch(similar[1:], torch.float32))[0], padded[1], atol=1e-4, rtol=1e-4
    )


def _expected_pairs(batch, cutoff: float) -> set[tuple[int, int]]:
    """The padded rows ``(b * (N+1) + 1 + i, b * (N+1) + 1 + j)`` of every pair of distinct
    real atoms closer than ``cutoff``, from the positions."""
    length = batch.pos.size(1) + 1
    found = set()
    for b in range(batch.pos.size(0)):
        real = int(batch.node_mask[b].sum())
        d = torch.cdist(batch.pos[b, :real], batch.pos[b, :real])
        for i, j in zip(*torch.nonzero(d < cutoff).T.tolist(), strict=True):
            if i != j:
                found.add((b * length + 1 + i, b * length + 1 + j))
    return found


@pytest.mark.parametrize("packed", [True, False])
@torch.no_grad()
def test_each_message_goes_between_the_rows_of_the_two_atoms(packed):
    model = _model()
    smiles = ["CC(=O)Nc1ccc(OCC)cc1", "C", "CO"] if packed else ["CCOc1ccccc1", "CCOc1ccccc1C"]
    batch = float64_batch(positioned_graphs(smiles=smiles))
    seen = {}

    def spy(module, args):
        seen["rows"], seen["target"], seen["source"] = args[0].size(0), args[1], args[2]

    model.messages[0].register_forward_pre_hook(spy)
    model(batch)
    length = batch.pos.size(1) + 1
    expected = _expected_pairs(batch, 3.0)
    assert len(expected) > 10
    target, source = seen["target"].tolist(), seen["source"].tolist()
    if packed:
        real = torch.nn.functional.pad(batch.node_mask, (1, 0), value=True).reshape(-1)
        tokens = real.nonzero().squeeze(1).tolist()  # each packed row's padded row
        assert seen["rows"] == len(tokens) < batch.pos.size(0) * length
        target, source = [tokens[t] for t in target], [tokens[s] for s in source]
    else:
        assert seen["rows"] == batch.pos.size(0) * length
    assert set(zip(target, source, strict=True)) == expected
    assert len(target) == len(expected)  # each pair once


def test_settings_are_checked_and_the_parameter_estimate_counts_the_blocks():
    with pytest.raises(ValueError, match="set model.channels=3d or both"):
        GraphormerConfig(distance_messages=True)
    with pytest.raises(ValueError, match="model.message_cutoff=0 is not allowed"):
        GraphormerConfig(channels="3d", distance_messages=True, message_cutoff=0)
    with pytest.raises(ValueError, match="model.distance_messages='yes' is not allowed"):
        GraphormerConfig(channels="3d", distance_messages="yes")
    with pytest.raises(ValueError, match="model.message_cutoff=nan is not allowed"):
        GraphormerConfig(channels="3d", distance_messages=True, message_cutoff=float("nan"))
    with pytest.raises(ValueError, match="set model.message_cutoff at most model.cutoff"):
        GraphormerConfig(channels="3d", distance_messages=True, cutoff=4.0, message_cutoff=5.0)
    config = GraphormerConfig(num_layers=3, hidden_dim=16, ffn_dim=16, num_heads=2)
    config.channels, config.distance_messages = "both", True
    config.__post_init__()
    model = Graphormer(config)
    assert len(model.messages) == 3
    actual = sum(p.numel() for p in model.parameters())
    assert config.estimated_parameters() == actual
    assert Graphormer(GraphormerConfig(channels="3d")).messages is None


def test_fine_tuning_takes_the_messages_with_the_architecture():
    from graphormer.training.pretrained import architecture

    stored = {"num_layers": 2, "distance_messages": True, "message_cutoff": 4.0, "dropout": 0.1}
    expected = {"num_layers": 2, "distance_messages": True, "message_cutoff": 4.0}
    assert architecture(stored) == expected


def test_a_2d_training_batch_of_a_both_model_gives_the_messages_zero_gradients():
    model = _model(channels="both", channel_probs=[1.0, 0.0, 0.0]).train()
    model(float64_batch(positioned_graphs())).sum().backward()
    grads = [p.grad for p in model.messages.parameters()]
    assert all(g is not None and g.abs().max() == 0 for g in grads)


@torch.no_grad()
def test_periodic_images_hold_their_sources_state_and_wrapping_keeps_the_energy():
    pytest.importorskip("ase")
    atoms, placements = copper_placements(seed=0, outside=5, fraction=0.15, axis=0)
    model = _model(atom_feature_dims=[119], bond_feature_dims=[1], cutoff=3.0)
    graph = periodic_graph(atoms, placements[0], 3.0)
    n = len(atoms)
    h = model.encode(periodic_batch([graph]))[0][0, 1:]
    torch.testing.assert_close(h[n:], h[graph.image_of[n:]])
    # which copy of an atom lies in the cell changes nothing: images are their sources
    assert_placements_agree(model, atoms, placements)


def test_gradient_forces_differentiate_through_the_messages():
    pytest.importorskip("ase")
    import dataclasses

    model = _model(**slab_gradient_settings())
    batch = slab_batch(2, seed=7)

    assert_forces_are_energy_gradients(model, batch)
    # and a loss on the forces reaches the messages' filters (a second derivative)
    model.train()
    model.forward_levels(dataclasses.replace(batch))["atom_vector"].square().sum().backward()
    assert model.messages[0].filter[0].weight.grad.abs().max() > 0


def test_train_and_predict_with_distance_messages(tmp_path):
    pytest.importorskip("ase")
    extra = ("model.distance_messages=true", "model.message_cutoff=4.5", "trainer.max_epochs=2")
    path, run, _, metrics = emt_run(tmp_path, *extra)
    state = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert "model.messages.0.filter.0.weight" in state["state_dict"]
    assert_predicts_energies(tmp_path, metrics["best_checkpoint"], path, 24)
