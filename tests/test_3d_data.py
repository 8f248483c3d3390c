"""Atom positions as data: RDKit conformers for a SMILES CSV (dataset.conformers=rdkit), their
cache, molecules RDKit cannot embed, and the padded ``pos`` of a batch."""

import warnings

import numpy as np
import pandas as pd
import pytest
import torch

from graphormer.data.collate import GraphormerCollator
from graphormer.data.conformers import RandomConformer, embed_conformers
from graphormer.data.sources import build_source
from graphormer.errors import ConfigError

from helpers import TINY, compose_train, nci_table, tiny_3d, train_config


def test_conformers_are_heavy_atoms_in_rdkit_order_with_real_bond_lengths_and_a_fixed_seed():
    pos = embed_conformers("CCO", num_conformers=3)
    assert pos.shape == (3, 3, 3) and pos.dtype == np.float32
    bonds = np.linalg.norm(pos[:, 0] - pos[:, 1], axis=-1)  # C-C
    assert np.all(np.abs(bonds - 1.51) < 0.05)
    co = np.linalg.norm(pos[:, 1] - pos[:, 2], axis=-1)  # C-O
    assert np.all(np.abs(co - 1.42) < 0.05)
    np.testing.assert_array_equal(embed_conformers("CCO", num_conformers=3), pos)
    assert embed_conformers("not a smiles") is None


def _csv(tmp_path, count=12):
    table = nci_table().iloc[:count]
    path = tmp_path / "molecules.csv"
    table.to_csv(path, index=False)
    return path, table


def _source(path, tmp_path, **extra):
    settings = {"source": "smiles_csv", "path": str(path), "targets": ["tpsa"]}
    return build_source({**settings, "root": str(tmp_path / "data"), "split": "random", **extra})


def test_a_molecule_rdkit_cannot_embed_is_named_once_and_left_out(tmp_path, monkeypatch):
    path, table = _csv(tmp_path)
    from graphormer.data.sources import smiles_csv

    real = smiles_csv.embed_many

    def failing(smiles, num_conformers):
        out = real(smiles, num_conformers)
        out[4] = None  # as RDKit answers a molecule it cannot embed
        return out

    monkeypatch.setattr(smiles_csv, "embed_many", failing)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = _source(path, tmp_path, conformers="rdkit").load()
    messages = [str(w.message) for w in caught if "conformers" in str(w.message)]
    assert len(messages) == 1 and f"row 4 ({table.smiles.iloc[4]!r})" in messages[0]
    assert "left out" in messages[0]
    dataset = loaded.dataset
    assert len(dataset) == len(table) - 1 and 4 not in dataset.row.view(-1).tolist()
    # kept molecules have real positions, never zeros; the batch pads them
    batch = GraphormerCollator()([dataset[i] for i in range(3)])
    sizes = batch.node_mask.sum(1)
    assert batch.pos.shape == (3, int(sizes.max()), 3)
    for i in range(3):
        real_pos = batch.pos[i, : sizes[i]]
        assert torch.cdist(real_pos, real_pos).max() > 1.0
        assert batch.pos[i, sizes[i] :].abs().sum() == 0
    # the cache is read back with the same warning, without embedding again
    monkeypatch.setattr(smiles_csv, "embed_many", None)
    with pytest.warns(UserWarning, match="could not be given conformers"):
        again = _source(path, tmp_path, conformers="rdkit").load().dataset
    torch.testing.assert_close(again.pos, dataset.pos)


def test_several_conformers_are_kept_and_one_is_read_at_random(tmp_path):
    path, _ = _csv(tmp_path, 6)
    dataset = _source(path, tmp_path, conformers="rdkit", num_conformers=3).load().dataset
    graph = dataset._data  # the stored storage, without the transform
    assert graph.conformers.shape[1:] == (3, 3)
    assert isinstance(dataset.transform, RandomConformer)
    torch.manual_seed(0)
    seen = {tuple(dataset[0].pos[0].tolist()) for _ in range(20)}
    assert len(seen) > 1


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"conformers": "openbabel"}, "dataset.conformers='openbabel' is not allowed"),
        ({"conformers": "rdkit", "num_conformers": 0}, "dataset.num_conformers=0"),
    ],
)
def test_conformer_settings_are_checked(tmp_path, extra, message):
    with pytest.raises(ConfigError, match=message):
        _source(tmp_path / "x.csv", tmp_path, **extra)


def test_train_a_3d_model_from_smiles_with_rdkit_conformers(tmp_path):
    path, _ = _csv(tmp_path, 40)
    table = pd.read_csv(path)
    assert len(table) == 40
    cfg = compose_train(
        [
            "dataset=smiles_csv",
            f"dataset.path={path}",
            "dataset.targets=[tpsa]",
            "dataset.conformers=rdkit",
            *tiny_3d(tmp_path),
        ]
    )
    result = train_config(cfg)
    assert np.isfinite(result["test"]["rmse"])


def test_a_3d_model_without_positions_is_one_error_naming_the_fix(tmp_path):
    path, _ = _csv(tmp_path, 20)
    cfg = compose_train(
        [
            "dataset=smiles_csv",
            f"dataset.path={path}",
            "dataset.targets=[tpsa]",
            f"dataset.root={tmp_path / 'data'}",
            f"output_dir={tmp_path / 'run'}",
            "model.channels=3d",
            *TINY,
        ]
    )
    with pytest.raises(ConfigError, match=r"model.channels=3d: .*dataset.conformers=rdkit"):
        train_config(cfg)


def test_predict_from_smiles_embeds_conformers_and_averages_them(tmp_path, monkeypatch):
    from graphormer.inference import inputs
    from graphormer.inference.predictor import Predictor

    path, table = _csv(tmp_path, 30)
    cfg = compose_train(
        [
            "dataset=smiles_csv",
            f"dataset.path={path}",
            "dataset.targets=[tpsa]",
            "dataset.conformers=rdkit",
            "dataset.num_conformers=2",
            *tiny_3d(tmp_path, channels="both"),
        ]
    )
    ckpt = train_config(cfg)["best_checkpoint"]
    predictor = Predictor.from_checkpoint(ckpt, device="cpu")
    assert predictor.conformers == 2  # the training run's dataset.num_conformers
    smiles = list(table.smiles.iloc[:3])
    real = [embed_conformers(s, 2) for s in smiles]

    def given(conformers):
        # embed_many answering with chosen conformers: RDKit's, or None (cannot embed)
        monkeypatch.setattr(inputs, "embed_many", lambda s, n: list(conformers[: len(s)]))
        return predictor.run(smiles)

    both = given(real).values[:, 0]
    first = given([c[[0, 0]] for c in real]).values[:, 0]
    second = given([c[[1, 1]] for c in real]).values[:, 0]
    np.testing.assert_allclose(both, (first + second) / 2, rtol=1e-5, atol=1e-5)
    assert not np.allclose(first, second)  # the positions are read
    # a molecule RDKit cannot embed gets an error in its row, never zero positions
    with pytest.warns(UserWarning, match="have no prediction"):
        result = given([real[0], None, real[2]])
    assert np.isnan(result.values[1]).all() and np.isfinite(result.values[[0, 2]]).all()
    assert result.errors[0] == "" and "RDKit could not embed 2 conformer(s)" in result.errors[1]
    monkeypatch.undo()
    table = predictor.predict(["CCO", "C1CC1C(=O)O"])
    assert table.error.tolist() == ["", ""]
    # conformers=False: a channels=both model predicts from the bond graph alone
    plain = Predictor.from_checkpoint(ckpt, device="cpu", conformers=False)
    assert plain.conformers == 0
    flat = plain.run(smiles).values[:, 0]
    assert np.isfinite(flat).all() and not np.allclose(flat, both)


def test_pyg_graphs_with_pos_train_a_3d_model_and_predict(tmp_path):
    from graphormer.data.featurize import featurize_smiles
    from graphormer.inference.predictor import Predictor

    _, table = _csv(tmp_path, 30)
    graphs = []
    for smiles, tpsa in zip(table.smiles, table.tpsa, strict=True):
        pos = embed_conformers(smiles)
        graph = featurize_smiles([smiles]).graphs[0]
        if pos is None or graph is None:
            continue
        graph.pos = torch.from_numpy(pos[0])  # [N, 3], as PyG's QM9 and MD17 hold it
        graph.y = torch.tensor([[float(tpsa)]])
        graphs.append(graph)
    path = tmp_path / "graphs.pt"
    torch.save(graphs, path)
    source = build_source(
        {"source": "pyg_file", "path": str(path), "root": str(tmp_path / "data"),
         "categorical_node_columns": list(range(9)), "categorical_edge_columns": [0, 1, 2]}
    )  # fmt: skip
    assert source.has_positions()
    torch.testing.assert_close(source.graphs().data.pos, torch.cat([g.pos for g in graphs]))
    cfg = compose_train(
        [
            "dataset=pyg_file",
            f"dataset.path={path}",
            f"dataset.categorical_node_columns={list(range(9))}",
            "dataset.categorical_edge_columns=[0,1,2]",
            *tiny_3d(tmp_path),
        ]
    )
    result = train_config(cfg)
    assert np.isfinite(result["test"]["rmse"])
    # the graphs' positions are read at prediction too: moving one atom changes its value
    predictor = Predictor.from_checkpoint(result["best_checkpoint"], device="cpu")
    before = predictor.predict_graphs(graphs[:2]).values
    moved = graphs[0].clone()
    moved.pos = moved.pos.clone()
    moved.pos[0] += 1.0
    after = predictor.predict_graphs([moved, graphs[1]]).values
    assert after[1] == pytest.approx(before[1]) and after[0] != pytest.approx(before[0])


def test_fine_tuning_takes_a_3d_checkpoints_distance_encoding(tmp_path):
    from graphormer import checkpoint as checkpoints
    from graphormer.training.pretrained import architecture

    path, _ = _csv(tmp_path, 40)
    common = [
        "dataset=smiles_csv",
        f"dataset.path={path}",
        "dataset.targets=[tpsa]",
        "dataset.conformers=rdkit",
        f"dataset.root={tmp_path / 'data'}",
        "trainer.max_epochs=1",
        *TINY,
    ]
    three_d = ["model.channels=3d", "model.num_kernels=16"]
    first = train_config(compose_train([*common, *three_d, f"output_dir={tmp_path / 'a'}"]))
    ckpt = first["best_checkpoint"]
    # pretrained= on the command line takes the checkpoint's architecture, its 3D channel with it.
    taken = architecture(checkpoints.load(ckpt).model)
    assert (taken["channels"], taken["num_kernels"], taken["cutoff"]) == ("3d", 16, None)
    # A 2D network cannot take the distance encoding's tensors: the setting is named.
    with pytest.raises(checkpoints.CheckpointError, match="model.channels"):
        train_config(compose_train([*common, f"pretrained={ckpt}", f"output_dir={tmp_path / 'b'}"]))
    tuned = train_config(
        compose_train([*common, *three_d, f"pretrained={ckpt}", f"output_dir={tmp_path / 'c'}"])
    )
    assert np.isfinite(tuned["test"]["rmse"])
