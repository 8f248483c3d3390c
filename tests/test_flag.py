"""FLAG (Kong et al., 2020): adversarial perturbations of the node input embeddings, training only."""

import json

import lightning.pytorch as pl
import pytest
import torch

from graphormer.data import GraphormerCollator, StructuralFeatures
from graphormer.training import GraphormerModule, masked_loss

from helpers import TINY, call_script, nci_graphs, to_data

MODEL = {
    "num_layers": 2,
    "hidden_dim": 32,
    "ffn_dim": 32,
    "num_heads": 4,
    "dropout": 0.0,  # no dropout: the test redoes the arithmetic by hand
    "attention_dropout": 0.0,
    "activation_dropout": 0.0,
}
TASK = {"name": "toy", "task_type": "regression", "num_tasks": 1, "metric": "rmse"}


def batch_of(count=24):
    graphs = [to_data(g, y=float(g["num_nodes"])) for g in nci_graphs(count)]
    return GraphormerCollator(max_hops=5, pad_to_multiple=8)(
        [(i, StructuralFeatures(5)(g)) for i, g in enumerate(graphs)]
    )


class FixedStart(GraphormerModule):
    """FLAG with a known random start, so that a test can redo its arithmetic by hand."""

    start: torch.Tensor

    def initial_perturbation(self, shape):
        return self.start.clone()


class Capture(pl.Callback):
    """The parameters' gradients at the first optimiser step, and every perturbation seen."""

    def __init__(self):
        self.grads = None
        self.perturbs = {"train": [], "eval": []}

    def on_fit_start(self, trainer, pl_module):
        forward = pl_module.model.forward

        def recording(batch, return_attention=False, perturb=None):
            stage = "train" if pl_module.training else "eval"
            self.perturbs[stage].append(None if perturb is None else perturb.detach().clone())
            return forward(batch, return_attention, perturb)

        pl_module.model.forward = recording

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        # After the optimiser step: the gradients it used, clipped (the step leaves them).
        if self.grads is None:
            self.grads = {n: p.grad.clone() for n, p in pl_module.named_parameters()}


def fit_one_step(module, batch, clip=None):
    capture = Capture()
    module.gradient_clip_val = clip
    trainer = pl.Trainer(
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[capture],
        limit_val_batches=1,
        num_sanity_val_steps=0,
    )
    loader = torch.utils.data.DataLoader([batch], batch_size=None)
    trainer.fit(module, train_dataloaders=loader, val_dataloaders=loader)
    return capture


def test_flag_accumulates_the_gradients_of_its_ascent_steps():
    batch = batch_of()
    torch.manual_seed(0)
    flag = {"m": 3, "step_size": 0.05, "mag": 0.0}
    module = FixedStart(model=MODEL, task=TASK, flag=flag, normalize_targets=False)
    module.start = torch.empty(*batch.x.shape[:2], 32).uniform_(-0.05, 0.05)
    reference = GraphormerModule(model=MODEL, task=TASK, normalize_targets=False)
    reference.load_state_dict(module.state_dict())

    # By hand: m ascent steps on the sign of the perturbation's gradient; parameters' gradients
    # of the m losses summed, each scaled by 1/m.
    perturb = module.start.clone().requires_grad_()
    losses = []
    for step in range(3):
        loss = masked_loss(reference.model(batch, perturb=perturb), batch.y, "mse") / 3
        losses.append(loss)
        if step < 2:
            (grad,) = torch.autograd.grad(loss, perturb, retain_graph=True)
            perturb = (perturb.detach() + 0.05 * grad.sign()).requires_grad_()
    sum(losses).backward()
    expected = {n: p.grad for n, p in reference.named_parameters()}

    capture = fit_one_step(module, batch)
    assert capture.grads.keys() == expected.keys()
    for name, grad in expected.items():
        torch.testing.assert_close(capture.grads[name], grad, rtol=1e-4, atol=1e-7, msg=name)
    # The perturbation mattered: the gradients differ from plain training's.
    plain = GraphormerModule(model=MODEL, task=TASK, normalize_targets=False)
    plain.load_state_dict(reference.state_dict())
    masked_loss(plain.model(batch), batch.y, "mse").backward()
    differs = [
        not torch.allclose(p.grad, expected[n], atol=1e-6) for n, p in plain.named_parameters()
    ]
    assert any(differs)


def test_perturbations_are_trained_on_bounded_and_never_used_in_evaluation():
    batch = batch_of()
    torch.manual_seed(0)
    module = GraphormerModule(
        model=MODEL,
        task=TASK,
        flag={"m": 4, "step_size": 0.5, "mag": 0.2},
        normalize_targets=False,
    )
    capture = fit_one_step(module, batch, clip=1e-3)
    train, evaluation = capture.perturbs["train"], capture.perturbs["eval"]
    assert len(train) == 4 and all(p is not None for p in train)
    assert train[0].shape == (*batch.x.shape[:2], 32)
    # Each ascent moved the perturbation, and the projection kept every node inside the ball.
    assert all(not torch.equal(a, b) for a, b in zip(train, train[1:], strict=False))
    assert max(float(p.norm(dim=-1).max()) for p in train) <= 0.2 + 1e-5
    assert evaluation and all(p is None for p in evaluation)
    # Clipping applies to the accumulated gradients (Lightning cannot clip manual steps).
    norm = torch.cat([g.flatten() for g in capture.grads.values()]).norm()
    assert float(norm) <= 1e-3 * (1 + 1e-4)


def test_flag_settings_are_checked():
    with pytest.raises(ValueError, match=r"flag.m=-1 is not allowed: an integer >= 0"):
        GraphormerModule(model=MODEL, task=TASK, flag={"m": -1})
    with pytest.raises(ValueError, match="flag.step_size=0.0 is not allowed: a finite number > 0"):
        GraphormerModule(model=MODEL, task=TASK, flag={"m": 2, "step_size": 0.0})
    assert GraphormerModule(model=MODEL, task=TASK).automatic_optimization


def test_flag_refuses_gradient_accumulation(tmp_path, ogb_root):
    from graphormer.errors import ConfigError

    from helpers import compose_train, train_config

    cfg = compose_train(
        [
            "dataset=ogbg-molhiv",
            f"dataset.root={ogb_root}",
            f"output_dir={tmp_path}",
            "flag.m=2",
            "+trainer.accumulate_grad_batches=4",
            *TINY,
        ]
    )
    with pytest.raises(ConfigError, match="trainer.accumulate_grad_batches=1"):
        train_config(cfg)


def test_flag_trains_with_bf16_and_clipping_and_under_ddp(tmp_path, ogb_root, ddp_run):
    common = ["dataset=ogbg-molhiv", f"dataset.root={ogb_root}", *TINY, "flag.m=2"]
    out = tmp_path / "bf16"
    call_script(
        "train.py",
        [*common, "trainer.precision=bf16-mixed", "trainer.max_epochs=1", f"hydra.run.dir={out}"],
        cwd=tmp_path,
    )
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["precision"] == "bf16-mixed" and metrics["valid"]["rocauc"] > 0.5
    # conftest's DDP run trains with FLAG (flag.m=2) on 2 ranks.
    out, log = ddp_run
    assert "devices: 2" in log
    last = torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["hyper_parameters"]["flag"]["m"] == 2
    # Manual optimisation still counts updates and steps the schedule: 244 training graphs
    # over 2 ranks in batches of 32, 4 batches per epoch, 2 epochs.
    assert last["global_step"] == 8
    assert last["lr_schedulers"][0]["last_epoch"] == 8
