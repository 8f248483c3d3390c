"""Auxiliary per-atom descriptor targets (issue #22): ``dataset.auxiliary_atom_descriptors``
regresses RDKit's per-atom descriptors beside a CSV's regression targets, a second loss that is
logged but never selects checkpoints, never is predicted and never blocks ensembles."""

import math
import shutil

import numpy as np
import pandas as pd
import pytest
import torch

from graphormer import Predictor, checkpoint
from graphormer.cli.train import run as train_run
from graphormer.data.descriptors import ATOM_DESCRIPTORS, atom_descriptor_values
from graphormer.data.sources.smiles_csv import SmilesCsvSource
from graphormer.data.tasks import TaskInfo
from graphormer.errors import ConfigError, DataError
from graphormer.training.evaluation import evaluate

from helpers import TINY, compose_train, evaluate_run, nci_table, train_config


def _source(path, tmp_path, targets=("tpsa",), **settings):
    return SmilesCsvSource(str(path), list(targets), root=str(tmp_path / "cache"), **settings)


@pytest.fixture
def csv(tmp_path):
    table = nci_table().iloc[:40].copy()
    table["ring"] = (table["tpsa"] > table["tpsa"].median()).astype(float)
    table["charges"] = [
        str([0.0] * n) for n in (len(v) for v in atom_descriptor_values(table.smiles, workers=1))
    ]
    path = tmp_path / "mols.csv"
    table.to_csv(path, index=False)
    return path


def test_auto_applies_to_regression_targets_alone(csv, tmp_path):
    on = _source(csv, tmp_path, auxiliary_atom_descriptors="auto").task_info()
    assert on.atom_auxiliary and on.atom_tasks == len(ATOM_DESCRIPTORS)
    assert on.monitor == "val/rmse"  # the molecule metric selects checkpoints
    assert on.without_auxiliary() == TaskInfo(on.name, "regression", 1, "rmse")
    off = [
        _source(csv, tmp_path, ["ring"], task_type="binary", auxiliary_atom_descriptors="auto"),
        _source(csv, tmp_path, atom_targets=["charges"], auxiliary_atom_descriptors="auto"),
        _source(csv, tmp_path, [], descriptor_targets=True, auxiliary_atom_descriptors="auto"),
        _source(csv, tmp_path, auxiliary_atom_descriptors=False),
        # an atom task type for no atom targets: auto stays off rather than refusing it
        _source(csv, tmp_path, atom_task_type="binary", auxiliary_atom_descriptors="auto"),
        _source(csv, tmp_path),  # the constructor's default: checkpoints made before it
    ]
    for source in off:
        assert not source.task_info().atom_auxiliary
    assert off[1].task_info().atom_tasks == 1  # the user's own atom targets, untouched
    binary = _source(csv, tmp_path, ["ring"], task_type="binary", auxiliary_atom_descriptors=True)
    assert binary.task_info().atom_auxiliary  # asked for: any molecule task can have it


def test_asking_for_it_where_it_cannot_apply_is_one_clear_error(csv, tmp_path):
    with pytest.raises(ConfigError, match="atom level holds dataset.atom_targets"):
        _source(csv, tmp_path, atom_targets=["charges"], auxiliary_atom_descriptors=True)
    with pytest.raises(ConfigError, match="descriptor_targets=true pre-trains"):
        _source(csv, tmp_path, [], descriptor_targets=True, auxiliary_atom_descriptors=True)
    with pytest.raises(ConfigError, match="not dataset.atom_task_type=binary"):
        _source(csv, tmp_path, atom_task_type="binary", auxiliary_atom_descriptors=True)
    with pytest.raises(ConfigError, match="must be auto, true or false, got 'yes'"):
        _source(csv, tmp_path, auxiliary_atom_descriptors="yes")
    with pytest.raises(ValueError, match="auxiliary atom targets serve molecule targets"):
        TaskInfo(
            "t",
            "regression",
            0,
            "rmse",
            atom_tasks=2,
            atom_task_type="regression",
            atom_auxiliary=True,
        )


def test_the_labels_are_rdkits_atom_descriptors(csv, tmp_path):
    loaded = _source(csv, tmp_path, auxiliary_atom_descriptors="auto").load()
    graph = loaded.dataset[3]
    smiles = pd.read_csv(csv).smiles[int(graph.row)]
    expected = torch.from_numpy(atom_descriptor_values([smiles], workers=1)[0])
    torch.testing.assert_close(graph.y_atom, expected, equal_nan=True)


@pytest.fixture(scope="module")
def auxiliary_run(tmp_path_factory):
    """train.py's defaults on a CSV's regression target: the auxiliary atoms come with them."""
    work = tmp_path_factory.mktemp("auxiliary")
    nci_table().iloc[:60].to_csv(work / "mols.csv", index=False)
    common = [
        *TINY,
        "dataset=smiles_csv",
        f"dataset.path={work / 'mols.csv'}",
        "dataset.targets=[tpsa]",
        f"dataset.root={work / 'cache'}",
        "trainer.max_epochs=2",
    ]
    runs = {
        name: train_config(compose_train([*common, *extra, f"output_dir={work / name}"]))
        for name, extra in (
            ("default", []),
            ("off", ["dataset.auxiliary_atom_descriptors=false"]),
        )
    }
    return runs, work


def test_training_logs_it_but_selects_and_predicts_molecules(auxiliary_run):
    runs, work = auxiliary_run
    metrics = runs["default"]
    assert metrics["metric"] == "rmse"  # what selected the best checkpoint
    assert set(metrics["test"]) == {"rmse", "atom_mae", "atom_rmse"}
    assert all(math.isfinite(v) for v in metrics["test"].values())
    record = checkpoint.load(metrics["best_checkpoint"])
    assert record.task["atom_auxiliary"] is True
    assert record.state_dict["model.atom_head.out.weight"].shape[0] == len(ATOM_DESCRIPTORS)
    off = checkpoint.load(runs["off"]["best_checkpoint"])
    assert "atom_auxiliary" not in off.task and "atom_tasks" not in off.task  # as before
    assert not any(k.startswith("model.atom_head.") for k in off.state_dict)
    # The second loss changes what the encoder learns: same seed, same batches, other weights.
    name = "model.layers.0.attn.q_proj.weight"
    assert not torch.equal(record.state_dict[name], off.state_dict[name])
    smiles = nci_table().smiles.iloc[:5].tolist()
    predictor = Predictor.from_checkpoint(metrics["best_checkpoint"], device="cpu")
    table = predictor.predict(smiles)
    assert list(table.columns) == ["smiles", "tpsa", "error"]
    result, _ = evaluate_run(metrics, work)
    assert math.isclose(result["test"]["rmse"], metrics["test"]["rmse"], rel_tol=1e-5)


def test_members_with_and_without_it_predict_together(auxiliary_run):
    """The auxiliary is how a member trained, not what it predicts: a model trained with it
    and one trained before it (or with it off) on the same data form one ensemble."""
    runs, _ = auxiliary_run
    paths = [runs["default"]["best_checkpoint"], runs["off"]["best_checkpoint"]]
    ensemble = Predictor.from_checkpoint(paths, device="cpu")
    smiles = nci_table().smiles.iloc[:4].tolist()
    both = ensemble.predict(smiles)
    alone = [Predictor.from_checkpoint(p, device="cpu").predict(smiles) for p in paths]
    expected = (alone[0]["tpsa"] + alone[1]["tpsa"]) / 2
    np.testing.assert_allclose(both["tpsa"], expected, rtol=1e-5)


def test_ensembles_train_and_score_with_auxiliary_atoms(tmp_path):
    nci_table().iloc[:50].to_csv(tmp_path / "mols.csv", index=False)
    cfg = compose_train(
        [
            *TINY,
            "dataset=smiles_csv",
            f"dataset.path={tmp_path / 'mols.csv'}",
            "dataset.targets=[tpsa]",
            f"dataset.root={tmp_path / 'cache'}",
            "trainer.max_epochs=1",
            "ensemble.size=2",
            f"output_dir={tmp_path / 'ens'}",
            "~logger",
        ]
    )
    metrics = train_run(cfg)
    assert metrics["ensemble_size"] == 2 and math.isfinite(metrics["test"]["rmse"])
    for member in metrics["members"]:
        assert checkpoint.load(member["best_checkpoint"]).task["atom_auxiliary"] is True
    found = evaluate(tmp_path / "ens", split="test", output=tmp_path / "eval.json")
    assert math.isclose(found["test"]["rmse"], metrics["test"]["rmse"], rel_tol=1e-5)


def test_ogb_molecule_sets_resolve_it_as_csvs_do(tmp_path):
    from graphormer.data.sources.ogb import OGBSource

    esol = OGBSource("ogbg-molesol", str(tmp_path), auxiliary_atom_descriptors="auto").task_info()
    assert esol.atom_auxiliary and esol.atom_tasks == len(ATOM_DESCRIPTORS)
    assert esol.without_auxiliary() == OGBSource("ogbg-molesol", str(tmp_path)).task_info()
    hiv = OGBSource("ogbg-molhiv", str(tmp_path), auxiliary_atom_descriptors="auto")
    assert not hiv.task_info().atom_auxiliary and hiv.atom_task_names() == []
    asked = OGBSource("ogbg-molhiv", str(tmp_path), auxiliary_atom_descriptors=True)
    assert asked.task_info().atom_auxiliary and asked.atom_task_names() == list(ATOM_DESCRIPTORS)
    with pytest.raises(ConfigError, match="must be auto, true or false, got 'yes'"):
        OGBSource("ogbg-molesol", str(tmp_path), auxiliary_atom_descriptors="yes")


def test_ogb_graphs_get_rdkits_atom_descriptors_of_their_smiles(tmp_path):
    from graphormer.data.sources.ogb import OGBSource
    from graphormer.testing import nci_ogb_dataset

    folder = nci_ogb_dataset(tmp_path, "ogbg-molesol", limit=40)
    source = OGBSource("ogbg-molesol", str(tmp_path), auxiliary_atom_descriptors="auto")
    loaded = source.load()
    smiles = pd.read_csv(folder / "mapping" / "mol.csv.gz").smiles.tolist()
    expected = atom_descriptor_values(smiles, workers=1)
    for index in (0, 17, 39):
        graph = loaded.dataset[index]
        assert graph.y_atom.shape == (graph.num_nodes, len(ATOM_DESCRIPTORS))
        torch.testing.assert_close(graph.y_atom, torch.from_numpy(expected[index]), equal_nan=True)
    cached = list((folder / "processed").glob("atom_descriptors_*.pt"))
    assert len(cached) == 1
    again = OGBSource("ogbg-molesol", str(tmp_path), auxiliary_atom_descriptors=True).load()
    torch.testing.assert_close(again.dataset[17].y_atom, loaded.dataset[17].y_atom, equal_nan=True)
    # A cache that does not fit the graphs is refused with its path, never used.
    torch.save(torch.zeros(3, len(ATOM_DESCRIPTORS)), cached[0])
    with pytest.raises(DataError, match="atom_descriptors_"):
        OGBSource("ogbg-molesol", str(tmp_path), auxiliary_atom_descriptors=True).load()
    plain = OGBSource("ogbg-molesol", str(tmp_path)).load()  # off: no atom labels at all
    assert getattr(plain.dataset[0], "y_atom", None) is None


def test_an_ogb_folder_rewritten_with_other_molecules_never_reuses_their_labels(tmp_path):
    from graphormer.data.sources.ogb import OGBSource
    from graphormer.testing import write_ogb_layout

    table = nci_table().iloc[:40]
    write_ogb_layout(tmp_path, "ogbg-molesol", table.smiles.tolist(), table.tpsa)
    OGBSource("ogbg-molesol", str(tmp_path), auxiliary_atom_descriptors=True).load()
    # The same folder, rebuilt with the molecules in reverse order (its graph cache removed,
    # as the corrupt-cache advice says): graph 0 is now the last molecule.
    folder = write_ogb_layout(
        tmp_path, "ogbg-molesol", table.smiles.tolist()[::-1], table.tpsa[::-1]
    )
    shutil.rmtree(folder / "processed" / "plain")
    loaded = OGBSource("ogbg-molesol", str(tmp_path), auxiliary_atom_descriptors=True).load()
    expected = atom_descriptor_values([table.smiles.iloc[-1]], workers=1)[0]
    torch.testing.assert_close(loaded.dataset[0].y_atom, torch.from_numpy(expected), equal_nan=True)
    assert len(list((folder / "processed").glob("atom_descriptors_*.pt"))) == 2


def test_a_smiles_that_is_not_its_graph_loses_its_atom_labels_not_the_run(tmp_path):
    from graphormer.data.sources.ogb import OGBSource
    from graphormer.testing import write_ogb_layout

    table = nci_table().iloc[:40]
    folder = write_ogb_layout(tmp_path, "ogbg-molesol", table.smiles.tolist(), table.tpsa)
    mapping = folder / "mapping" / "mol.csv.gz"
    smiles = table.smiles.tolist()
    # Molecule 5's SMILES written with its atoms in reverse order: the same molecule, the
    # same atom count, another atom order than its graph's (unless it reads the same).
    from rdkit import Chem

    mol = Chem.MolFromSmiles(smiles[5])
    reordered = Chem.RenumberAtoms(mol, list(range(mol.GetNumAtoms()))[::-1])
    smiles[5] = Chem.MolToSmiles(reordered, canonical=False)
    assert [a.GetAtomicNum() for a in Chem.MolFromSmiles(smiles[5]).GetAtoms()] != [
        a.GetAtomicNum() for a in mol.GetAtoms()
    ]
    pd.DataFrame({"smiles": smiles}).to_csv(mapping, index=False)
    with pytest.warns(UserWarning, match=r"1 molecule\(s\) of .* do not parse .*5 \("):
        loaded = OGBSource("ogbg-molesol", str(tmp_path), auxiliary_atom_descriptors=True).load()
    assert torch.isnan(loaded.dataset[5].y_atom).all()
    assert not torch.isnan(loaded.dataset[4].y_atom[:, 0]).any()
    # A file of other molecules altogether is refused, not turned into missing labels.
    pd.DataFrame({"smiles": smiles[::-1]}).to_csv(mapping, index=False)
    with pytest.raises(DataError, match="does not belong to these graphs"):
        OGBSource("ogbg-molesol", str(tmp_path), auxiliary_atom_descriptors=True).load()


def test_ogb_regression_trains_it_by_default(ogb_root, tmp_path):
    metrics = train_config(
        compose_train(
            [
                *TINY,
                "dataset=ogbg-molesol",
                f"dataset.root={ogb_root}",
                "trainer.max_epochs=1",
                f"output_dir={tmp_path / 'run'}",
            ]
        )
    )
    assert metrics["metric"] == "rmse"
    assert set(metrics["test"]) == {"rmse", "atom_mae", "atom_rmse"}
    record = checkpoint.load(metrics["best_checkpoint"])
    assert record.task["atom_auxiliary"] is True
    assert record.data["dataset"]["auxiliary_atom_descriptors"] == "auto"
    result, _ = evaluate_run(metrics, tmp_path)
    assert math.isclose(result["test"]["rmse"], metrics["test"]["rmse"], rel_tol=1e-5)
    table = Predictor.from_checkpoint(metrics["best_checkpoint"], device="cpu").predict(
        nci_table().smiles.iloc[:3].tolist()
    )
    assert list(table.columns) == ["smiles", "task_0", "error"]  # molecules alone


def test_an_ogb_set_trains_exactly_as_the_same_molecules_in_a_csv(tmp_path):
    """The auxiliary labels of OGB's graphs are the CSV path's, atom for atom: the same
    molecules, split and seed train to the same metrics either way."""
    import json

    from graphormer.testing import write_ogb_layout

    table = nci_table().iloc[:60]
    table.to_csv(tmp_path / "mols.csv", index=False)
    write_ogb_layout(tmp_path / "ogb", "ogbg-molesol", table.smiles.tolist(), table.tpsa)
    # write_ogb_layout's split: the first 80% train, the next 10% valid, the rest test.
    split = {"train": list(range(48)), "valid": list(range(48, 54)), "test": list(range(54, 60))}
    (tmp_path / "split.json").write_text(json.dumps(split))
    common = [*TINY, "trainer.max_epochs=2"]
    csv = train_config(
        compose_train(
            [
                *common,
                "dataset=smiles_csv",
                f"dataset.path={tmp_path / 'mols.csv'}",
                "dataset.targets=[tpsa]",
                f"dataset.split_file={tmp_path / 'split.json'}",
                f"dataset.root={tmp_path / 'cache'}",
                f"output_dir={tmp_path / 'csv'}",
            ]
        )
    )
    ogb = train_config(
        compose_train(
            [
                *common,
                "dataset=ogbg-molesol",
                f"dataset.root={tmp_path / 'ogb'}",
                f"output_dir={tmp_path / 'ogb_run'}",
            ]
        )
    )
    assert set(ogb["test"]) == set(csv["test"]) == {"rmse", "atom_mae", "atom_rmse"}
    assert set(ogb["valid"]) == set(csv["valid"]) == {"rmse", "atom_mae", "atom_rmse"}
    for split_name in ("valid", "test"):
        for key, value in csv[split_name].items():
            assert math.isclose(ogb[split_name][key], value, rel_tol=1e-6), (split_name, key)
