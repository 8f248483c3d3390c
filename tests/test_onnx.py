"""A trained model as ONNX (issue 40): graphormer-export, the numpy twins of the collator and
the OnnxPredictor, checked against the torch Predictor."""

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from graphormer import Predictor
from graphormer.data.featurize import featurize_smiles
from graphormer.errors import ConfigError, UserFacingError
from graphormer.portable.dense import INPUT_NAMES

from helpers import (
    REPO,
    TINY,
    compose_config,
    compose_train,
    nci_smiles,
    nci_table,
    train_config,
    untrained_checkpoint,
)

# Rows that keep their place with an error: unparsable, empty, whitespace inside.
BAD = {2: "C1CC", 5: "", 9: "CC C"}


def molecules(count: int) -> list[str]:
    """``count`` NCI molecules (a few salts among them) with the BAD rows in place."""
    smiles = list(nci_smiles()[:count])
    for position, bad in sorted(BAD.items()):
        smiles.insert(position, bad)
    return smiles


onnxruntime = pytest.importorskip("onnxruntime", reason="the onnx extra (onnxruntime) is absent")
pytest.importorskip("onnx", reason="the onnx extra (onnx) is absent")

from graphormer.cli.export import run as export  # noqa: E402
from graphormer.portable.onnx_predictor import OnnxPredictor  # noqa: E402


def exported(ckpt, output, *overrides):
    return export(compose_config("export", [f"ckpt={ckpt}", f"output={output}", *overrides]))


def assert_same_table(found: pd.DataFrame, expected: pd.DataFrame, columns):
    assert list(found.columns) == list(expected.columns)
    assert found["error"].tolist() == expected["error"].tolist()
    for column in columns:
        a, b = found[column].to_numpy(float), expected[column].to_numpy(float)
        assert (np.isnan(a) == np.isnan(b)).all(), column
        assert np.nanmax(np.abs(a - b)) <= 1e-4, column


def test_regression_export_matches_the_predictor(esol_checkpoint, tmp_path):
    """The table of ONNX Runtime is the Predictor's: units (the run's standardisation inside
    the graph), errors in place, within 1e-4, on molecules of many sizes and salts."""
    [path] = exported(esol_checkpoint, tmp_path / "esol.onnx")
    smiles = molecules(60)
    expected = Predictor.from_checkpoint(esol_checkpoint, device="cpu").predict(smiles)
    found = OnnxPredictor(path, batch_size=16).predict(smiles)
    assert_same_table(found, expected, ["task_0"])
    assert found.loc[2, "error"].startswith("invalid SMILES")
    assert found.loc[9, "error"].startswith("whitespace")
    assert abs(float(np.nanmean(found.task_0)) + 3.0) < 5  # in units, not standardised


def test_binary_ensemble_exports_its_members(tmp_path, ogb_root):
    """Two members: one file each; the mean probability and the spread are the Predictor's."""
    members = [
        untrained_checkpoint(
            tmp_path / f"hiv{seed}.ckpt",
            ["dataset=ogbg-molhiv", f"dataset.root={ogb_root}", f"seed={seed}"],
        )
        for seed in (0, 1)
    ]
    ckpt = "[" + ",".join(str(p) for p in members) + "]"
    paths = exported(ckpt, tmp_path / "hiv.onnx")
    assert [p.name for p in paths] == ["hiv.onnx", "hiv.member1.onnx"]
    smiles = molecules(30)
    expected = Predictor.from_checkpoint(members, device="cpu").predict(smiles)
    found = OnnxPredictor(paths[0]).predict(smiles)
    assert "task_0_std" in found.columns
    assert_same_table(found, expected, ["task_0", "task_0_std"])
    valid = found.error == ""
    assert ((found.task_0[valid] > 0) & (found.task_0[valid] < 1)).all()
    assert (found.task_0_std[valid] > 0).all()


def test_onnx_predictor_runs_without_torch(esol_checkpoint, featured_model, tmp_path):
    """A process in which torch cannot be imported predicts with the exported files, a model
    reading molecule features (computed there from SMILES) among them."""
    [path] = exported(esol_checkpoint, tmp_path / "esol.onnx")
    _, featured = featured_model
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from graphormer.portable.onnx_predictor import OnnxPredictor\n"
        f"for path, column in (({str(path)!r}, 'task_0'), ({str(featured)!r}, 'tpsa')):\n"
        "    table = OnnxPredictor(path).predict(['CCO', 'C1CC', 'c1ccccc1O'])\n"
        "    print(table.error.tolist(), table[column].notna().tolist())\n"
        "assert 'torch' not in {m.split('.')[0] for m in sys.modules if sys.modules[m]}\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("[True, False, True]") == 2, done.stdout


def test_export_refuses_to_overwrite(esol_checkpoint, tmp_path):
    target = tmp_path / "model.onnx"
    target.write_text("mine")
    with pytest.raises(UserFacingError, match="overwrite"):
        exported(esol_checkpoint, target)
    assert target.read_text() == "mine"
    with pytest.raises(UserFacingError, match=r"\.onnx"):
        exported(esol_checkpoint, tmp_path / "model.ckpt")


def test_onnx_predictor_refuses_other_files(tmp_path):
    other = tmp_path / "other.onnx"
    other.write_bytes(b"not a model")
    with pytest.raises(UserFacingError, match="cannot be read as an ONNX model"):
        OnnxPredictor(other)


def test_network_parity_on_the_raw_inputs(esol_checkpoint, tmp_path):
    """ONNX Runtime on the collator's arrays equals the module on the same batch (no
    featurisation in between), for a batch size and atom count unlike the traced ones."""
    [path] = exported(esol_checkpoint, tmp_path / "esol.onnx")
    predictor = Predictor.from_checkpoint(esol_checkpoint, device="cpu")
    smiles = list(nci_smiles()[100:137])
    batch = predictor.collator(featurize_smiles(smiles).graphs)
    with torch.inference_mode():
        expected = predictor.module(batch).numpy()
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {name: getattr(batch, name).numpy() for name in INPUT_NAMES}
    feeds = {k: v if v.dtype == bool else v.astype(np.int64) for k, v in feeds.items()}
    [found] = session.run(None, feeds)
    assert found.shape == expected.shape
    assert np.abs(found - expected).max() <= 1e-4


def test_export_leaves_the_predictor_as_it_was(tmp_path, ogb_root):
    """A model with dropout: exporting leaves its members in eval mode (the exporter restores
    its wrapper's mode recursively), so the Predictor stays deterministic."""
    from graphormer.inference.onnx_export import export_onnx

    ckpt = untrained_checkpoint(
        tmp_path / "drop.ckpt",
        ["dataset=ogbg-molhiv", f"dataset.root={ogb_root}", "model.dropout=0.3"],
    )
    predictor = Predictor.from_checkpoint(ckpt, device="cpu")
    export_onnx(predictor, tmp_path / "drop.onnx")
    assert not any(m.training for m in predictor.modules)
    smiles = molecules(20)
    first, again = predictor.run(smiles).values, predictor.run(smiles).values
    np.testing.assert_array_equal(first, again)
    found = OnnxPredictor(tmp_path / "drop.onnx").run(smiles).values
    assert np.nanmax(np.abs(found - first)) <= 1e-4


def test_export_without_the_onnx_extra_names_it(tmp_path, monkeypatch):
    """Without onnx (or onnxruntime) the command says which extra to install, before any model
    is read (it was a ModuleNotFoundError traceback after loading the model)."""
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(ConfigError, match=r"needs the onnx extra .*graphormer\[onnx\]"):
        exported(tmp_path / "missing.ckpt", tmp_path / "m.onnx")


@pytest.fixture(scope="module")
def featured_model(tmp_path_factory):
    """A tiny smiles_csv regression model trained 1 epoch on RDKit descriptors and Morgan counts
    computed from SMILES, exported by graphormer-export (which checks it on its molecules):
    ``(checkpoint, model.onnx)``. Shared: tests read it, never change it."""
    work = tmp_path_factory.mktemp("featured")
    nci_table().iloc[:48].to_csv(work / "mols.csv", index=False)
    cfg = compose_train(
        [
            *TINY,
            "dataset=smiles_csv",
            f"dataset.path={work / 'mols.csv'}",
            "dataset.targets=[tpsa]",
            "dataset.molecule_features=rdkit2d+morgan_counts",
            f"dataset.root={work / 'cache'}",
            "trainer.max_epochs=1",
            f"output_dir={work / 'run'}",
        ]
    )
    ckpt = train_config(cfg)["best_checkpoint"]
    [path] = exported(ckpt, work / "featured.onnx")
    return ckpt, path


def test_molecule_features_export_matches_the_predictor(featured_model):
    """A model reading RDKit descriptors and Morgan counts: the file takes their raw values as
    one more input and names them; OnnxPredictor computes them from SMILES, and its table is
    the Predictor's, unparsable and empty rows in place."""
    from graphormer.portable.features import MORGAN_BITS, rdkit2d_names

    ckpt, path = featured_model
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inputs = {i.name: i.shape for i in session.get_inputs()}
    width = len(rdkit2d_names()) + MORGAN_BITS
    assert list(inputs) == [*INPUT_NAMES, "molecule_features"]
    assert inputs["molecule_features"][1] == width
    onnx_predictor = OnnxPredictor(path, batch_size=8)
    assert onnx_predictor.feature_sets == "rdkit2d+morgan_counts"
    assert len(onnx_predictor.metadata["molecule_features"]["names"]) == width
    smiles = molecules(17)
    expected = Predictor.from_checkpoint(ckpt, device="cpu").predict(smiles)
    found = onnx_predictor.predict(smiles)
    assert_same_table(found, expected, ["tpsa"])
    assert found.loc[2, "error"].startswith("invalid SMILES")
    assert (found.error == "").sum() == 17


def test_molecule_features_fill_and_clip_in_onnx_runtime(featured_model):
    """The model's own rule on raw features (NaN and inf filled with the training median,
    far values clipped, dropped columns zero) runs in ONNX Runtime as in torch."""
    ckpt, path = featured_model
    predictor = Predictor.from_checkpoint(ckpt, device="cpu")
    smiles = list(nci_smiles()[200:213])
    batch = predictor.collator(featurize_smiles(smiles).graphs)
    raw = np.array(predictor.molecule_features.compute(smiles))
    raw[0, :50] = np.nan
    raw[1, 10:20] = np.inf
    raw[2, 5:9] = -np.inf
    raw[3, :] = 1e30
    batch.molecule_features = torch.from_numpy(raw)
    with torch.inference_mode():
        expected = predictor.module(batch).numpy()
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {name: getattr(batch, name).numpy() for name in INPUT_NAMES}
    feeds = {k: v if v.dtype == bool else v.astype(np.int64) for k, v in feeds.items()}
    [found] = session.run(None, {**feeds, "molecule_features": raw})
    assert np.isfinite(found).all()
    assert np.abs(found - expected).max() <= 1e-4
    # The input is read: every value missing (the training medians) predicts otherwise.
    [medians] = session.run(None, {**feeds, "molecule_features": np.full_like(raw, np.nan)})
    assert np.abs(found - medians)[4:].min() > 1e-4


def test_onnx_predictor_refuses_features_this_rdkit_names_otherwise(featured_model, monkeypatch):
    """An RDKit whose descriptor list differs from the exporting one is refused, not misread."""
    import graphormer.portable.onnx_predictor as onnx_predictor

    _, path = featured_model
    names = onnx_predictor.feature_set_names
    monkeypatch.setattr(onnx_predictor, "feature_set_names", lambda sets: names(sets)[1:])
    with pytest.raises(UserFacingError, match="RDKit's descriptor list differs: .*rdkit2d:"):
        OnnxPredictor(path)


def test_export_refuses_a_files_feature_columns(tmp_path):
    """dataset.feature_columns are a file's, not SMILES': one error naming them and the fix."""
    table = nci_table().iloc[:20].assign(mw=np.linspace(100, 300, 20))
    table.to_csv(tmp_path / "mols.csv", index=False)
    ckpt = untrained_checkpoint(
        tmp_path / "cols.ckpt",
        [
            "dataset=smiles_csv",
            f"dataset.path={tmp_path / 'mols.csv'}",
            "dataset.targets=[tpsa]",
            "dataset.feature_columns=[mw]",
            f"dataset.root={tmp_path / 'cache'}",
        ],
    )
    with pytest.raises(ConfigError) as error:
        exported(ckpt, tmp_path / "cols.onnx")
    message = str(error.value)
    assert "\n" not in message
    assert "dataset.feature_columns=['mw']" in message and "SMILES only" in message
    assert "graphormer.Predictor" in message
    assert not (tmp_path / "cols.onnx").exists()


def test_a_file_of_the_first_layout_predicts_as_before(esol_checkpoint, tmp_path):
    """A file exported before molecule features (no ``molecule_features`` metadata) loads and
    predicts as a new export of the same model."""
    import json

    import onnx

    from graphormer.portable.onnx_predictor import METADATA_KEY

    [path] = exported(esol_checkpoint, tmp_path / "esol.onnx")
    model = onnx.load(str(path))
    [entry] = [e for e in model.metadata_props if e.key == METADATA_KEY]
    values = json.loads(entry.value)
    assert values.pop("molecule_features") is None
    entry.value = json.dumps(values)
    onnx.save(model, str(tmp_path / "old.onnx"))
    smiles = molecules(12)
    old = OnnxPredictor(tmp_path / "old.onnx")
    assert old.feature_sets is None
    assert_same_table(old.predict(smiles), OnnxPredictor(path).predict(smiles), ["task_0"])
