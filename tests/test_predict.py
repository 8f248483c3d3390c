"""Predictions, embeddings and errors of scripts/predict.py and graphormer.Predictor (issue 9)."""

import gzip
import json

import numpy as np
import pandas as pd
import pytest
import torch
from ogb.graphproppred import Evaluator
from PIL import Image
from rdkit import Chem

from graphormer import Predictor, checkpoint
from graphormer.cli.predict import run as predict
from graphormer.errors import UserFacingError
from graphormer.inference import featurize_smiles
from graphormer.inference.pictures import relative_to_uniform
from graphormer.training import GraphormerModule, build_datamodule

from helpers import (
    call_failing,
    call_script,
    compose_config,
    evaluate_run,
    model_preset,
    nci_smiles,
    untrained_checkpoint,
)

# train.py's run on OGB-layout ogbg-molhiv (tiny model, 3 epochs), as test_training uses it.

# OGB's own label columns of ogbg-moltox21 (its mapping/mol.csv.gz, before `smiles`, `mol_id`).
TOX21_TASKS = [
    "NR-AR",
    "NR-AR-LBD",
    "NR-AhR",
    "NR-Aromatase",
    "NR-ER",
    "NR-ER-LBD",
    "NR-PPAR-gamma",
    "SR-ARE",
    "SR-ATAD5",
    "SR-HSE",
    "SR-MMP",
    "SR-p53",
]
# Rows the script must keep in place: unparsable, empty, and too large for max_atoms=60.
INVALID = {3: "C1CC", 7: "", 8: "not_a_smiles", 12: "C" * 61}


def compose_predict(overrides):
    return compose_config("predict", overrides)


def ogb_test_split(root, name="ogbg-molhiv"):
    """The test molecules of an OGB-layout dataset: dataset indices, SMILES, labels ``[n, T]``."""
    folder = root / "_".join(name.split("-"))
    smiles = pd.read_csv(folder / "mapping" / "mol.csv.gz").smiles
    with gzip.open(folder / "split" / "scaffold" / "test.csv.gz", "rt") as f:
        index = pd.read_csv(f, header=None)[0].to_numpy()
    with gzip.open(folder / "raw" / "graph-label.csv.gz", "rt") as f:
        labels = pd.read_csv(f, header=None).to_numpy(dtype=float)
    return index, smiles[index].tolist(), labels[index]


def module_outputs_on_test_split(module):
    """The module run in-process over its datamodule's test loader, as eval.py runs it:
    {dataset index: (probabilities or values, graph-token final state)}."""
    data = module.hparams["data"]
    datamodule = build_datamodule(dict(data["dataset"]), dict(data["datamodule"]))
    datamodule.prepare_data()
    datamodule.setup("test")
    outputs = {}
    with torch.inference_mode():
        for batch in datamodule.test_dataloader():
            out = module(batch)
            if module.task.is_classification:
                out = torch.sigmoid(out)
            hidden, _ = module.model.encode(batch)
            for i, index in enumerate(batch.index.tolist()):
                outputs[index] = (out[i].numpy(), hidden[i, 0].numpy())
    return outputs


@pytest.fixture(scope="module")
def test_split_predictions(trained_run, ogb_root):
    """predict.py on ogbg-molhiv's test molecules, as a user's CSV: an ID column with leading
    zeros, a free-text column, and invalid rows in the middle; with embeddings."""
    work, out, _ = trained_run
    metrics = json.loads((out / "metrics.json").read_text())
    index, smiles, labels = ogb_test_split(ogb_root)
    rows = [
        {"id": f"{i:05d}", "smiles": s, "note": "NA"} for i, s in zip(index, smiles, strict=True)
    ]
    for position, bad in sorted(INVALID.items()):
        rows.insert(position, {"id": "00000", "smiles": bad, "note": ""})
    table = pd.DataFrame(rows)
    table.to_csv(work / "test_molecules.csv", index=False)
    log = call_script(
        "predict.py",
        [
            f"ckpt={metrics['best_checkpoint']}",
            f"input={work / 'test_molecules.csv'}",
            f"output={work / 'predictions.csv'}",
            f"embeddings={work / 'embeddings.npy'}",
            "max_atoms=60",
            f"hydra.run.dir={work / 'predict'}",
        ],
        cwd=work,
    )
    return {
        "metrics": metrics,
        "work": work,
        "log": log,
        "index": index,
        "labels": labels,
        "input": table,
        # The input's columns as text; empty predictions and errors as NaN.
        "output": pd.read_csv(
            work / "predictions.csv",
            dtype={"id": str, "smiles": str, "note": str},
            keep_default_na=False,
            na_values={"task_0": [""], "error": [""]},
        ),
        "embeddings": np.load(work / "embeddings.npy"),
    }


def test_predict_script_reproduces_eval_metric(test_split_predictions):
    """OGB's Evaluator on predict.py's output gives what eval.py computed for the checkpoint."""
    run = test_split_predictions
    result, _ = evaluate_run(run["metrics"], run["work"])
    output = run["output"]
    valid = output[output.error.isna()]
    assert len(valid) == len(run["index"]) == result["test"]["num_graphs"]
    y_pred = valid[["task_0"]].to_numpy()
    ours = Evaluator("ogbg-molhiv").eval({"y_true": run["labels"], "y_pred": y_pred})["rocauc"]
    assert ours == pytest.approx(result["test"]["rocauc"], abs=1e-5)
    assert "predicted 40 of 44 molecules" in run["log"]


def test_predict_script_matches_the_module_on_each_test_molecule(test_split_predictions):
    run = test_split_predictions
    module = GraphormerModule.from_checkpoint(run["metrics"]["best_checkpoint"])
    reference = module_outputs_on_test_split(module)
    output = run["output"]
    valid = output[output.error.isna()]
    assert len(reference) == len(valid)
    for index, prob in zip(run["index"], valid.task_0, strict=True):
        assert prob == pytest.approx(float(reference[index][0][0]), abs=1e-5)
    # Embeddings: the graph token's final state, row-aligned with the output (NaN when invalid).
    embeddings = run["embeddings"]
    assert embeddings.shape == (len(output), module.config.hidden_dim)
    assert embeddings.dtype == np.float32
    rows = valid.index.to_numpy()
    for index, row in zip(run["index"], rows, strict=True):
        np.testing.assert_allclose(embeddings[row], reference[index][1], atol=1e-5)
    assert np.isnan(embeddings[sorted(INVALID)]).all()


def test_predict_script_keeps_every_row_in_place(test_split_predictions):
    run = test_split_predictions
    table, output = run["input"], run["output"]
    assert list(output.columns) == ["id", "smiles", "note", "task_0", "error"]
    assert len(output) == len(table)
    # The input's own values come back as written (leading zeros, "NA", empty cells).
    assert output.id.tolist() == table.id.tolist()
    assert output.note.tolist() == table.note.tolist()
    assert output.smiles.tolist() == table.smiles.tolist()
    failed = output.error.notna()
    assert set(np.flatnonzero(failed)) == set(INVALID)
    assert output.task_0[failed].isna().all() and output.task_0[~failed].between(0, 1).all()
    assert "unclosed ring" in output.error[3]
    assert output.error[7] == "empty SMILES"
    assert "syntax error" in output.error[8]
    assert output.error[12] == "61 atoms, more than max_atoms=60"
    assert "no prediction for 4 row(s) (3, 7, 8, 12;" in run["log"]


def test_predictions_do_not_depend_on_batching_or_neighbours(trained_run):
    """Molecules sorted by size into batches come back in input order: each row equals the
    molecule predicted alone; invalid entries in between shift nothing."""
    _, out, _ = trained_run
    predictor = Predictor.from_checkpoint(out / "checkpoints" / "last.ckpt", batch_size=8)
    smiles = list(nci_smiles()[:40])
    mixed = smiles[:10] + ["C1CC"] + smiles[10:30] + [None, ""] + smiles[30:]
    with pytest.warns(UserWarning, match="3 of 43 molecules have no prediction"):
        table = predictor.predict(mixed)
    assert table.smiles.tolist() == mixed
    assert table.error.astype(bool).tolist() == [s in ("C1CC", None, "") for s in mixed]
    together = table.task_0[table.error == ""].to_numpy()
    alone = [predictor.predict([s]).task_0[0] for s in smiles]
    np.testing.assert_allclose(together, alone, atol=1e-5)
    assert np.ptp(together) > 1e-3  # distinct molecules, distinct predictions
    with pytest.warns(UserWarning, match="3 of 43"):
        embeddings = predictor.embed(mixed)
    assert embeddings.shape == (43, predictor.hidden_dim)
    np.testing.assert_allclose(embeddings[0], predictor.embed([smiles[0]])[0], atol=1e-5)
    assert np.isnan(embeddings[[10, 31, 32]]).all() and not np.isnan(embeddings[11]).any()


def test_multi_task_outputs_carry_ogbs_task_names(ogb_root, tmp_path):
    """ogbg-moltox21 (12 tasks): one probability column per task, named after OGB's label columns
    of mapping/mol.csv.gz when the dataset folder has them, task_i when it does not."""
    named = tmp_path / "named"
    (named / "ogbg_moltox21" / "mapping").mkdir(parents=True)
    mapping = pd.DataFrame(
        {name: [0.0] for name in TOX21_TASKS} | {"smiles": ["C"], "mol_id": ["x"]}
    )
    mapping.to_csv(named / "ogbg_moltox21" / "mapping" / "mol.csv.gz", index=False)
    ckpt = untrained_checkpoint(
        tmp_path / "tox21.ckpt", ["dataset=ogbg-moltox21", f"dataset.root={named}"]
    )
    predictor = Predictor.from_checkpoint(ckpt)
    assert predictor.task_names == TOX21_TASKS
    smiles = list(nci_smiles()[:20])
    table = predictor.predict(smiles)
    assert list(table.columns) == ["smiles", *TOX21_TASKS, "error"]
    values = table[TOX21_TASKS].to_numpy()
    assert ((values > 0) & (values < 1)).all()
    # Column j is task j: the module's j-th output.
    module = GraphormerModule.from_checkpoint(ckpt)
    batch = predictor.collator(featurize_smiles(smiles).graphs)
    with torch.inference_mode():
        expected = torch.sigmoid(module(batch)).numpy()
    np.testing.assert_allclose(values, expected, atol=1e-5)
    assert np.ptp(values, axis=1).max() > 1e-4  # the tasks differ

    unnamed = untrained_checkpoint(
        tmp_path / "plain.ckpt", ["dataset=ogbg-moltox21", f"dataset.root={ogb_root}"]
    )
    assert Predictor.from_checkpoint(unnamed).task_names == [f"task_{i}" for i in range(12)]


def test_smiles_csv_model_predicts_in_target_units_under_target_names(tmp_path, nci_csv):
    """A SMILES-CSV regression model: columns named after its targets (with _pred when the input
    holds the true values under those names), values in the targets' units, and its SMILES
    column as the default."""
    ckpt = untrained_checkpoint(
        tmp_path / "csv.ckpt",
        [
            "dataset=smiles_csv",
            f"dataset.path={nci_csv}",
            "dataset.targets=[tpsa,logp]",
            "dataset.smiles_column=SMILES",
        ],
        target_mean=[1000.0, -5.0],
        target_std=[10.0, 0.1],
    )
    table = pd.read_csv(nci_csv).rename(columns={"smiles": "SMILES"}).iloc[:30]
    table.to_csv(tmp_path / "in.csv", index=False)
    cfg = compose_predict(
        [f"ckpt={ckpt}", f"input={tmp_path / 'in.csv'}", f"output={tmp_path / 'out.csv'}"]
    )
    with pytest.warns(UserWarning, match="tpsa -> tpsa_pred"):
        predict(cfg)
    out = pd.read_csv(tmp_path / "out.csv")
    assert list(out.columns) == [*table.columns, "tpsa_pred", "logp", "error"]
    np.testing.assert_array_equal(out.tpsa.to_numpy(), table.tpsa.to_numpy())
    ok = out.error.isna()
    # De-standardised: around the training mean, spread by the training std.
    assert out.tpsa_pred[ok].between(900, 1100).all() and out.logp[ok].between(-7, -3).all()
    module = GraphormerModule.from_checkpoint(ckpt)
    graphs = featurize_smiles(table.SMILES.tolist()).graphs
    batch = Predictor.from_checkpoint(ckpt).collator([g for g in graphs if g is not None])
    with torch.inference_mode():
        expected = module(batch).numpy()
    np.testing.assert_allclose(out.loc[ok, ["tpsa_pred", "logp"]].to_numpy(), expected, rtol=1e-5)


def test_predictions_run_in_the_training_runs_precision(ogb_root, tmp_path):
    torch.manual_seed(0)  # the untrained weights: not whatever random state earlier tests left
    ckpt = untrained_checkpoint(
        tmp_path / "bf16.ckpt",
        # The graph-token readout: an untrained token_sum model's outputs grow with its atoms,
        # and this test's tolerance is set by outputs that sit near one value (below).
        ["dataset=ogbg-molesol", f"dataset.root={ogb_root}", "model.readout=token"],
        target_mean=[0.0],
        target_std=[100.0],
        precision="bf16-mixed",
    )
    smiles = list(nci_smiles()[:30])
    mixed = Predictor.from_checkpoint(ckpt)
    assert mixed.precision == "bf16-mixed"
    full = Predictor.from_checkpoint(ckpt, precision="32-true")
    ours, reference = mixed.predict(smiles).task_0, full.predict(smiles).task_0
    # bfloat16 keeps 8 bits of mantissa: each output within 0.5% of the targets' scale (std 100)
    # of float32's; an untrained model's outputs sit near one value, so their own size is no scale.
    np.testing.assert_allclose(ours, reference, atol=0.005 * 100.0)
    assert not np.allclose(ours, reference, rtol=0, atol=1e-4)


def test_a_checkpoint_without_data_settings_still_predicts(tmp_path):
    """A converted or hand-made checkpoint records no dataset: tasks are task_i, the structural
    settings the model's own."""
    task = {"name": "x", "task_type": "regression", "num_tasks": 2, "metric": "rmse"}
    module = GraphormerModule(model=model_preset("graphormer_tiny"), task=task, data=None)
    ckpt = checkpoint.save(tmp_path / "bare.ckpt", module.state_dict(), dict(module.hparams))
    predictor = Predictor.from_checkpoint(ckpt)
    assert predictor.task_names == ["task_0", "task_1"] and predictor.precision == "32-true"
    assert predictor.collator.max_hops == module.config.multi_hop_max_dist
    table = predictor.predict(["CCO", "c1ccccc1O"])
    assert list(table.columns) == ["smiles", "task_0", "task_1", "error"]
    assert table[["task_0", "task_1"]].notna().all().all()


def test_smiles_on_the_command_line_print_a_table(trained_run, tmp_path, capsys):
    """smiles=[...] as a shell passes it (Hydra's own override parsing), printed as a table."""
    _, out, _ = trained_run
    try:  # .parquet needs the optional `parquet` extra; without it the same checks run on .npy
        import pyarrow  # noqa: F401

        path = tmp_path / "emb.parquet"
    except ImportError:
        path = tmp_path / "emb.npy"
    cfg = compose_predict(
        [
            f"ckpt={out / 'checkpoints' / 'last.ckpt'}",
            'smiles=["CC(=O)Oc1ccccc1C(=O)O",c1ccccc1O,"C1CC"]',
            f"embeddings={path}",
        ]
    )
    predict(cfg)
    result = capsys.readouterr()
    lines = result.out.strip().splitlines()
    assert lines[0].split() == ["smiles", "task_0", "error"]
    assert lines[1].startswith("CC(=O)Oc1ccccc1C(=O)O") and lines[2].startswith("c1ccccc1O")
    assert "unclosed ring" in lines[3]
    assert "predicted 2 of 3 molecules" in result.err
    if path.suffix == ".parquet":
        embeddings = pd.read_parquet(path)
        assert list(embeddings.columns)[:2] == ["emb_0", "emb_1"]
    else:
        embeddings = pd.DataFrame(np.load(path))
    assert embeddings.shape == (3, 32)
    assert embeddings.iloc[2].isna().all() and embeddings.iloc[:2].notna().all().all()


def test_user_errors_are_one_line_without_a_traceback(trained_run, tmp_path):
    _, out, _ = trained_run
    ckpt = out / "checkpoints" / "last.ckpt"
    (tmp_path / "no_smiles.csv").write_text("name,structure\na,CCO\n")
    args = [
        f"ckpt={ckpt}",
        f"input={tmp_path / 'no_smiles.csv'}",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    # In-process: predict.py in a process of its own stops on a user error in test_safety.
    result = call_failing("predict.py", args, tmp_path)
    message = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(message) == 1
    assert "no column 'smiles'" in message[0] and "['name', 'structure']" in message[0]
    assert "smiles_column=" in message[0]

    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "header.csv").write_text("smiles,id\n")
    cases = {
        "does not exist": [f"input={tmp_path / 'missing.csv'}"],
        "is empty": [f"input={tmp_path / 'empty.csv'}"],
        "header but no rows": [f"input={tmp_path / 'header.csv'}"],
        "not both": [f"input={tmp_path / 'header.csv'}", "smiles=[CCO]"],
        "nothing to predict": [],
        "smiles= is empty": ["smiles=[]"],
        "a .npy or .parquet file": ["smiles=[CCO]", "embeddings=out.csv"],
        "not a device name": ["smiles=[CCO]", "device=nonsense"],
        "precision=": ["smiles=[CCO]", "precision=8-bit"],
    }
    for expected, overrides in cases.items():
        with pytest.raises(UserFacingError, match=expected):
            predict(compose_predict([f"ckpt={ckpt}", *overrides]))


def test_explain_script_writes_pictures_and_raw_maps(trained_run, tmp_path):
    """explain.py: per molecule, shaded drawings and per-head heatmaps (PNG, of the expected size
    and not blank) and the raw maps, cut to the molecule (no padding), rows summing to 1."""
    _, out, _ = trained_run
    aspirin, nci = "CC(=O)Oc1ccccc1C(=O)O", nci_smiles()[5]
    log = call_script(
        "explain.py",
        [
            f"ckpt={out / 'checkpoints' / 'last.ckpt'}",
            f'smiles=["{aspirin}","{nci}"]',
            f"output={tmp_path / 'pictures'}",
            "size=300",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        cwd=tmp_path,
    )
    module = GraphormerModule.from_checkpoint(out / "checkpoints" / "last.ckpt")
    layers, heads = module.config.num_layers, module.config.num_heads
    for i, smiles in enumerate([aspirin, nci]):
        folder = tmp_path / "pictures" / f"mol_{i}"
        assert str(folder) in log
        atoms = Chem.MolFromSmiles(smiles).GetNumAtoms()
        weights = np.load(folder / "attention.npy")
        assert weights.shape == (layers, heads, atoms + 1, atoms + 1)
        np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
        assert (weights >= 0).all()
        rollout = np.load(folder / "rollout.npy")
        assert rollout.shape == (atoms + 1, atoms + 1)
        np.testing.assert_allclose(rollout.sum(-1), 1.0, atol=1e-5)
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["smiles"] == smiles and len(summary["labels"]) == atoms + 1
        assert summary["labels"][:2] == [
            "graph",
            Chem.MolFromSmiles(smiles).GetAtomWithIdx(0).GetSymbol() + "0",
        ]

        rollout_png = picture(folder / "rollout.png")
        assert rollout_png.size == (300, 300)
        # 3 layers + the rollout: one row of four 150 px panels.
        assert picture(folder / "layers.png").size == (4 * 150, 150)
        # Shaded relative to uniform: atoms with clearly more than their share are drawn warm,
        # a nearly flat map is not (and says so).
        relative = relative_to_uniform(rollout[0, 1:])
        if relative.max() > 1.5:
            assert shaded_pixels(rollout_png) > 200
        elif relative.max() < 1.1 and relative.min() > 0.9:
            assert shaded_pixels(rollout_png) < 50
        for layer in range(layers):
            heatmap = picture(folder / f"heads_layer{layer}.png")
            assert heatmap.width > 4 * (atoms + 1) * 4 and heatmap.height > (atoms + 1) * 4
            assert shaded_pixels(heatmap) > 4 * (atoms + 1)


def picture(path):
    """An RGB picture that is not blank (its pixels vary)."""
    image = Image.open(path).convert("RGB")
    assert np.asarray(image, dtype=float).std() > 10, f"{path} is blank"
    return image


def shaded_pixels(image) -> int:
    """Pixels of the attention colour scale (warm: clearly more red than blue)."""
    rgb = np.asarray(image, dtype=int)
    return int(((rgb[..., 0] - rgb[..., 2]) > 60).sum())
