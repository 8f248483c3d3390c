"""An exponential moving average of the weights (``optim.ema_decay``, issue #22): the average's
arithmetic, what validation and the checkpoints hold, and an exact resume."""

import json

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from graphormer import checkpoint
from graphormer.errors import ConfigError
from graphormer.training.callbacks import WeightAverage
from graphormer.training.evaluation import evaluate
from graphormer.training.settings import OptimSettings

from helpers import call_script, tpsa_run_args


class Line(pl.LightningModule):
    """A linear regression on fixed data; records its weights after every update."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(3, 1)
        self.frozen = nn.Parameter(torch.ones(2), requires_grad=False)
        self.history: list[torch.Tensor] = []
        self.validated: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.history.append(self.net.weight.detach().clone())

    def validation_step(self, batch, batch_idx):
        self.validated.append(self.net.weight.detach().clone())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader():
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(16, 3, generator=generator)
    return DataLoader(TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [0.5]])), batch_size=2)


def fit(module, tmp_path, max_steps, decay=0.8, accumulate=1, ckpt_path=None, saves=None, **kwargs):
    average = WeightAverage(decay)
    trainer = pl.Trainer(
        max_steps=max_steps,
        accumulate_grad_batches=accumulate,
        callbacks=[average, *([saves] if saves else [])],
        logger=False,
        enable_checkpointing=saves is not None,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
        **kwargs,
    )
    trainer.fit(module, loader(), loader(), ckpt_path=ckpt_path)
    return trainer, average


def expected_average(history, decay):
    average = Line().net.weight.detach().clone()  # the initial weights
    for t, weights in enumerate(history):
        d = min(decay, t / (t + 1))
        average = d * average + (1 - d) * weights
    return average


@pytest.mark.parametrize("accumulate", [1, 2])
def test_the_average_follows_every_update_with_its_warm_up(tmp_path, accumulate):
    module = Line()
    fit(module, tmp_path, max_steps=6, accumulate=accumulate, limit_val_batches=0)
    # One term per optimiser update (with accumulation, every second batch), with
    # d = min(decay, t / (t + 1)): the plain mean of the first updates' weights (the
    # initialisation not among them), then the exponential average at 0.8.
    updates = module.history[accumulate - 1 :: accumulate]
    assert len(updates) == 6
    # After fit the module holds the average (as its checkpoints do).
    torch.testing.assert_close(module.net.weight, expected_average(updates, 0.8))
    assert not torch.equal(module.net.weight, updates[-1])
    assert torch.equal(module.frozen, torch.ones(2))  # only what is trained is averaged


def test_validation_sees_the_average_and_training_continues_from_its_own_weights(tmp_path):
    module = Line()
    fit(module, tmp_path, max_steps=16, val_check_interval=8, limit_val_batches=1)
    first_epoch = module.history[:8]
    torch.testing.assert_close(module.validated[0], expected_average(first_epoch, 0.8))
    # The second epoch's first update started from the trained weights, not the average.
    torch.testing.assert_close(module.validated[1], expected_average(module.history, 0.8))
    assert not torch.equal(module.validated[0], first_epoch[-1])


def test_a_checkpoint_holds_the_average_and_a_resume_continues_both(tmp_path):
    straight = Line()
    saves = ModelCheckpoint(tmp_path / "ckpt", every_n_epochs=1, save_top_k=-1)
    fit(straight, tmp_path / "a", max_steps=16, limit_val_batches=0, saves=saves)
    path = tmp_path / "ckpt" / "epoch=0-step=8.ckpt"  # the end of the first of two epochs
    saved = torch.load(path, weights_only=True)
    # state_dict: the average (what eval, predict and pretrained= read); the callback's state:
    # the training weights and the float32 average.
    state = saved["callbacks"]["WeightAverage"]
    assert state["updates"] == 8
    first_epoch = expected_average(straight.history[:8], 0.8)
    torch.testing.assert_close(state["average"]["net.weight"], first_epoch)
    assert torch.equal(saved["state_dict"]["net.weight"], state["average"]["net.weight"])
    assert torch.equal(state["weights"]["net.weight"], straight.history[7])

    resumed = Line()
    fit(resumed, tmp_path / "b", max_steps=16, limit_val_batches=0, ckpt_path=path)
    # The training weights continued (the first update after the resume is the uninterrupted
    # run's, not one from the average), and so did the average, warm-up count included. (The
    # uninterrupted run's exact continuation is tests/test_runs.py's, through train.py.)
    assert torch.equal(resumed.history[0], straight.history[8])
    both = [*straight.history[:8], *resumed.history]
    torch.testing.assert_close(resumed.net.weight, expected_average(both, 0.8))


@pytest.mark.parametrize("decay", [0, 1, 1.5, -0.1, "x", True])
def test_the_decay_must_lie_between_0_and_1(decay):
    with pytest.raises(ConfigError, match="optim.ema_decay"):
        OptimSettings(ema_decay=decay)
    if not isinstance(decay, str | bool):
        with pytest.raises(ValueError, match="optim.ema_decay"):
            WeightAverage(decay)


def test_a_run_validates_checkpoints_and_evaluates_the_average(tmp_path, nci_csv):
    out = tmp_path / "run"
    args = tpsa_run_args(nci_csv, out, "trainer.max_epochs=3", "optim.ema_decay=0.9")
    call_script("train.py", args, tmp_path)
    metrics = json.loads((out / "metrics.json").read_text())
    last = torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)
    state = last["callbacks"]["WeightAverage"]
    name = "model.head.weight"
    assert state["decay"] == 0.9 and state["updates"] > 0
    torch.testing.assert_close(last["state_dict"][name], state["average"][name])
    assert not torch.equal(last["state_dict"][name], state["weights"][name])
    assert checkpoint.load(out / "checkpoints" / "last.ckpt").hyper_parameters["ema_decay"] == 0.9
    # The score that chose the best checkpoint is the score of the weights it holds.
    again = evaluate(metrics["best_checkpoint"], split="valid", output=tmp_path / "eval.json")
    assert again["valid"]["rmse"] == pytest.approx(metrics["valid"]["rmse"], rel=1e-5)
