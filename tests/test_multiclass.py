"""Multi-class tasks on a user's molecules (dataset=smiles_csv dataset.task_type=multiclass;
issue #17): class ids from a CSV column, cross-entropy, accuracy, one probability per class."""

import numpy as np
import pandas as pd
import pytest

from graphormer.cli.train import run as train_run
from graphormer.data import build_source
from graphormer.errors import DataError

from helpers import TINY, compose_train, nci_table


def tertiles(limit=360):
    """Real molecules labelled by their TPSA tertile: classes 0, 1, 2 (majority share ~1/3)."""
    table = nci_table().iloc[:limit].copy()
    table["band"] = pd.qcut(table.tpsa, 3, labels=False).astype(int)
    return table[["smiles", "band"]]


def csv(tmp_path, table, name="bands.csv"):
    path = tmp_path / name
    table.to_csv(path, index=False)
    return path


def source(path, **settings):
    values = {
        "source": "smiles_csv",
        "path": str(path),
        "targets": ["band"],
        "root": str(path.parent),
    }
    return build_source({**values, "task_type": "multiclass", "split": "random", **settings})


def test_smiles_csv_trains_a_multiclass_task_above_the_majority_class(tmp_path):
    table = tertiles()
    path = csv(tmp_path, table)
    cfg = compose_train(
        [
            *TINY,
            "dataset=smiles_csv",
            f"dataset.path={path}",
            "dataset.targets=[band]",
            "dataset.task_type=multiclass",
            "dataset.split=random",
            f"dataset.root={tmp_path}",
            f"output_dir={tmp_path / 'run'}",
            "trainer.max_epochs=10",
        ]
    )
    # Through graphormer-train's own path (the run, then its end-of-training calibration step,
    # which a multi-class task skips), as a user runs it.
    metrics = train_run(cfg)
    assert metrics["calibration"] is None
    assert not (tmp_path / "run" / "calibration.json").exists()
    majority = table.band.value_counts(normalize=True).max()
    assert metrics["metric"] == "acc"
    assert metrics["test"]["acc"] > majority + 0.2, (metrics, majority)

    from graphormer import Predictor

    predictor = Predictor.from_checkpoint(metrics["best_checkpoint"], device="cpu")
    out = predictor.predict(["CCO", "not a smiles", "OC(=O)c1ccccc1O"])
    assert list(out.columns) == [
        "smiles",
        "band_prob_0",
        "band_prob_1",
        "band_prob_2",
        "band",
        "error",
    ]
    probabilities = out[["band_prob_0", "band_prob_1", "band_prob_2"]].to_numpy()
    assert np.allclose(probabilities[[0, 2]].sum(-1), 1, atol=1e-5)
    assert np.isnan(probabilities[1]).all() and out.band.isna().tolist() == [False, True, False]
    assert out.band[0] == probabilities[0].argmax()


def test_the_number_of_classes_comes_from_the_labels_or_the_setting(tmp_path):
    path = csv(tmp_path, tertiles(60))
    assert source(path).task_info().num_classes == 3
    assert source(path, num_classes=5).task_info().num_classes == 5


@pytest.mark.parametrize(
    "label, settings, message",
    [
        (1.5, {}, r"row\(s\) \(0-based, header excluded\) \[7\] have labels \[1.5\]; a multi"),
        (-1, {}, r"have labels \[-1.0\]"),
        (2, {"num_classes": 2}, r"class id in 0..1"),
    ],
)
def test_bad_class_labels_are_one_clear_error(tmp_path, label, settings, message):
    table = tertiles(60)
    table["band"] = table.band.clip(upper=1).astype(float)
    table.loc[7, "band"] = label
    with pytest.raises(DataError, match=message):
        source(csv(tmp_path, table), **settings).load()
