"""model.vector_messages: distance messages that also carry vectors (PaiNN's equivariant
message and update). The block against a pair-by-pair reference, rotation of the vectors and
invariance of the states, angles reaching the states, padded and packed batches, periodic
images, gradient forces through the vectors, the settings' checks, and a run of the commands."""

import pytest
import torch

from graphormer.models import Graphormer, GraphormerConfig, VectorMessages

from helpers import (
    assert_forces_are_energy_gradients,
    assert_placements_agree,
    assert_predicts_energies,
    call_script,
    copper_placements,
    emt_run,
    float64_batch,
    periodic_batch,
    periodic_graph,
    positioned_graphs,
    proper_rotation,
    read_json,
    rotated_levels,
    slab_batch,
    slab_gradient_settings,
    small_3d_model,
)


def _model(dtype=torch.float64, **settings) -> Graphormer:
    values = {"distance_messages": True, "vector_messages": True, "message_cutoff": 3.0}
    return small_3d_model(dtype, **{**values, **settings})


def _pairs():
    torch.manual_seed(0)
    target = torch.tensor([0, 0, 1, 3, 3, 3, 2])
    source = torch.tensor([1, 2, 0, 4, 5, 0, 3])
    psi = torch.rand(7, 5, dtype=torch.float64)
    switch = torch.tensor([1.0, 0.5, 0.2, 0.0, 0.9, 1.0, 0.7], dtype=torch.float64)
    unit = torch.nn.functional.normalize(torch.randn(7, 3, dtype=torch.float64), dim=-1)
    return target, source, psi, switch, unit


def test_the_block_sums_messages_and_mixes_channels_as_written():
    torch.manual_seed(1)
    d = 8
    block = VectorMessages(num_kernels=5, hidden_dim=d).double()
    with torch.no_grad():
        for p in block.parameters():
            p.add_(0.3 * torch.randn_like(p))
    h = torch.randn(6, d, dtype=torch.float64)
    vectors = torch.randn(6, 3, d, dtype=torch.float64)
    target, source, psi, switch, unit = _pairs()
    out_h, out_v = block(h, vectors, target, source, psi, switch, unit)

    x = block.inp(block.norm(h))
    new_h, new_v = h.clone(), vectors.clone()
    for t, s, k, c, r in zip(target, source, psi, switch, unit, strict=True):
        a, b, g = (c * block.filter(k) * x[s]).split(d)
        new_h[t] += a
        new_v[t] += vectors[s] * b + r[:, None] * g[None, :]
    u = new_v @ block.mix.weight[:d].T  # [R, 3, d]
    v = new_v @ block.mix.weight[d:].T
    norm = (v.pow(2).sum(1) + 1e-8).sqrt()
    e, f, g = block.update(torch.cat([block.update_norm(new_h), norm], -1)).split(d, dim=-1)
    torch.testing.assert_close(out_h, new_h + f * (u * v).sum(1) + g)
    torch.testing.assert_close(out_v, new_v + e[:, None, :] * u)
    # no vectors in yet: zeros, and a lone atom (row 5 receives nothing) keeps no vector
    first_h, first_v = block(h, None, target, source, psi, switch, unit)
    zeros_h, zeros_v = block(h, torch.zeros_like(vectors), target, source, psi, switch, unit)
    torch.testing.assert_close(first_h, zeros_h)
    torch.testing.assert_close(first_v, zeros_v)
    assert first_v[5].abs().max() == 0 and first_v[0].abs().max() > 0


def test_the_block_rotates_vectors_and_keeps_states():
    torch.manual_seed(2)
    block = VectorMessages(num_kernels=5, hidden_dim=8).double()
    h = torch.randn(6, 8, dtype=torch.float64)
    vectors = torch.randn(6, 3, 8, dtype=torch.float64)
    target, source, psi, switch, unit = _pairs()
    rotation = proper_rotation(3)
    out_h, out_v = block(h, vectors, target, source, psi, switch, unit)
    turned_h, turned_v = block(
        h, rotation @ vectors, target, source, psi, switch, unit @ rotation.T
    )
    torch.testing.assert_close(turned_h, out_h)
    torch.testing.assert_close(turned_v, rotation @ out_v)
    # a reflection too: the vectors are polar, the states see only products and norms
    mirror = torch.diag(torch.tensor([1.0, -1.0, 1.0], dtype=torch.float64))
    mirrored = block(h, mirror @ vectors, target, source, psi, switch, unit @ mirror)
    torch.testing.assert_close(mirrored[0], out_h)
    torch.testing.assert_close(mirrored[1], mirror @ out_v)


@torch.no_grad()
def test_energies_stay_invariant_and_forces_rotate_with_the_molecule():
    model = _model(atom_vector_tasks=1)
    shift = torch.tensor([2.0, -4.0, 1.0], dtype=torch.float64)
    before = rotated_levels(model, proper_rotation(1), shift)
    # the forces are the vector head's plus the linear map of the final vectors
    batch = float64_batch(positioned_graphs())
    h, _, attn_bias, vectors = model._encode(batch)
    head = model.vector_head(h[:, 1:], batch.pos, attn_bias[:, :, 1:, 1:])
    mapped = model.vector_out(vectors[:, 1:]).transpose(-1, -2)
    mask = batch.atom_mask[..., None, None]
    torch.testing.assert_close(before["atom_vector"], (head + mapped) * mask)
    assert (mapped * mask).abs().max() > 1e-3


@torch.no_grad()
def test_the_vectors_pass_from_each_block_to_the_next_between_the_atoms_unit_vectors():
    model = _model()
    batch = float64_batch(positioned_graphs(smiles=["CCOc1ccccc1", "CCOc1ccccc1C"]))
    seen = []
    model.messages[1].register_forward_pre_hook(lambda module, args: seen.append(args))
    model(batch)
    (args,) = seen
    assert args[1] is not None and args[1].abs().max() > 1e-3  # the first block's vectors
    # each pair's unit vector points from its target atom to its source atom
    length = batch.pos.size(1) + 1
    target, source, unit = args[2], args[3], args[-1]
    flat = torch.nn.functional.pad(batch.pos, (0, 0, 1, 0)).reshape(-1, 3)  # padded rows
    gap = flat[source] - flat[target]
    assert len(target) > 10 and (target % length != 0).all()
    torch.testing.assert_close(unit, gap / gap.norm(dim=-1, keepdim=True))


@torch.no_grad()
def test_the_states_see_angles_that_distance_messages_alone_do_not():
    """Two arrangements of four atoms with the same distances from the centre to each
    neighbour: the first message block of scalar distance messages gives the centre the same
    state for both; the vector block's products of summed unit vectors tell them apart."""
    d, target, source = 8, torch.tensor([0, 0, 0]), torch.tensor([1, 2, 3])
    torch.manual_seed(4)
    psi = torch.rand(1, 5, dtype=torch.float64).expand(3, 5)  # one distance to each neighbour
    switch = torch.ones(3, dtype=torch.float64)
    block = VectorMessages(num_kernels=5, hidden_dim=d).double()
    with torch.no_grad():
        for p in block.parameters():
            p.add_(0.3 * torch.randn_like(p))
    h = torch.zeros(4, d, dtype=torch.float64)
    h[1:] = torch.randn(d, dtype=torch.float64)  # three identical neighbours
    planar = torch.tensor([[1.0, 0, 0], [-0.5, 0.866025, 0], [-0.5, -0.866025, 0]])
    bent = torch.tensor([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0]])
    states = [block(h, None, target, source, psi, switch, u.double())[0][0] for u in (planar, bent)]
    assert (states[0] - states[1]).abs().max() > 1e-3


@torch.no_grad()
def test_a_molecule_alone_equals_the_same_in_a_padded_or_packed_batch():
    model = _model(torch.float32, atom_vector_tasks=1)
    graphs = positioned_graphs(smiles=["CC(=O)Nc1ccc(OCC)cc1", "C", "O", "N", "CO", "CC"])
    together = model.forward_levels(float64_batch(graphs, torch.float32))  # packed
    similar = positioned_graphs(smiles=["CC(=O)Nc1ccc(OCC)cc1", "CC(=O)Nc1ccc(OC)cc1"])
    padded = model.forward_levels(float64_batch(similar, torch.float32))  # not packed
    for index in (0, 4, 5):
        alone = model.forward_levels(float64_batch(graphs[index : index + 1], torch.float32))
        n = graphs[index].num_nodes
        torch.testing.assert_close(
            alone["molecule"][0], together["molecule"][index], atol=1e-4, rtol=1e-4
        )
        torch.testing.assert_close(
            alone["atom_vector"][0, :n], together["atom_vector"][index, :n], atol=1e-4, rtol=1e-4
        )
    alone = model.forward_levels(float64_batch(similar[1:], torch.float32))
    torch.testing.assert_close(alone["molecule"][0], padded["molecule"][1], atol=1e-4, rtol=1e-4)
    n = similar[1].num_nodes
    torch.testing.assert_close(
        alone["atom_vector"][0, :n], padded["atom_vector"][1, :n], atol=1e-4, rtol=1e-4
    )


@torch.no_grad()
def test_periodic_images_hold_their_sources_vectors_and_wrapping_keeps_the_energy():
    pytest.importorskip("ase")
    atoms, placements = copper_placements(seed=0, outside=5, fraction=0.15, axis=0)
    model = _model(atom_feature_dims=[119], bond_feature_dims=[1], cutoff=3.0)
    graph = periodic_graph(atoms, placements[0], 3.0)
    n = len(atoms)
    vectors = model._encode(periodic_batch([graph]))[3][0, 1:]
    assert vectors[:n].abs().max() > 1e-3
    torch.testing.assert_close(vectors[n:], vectors[graph.image_of[n:]])
    assert_placements_agree(model, atoms, placements)


def test_gradient_forces_differentiate_through_the_vectors():
    pytest.importorskip("ase")
    import dataclasses

    model = _model(**slab_gradient_settings())
    assert model.vector_out is None  # the gradient gives the forces
    batch = slab_batch(2, seed=7)
    assert_forces_are_energy_gradients(model, batch)
    model.train()
    model.forward_levels(dataclasses.replace(batch))["atom_vector"].square().sum().backward()
    assert model.messages[0].mix.weight.grad.abs().max() > 0


def test_settings_are_checked_and_the_parameter_estimate_counts_the_blocks():
    with pytest.raises(ValueError, match="set model.distance_messages=true as well"):
        GraphormerConfig(channels="3d", vector_messages=True)
    with pytest.raises(ValueError, match="model.vector_messages='yes' is not allowed"):
        GraphormerConfig(channels="3d", distance_messages=True, vector_messages="yes")
    for tasks in (0, 1):
        config = GraphormerConfig(
            num_layers=3,
            hidden_dim=16,
            ffn_dim=16,
            num_heads=2,
            channels="3d",
            distance_messages=True,
            vector_messages=True,
            atom_vector_tasks=tasks,
        )
        model = Graphormer(config)
        assert len(model.messages) == 3 and isinstance(model.messages[0], VectorMessages)
        assert (model.vector_out is not None) == bool(tasks)
        actual = sum(p.numel() for p in model.parameters())
        assert config.estimated_parameters() == actual


def test_fine_tuning_takes_the_vectors_with_the_architecture():
    from graphormer.training.pretrained import architecture

    stored = {"distance_messages": True, "vector_messages": True, "dropout": 0.1}
    assert architecture(stored) == {"distance_messages": True, "vector_messages": True}


def test_a_2d_training_batch_of_a_both_model_gives_the_vector_map_a_zero_gradient():
    model = _model(channels="both", channel_probs=[1.0, 0.0, 0.0], atom_vector_tasks=1).train()
    out = model.forward_levels(float64_batch(positioned_graphs()))
    (out["molecule"].sum() + out["atom_vector"].sum()).backward()
    unused = [n for n, p in model.named_parameters() if p.grad is None]
    assert unused == []
    assert model.vector_out.weight.grad.abs().max() == 0


def test_train_and_predict_with_vector_messages(tmp_path):
    pytest.importorskip("ase")
    overrides = (
        "dataset.atom_vector_targets=[forces]",
        "model.distance_messages=true",
        "model.vector_messages=true",
        "trainer.max_epochs=2",
    )
    path, run, args, metrics = emt_run(tmp_path, *overrides)
    state = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert "model.messages.0.mix.weight" in state["state_dict"]
    assert "model.vector_out.weight" in state["state_dict"]
    assert_predicts_energies(tmp_path, metrics["best_checkpoint"], path, 24)
    # fine-tuning on the energy alone takes the messages and leaves the force map behind, and
    # a model of energies alone fine-tunes into one with forces
    common = [a for a in args if not a.startswith(("hydra.run.dir", "dataset.atom_vector"))]
    ckpt = metrics["best_checkpoint"]
    energy_run = tmp_path / "energy"
    call_script(
        "train.py",
        [*common, f"hydra.run.dir={energy_run}", f"pretrained={ckpt}", "trainer.max_epochs=1"],
        cwd=tmp_path,
    )
    tuned = torch.load(energy_run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert "model.vector_out.weight" not in tuned and "model.messages.0.mix.weight" in tuned
    forces_run = tmp_path / "forces"
    back = read_json(energy_run / "metrics.json")["best_checkpoint"]
    call_script(
        "train.py",
        [*common, "dataset.atom_vector_targets=[forces]", f"hydra.run.dir={forces_run}"]
        + [f"pretrained={back}"],
        cwd=tmp_path,
    )
