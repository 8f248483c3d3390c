"""Bond-level targets (issue #18): RDKit's rotatable bonds of real NCI molecules as a binary bond
target, read from a SMILES CSV in RDKit's bond order, trained, evaluated, predicted and drawn;
the bond head's order independence, missing labels, row alignment and malformed cells."""

import json

import numpy as np
import pandas as pd
import pytest
import torch
from rdkit import Chem
from sklearn.metrics import roc_auc_score

from graphormer.data import GraphormerCollator
from graphormer.data.featurize import featurize_smiles, molecule_bond_edges
from graphormer.data.sources.smiles_csv import SmilesCsvSource
from graphormer.data.tasks import TaskInfo
from graphormer.errors import ConfigError, DataError
from graphormer.models import Graphormer, GraphormerConfig
from graphormer.models.heads import BondHead
from graphormer.testing import nci_rotatable_bonds
from graphormer.training import GraphormerModule
from graphormer.training.module import masked_loss

from helpers import (
    csv_train_config,
    explain_item_values,
    fine_tune_into_items,
    fit_item_ensemble,
    predict_item_column,
    train_config,
)

# A run's targets: the rotatable bonds alone, no molecule target.
ROTATABLE = [
    "dataset.targets=[]",
    "dataset.bond_targets=[rotatable]",
    "dataset.bond_task_type=binary",
]


def _source(path, **kwargs) -> SmilesCsvSource:
    values = {
        "targets": [],
        "bond_targets": ["rotatable"],
        "bond_task_type": "binary",
        "root": str(path.parent / "data"),
    }
    return SmilesCsvSource(str(path), **{**values, **kwargs})


@pytest.fixture(scope="module")
def bond_run(tmp_path_factory):
    """One tiny model trained on the rotatable bonds of 300 NCI molecules (bonds alone)."""
    work = tmp_path_factory.mktemp("bonds")
    csv = work / "rotatable.csv"
    nci_rotatable_bonds(300).drop(columns=["bond_type", "heavy"]).to_csv(csv, index=False)
    cfg = csv_train_config(
        csv,
        work,
        *ROTATABLE,
        "trainer.max_epochs=4",
        "logger=csv",
        "optim.lr=2e-3",
        # 32 updates, a third of the weight average's horizon at 0.99: the average would be
        # the mean of the whole run (0.92 here, against 0.99 for the weights themselves).
        "optim.ema_decay=null",
    )
    return work, csv, train_config(cfg)


def _split_bonds(csv, work, split: str) -> tuple[np.ndarray, np.ndarray]:
    """RDKit bond types and rotatable labels of every bond of ``split``, as training split."""
    loaded = _source(csv, root=str(work / "data")).load()
    table = pd.read_csv(csv)
    types, labels = [], []
    for graph in loaded.split[split].tolist():
        row = int(loaded.dataset.row[graph])
        types += [str(b.GetBondType()) for b in Chem.MolFromSmiles(table.smiles[row]).GetBonds()]
        labels += json.loads(table.rotatable[row])
    return np.array(types), np.array(labels)


def test_bond_training_beats_the_per_bond_type_rate(bond_run):
    work, csv, results = bond_run
    assert results["metric"] == "bond_rocauc"
    assert set(results["test"]) == {"bond_rocauc"} and set(results["valid"]) == {"bond_rocauc"}
    types, labels = _split_bonds(csv, work, "train")
    rates = {t: labels[types == t].mean() for t in set(types)}
    test_types, test_labels = _split_bonds(csv, work, "test")
    baseline = roc_auc_score(test_labels, [rates.get(t, labels.mean()) for t in test_types])
    # Only single bonds rotate, so the bond type alone ranks well (0.84 here); which single bonds
    # rotate depends on ring membership and the neighbours' degrees, which the model reads from
    # the atoms' states. Measured: 0.84 for the per-type rate, 0.99 for the tiny model (4 epochs).
    assert results["test"]["bond_rocauc"] > baseline + 0.1, (results["test"], baseline)


def test_eval_reproduces_every_level_of_training(bond_run, tmp_path):
    from graphormer.training.evaluation import evaluate

    _, _, results = bond_run
    found = evaluate(results["best_checkpoint"], split="all", output=tmp_path / "eval.json")
    for split in ("valid", "test"):
        assert found[split]["bond_rocauc"] == pytest.approx(results[split]["bond_rocauc"], rel=1e-6)


def test_epoch_lines_and_logs_show_the_bond_level(bond_run):
    work, _, _ = bond_run
    logged = pd.concat(pd.read_csv(f) for f in (work / "run").rglob("metrics.csv"))
    assert {"val/bond_rocauc", "test/bond_rocauc"} <= set(logged.columns)


def _bond_graph(smiles: str):
    graph = featurize_smiles([smiles]).graphs[0]
    graph.bond_edge = molecule_bond_edges(graph)
    return graph


def _bond_predictions(module, graphs) -> torch.Tensor:
    batch = GraphormerCollator(max_hops=5)(graphs)
    with torch.no_grad():
        return module.forward_levels(batch)["bond"]  # [B, M, 1]


def test_permuting_atoms_and_swapping_bond_ends_keep_the_bond_predictions(bond_run):
    _, _, results = bond_run
    module = GraphormerModule.from_checkpoint(results["best_checkpoint"])
    graph = _bond_graph("CC(=O)Nc1ccc(OCC)cc1")
    perm = torch.randperm(graph.num_nodes, generator=torch.Generator().manual_seed(0))
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(len(perm))
    permuted = graph.clone()
    permuted.x = graph.x[perm]
    permuted.edge_index = inverse[graph.edge_index]  # the same bonds, their atoms renumbered
    swapped = graph.clone()
    swapped.bond_edge = graph.bond_edge + 1  # edge 2k+1: bond k read from its end atom
    out = _bond_predictions(module, [graph, permuted, swapped])
    assert torch.allclose(out[1], out[0], atol=1e-5)
    assert torch.allclose(out[2], out[0], atol=1e-6)
    # The prediction is of the bond, not of an atom: bonds of the same atoms differ.
    assert out[0].std() > 0.05


def test_the_bond_head_is_symmetric_in_its_two_atoms():
    head = BondHead(hidden_dim=8, num_tasks=2, bond_feature_dims=[5, 3])
    torch.nn.init.normal_(head.pair.weight)  # a head far from its small initialisation
    h = torch.randn(2, 4, 8)
    ends = torch.tensor([[[0, 1], [2, 3], [1, 3]], [[3, 0], [0, 0], [2, 1]]])
    attr = torch.randint(0, 3, (2, 3, 2))
    forward, backward = head(h, ends, attr), head(h, ends.flip(-1), attr)
    assert forward.shape == (2, 3, 2) and torch.equal(forward, backward)
    assert not torch.allclose(forward, head(h, ends, (attr + 1) % 3))  # the bond's features count


def test_a_molecule_model_is_unchanged_by_the_bond_head_option():
    sizes = {"num_layers": 1, "hidden_dim": 16, "ffn_dim": 16, "num_heads": 2}
    plain = Graphormer(GraphormerConfig(**sizes)).eval()
    assert not any(name.startswith("bond_head") for name in plain.state_dict())
    both = Graphormer(GraphormerConfig(**sizes, bond_tasks=2)).eval()
    missing, unexpected = both.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and missing and all(n.startswith("bond_head.") for n in missing)
    graphs = [_bond_graph("CCO"), _bond_graph("c1ccccc1"), _bond_graph("[Na+]")]
    batch = GraphormerCollator(max_hops=5)(graphs)
    with torch.no_grad():
        out = both.forward_levels(batch)
        assert torch.equal(out["molecule"], plain(batch))
    assert out["bond"].shape == (3, 6, 2)
    assert batch.bond_mask.sum(1).tolist() == [2, 6, 0]
    alone = Graphormer(GraphormerConfig(**sizes, num_tasks=0, bond_tasks=1))
    assert alone.head is None and alone.forward_levels(batch)["molecule"].shape == (3, 0)
    estimated = GraphormerConfig(**sizes, bond_tasks=2).estimated_parameters()
    assert estimated == sum(p.numel() for p in both.parameters())
    # A molecule task stores no bond fields: its checkpoints keep exactly their settings.
    assert "bond_tasks" not in TaskInfo("t", "regression", 1, "rmse").to_dict()


def _write(tmp_path, rows: list[dict]):
    path = tmp_path / "bonds.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def _rows(count: int = 12) -> list[dict]:
    table = nci_rotatable_bonds(count)
    return [
        {"smiles": s, "rotatable": r} for s, r in zip(table.smiles, table.rotatable, strict=True)
    ]


def test_rows_order_and_missing_labels(tmp_path):
    rows = _rows()
    rows.insert(2, {"smiles": "not a smiles", "rotatable": "[1]"})  # skipped, rows stay aligned
    rows[4]["rotatable"] = ""  # an unlabelled molecule
    first = json.loads(rows[5]["rotatable"])
    rows[5]["rotatable"] = "[nan, " + ", ".join(map(str, first[1:])) + "]"  # one unlabelled bond
    path = _write(tmp_path, rows)
    with pytest.warns(UserWarning, match="skipped 1 row"):
        dataset = _source(path, split="random").load().dataset
    for graph_index in range(len(dataset)):
        graph = dataset[graph_index]
        row = int(graph.row)
        mol = Chem.MolFromSmiles(rows[row]["smiles"])
        assert graph.y.shape == (1, 0) and graph.y_bond.shape == (mol.GetNumBonds(), 1)
        # Bond k of RDKit is edge 2k of smiles2graph, from its begin to its end atom.
        ends = graph.edge_index[:, graph.bond_edge].t().tolist()
        assert ends == [[b.GetBeginAtomIdx(), b.GetEndAtomIdx()] for b in mol.GetBonds()]
        if row == 4:
            assert torch.isnan(graph.y_bond).all()
        elif row == 5:
            assert torch.isnan(graph.y_bond[0, 0]) and not torch.isnan(graph.y_bond[1:]).any()
            assert graph.y_bond[1:, 0].tolist() == first[1:]
        else:
            assert graph.y_bond[:, 0].tolist() == json.loads(rows[row]["rotatable"])
    # The collator pads with NaN labels, so padding never counts in a loss; its bond ends are
    # the atoms' positions in each graph.
    picked = [dataset[0], dataset[3], dataset[4]]
    batch = GraphormerCollator(max_hops=5)(picked)
    assert torch.isnan(batch.y_bond[~batch.bond_mask]).all()
    for b, graph in enumerate(picked):
        count = len(graph.bond_edge)
        assert batch.bond_mask[b].sum() == count
        assert torch.equal(batch.bond_atoms[b, :count], graph.edge_index[:, graph.bond_edge].t())
        assert torch.equal(batch.edge_attr[batch.bond_edge[b, :count]], graph.edge_attr[0::2])
    pred = torch.randn(batch.y_bond.shape)
    labelled = ~torch.isnan(batch.y_bond)
    expected = torch.nn.functional.binary_cross_entropy_with_logits(
        pred[labelled], batch.y_bond[labelled]
    )
    got = masked_loss(pred.flatten(0, 1), batch.y_bond.flatten(0, 1), "bce")
    assert torch.allclose(got, expected)


def test_caches_made_before_bond_targets_keep_their_key(tmp_path):
    path = _write(tmp_path, [{**r, "heavy": 1.0} for r in _rows()])
    plain = SmilesCsvSource(str(path), targets=["heavy"], root=str(tmp_path / "data"))
    bonds = _source(path, targets=["heavy"])
    plain_folder = plain.load().dataset.processed_dir
    assert bonds.load().dataset.processed_dir != plain_folder
    # The key of a molecule-only cache is the one it had before bond targets (made from these
    # settings as that version read them), so existing caches are found again.
    import hashlib

    digest = hashlib.sha1(path.read_bytes())
    digest.update(json.dumps(["smiles", ["heavy"], None, None]).encode())
    assert f"_{digest.hexdigest()[:12]}" in plain_folder


def test_a_list_of_the_wrong_length_names_row_column_and_counts(tmp_path):
    rows = _rows()
    values = json.loads(rows[3]["rotatable"])
    rows[3]["rotatable"] = "[" + ", ".join(map(str, values + [0])) + "]"
    with pytest.raises(DataError) as error:
        _source(_write(tmp_path, rows)).load()
    message = str(error.value)
    assert message.startswith("bond target column 'rotatable'") and "row 3" in message
    assert f"{len(values) + 1} value(s)" in message and f"has {len(values)} bonds" in message


@pytest.mark.parametrize("cell", ["0, 1", "[0, yes]", "[0,, 1]", "[inf, 0]"])
def test_a_malformed_list_cell_is_one_clear_error(tmp_path, cell):
    rows = _rows()
    rows[6]["rotatable"] = cell
    with pytest.raises(DataError, match=r"bond target column 'rotatable' .* at row 6 .* per bond"):
        _source(_write(tmp_path, rows)).load()


def test_binary_bond_labels_must_be_zero_or_one(tmp_path):
    rows = _rows()
    rows[2]["rotatable"] = "[" + ", ".join(["0.5"] * len(json.loads(rows[2]["rotatable"]))) + "]"
    with pytest.raises(DataError, match="bond_task_type=binary"):
        _source(_write(tmp_path, rows)).load()
    with pytest.raises(ConfigError, match="bond_task_type"):
        _source(_write(tmp_path, rows), bond_task_type="multiclass").task_info()


def test_monitor_names_bond_metrics_and_defaults_to_the_first_level(tmp_path):
    from graphormer.training.run import monitor_key

    path = _write(tmp_path, [{**r, "heavy": 1.0} for r in _rows()])
    task = _source(path).task_info()
    assert task.monitor == "val/bond_rocauc" and task.higher_is_better
    both = _source(path, targets=["heavy"], bond_task_type="regression").task_info()
    assert both.level_metrics == ("rmse", "bond_mae", "bond_rmse") and both.monitor == "val/rmse"
    assert monitor_key("bond_mae", both) == "val/bond_mae"
    assert not both.metric_higher_is_better("bond_mae")
    with pytest.raises(ConfigError, match="val/rmse, val/bond_mae, val/bond_rmse"):
        monitor_key("val/bond_rocauc", both)


def test_fine_tuning_a_molecule_model_into_bond_targets(tmp_path):
    """A molecule-level run, then a run of molecule and bond targets initialised from it; then
    bonds alone: the encoder is copied, the new head initialised, and the report says so."""
    csv = tmp_path / "both.csv"
    nci_rotatable_bonds(60).drop(columns=["bond_type"]).to_csv(csv, index=False)
    both, _ = fine_tune_into_items(
        csv, tmp_path, "bond", ROTATABLE[1:], _source(csv).task_info(), "monitor=bond_rocauc"
    )
    assert both["metric"] == "bond_rocauc"
    assert set(both["test"]) == {"rmse", "bond_rocauc"}


def test_predictor_writes_bond_lists_and_long_tables(bond_run):
    from graphormer.inference import Predictor

    _, _, results = bond_run
    predictor = Predictor.from_checkpoint(results["best_checkpoint"], device="cpu")
    smiles = ["CC(=O)Nc1ccc(OCC)cc1", "not a smiles", "OCC"]
    with pytest.warns(UserWarning, match="1 of 3 molecules"):
        wide = predictor.predict(smiles)
    assert list(wide.columns) == ["smiles", "rotatable", "error"]
    module = GraphormerModule.from_checkpoint(results["best_checkpoint"])
    for row in (0, 2):
        listed = json.loads(wide.rotatable[row])
        bonds = torch.sigmoid(_bond_predictions(module, [_bond_graph(smiles[row])])[0, :, 0])
        assert len(listed) == Chem.MolFromSmiles(smiles[row]).GetNumBonds()
        assert listed == pytest.approx(bonds.tolist(), abs=1e-5)
    assert pd.isna(wide.rotatable[1]) and wide.error[1]

    with pytest.warns(UserWarning, match="1 of 3 molecules"):
        long = predictor.predict(smiles, layout="long")
    columns = ["row", "bond_index", "begin_atom", "end_atom", "bond_type", "rotatable", "error"]
    assert list(long.columns) == columns
    first = long[long.row == 0]
    mol = Chem.MolFromSmiles(smiles[0])
    assert first.bond_index.tolist() == list(range(mol.GetNumBonds()))
    assert first.begin_atom.tolist() == [b.GetBeginAtomIdx() for b in mol.GetBonds()]
    assert first.end_atom.tolist() == [b.GetEndAtomIdx() for b in mol.GetBonds()]
    assert first.bond_type.tolist() == [str(b.GetBondType()) for b in mol.GetBonds()]
    assert first.rotatable.tolist() == pytest.approx(json.loads(wide.rotatable[0]), abs=1e-5)
    failed = long[long.row == 1]
    assert len(failed) == 1 and pd.isna(failed.bond_index.iloc[0]) and failed.error.iloc[0]


def test_atom_and_bond_long_rows_are_stacked_with_a_level_column():
    from graphormer.inference import Predictor

    task = TaskInfo("t", "regression", 1, "rmse", None, 1, "regression", 1, "binary")
    model = {"num_layers": 1, "hidden_dim": 16, "ffn_dim": 16, "num_heads": 2}
    module = GraphormerModule(model=model, task=task.to_dict())
    predictor = Predictor(
        module, ["heavy"], device="cpu", atom_task_names=["charge"], bond_task_names=["rot"]
    )
    with pytest.warns(UserWarning, match="1 of 3 molecules"):
        wide = predictor.predict(["CCO", "bad", "c1ccccc1"])
    assert list(wide.columns) == ["smiles", "heavy", "charge", "rot", "error"]
    with pytest.warns(UserWarning, match="1 of 3 molecules"):
        long = predictor.predict(["CCO", "bad", "c1ccccc1"], layout="long")
    assert (
        long.level.tolist() == ["atom"] * 3 + ["bond"] * 2 + ["atom"] + ["atom"] * 6 + ["bond"] * 6
    )
    assert long.row.tolist() == [0] * 5 + [1] + [2] * 12
    ethanol = long[(long.row == 0) & (long.level == "bond")]
    assert ethanol.bond_index.tolist() == [0, 1] and ethanol.charge.isna().all()
    assert ethanol.rot.tolist() == pytest.approx(json.loads(wide.rot[0]), abs=1e-6)
    assert long[long.row == 1].error.iloc[0]


def test_molecules_without_bonds_keep_their_rows_in_long_tables():
    from graphormer.inference import Predictor

    model = {"num_layers": 1, "hidden_dim": 16, "ffn_dim": 16, "num_heads": 2}
    bonds = TaskInfo("t", "regression", 0, "rmse", None, 0, None, 1, "binary")
    predictor = Predictor(
        GraphormerModule(model=model, task=bonds.to_dict()),
        [],
        device="cpu",
        bond_task_names=["rot"],
    )
    long = predictor.predict(["CCO", "[Na+]", "O"], layout="long")
    # Ethanol's two bonds, then one row each for the ion and water: no bond, no error.
    assert long.row.tolist() == [0, 0, 1, 2]
    assert long.bond_index.isna().tolist() == [False, False, True, True]
    assert long.error.fillna("").eq("").all() and long.rot.isna().tolist()[2:] == [True, True]

    both = TaskInfo("t", "regression", 0, "rmse", None, 1, "regression", 1, "binary")
    predictor = Predictor(
        GraphormerModule(model=model, task=both.to_dict()),
        [],
        device="cpu",
        atom_task_names=["charge"],
        bond_task_names=["rot"],
    )
    long = predictor.predict(["CCO", "[Na+]"], layout="long")
    # The ion keeps its atom row and gets no empty bond row beside it.
    assert long.level.tolist() == ["atom"] * 3 + ["bond"] * 2 + ["atom"]
    assert long.row.tolist() == [0] * 5 + [1]


def test_predict_script_writes_bond_columns(bond_run, tmp_path):
    _, csv, results = bond_run
    truth, predicted = predict_item_column(results["best_checkpoint"], csv, tmp_path, "rotatable")
    assert roc_auc_score(truth, predicted) > 0.9


def test_an_ensemble_of_bond_models_scores_its_mean_probabilities(tmp_path):
    csv = tmp_path / "rotatable.csv"
    nci_rotatable_bonds(120).drop(columns=["bond_type", "heavy"]).to_csv(csv, index=False)
    found = fit_item_ensemble(csv, tmp_path, ROTATABLE, "bond_rocauc")
    assert set(found["test"]) == {"bond_rocauc", "num_graphs"}
    assert found["calibration"] is None  # binary bonds: no intervals, no probability map
    assert 0.5 < found["test"]["bond_rocauc"] <= 1
    # The mean probabilities' calibration error, per bond target.
    assert 0 <= found["uncertainty"]["test"]["bond"]["ece_before"]["rotatable"] <= 1
    # Predictions per bond: the members' mean probability and its spread.
    from graphormer.inference import Predictor

    predictor = Predictor.from_checkpoint(tmp_path / "run", device="cpu")
    smiles = pd.read_csv(csv).smiles[:6].tolist()
    wide = predictor.predict(smiles)
    assert list(wide.columns) == ["smiles", "rotatable", "rotatable_std", "error"]
    long = predictor.predict(smiles, layout="long")
    assert len(long) == sum(Chem.MolFromSmiles(s).GetNumBonds() for s in smiles)
    assert (long.rotatable_std >= 0).all() and long.rotatable_std.max() > 0
    assert long.rotatable.between(0, 1).all()
    with pytest.raises(ConfigError, match="interval"):
        predictor.run(smiles, interval=0.9)  # binary bonds: probabilities, no intervals


def test_explain_colours_bonds_by_their_predicted_values(bond_run, tmp_path):
    from graphormer.inference.pictures import draw_bond_values

    _, _, results = bond_run
    _, picture = explain_item_values(
        results["best_checkpoint"], "CC(=O)Nc1ccc(OCC)cc1", "bond", "rotatable", tmp_path
    )
    # Coloured bonds: the rotatable ones (high probabilities) are drawn in red (an uncoloured
    # drawing has black bonds and a few red oxygen letters, far fewer such pixels).
    reds = np.asarray(picture).astype(int)
    assert ((reds[..., 0] - reds[..., 2]) > 80).sum() > 200
    with pytest.raises(ValueError, match="3 values for the 13 bonds"):
        draw_bond_values("CC(=O)Nc1ccc(OCC)cc1", np.zeros(3), "rotatable")
