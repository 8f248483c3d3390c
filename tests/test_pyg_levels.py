"""dataset=pyg_file with node- and edge-level targets (issue #18): a node-level ``y``
(``dataset.y_level=node``) and an ``edge_y`` read as the atom and bond levels of any graph,
trained, evaluated and predicted."""

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score
from torch_geometric.data import Data
from torch_geometric.utils import degree

from graphormer.data import build_source
from graphormer.errors import ConfigError, DataError
from graphormer.training import evaluate

from helpers import TINY, compose_train, train_config


def level_graphs(count: int, seed: int = 0) -> list[Data]:
    """Random connected undirected graphs (each edge listed both ways) of 6-14 nodes with one
    categorical node feature in 0..2; ``y`` ``[N, 1]`` each node's degree, ``edge_y`` ``[E, 1]``
    1 where the edge's two nodes share their category: a node and an edge property that follow
    from the graph, never given as an input."""
    rng = np.random.default_rng(seed)
    graphs = []
    for _ in range(count):
        n = int(rng.integers(6, 15))
        pairs = {(int(rng.integers(0, i)), i) for i in range(1, n)}  # a random tree
        for _ in range(n // 2):
            i, j = sorted(rng.choice(n, 2, replace=False).tolist())
            pairs.add((i, j))
        edges = torch.tensor(sorted(pairs)).t()
        edge_index = torch.cat([edges, edges.flip(0)], dim=1)
        x = torch.from_numpy(rng.integers(0, 3, (n, 1)))
        same = (x[edge_index[0], 0] == x[edge_index[1], 0]).float().view(-1, 1)
        y = degree(edge_index[0], n).view(-1, 1)
        graphs.append(Data(x=x, edge_index=edge_index, y=y, edge_y=same))
    return graphs


@pytest.fixture(scope="module")
def levels_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("pyg_levels")
    path = work / "graphs.pt"
    torch.save(level_graphs(240), path)
    cfg = compose_train(
        [
            *TINY,
            "dataset=pyg_file",
            f"dataset.path={path}",
            f"dataset.root={work}",
            "dataset.y_level=node",
            "dataset.edge_task_type=binary",
            "dataset.categorical_node_columns=[0]",
            f"output_dir={work / 'run'}",
            "trainer.max_epochs=6",
            "optim.lr=2e-3",
        ]
    )
    return work, path, train_config(cfg)


def test_node_and_edge_targets_train_far_beyond_their_baselines(levels_run):
    _, path, results = levels_run
    assert results["metric"] == "atom_mae"  # the first level present: nodes
    assert set(results["test"]) == {"atom_mae", "atom_rmse", "bond_rocauc"}
    source = build_source({"source": "pyg_file", "path": str(path), "y_level": "node"})
    loaded = source.load()
    graphs = torch.load(path, weights_only=False)
    train = torch.cat([graphs[i].y for i in loaded.split["train"].tolist()])
    test = torch.cat([graphs[i].y for i in loaded.split["test"].tolist()])
    mean_mae = float((test - train.mean()).abs().mean())
    # Measured: the training mean is 1.0 off per node; the tiny model well under 0.3.
    assert results["test"]["atom_mae"] < 0.5 * mean_mae, (results["test"], mean_mae)
    # A constant edge rate ranks nothing (0.5); the categories are in the nodes' states.
    assert results["test"]["bond_rocauc"] > 0.85, results["test"]


def test_eval_and_predict_graphs_reproduce_every_level(levels_run, tmp_path):
    from graphormer import Predictor

    _, path, results = levels_run
    found = evaluate(results["best_checkpoint"], split="test", output=tmp_path / "eval.json")
    for name in ("atom_mae", "atom_rmse", "bond_rocauc"):
        assert found["test"][name] == pytest.approx(results["test"][name], rel=1e-5)
    predictor = Predictor.from_checkpoint(results["best_checkpoint"], device="cpu")
    # Named by position (prediction never needs the training file, so names are not read there).
    assert predictor.atom_task_names == ["atom_0"] and predictor.bond_task_names == ["bond_0"]
    source = build_source({"source": "pyg_file", "path": str(path), "y_level": "node"})
    test = source.load().split["test"].tolist()
    graphs = torch.load(path, weights_only=False)
    chosen = [graphs[i] for i in test]
    result = predictor.predict_graphs(chosen)
    assert [len(a) for a in result.atoms] == [g.num_nodes for g in chosen]
    assert [len(b) for b in result.bonds] == [g.edge_index.size(1) for g in chosen]
    truth = torch.cat([g.edge_y for g in chosen]).view(-1).numpy()
    predicted = np.concatenate(result.bonds).reshape(-1)
    assert roc_auc_score(truth, predicted) == pytest.approx(results["test"]["bond_rocauc"], 1e-5)
    nodes = np.concatenate(result.atoms).reshape(-1)
    degrees = torch.cat([g.y for g in chosen]).view(-1).numpy()
    assert np.abs(nodes - degrees).mean() == pytest.approx(results["test"]["atom_mae"], rel=1e-5)


def _source(path, **settings):
    return build_source({"source": "pyg_file", "path": str(path), **settings})


def test_level_labels_of_the_wrong_shape_are_one_clear_error(tmp_path):
    graphs = level_graphs(6)
    graphs[3].y = graphs[3].y[:-1]
    torch.save(graphs, tmp_path / "short.pt")
    with pytest.raises(DataError, match=r"graph 3's y has shape \[\d+, 1\], but it has \d+ nodes"):
        _source(tmp_path / "short.pt", y_level="node").task_info()
    # Read as graph-level labels, per-node rows of varying length name the setting.
    with pytest.raises(DataError, match="dataset.y_level=node"):
        _source(tmp_path / "short.pt").task_info()
    graphs = level_graphs(6)
    graphs[2].edge_y = graphs[2].edge_y[:3]
    torch.save(graphs, tmp_path / "edges.pt")
    with pytest.raises(DataError, match=r"graph 2's edge_y has shape \[3, 1\], but it has"):
        _source(tmp_path / "edges.pt", y_level="node").task_info()
    graphs = level_graphs(6)
    del graphs[4].edge_y
    torch.save(graphs, tmp_path / "some.pt")
    with pytest.raises(DataError, match="graph 4 has no edge_y"):
        _source(tmp_path / "some.pt", y_level="node").task_info()
    graphs = level_graphs(6)
    graphs[1].edge_y = graphs[1].edge_y * 2
    torch.save(graphs, tmp_path / "binary.pt")
    with pytest.raises(DataError, match="edge_task_type=binary takes 0/1"):
        _source(tmp_path / "binary.pt", y_level="node", edge_task_type="binary").task_info()
    with pytest.raises(ConfigError, match="dataset.y_level"):
        _source(tmp_path / "binary.pt", y_level="edge")
    with pytest.raises(ConfigError, match="dataset.node_task_type"):
        _source(tmp_path / "binary.pt", node_task_type="multiclass")
    # A graph-level task type with node-level labels alone would otherwise train regression.
    torch.save(level_graphs(6), tmp_path / "nodes.pt")
    for task_type in ("binary", "multiclass"):
        with pytest.raises(ConfigError, match="set dataset.node_task_type / dataset.edge_task"):
            _source(tmp_path / "nodes.pt", y_level="node", task_type=task_type).task_info()


def test_graph_targets_and_edge_targets_together(tmp_path):
    graphs = level_graphs(12)
    for g in graphs:
        g.y = torch.tensor([[float(g.num_nodes)]])
    torch.save(graphs, tmp_path / "both.pt")
    task = _source(tmp_path / "both.pt", edge_task_type="binary").task_info()
    assert (task.num_tasks, task.atom_tasks, task.bond_tasks) == (1, 0, 1)
    assert task.level_metrics == ("rmse", "bond_rocauc")
    dataset = _source(tmp_path / "both.pt", edge_task_type="binary").load().dataset
    assert dataset[5].bond_edge.tolist() == list(range(graphs[5].edge_index.size(1)))
    assert torch.equal(dataset[5].y_bond, graphs[5].edge_y)
    # Without edge_y the file reads exactly as before: no level fields.
    for g in graphs:
        del g.edge_y
    torch.save(graphs, tmp_path / "plain.pt")
    plain = _source(tmp_path / "plain.pt").load().dataset
    assert "y_bond" not in plain[0] and "bond_edge" not in plain[0] and "y_atom" not in plain[0]
