"""Several conformers per molecule (dataset.num_conformers > 1): evaluation, in training and in
eval.py, scores the mean over a molecule's conformers, as prediction does: the same numbers every
time."""

import numpy as np
import pytest
import torch

from graphormer.data.conformers import mean_over_repeats
from graphormer.data.sources import build_source

from helpers import TINY, compose_train, nci_table, train_config


def test_rows_of_one_key_are_averaged_and_their_keys_sorted():
    keys = torch.tensor([3, 1, 3, 1, 2])
    values = torch.tensor([[1.0], [10.0], [3.0], [20.0], [5.0]])
    labels = torch.tensor([7.0, 8.0, 7.0, 8.0, 9.0])
    found, mean, first = mean_over_repeats(keys, values, labels)
    assert found.tolist() == [1, 2, 3]
    assert mean.view(-1).tolist() == [15.0, 5.0, 2.0]
    assert first.tolist() == [8.0, 9.0, 7.0]
    # a value repeated (a graph evaluated twice) is itself, to the bit; no labels: None
    value = torch.tensor([0.1, 0.1, 1 / 3])
    found, mean, first = mean_over_repeats(torch.tensor([5, 5, 6]), value)
    assert mean.tolist() == [value[0].item(), value[2].item()] and first is None


def test_eval_of_a_model_of_several_conformers_is_their_mean_as_predict_gives(tmp_path):
    from graphormer.inference import Predictor
    from graphormer.training.evaluation import evaluate

    table = nci_table().iloc[:40].copy()
    table["split"] = ["train"] * 28 + ["valid"] * 6 + ["test"] * 6
    path = tmp_path / "molecules.csv"
    table.to_csv(path, index=False)
    cfg = compose_train(
        [
            "dataset=smiles_csv",
            f"dataset.path={path}",
            "dataset.targets=[tpsa]",
            "dataset.split=column",
            "dataset.split_column=split",
            "dataset.conformers=rdkit",
            "dataset.num_conformers=3",
            f"dataset.root={tmp_path / 'data'}",
            f"output_dir={tmp_path / 'run'}",
            "model.channels=3d",
            "model.num_kernels=16",
            "trainer.max_epochs=1",
            *TINY,
        ]
    )
    result = train_config(cfg)
    # the conformers differ enough to move the prediction: a random one would not reproduce
    source = build_source(
        {
            "source": "smiles_csv",
            "path": str(path),
            "targets": ["tpsa"],
            "conformers": "rdkit",
            "num_conformers": 3,
            "split": "column",
            "split_column": "split",
            "root": str(tmp_path / "data"),
        }
    )
    assert source.load().dataset._data.conformers.shape[1] == 3
    ckpt = result["best_checkpoint"]
    first, again = (
        evaluate(ckpt, split="all", output=tmp_path / f"eval{i}.json") for i in range(2)
    )
    assert first["valid"] == again["valid"] and first["test"] == again["test"]
    # training's validation scored the same mean
    assert first["valid"]["rmse"] == np.float32(result["valid"]["rmse"])
    predictor = Predictor.from_checkpoint(ckpt, device="cpu")
    for split in ("valid", "test"):
        rows = table[table.split == split]
        predicted = predictor.run(rows.smiles.tolist()).values[:, 0]
        rmse = float(np.sqrt(np.mean((predicted - rows.tpsa.to_numpy()) ** 2)))
        assert first[split]["rmse"] == pytest.approx(rmse, rel=1e-4)
