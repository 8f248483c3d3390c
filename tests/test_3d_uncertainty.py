"""Ensembles and MC dropout of 3D models with per-atom vector targets (forces): the members'
vectors averaged component by component, their spread per component, the energy's intervals
beside them."""

import json

import numpy as np
import pandas as pd
import pytest
import torch

from graphormer.testing import emt_frames

from helpers import TINY, call_script, compose_train

pytest.importorskip("ase", reason="dataset=ase needs the 3d extra (pip install ase)")
import ase.io  # noqa: E402


def _train_args(tmp_path, path, *extra: str) -> list[str]:
    return [
        "dataset=ase",
        f"dataset.path={path}",
        "dataset.atom_vector_targets=[forces]",
        f"dataset.root={tmp_path / 'data'}",
        f"output_dir={tmp_path / 'run'}",
        "model.channels=3d",
        "model.num_kernels=16",
        "loss_weights={atom_vector: 2.0}",
        "~logger",
        *TINY,
        *extra,
    ]


def test_an_ensemble_of_force_models_averages_the_vectors_and_gives_their_spread(tmp_path):
    from graphormer.cli.train import settings_from
    from graphormer.training.evaluation import evaluate
    from graphormer.training.experiment import fit

    path = tmp_path / "emt.extxyz"
    frames = emt_frames(30)
    ase.io.write(path, frames)
    cfg = compose_train(_train_args(tmp_path, path, "ensemble.size=2", "trainer.max_epochs=2"))
    found = fit(settings_from(cfg))
    assert found["ensemble_size"] == 2
    assert set(found["test"]) == {"rmse", "atom_vector_mae", "atom_vector_rmse", "num_graphs"}
    members = [m["test"]["atom_vector_mae"] for m in found["members"]]
    # The mean of two members' vectors is no worse than the worse of them (the MAE is convex).
    assert found["test"]["atom_vector_mae"] <= max(members) + 1e-6
    assert found["test"]["atom_vector_mae"] != pytest.approx(members[0], rel=1e-6)
    # eval.py scores the ensemble's mean as training did
    scored = evaluate(tmp_path / "run", split="test", output=tmp_path / "eval.json")
    for name in ("atom_vector_mae", "atom_vector_rmse", "rmse"):
        assert scored["test"][name] == pytest.approx(found["test"][name], rel=1e-5)

    # predict.py: the members' mean vectors with a std per component beside them, and the
    # energy's calibrated interval (vectors have none)
    common = [f"ckpt={tmp_path / 'run'}", f"input={path}", "device=cpu", "interval=0.5"]
    common += [f"hydra.run.dir={tmp_path / 'p'}"]
    call_script("predict.py", [*common, f"output={tmp_path / 'wide.csv'}"], cwd=tmp_path)
    wide = pd.read_csv(tmp_path / "wide.csv")
    assert list(wide.columns) == [
        "graph", "energy", "energy_std", "energy_lower", "energy_upper", "forces", "forces_std",
        "error",
    ]  # fmt: skip
    forces = [np.array(json.loads(cell)) for cell in wide.forces]
    std = [np.array(json.loads(cell)) for cell in wide.forces_std]
    assert [v.shape for v in std] == [(len(a), 3) for a in frames]
    assert all((s > 0).all() for s in std)
    assert (wide.energy_lower < wide.energy).all() and (wide.energy < wide.energy_upper).all()
    call_script("predict.py", [*common, "layout=long", f"output={tmp_path / 'long.csv'}"], tmp_path)
    long = pd.read_csv(tmp_path / "long.csv")
    xyz = ["forces_x", "forces_y", "forces_z"]
    spread = ["forces_x_std", "forces_y_std", "forces_z_std"]
    assert list(long.columns) == [
        "row", "atom_index", "element", "forces_x", "forces_x_std", "forces_y", "forces_y_std",
        "forces_z", "forces_z_std", "error",
    ]  # fmt: skip
    np.testing.assert_allclose(long[xyz].to_numpy(), np.concatenate(forces), atol=1e-5)
    np.testing.assert_allclose(long[spread].to_numpy(), np.concatenate(std), atol=1e-5)

    # the members' mean vector rotates with the molecule (their spread, per axis, does not)
    from graphormer.data.sources.ase import structure_graphs
    from graphormer.inference import Predictor

    predictor = Predictor.from_checkpoint(tmp_path / "run", device="cpu")
    graphs = structure_graphs(str(path))[:5]
    q, _ = torch.linalg.qr(torch.randn(3, 3, generator=torch.Generator().manual_seed(1)))
    rotation = q * torch.sign(torch.det(q))  # a proper rotation
    turned = [g.clone() for g in graphs]
    for g in turned:
        g.pos = g.pos @ rotation.T
    plain, rotated = predictor.predict_graphs(graphs), predictor.predict_graphs(turned)
    for a, b in zip(plain.atom_vectors, rotated.atom_vectors, strict=True):
        np.testing.assert_allclose(a @ rotation.T.numpy(), b, atol=1e-4)
    np.testing.assert_allclose(plain.values, rotated.values, rtol=1e-4, atol=1e-4)


def test_mc_dropout_gives_a_force_model_a_reproducible_spread(tmp_path):
    from graphormer.cli.train import settings_from
    from graphormer.data.sources.ase import structure_graphs
    from graphormer.inference import Predictor
    from graphormer.training.experiment import fit

    path = tmp_path / "emt.extxyz"
    ase.io.write(path, emt_frames(30))
    cfg = compose_train(_train_args(tmp_path, path, "trainer.max_epochs=1", "model.dropout=0.1"))
    fit(settings_from(cfg))
    predictor = Predictor.from_checkpoint(tmp_path / "run", device="cpu", mc_dropout=10)
    graphs = structure_graphs(str(path), key="input")[:4]
    first, again = (predictor.predict_graphs(graphs, interval=0.5) for _ in range(2))
    std = first.item_extras["atom_vector"]["std"]
    assert [s.shape for s in std] == [(len(g.pos), 1, 3) for g in graphs]
    assert all((s > 0).all() for s in std)
    for a, b in zip(std, again.item_extras["atom_vector"]["std"], strict=True):
        assert np.array_equal(a, b)  # seeded passes: the same input, the same spread
    for a, b in zip(first.atom_vectors, again.atom_vectors, strict=True):
        assert np.array_equal(a, b)
    assert (first.lower < first.values).all() and (first.values < first.upper).all()
