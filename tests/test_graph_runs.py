"""Runs on graphs that are not OGB molecules (issue #17): an interrupted `tu` or `pyg_file` run
resumed from its checkpoint ends exactly like the uninterrupted one; splits from a file and
stratified cross-validation folds; a TU dataset of structure alone trains and predicts."""

import json

import lightning.pytorch as pl
import pytest
import torch

from graphormer import checkpoint
from graphormer.data import build_source
from graphormer.errors import ConfigError, DataError
from graphormer.testing import nci_tu, protein_like_graphs, shape_graphs, write_tu_layout
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
    nci_tu(root, "NCI_TU3", limit=60, classes=3)
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


def write_split(path, train, valid, test):
    path.write_text(json.dumps({"train": train, "valid": valid, "test": test}))
    return str(path)


def test_a_split_file_chooses_the_graphs_of_each_split(graph_data, tmp_path):
    listed = write_split(tmp_path / "split.json", list(range(3, 60)), [0, 1], [2, 60, 61])
    for settings in (
        {"source": "tu", "name": "NCI_TU2", "root": str(graph_data)},
        {"source": "pyg_file", "path": str(graph_data / "graphs.pt"), "root": str(graph_data)},
    ):
        source = build_source({**settings, "split_file": listed})
        with pytest.warns(UserWarning, match="34 graphs are in no split"):
            split = source.load().split
        assert split["valid"].tolist() == [0, 1] and split["test"].tolist() == [2, 60, 61]
    bad = write_split(tmp_path / "bad.json", [0], [1], [500])
    with pytest.raises(DataError, match=r"'test' lists graphs 500, outside the input's 96 graphs"):
        build_source(
            {"source": "tu", "name": "NCI_TU2", "root": str(graph_data), "split_file": bad}
        ).load()
    with pytest.raises(ConfigError, match="both choose the split"):
        build_source({"source": "tu", "name": "NCI_TU2", "split": "random", "split_file": listed})


def test_cross_validation_folds_of_a_multiclass_tu_dataset_are_stratified(graph_data, tmp_path):
    from graphormer.cli.train import settings_from
    from graphormer.training.crossval import _fold_splits

    cfg = compose_train(
        [*TINY, "dataset=tu", "dataset.name=NCI_TU3", f"dataset.root={graph_data}", "cv.folds=3"]
        + [f"output_dir={tmp_path}"]
    )
    settings = settings_from(cfg)
    source = build_source(settings.dataset)
    datasets, grouped = _fold_splits(settings, source, tmp_path)
    assert not grouped and len(datasets) == 3
    labels = source.graphs().data.y.view(-1)
    tests = []
    for k, values in enumerate(datasets):
        assert values["split"] == "file"
        split = build_source(values).load().split  # each fold is an ordinary run's split
        tests.append(split["test"].tolist())
        assert (
            split["valid"].tolist()
            == json.loads((tmp_path / "folds" / str((k + 1) % 3) / "split.json").read_text())[
                "test"
            ]
        )
        counts = torch.bincount(labels[split["test"]].long(), minlength=3)
        assert counts.sum() == 20 and counts.min() >= 6, counts  # about a third of each class
    assert sorted(sum(tests, [])) == list(range(60))  # the test folds partition the graphs


def test_cross_validation_of_a_binary_tu_dataset_summarises_its_accuracy(graph_data, tmp_path):
    from graphormer.cli.train import settings_from
    from graphormer.training.crossval import cross_validate

    cfg = compose_train(
        [*TINY, "dataset=tu", "dataset.name=NCI_TU2", f"dataset.root={graph_data}", "cv.folds=3"]
        + [f"output_dir={tmp_path}"]
    )
    scores = iter([(0.8, 0.7), (0.9, 0.8), (0.7, 0.9)])

    def fit(run):  # each fold's metrics, as a run reports them
        auc, acc = next(scores)
        return {s: {"rocauc": auc, "acc": acc} for s in ("valid", "test")}

    summary = cross_validate(settings_from(cfg), fit)
    assert summary["test"]["mean"] == pytest.approx(0.8)
    acc = summary["reported"]["acc"]["test"]
    assert acc["mean"] == pytest.approx(0.8) and acc["std"] == pytest.approx(0.1) and acc["n"] == 3
    stored = json.loads((tmp_path / "cv_metrics.json").read_text())
    assert stored["reported"]["acc"]["valid"]["mean"] == pytest.approx(0.8)


def test_a_tu_dataset_of_structure_alone_trains_and_predicts(tmp_path):
    from torch_geometric.data import Data

    from graphormer import Predictor

    graphs, labels = protein_like_graphs(60, seed=4, max_nodes=30)
    bare = [Data(edge_index=g.edge_index, num_nodes=g.num_nodes) for g in graphs]
    raw = write_tu_layout(tmp_path, "BARE", bare, labels)
    assert sorted(p.name for p in raw.iterdir()) == [
        "BARE_A.txt", "BARE_graph_indicator.txt", "BARE_graph_labels.txt"
    ]  # fmt: skip
    source = build_source({"source": "tu", "name": "BARE", "root": str(tmp_path)})
    assert source.feature_dims() == ([], []) and source.continuous_dims() == (0, 0)
    cfg = compose_train(
        [
            *TINY,
            "dataset=tu",
            "dataset.name=BARE",
            f"dataset.root={tmp_path}",
            "trainer.max_epochs=1",
            f"output_dir={tmp_path / 'run'}",
        ]
    )
    metrics = train_config(cfg)
    assert set(metrics["test"]) == {"rocauc", "acc"}
    predictor = Predictor.from_checkpoint(metrics["best_checkpoint"], device="cpu")
    result = predictor.predict_graphs(bare[:5])
    assert not any(result.errors) and result.values.shape == (5, 1)
    assert ((result.values > 0) & (result.values < 1)).all()

    # A checkpoint saved before binary TU tasks reported accuracy still evaluates.
    from graphormer.training.evaluation import evaluate

    stored = torch.load(metrics["best_checkpoint"], weights_only=True)
    del stored["hyper_parameters"]["task"]["reported"]
    old = tmp_path / "old.ckpt"
    torch.save(checkpoint.seal(stored), old)  # as saved then: a valid digest
    found = evaluate(old, output=tmp_path / "old.json")
    assert found["test"]["rocauc"] == pytest.approx(metrics["test"]["rocauc"], rel=1e-6)


def test_feature_statistics_in_chunks_equal_those_of_all_rows_at_once(graph_data):
    from graphormer.cli.train import settings_from
    from graphormer.training.run import build_datamodule

    settings = settings_from(
        compose_train([*TINY, *dataset_args("pyg_file", graph_data), "output_dir=unused"])
    )
    datamodule = build_datamodule(settings.dataset, settings.datamodule, settings.seed)
    datamodule.prepare_data()
    datamodule.setup("fit")
    for key in ("x_continuous", "edge_attr_continuous"):
        rows = datamodule.train_rows(key).double()
        for chunk in (7, 1000, 1 << 22):  # chunks that cut graphs, several graphs, all at once
            mean, std = datamodule.train_statistics(key, chunk_rows=chunk)
            torch.testing.assert_close(mean, rows.mean(0), rtol=0, atol=1e-9)
            torch.testing.assert_close(std, rows.std(0, correction=0), rtol=0, atol=1e-9)
    assert datamodule.train_statistics("no_such_feature") is None


def _comparable(value, folder: str):
    """A checkpoint's contents with the run folder's name taken out of its paths."""
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, tuple(value.shape), value.tolist())
    if isinstance(value, dict):
        return {_comparable(k, folder): _comparable(v, folder) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_comparable(v, folder) for v in value]
    if isinstance(value, str):
        return value.replace(folder, "RUN")
    return value


def test_a_new_best_and_last_ckpt_cost_one_dump(graph_data, tmp_path, monkeypatch):
    """An epoch with a new best checkpoint dumps it once and copies it to last.ckpt; the files
    hold what two dumps give (the same run with the copy turned off)."""
    from pathlib import Path

    from graphormer.training.callbacks import RunCheckpoint

    args = [*NOISY, *dataset_args("tu", graph_data)]
    dumps: list[str] = []
    original = pl.Trainer.save_checkpoint

    def counted(self, filepath, *rest, **kwargs):
        dumps.append(Path(filepath).name)
        return original(self, filepath, *rest, **kwargs)

    monkeypatch.setattr(pl.Trainer, "save_checkpoint", counted)
    files = {}
    for name in ("dumped", "copied"):
        if name == "dumped":
            monkeypatch.setattr(RunCheckpoint, "_twin_of", lambda self, trainer: None)
        else:
            monkeypatch.undo()
            monkeypatch.setattr(pl.Trainer, "save_checkpoint", counted)
        dumps.clear()
        out = tmp_path / name
        train_config(compose_train([*args, f"output_dir={out}"]))
        files[name] = (out, list(dumps))
    (dumped, dumped_calls), (copied, copied_calls) = files["dumped"], files["copied"]
    assert dumped_calls.count("last.ckpt.partial") == 3  # every epoch
    best_epochs = [n for n in copied_calls if n.startswith("best-")]
    assert best_epochs, "the run never improved: nothing was copied"
    # The first epoch's last.ckpt records its own path, which the best file before it did not.
    assert copied_calls.count("last.ckpt.partial") == 3 - len(best_epochs) + 1
    for run in (dumped, copied):
        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == sorted(
            p.name for p in (dumped / "checkpoints").iterdir()
        )
    for file in ("last.ckpt", *(p.name for p in (dumped / "checkpoints").glob("best-*"))):
        theirs = torch.load(dumped / "checkpoints" / file, weights_only=True)
        ours = torch.load(copied / "checkpoints" / file, weights_only=True)
        checkpoint.load(copied / "checkpoints" / file)  # its seal holds
        for stored in (theirs, ours):  # a digest over the paths too
            del stored[checkpoint.META_KEY][checkpoint._WHOLE_DIGEST]
        assert _comparable(ours, str(copied)) == _comparable(theirs, str(dumped)), file
