"""model.forces=gradient: per-atom forces as the energy's negative gradient with respect to the
positions (periodic images moving with their atoms), in evaluation under inference_mode and in
training through a second derivative; trained, evaluated and predicted by the commands."""

import numpy as np
import pandas as pd
import pytest
import torch

from graphormer.models import Graphormer, GraphormerConfig

from helpers import (
    TINY,
    call_script,
    energy_at,
    evaluate_run,
    float64_batch,
    positioned_graphs,
    read_json,
    slab_batch,
)

pytest.importorskip("ase", reason="structures need the 3d extra (pip install ase)")
import ase.io  # noqa: E402

from graphormer.data.sources.ase import ELEMENTS  # noqa: E402
from graphormer.testing import emt_frames  # noqa: E402


def _train_args(path, root, run, *extra: str) -> list[str]:
    """train.py on the structures at ``path`` with a tiny 3D model: energies, and with
    ``dataset.atom_vector_targets=[forces]`` among ``extra`` their forces."""
    return [
        "dataset=ase",
        f"dataset.path={path}",
        f"dataset.root={root}",
        f"hydra.run.dir={run}",
        "model.channels=3d",
        "model.num_kernels=16",
        *extra,
        *TINY,
    ]


GRADIENT = ("dataset.atom_vector_targets=[forces]", "model.forces=gradient")


def _model(forces: str = "gradient", **changes) -> Graphormer:
    torch.manual_seed(0)
    settings = dict(
        num_layers=2,
        hidden_dim=16,
        ffn_dim=16,
        num_heads=4,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        readout="token_sum",
        channels="3d",
        num_kernels=8,
        num_tags=3,
        atom_feature_dims=[ELEMENTS],
        bond_feature_dims=[1],
        atom_vector_tasks=1,
        forces=forces,
    )
    return Graphormer(GraphormerConfig(**{**settings, **changes})).double()


def test_forces_are_the_scaled_negative_gradient_with_images_moving_along():
    model = _model().eval()
    model.force_scale.fill_(2.5)  # the energy's units over the vectors'
    batch = slab_batch(2, seed=7)
    assert (batch.image_of >= 0).any()
    pos = batch.pos.clone()
    with torch.inference_mode():  # as eval.py and predict.py run it
        out = model.forward_levels(batch)
    vectors = out["atom_vector"]
    assert vectors.shape == (*batch.pos.shape[:2], 1, 3) and not vectors.requires_grad
    assert torch.equal(batch.pos, pos)  # the caller's batch is untouched
    assert (vectors[~batch.atom_mask] == 0).all()  # images and padding carry no vectors
    # Finite differences: an atom and each of its images move by the same step.
    graph = 0
    atom = int(batch.image_of[graph][batch.image_of[graph] >= 0][0])
    copies = (batch.image_of[graph] == atom) | (torch.arange(pos.size(1)) == atom)
    for axis in range(3):
        step = torch.zeros_like(pos)
        step[graph, copies, axis] = 1e-5
        difference = energy_at(model, batch, pos + step) - energy_at(model, batch, pos - step)
        expected = -2.5 * float(difference[graph]) / 2e-5
        assert abs(expected) > 1e-6
        torch.testing.assert_close(
            float(vectors[graph, atom, 0, axis]), expected, rtol=1e-4, atol=1e-9
        )
    # The energy depends on differences of positions only: each structure's forces sum to 0.
    total = (vectors[:, :, 0] * batch.atom_mask[..., None]).sum(1)
    torch.testing.assert_close(total, torch.zeros_like(total), rtol=0, atol=1e-9)
    # The molecule outputs are the plain forward's.
    with torch.no_grad():
        torch.testing.assert_close(out["molecule"], model(batch))


def test_a_loss_on_the_forces_trains_through_the_second_derivative():
    model = _model().train()
    batch = slab_batch(2, seed=3)
    weights = torch.randn(*batch.pos.shape[:2], 1, 3, dtype=torch.float64)

    def loss() -> torch.Tensor:
        return (model.forward_levels(batch)["atom_vector"] * weights).sum()

    loss().backward()
    means = model.geometry.means
    analytic = means.grad.clone()
    assert analytic.abs().max() > 1e-6
    for k in range(3):  # finite differences in three kernel centres
        with torch.no_grad():
            means[k] += 1e-6
            up = float(loss())
            means[k] -= 2e-6
            down = float(loss())
            means[k] += 1e-6
        torch.testing.assert_close(float(analytic[k]), (up - down) / 2e-6, rtol=1e-4, atol=1e-8)


def test_forces_gradient_refuses_what_it_cannot_differentiate():
    with pytest.raises(ValueError, match="model.forces='field' is not allowed"):
        _model(forces="field")
    with pytest.raises(ValueError, match="needs atom positions"):
        _model(channels="2d")
    with pytest.raises(ValueError, match="one per-atom vector target"):
        _model(atom_vector_tasks=2)
    with pytest.raises(ValueError, match="one molecule target"):
        _model(num_tasks=0)
    assert _model(forces="head").vector_head is not None
    assert _model().vector_head is None


def test_a_model_of_bonds_and_positions_takes_its_forces_from_the_energy_of_both():
    # channels=both: the energy reads the bond graph and the positions; its gradient is the
    # forces. A 2D training step reads no positions: zero forces, and the step still trains.
    ogb = GraphormerConfig()  # molecules: OGB's atom and bond features
    model = _model(
        channels="both",
        channel_probs=[1.0, 0.0, 0.0],
        atom_feature_dims=ogb.atom_feature_dims,
        bond_feature_dims=ogb.bond_feature_dims,
        num_tags=0,
    ).eval()
    batch = float64_batch(positioned_graphs())
    pos = batch.pos.clone()
    with torch.inference_mode():
        vectors = model.forward_levels(batch)["atom_vector"]
    assert model.channels(batch) == (True, True)
    graph, atom = 1, 2
    for axis in range(3):
        step = torch.zeros_like(pos)
        step[graph, atom, axis] = 1e-5
        difference = energy_at(model, batch, pos + step) - energy_at(model, batch, pos - step)
        expected = -float(difference[graph]) / 2e-5
        assert abs(expected) > 1e-6
        torch.testing.assert_close(
            float(vectors[graph, atom, 0, axis]), expected, rtol=1e-4, atol=1e-9
        )
    model.train()  # channel_probs draws 2D only
    assert model.channels(batch) == (True, False)
    out = model.forward_levels(batch)
    assert (out["atom_vector"] == 0).all()
    (out["molecule"].sum() + out["atom_vector"].sum()).backward()
    assert model.geometry.means.grad is None or (model.geometry.means.grad == 0).all()
    assert max(float(p.grad.abs().max()) for p in model.parameters() if p.grad is not None) > 0


def test_train_eval_and_predict_forces_as_the_energys_gradient(tmp_path):
    path = tmp_path / "emt.extxyz"
    frames = emt_frames(30)
    ase.io.write(path, frames)
    run = tmp_path / "run"
    args = _train_args(path, tmp_path / "data", run, *GRADIENT, "trainer.max_epochs=2")
    log = call_script("train.py", args, cwd=tmp_path)
    assert "val/atom_vector_mae" in log
    metrics = read_json(run / "metrics.json")
    state = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert "model.vector_head.out.weight" not in state
    scale = state["target_std"][0] / state["atom_vector_std"].view(-1)[0]
    torch.testing.assert_close(state["model.force_scale"], scale.view(1))
    assert float(state["target_std"][0]) != 1.0 and float(state["atom_vector_std"]) != 1.0

    results, log = evaluate_run(metrics, tmp_path)
    for split in ("valid", "test"):
        assert np.isfinite(results[split]["atom_vector_mae"])

    # predict.py: the forces it writes are minus the slope of the energies it writes.
    atom, step = 1, 1e-2
    moved = [frames[0].copy(), frames[0].copy()]
    for frame, sign in zip(moved, (1, -1), strict=True):
        frame.positions[atom, 0] += sign * step
    ase.io.write(tmp_path / "moved.extxyz", [frames[0], *moved])
    out = tmp_path / "pred.csv"
    best = metrics["best_checkpoint"]
    call_script(
        "predict.py",
        [f"ckpt={best}", f"input={tmp_path / 'moved.extxyz'}", "layout=long", f"output={out}"],
        cwd=tmp_path,
    )
    wide = tmp_path / "energies.csv"
    call_script(
        "predict.py",
        [f"ckpt={best}", f"input={tmp_path / 'moved.extxyz'}", f"output={wide}"],
        cwd=tmp_path,
    )
    energy = pd.read_csv(wide).energy.to_numpy()
    long = pd.read_csv(out)
    force = long[long.row == 0].forces_x.to_numpy()[atom]
    slope = -(energy[1] - energy[2]) / (2 * step)
    assert abs(slope) > 1e-3
    assert abs(force - slope) < 0.02 * abs(slope) + 1e-3


def test_forces_gradient_with_flag_is_one_error_line(tmp_path):
    from helpers import call

    path = tmp_path / "emt.extxyz"
    ase.io.write(path, emt_frames(12))
    args = _train_args(path, tmp_path / "data", tmp_path / "run", *GRADIENT, "flag.m=2")
    result = call("train.py", args, tmp_path)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "flag.m > 0" in lines[0] and "model.forces=head" in lines[0]
    assert "Traceback" not in result.stderr


def test_an_energy_model_fine_tunes_into_gradient_forces(tmp_path):
    # A 3D model of energies alone has every tensor a gradient-forces model has: fine-tuning it
    # on forces is a strict fit (the energy-to-force scale is the new task's, not copied).
    path = tmp_path / "emt.extxyz"
    ase.io.write(path, emt_frames(30))
    energy_run, forces_run = tmp_path / "energy", tmp_path / "forces"
    one = "trainer.max_epochs=1"
    call_script("train.py", _train_args(path, tmp_path / "d1", energy_run, one), cwd=tmp_path)
    pretrained = f"pretrained={energy_run / 'checkpoints' / 'last.ckpt'}"
    args = _train_args(path, tmp_path / "d2", forces_run, *GRADIENT, pretrained, one)
    log = call_script("train.py", args, cwd=tmp_path)
    assert "val/atom_vector_mae" in log
    state = torch.load(forces_run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    scale = state["target_std"][0] / state["atom_vector_std"].view(-1)[0]
    torch.testing.assert_close(state["model.force_scale"], scale.view(1))


def test_second_derivatives_run_plain_attention_and_dropout(monkeypatch):
    # The fused attention kernels (CUDA's memory-efficient and cuDNN ones, this package's CPU
    # kernel) have backward passes that are differentiable once: training must not call them.
    import torch.nn.functional as F

    def refuse(*args, **kwargs):
        raise AssertionError("a fused attention kernel inside a second derivative")

    model = _model(dropout=0.1, attention_dropout=0.1, activation_dropout=0.1).train()
    batch = slab_batch(2, seed=4)
    monkeypatch.setattr(F, "scaled_dot_product_attention", refuse)
    monkeypatch.setattr("graphormer.models.attention.biased_attention", refuse)
    model.forward_levels(batch)["atom_vector"].square().sum().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert model.geometry.means.grad.abs().max() > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forces_train_through_the_second_derivative_on_cuda(dtype):
    model = _model().float().cuda().train()
    batch = slab_batch(2, seed=4).to("cuda")
    batch.pos = batch.pos.float()
    with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
        forces = model.forward_levels(batch)["atom_vector"]
    forces.float().square().sum().backward()
    assert torch.isfinite(model.geometry.means.grad).all()
    assert model.geometry.means.grad.abs().max() > 0
