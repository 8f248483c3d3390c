"""Nothing silently wrong: what used to end with inf, an empty column or a success line after
hours of training is one ``error:`` line, before training where the config and the data's size
could have told."""

import json

import numpy as np
import pandas as pd
import pytest

from graphormer.data import GraphDataModule, SmilesCsvSource
from graphormer.errors import ConfigError, DataError
from graphormer.training.settings import TrainerSettings

from helpers import TINY, call_failing, call_script, nci_table


@pytest.fixture(scope="module")
def molecules() -> pd.DataFrame:
    """120 NCI molecules with their TPSA and a binary label (TPSA above the median)."""
    table = nci_table().iloc[:120].copy()
    table["binary"] = (table.tpsa > table.tpsa.median()).astype(float)
    return table.reset_index(drop=True)


def train_args(csv, out, target="tpsa", *extra):
    binary = ["dataset.task_type=binary"] if target == "binary" else []
    return [
        "dataset=smiles_csv",
        f"dataset.path={csv}",
        f"dataset.targets=[{target}]",
        *binary,
        f"dataset.root={out.parent / 'data'}",
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


def test_a_diverging_run_that_skips_most_updates_is_not_a_success(molecules, tmp_path):
    molecules.to_csv(tmp_path / "m.csv", index=False)
    out = tmp_path / "run"
    args = train_args(
        tmp_path / "m.csv",
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


def test_cv_folds_beyond_the_scaffold_groups_fail_before_any_fold_trains(molecules, tmp_path):
    molecules.to_csv(tmp_path / "m.csv", index=False)
    out = tmp_path / "run"
    args = train_args(tmp_path / "m.csv", out, "tpsa", "trainer.max_epochs=1", "cv.folds=100")
    line = error_line(call_failing("train.py", args, tmp_path))
    assert "cv.folds=100 is more than" in line and "give cv.folds <= 49" in line, line
    assert not list(out.glob("folds/*/checkpoints/*.ckpt"))


def test_a_fold_that_cannot_be_scored_fails_before_any_fold_trains(molecules, tmp_path):
    molecules.to_csv(tmp_path / "m.csv", index=False)
    out = tmp_path / "run"
    args = train_args(tmp_path / "m.csv", out, "binary", "trainer.max_epochs=1", "cv.folds=45")
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
