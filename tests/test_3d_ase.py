"""dataset=ase: structures from any file ASE reads (extended XYZ, .db, .traj), their targets from
info keys or stored calculator results, per-atom vectors, splits, and training a 3D model."""

import builtins
import json

import numpy as np
import pandas as pd
import pytest
import torch

from graphormer.data.conformers import embed_conformers
from graphormer.data.sources import build_source
from graphormer.data.tasks import ATOM_VECTOR
from graphormer.errors import ConfigError, DataError
from graphormer.testing import emt_frames

from helpers import (
    TINY,
    call_script,
    compose_train,
    evaluate_run,
    nci_smiles,
    read_json,
    tiny_3d,
    train_config,
)

pytest.importorskip("ase", reason="dataset=ase needs the 3d extra (pip install ase)")
import ase.db  # noqa: E402
import ase.io  # noqa: E402
from ase import Atoms  # noqa: E402
from ase.calculators.singlepoint import SinglePointCalculator  # noqa: E402
from rdkit import Chem  # noqa: E402


def _frames(count: int, calculator: bool = False) -> list:
    """Real heavy-atom geometries of NCI molecules with a made-up pair energy and its forces."""
    frames = []
    for i, smiles in enumerate(nci_smiles()[: count * 2]):
        pos = embed_conformers(smiles, optimise=False)
        if pos is None or len(frames) == count:
            continue
        numbers = [a.GetAtomicNum() for a in Chem.MolFromSmiles(smiles).GetAtoms()]
        atoms = Atoms(numbers=numbers, positions=pos[0].astype(float))
        d = atoms.get_all_distances()
        energy = float(np.triu(np.exp(-d), 1).sum())
        forces = np.random.default_rng(i).normal(size=(len(atoms), 3))
        atoms.info["split"] = ("train", "valid", "test")[len(frames) % 3]
        atoms.info["gap"] = 0.1 * len(atoms)
        if calculator:
            atoms.calc = SinglePointCalculator(atoms, energy=energy, forces=forces)
        else:
            atoms.info["energy_info"] = energy
            atoms.arrays["dipoles"] = forces
        frames.append(atoms)
    return frames


def _source(path, tmp_path, **extra):
    return build_source({"source": "ase", "path": str(path), "root": str(tmp_path), **extra})


@pytest.mark.parametrize("suffix", ["extxyz", "db", "traj"])
def test_each_file_kind_gives_elements_positions_and_targets(tmp_path, suffix):
    frames = _frames(6, calculator=True)
    path = tmp_path / f"frames.{suffix}"
    if suffix == "db":  # a database keeps per-frame values as key-value pairs
        with ase.db.connect(path) as db:
            for atoms in frames:
                db.write(atoms, gap=atoms.info["gap"])
    else:
        ase.io.write(path, frames)
    source = _source(path, tmp_path, targets=["energy", "gap"], atom_vector_targets=["forces"])
    graphs = source.graphs()
    assert graphs.num_graphs == 6 and graphs.node_dims == [119]
    data = graphs.data
    numbers = np.concatenate([a.numbers for a in frames])
    np.testing.assert_array_equal(data.x.view(-1).numpy(), numbers - 1)
    positions = np.concatenate([a.positions for a in frames])
    np.testing.assert_allclose(data.pos.numpy(), positions, atol=1e-5)
    energies = [a.get_potential_energy() for a in frames]
    np.testing.assert_allclose(data.y[:, 0].numpy(), energies, rtol=1e-6)
    np.testing.assert_allclose(data.y[:, 1].numpy(), [0.1 * len(a) for a in frames], rtol=1e-6)
    forces = np.concatenate([a.get_forces() for a in frames])
    np.testing.assert_allclose(data.y_atom_vector[:, 0].numpy(), forces, rtol=1e-5, atol=1e-6)
    # vectors are kept, and a level of the task: the model is asked for one vector per atom
    task = source.load().task
    assert (task.atom_vector_tasks, task.level_metrics) == (
        1,
        ("rmse", "atom_vector_mae", "atom_vector_rmse"),
    )
    assert source.atom_vector_task_names() == ["forces"]


def test_info_and_arrays_keys_and_the_column_and_file_splits(tmp_path):
    frames = _frames(9)
    path = tmp_path / "frames.extxyz"
    ase.io.write(path, frames)
    source = _source(path, tmp_path, targets=["energy_info"], split="column", split_column="split")
    loaded = source.load()
    assert [len(loaded.split[s]) for s in ("train", "valid", "test")] == [3, 3, 3]
    assert loaded.split["valid"].tolist() == [1, 4, 7]
    graph = loaded.dataset[4]
    assert graph.pos.shape == (frames[4].get_global_number_of_atoms(), 3)
    assert graph.y.item() == pytest.approx(frames[4].info["energy_info"], rel=1e-6)
    split_file = tmp_path / "split.json"
    split_file.write_text(json.dumps({"train": [0, 1, 2, 3, 4], "valid": [5, 6], "test": [7, 8]}))
    source = _source(path, tmp_path, targets=["energy_info"], split_file=str(split_file))
    assert source.load().split["test"].tolist() == [7, 8]
    vectors = _source(path, tmp_path, targets=["energy_info"], atom_vector_targets=["dipoles"])
    np.testing.assert_allclose(
        vectors.graphs().data.y_atom_vector[:, 0].numpy(),
        np.concatenate([a.arrays["dipoles"] for a in frames]),
        rtol=1e-5,
    )


def test_a_target_no_frame_holds_and_a_flat_periodic_cell_are_errors(tmp_path):
    frames = _frames(3)
    path = tmp_path / "frames.extxyz"
    ase.io.write(path, frames)
    with pytest.raises(DataError, match="no frame holds \\['enthalpy'\\]"):
        _source(path, tmp_path, targets=["enthalpy"]).graphs()
    frames[1].pbc = True
    frames[1].cell = [20.0, 20.0, 0.0]  # periodic frames are read (tests/test_periodic_ase.py)
    periodic = tmp_path / "periodic.traj"
    ase.io.write(periodic, frames)
    with pytest.raises(DataError, match="frame 1: the cell .* has zero volume"):
        _source(periodic, tmp_path, targets=["energy_info"]).graphs()
    with pytest.raises(DataError, match="ASE cannot read it"):
        bad = tmp_path / "bad.extxyz"
        bad.write_text("3\nnot a comment line = [\nC 0 0\n")
        _source(bad, tmp_path).graphs()


def test_without_ase_the_source_names_the_extra(tmp_path, monkeypatch):
    path = tmp_path / "frames.extxyz"
    ase.io.write(path, _frames(3))
    real_import = builtins.__import__

    def no_ase(name, *args, **kwargs):
        if name == "ase" or name.startswith("ase."):
            raise ImportError("No module named 'ase'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ase)
    with pytest.raises(ConfigError, match=r"pip install 'graphormer\[3d\]'"):
        _source(path, tmp_path).graphs()


def test_train_a_3d_model_on_an_extxyz_file(tmp_path):
    path = tmp_path / "frames.extxyz"
    ase.io.write(path, _frames(30, calculator=True))
    cfg = compose_train(
        [
            "dataset=ase",
            f"dataset.path={path}",
            *tiny_3d(tmp_path),
        ]
    )
    result = train_config(cfg)
    assert np.isfinite(result["test"]["rmse"])
    assert torch.isfinite(torch.tensor(result["valid"]["rmse"]))


def test_vector_statistics_scale_by_the_rms_norm_and_never_shift():
    rows = torch.tensor([[[3.0, 4.0, 0.0]], [[0.0, 0.0, float("nan")]], [[1.0, 0.0, 0.0]]])
    mean, std = ATOM_VECTOR.statistics(rows)  # [T, 1] each: one scale shared by x, y, z
    assert mean.tolist() == [[0.0]]
    assert float(std) == pytest.approx(((25 + 1) / 2) ** 0.5)  # the NaN atom: unlabelled
    # the per-component rows its metrics read: [n, T, 3] -> [3 n, T]
    two = torch.cat([rows[[0, 2]], -rows[[0, 2]]], dim=1)  # [2 atoms, T=2, 3]
    assert ATOM_VECTOR.component_rows(two).tolist() == [
        [3, -3],
        [4, -4],
        [0, 0],
        [1, -1],
        [0, 0],
        [0, 0],
    ]


def test_train_energy_and_forces_then_eval_and_resume(tmp_path):
    path = tmp_path / "emt.extxyz"
    ase.io.write(path, emt_frames(30))
    run = tmp_path / "run"
    args = [
        "dataset=ase",
        f"dataset.path={path}",
        "dataset.atom_vector_targets=[forces]",
        f"dataset.root={tmp_path / 'data'}",
        f"hydra.run.dir={run}",
        "model.channels=3d",
        "model.num_kernels=16",
        "trainer.max_epochs=2",
        "loss_weights={atom_vector: 2.0}",
        *TINY,
    ]
    log = call_script("train.py", args, cwd=tmp_path)
    assert "val/atom_vector_mae" in log
    metrics = read_json(run / "metrics.json")
    last = run / "checkpoints" / "last.ckpt"
    stored = torch.load(last, weights_only=True)
    state = stored["state_dict"]
    # scaled by the training forces' RMS norm, never shifted (rotation equivariance)
    forces = np.concatenate([a.get_forces() for a in ase.io.read(path, ":")])
    assert state["atom_vector_mean"].tolist() == [[0.0]]
    assert 0 < float(state["atom_vector_std"]) < 2 * np.sqrt((forces**2).sum(-1).mean())
    assert stored["hyper_parameters"]["model"]["channels"] == "3d"

    results, log = evaluate_run(metrics, tmp_path)
    assert "atom_vector_mae" in log
    for split in ("valid", "test"):
        assert np.isfinite(results[split]["atom_vector_mae"])
        assert results[split]["atom_vector_mae"] <= results[split]["atom_vector_rmse"]

    # predict.py reads the structure file: forces as a list of [x, y, z] per frame, or one row
    # per atom with x, y, z columns
    frames = ase.io.read(path, ":")
    best = metrics["best_checkpoint"]
    common = [f"ckpt={best}", f"input={path}", f"hydra.run.dir={tmp_path / 'p'}"]
    call_script("predict.py", [*common, f"output={tmp_path / 'wide.csv'}"], cwd=tmp_path)
    wide = pd.read_csv(tmp_path / "wide.csv")
    assert list(wide.columns) == ["graph", "energy", "forces", "error"] and len(wide) == 30
    # Intervals are the energy's: the vectors have none, and do not stop the energy's.
    banded = [*common, "interval=0.5", f"output={tmp_path / 'banded.csv'}"]
    call_script("predict.py", banded, cwd=tmp_path)
    banded = pd.read_csv(tmp_path / "banded.csv")
    assert list(banded.columns) == [
        "graph", "energy", "energy_lower", "energy_upper", "forces", "error"
    ]  # fmt: skip
    assert (banded.energy_lower < banded.energy).all() and (
        banded.energy < banded.energy_upper
    ).all()
    vectors = [np.array(json.loads(cell)) for cell in wide.forces]
    assert [v.shape for v in vectors] == [(len(a), 3) for a in frames]
    long_args = [*common, "layout=long", f"output={tmp_path / 'long.csv'}"]
    call_script("predict.py", long_args, cwd=tmp_path)
    long = pd.read_csv(tmp_path / "long.csv")
    assert list(long.columns) == [
        "row", "atom_index", "element", "forces_x", "forces_y", "forces_z", "error"
    ]  # fmt: skip
    assert long.element.tolist() == [s for a in frames for s in a.get_chemical_symbols()]
    np.testing.assert_allclose(
        long[["forces_x", "forces_y", "forces_z"]].to_numpy(), np.concatenate(vectors), atol=1e-5
    )

    log = call_script("train.py", [f"ckpt_path={last}", "trainer.max_epochs=3"], cwd=tmp_path)
    assert "epoch 3/3" in log and "epoch 1/" not in log and "val/atom_vector_mae" in log
    resumed = torch.load(last, weights_only=True)
    assert resumed["epoch"] == 2
    assert torch.equal(resumed["state_dict"]["atom_vector_std"], state["atom_vector_std"])
