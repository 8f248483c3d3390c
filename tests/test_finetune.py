"""Fine-tuning (issue #22): a slower learning rate for the pre-trained tensors
(``optim.pretrained_lr_scale``), a decay toward their pre-trained values rather than toward zero
(``optim.pretrained_decay``, L2-SP), and an output layer fitted on the frozen pre-trained network
before fine-tuning starts (``pretrained_head=probe``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from graphormer.errors import ConfigError
from graphormer.training.module import (
    ANCHOR_KEY,
    PRETRAINED_KEY,
    GraphormerModule,
    masked_loss,
)
from graphormer.training.pretrained import PROBE_PENALTIES
from graphormer.training.settings import OptimSettings

from helpers import call_failing, call_script, compose_train, tpsa_run_args, train_config

# The output layer, the readout's map and the auxiliary atom head (train.py's default for a
# regression target: its per-atom descriptors are the new dataset's).
NEW_FOR_THE_TASK = {
    "model.head.weight",
    "model.head.bias",
    "model.readout.weight",
    *(
        f"model.atom_head.{layer}.{p}"
        for layer in ("transform", "norm", "out")
        for p in ("weight", "bias")
    ),
}


@pytest.fixture(scope="module")
def pretrained_tpsa(tmp_path_factory, nci_csv):
    """A one-epoch TPSA run's best checkpoint: the pre-trained network of the probe tests."""
    work = tmp_path_factory.mktemp("probe_source")
    call_script("train.py", tpsa_run_args(nci_csv, work / "run", "trainer.max_epochs=1"), work)
    return json.loads((work / "run" / "metrics.json").read_text())["best_checkpoint"]


def fine_tune(tmp_path, csv, out, pretrained, *extra) -> str:
    """train.py fine-tuning ``pretrained`` into ``out`` on one learning-rate schedule whatever
    ``trainer.max_epochs`` says, so that a run stopped after its first epoch and resumed can end
    as one that ran straight; its output."""
    args = tpsa_run_args(
        csv,
        out,
        f"pretrained={pretrained}",
        "optim.warmup_steps=2",
        "optim.total_steps=1000",
        *extra,
    )
    return call_script("train.py", args, tmp_path)


def stopped_and_resumed(tmp_path, csv, pretrained, *extra) -> tuple[str, dict]:
    """The fine-tuning of :func:`fine_tune` stopped after its first epoch, then resumed for a
    second (the file ``pretrained=`` named is not read again): the resume's output and its last
    checkpoint."""
    resumed = tmp_path / "resumed"
    fine_tune(tmp_path, csv, resumed, pretrained, *extra, "trainer.max_epochs=1")
    epoch_one = resumed / "checkpoints" / "last.ckpt"
    log = call_script(
        "train.py",
        [f"ckpt_path={epoch_one}", "trainer.max_epochs=2", "trainer.enable_progress_bar=false"],
        tmp_path,
    )
    return log, torch.load(epoch_one, weights_only=True)


def assert_same_weights(a: dict, b: dict) -> None:
    for name, tensor in a["state_dict"].items():
        assert torch.equal(b["state_dict"][name], tensor), name


def test_the_copied_tensors_train_slower_and_a_resume_keeps_the_groups(
    tmp_path, nci_csv, pretrained_tpsa
):
    scale = "optim.pretrained_lr_scale=0.1"
    straight = tmp_path / "straight"
    log = fine_tune(tmp_path, nci_csv, straight, pretrained_tpsa, scale, "trainer.max_epochs=2")
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

    # Stopped and resumed: the same groups, the same end.
    _, again = stopped_and_resumed(tmp_path, nci_csv, pretrained_tpsa, scale)
    assert set(again[PRETRAINED_KEY]) == copied
    assert_same_weights(last, again)


def test_without_pretrained_weights_there_is_one_group(pretrained_tpsa):
    # The pre-trained run was itself trained without pretrained weights.
    last = torch.load(Path(pretrained_tpsa).parent / "last.ckpt", weights_only=True)
    assert PRETRAINED_KEY not in last
    assert len(last["optimizer_states"][0]["param_groups"]) == 1


def test_the_scale_without_pretrained_weights_is_refused(tmp_path, nci_csv):
    """A scale with nothing copied to slow down would be dropped without a word: one error line,
    before any data is read."""
    out = tmp_path / "run"
    args = tpsa_run_args(nci_csv, out, "optim.pretrained_lr_scale=0.1")
    result = call_failing("train.py", args, tmp_path)
    assert (
        "error: optim.pretrained_lr_scale=0.1 sets the learning rate of the tensors a fine-tuning "
        "copies: give pretrained=FILE.ckpt too, or leave optim.pretrained_lr_scale=null"
    ) in result.stderr
    assert not out.exists() or not any(out.rglob("*.ckpt"))


@pytest.mark.parametrize("scale", [0, -0.5, "x", True])
def test_the_scale_must_be_a_positive_number(scale):
    with pytest.raises(ConfigError, match="optim.pretrained_lr_scale"):
        OptimSettings(pretrained_lr_scale=scale)


def test_an_update_pulls_the_copied_tensors_toward_their_pretrained_values():
    """One optimiser step against torch's AdamW as the oracle: a copied tensor takes AdamW's step
    without weight decay, then moves ``lr * pretrained_decay`` of the way back to its pre-trained
    value; the tensors new to the task decay toward zero as AdamW's ``weight_decay`` does; a
    copied tensor without a gradient (an update skipped for it) does not move."""
    torch.manual_seed(0)
    task = {"name": "toy", "task_type": "regression", "num_tasks": 1, "metric": "rmse"}
    lr, rate, decay = 0.01, 20.0, 0.01
    module = GraphormerModule(
        model={"num_layers": 1, "hidden_dim": 16, "num_heads": 2},
        task=task,
        lr=lr,
        weight_decay=decay,
        warmup_steps=0,  # the first update at the peak rate
        total_steps=100,
        pretrained_decay=rate,
        fused=False,
    )
    params = dict(module.named_parameters())
    new_names = {n for n in params if n.startswith("model.head.") or n == "model.readout.weight"}
    module.pretrained_parameters = frozenset(params.keys() - new_names)
    module.anchor_pretrained()
    anchors = {n: t.clone() for n, t in module.pretrained_anchor.items()}
    idle = sorted(module.pretrained_parameters)[0]
    with torch.no_grad():  # fine-tuning has moved the weights away from the pre-trained ones
        for p in params.values():
            p.add_(torch.randn_like(p))
    for name, p in params.items():
        p.grad = None if name == idle else torch.randn_like(p)
    before = {n: p.detach().clone() for n, p in params.items()}

    reference = {n: t.clone().requires_grad_() for n, t in before.items() if n != idle}
    for name, t in reference.items():
        t.grad = params[name].grad.clone()
    torch.optim.AdamW(
        [t for n, t in reference.items() if n in new_names], lr=lr, weight_decay=decay
    ).step()
    torch.optim.AdamW(
        [t for n, t in reference.items() if n not in new_names], lr=lr, weight_decay=0.0
    ).step()

    configured = module.configure_optimizers()  # the scheduler holds the optimiser weakly
    configured["optimizer"].step()
    for name, p in params.items():
        if name == idle:
            assert torch.equal(p, before[name])
            continue
        expected = reference[name].detach()
        if name not in new_names:
            expected = expected - lr * rate * (expected - anchors[name])
            assert not torch.allclose(expected, reference[name].detach())
        torch.testing.assert_close(p.detach(), expected, rtol=1e-6, atol=1e-7, msg=name)


def test_the_copied_tensors_decay_toward_the_pretrained_ones_also_after_a_resume(
    tmp_path, nci_csv, pretrained_tpsa
):
    decay = "optim.pretrained_decay=500"  # lr 1e-3: half the drift undone each update
    straight = tmp_path / "straight"
    log = fine_tune(tmp_path, nci_csv, straight, pretrained_tpsa, decay, "trainer.max_epochs=2")
    assert (
        "optim.pretrained_decay=500: the copied tensors decay toward their pre-trained values, "
        "the ones new to the task toward zero (optim.weight_decay=0.01)"
    ) in log
    source = torch.load(pretrained_tpsa, weights_only=True)["state_dict"]
    last = torch.load(straight / "checkpoints" / "last.ckpt", weights_only=True)
    copied = set(last[PRETRAINED_KEY])
    # The point the copied tensors are pulled toward is the weights pretrained= held.
    assert set(last[ANCHOR_KEY]) == copied
    for name in copied:
        assert torch.equal(last[ANCHOR_KEY][name], source[name]), name
    new, pulled = last["optimizer_states"][0]["param_groups"]
    assert (new["weight_decay"], pulled["weight_decay"]) == (0.01, 0.0)
    assert pulled["pretrained_decay"] == 500.0 and "pretrained_decay" not in new
    assert new["lr"] == pulled["lr"]  # one learning rate unless pretrained_lr_scale says

    # The same fine-tuning without the pull drifts further from the pre-trained weights.
    free = tmp_path / "free"
    fine_tune(tmp_path, nci_csv, free, pretrained_tpsa, "trainer.max_epochs=2")
    unpulled = torch.load(free / "checkpoints" / "last.ckpt", weights_only=True)

    def drift(checkpoint):
        weights = checkpoint["state_dict"]
        return sum(float((weights[n] - source[n]).pow(2).sum()) for n in copied) ** 0.5

    assert drift(last) < 0.5 * drift(unpulled)

    # Stopped and resumed (pretrained= is not read again): the same anchors, the same end.
    log, again = stopped_and_resumed(tmp_path, nci_csv, pretrained_tpsa, decay)
    assert "pretrained_decay" not in log
    assert all(torch.equal(again[ANCHOR_KEY][n], t) for n, t in last[ANCHOR_KEY].items())
    assert_same_weights(last, again)


def test_the_decay_setting_is_checked(tmp_path, nci_csv):
    args = tpsa_run_args(nci_csv, tmp_path / "run", "optim.pretrained_decay=10")
    result = call_failing("train.py", args, tmp_path)
    assert (
        "error: optim.pretrained_decay=10 pulls the tensors copied by a fine-tuning toward their "
        "pre-trained values: give pretrained=FILE.ckpt too"
    ) in result.stderr
    for wrong in (-1, "x", True):
        with pytest.raises(ConfigError, match="optim.pretrained_decay"):
            OptimSettings(pretrained_decay=wrong)
    assert OptimSettings(lr=1e-3, pretrained_decay=1000).pretrained_decay == 1000
    with pytest.raises(ConfigError, match=r"at most 1 / lr = 1000 \(each update"):
        OptimSettings(lr=1e-3, pretrained_decay=1001)
    # The copied tensors' own rate is what a pull of lr x rate uses.
    assert OptimSettings(lr=1e-3, pretrained_lr_scale=0.1, pretrained_decay=10000).pretrained_decay
    with pytest.raises(ConfigError, match=r"at most 1 / lr = 10000 "):
        OptimSettings(lr=1e-3, pretrained_lr_scale=0.1, pretrained_decay=20000)


class StartingWeights(pl.Callback):
    """The molecule output maps as training starts, and the frozen network's features of the
    training and validation graphs, written out here (not through Graphormer.head_inputs)."""

    def on_train_start(self, trainer, pl_module):
        model = pl_module.model
        self.maps = {k: v.detach().clone() for k, v in pl_module.named_parameters()}
        self.mean, self.std = pl_module.target_mean.clone(), pl_module.target_std.clone()
        model.eval()
        self.features = {}
        with torch.no_grad():
            for split in ("train", "valid"):
                rows, targets = [], []
                for batch in trainer.datamodule.probe_dataloader(split):
                    h, _ = model.encode(batch)
                    hidden = model.head_transform(h[:, 0])
                    atoms = h[:, 1:].sum(1)
                    if model.config.readout == "token_mean":
                        count = batch.node_mask.sum(1, keepdim=True)
                        hidden = hidden + model.readout(atoms / count)
                    state = model.head_norm(F.gelu(hidden))
                    if model.config.readout == "token_sum":
                        rows.append(torch.cat([state, atoms], 1))
                    else:
                        rows.append(state)
                    targets.append(batch.y.view(batch.num_graphs, -1))
                self.features[split] = (torch.cat(rows).double(), torch.cat(targets).double())
        model.train()


def _expected_probe(features, task, n_features, mean, std):
    """scikit-learn's ridge regression (logistic regression) on the network's features, for
    each penalty of PROBE_PENALTIES, keeping the one of least validation loss: the oracle of
    pretrained_head=probe."""
    from sklearn.linear_model import LogisticRegression, Ridge

    x, y = (t.numpy() for t in features["train"])
    xv, yv = (t.numpy() for t in features["valid"])
    keep, keep_v = ~np.isnan(y[:, 0]), ~np.isnan(yv[:, 0])
    x, y, xv, yv = x[keep], y[keep, 0], xv[keep_v], yv[keep_v, 0]
    best = None
    for penalty in PROBE_PENALTIES:
        if task == "binary":
            # Ours: mean log-loss + penalty |w|^2; scikit-learn's: C sum log-loss + |w|^2 / 2.
            fit = LogisticRegression(C=1 / (2 * penalty * len(x)), tol=1e-10, max_iter=10000)
            fit.fit(x, y)
            w, b = fit.coef_[0], fit.intercept_[0]
            logits = xv @ w + b
            loss = np.mean(np.logaddexp(0, logits) - yv * logits)
        else:
            # Ours: mean squared error (standardised targets) + penalty |w|^2.
            target = (y - float(mean[0])) / float(std[0])
            fit = Ridge(alpha=penalty * len(x)).fit(x, target)
            w, b = fit.coef_, fit.intercept_
            loss = np.mean((xv @ w + b - (yv - float(mean[0])) / float(std[0])) ** 2)
        if best is None or loss < best[0]:
            best = (loss, w, b)
    _, w, b = best
    return w[:n_features], w[n_features:], b


@pytest.mark.parametrize(
    "task, readout", [("regression", "token_sum"), ("binary", "token_sum"), ("regression", "token")]
)
def test_the_probe_fits_the_output_layer_as_scikit_learn_does(
    tmp_path, nci_csv, pretrained_tpsa, task, readout
):
    target = "tpsa" if task == "regression" else "binary"
    cfg = compose_train(
        tpsa_run_args(
            nci_csv,
            tmp_path / "run",
            f"dataset.targets=[{target}]",
            f"dataset.task_type={task}",
            f"pretrained={pretrained_tpsa}",
            "pretrained_head=probe",
            f"model.readout={readout}",
            "pretrained_strict=false",  # the source's readout map is token_sum's
            "trainer.max_epochs=1",
            f"output_dir={tmp_path / 'run'}",
        )
    )
    seen = StartingWeights()
    train_config(cfg, callbacks=[seen])
    width = seen.maps["model.head.weight"].size(1)
    state_w, atoms_w, bias = _expected_probe(seen.features, task, width, seen.mean, seen.std)
    if readout == "token_sum":
        ours = torch.cat([seen.maps["model.head.weight"], seen.maps["model.readout.weight"]], 1)
    else:
        assert "model.readout.weight" not in seen.maps and atoms_w.size == 0
        ours = seen.maps["model.head.weight"]
    # What the layer computes on the training graphs' features: the two fits' outputs agree
    # (a near-separable logistic fit is flat along some weight directions; its outputs are not).
    x = seen.features["train"][0].numpy()
    expected = x @ np.concatenate([state_w, atoms_w]) + bias
    got = x @ ours[0].double().numpy() + seen.maps["model.head.bias"][0].item()
    np.testing.assert_allclose(got, expected, atol=1e-3 * np.abs(expected).max())
    if task == "regression":  # the exact ridge: the weights themselves
        np.testing.assert_allclose(
            ours[0].numpy(), np.concatenate([state_w, atoms_w]), rtol=1e-3, atol=1e-5
        )


def test_fine_tuning_starts_from_the_probe_and_a_resume_does_not_probe_again(
    tmp_path, nci_csv, pretrained_tpsa
):
    probe = "pretrained_head=probe"
    straight = tmp_path / "straight"
    log = fine_tune(tmp_path, nci_csv, straight, pretrained_tpsa, probe, "trainer.max_epochs=2")
    found = re.search(
        r"pretrained_head=probe: fitted model.head.bias, model.head.weight, "
        r"model.readout.weight on the frozen pre-trained network \((\d+) training graphs, L2 "
        r"penalty ([\d.e-]+); validation loss ([\d.e+-]+) re-initialised, ([\d.e+-]+) fitted",
        log,
    )
    assert found, log
    graphs, penalty, before, after = found.groups()
    assert int(graphs) > 200 and float(penalty) in PROBE_PENALTIES
    # The re-initialised layer predicts about the training mean (loss ~1 on standardised
    # targets); the fitted one reads the pre-trained network.
    assert float(after) < 0.7 * float(before)

    log, again = stopped_and_resumed(tmp_path, nci_csv, pretrained_tpsa, probe)
    assert "pretrained_head=probe" not in log
    assert_same_weights(
        torch.load(straight / "checkpoints" / "last.ckpt", weights_only=True), again
    )


def test_the_head_setting_is_checked(tmp_path, nci_csv):
    args = tpsa_run_args(nci_csv, tmp_path / "run", "pretrained_head=probe")
    result = call_failing("train.py", args, tmp_path)
    assert "error: pretrained_head=probe fits the new output layer of a fine-tuning: give " in (
        result.stderr
    )
    args = tpsa_run_args(nci_csv, tmp_path / "run", "pretrained_head=linear")
    result = call_failing("train.py", args, tmp_path)
    assert "error: pretrained_head='linear' is not allowed: one of random, probe" in result.stderr


@pytest.mark.parametrize(
    "task, readout, head_bias",
    [("multiclass", "token_mean", "per_task"), ("regression", "token_sum", "shared")],
)
def test_the_probe_minimises_the_penalised_loss_by_l_bfgs(
    tmp_path, nci_csv, pretrained_tpsa, task, readout, head_bias
):
    """Where no closed form or Newton step serves (multi-class cross-entropy; one bias shared by
    all outputs), the fitted layer is a minimum: the penalised loss's gradient is zero there."""
    table = pd.read_csv(nci_csv)
    table["band"] = pd.qcut(table.tpsa, 3, labels=False)
    path = tmp_path / "bands.csv"
    table.to_csv(path, index=False)
    cfg = compose_train(
        tpsa_run_args(
            path,
            tmp_path / "run",
            f"dataset.targets=[{'band' if task == 'multiclass' else 'tpsa'}]",
            f"dataset.task_type={task}",
            f"pretrained={pretrained_tpsa}",
            "pretrained_head=probe",
            f"model.readout={readout}",
            f"model.head_bias={head_bias}",
            "pretrained_strict=false",
            "trainer.max_epochs=1",
            f"output_dir={tmp_path / 'run'}",
        )
    )
    seen = StartingWeights()
    train_config(cfg, callbacks=[seen])
    x, y = seen.features["train"]
    y = (y - seen.mean.double()) / seen.std.double()
    names = ["model.head.weight"] + (["model.readout.weight"] if readout == "token_sum" else [])
    weight = torch.cat([seen.maps[n].double() for n in names], 1).T.clone().requires_grad_()
    bias_name = "model.head_bias" if head_bias == "shared" else "model.head.bias"
    bias = seen.maps[bias_name].double().clone().requires_grad_()
    loss_name = "ce" if task == "multiclass" else "mse"
    gradients = []
    for penalty in PROBE_PENALTIES:
        value = masked_loss(x @ weight + bias, y, loss_name) + penalty * weight.pow(2).sum()
        grad_w, grad_b = torch.autograd.grad(value, [weight, bias])
        gradients.append(max(grad_w.abs().max().item(), grad_b.abs().max().item()))
    # Zero (to the float32 the parameters are stored in) at the chosen penalty, not at the others.
    assert sorted(gradients)[0] < 1e-4 < sorted(gradients)[1], gradients
