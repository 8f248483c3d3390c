"""dataset=pyg_file (issue #17): a user's own list of PyG graphs, with categorical, continuous and
absent features, multi-class and regression tasks, trained, evaluated and checked offline."""

import os
import pickle

import numpy as np
import pandas as pd
import pytest
import torch
from torch_geometric.data import Data

from graphormer.data import build_source
from graphormer.data.tasks import TaskInfo, score
from graphormer.errors import ConfigError, DataError
from graphormer.testing import shape_graphs
from graphormer.training import evaluate

from helpers import TINY, compose_train, train_config

# Graphs of three shapes; the label is the shape (balanced classes: majority-class accuracy 1/3).
NUM_GRAPHS = 240


def write(path, graphs):
    torch.save(graphs, path)
    return path


def train_on(path, work, *overrides, epochs=12):
    cfg = compose_train(
        [
            *TINY,
            "dataset=pyg_file",
            f"dataset.path={path}",
            f"dataset.root={work}",
            f"output_dir={work / 'run'}",
            f"trainer.max_epochs={epochs}",
            *overrides,
        ]
    )
    return train_config(cfg)


@pytest.fixture(scope="module")
def shapes_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("pyg_file")
    path = write(work / "graphs.pt", shape_graphs(NUM_GRAPHS, seed=1))
    metrics = train_on(
        path, work, "dataset.task_type=multiclass", "dataset.categorical_node_columns=[0]"
    )
    return work, path, metrics


def test_a_multiclass_model_learns_the_shapes_far_above_the_majority_class(shapes_run):
    _, _, metrics = shapes_run
    assert metrics["metric"] == "acc"
    # Three balanced classes: the majority class scores about 1/3.
    assert metrics["test"]["acc"] > 0.7, metrics


def test_the_checkpoint_stores_the_feature_sizes_and_statistics(shapes_run):
    from graphormer.training import GraphormerModule

    _, _, metrics = shapes_run
    module = GraphormerModule.from_checkpoint(metrics["best_checkpoint"])
    config = module.config
    assert config.atom_feature_dims == [4] and config.bond_feature_dims == []
    assert (config.node_continuous_dim, config.edge_continuous_dim) == (2, 1)
    assert module.task == TaskInfo("pyg_file", "multiclass classification", 1, "acc", 3)
    assert config.num_tasks == 3  # one logit per class
    projection = module.model.node_encoder.continuous
    # Column 1 lies around 1000 with a spread of 100: standardised with the training split's.
    assert 950 < float(projection.mean[0]) < 1050 and 80 < float(projection.std[0]) < 120


def test_eval_reproduces_training_exactly(shapes_run, tmp_path):
    _, _, metrics = shapes_run
    results = evaluate(metrics["best_checkpoint"], split="all", output=tmp_path / "eval.json")
    assert results["test"]["acc"] == metrics["test"]["acc"]
    assert results["valid"]["acc"] == metrics["valid"]["acc"]


def test_eval_refuses_a_file_whose_features_no_longer_fit(shapes_run, tmp_path):
    _, _, metrics = shapes_run
    graphs = shape_graphs(30, seed=2)
    for g in graphs:
        g.x = g.x[:, :2]  # one continuous column fewer
    moved = write(tmp_path / "other.pt", graphs)
    with pytest.raises(Exception, match="1 continuous node feature column.*reads 2"):
        evaluate(metrics["best_checkpoint"], dataset_path=str(moved), output=tmp_path / "e.json")


def test_regression_on_continuous_features_beats_the_mean(tmp_path):
    path = write(tmp_path / "graphs.pt", shape_graphs(NUM_GRAPHS, seed=3, regression=True))
    metrics = train_on(path, tmp_path, "dataset.task_type=regression", epochs=15)
    y = torch.stack([g.y.view(-1) for g in torch.load(path, weights_only=False)])
    spread = float(y.std())  # the RMSE of predicting the mean
    assert metrics["test"]["rmse"] < 0.6 * spread, (metrics, spread)


def test_graphs_without_features_train_on_structure_alone(tmp_path):
    graphs = shape_graphs(NUM_GRAPHS, seed=4)
    bare = [Data(edge_index=g.edge_index, num_nodes=g.num_nodes, y=g.y) for g in graphs]
    path = write(tmp_path / "bare.pt", bare)
    metrics = train_on(path, tmp_path, "dataset.task_type=multiclass", "dataset.metric=f1")
    assert metrics["metric"] == "f1" and metrics["test"]["f1"] > 0.7, metrics


def test_splits_given_in_the_file_are_kept(tmp_path):
    graphs = shape_graphs(12)
    for i, g in enumerate(graphs):
        g.split = ("train", "train", "valid", "test")[i % 4]
    source = build_source(
        {
            "source": "pyg_file",
            "path": str(write(tmp_path / "g.pt", graphs)),
            "task_type": "multiclass",
        }
    )
    loaded = source.load()
    assert loaded.split["train"].tolist() == [0, 1, 4, 5, 8, 9]
    assert loaded.split["valid"].tolist() == [2, 6, 10]
    assert loaded.split["test"].tolist() == [3, 7, 11]


def split_with(graphs, position, value):
    for g in graphs:
        g.split = "train"
    graphs[position].split = value


def bad_file(tmp_path, change):
    graphs = shape_graphs(9)
    change(graphs)
    return str(write(tmp_path / "bad.pt", graphs))


@pytest.mark.parametrize(
    "change, settings, message",
    [
        (
            lambda g: g[4].x.__setitem__((2, 2), float("nan")),
            {},
            r"graph 4 has a nan in node feature column 2",
        ),
        (
            lambda g: g[1].edge_attr.__setitem__((0, 0), float("inf")),
            {},
            r"graph 1 has a inf in edge feature column 0",
        ),
        (
            lambda g: setattr(g[3], "y", torch.tensor([1.5])),
            {},
            r"graph\(s\) \[3\] have labels \[1.5\]",
        ),
        (lambda g: None, {"num_classes": 2}, r"have labels \[2.0\]; .* class id in 0..1"),
        (lambda g: split_with(g, 2, "val"), {}, r"graph 2's split is 'val'"),
        (
            lambda g: setattr(g[5], "x", g[5].x[:, :2]),
            {},
            r"graph 5's x has 2 columns, graph 0's 3",
        ),
        (lambda g: None, {"categorical_node_columns": [1]}, r"categorical node column 1"),
        (
            lambda g: setattr(g[0], "edge_index", g[0].edge_index + 100),
            {},
            r"graph 0's edge_index refers to node",
        ),
    ],
)
def test_bad_graphs_are_one_clear_error(tmp_path, change, settings, message):
    path = bad_file(tmp_path, change)
    source = build_source(
        {"source": "pyg_file", "path": path, "task_type": "multiclass", **settings}
    )
    with pytest.raises(DataError, match=message):
        source.task_info()
        source.feature_dims()


def test_a_class_absent_from_training_is_named(tmp_path):
    graphs = shape_graphs(12)
    for i, g in enumerate(graphs):
        g.split = "train" if g.y.item() != 2 else ("valid", "test")[i % 2]
    path = str(write(tmp_path / "g.pt", graphs))
    source = build_source({"source": "pyg_file", "path": path, "task_type": "multiclass"})
    with pytest.warns(UserWarning, match=r"class\(es\) 2 of 3 have no training graph"):
        source.load()


class Payload:
    def __reduce__(self):
        return (os.system, ("echo hacked",))


def test_a_file_holding_code_is_refused_without_running_it(tmp_path, capfd):
    path = tmp_path / "evil.pt"
    torch.save([*shape_graphs(2), Payload()], path)
    source = build_source({"source": "pyg_file", "path": str(path), "task_type": "multiclass"})
    with pytest.raises(DataError, match=r"holds more than tensors and PyG Data objects \(.*system"):
        source.task_info()
    assert "hacked" not in capfd.readouterr().out
    plain = tmp_path / "plain.pkl"
    plain.write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(DataError, match="is not read"):
        build_source({"source": "pyg_file", "path": str(plain)}).task_info()


def test_settings_are_checked(tmp_path):
    with pytest.raises(ConfigError, match=r"dataset.task_type must be one of"):
        build_source({"source": "pyg_file", "path": "x.pt", "task_type": "ordinal"})
    with pytest.raises(ConfigError, match=r"dataset.metric='rmse' does not fit"):
        build_source(
            {"source": "pyg_file", "path": "x.pt", "task_type": "multiclass", "metric": "rmse"}
        )
    with pytest.raises(DataError, match="does not exist"):
        build_source({"source": "pyg_file", "path": str(tmp_path / "none.pt")}).task_info()


def test_macro_f1_and_accuracy_take_logits():
    task = TaskInfo("t", "multiclass classification", 1, "acc", 3)
    y_true = torch.tensor([[0.0], [1.0], [2.0], [2.0]])
    logits = torch.tensor([[5.0, 0, 0], [0, 5.0, 0], [0, 5.0, 0], [0, 0, 5.0]])
    assert score(task, task.evaluator(), y_true, logits, "test") == 0.75
    f1 = TaskInfo("t", "multiclass classification", 1, "f1", 3)
    # Per class F1: 1, 2/3, 2/3.
    assert abs(score(f1, f1.evaluator(), y_true, logits, "test") - 7 / 9) < 1e-9


# -- prediction on graphs --------------------------------------------------------------------


def test_predict_graphs_keeps_every_row_and_matches_eval(shapes_run):
    from graphormer import Predictor

    _, path, metrics = shapes_run
    predictor = Predictor.from_checkpoint(metrics["best_checkpoint"], device="cpu")
    source = build_source({"source": "pyg_file", "path": str(path), "task_type": "multiclass"})
    test = source.load().split["test"].tolist()
    graphs = torch.load(path, weights_only=False)
    chosen = [graphs[i] for i in test]
    narrow = chosen[0].clone()
    narrow.x = narrow.x[:, :2]
    unseen = chosen[1].clone()
    unseen.x[0, 0] = 9  # a categorical id beyond the model's table of 4
    broken = chosen[2].clone()
    broken.x[1, 2] = float("inf")
    inputs = [narrow, *chosen, "not a graph", unseen, broken]
    result = predictor.predict_graphs(inputs)
    assert len(result.errors) == len(inputs) == len(result.values)
    assert "the model reads 1 and 2" in result.errors[0]
    assert "not a torch_geometric.data.Data" in result.errors[-3]
    assert "beyond the model's 4 classes" in result.errors[-2]
    assert "has a inf in node feature column 2" in result.errors[-1]
    good = result.values[1 : 1 + len(chosen)]
    assert not any(result.errors[1 : 1 + len(chosen)]) and np.allclose(good.sum(-1), 1, atol=1e-5)
    labels = np.array([int(g.y) for g in chosen])
    assert (good.argmax(-1) == labels).mean() == pytest.approx(metrics["test"]["acc"], abs=1e-6)
    table = predictor.table(pd.DataFrame({"graph": range(len(inputs))}), result)
    assert list(table.columns) == [
        "graph",
        "task_0_prob_0",
        "task_0_prob_1",
        "task_0_prob_2",
        "task_0",
        "error",
    ]
    assert table["task_0"].isna().tolist() == [True] + [False] * len(chosen) + [True] * 3


def test_a_graph_model_refuses_smiles_but_not_graphs(shapes_run):
    from graphormer import Predictor
    from graphormer.checkpoint import CheckpointError

    _, _, metrics = shapes_run
    predictor = Predictor.from_checkpoint(metrics["best_checkpoint"], device="cpu")
    with pytest.raises(CheckpointError, match=r"not on molecules .* input=graphs.pt"):
        predictor.predict(["CCO"])


def test_predict_command_reads_a_graph_file(shapes_run, tmp_path):
    from graphormer.cli.predict import run

    from helpers import compose_config

    _, path, metrics = shapes_run
    graphs = shape_graphs(6, seed=9)
    graphs[2].split = "test"
    for g in graphs:
        g.split = g.get("split") or "train"
    graphs[4].x = graphs[4].x[:, :1]
    torch.save(graphs, tmp_path / "new.pt")
    out = tmp_path / "preds.csv"
    cfg = compose_config(
        "predict",
        [
            f"ckpt={metrics['best_checkpoint']}",
            f"input={tmp_path / 'new.pt'}",
            f"output={out}",
            "device=cpu",
        ],
    )
    run(cfg)
    table = pd.read_csv(out, keep_default_na=False)
    assert table["graph"].tolist() == list(range(6))
    assert table["split"].tolist() == ["train", "train", "test", "train", "train", "train"]
    assert table["error"].astype(bool).tolist() == [False] * 4 + [True, False]
    assert table.loc[4, "task_0"] == "" and set(
        table.loc[[0, 1, 2, 3, 5], "task_0"].astype(str)
    ) <= {"0", "1", "2"}


def test_fine_tuning_on_graphs_with_other_features_is_one_clear_error(shapes_run, tmp_path):
    _, _, metrics = shapes_run
    graphs = shape_graphs(30, seed=6)
    for g in graphs:
        g.x = g.x[:, :2]  # one continuous node column fewer than the checkpoint's model reads
    path = write(tmp_path / "other.pt", graphs)
    from graphormer.checkpoint import CheckpointError

    with pytest.raises(CheckpointError, match=r"does not fit .* model.node_continuous_dim 2 vs 1"):
        train_on(
            path,
            tmp_path,
            f"pretrained={metrics['best_checkpoint']}",
            "dataset.task_type=multiclass",
            "dataset.categorical_node_columns=[0]",
        )
