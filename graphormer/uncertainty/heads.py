"""Heads that predict their own spread, as loss options of regression (``loss=mve``,
``loss=evidential``): how their raw outputs become a distribution, its variance, and its
negative log-likelihood. chemprop v2 has both; the formulas are the papers'.

- Mean-variance estimation (Nix & Weigend, 1994): per task a mean and a variance (softplus),
  trained on the Gaussian negative log-likelihood.
- Deep evidential regression (Amini et al., NeurIPS 2020): per task the Normal-Inverse-Gamma
  parameters gamma, nu, alpha, beta, trained on their negative log-likelihood (a Student-t's) plus
  ``lambda * |y - gamma| * (2 nu + alpha)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "DISTRIBUTION_WIDTHS",
    "EVIDENTIAL_LAMBDA",
    "distribution_nll",
    "distribution_parameters",
    "distribution_variance",
]

# Losses of a head that predicts a distribution per task, and its outputs per task: mean-
# variance estimation (mean, variance) and deep evidential regression (gamma, nu, alpha, beta).
DISTRIBUTION_WIDTHS = {"mve": 2, "evidential": 4}
# Weight of the evidential regulariser |y - gamma| * (2 nu + alpha) (chemprop v2's default).
EVIDENTIAL_LAMBDA = 0.2
_EPS = 1e-6


def distribution_parameters(raw: Tensor, loss: str) -> list[Tensor]:
    """A distribution head's raw outputs ``[B, T * k]`` as its ``k`` parameters ``[B, T]``
    each, constrained: MVE's (mean, variance > 0), evidential's (gamma, nu > 0, alpha > 1,
    beta > 0); softplus keeps them positive, as chemprop v2 does."""
    width = DISTRIBUTION_WIDTHS[loss]
    parts = raw.float().unflatten(-1, (-1, width)).unbind(-1)  # k x [B, T]
    if loss == "mve":
        return [parts[0], F.softplus(parts[1]) + _EPS]
    gamma, nu, alpha, beta = parts
    return [gamma, F.softplus(nu) + _EPS, F.softplus(alpha) + 1 + _EPS, F.softplus(beta) + _EPS]


def distribution_variance(parameters: list[Tensor], loss: str) -> Tensor:
    """The predictive variance ``[B, T]`` (standardised units) of a distribution head: MVE's
    variance; evidential's aleatoric plus epistemic variance ``beta (1 + 1/nu) / (alpha - 1)``
    (Amini et al., NeurIPS 2020)."""
    if loss == "mve":
        return parameters[1]
    _, nu, alpha, beta = parameters
    return beta * (1 + 1 / nu) / (alpha - 1)


def distribution_nll(pred: Tensor, target: Tensor, loss: str) -> Tensor:
    """Per-entry negative log-likelihood (plus the evidential regulariser) of ``target``
    ``[B, T]`` under the head's distribution ``pred`` ``[B, T * k]``."""
    parameters = distribution_parameters(pred, loss)
    if loss == "mve":
        mean, var = parameters
        return 0.5 * (torch.log(2 * math.pi * var) + (target - mean) ** 2 / var)
    gamma, nu, alpha, beta = parameters
    omega = 2 * beta * (1 + nu)
    error = target - gamma
    nll = (
        0.5 * torch.log(math.pi / nu)
        - alpha * torch.log(omega)
        + (alpha + 0.5) * torch.log(nu * error**2 + omega)
        + torch.lgamma(alpha)
        - torch.lgamma(alpha + 0.5)
    )
    return nll + EVIDENTIAL_LAMBDA * error.abs() * (2 * nu + alpha)
