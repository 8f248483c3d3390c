"""dataset=ogbg-ppa (issue #17) through OGB's own loader, offline, on a tiny ppa-layout folder of
non-molecular graphs: no node features, 7 continuous edge features, 37 classes, OGB's accuracy."""

import pytest
import torch

from graphormer.data import StructuralFeatures, build_source
from graphormer.testing import shape_graphs, write_ppa_layout
from graphormer.training import evaluate

from helpers import TINY, compose_train, train_config


@pytest.fixture(scope="module")
def ppa_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("ppa")
    graphs = shape_graphs(240, seed=5)
    labels = [int(g.y) for g in graphs]
    write_ppa_layout(root, graphs, labels)
    return root, graphs, labels


def test_graphs_have_no_node_features_and_seven_continuous_edge_features(ppa_root):
    root, graphs, labels = ppa_root
    source = build_source({"source": "ogbg_ppa", "root": str(root)})
    task = source.task_info()
    assert (task.task_type, task.metric, task.num_classes) == (
        "multiclass classification",
        "acc",
        37,
    )
    assert source.feature_dims() == ([], []) and source.continuous_dims() == (0, 7)
    loaded = source.load(StructuralFeatures(5))
    assert [len(loaded.split[k]) for k in ("train", "valid", "test")] == [192, 24, 24]
    graph = loaded.dataset[3]
    assert graph.x.shape == (graphs[3].num_nodes, 0) and graph.edge_attr.shape[1] == 0
    assert graph.edge_attr_continuous.shape == (graphs[3].edge_index.size(1), 7)
    assert int(graph.y) == labels[3]
    # OGB added the reverse of every edge (add_inverse_edge).
    pairs = set(map(tuple, graph.edge_index.t().tolist()))
    assert pairs == set(map(tuple, graphs[3].edge_index.t().tolist()))


def test_training_beats_the_majority_class_scored_by_ogbs_evaluator(ppa_root, tmp_path):
    from ogb.graphproppred import Evaluator

    root, _, labels = ppa_root
    cfg = compose_train(
        [*TINY, "dataset=ogbg-ppa", f"dataset.root={root}", f"output_dir={tmp_path / 'run'}",
         "trainer.max_epochs=12"]
    )  # fmt: skip
    with pytest.warns(UserWarning, match=r"class\(es\) 3, 4, 5"):
        metrics = train_config(cfg)
    assert metrics["metric"] == "acc" and metrics["test"]["acc"] > 0.7, metrics  # majority ~1/3
    results = evaluate(metrics["best_checkpoint"], split="test", output=tmp_path / "eval.json")
    assert results["test"]["acc"] == metrics["test"]["acc"]
    assert isinstance(
        build_source({"source": "ogbg_ppa", "root": str(root)}).task_info().evaluator(), Evaluator
    )
    assert torch.tensor(labels).max() == 2
