"""Fine-tuning with a slower learning rate for the pre-trained tensors (issue #22):
``optim.pretrained_lr_scale``."""

from __future__ import annotations

import json

import pytest
import torch

from graphormer.errors import ConfigError
from graphormer.training.module import PRETRAINED_KEY
from graphormer.training.settings import OptimSettings

from helpers import call_script, tpsa_run_args

NEW_FOR_THE_TASK = {"model.head.weight", "model.head.bias", "model.readout.weight"}


def test_the_copied_tensors_train_slower_and_a_resume_keeps_the_groups(tmp_path, nci_csv):
    source = tmp_path / "source"
    call_script("train.py", tpsa_run_args(nci_csv, source, "trainer.max_epochs=1"), tmp_path)
    pretrained = json.loads((source / "metrics.json").read_text())["best_checkpoint"]

    def finetune(out, *extra):
        args = tpsa_run_args(
            nci_csv,
            out,
            f"pretrained={pretrained}",
            "optim.pretrained_lr_scale=0.1",
            "optim.warmup_steps=2",
            "optim.total_steps=1000",  # one schedule, whatever max_epochs says
            *extra,
        )
        return call_script("train.py", args, tmp_path)

    straight = tmp_path / "straight"
    log = finetune(straight, "trainer.max_epochs=2")
    assert "optim.pretrained_lr_scale=0.1: the copied tensors train at lr 0.0001" in log
    last = torch.load(straight / "checkpoints" / "last.ckpt", weights_only=True)
    copied = set(last[PRETRAINED_KEY])
    trained = {k for k in last["state_dict"] if k.startswith("model.")}
    assert copied and copied | NEW_FOR_THE_TASK <= trained and not copied & NEW_FOR_THE_TASK
    new, slow = last["optimizer_states"][0]["param_groups"]
    assert (new["initial_lr"], slow["initial_lr"]) == (1e-3, pytest.approx(1e-4))
    assert len(new["params"]) == len(NEW_FOR_THE_TASK) and len(slow["params"]) == len(copied)
    # One schedule for both: at every step the copied tensors' rate is a tenth of the others'.
    assert 0 < new["lr"] < 1e-3 and slow["lr"] == pytest.approx(0.1 * new["lr"])

    # Stopped after its first epoch and resumed: the same groups, the same end (the file
    # pretrained= named is not read again).
    resumed = tmp_path / "resumed"
    finetune(resumed, "trainer.max_epochs=1")
    epoch_one = resumed / "checkpoints" / "last.ckpt"
    call_script(
        "train.py",
        [f"ckpt_path={epoch_one}", "trainer.max_epochs=2", "trainer.enable_progress_bar=false"],
        tmp_path,
    )
    again = torch.load(resumed / "checkpoints" / "last.ckpt", weights_only=True)
    assert set(again[PRETRAINED_KEY]) == copied
    for name, tensor in last["state_dict"].items():
        assert torch.equal(again["state_dict"][name], tensor), name


def test_without_pretrained_weights_there_is_one_group(tmp_path, nci_csv):
    out = tmp_path / "run"
    args = tpsa_run_args(nci_csv, out, "trainer.max_epochs=1", "optim.pretrained_lr_scale=0.1")
    log = call_script("train.py", args, tmp_path)
    assert "pretrained_lr_scale" not in log
    last = torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)
    assert PRETRAINED_KEY not in last
    assert len(last["optimizer_states"][0]["param_groups"]) == 1


@pytest.mark.parametrize("scale", [0, -0.5, "x", True])
def test_the_scale_must_be_a_positive_number(scale):
    with pytest.raises(ConfigError, match="optim.pretrained_lr_scale"):
        OptimSettings(pretrained_lr_scale=scale)
