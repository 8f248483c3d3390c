"""IS2RE: the relaxed energy with the position change of the moving atoms as an auxiliary
vector target (L1, its weight falling linearly over training), and OC20's EwT metric."""

import numpy as np
import pytest
import torch

from graphormer.data.tasks import ATOM, ATOM_VECTOR, TaskInfo, score_reported
from graphormer.errors import ConfigError
from graphormer.testing import emt_slabs
from graphormer.training.module import GraphormerModule
from graphormer.training.settings import RunSettings

from helpers import IS2RE_TINY, compose_train, read_json, tiny_3d, train_config

pytest.importorskip("ase", reason="dataset=ase needs the 3d extra (pip install ase)")
import ase.io  # noqa: E402


def test_ewt_is_the_share_of_energies_within_0_02():
    task = TaskInfo("is2re", "regression", 1, "mae", reported=("ewt",))
    y_true = torch.tensor([[1.0], [2.0], [3.0], [float("nan")]])
    y_pred = torch.tensor([[1.01], [2.03], [2.985], [0.0]])
    assert score_reported(task, y_true, y_pred) == {"ewt": pytest.approx(2 / 3)}


def _module(**settings) -> GraphormerModule:
    task = TaskInfo(
        "is2re",
        "regression",
        1,
        "mae",
        atom_tasks=1,
        atom_task_type="regression",
        atom_vector_tasks=1,
        atom_vector_task_type="regression",
    )
    model = dict(num_layers=1, hidden_dim=8, ffn_dim=8, num_heads=2, channels="3d")
    model.update(atom_feature_dims=[119], bond_feature_dims=[1], num_kernels=4)
    return GraphormerModule(model=model, task=task.to_dict(), total_steps=100, **settings)


def test_the_vector_weight_falls_linearly_and_the_item_loss_is_l1(monkeypatch):
    module = _module(
        loss_weights={"atom_vector": 15.0},
        loss_weights_end={"atom_vector": 1.0},
        item_loss="l1",
    )
    for step, weight in ((0, 15.0), (50, 8.0), (100, 1.0), (150, 1.0)):
        monkeypatch.setattr(GraphormerModule, "global_step", property(lambda self, s=step: s))
        weights = module.level_weights()
        assert weights["atom_vector"] == pytest.approx(weight)
        assert weights["molecule"] == 1.0
    assert module._item_loss(ATOM_VECTOR) == "l1" and module._item_loss(ATOM) == "l1"
    assert _module()._item_loss(ATOM_VECTOR) == "mse"  # as before, without the setting
    with pytest.raises(ValueError, match="loss_weights_end.energy is not a level"):
        _module(loss_weights_end={"energy": 1.0})


def test_the_run_settings_check_the_new_keys(tmp_path):
    base = dict(dataset={"source": "ase"}, model={}, output_dir=tmp_path)
    with pytest.raises(ConfigError, match="item_loss"):
        RunSettings(**base, item_loss="huber")
    with pytest.raises(ConfigError, match="loss_weights_end"):
        RunSettings(**base, loss_weights_end=3)


def test_train_is2re_on_relaxed_emt_slabs(tmp_path):
    path = tmp_path / "is2re.extxyz"
    ase.io.write(path, emt_slabs(24, seed=7, relax_steps=8))
    run = tmp_path / "run"
    cfg = compose_train(
        [
            "dataset=ase",
            f"dataset.path={path}",
            "dataset.targets=[energy_relaxed]",
            "dataset.relaxed_positions=pos_relaxed",
            "dataset.metric=mae",
            "dataset.reported=[ewt]",
            *IS2RE_TINY,
            *tiny_3d(tmp_path, epochs=2),
        ]
    )
    result = train_config(cfg)
    assert np.isfinite(result["test"]["mae"]) and 0 <= result["test"]["ewt"] <= 1
    assert np.isfinite(result["test"]["atom_vector_mae"])
    stored = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    hyper = stored["hyper_parameters"]
    assert hyper["item_loss"] == "l1" and hyper["loss_weights_end"] == {"atom_vector": 1.0}
    assert stored["state_dict"]["target_std"].item() > 0  # energies standardised
    metrics = read_json(run / "metrics.json")
    assert "ewt" in str(metrics)
