"""Atom-level targets (issue #18): Gasteiger partial charges of real NCI molecules, computed
offline with rdkit, read from a SMILES CSV, trained, evaluated and checked for permutation
equivariance, missing labels, row alignment and malformed cells."""

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from rdkit import Chem, RDLogger
from rdkit.Chem import rdPartialCharges

from graphormer.data import GraphormerCollator
from graphormer.data.featurize import featurize_smiles
from graphormer.data.sources.smiles_csv import SmilesCsvSource
from graphormer.data.tasks import ATOM
from graphormer.errors import ConfigError, DataError
from graphormer.models import Graphormer, GraphormerConfig
from graphormer.training import GraphormerModule
from graphormer.training.module import masked_loss

from helpers import (
    csv_train_config,
    explain_item_values,
    fine_tune_into_items,
    fit_item_ensemble,
    nci_smiles,
    predict_item_column,
    train_config,
)

# Molecules of at most this many atoms keep the tests fast.
_MAX_ATOMS = 40

# A run's targets: the Gasteiger charges alone, no molecule target.
CHARGES = ["dataset.targets=[]", "dataset.atom_targets=[charge]"]


def _charges(smiles: str) -> list[float] | None:
    mol = Chem.MolFromSmiles(smiles)
    rdPartialCharges.ComputeGasteigerCharges(mol)
    values = [a.GetDoubleProp("_GasteigerCharge") for a in mol.GetAtoms()]
    return values if all(math.isfinite(v) for v in values) else None


def _cell(values) -> str:
    return "[" + ", ".join("nan" if v != v else f"{v:.4f}" for v in values) + "]"


def charge_table(count: int) -> pd.DataFrame:
    """``smiles`` and ``charge`` (Gasteiger charges, a list per molecule) of NCI molecules."""
    RDLogger.DisableLog("rdApp.*")
    rows = []
    for smiles in nci_smiles():
        if Chem.MolFromSmiles(smiles).GetNumAtoms() > _MAX_ATOMS:
            continue
        charges = _charges(smiles)
        if charges is not None:
            rows.append({"smiles": smiles, "charge": _cell(charges)})
        if len(rows) == count:
            break
    return pd.DataFrame(rows)


def _source(path, **kwargs) -> SmilesCsvSource:
    values = {"targets": [], "atom_targets": ["charge"], "root": str(path.parent / "data")}
    return SmilesCsvSource(str(path), **{**values, **kwargs})


@pytest.fixture(scope="module")
def charge_run(tmp_path_factory):
    """One tiny model trained on the Gasteiger charges of 400 NCI molecules (atoms alone)."""
    work = tmp_path_factory.mktemp("atoms")
    csv = work / "charges.csv"
    charge_table(400).to_csv(csv, index=False)
    cfg = csv_train_config(
        csv, work, *CHARGES, "trainer.max_epochs=8", "logger=csv", "optim.lr=2e-3"
    )
    return work, csv, train_config(cfg)


def _split_atoms(csv, work, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Elements and charges of every atom of ``split``, as training split the CSV."""
    loaded = _source(csv, root=str(work / "data")).load()
    table = pd.read_csv(csv)
    elements, charges = [], []
    for graph in loaded.split[split].tolist():
        row = int(loaded.dataset.row[graph])
        mol = Chem.MolFromSmiles(table.smiles[row])
        elements += [a.GetSymbol() for a in mol.GetAtoms()]
        charges += json.loads(table.charge[row])
    return np.array(elements), np.array(charges)


def test_atom_training_beats_the_per_element_mean(charge_run):
    work, csv, results = charge_run
    assert results["metric"] == "atom_mae"
    assert set(results["test"]) == {"atom_mae", "atom_rmse"}
    assert set(results["valid"]) == {"atom_mae", "atom_rmse"}
    elements, charges = _split_atoms(csv, work, "train")
    means = {e: charges[elements == e].mean() for e in set(elements)}
    test_elements, test_charges = _split_atoms(csv, work, "test")
    baseline = np.array([means.get(e, charges.mean()) for e in test_elements])
    baseline_mae = float(np.abs(baseline - test_charges).mean())
    # Measured: 0.078 for the per-element mean, 0.03-0.035 for the tiny model after 8 epochs.
    assert results["test"]["atom_mae"] < 0.6 * baseline_mae, (results["test"], baseline_mae)


def test_eval_reproduces_every_level_of_training(charge_run, tmp_path):
    from graphormer.training.evaluation import evaluate

    _, _, results = charge_run
    found = evaluate(results["best_checkpoint"], split="all", output=tmp_path / "eval.json")
    for split in ("valid", "test"):
        for name in ("atom_mae", "atom_rmse"):
            assert found[split][name] == pytest.approx(results[split][name], rel=1e-5)


def test_epoch_lines_and_logs_show_the_atom_level(charge_run):
    work, _, _ = charge_run
    logged = pd.concat(pd.read_csv(f) for f in (work / "run").rglob("metrics.csv"))
    assert {"val/atom_mae", "val/atom_rmse", "test/atom_mae"} <= set(logged.columns)


def _permuted(graph, perm: torch.Tensor):
    """``graph`` with its atoms renumbered: new atom i is old atom ``perm[i]``."""
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(len(perm))
    out = graph.clone()
    out.x = graph.x[perm]
    out.edge_index = inverse[graph.edge_index]
    return out


def test_permuting_the_atoms_permutes_the_atom_predictions(charge_run):
    _, _, results = charge_run
    module = GraphormerModule.from_checkpoint(results["best_checkpoint"])
    graph = featurize_smiles(["CC(=O)Nc1ccc(O)cc1"]).graphs[0]
    perm = torch.randperm(graph.num_nodes, generator=torch.Generator().manual_seed(0))
    collate = GraphormerCollator(max_hops=module.config.hops_needed)
    with torch.no_grad():
        plain = module.model.forward_levels(collate([graph]))["atom"][0]
        shuffled = module.model.forward_levels(collate([_permuted(graph, perm)]))["atom"][0]
    assert torch.allclose(shuffled, plain[perm], atol=1e-5)
    # And the model learnt the chemistry: the carbonyl O is more negative than the methyl C.
    charges = module.level_units(ATOM, plain)[:, 0]
    assert charges[3] < charges[0]


def test_a_molecule_model_is_unchanged_by_the_atom_head_option():
    sizes = {"num_layers": 1, "hidden_dim": 16, "ffn_dim": 16, "num_heads": 2}
    plain = Graphormer(GraphormerConfig(**sizes)).eval()
    assert not any(name.startswith("atom_head") for name in plain.state_dict())
    both = Graphormer(GraphormerConfig(**sizes, atom_tasks=2)).eval()
    missing, unexpected = both.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and all(name.startswith("atom_head.") for name in missing)
    batch = GraphormerCollator(max_hops=5)(featurize_smiles(["CCO", "c1ccccc1"]).graphs)
    with torch.no_grad():
        out = both.forward_levels(batch)
        assert torch.equal(both(batch), plain(batch))
        assert torch.equal(out["molecule"], plain(batch))
    assert out["atom"].shape == (2, 6, 2)
    alone = Graphormer(GraphormerConfig(**sizes, num_tasks=0, atom_tasks=1))
    assert alone.head is None and alone.forward_levels(batch)["molecule"].shape == (2, 0)
    with pytest.raises(ValueError, match="num_tasks"):
        GraphormerConfig(num_tasks=0)


def _write(tmp_path, rows: list[dict]):
    path = tmp_path / "atoms.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def _rows(count: int = 12) -> list[dict]:
    table = charge_table(count)
    return [{"smiles": s, "charge": c} for s, c in zip(table.smiles, table.charge, strict=True)]


def test_rows_order_and_missing_labels(tmp_path):
    rows = _rows()
    rows.insert(2, {"smiles": "not a smiles", "charge": "[0.1]"})  # skipped, rows stay aligned
    rows[4]["charge"] = ""  # an unlabelled molecule
    first = json.loads(rows[5]["charge"])
    rows[5]["charge"] = _cell([float("nan"), *first[1:]])  # one unlabelled atom
    path = _write(tmp_path, rows)
    with pytest.warns(UserWarning, match="skipped 1 row"):
        dataset = _source(path, split="random").load().dataset
    for graph_index in range(len(dataset)):
        graph = dataset[graph_index]
        row = int(graph.row)
        assert graph.y.shape == (1, 0) and graph.y_atom.shape == (graph.num_nodes, 1)
        if row == 4:
            assert torch.isnan(graph.y_atom).all()
        elif row == 5:
            assert torch.isnan(graph.y_atom[0, 0]) and not torch.isnan(graph.y_atom[1:]).any()
            assert graph.y_atom[1:, 0].tolist() == pytest.approx(first[1:], abs=1e-6)
        else:
            assert graph.y_atom[:, 0].tolist() == pytest.approx(
                json.loads(rows[row]["charge"]), abs=1e-6
            )
    # The collator pads with NaN labels, so padding never counts in a loss.
    batch = GraphormerCollator(max_hops=5)([dataset[0], dataset[3], dataset[4]])
    assert torch.isnan(batch.y_atom[~batch.node_mask]).all()
    pred = torch.randn(batch.y_atom.shape)
    labelled = ~torch.isnan(batch.y_atom)
    expected = ((pred - batch.y_atom)[labelled] ** 2).mean()
    got = masked_loss(pred.flatten(0, 1), batch.y_atom.flatten(0, 1), "mse")
    assert torch.allclose(got, expected)


def test_a_list_of_the_wrong_length_names_row_column_and_counts(tmp_path):
    rows = _rows()
    values = json.loads(rows[3]["charge"])
    rows[3]["charge"] = _cell(values[:-1])
    with pytest.raises(DataError) as error:
        _source(_write(tmp_path, rows)).load()
    message = str(error.value)
    assert "'charge'" in message and "row 3" in message
    assert f"{len(values) - 1} value(s)" in message and f"has {len(values)} atoms" in message


@pytest.mark.parametrize("cell", ["0.1, 0.2", "[0.1, abc]", "[0.1,, 0.2]", "[inf, 0.1]"])
def test_a_malformed_list_cell_is_one_clear_error(tmp_path, cell):
    rows = _rows()
    rows[6]["charge"] = cell
    with pytest.raises(DataError, match=r"'charge' .* at row 6 .* not a list of numbers"):
        _source(_write(tmp_path, rows)).load()


def test_binary_atom_labels_must_be_zero_or_one(tmp_path):
    rows = _rows()
    with pytest.raises(DataError, match="atom_task_type=binary"):
        _source(_write(tmp_path, rows), atom_task_type="binary").load()
    with pytest.raises(ConfigError, match="atom_task_type"):
        _source(_write(tmp_path, rows), atom_task_type="multiclass").task_info()
    with pytest.raises(ConfigError, match="dataset.targets is empty"):
        SmilesCsvSource(str(tmp_path / "atoms.csv"), targets=[])


def test_monitor_must_name_a_metric_of_the_task(tmp_path):
    from graphormer.training.run import monitor_key

    task = _source(_write(tmp_path, _rows())).task_info()
    assert task.monitor == "val/atom_mae" and not task.higher_is_better
    assert monitor_key("atom_rmse", task) == "val/atom_rmse"
    with pytest.raises(ConfigError, match="val/atom_mae, val/atom_rmse"):
        monitor_key("val/rmse", task)


def test_fine_tuning_a_molecule_model_into_atom_targets(tmp_path):
    """A molecule-level run, then a run of molecule and atom targets together initialised from
    it: the encoder is copied, the new heads initialised, and the report says so."""
    table = charge_table(60)
    table["heavy"] = [Chem.MolFromSmiles(s).GetNumAtoms() for s in table.smiles]
    csv = tmp_path / "both.csv"
    table.to_csv(csv, index=False)
    atoms = SmilesCsvSource(str(csv), targets=[], atom_targets=["charge"]).task_info()
    both, report = fine_tune_into_items(
        csv, tmp_path, "atom", ["dataset.atom_targets=[charge]"], atoms
    )
    # Both levels are trained, scored and written; the molecule level selects by default.
    assert both["metric"] == "rmse"
    assert set(both["test"]) == {"rmse", "atom_mae", "atom_rmse"}
    # Into atom targets alone: the molecule head is left out.
    assert report.unused_head == sorted(
        f"model.{m}.{p}" for m in ("head_norm", "head_transform") for p in ("bias", "weight")
    )


def test_predictor_writes_atom_lists_and_long_tables(charge_run):
    from graphormer.inference import Predictor

    _, _, results = charge_run
    predictor = Predictor.from_checkpoint(results["best_checkpoint"], device="cpu")
    smiles = ["CC(=O)Nc1ccc(O)cc1", "not a smiles", "OCC"]
    with pytest.warns(UserWarning, match="1 of 3 molecules"):
        wide = predictor.predict(smiles)
    assert list(wide.columns) == ["smiles", "charge", "error"]
    module = GraphormerModule.from_checkpoint(results["best_checkpoint"])
    for row in (0, 2):
        listed = json.loads(wide.charge[row])
        graph = featurize_smiles([smiles[row]]).graphs[0]
        with torch.no_grad():
            atoms = module.forward_levels(GraphormerCollator(max_hops=5)([graph]))["atom"][0]
        assert len(listed) == Chem.MolFromSmiles(smiles[row]).GetNumAtoms()
        assert listed == pytest.approx(atoms[:, 0].tolist(), abs=1e-5)
    assert pd.isna(wide.charge[1]) and "whitespace" in wide.error[1]

    with pytest.warns(UserWarning, match="1 of 3 molecules"):
        long = predictor.predict(smiles, layout="long")
    assert list(long.columns) == ["row", "atom_index", "element", "charge", "error"]
    first = long[long.row == 0]
    assert first.atom_index.tolist() == list(range(11))
    assert first.element.tolist() == [
        a.GetSymbol() for a in Chem.MolFromSmiles(smiles[0]).GetAtoms()
    ]
    assert first.charge.tolist() == pytest.approx(json.loads(wide.charge[0]), abs=1e-5)
    failed = long[long.row == 1]
    assert len(failed) == 1 and pd.isna(failed.atom_index.iloc[0]) and failed.error.iloc[0]
    with pytest.raises(ConfigError, match="layout"):
        predictor.predict(smiles, layout="tall")


def test_predict_script_writes_atom_columns(charge_run, tmp_path):
    _, csv, results = charge_run
    truth, predicted = predict_item_column(results["best_checkpoint"], csv, tmp_path, "charge")
    assert np.abs(truth - predicted).mean() < 0.06


def test_an_ensemble_of_atom_models_scores_its_mean_with_spread_and_intervals(tmp_path):
    csv = tmp_path / "charges.csv"
    charge_table(120).to_csv(csv, index=False)
    found = fit_item_ensemble(csv, tmp_path, CHARGES, "atom_mae")
    assert set(found["test"]) == {"atom_mae", "atom_rmse", "num_graphs"}
    members = [m["test"]["atom_mae"] for m in found["members"]]
    # The mean of two members is no worse than the worse of them (the MAE is convex).
    assert found["test"]["atom_mae"] <= max(members) + 1e-6
    report = found["uncertainty"]["valid"]["atom"]
    assert report["interval_scores"] == "normalized"  # the members' spread scales them
    assert -1 <= report["std_error_spearman"]["charge"] <= 1
    # Split-conformal intervals on the split they were fitted on cover at least their level.
    for level, tasks in report["intervals"].items():
        assert tasks["charge"]["coverage"] >= float(level) - 1e-9
        assert tasks["charge"]["mean_width"] > 0
    assert "charge" in found["uncertainty"]["test"]["atom"]["intervals"]["0.9"]
    # predict.py: per atom, the members' mean, their spread and the calibrated interval.
    from helpers import call_script

    out = tmp_path / "wide.csv"
    args = [f"ckpt={tmp_path / 'run'}", f"input={csv}", "device=cpu", "interval=0.9"]
    call_script("predict.py", [*args, f"output={out}"], cwd=tmp_path)
    wide = pd.read_csv(out)
    names = ["charge_pred", "charge_std", "charge_lower", "charge_upper"]
    assert list(wide.columns) == ["smiles", "charge", *names, "error"]
    value, std, lower, upper = (np.concatenate([json.loads(c) for c in wide[n]]) for n in names)
    assert len(value) == len(std) == len(lower) == sum(len(json.loads(c)) for c in wide.charge)
    assert (std > 0).all() and (lower <= value).all() and (value <= upper).all()
    long = tmp_path / "long.csv"
    call_script("predict.py", [*args, f"output={long}", "layout=long"], cwd=tmp_path)
    rows = pd.read_csv(long)
    assert rows.charge_std.to_numpy() == pytest.approx(std, abs=1e-5)
    assert rows.charge_upper.to_numpy() == pytest.approx(upper, abs=1e-5)
    # Loosely: the 90% intervals hold most of the molecules' true charges.
    truth = np.concatenate([json.loads(c) for c in wide.charge])
    assert ((truth >= lower) & (truth <= upper)).mean() > 0.7


def test_mc_dropout_gives_an_atom_model_a_reproducible_spread_and_intervals(tmp_path):
    from graphormer.cli.train import settings_from
    from graphormer.inference import Predictor
    from graphormer.training.experiment import fit

    csv = tmp_path / "charges.csv"
    charge_table(60).to_csv(csv, index=False)
    cfg = csv_train_config(
        csv, tmp_path, *CHARGES, "trainer.max_epochs=1", "~logger", "model.dropout=0.1"
    )
    fit(settings_from(cfg))  # the run, then its calibration (the atoms' residuals)
    predictor = Predictor.from_checkpoint(tmp_path / "run", device="cpu", mc_dropout=3)
    smiles = ["CCO", "c1ccccc1O"]
    first, again = (predictor.run(smiles, interval=0.9) for _ in range(2))
    std = first.item_extras["atom"]["std"]
    assert [len(s) for s in std] == [3, 7] and all((s > 0).all() for s in std)
    for a, b in zip(std, again.item_extras["atom"]["std"], strict=True):
        assert np.array_equal(a, b)  # seeded passes: the same input, the same spread
    lower, upper = first.item_extras["atom"]["lower"], first.item_extras["atom"]["upper"]
    for values, low, high in zip(first.atoms, lower, upper, strict=True):
        assert (low < values).all() and (values < high).all()


def test_cross_validation_of_an_atom_model_scores_each_fold_by_its_atoms(tmp_path):
    from graphormer.cli.train import settings_from
    from graphormer.training.experiment import fit

    csv = tmp_path / "charges.csv"
    charge_table(90).to_csv(csv, index=False)
    cfg = csv_train_config(csv, tmp_path, *CHARGES, "cv.folds=3", "trainer.max_epochs=1", "~logger")
    summary = fit(settings_from(cfg))
    assert summary["metric"] == "atom_mae" and summary["test"]["n"] == 3
    folds = [
        json.loads((tmp_path / "run" / r["folder"] / "metrics.json").read_text())
        for r in summary["folds"]
    ]
    maes = [f["test"]["atom_mae"] for f in folds]
    assert summary["test"]["mean"] == pytest.approx(np.mean(maes))
    assert "atom_rmse" in summary["reported"]


def test_explain_colours_atoms_by_their_predicted_values(charge_run, tmp_path):
    from graphormer.inference.pictures import atom_value_colours

    _, _, results = charge_run
    explain_item_values(
        results["best_checkpoint"], "CC(=O)Nc1ccc(O)cc1", "atom", "charge", tmp_path
    )
    # Signed values: a diverging map centred on zero (white), blue below, red above.
    rgb, scale, signed = atom_value_colours(np.array([-0.4, 0.0, 0.2]))
    assert signed and scale == pytest.approx(0.4)
    assert rgb[1].tolist() == [1.0, 1.0, 1.0]
    assert rgb[0][2] > rgb[0][0] and rgb[2][0] > rgb[2][2]
