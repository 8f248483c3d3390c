"""Issue #20: inputs that destroyed users' files, diverged silently, or were accepted when they
should not be; each one now stops with one ``error:`` line that names the input and the fix.
Run through the commands' own applications wherever that is possible: in-process
(tests/helpers.call, the same main() a script runs, its exit status and output), and in a
subprocess where a process is what protects the test (a run that would grow without end). That a
user error is one line with exit status 1 and no traceback from a real process is tested once
per command (test_bad_input, test_predict, test_convert)."""

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from graphormer import checkpoint
from graphormer.data.featurize import featurize_smiles
from graphormer.data.splits import random_split
from graphormer.data.tasks import TaskInfo, score
from graphormer.errors import ConfigError, DataError
from graphormer.outputs import atomic_path, check_outputs
from graphormer.testing import model_preset
from graphormer.training import GraphormerModule

from helpers import (
    TINY,
    call_failing,
    call_script,
    nci_graphs,
    nci_table,
    run_failing,
    run_script,
    to_data,
    tpsa_run_args,
)

TASK = {"name": "x", "task_type": "regression", "num_tasks": 1, "metric": "rmse"}


@pytest.fixture
def small_ckpt(tmp_path) -> Path:
    """A checkpoint the Predictor reads (converted-style: no dataset settings)."""
    module = GraphormerModule(model=model_preset("graphormer_tiny"), task=TASK, data=None)
    return checkpoint.save(tmp_path / "model.ckpt", module.state_dict(), dict(module.hparams))


# -- 1. outputs never destroy a file ----------------------------------------------------------


def test_an_output_equal_to_an_input_is_refused_and_the_input_kept(tmp_path, small_ckpt):
    ckpt_bytes = small_ckpt.read_bytes()
    mols = tmp_path / "mols.csv"
    mols.write_text("smiles\nCCO\nc1ccccc1O\n")
    cases = [
        ("eval.py", [f"ckpt={small_ckpt}", f"output={small_ckpt}"], "ckpt="),
        ("predict.py", [f"ckpt={small_ckpt}", "smiles=[CCO]", f"output={small_ckpt}"], "ckpt="),
        ("predict.py", [f"ckpt={small_ckpt}", f"input={mols}", f"output={mols}"], "input="),
        ("convert.py", [f"source={small_ckpt}", f"output={small_ckpt}"], "source="),
    ]
    for script, args, named in cases:
        # overwrite=true never allows writing over an input
        result = call_failing(script, [*args, "overwrite=true"], cwd=tmp_path)
        assert "error: output=" in result.stderr and f"is the {named}" in result.stderr
    assert small_ckpt.read_bytes() == ckpt_bytes
    assert mols.read_text() == "smiles\nCCO\nc1ccccc1O\n"


def test_two_outputs_on_one_path_are_refused(tmp_path, small_ckpt):
    args = [f"ckpt={small_ckpt}", "smiles=[CCO]", "output=x.npy", "embeddings=x.npy"]
    result = call_failing("predict.py", args, cwd=tmp_path)
    assert "output= and embeddings= are both x.npy" in result.stderr
    assert not (tmp_path / "x.npy").exists()


# Slow (about a minute of script starts); the refusal of an output that is an input runs by default.
@pytest.mark.slow
def test_an_existing_output_needs_overwrite(tmp_path, small_ckpt):
    args = [f"ckpt={small_ckpt}", "smiles=[CCO]", "output=preds.csv"]
    run_script("predict.py", args, cwd=tmp_path)
    first = (tmp_path / "preds.csv").read_text()
    result = run_failing("predict.py", [*args[:1], "smiles=[CCCC]", args[2]], cwd=tmp_path)
    assert "output=preds.csv already exists" in result.stderr
    assert "overwrite=true" in result.stderr
    assert (tmp_path / "preds.csv").read_text() == first
    run_script("predict.py", [*args[:1], "smiles=[CCCC]", args[2], "overwrite=true"], tmp_path)
    assert "CCCC" in (tmp_path / "preds.csv").read_text()

    explain = [f"ckpt={small_ckpt}", "smiles=CCO", "output=pictures"]
    run_script("explain.py", explain, cwd=tmp_path)
    result = run_failing("explain.py", explain, cwd=tmp_path)
    assert "output=pictures already exists" in result.stderr
    run_script("explain.py", [*explain, "overwrite=true"], cwd=tmp_path)

    converted = tmp_path / "other.ckpt"
    shutil.copy(small_ckpt, converted)
    result = run_failing("convert.py", [f"source={small_ckpt}", f"output={converted}"], tmp_path)
    assert "already exists" in result.stderr


def test_check_outputs_compares_resolved_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a").mkdir()
    (tmp_path / "in.csv").write_text("x")
    with pytest.raises(ConfigError, match="is the input="):
        check_outputs({"output": "a/../in.csv"}, {"input": str(tmp_path / "in.csv")}, True)
    check_outputs({"output": "new.csv"}, {"input": "in.csv"}, overwrite=False)


def test_a_failed_write_leaves_the_old_file_whole(tmp_path):
    target = tmp_path / "preds.csv"
    target.write_text("the old predictions")
    with pytest.raises(OSError, match="No space"), atomic_path(target) as partial:
        partial.write_text("half of the new")
        raise OSError(28, "No space left on device")
    assert target.read_text() == "the old predictions"
    assert [p.name for p in tmp_path.iterdir()] == ["preds.csv"]


# -- 2. divergence stops the run --------------------------------------------------------------


def _train(csv: Path, out: Path, *extra: str) -> list[str]:
    return tpsa_run_args(csv, out, "trainer.max_epochs=2", *extra)


def test_divergence_stops_the_run_with_the_step_and_the_cause(tmp_path, nci_csv):
    result = call_failing("train.py", _train(nci_csv, tmp_path / "run", "optim.lr=1e3"), tmp_path)
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("error: training diverged:") and "at step" in error
    assert "optim.lr" in error and "nonfinite=skip" in error


# Slow: the default run covers nonfinite=stop through the script.
@pytest.mark.slow
def test_divergence_can_skip_the_updates(tmp_path, nci_csv):
    args = _train(nci_csv, tmp_path / "run", "optim.lr=1e3", "nonfinite=skip")
    log = run_script("train.py", args, tmp_path)
    assert "update skipped" in log


# -- 3. the digest covers everything a resume reads --------------------------------------------


def _tampered(source: Path, path: Path, edit, reseal: bool = False) -> Path:
    stored = torch.load(source, weights_only=True)
    edit(stored)
    if reseal:  # as a tool that rewrites the file (and its digests) would
        stored[checkpoint.META_KEY]["weights_sha256"] = checkpoint.weights_digest(
            stored["state_dict"]
        )
        checkpoint.seal(stored)
    torch.save(stored, path)
    return path


def test_an_altered_optimiser_rng_or_settings_entry_is_refused(trained_run, tmp_path):
    _, out, _ = trained_run
    last = out / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)[checkpoint.META_KEY]["format_version"] == 3

    def optimiser(stored):
        state = stored["optimizer_states"][0]["state"]
        state[next(iter(state))]["exp_avg"].add_(1.0)

    def rng(stored):
        stored["graphormer_rng_states"]["torch"].zero_()

    def settings(stored):
        stored["hyper_parameters"]["lr"] = 10.0

    for name, edit in (("opt", optimiser), ("rng", rng), ("hp", settings)):
        path = _tampered(last, tmp_path / f"{name}.ckpt", edit)
        with pytest.raises(checkpoint.CheckpointError, match="altered or damaged"):
            checkpoint.load(path)
    result = call_failing("predict.py", [f"ckpt={tmp_path / 'opt.ckpt'}", "smiles=[CCO]"], tmp_path)
    assert "was altered or damaged after it was saved" in result.stderr


def test_a_resume_from_an_altered_checkpoint_is_refused(trained_run, tmp_path, ogb_root):
    _, out, _ = trained_run
    path = _tampered(
        out / "checkpoints" / "last.ckpt",
        tmp_path / "rng.ckpt",
        lambda stored: stored["graphormer_rng_states"]["torch"].zero_(),
    )
    args = [
        "dataset=ogbg-molhiv",
        f"dataset.root={ogb_root}",
        f"ckpt_path={path}",
        f"hydra.run.dir={tmp_path / 'resumed'}",
        *TINY,
    ]
    result = call_failing("train.py", args, tmp_path)
    assert f"error: checkpoint {path} was altered or damaged" in result.stderr


def test_non_finite_weights_are_refused_even_with_a_valid_digest(trained_run, tmp_path):
    _, out, _ = trained_run

    def nan_weights(stored):
        stored["state_dict"]["model.head.weight"][0, 0] = float("nan")

    path = _tampered(out / "checkpoints" / "last.ckpt", tmp_path / "nan.ckpt", nan_weights, True)
    result = call_failing("eval.py", [f"ckpt={path}", f"hydra.run.dir={tmp_path / 'e'}"], tmp_path)
    assert "NaN or infinite values in model.head.weight" in result.stderr


def test_format_2_checkpoints_still_load(tmp_path):
    module = GraphormerModule(model=model_preset("graphormer_tiny"), task=TASK, data=None)
    path = checkpoint.save(tmp_path / "m.ckpt", module.state_dict(), dict(module.hparams))
    stored = torch.load(path, weights_only=True)
    stored[checkpoint.META_KEY]["format_version"] = 2
    del stored[checkpoint.META_KEY]["checkpoint_sha256"]
    stored["hyper_parameters"]["lr"] = 1.0  # not covered by format 2's digest
    torch.save(stored, path)
    assert checkpoint.load(path).format_version == 2


# -- 4. stored settings are checked against the tensors before anything is built -------------


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("num_layers", 10**9, "model.num_layers=1000000000 but it holds 3 layers"),
        pytest.param(
            "max_degree", 2 * 10**7, "in_degree.weight is (65, 32)", marks=pytest.mark.slow
        ),
    ],
)
def test_stored_settings_that_do_not_fit_the_tensors_fail_fast(
    trained_run, tmp_path, key, value, message
):
    _, out, _ = trained_run

    def edit(stored):
        stored["hyper_parameters"]["model"][key] = value

    path = _tampered(out / "checkpoints" / "last.ckpt", tmp_path / "big.ckpt", edit, True)
    result = run_failing("predict.py", [f"ckpt={path}", "smiles=[CCO]"], tmp_path, timeout=60)
    assert "does not match the model its own settings describe" in result.stderr
    assert message in result.stderr


# -- 5. targets and SMILES that were misread ---------------------------------------------------


def _csv_run(tmp_path: Path, table: pd.DataFrame, *extra: str):
    csv = tmp_path / "mols.csv"
    table.to_csv(csv, index=False)
    return call_failing("train.py", _train(csv, tmp_path / "run", *extra), tmp_path)


def test_a_target_beyond_float32_is_refused_with_its_rows(tmp_path):
    table = nci_table().iloc[:60].copy()
    table.loc[[3, 7], "tpsa"] = 1e39
    result = _csv_run(tmp_path, table)
    assert "too large for float32" in result.stderr and "rows 3, 7" in result.stderr


def test_a_duplicated_target_column_is_refused(tmp_path):
    csv = tmp_path / "mols.csv"
    table = nci_table().iloc[:60]
    lines = ["smiles,tpsa,tpsa"] + [
        f"{s},{v},{v + 1}" for s, v in zip(table.smiles, table.tpsa, strict=True)
    ]
    csv.write_text("\n".join(lines) + "\n")
    result = call_failing("train.py", _train(csv, tmp_path / "run"), tmp_path)
    assert "more than one column named 'tpsa'" in result.stderr


def test_a_target_labelled_only_in_training_is_refused(tmp_path):
    table = nci_table().iloc[:60].copy()
    split = random_split(len(table), (0.8, 0.1, 0.1), 0)
    table["other"] = np.nan
    table.loc[split["train"].numpy(), "other"] = 1.0
    result = _csv_run(tmp_path, table, "dataset.targets=[tpsa,other]", "dataset.split=random")
    assert "['other']" in result.stderr and "valid split" in result.stderr


def test_a_smiles_with_whitespace_inside_is_not_read_as_its_first_part(tmp_path, small_ckpt):
    assert "whitespace inside the SMILES" in featurize_smiles(["CC\tC"]).errors[0]
    mols = tmp_path / "mols.csv"
    mols.write_text('smiles\n"CC\tC"\nCCC\n')
    log = call_script("predict.py", [f"ckpt={small_ckpt}", f"input={mols}"], tmp_path)
    assert "predicted 1 of 2 molecules" in log and "whitespace inside" in log


# -- 6. Lightning's refusals, bf16, one-class validation ----------------------------------------


# Slow: tests/test_settings.py refuses these values in-process by default.
@pytest.mark.slow
@pytest.mark.parametrize("override", ["trainer.precision=garbage", "trainer.devices=0"])
def test_lightnings_refusals_are_one_error_line(tmp_path, nci_csv, override):
    result = run_failing("train.py", _train(nci_csv, tmp_path / "run", override), tmp_path)
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: {override.split('=')[0]}=")


@pytest.mark.parametrize("override", [{"strategy": "foo"}, {"max_steps": -5}])
def test_lightnings_other_refusals_are_config_errors(override):
    from graphormer.training.settings import TrainerSettings

    with pytest.raises(ConfigError, match=f"trainer.{next(iter(override))}="):
        TrainerSettings.from_dict(override)


def test_bf16_true_is_scored_in_float32(tmp_path, nci_csv):
    args = _train(nci_csv, tmp_path / "run", "trainer.precision=bf16-true", "trainer.max_epochs=1")
    log = call_script("train.py", args, tmp_path)
    assert "valid rmse:" in log
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["precision"] == "bf16-true"


@pytest.mark.parametrize("precision", ["bf16-true", "16-true"])
def test_true_half_precision_keeps_the_labels_exact(precision):
    # Lightning's own plugin turned a label of 72.3079 into 72.5 (bf16) before the loss.
    from graphormer.data import GraphormerCollator, StructuralFeatures
    from graphormer.training.precision import LabelKeepingHalfPrecision

    graphs = []
    for i, graph in enumerate(nci_graphs(2)):
        data = to_data(graph, 72.3079 + i)
        data.y_atom = torch.full((data.num_nodes, 1), 3.14159)
        data.x_continuous = torch.full((data.num_nodes, 2), 1.0001)
        graphs.append(StructuralFeatures(5)(data))
    batch = GraphormerCollator(max_hops=5)(graphs)
    converted = LabelKeepingHalfPrecision(precision).convert_input(batch)
    half = torch.bfloat16 if precision == "bf16-true" else torch.float16
    assert converted.y.dtype == torch.float32
    assert torch.equal(converted.y, batch.y) and converted.y[0, 0].item() == pytest.approx(72.3079)
    assert converted.y_atom.dtype == torch.float32  # NaN at padding: compared bit for bit
    torch.testing.assert_close(converted.y_atom, batch.y_atom, rtol=0, atol=0, equal_nan=True)
    assert converted.x_continuous.dtype == half  # inputs still follow the model's dtype
    assert converted.spatial_pos.dtype == batch.spatial_pos.dtype


def test_a_split_with_one_class_names_the_split_and_the_task():
    evaluator = TaskInfo("t", "binary classification", 2, "rocauc").evaluator()
    task = TaskInfo("t", "binary classification", 2, "rocauc")
    pred = torch.randn(6, 2, dtype=torch.bfloat16)
    true = torch.tensor([[0, 0], [0, 1], [0, 0], [0, 1], [0, 0], [0, 1]], dtype=torch.float)
    with pytest.warns(UserWarning, match=r"valid split of t leaves out task 0 \(no positive"):
        value = score(task, evaluator, true, pred, "valid")
    assert 0.0 <= value <= 1.0
    with pytest.raises(DataError, match="cannot be computed on the valid split.*task 0.*task 1"):
        score(task, evaluator, true[:, :1].repeat(1, 2), pred, "valid")
