"""Heads that predict their own spread: mean-variance estimation (``loss=mve``) and deep
evidential regression (``loss=evidential``): their losses against known densities, and a trained
model's ``<task>_std`` at prediction time."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from graphormer.errors import ConfigError
from graphormer.inference import Predictor
from graphormer.training.module import (
    EVIDENTIAL_LAMBDA,
    distribution_parameters,
    distribution_variance,
    masked_loss,
)

from helpers import TINY, compose_train, csv_cache, nci_smiles, nci_tpsa_run, train_config


def test_mve_loss_is_the_gaussian_negative_log_likelihood():
    raw = torch.tensor([[0.3, -0.2, 1.5, 0.7]])  # two tasks: (mean, variance before softplus)
    target = torch.tensor([[1.0, float("nan")]])  # the second is unlabelled: weighs nothing
    mean, var = distribution_parameters(raw, "mve")
    expected = -stats.norm.logpdf(1.0, loc=0.3, scale=math.sqrt(float(var[0, 0])))
    assert float(masked_loss(raw, target, "mve")) == pytest.approx(expected, rel=1e-5)
    assert float(var[0, 0]) == pytest.approx(math.log1p(math.exp(-0.2)) + 1e-6, rel=1e-5)


def test_evidential_loss_is_the_student_t_likelihood_plus_its_regulariser():
    raw = torch.tensor([[0.5, 0.3, 1.2, -0.4]])  # gamma, nu, alpha, beta before constraints
    target = torch.tensor([[2.0]])
    gamma, nu, alpha, beta = (float(p[0, 0]) for p in distribution_parameters(raw, "evidential"))
    assert alpha > 1 and nu > 0 and beta > 0
    # The Normal-Inverse-Gamma evidence integrates to a Student-t (Amini et al., 2020, eq. 8).
    scale = math.sqrt(beta * (1 + nu) / (nu * alpha))
    nll = -stats.t.logpdf(2.0, df=2 * alpha, loc=gamma, scale=scale)
    expected = nll + EVIDENTIAL_LAMBDA * abs(2.0 - gamma) * (2 * nu + alpha)
    assert float(masked_loss(raw, target, "evidential")) == pytest.approx(expected, rel=1e-4)
    variance = distribution_variance(distribution_parameters(raw, "evidential"), "evidential")
    assert float(variance) == pytest.approx(beta * (1 + 1 / nu) / (alpha - 1), rel=1e-5)


@pytest.mark.parametrize("loss", ["mve", "evidential"])
def test_a_trained_head_gives_each_molecule_its_std(tmp_path, nci_csv, loss):
    cfg = compose_train(
        [
            *nci_tpsa_run(nci_csv, tmp_path / "run"),
            f"loss={loss}",
            "trainer.max_epochs=2",
            "~logger",
            *TINY,
        ]
    )
    metrics = train_config(cfg)
    assert np.isfinite(metrics["test"]["rmse"])
    predictor = Predictor.from_checkpoint(metrics["best_checkpoint"])
    assert predictor.spread == loss
    table = predictor.predict(nci_smiles()[:20])
    assert (table["tpsa_std"] > 0).all() and np.isfinite(table["tpsa"]).all()
    # The mean is what the module's forward gives (its other outputs are the spread's).
    again = predictor.predict(nci_smiles()[:5])
    np.testing.assert_allclose(again["tpsa"], table["tpsa"][:5], rtol=1e-5)


def test_a_spread_head_is_for_regression(tmp_path, nci_csv):
    cfg = compose_train(
        [
            "dataset=smiles_csv",
            f"dataset.path={nci_csv}",
            "dataset.targets=[binary]",
            "dataset.task_type=binary",
            f"dataset.root={csv_cache(nci_csv)}",
            f"output_dir={tmp_path / 'run'}",
            "loss=mve",
            "~logger",
            *TINY,
        ]
    )
    with pytest.raises((ConfigError, ValueError), match="loss=mve"):
        train_config(cfg)


@pytest.mark.parametrize("loss", ["mve", "evidential"])
def test_a_spread_head_learns_noise_that_grows(loss):
    """Where the noise is real (it grows with |x|), the predicted std follows it: MVE's 90%
    Gaussian interval covers about 90%."""
    torch.manual_seed(0)
    x = torch.rand(1000, 1) * 4 - 2
    noise = 0.1 + 0.5 * x.abs()
    y = torch.sin(x) + noise * torch.randn_like(x)
    width = 2 if loss == "mve" else 4
    net = torch.nn.Sequential(
        torch.nn.Linear(1, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
        torch.nn.Linear(32, width),
    )  # fmt: skip
    optimizer = torch.optim.Adam(net.parameters(), 3e-3)
    for _ in range(1500):
        optimizer.zero_grad()
        masked_loss(net(x), y, loss).backward()
        optimizer.step()
    with torch.no_grad():
        parameters = distribution_parameters(net(x), loss)
        std = distribution_variance(parameters, loss).sqrt()[:, 0].numpy()
    error = (y[:, 0] - parameters[0][:, 0]).abs().numpy()
    assert stats.spearmanr(std, noise[:, 0].numpy()).statistic > 0.8
    covered = (error <= stats.norm.ppf(0.95) * std).mean()
    if loss == "mve":
        assert 0.85 <= covered <= 0.95
    else:  # the Student-t's heavier tails and the regulariser: wider, never narrower
        assert covered >= 0.85
