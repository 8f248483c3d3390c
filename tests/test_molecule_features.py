"""Molecule-level features and descriptor pre-training (issue #22): RDKit 2D descriptors and a
file's own numeric columns as model inputs, their training-split rule kept in the checkpoint,
and ``experiment=descriptor_pretrain`` feeding ``pretrained=``."""

import math

import numpy as np
import pandas as pd
import pytest
import torch

from graphormer import Predictor, checkpoint
from graphormer.data.descriptors import (
    ATOM_DESCRIPTORS,
    MORGAN_BITS,
    MoleculeFeatures,
    atom_descriptor_values,
    feature_sets,
    morgan_count_values,
    rdkit2d_names,
    rdkit2d_values,
)
from graphormer.data.sources.smiles_csv import SmilesCsvSource
from graphormer.errors import ConfigError, DataError
from graphormer.models import Graphormer, GraphormerConfig, MoleculeFeatureInput
from graphormer.training import GraphormerModule, build_datamodule

from helpers import TINY, compose_train, evaluate_run, nci_table, series_csv, train_config

FIXTURES_CKPT = "format1_tiny.ckpt"


def test_the_rule_fills_with_the_training_median_drops_constant_columns_and_clips():
    rows = torch.tensor(
        [
            [1.0, 7.0, float("nan"), 0.0],
            [2.0, 7.0, float("nan"), 0.0],
            [float("inf"), 7.0, float("nan"), 1.0],
            [4.0, 7.0, float("nan"), 1e6],
        ]
    )
    block = MoleculeFeatureInput(4, 8)
    dropped = block.fit(rows)
    assert dropped == {"no_finite_value": [2], "constant": [1]}
    assert block.fill[0] == 2.0  # the median of the finite training values 1, 2, 4
    assert block.keep.tolist() == [1.0, 0.0, 0.0, 1.0]
    standard = block.standardise(torch.tensor([[float("nan"), 123.0, 5.0, 1e30]]))
    filled = (2.0 - block.mean[0]) / block.std[0]
    assert torch.allclose(standard[0, 0], filled)
    assert standard[0, 1] == 0 and standard[0, 2] == 0  # dropped columns read as zero
    assert standard[0, 3] == block.clip  # far out: clipped


def test_rdkit2d_values_are_float32_nan_for_what_is_not_a_number():
    values = rdkit2d_values(["CCO", "not_a_smiles", "c1ccccc1O"])
    assert values.dtype == np.float32 and values.shape == (3, len(rdkit2d_names()))
    assert np.isnan(values[1]).all() and np.isfinite(values[0]).sum() > 150
    logp = rdkit2d_names().index("MolLogP")
    assert math.isclose(values[0, logp], -0.0014, abs_tol=1e-3)


def test_morgan_counts_are_rdkits_ecfp4_counts_and_sets_join_with_plus():
    from rdkit import Chem
    from rdkit.Chem import AllChem

    values = morgan_count_values(["c1ccccc1O", "not_a_smiles", "CC(=O)Oc1ccccc1C(=O)O"])
    assert values.dtype == np.float32 and values.shape == (3, MORGAN_BITS)
    assert np.isnan(values[1]).all()
    for row, smiles in ((0, "c1ccccc1O"), (2, "CC(=O)Oc1ccccc1C(=O)O")):
        # RDKit's older API, a different code path to the same counts.
        reference = AllChem.GetHashedMorganFingerprint(Chem.MolFromSmiles(smiles), 2, MORGAN_BITS)
        expected = np.zeros(MORGAN_BITS)
        for bit, count in reference.GetNonzeroElements().items():
            expected[bit] = count
        np.testing.assert_array_equal(values[row], expected)
    assert values[0].sum() > 7  # counts, not bits: a benzene carbon environment repeats
    assert feature_sets("rdkit2d+morgan_counts") == ["rdkit2d", "morgan_counts"]
    assert feature_sets(None) == []
    for wrong in ("morgan", "rdkit2d+rdkit2d", "rdkit2d+"):
        with pytest.raises(ConfigError, match="rdkit2d or morgan_counts, several joined with"):
            MoleculeFeatures(wrong)
    both = MoleculeFeatures("morgan_counts+rdkit2d", ["mw"])
    names = both.names()
    assert names[0] == "morgan_counts:0" and names[MORGAN_BITS] == f"rdkit2d:{rdkit2d_names()[0]}"
    assert names[-1] == "mw" and len(names) == MORGAN_BITS + len(rdkit2d_names()) + 1


def test_atom_descriptors_are_the_contributions_rdkits_molecule_descriptors_sum():
    from rdkit import Chem
    from rdkit.Chem import Crippen, rdMolDescriptors
    from rdkit.Chem.EState import EState

    smiles = list(nci_table().smiles[:600])  # past the size where a process pool computes them
    values = atom_descriptor_values(smiles)
    assert len(values) == len(smiles)
    serial = atom_descriptor_values(smiles[:50], workers=1)
    for a, b in zip(values[:50], serial, strict=True):
        np.testing.assert_array_equal(a, b)
    for text, atoms in zip(smiles[:100], values[:100], strict=True):
        mol = Chem.MolFromSmiles(text)
        assert atoms.dtype == np.float32 and atoms.shape == (mol.GetNumAtoms(), 6)
        # Each heavy atom carries its hydrogens' share: the columns sum to the molecule's values.
        assert math.isclose(atoms[:, 0].sum(), Crippen.MolLogP(mol), abs_tol=1e-3)
        assert math.isclose(atoms[:, 1].sum(), Crippen.MolMR(mol), abs_tol=1e-3)
        assert math.isclose(atoms[:, 2].sum(), rdMolDescriptors.CalcTPSA(mol), abs_tol=1e-3)
        # Labute's per-atom terms with explicit hydrogens (its molecule value adds a global term).
        with_h = sum(rdMolDescriptors._CalcLabuteASAContribs(Chem.AddHs(mol))[0])
        assert math.isclose(atoms[:, 3].sum(), with_h, rel_tol=1e-5)
        estate = np.asarray(EState.EStateIndices(mol), dtype=np.float32)
        np.testing.assert_allclose(atoms[:, 5], estate, rtol=1e-6)
    # Ethanol's oxygen: the most negative charge, a TPSA of 20.23 (hydroxyl), a negative logP.
    ethanol, broken = atom_descriptor_values(["CCO", "C1CC"], workers=1)
    assert broken is None
    assert ethanol[2, 4] == ethanol[:, 4].min() and math.isclose(ethanol[2, 2], 20.23, rel_tol=1e-6)
    assert ethanol[2, 0] < 0 < ethanol[0, 0]
    names = [ATOM_DESCRIPTORS.index(n) for n in ("crippen_logp", "tpsa", "estate")]
    assert names == [0, 2, 5]


def test_atom_descriptor_targets_are_computed_and_refuse_given_atom_targets(tmp_path):
    table = nci_table().iloc[:30]
    table[["smiles"]].to_csv(tmp_path / "smiles.csv", index=False)
    source = SmilesCsvSource(
        str(tmp_path / "smiles.csv"),
        [],
        descriptor_targets=True,
        atom_descriptor_targets=True,
        split="random",
        root=str(tmp_path / "cache"),
    )
    loaded = source.load()
    assert loaded.task.atom_tasks == len(ATOM_DESCRIPTORS)
    assert source.atom_task_names() == list(ATOM_DESCRIPTORS)
    graph = loaded.dataset[7]
    expected = atom_descriptor_values([table.smiles[int(graph.row)]], workers=1)[0]
    torch.testing.assert_close(graph.y_atom, torch.from_numpy(expected), equal_nan=True)
    with pytest.raises(ConfigError, match="leave dataset.atom_targets empty"):
        SmilesCsvSource(
            str(tmp_path / "smiles.csv"),
            [],
            descriptor_targets=True,
            atom_descriptor_targets=True,
            atom_targets=["charge"],
        )


def _csv(tmp_path, n=40):
    table = nci_table().iloc[:n].copy()
    table["mw"] = np.linspace(100, 500, n)
    table.loc[3, "mw"] = float("nan")
    path = tmp_path / "mols.csv"
    table.to_csv(path, index=False)
    return path, table


def test_feature_columns_errors_name_the_column_and_row(tmp_path):
    path, table = _csv(tmp_path)
    root = str(tmp_path / "cache")
    missing = SmilesCsvSource(str(path), ["tpsa"], root=root, feature_columns=["weight"])
    with pytest.raises(DataError, match=r"no column\(s\) \['weight'\]"):
        missing.load()
    table["mw"] = table["mw"].astype(object)
    table.loc[7, "mw"] = "heavy"
    table.to_csv(path, index=False)
    source = SmilesCsvSource(str(path), ["tpsa"], root=root, feature_columns=["mw"])
    with pytest.raises(DataError, match=r"feature column 'mw' .* 'heavy' at row 7"):
        source.load()
    features = MoleculeFeatures(columns=["mw"])
    with pytest.raises(DataError, match="gives only SMILES"):
        features.compute(["CCO"], None)


@pytest.fixture(scope="module")
def featured_run(tmp_path_factory):
    """A tiny model trained 1 epoch with RDKit descriptors, Morgan counts and a column of the
    file."""
    work = tmp_path_factory.mktemp("features")
    path, _ = _csv(work, 60)
    cfg = compose_train(
        [
            *TINY,
            "dataset=smiles_csv",
            f"dataset.path={path}",
            "dataset.targets=[tpsa]",
            "dataset.molecule_features=rdkit2d+morgan_counts",
            "dataset.feature_columns=[mw]",
            f"dataset.root={work / 'cache'}",
            "trainer.max_epochs=1",
            f"output_dir={work / 'run'}",
        ]
    )
    return train_config(cfg), work, path


def test_a_featured_model_keeps_its_statistics_and_predicts_as_it_evaluates(featured_run):
    metrics, work, path = featured_run
    record = checkpoint.load(metrics["best_checkpoint"])
    names = record.data["molecule_features"]["names"]
    morgan = [f"morgan_counts:{i}" for i in range(MORGAN_BITS)]
    assert names == [*(f"rdkit2d:{n}" for n in rdkit2d_names()), *morgan, "mw"]
    assert "median" in record.data["molecule_features"]["rule"]
    assert record.model["molecule_features_dim"] == len(names)
    keep = record.state_dict["model.molecule_input.keep"]
    assert 0 < int(keep.sum()) < len(names)  # NCI's constant descriptors dropped, others kept
    # The training median of mw fills row 3's empty cell: the statistics are the training split's.
    fill = record.state_dict["model.molecule_input.fill"][-1]
    assert 100 < float(fill) < 500
    # Prediction recomputes the features from SMILES and the file's column: the test split's
    # predictions are the ones evaluation scores.
    module = GraphormerModule.from_checkpoint(record)
    settings = module.hparams["data"]
    datamodule = build_datamodule(settings["dataset"], settings["datamodule"])
    datamodule.setup("test")
    expected, rows = [], []
    for batch in datamodule.test_dataloader():
        with torch.inference_mode():
            expected.append(module(batch)[:, 0])
    rows = datamodule.loaded.dataset.row.view(-1)[datamodule.loaded.split["test"]].tolist()
    expected = torch.cat(expected).numpy()
    table = pd.read_csv(path)
    predictor = Predictor.from_checkpoint(metrics["best_checkpoint"], device="cpu")
    got = predictor.predict(table.smiles.iloc[rows].tolist(), features=table.iloc[rows])
    order = datamodule.loaded.split["test"]
    assert len(expected) == len(order)
    np.testing.assert_allclose(np.sort(got["tpsa"].to_numpy()), np.sort(expected), rtol=1e-5)
    result, _ = evaluate_run(metrics, work)
    assert math.isclose(result["test"]["rmse"], metrics["test"]["rmse"], rel_tol=1e-5)


def test_a_model_without_molecule_features_has_exactly_its_old_tensors():
    from pathlib import Path

    old = checkpoint.load(Path(__file__).parent / "fixtures" / FIXTURES_CKPT)
    module = GraphormerModule.from_checkpoint(old)
    assert set(module.state_dict()) == set(old.state_dict)
    assert module.model.molecule_input is None
    plain = Graphormer(GraphormerConfig(num_layers=1, hidden_dim=8, ffn_dim=8, num_heads=2))
    assert not any("molecule" in name for name in plain.state_dict())


def test_descriptor_pretraining_runs_and_fine_tunes_with_pretrained(tmp_path):
    table = nci_table().iloc[:60]
    table[["smiles"]].to_csv(tmp_path / "smiles.csv", index=False)
    table.to_csv(tmp_path / "labelled.csv", index=False)
    common = [*TINY, "trainer.max_epochs=1", f"dataset.root={tmp_path / 'cache'}"]
    pre = train_config(
        compose_train(
            [
                *common,
                "experiment=descriptor_pretrain",
                "dataset.atom_descriptor_targets=true",
                f"dataset.path={tmp_path / 'smiles.csv'}",
                f"output_dir={tmp_path / 'pre'}",
            ]
        )
    )
    record = checkpoint.load(pre["best_checkpoint"])
    assert record.task["num_tasks"] == len(rdkit2d_names())
    assert record.task["atom_tasks"] == len(ATOM_DESCRIPTORS)
    assert any(k.startswith("model.atom_head.") for k in record.state_dict)
    assert math.isfinite(pre["test"]["rmse"]) and math.isfinite(pre["test"]["atom_rmse"])
    tuned = train_config(
        compose_train(
            [
                *common,
                "dataset=smiles_csv",
                f"dataset.path={tmp_path / 'labelled.csv'}",
                "dataset.targets=[tpsa]",
                "dataset.molecule_features=rdkit2d",
                f"pretrained={pre['best_checkpoint']}",
                f"output_dir={tmp_path / 'tuned'}",
            ]
        )
    )
    encoder = {k for k in record.state_dict if k.startswith("model.layers.")}
    tuned_record = checkpoint.load(tuned["best_checkpoint"])
    mine = tuned_record.state_dict
    assert encoder and encoder <= set(mine) and math.isfinite(tuned["test"]["rmse"])
    # Its atom head is its own: auxiliary atom descriptors (train.py's default for a regression
    # target), an output layer that fine-tuning initialises afresh.
    assert tuned_record.task["atom_auxiliary"] is True
    assert "model.molecule_input.keep" in mine


def test_ogb_molecules_get_descriptors_from_their_mapping_smiles(tmp_path):
    from graphormer.data.sources.ogb import OGBSource
    from graphormer.testing import nci_ogb_dataset

    nci_ogb_dataset(tmp_path, "ogbg-molesol", limit=40)
    source = OGBSource("ogbg-molesol", str(tmp_path), molecule_features="rdkit2d")
    first = source.load().dataset
    again = source.load().dataset  # from the cached tensor file
    assert first[5].molecule_features.shape == (1, len(rdkit2d_names()))
    smiles = pd.read_csv(tmp_path / "ogbg_molesol" / "mapping" / "mol.csv.gz")["smiles"]
    expected = rdkit2d_values([smiles[5]])
    torch.testing.assert_close(again[5].molecule_features, torch.from_numpy(expected))


def test_auto_features_follow_the_split_and_the_run_keeps_what_auto_chose(tmp_path, caplog):
    import logging

    from graphormer.data.descriptors import (
        ANALOGUE_SIMILARITY,
        MORGAN_BITS,
        nearest_similarity_median,
    )

    path = series_csv(tmp_path)
    assert nearest_similarity_median(["CCO", "c1ccccc1O"], ["CCCO"]) > 0.3
    assert nearest_similarity_median([], ["CCO"]) == 0.0
    common = [
        *TINY,
        "dataset=smiles_csv",
        f"dataset.path={path}",
        "dataset.targets=[tpsa]",
        "dataset.feature_columns=[length]",
        f"dataset.root={tmp_path / 'cache'}",
        "trainer.max_epochs=1",
    ]
    assert compose_train(common).dataset.molecule_features == "auto"  # the CSV default
    # A random split of a series: each held-out molecule has its homologue in training.
    with caplog.at_level(logging.INFO, logger="graphormer"):
        series = train_config(
            compose_train([*common, "dataset.split=random", f"output_dir={tmp_path / 'a'}"])
        )
    assert "Morgan counts beside the graph" in caplog.text
    record = checkpoint.load(series["best_checkpoint"])
    assert record.data["dataset"]["molecule_features"] == "morgan_counts"  # resolved, not auto
    auto = record.data["molecule_features"]["auto"]
    assert (
        auto["similarity"] >= ANALOGUE_SIMILARITY and auto["molecule_features"] == "morgan_counts"
    )
    names = record.data["molecule_features"]["names"]
    assert names[0] == "morgan_counts:0" and names[-1] == "length" and len(names) == MORGAN_BITS + 1
    assert record.model["molecule_features_dim"] == MORGAN_BITS + 1
    # The counts training read are the ones prediction computes from the SMILES: evaluation
    # of the test split (rebuilt from the saved settings) scores what training scored.
    result, _ = evaluate_run(series, tmp_path / "a")
    assert math.isclose(result["test"]["rmse"], series["test"]["rmse"], rel_tol=1e-5)
    # The run auto chose is the run of the set named outright, to the last digit.
    named = train_config(
        compose_train(
            [
                *common,
                "dataset.split=random",
                "dataset.molecule_features=morgan_counts",
                "fingerprint_kernel.use=true",  # what auto adds for an analogue series
                f"output_dir={tmp_path / 'named'}",
            ]
        )
    )
    assert named["test"]["rmse"] == series["test"]["rmse"]
    # A scaffold split of the same file: no held-out molecule shares a training scaffold.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="graphormer"):
        scaffold = train_config(
            compose_train([*common, "dataset.split=scaffold", f"output_dir={tmp_path / 'b'}"])
        )
    assert "the graph alone" in caplog.text
    record = checkpoint.load(scaffold["best_checkpoint"])
    assert record.data["dataset"]["molecule_features"] is None
    assert record.data["molecule_features"]["names"] == ["length"]  # the file's column stays
    assert record.data["molecule_features"]["auto"]["similarity"] < ANALOGUE_SIMILARITY


def test_auto_features_are_for_csv_molecules_only():
    from graphormer.data.sources.ogb import OGBSource

    with pytest.raises(ConfigError, match=r"auto chooses from a CSV's split .* rdkit2d, morgan"):
        OGBSource("ogbg-molesol", molecule_features="auto")


def test_auto_gives_large_sets_the_graph_alone_and_samples_the_held_out_molecules(
    tmp_path, monkeypatch, caplog
):
    import logging

    import numpy as np

    from graphormer.data import descriptors
    from graphormer.data.sources.smiles_csv import SmilesCsvSource

    path = series_csv(tmp_path)

    def load():
        source = SmilesCsvSource(
            str(path), ["tpsa"], split="random", root=str(tmp_path / "cache"),
            molecule_features="auto",
        )  # fmt: skip
        return source, source.load()

    source, loaded = load()  # a series: analogues in training, so the counts
    assert source.auto_choice["molecule_features"] == "morgan_counts"
    assert loaded.dataset[0].molecule_features.shape == (1, descriptors.MORGAN_BITS)
    # One molecule more than the cap: the graph alone, said in the log and in the record.
    monkeypatch.setattr(descriptors, "ANALOGUE_MAX_MOLECULES", len(loaded.dataset) - 1)
    with caplog.at_level(logging.INFO, logger="graphormer"):
        source, loaded = load()
    assert source.auto_choice == {"molecule_features": None, "molecules": len(loaded.dataset)}
    assert source.molecule_features() is None and source.resolved_settings() == {
        "molecule_features": None
    }
    assert "the graph alone" in caplog.text and "more than the" in caplog.text
    assert getattr(loaded.dataset[0], "molecule_features", None) is None
    # The median over more held-out molecules than the sample is the median of a seeded sample.
    queries = list(nci_table().smiles[:40])
    train = list(nci_table().smiles[40:240])
    picked = np.sort(np.random.default_rng(0).choice(40, 10, replace=False))
    sampled = descriptors.nearest_similarity_median(train, queries, sample=10)
    assert sampled == descriptors.nearest_similarity_median(train, [queries[i] for i in picked])
    assert sampled != descriptors.nearest_similarity_median(train, queries)


def test_auto_depth_is_six_layers_for_an_analogue_series_and_twelve_otherwise(tmp_path, caplog):
    import logging

    from graphormer.cli.train import settings_from

    path = series_csv(tmp_path, n=30)
    common = [
        *TINY,
        "model.num_layers=auto",
        "dataset=smiles_csv",
        f"dataset.path={path}",
        "dataset.targets=[tpsa]",
        f"dataset.root={tmp_path / 'cache'}",
        "trainer.max_epochs=1",
    ]
    assert compose_train(["dataset=smiles_csv"]).model.num_layers == "auto"  # slim's default
    depths = {}
    for split, features in (("random", "auto"), ("scaffold", "auto"), ("random", "morgan_counts")):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="graphormer"):
            run = train_config(
                compose_train(
                    [
                        *common,
                        f"dataset.split={split}",
                        f"dataset.molecule_features={features}",
                        f"output_dir={tmp_path / (split + features)}",
                    ]
                )
            )
        record = checkpoint.load(run["best_checkpoint"])
        held = {key.split(".")[2] for key in record.state_dict if key.startswith("model.layers.")}
        assert record.model["num_layers"] == len(held)  # the number, never auto
        depths[split, features] = len(held)
        assert f"model.num_layers=auto: {len(held)} layers" in caplog.text
    # auto's analogue series gets 6 layers; a scaffold split, and Morgan counts named outright
    # (which say nothing about the split), get 12.
    assert depths == {
        ("random", "auto"): 6,
        ("scaffold", "auto"): 12,
        ("random", "morgan_counts"): 12,
    }
    # Fine-tuning: auto takes the pre-trained network's depth (12, from the scaffold run), not
    # the 6 of the analogue series it now trains on, whose Morgan counts are new inputs.
    pretrained = checkpoint.load(
        next((tmp_path / "scaffoldauto" / "checkpoints").glob("best-*.ckpt"))
    )
    assert pretrained.model["num_layers"] == 12
    tuned = train_config(
        compose_train(
            [
                *common,
                "dataset.split=random",
                f"pretrained={pretrained.path}",
                "pretrained_strict=false",
                f"output_dir={tmp_path / 'tuned'}",
            ]
        )
    )
    assert checkpoint.load(tuned["best_checkpoint"]).model["num_layers"] == 12
    # Anything but a positive integer or auto is refused before any data is read.
    for bad in ("deep", 0):
        cfg = compose_train([*common, f"model.num_layers={bad}", f"output_dir={tmp_path / 'x'}"])
        with pytest.raises(ConfigError, match="num_layers"):
            settings_from(cfg)
