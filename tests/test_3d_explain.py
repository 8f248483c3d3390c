"""explain.py for 3D models: an energy model that reads conformers from SMILES, and a force model
explained from a structure file, give their per-atom values on the 2D depiction."""

import json

import numpy as np
import pytest
from rdkit import Chem

from graphormer.testing import emt_frames

from helpers import call_script, compose_train, nci_table, tiny_3d, train_config

pytest.importorskip("ase", reason="dataset=ase needs the 3d extra (pip install ase)")
import ase.io  # noqa: E402


def test_explain_a_3d_energy_model_reads_the_conformers_prediction_reads(tmp_path):
    from graphormer.inference import Predictor

    path = tmp_path / "molecules.csv"
    nci_table().iloc[:30].to_csv(path, index=False)
    cfg = compose_train(
        [
            "dataset=smiles_csv",
            f"dataset.path={path}",
            "dataset.targets=[tpsa]",
            "dataset.conformers=rdkit",
            "dataset.num_conformers=2",
            "model.readout=token_sum",
            *tiny_3d(tmp_path),
        ]
    )
    ckpt = train_config(cfg)["best_checkpoint"]
    smiles = ["CCO", "c1ccccc1O"]
    out = tmp_path / "pictures"
    args = [f"ckpt={ckpt}", f"smiles=[{','.join(smiles)}]", f"output={out}", "size=300"]
    log = call_script("explain.py", [*args, f"hydra.run.dir={tmp_path / 'e'}"], cwd=tmp_path)
    expected = Predictor.from_checkpoint(ckpt, device="cpu").run(smiles).values[:, 0]
    for i, text in enumerate(smiles):
        folder = out / f"mol_{i}"
        assert str(folder) in log and (folder / "contributions_tpsa.png").stat().st_size > 0
        summary = json.loads((folder / "summary.json").read_text())
        atoms = Chem.MolFromSmiles(text).GetNumAtoms()
        assert len(summary["atom_contributions"]["tpsa"]) == atoms
        # the mean over the same conformers as predict.py's
        assert summary["predictions"]["tpsa"] == pytest.approx(float(expected[i]), rel=1e-4)


def test_explain_a_force_model_on_a_structure_file_draws_each_atoms_vector_norm(
    tmp_path, monkeypatch
):
    from graphormer.data.sources.ase import structure_graphs
    from graphormer.inference import Predictor, explain
    from graphormer.inference.attention import structure_attention_maps

    path = tmp_path / "emt.extxyz"
    ase.io.write(path, emt_frames(30))
    cfg = compose_train(
        [
            "dataset=ase",
            f"dataset.path={path}",
            "dataset.atom_vector_targets=[forces]",
            *tiny_3d(tmp_path),
        ]
    )
    ckpt = train_config(cfg)["best_checkpoint"]
    frames = tmp_path / "two.extxyz"
    ase.io.write(frames, emt_frames(2))  # CH4, H2O
    out = tmp_path / "pictures"
    args = [f"ckpt={ckpt}", f"input={frames}", f"output={out}", "size=300"]
    log = call_script("explain.py", [*args, f"hydra.run.dir={tmp_path / 'e'}"], cwd=tmp_path)
    assert "forces norm per atom" in log
    predictor = Predictor.from_checkpoint(ckpt, device="cpu")
    graphs = structure_graphs(str(frames))
    predicted = predictor.predict_graphs(graphs)
    for i, atoms in enumerate(ase.io.read(frames, ":")):
        folder = out / f"mol_{i}"
        assert (folder / "atoms_forces.png").stat().st_size > 0
        assert (folder / "contributions_energy.png").stat().st_size > 0
        assert (folder / "rollout.png").stat().st_size > 0
        summary = json.loads((folder / "summary.json").read_text())
        # the file's atoms, in its order
        symbols = atoms.get_chemical_symbols()
        assert summary["labels"] == ["graph", *(f"{s}{k}" for k, s in enumerate(symbols))]
        vectors = np.array(summary["atom_vector_predictions"]["forces"])
        np.testing.assert_allclose(vectors, predicted.atom_vectors[i][:, 0], atol=1e-5)
        norms = summary["atom_vector_norms"]["forces"]
        np.testing.assert_allclose(norms, np.linalg.norm(vectors, axis=-1), rtol=1e-6)
        assert summary["predictions"]["energy"] == pytest.approx(
            float(predicted.values[i, 0]), rel=1e-5
        )
    # drawn with the bonds its positions imply; the legend says the colours are vector norms
    maps = structure_attention_maps(predictor, graphs, "two.extxyz")
    assert [m.molecule.GetNumBonds() for m in maps] == [4, 2]  # CH4, H2O
    drawn = []
    real = explain.draw_atom_values

    def recorded(molecule, values, name, size):
        drawn.append(name)
        return real(molecule, values, name, size)

    monkeypatch.setattr(explain, "draw_atom_values", recorded)
    explain.write_explanation(maps[0], tmp_path / "again", size=200)
    # the energy's per-atom terms too (ASE's structures train a token_sum readout)
    assert drawn == [
        "energy, each atom's contribution",
        "forces, each atom's vector norm |(x, y, z)|",
    ]
