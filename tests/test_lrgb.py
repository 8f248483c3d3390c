"""dataset=lrgb (issue #17): the LRGB peptide sets in PyG's raw layout, offline, from rdkit's
molecules featurised the OGB way; official split, AP / MAE, raw files read as data."""

import os

import pytest
import torch
import torch_geometric.data

from graphormer.data import DatasetNotFoundError, StructuralFeatures, build_source
from graphormer.errors import ConfigError, DataError
from graphormer.testing import write_lrgb_layout
from graphormer.training import evaluate

from helpers import TINY, compose_train, train_config


def lrgb(root, name):
    return build_source({"source": "lrgb", "name": name, "root": str(root)})


def test_peptides_func_is_ten_labels_scored_by_ap_with_the_official_split(tmp_path):
    write_lrgb_layout(tmp_path, "peptides-func", (30, 10, 10))
    source = lrgb(tmp_path, "Peptides-func")
    task = source.task_info()
    assert (task.task_type, task.num_tasks, task.metric) == ("binary classification", 10, "ap")
    loaded = source.load(StructuralFeatures(5))
    assert [loaded.split[k].tolist() for k in ("valid", "test")] == [
        list(range(30, 40)),
        list(range(40, 50)),
    ]
    train = torch.load(tmp_path / "peptides-func" / "raw" / "train.pt", weights_only=True)
    graph = loaded.dataset[4]
    assert torch.equal(graph.x, train[4][0]) and torch.equal(graph.edge_attr, train[4][1])
    assert torch.equal(graph.y, train[4][3]) and graph.spatial_pos.numel() == graph.num_nodes**2
    assert source.feature_dims() is None and source.smiles_refusal() is None  # OGB's features


def test_peptides_struct_training_beats_the_mean_and_eval_reproduces_it(tmp_path):
    write_lrgb_layout(tmp_path, "peptides-struct", (320, 40, 40))
    cfg = compose_train(
        [*TINY, "dataset=lrgb", "dataset.name=Peptides-struct", f"dataset.root={tmp_path}",
         f"output_dir={tmp_path / 'run'}", "trainer.max_epochs=20"]
    )  # fmt: skip
    metrics = train_config(cfg)
    raw = tmp_path / "peptides-struct" / "raw"
    train, test = (torch.load(raw / f"{s}.pt", weights_only=True) for s in ("train", "test"))
    y, mean = torch.cat([g[3] for g in test]), torch.cat([g[3] for g in train]).mean(0)
    mean_mae = float((y - mean).abs().mean())  # predicting the training mean
    assert metrics["metric"] == "mae" and metrics["test"]["mae"] < 0.75 * mean_mae, (
        metrics,
        mean_mae,
    )
    results = evaluate(metrics["best_checkpoint"], split="test", output=tmp_path / "eval.json")
    assert results["test"]["mae"] == metrics["test"]["mae"]


class Payload:
    def __reduce__(self):
        return (os.system, ("echo hacked",))


def test_raw_files_holding_code_are_refused_and_names_are_checked(tmp_path, capfd):
    raw = write_lrgb_layout(tmp_path, "peptides-func", (4, 2, 2))
    torch.save([Payload()], raw / "val.pt")
    with pytest.raises(DataError, match="val.pt is not read .*data, never code"):
        lrgb(tmp_path, "peptides-func").load()
    assert "hacked" not in capfd.readouterr().out
    with pytest.raises(ConfigError, match="choose Peptides-func or Peptides-struct"):
        lrgb(tmp_path, "PascalVOC-SP")


def test_no_network_is_a_clear_error_naming_the_url_and_the_folder(tmp_path, monkeypatch):
    def offline(url, folder, log=True):
        raise OSError("Network is unreachable")

    monkeypatch.setattr(torch_geometric.data, "download_url", offline)
    with pytest.raises(DatasetNotFoundError) as error:
        lrgb(tmp_path, "Peptides-struct").load()
    message = str(error.value)
    assert "https://www.dropbox.com/s/zgv4z8fcpmknhs8/peptidesstruct.zip?dl=1" in message
    assert str(tmp_path / "peptides-struct" / "raw") in message
