"""Nothing silently wrong: what used to end with inf, an empty column or a success line after
hours of training is one ``error:`` line, before training where the config and the data's size
could have told."""

import json
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pandas as pd
import pytest

from graphormer.data import GraphDataModule, SmilesCsvSource
from graphormer.errors import ConfigError, DataError
from graphormer.training.settings import TrainerSettings

from helpers import (
    TINY,
    call_failing,
    call_script,
    compose_train,
    csv_cache,
    nci_table,
    train_config,
)


@pytest.fixture(scope="module")
def molecules() -> pd.DataFrame:
    """120 NCI molecules with their TPSA and a binary label (TPSA above the median)."""
    table = nci_table().iloc[:120].copy()
    table["binary"] = (table.tpsa > table.tpsa.median()).astype(float)
    return table.reset_index(drop=True)


@pytest.fixture(scope="module")
def molecules_csv(molecules, tmp_path_factory) -> Path:
    """``molecules`` as a CSV file; shared, so that its runs featurise it once."""
    path = tmp_path_factory.mktemp("molecules") / "m.csv"
    molecules.to_csv(path, index=False)
    return path


def train_args(csv, out, target="tpsa", *extra):
    binary = ["dataset.task_type=binary"] if target == "binary" else []
    return [
        "dataset=smiles_csv",
        f"dataset.path={csv}",
        f"dataset.targets=[{target}]",
        *binary,
        f"dataset.root={csv_cache(csv)}",
        f"hydra.run.dir={out}",
        *TINY,
        *extra,
    ]


def error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0]


def test_a_target_whose_square_overflows_is_refused_before_training(molecules, tmp_path):
    table = molecules.copy()
    table.loc[3, "tpsa"] = 3e38  # a float32 number; its square is not (RMSE inf, exit 0 before)
    table.to_csv(tmp_path / "huge.csv", index=False)
    out = tmp_path / "run"
    failed = call_failing("train.py", train_args(tmp_path / "huge.csv", out), tmp_path)
    line = error_line(failed)
    assert "as large as 3e+38" in line and "rescale the target" in line, line
    assert not list(out.glob("checkpoints/*.ckpt")), "refused before the first epoch"


def test_a_diverging_run_that_skips_most_updates_is_not_a_success(molecules_csv, tmp_path):
    out = tmp_path / "run"
    args = train_args(
        molecules_csv,
        out,
        "tpsa",
        "trainer.max_epochs=3",
        "nonfinite=skip",
        "optim.lr=1e4",
        "optim.end_lr=0",
        "trainer.gradient_clip_val=null",
    )
    line = error_line(call_failing("train.py", args, tmp_path))
    assert "training diverged" in line and "were skipped" in line, line
    assert not (out / "metrics.json").exists()


def test_nonfinite_scores_end_the_run_with_an_error():
    from graphormer.training.module import NonFiniteError
    from graphormer.training.run import _refuse_nonfinite_scores

    results = {"valid": {"rmse": 1.5}, "test": {"rmse": 2.0}, "best_checkpoint": "b.ckpt"}
    _refuse_nonfinite_scores(results)  # finite: a result
    for split, value in (("valid", float("inf")), ("test", float("nan"))):
        bad = {**results, split: {"rmse": value}}
        with pytest.raises(NonFiniteError, match=f"{split} rmse {value}"):
            _refuse_nonfinite_scores(bad)
    _refuse_nonfinite_scores({**results, "test": None})  # no labelled test split


def test_settings_under_which_validation_never_runs_are_refused():
    with pytest.raises(ConfigError, match=r"check_val_every_n_epoch=5 .* at most .*max_epochs=2"):
        TrainerSettings(max_epochs=2, check_val_every_n_epoch=5)
    for value in (0, 0.0):
        with pytest.raises(ConfigError, match="trainer.limit_val_batches"):
            TrainerSettings.from_dict({"limit_val_batches": value})
    TrainerSettings(max_epochs=5, check_val_every_n_epoch=5)
    # Step-limited runs validate by steps: their epochs are not known from the settings.
    TrainerSettings(max_epochs=-1, max_steps=100, check_val_every_n_epoch=10)


def test_a_split_a_ranking_metric_cannot_score_is_refused_before_training(molecules, tmp_path):
    molecules.to_csv(tmp_path / "m.csv", index=False)
    negatives = np.flatnonzero(molecules.binary.to_numpy() == 0)
    positives = np.flatnonzero(molecules.binary.to_numpy() == 1)
    split = {
        "train": sorted([*negatives[:40], *positives[:40]]),
        "valid": sorted(negatives[40:50]),  # one class: its ROC-AUC does not exist
        "test": sorted([*negatives[50:55], *positives[40:45]]),
    }
    file = tmp_path / "split.json"
    file.write_text(json.dumps({k: [int(i) for i in v] for k, v in split.items()}))
    source = SmilesCsvSource(
        str(tmp_path / "m.csv"),
        targets=["binary"],
        task_type="binary",
        split_file=str(file),
        root=str(tmp_path / "cache"),
    )
    datamodule = GraphDataModule(source, batch_size=8)
    datamodule.prepare_data()
    with pytest.raises(DataError, match="rocauc .* cannot be computed on the valid split"):
        datamodule.setup("fit")


def test_cv_folds_beyond_the_scaffold_groups_fail_before_any_fold_trains(molecules_csv, tmp_path):
    out = tmp_path / "run"
    args = train_args(molecules_csv, out, "tpsa", "trainer.max_epochs=1", "cv.folds=100")
    line = error_line(call_failing("train.py", args, tmp_path))
    assert "cv.folds=100 is more than" in line and "give cv.folds <= 49" in line, line
    assert not list(out.glob("folds/*/checkpoints/*.ckpt"))


def test_a_fold_that_cannot_be_scored_fails_before_any_fold_trains(molecules_csv, tmp_path):
    out = tmp_path / "run"
    args = train_args(molecules_csv, out, "binary", "trainer.max_epochs=1", "cv.folds=45")
    line = error_line(call_failing("train.py", args, tmp_path))
    assert "cv.folds=45: fold" in line and "one class only" in line, line
    assert "Lower cv.folds" in line
    assert not list(out.glob("folds/*/checkpoints/*.ckpt"))


def test_a_resume_refuses_training_data_changed_at_the_same_path(molecules, tmp_path):
    csv = tmp_path / "m.csv"
    molecules.to_csv(csv, index=False)
    out = tmp_path / "run"
    call_script("train.py", train_args(csv, out, "tpsa", "trainer.max_epochs=1"), tmp_path)
    last = out / "checkpoints" / "last.ckpt"
    resume = [f"ckpt_path={last}", "trainer.max_epochs=2"]
    changed = molecules.assign(tpsa=molecules.tpsa * 2)
    changed.to_csv(csv, index=False)
    line = error_line(call_failing("train.py", resume, tmp_path))
    assert "is not the data the checkpoint being resumed was trained on" in line, line
    assert str(csv) in line and "pretrained=" in line
    molecules.to_csv(csv, index=False)  # the same data again: the resume goes on
    call_script("train.py", resume, tmp_path)
    assert json.loads((out / "metrics.json").read_text())["epochs"] == 2


def test_mc_dropout_of_one_pass_is_refused():
    from graphormer.inference.predictor import Predictor
    from graphormer.testing import model_preset
    from graphormer.training.module import GraphormerModule

    model = {**model_preset("graphormer_tiny"), "dropout": 0.1}
    task = {"name": "toy", "task_type": "regression", "num_tasks": 1, "metric": "rmse"}
    module = GraphormerModule(model=model, task=task)
    # One pass has no spread: its <task>_std column was left empty (NaN) without a word.
    with pytest.raises(ConfigError, match="mc_dropout=1 is not allowed: one pass has no spread"):
        Predictor(module, ["tpsa"], device="cpu", mc_dropout=1)
    two = Predictor(module, ["tpsa"], device="cpu", mc_dropout=2).run(["CCO", "c1ccccc1O"])
    assert np.isfinite(two.std).all()


def fitted_regression_calibration(tmp_path):
    from graphormer.training.calibration import Calibration

    rng = np.random.default_rng(0)
    y = rng.normal(size=(50, 1))
    found = Calibration.fit("regression", [], y, y + rng.normal(scale=0.3, size=(50, 1)))
    return found.save(tmp_path / "calibration.json")


@pytest.mark.parametrize(
    "edit, entry",
    [
        (lambda v: v.update(residual=[[-s for s in v["residual"][0]]]), "residual"),
        (lambda v: v.update(residual=[v["residual"][0][::-1]]), "out of order"),
        (lambda v: v.update(normalized=v["residual"] * 2), "numbers of tasks"),
        (lambda v: v.update(mc_normalized=v["residual"], mc_passes=1), "mc_passes 1"),
        (
            lambda v: v.update(
                task_type="binary classification", method="temperature", temperature=[-1.0]
            ),
            "temperature",
        ),
        (
            lambda v: v.update(
                task_type="binary classification",
                method="isotonic",
                isotonic=[[[0.0, 0.5, 1.0], [0.9, 0.5, 0.1]]],
                residual=None,
            ),
            "not non-decreasing",
        ),
        (lambda v: v.update(method="platt"), "method 'platt'"),
    ],
)
def test_an_edited_calibration_is_refused_not_applied(tmp_path, edit, entry):
    from graphormer.training.calibration import Calibration

    path = fitted_regression_calibration(tmp_path)
    lower, upper = Calibration.load(path).intervals(np.zeros((3, 1)), None, 0.8, None)
    assert (lower < upper).all()
    values = json.loads(path.read_text())
    edit(values)
    path.write_text(json.dumps(values))
    # A negative score gave intervals with lower above upper, used without a word.
    with pytest.raises(DataError, match=f"{path}.*{entry}.*train the run again"):
        Calibration.load(path)


def test_a_calibration_that_makes_validation_ece_worse_is_not_applied():
    from graphormer.training.calibration import Calibration

    rng = np.random.default_rng(3)  # a sample on which temperature scaling raises the ECE
    probs = rng.uniform(0.05, 0.95, 40)
    labels = (rng.uniform(size=40) < probs).astype(float)
    found = Calibration.fit(
        "binary classification", [], labels[:, None], probs[:, None], method="temperature"
    )
    assert found.kept_uncalibrated == [0] and found.temperature == [1.0]
    assert found.ece_after == found.ece_before
    np.testing.assert_allclose(found.calibrate(probs[:, None])[:, 0], probs, rtol=1e-12)
    isotonic = Calibration.fit(
        "binary classification", [], labels[:, None], probs[:, None], method="isotonic"
    )
    assert isotonic.kept_uncalibrated == [] and isotonic.ece_after[0] < isotonic.ece_before[0]


def test_calibration_says_what_it_did_in_the_log_and_the_metrics(molecules_csv, tmp_path):
    out = tmp_path / "run"
    args = train_args(
        molecules_csv, out, "binary", "trainer.max_epochs=1", "calibration=temperature"
    )
    log = call_script("train.py", args, tmp_path)
    found = json.loads((out / "metrics.json").read_text())["calibration"]
    assert found["method"] == "temperature" and set(found["ece_before"]) == {"binary"}
    before, after = found["ece_before"]["binary"], found["ece_after"]["binary"]
    assert after <= before
    line = f"calibration=temperature: validation ECE binary {before:.4f} -> {after:.4f}"
    assert line in log and line in (out / "train.log").read_text()


def test_hops_beyond_what_any_training_graph_has_are_refused_up_front(molecules_csv, tmp_path):
    from graphormer.training.settings import DataModuleSettings

    with pytest.raises(ConfigError, match=r"datamodule.max_hops=128 .* at most 127"):
        DataModuleSettings(max_nodes=128, max_hops=128)
    assert DataModuleSettings(max_nodes=128, max_hops=127).max_hops == 127
    assert DataModuleSettings(max_nodes=1, max_hops=1).max_hops == 1
    # datamodule.max_hops follows the model's: 100000 hops per node pair of 120 molecules asked
    # numpy for 7.3 GiB (22 GB on a larger set) before the kernel killed the run.
    args = train_args(molecules_csv, tmp_path / "run", "tpsa", "model.multi_hop_max_dist=100000")
    line = error_line(call_failing("train.py", args, tmp_path))
    assert "max_hops=100000 is not allowed: at most 127" in line, line
    assert "model.multi_hop_max_dist" in line


class FirstEpochSteps(pl.Callback):
    """The training loss and learning rate of each step of the first epoch."""

    def __init__(self) -> None:
        self.losses, self.lrs = [], []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if trainer.current_epoch == 0 and outputs is not None:
            self.losses.append(float(outputs["loss"]))
            self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])


def test_a_probed_head_is_not_undone_by_the_first_fine_tuning_epoch(tmp_path):
    table = nci_table()
    table.iloc[200:1000].to_csv(tmp_path / "pre.csv", index=False)
    tuned = table.iloc[:200].copy()
    tuned["tpsa"] = np.log1p(tuned.tpsa) * 3  # another target on other molecules
    tuned.to_csv(tmp_path / "ft.csv", index=False)
    pre = tmp_path / "pre"
    common = ["dataset.auxiliary_atom_descriptors=false", "model.dropout=0.1"]
    call_script(
        "train.py",
        train_args(tmp_path / "pre.csv", pre, "tpsa", "trainer.max_epochs=4", *common),
        tmp_path,
    )
    best = json.loads((pre / "metrics.json").read_text())["best_checkpoint"]

    def first_epoch(name: str, *extra: str) -> FirstEpochSteps:
        steps = FirstEpochSteps()
        args = train_args(
            tmp_path / "ft.csv",
            tmp_path / name,
            "tpsa",
            "trainer.max_epochs=3",
            f"pretrained={best}",
            "pretrained_head=probe",
            f"output_dir={tmp_path / name}",
            *common,
            *extra,
        )
        train_config(compose_train(args), callbacks=[steps])
        return steps

    # 160 training molecules in batches of 32: the learning rate rises over the whole first
    # epoch (the callback sees the next step's rate).
    warmed = first_epoch("warmed")
    assert len(warmed.lrs) == 5 and warmed.lrs[:4] == sorted(warmed.lrs[:4])
    assert warmed.lrs[0] == pytest.approx(0.4e-3)
    # The default 6% warm-up of 15 steps was one step, as optim.warmup_steps=1 is: the loss went
    # from the probe's 0.34 to 14.6 within the first epoch (4.6 on average; 0.65 warmed).
    abrupt = first_epoch("abrupt", "optim.warmup_steps=1")
    mean = np.mean(warmed.losses)
    assert mean < 0.5 * np.mean(abrupt.losses), (warmed.losses, abrupt.losses)
    assert mean < 3 * warmed.losses[0], warmed.losses


def test_max_steps_that_end_before_the_first_validation_fail_before_training(
    molecules_csv, tmp_path
):
    out = tmp_path / "run"
    # 96 training molecules in batches of 32: validation first runs after step 3. Two steps
    # trained, then said "no checkpoint was selected because validation never ran".
    args = train_args(molecules_csv, out, "tpsa", "trainer.max_steps=2")
    line = error_line(call_failing("train.py", args, tmp_path))
    assert "trainer.max_steps=2 ends training before validation first runs" in line, line
    assert "at least 3" in line
    assert not list(out.glob("checkpoints/*.ckpt"))
    half = train_args(
        molecules_csv,
        tmp_path / "half",
        "tpsa",
        "trainer.max_steps=1",
        "trainer.val_check_interval=0.4",
    )
    call_script("train.py", half, tmp_path)  # validates after the first batch
