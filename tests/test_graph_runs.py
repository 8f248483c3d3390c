"""Runs on graphs that are not OGB molecules (issue #17): an interrupted `tu` or `pyg_file` run
resumed from its checkpoint ends exactly like the uninterrupted one."""

import json

import lightning.pytorch as pl
import pytest
import torch

from graphormer import checkpoint
from graphormer.testing import nci_tu, shape_graphs
from graphormer.training.run import RunInterrupted

from helpers import TINY, compose_train, train_config

# Dropout on, so that the random streams matter for exactness.
NOISY = [*TINY, "model.dropout=0.1", "model.attention_dropout=0.1", "trainer.max_epochs=3"]


@pytest.fixture(scope="module")
def graph_data(tmp_path_factory):
    """A TU dataset (NCI molecules, float node attributes) and a graphs.pt of non-molecular
    shapes with continuous node and edge features."""
    root = tmp_path_factory.mktemp("graphs")
    nci_tu(root, "NCI_TU2", limit=96, classes=2)
    torch.save(shape_graphs(96, seed=3), root / "graphs.pt")
    return root


def dataset_args(kind, root):
    if kind == "tu":
        return ["dataset=tu", "dataset.name=NCI_TU2", f"dataset.root={root}"]
    return [
        "dataset=pyg_file",
        f"dataset.path={root / 'graphs.pt'}",
        f"dataset.root={root}",
        "dataset.task_type=multiclass",
        "dataset.categorical_node_columns=[0]",
    ]


class CtrlCAtEpoch(pl.Callback):
    """Ctrl-C as the epoch ``epoch`` (0-based) starts: the epochs before it are saved."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch == self.epoch:
            raise KeyboardInterrupt


def final(out):
    metrics = json.loads((out / "metrics.json").read_text())
    state = checkpoint.load(out / "checkpoints" / "last.ckpt").state_dict
    return {k: metrics[k] for k in ("valid", "test", "epochs")}, state


@pytest.mark.parametrize("kind", ["tu", "pyg_file"])
def test_an_interrupted_run_resumes_exactly(graph_data, kind, tmp_path):
    args = [*NOISY, *dataset_args(kind, graph_data)]
    reference = tmp_path / "reference"
    train_config(compose_train([*args, f"output_dir={reference}"]))
    out = tmp_path / "run"
    with pytest.raises(RunInterrupted) as stopped:
        train_config(compose_train([*args, f"output_dir={out}"]), callbacks=[CtrlCAtEpoch(2)])
    assert stopped.value.epochs == 2
    last = out / "checkpoints" / "last.ckpt"
    train_config(compose_train([*args, f"output_dir={out}", f"ckpt_path={last}"]))
    # Weights, optimiser moments, schedule, feature and target statistics, data order and
    # dropout streams continued where they stopped.
    (scores, state), (expected, theirs) = final(out), final(reference)
    assert scores == expected
    # A binary TU task reports accuracy beside its ROC-AUC (TU results are compared by it).
    assert set(scores["test"]) == ({"rocauc", "acc"} if kind == "tu" else {"acc"})
    assert state.keys() == theirs.keys()
    assert all(torch.equal(state[k], theirs[k]) for k in state), [
        k for k in state if not torch.equal(state[k], theirs[k])
    ]


def test_accuracy_is_reported_beside_a_binary_metric_and_stored_with_the_task():
    from graphormer.data.tasks import TaskInfo, score_reported, with_accuracy

    task = with_accuracy(TaskInfo("t", "binary classification", 2, "rocauc"))
    assert task.level_metrics == ("rocauc", "acc") and task.monitor == "val/rocauc"
    assert TaskInfo(**task.to_dict()) == task  # a checkpoint's copy
    y = torch.tensor([[1.0, 0.0], [0.0, float("nan")], [1.0, 1.0]])
    logits = torch.tensor([[2.0, 0.5], [-1.0, 9.0], [-0.1, 3.0]])
    assert score_reported(task, y, logits) == {"acc": 3 / 5}
    plain = TaskInfo("t", "binary classification", 1, "rocauc")
    assert "reported" not in plain.to_dict() and score_reported(plain, y, logits) == {}
    regression = TaskInfo("r", "regression", 1, "rmse")
    assert with_accuracy(regression) == regression
