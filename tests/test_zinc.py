"""ZINC through PyG's own ZINC class (subclassed), offline, on a fixture in PyG's raw ZINC layout
made of real molecules: which molecules and labels each split holds, ZINC's vocabularies sizing
the model, training and evaluation end to end, and raw files read as data, never code."""

import contextlib
import json
import os
import pickle
import shutil
import urllib.error

import numpy as np
import pytest
import torch
import torch_geometric.datasets.zinc as pyg_zinc
from torch_geometric.datasets import ZINC

from graphormer.cli.train import settings_from
from graphormer.data import (
    DatasetCacheError,
    DatasetNotFoundError,
    StructuralFeatures,
    build_source,
)
from graphormer.errors import ConfigError, DataError
from graphormer.testing import nci_zinc, nci_zinc_splits, write_zinc_layout
from graphormer.training import CheckpointError, build_datamodule, build_module

from helpers import TINY, call_script, compose_train, evaluate_run

SPLITS = {"train": "train", "valid": "val", "test": "test"}  # ours -> ZINC's file names


@pytest.fixture(scope="module")
def zinc_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("zinc")
    nci_zinc(root)  # 300 / 60 / 60 molecules; the subset 200 / 40 / 40
    return root


def load(root, subset=True, max_hops=5):
    source = build_source({"source": "zinc", "root": str(root), "subset": subset})
    return source.load(StructuralFeatures(max_hops) if max_hops else None)


def adjacency(graph):
    """The dense bond-type matrix a graph's edges describe."""
    n = graph.x.size(0)
    dense = torch.zeros(n, n, dtype=torch.long)
    dense[graph.edge_index[0], graph.edge_index[1]] = graph.edge_attr.long()
    return dense


def test_subset_and_full_hold_each_splits_molecules_with_their_labels(zinc_root):
    molecules, index = nci_zinc_splits()
    for subset, sizes in ((True, (200, 40, 40)), (False, (300, 60, 60))):
        loaded = load(zinc_root, subset)
        dataset = loaded.dataset
        assert isinstance(dataset, ZINC)
        assert {k: len(v) for k, v in loaded.split.items()} == dict(zip(SPLITS, sizes, strict=True))
        assert loaded.task.metric == "mae" and loaded.task.task_type == "regression"
        for ours, theirs in SPLITS.items():
            # The subset's graphs are the index file's molecules, in the file's order.
            positions = index[theirs] if subset else range(len(molecules[theirs]))
            assert len(loaded.split[ours]) == len(positions)
            for k, position in zip(loaded.split[ours].tolist(), positions, strict=True):
                graph, molecule = dataset[k], molecules[theirs][position]
                assert torch.equal(graph.x.long().view(-1), molecule["atom_type"])
                assert torch.equal(adjacency(graph), molecule["bond_type"])
                assert graph.y.item() == molecule["logP_SA_cycle_normalized"].item()
        # ZINC's own featurisation: one atom-type column (28 types), 1-D bond types 1..3.
        assert dataset.x.shape[1] == 1 and dataset.edge_attr.dim() == 1
        assert 0 <= int(dataset.x.min()) and int(dataset.x.max()) < 28
        assert set(dataset.edge_attr.unique().tolist()) == {1, 2, 3}
        assert len(set(dataset.x.view(-1).tolist())) > 5  # not all carbons


def test_graphs_equal_what_pygs_own_zinc_loader_builds(zinc_root, tmp_path):
    # PyG's unmodified ZINC (its own pickle.load: fine for our own fixture) as the reference.
    shutil.copytree(zinc_root / "ZINC" / "raw", tmp_path / "raw")
    for subset in (True, False):
        loaded = load(zinc_root, subset)
        for ours, theirs in SPLITS.items():
            reference = ZINC(str(tmp_path), subset=subset, split=theirs)
            assert len(reference) == len(loaded.split[ours])
            for k, expected in zip(loaded.split[ours].tolist(), reference, strict=True):
                graph = loaded.dataset[k]
                assert torch.equal(graph.x.long(), expected.x)
                assert torch.equal(graph.edge_index, expected.edge_index)
                assert torch.equal(graph.edge_attr.long(), expected.edge_attr)
                assert torch.equal(graph.y.view(-1), expected.y.view(-1))


def test_structural_features_are_cached_under_their_settings(zinc_root):
    loaded = load(zinc_root, max_hops=3)
    folder = zinc_root / "ZINC" / "subset" / "processed"
    assert (folder / "structural_v2_hops3" / "graphs.pt").is_file()
    cached = (folder / "structural_v2_hops3" / "graphs.pt").stat().st_mtime_ns
    for k in (0, 57, 210, 279):
        graph = loaded.dataset[k]
        plain = graph.clone()
        for key in ("in_degree", "out_degree", "spatial_pos", "edge_path"):
            del plain[key]
        expected = StructuralFeatures(3)(plain)
        assert torch.equal(graph.spatial_pos, expected.spatial_pos)
        assert torch.equal(graph.edge_path, expected.edge_path)
        assert torch.equal(graph.in_degree, expected.in_degree)
    again = load(zinc_root, max_hops=3)  # read back, not processed again
    assert (folder / "structural_v2_hops3" / "graphs.pt").stat().st_mtime_ns == cached
    assert torch.equal(again.dataset[5].edge_path, loaded.dataset[5].edge_path)
    # Per-batch features (datamodule.on_the_fly) cache plain graphs in a folder of their own.
    assert "spatial_pos" not in load(zinc_root, max_hops=None).dataset[0]
    assert (folder / "plain" / "graphs.pt").is_file()


def _module(root, tmp_path, *overrides):
    cfg = compose_train(
        ["dataset=zinc", f"dataset.root={root}", "model=graphormer_tiny", f"output_dir={tmp_path}"]
        + list(overrides)
    )
    settings = settings_from(cfg)
    datamodule = build_datamodule(settings.dataset, settings.datamodule)
    return build_module(settings, datamodule), datamodule


def test_the_models_embedding_tables_follow_zincs_vocabularies(zinc_root, tmp_path):
    module, datamodule = _module(zinc_root, tmp_path)
    assert module.config.atom_feature_dims == [28] and module.config.bond_feature_dims == [4]
    assert module.model.node_encoder.atom.embedding.num_embeddings == 28
    assert module.model.attn_bias.edge.embedding.num_embeddings == 4
    # Saved with the model settings, so that a checkpoint rebuilds the same tables.
    assert module.hparams["model"]["atom_feature_dims"] == [28]
    assert module.hparams["model"]["bond_feature_dims"] == [4]
    datamodule.prepare_data()
    datamodule.setup("fit")
    batch = next(iter(datamodule.val_dataloader()))
    assert batch.x.shape[-1] == 1 and batch.edge_attr.shape[-1] == 1
    assert module(batch).shape == (batch.num_graphs, 1)

    # OGB-featurised datasets keep OGB's 9 atom and 3 bond columns.
    cfg = compose_train(["model=graphormer_tiny", f"output_dir={tmp_path}"])
    settings = settings_from(cfg)
    ogb = build_module(settings, build_datamodule(settings.dataset, settings.datamodule))
    assert len(ogb.config.atom_feature_dims) == 9 and len(ogb.config.bond_feature_dims) == 3

    # A user's own sizes are kept where they hold the data, refused where they cannot.
    larger, _ = _module(zinc_root, tmp_path, "model.atom_feature_dims=[40]")
    assert larger.model.node_encoder.atom.embedding.num_embeddings == 40
    with pytest.raises(ConfigError, match=r"model.atom_feature_dims=\[20\] cannot hold .* \[28\]"):
        _module(zinc_root, tmp_path, "model.atom_feature_dims=[20]")
    with pytest.raises(ConfigError, match=r"model.bond_feature_dims=\[5, 6, 2\] cannot hold"):
        _module(zinc_root, tmp_path, "model.bond_feature_dims=[5,6,2]")


@pytest.fixture(scope="module")
def zinc_run(tmp_path_factory, zinc_root):
    work = tmp_path_factory.mktemp("zinc_run")
    out = work / "run"
    log = call_script(
        "train.py",
        [
            "dataset=zinc",
            f"dataset.root={zinc_root}",
            f"hydra.run.dir={out}",
            *TINY,
            "trainer.max_epochs=20",
            "optim.lr=3e-3",
        ],
        cwd=work,
    )
    return work, out, log


def test_training_beats_the_mean_predictor(zinc_run):
    _, out, log = zinc_run
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["dataset"] == "zinc" and metrics["metric"] == "mae"
    molecules, index = nci_zinc_splits()

    def targets(split):
        return np.array(
            [molecules[split][i]["logP_SA_cycle_normalized"].item() for i in index[split]]
        )

    # A model that learned nothing predicts the training mean.
    mean = targets("train").mean()
    baseline = {ours: np.abs(targets(theirs) - mean).mean() for ours, theirs in SPLITS.items()}
    assert 0 < metrics["valid"]["mae"] < 0.8 * baseline["valid"], (metrics, baseline)
    assert 0 < metrics["test"]["mae"] < 0.8 * baseline["test"], (metrics, baseline)
    assert "data: zinc: train 200, valid 40, test 40" in log
    from graphormer import checkpoint

    hparams = checkpoint.load(metrics["best_checkpoint"]).hyper_parameters
    assert hparams["model"]["atom_feature_dims"] == [28]
    assert hparams["model"]["bond_feature_dims"] == [4]


def test_eval_reproduces_valid_and_test_mae(zinc_run):
    work, out, _ = zinc_run
    metrics = json.loads((out / "metrics.json").read_text())
    result, _ = evaluate_run(metrics, work)
    for split in ("valid", "test"):
        assert result[split]["mae"] == pytest.approx(metrics[split]["mae"], abs=1e-6)
    assert result["valid"]["num_graphs"] == 40 and result["test"]["num_graphs"] == 40


def test_prediction_from_smiles_refuses_a_zinc_checkpoint(zinc_run):
    from graphormer import Predictor

    _, out, _ = zinc_run
    metrics = json.loads((out / "metrics.json").read_text())
    with pytest.raises(
        CheckpointError, match=r"trained on ZINC \(zinc\).*\(smiles2graph\)"
    ) as error:
        # Graphs in ZINC's own features could still be given to predict_graphs: the refusal
        # comes with SMILES.
        Predictor.from_checkpoint(metrics["best_checkpoint"], device="cpu").predict(["CCO"])
    assert "\n" not in str(error.value)


# -- offline, and files that are not what they claim -------------------------------------------


def test_no_network_is_a_clear_error_naming_the_url_and_the_folder(tmp_path, monkeypatch):
    def offline(url, folder, *args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(pyg_zinc, "download_url", offline)
    with pytest.raises(DatasetNotFoundError) as error:
        load(tmp_path)
    message = str(error.value)
    assert ZINC.url in message and f"unzip it into {tmp_path / 'ZINC'}" in message
    assert "dataset.root=" in message and "\n" not in message
    assert not (tmp_path / "ZINC").exists()  # no empty leftovers


def test_a_partial_raw_folder_is_kept_and_named(tmp_path, monkeypatch):
    monkeypatch.setattr(pyg_zinc, "download_url", pytest.fail)  # must not be reached
    molecules, _ = nci_zinc_splits()
    write_zinc_layout(tmp_path, molecules)  # the pickles, without the subset's index files
    with pytest.raises(DatasetNotFoundError, match=r"lacks \['train.index', 'val.index'"):
        load(tmp_path, subset=True)
    assert (tmp_path / "ZINC" / "raw" / "train.pickle").is_file()  # PyG would delete raw/
    assert len(load(tmp_path, subset=False).split["test"]) == 60  # the full set needs no index


class Payload:
    """Creates a folder when unpickled: proof that a file's code ran."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


class StoragePayload:
    """A tensor storage whose bytes hide a payload (torch reads them with a full unpickle)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (torch.storage._load_from_bytes, (pickle.dumps(Payload(self.marker)),))


@pytest.mark.parametrize("where", ["molecule", "storage"])
def test_a_tampered_raw_pickle_is_refused_without_running_it(tmp_path, where):
    molecules, index = nci_zinc_splits()
    marker = tmp_path / "payload-ran"
    tampered = [dict(m) for m in molecules["train"]]
    tampered[3]["num_atom"] = Payload(marker) if where == "molecule" else StoragePayload(marker)
    write_zinc_layout(tmp_path, {**molecules, "train": tampered}, index)
    with pytest.raises(DataError, match="train.pickle holds more than data") as error:
        load(tmp_path)
    assert "\n" not in str(error.value) and "never code" in str(error.value)
    if where == "molecule":
        assert "posix.mkdir" in str(error.value) or "nt.mkdir" in str(error.value)
    assert not marker.exists()
    # The payload is live: Python's own unpickler (what PyG's process() uses) runs it (torch
    # then finds no storage in the hidden bytes, after the payload ran).
    with open(tmp_path / "ZINC" / "raw" / "train.pickle", "rb") as f:
        with contextlib.suppress(RuntimeError):
            pickle.load(f)
    assert marker.exists()


def test_a_tampered_processed_file_is_refused_without_running_it(zinc_root, tmp_path):
    shutil.copytree(zinc_root / "ZINC" / "raw", tmp_path / "ZINC" / "raw")
    load(tmp_path)
    folder = tmp_path / "ZINC" / "subset" / "processed" / StructuralFeatures(5).cache_key
    marker = tmp_path / "payload-ran"
    for name, error in (("graphs.pt", DatasetCacheError), ("pre_transform.pt", DatasetCacheError)):
        original = (folder / name).read_bytes()
        torch.save({"data": Payload(marker)}, folder / name)
        with pytest.raises(error, match=f"Delete the folder {folder}"):
            load(tmp_path)
        assert not marker.exists()
        (folder / name).write_bytes(original)
    assert len(load(tmp_path).dataset) == 280


def test_atom_types_outside_zincs_vocabulary_are_a_clear_error(tmp_path):
    molecules, index = nci_zinc_splits()
    bad = [dict(m) for m in molecules["val"]]
    bad[7]["atom_type"] = bad[7]["atom_type"].clone()
    bad[7]["atom_type"][0] = 31
    write_zinc_layout(tmp_path, {**molecules, "val": bad}, index)
    with pytest.raises(DataError, match=r"val.pickle holds atom type \[31\] outside ZINC's 28"):
        load(tmp_path, subset=False)
