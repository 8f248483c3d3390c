"""PCQM4Mv2 through ogb.lsc's own loader, compact storage, training, evaluation and the
leaderboard submission file, offline on a PCQM4Mv2-layout dataset of real molecules."""

import json
import shutil
import urllib.error

import numpy as np
import pytest
import torch
from ogb.utils import smiles2graph

from graphormer.data import (
    DatasetNotFoundError,
    GraphDataModule,
    GraphormerCollator,
    StructuralFeatures,
    build_source,
)
from graphormer.data.featurize import featurize_compact
from graphormer.data.sources.pcqm4mv2 import write_compact
from graphormer.testing import nci_pcqm4mv2, nci_table

from helpers import TINY, call_failing, call_script, evaluate_run


@pytest.fixture(scope="module")
def pcqm_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("lsc")
    nci_pcqm4mv2(root, limit=300)
    return root


def datamodule(root, **kwargs):
    source = build_source({"source": "pcqm4mv2", "root": str(root), "processes": 2})
    module = GraphDataModule(source, batch_size=16, **kwargs)
    module.prepare_data()
    module.setup("fit")
    return module


def test_graphs_are_ogbs_featurisation_in_small_integer_types(pcqm_root):
    module = datamodule(pcqm_root)
    dataset = module.loaded.dataset
    assert (dataset.x.dtype, dataset.edge_index.dtype, dataset.edge_attr.dtype) == (
        np.uint8,
        np.int16,
        np.uint8,
    )
    assert module.split_sizes() == {"train": 210, "valid": 30, "test-dev": 30, "test-challenge": 30}
    smiles = nci_table().smiles[:300].tolist()
    for i in (0, 7, 150, 299):
        graph = smiles2graph(smiles[i])
        item = dataset[i]
        assert torch.equal(item.x.long(), torch.from_numpy(graph["node_feat"]))
        assert torch.equal(item.edge_index, torch.from_numpy(graph["edge_index"]))
        assert torch.equal(item.edge_attr.long(), torch.from_numpy(graph["edge_feat"]))
    tpsa = nci_table().tpsa.to_numpy()[:300]
    y = dataset.y.view(-1).numpy()
    np.testing.assert_allclose(y[:240], 3.0 + tpsa[:240] / 40.0, rtol=1e-6)
    assert np.isnan(y[240:]).all()  # test-dev and test-challenge carry no labels
    assert module.is_labelled("valid") and not module.is_labelled("test-dev")


def test_structural_features_are_computed_per_batch_and_equal_the_cached_ones(pcqm_root):
    dataset = datamodule(pcqm_root).loaded.dataset
    graphs = [dataset[i] for i in range(40)]
    assert "spatial_pos" not in graphs[0]  # never cached for this dataset
    collate = GraphormerCollator(max_hops=5, pad_to_multiple=8)
    on_the_fly = collate(graphs)
    cached = collate([StructuralFeatures(5)(g.clone()) for g in graphs])
    for name in ("x", "in_degree", "out_degree", "spatial_pos", "edge_path", "edge_attr", "y"):
        assert torch.equal(getattr(on_the_fly, name), getattr(cached, name)), name


def test_several_processes_write_what_one_does(tmp_path):
    smiles = nci_table().smiles[:120].tolist() + ["not a smiles"]
    labels = np.arange(121.0)
    split = {"train": np.arange(100), "valid": np.arange(100, 121)}
    write_compact(smiles, labels, split, str(tmp_path / "one"), processes=1, chunk=25)
    info = write_compact(smiles, labels, split, str(tmp_path / "two"), processes=2, chunk=25)
    assert info["graphs"] == 121 and info["failed"] == 1
    for name in ("x", "edge_index", "edge_attr", "node_ptr", "edge_ptr", "y"):
        a, b = (np.load(tmp_path / d / f"{name}.npy") for d in ("one", "two"))
        assert np.array_equal(a, b, equal_nan=True), name
    whole = featurize_compact(smiles)
    assert whole["failed"].tolist() == [120] and whole["num_nodes"][120] == 0
    assert not any(p.name.endswith(".partial") for p in tmp_path.iterdir())


def test_missing_dataset_without_network_is_a_clear_error(tmp_path, monkeypatch):
    import ogb.lsc.pcqm4mv2 as lsc

    def offline(url):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(lsc, "decide_download", offline)
    with pytest.raises(DatasetNotFoundError, match="pcqm4m-v2.zip .* dataset.root="):
        build_source({"source": "pcqm4mv2", "root": str(tmp_path)}).load()
    assert not (tmp_path / "pcqm4m-v2").exists()  # no empty leftovers


@pytest.fixture(scope="module")
def pcqm_run(tmp_path_factory, pcqm_root):
    work = tmp_path_factory.mktemp("pcqm_run")
    out = work / "run"
    log = call_script(
        "train.py",
        [
            "dataset=pcqm4mv2",
            f"dataset.root={pcqm_root}",
            "datamodule.num_workers=2",
            f"hydra.run.dir={out}",
            *TINY,
            "trainer.max_epochs=10",
            "optim.lr=3e-3",
        ],
        cwd=work,
    )
    return work, out, log


def test_training_reports_valid_mae_and_no_test_metric(pcqm_run):
    _, out, log = pcqm_run
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["metric"] == "mae" and metrics["test"] is None
    # Better than predicting the training mean (what a model that learned nothing scores).
    gaps = 3.0 + nci_table().tpsa.to_numpy()[:300] / 40.0
    baseline = np.abs(gaps[210:240] - gaps[:210].mean()).mean()  # 0.598 eV
    assert 0 < metrics["valid"]["mae"] < 0.8 * baseline
    assert "data: pcqm4mv2: train 210, valid 30, test-dev 30, test-challenge 30" in log
    assert "test mae: none (no labelled test split)" in log


def test_eval_reproduces_valid_mae_and_writes_the_submission_file(pcqm_run, tmp_path):
    from graphormer.training import GraphormerModule

    work, out, _ = pcqm_run
    metrics = json.loads((out / "metrics.json").read_text())
    result, _ = evaluate_run(metrics, work)  # split=all: the labelled evaluation splits
    assert set(result) >= {"valid"} and "test" not in result
    assert result["valid"]["mae"] == pytest.approx(metrics["valid"]["mae"], abs=1e-6)

    log = call_script(
        "eval.py",
        [
            f"ckpt={metrics['best_checkpoint']}",
            "split=test-dev",
            f"output={tmp_path / 'eval.json'}",
            f"hydra.run.dir={tmp_path / 'eval'}",
        ],
        cwd=tmp_path,
    )
    path = tmp_path / "y_pred_pcqm4m-v2_test-dev.npz"
    assert f"submission: {path}" in log and "NOT a valid leaderboard submission" in log
    y_pred = np.load(path)["y_pred"]
    assert y_pred.shape == (30,) and y_pred.dtype == np.float32
    # The file lists test-dev's molecules in OGB's order, each with the model's prediction.
    module = GraphormerModule.from_checkpoint(metrics["best_checkpoint"])
    dm = datamodule(_root_of(metrics))
    index = dm.loaded.split["test-dev"]
    batch = GraphormerCollator(max_hops=5, pad_to_multiple=8)(
        [dm.loaded.dataset[int(i)] for i in index]
    )
    with torch.no_grad():
        expected = module(batch).view(-1).numpy()
    np.testing.assert_allclose(y_pred, expected, atol=1e-5)


def _root_of(metrics):
    from graphormer import checkpoint

    hparams = checkpoint.load(metrics["best_checkpoint"]).hyper_parameters
    return hparams["data"]["dataset"]["root"]


def test_a_metric_for_an_unlabelled_split_is_a_clear_error(pcqm_run, tmp_path):
    _, out, _ = pcqm_run
    metrics = json.loads((out / "metrics.json").read_text())
    args = [f"ckpt={metrics['best_checkpoint']}", "split=test", f"hydra.run.dir={tmp_path / 'e'}"]
    result = call_failing("eval.py", args, tmp_path)
    assert "split='test' is not an evaluation split of pcqm4mv2" in result.stderr
    assert "test-dev" in result.stderr


def test_an_outdated_folder_never_prompts(tmp_path):
    folder = nci_pcqm4mv2(tmp_path, limit=40)
    (folder / "RELEASE_v1.txt").unlink()
    with pytest.raises(DatasetNotFoundError, match="RELEASE_v1.txt"):
        build_source({"source": "pcqm4mv2", "root": str(tmp_path)}).load()
    shutil.rmtree(folder)
