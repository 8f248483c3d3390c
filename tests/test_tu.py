"""dataset=tu (issue #17): TU datasets through PyG's raw-file reader, offline, on TU files made
of rdkit's molecules with float node attributes."""

import pytest
import torch
import torch_geometric.data

from graphormer.data import DatasetNotFoundError, StructuralFeatures, build_source
from graphormer.errors import ConfigError
from graphormer.testing import nci_tu
from graphormer.training import evaluate

from helpers import TINY, compose_train, train_config


@pytest.fixture(scope="module")
def tu_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("tu")
    labels = {
        "NCI_TU2": nci_tu(root, "NCI_TU2", limit=120, classes=2),
        "NCI_TU3": nci_tu(root, "NCI_TU3", limit=300, classes=3),
    }
    return root, labels


def tu(root, name, **settings):
    return build_source({"source": "tu", "name": name, "root": str(root), **settings})


def test_labels_are_categorical_attributes_continuous_and_the_task_follows_the_labels(tu_root):
    root, labels = tu_root
    binary = tu(root, "NCI_TU2")
    task = binary.task_info()
    assert (task.task_type, task.metric, task.num_classes) == (
        "binary classification",
        "rocauc",
        None,
    )
    multi = tu(root, "NCI_TU3")
    assert multi.task_info().num_classes == 3 and multi.task_info().metric == "acc"
    assert multi.continuous_dims() == (2, 0)
    node_dims, edge_dims = multi.feature_dims()
    assert len(node_dims) == 1 and len(edge_dims) == 1 and 5 < node_dims[0] < 120
    dataset = multi.load(StructuralFeatures(5)).dataset
    raw = root / "NCI_TU3" / "raw"
    node_labels = [int(v) for v in (raw / "NCI_TU3_node_labels.txt").read_text().split()]
    attributes = [
        [float(v) for v in line.split(",")]
        for line in (raw / "NCI_TU3_node_attributes.txt").read_text().splitlines()
    ]
    first = min(node_labels)
    graph = dataset[7]
    start = sum(dataset[i].num_nodes for i in range(7))
    n = graph.num_nodes
    assert graph.x.view(-1).tolist() == [v - first for v in node_labels[start : start + n]]
    torch.testing.assert_close(graph.x_continuous, torch.tensor(attributes[start : start + n]))
    assert graph.y.item() == labels["NCI_TU3"][7]
    # Bond types stay with their bonds after PyG reorders the edges.
    edges = [
        tuple(map(int, line.split(",")))
        for line in (raw / "NCI_TU3_A.txt").read_text().splitlines()
    ]
    bonds = [int(v) for v in (raw / "NCI_TU3_edge_labels.txt").read_text().split()]
    first_bond = min(bonds)
    expected = {
        (a - 1 - start, b - 1 - start): t - first_bond
        for (a, b), t in zip(edges, bonds, strict=True)
        if start < a <= start + n
    }
    got = dict(
        zip(
            map(tuple, graph.edge_index.t().tolist()),
            graph.edge_attr.view(-1).tolist(),
            strict=True,
        )
    )
    assert got == expected


def test_splits_are_seeded_and_stratified_by_class(tu_root):
    root, labels = tu_root
    y = torch.tensor(labels["NCI_TU3"])
    split = tu(root, "NCI_TU3").load().split
    again = tu(root, "NCI_TU3").load().split
    assert all(torch.equal(split[k], again[k]) for k in split)
    assert sorted(torch.cat(list(split.values())).tolist()) == list(range(len(y)))
    for name, part in split.items():
        shares = torch.bincount(y[part], minlength=3).float() / len(part)
        assert (shares - 1 / 3).abs().max() < 0.05, (name, shares)
    other = tu(root, "NCI_TU3", split="random", split_seed=1).load().split
    assert not torch.equal(other["test"], split["test"])
    with pytest.raises(ConfigError, match="dataset.split must be 'stratified', 'random' or 'file'"):
        tu(root, "NCI_TU3", split="scaffold")


def test_training_beats_the_majority_class_and_eval_reproduces_it(tu_root, tmp_path):
    root, labels = tu_root
    cfg = compose_train(
        [
            *TINY,
            "dataset=tu",
            "dataset.name=NCI_TU3",
            f"dataset.root={root}",
            f"output_dir={tmp_path / 'run'}",
            "trainer.max_epochs=10",
        ]
    )
    metrics = train_config(cfg)
    majority = max(labels["NCI_TU3"].count(c) for c in range(3)) / len(labels["NCI_TU3"])
    assert metrics["test"]["acc"] > majority + 0.15, (metrics, majority)
    results = evaluate(metrics["best_checkpoint"], split="test", output=tmp_path / "eval.json")
    assert results["test"]["acc"] == metrics["test"]["acc"]

    # Prediction needs the model only: the training data are neither read nor downloaded.
    from graphormer import Predictor
    from graphormer.data.sources.tu import TUSource

    expected = tu(root, "NCI_TU3").categorical_columns()  # read from the data

    def unreadable(self):
        raise AssertionError("prediction read the TU dataset")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TUSource, "graphs", unreadable)
        predictor = Predictor.from_checkpoint(metrics["best_checkpoint"], device="cpu")
    assert predictor.categorical_columns == expected


def test_no_network_is_a_clear_error_naming_the_url_and_the_folder(tmp_path, monkeypatch):
    def offline(url, folder, log=True):
        raise OSError("Network is unreachable")

    monkeypatch.setattr(torch_geometric.data, "download_url", offline)
    with pytest.raises(DatasetNotFoundError) as error:
        tu(tmp_path, "PROTEINS").task_info()
    message = str(error.value)
    assert "https://www.chrsmrrs.com/graphkerneldatasets/PROTEINS.zip" in message
    assert str(tmp_path / "PROTEINS" / "raw") in message and "Network is unreachable" in message
    assert not (tmp_path / "PROTEINS").exists()
