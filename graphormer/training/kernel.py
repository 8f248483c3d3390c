"""A Tanimoto kernel ridge regression on each molecule's Morgan counts, blended with the network.

On a series of analogues (what ``dataset.molecule_features=auto`` detects before giving Morgan
counts), a kernel model on fingerprints predicts a molecule from its nearest training molecules,
which the network does less well: MoleculeACE found such models ahead of most deep ones, and
mixing the two predictions helps both. :class:`FingerprintKernel` fits kernel ridge
regression with the Tanimoto kernel on the training molecules' Morgan counts (its ridge chosen on
the validation molecules) and mixes its prediction with the network's,
``weight * network + (1 - weight) * kernel``. The training molecules' counts and the dual
coefficients are buffers, so the model's checkpoint holds the fitted kernel (plain tensors).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

__all__ = ["RIDGES", "FingerprintKernel", "tanimoto"]

# The ridges tried on the validation molecules, smallest first (the kernel's values lie in [0, 1]).
RIDGES = (0.01, 0.03, 0.1, 0.3, 1.0)
# Without a labelled validation molecule: the ridge most often chosen on MoleculeACE's sets.
DEFAULT_RIDGE = 0.1


def tanimoto(a: Tensor, b: Tensor) -> Tensor:
    """The Tanimoto (Jaccard) similarity of count vectors, ``<a, b> / (|a|^2 + |b|^2 - <a, b>)``,
    ``[len(a), len(b)]``, in ``a``'s floating dtype; two empty fingerprints are identical (1)."""
    dot = a @ b.T
    denominator = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - dot
    empty = denominator <= 0
    return torch.where(empty, torch.ones_like(dot), dot / denominator.masked_fill(empty, 1.0))


class FingerprintKernel(nn.Module):
    """Kernel ridge regression with the Tanimoto kernel on Morgan counts, mixed with the network.

    Args:
        references (int): training molecules whose counts the kernel keeps.
        bits (int): the counts' width.
        num_tasks (int): regression targets.
        weight (float): the network's share of the mix; the kernel gets ``1 - weight``.

    Buffers: ``references`` ``[n, bits]`` (the counts, float16: exact below 2,048),
    ``dual`` ``[n, T]`` (zero where a molecule's target is missing), ``offset`` ``[T]`` (the
    training mean) and ``ridge`` ``[T]`` (the chosen ridge; 0 before :meth:`fit`).
    """

    def __init__(self, references: int, bits: int, num_tasks: int, weight: float) -> None:
        super().__init__()
        if not 0.0 <= weight <= 1.0:
            raise ValueError(f"fingerprint_kernel.weight must lie in [0, 1], got {weight}")
        self.weight = float(weight)
        self.register_buffer("references", torch.zeros(references, bits, dtype=torch.float16))
        self.register_buffer("dual", torch.zeros(references, num_tasks))
        self.register_buffer("offset", torch.zeros(num_tasks))
        self.register_buffer("ridge", torch.zeros(num_tasks))

    @property
    def fitted(self) -> bool:
        return bool((self.ridge > 0).all())

    def fit(
        self,
        counts: Tensor,
        targets: Tensor,
        valid_counts: Tensor,
        valid_targets: Tensor,
        ridges: Sequence[float] = RIDGES,
    ) -> list[dict[str, float]]:
        """Fits each target on the training molecules that have it (``counts`` ``[n, bits]``,
        ``targets`` ``[n, T]``, NaN missing), its ridge the one of ``ridges`` with the lowest
        RMSE on the labelled validation molecules (:data:`DEFAULT_RIDGE` with none). Returns per
        target the ridge and its validation RMSE (NaN without validation labels)."""
        if counts.shape != self.references.shape or targets.size(1) != self.dual.size(1):
            raise ValueError(
                f"the kernel keeps {tuple(self.references.shape)} counts and "
                f"{self.dual.size(1)} target(s); got {tuple(counts.shape)} and "
                f"{targets.size(1)}"
            )
        counts, valid_counts = counts.double(), valid_counts.double()
        gram = tanimoto(counts, counts)
        across = tanimoto(valid_counts, counts)
        dual = torch.zeros(self.dual.shape, dtype=torch.float64)
        offset, chosen, report = torch.zeros(self.dual.size(1)), [], []
        for task in range(targets.size(1)):
            y = targets[:, task].double()
            labelled = ~y.isnan()
            if not labelled.any():
                raise ValueError(f"target {task} has no labelled training molecule")
            mean = y[labelled].mean()
            centred = y[labelled] - mean
            sub = gram[labelled][:, labelled]
            valid_y = valid_targets[:, task].double()
            valid_labelled = ~valid_y.isnan()
            best = None
            for ridge in ridges if valid_labelled.any() else (DEFAULT_RIDGE,):
                system = sub + ridge * torch.eye(len(sub), dtype=sub.dtype)
                coefficients = torch.cholesky_solve(
                    centred[:, None], torch.linalg.cholesky(system)
                )[:, 0]
                error = math.nan
                if valid_labelled.any():
                    pred = mean + across[valid_labelled][:, labelled] @ coefficients
                    error = float((pred - valid_y[valid_labelled]).pow(2).mean().sqrt())
                if best is None or error < best[1]:
                    best = (ridge, error, coefficients)
            ridge, error, coefficients = best
            dual[labelled, task] = coefficients
            offset[task] = float(mean)
            chosen.append(ridge)
            report.append({"ridge": ridge, "valid_rmse": error})
        self.references.copy_(counts.to(self.references.dtype))
        self.dual.copy_(dual.to(self.dual.dtype))
        self.offset.copy_(offset)
        self.ridge.copy_(torch.tensor(chosen))
        return report

    def predict(self, counts: Tensor) -> Tensor:
        """The kernel model's predictions ``[B, T]`` for molecules' counts ``[B, bits]``, in
        float32 whatever the run's precision."""
        with torch.autocast(counts.device.type, enabled=False):
            similarity = tanimoto(counts.float(), self.references.float())
            return self.offset.float() + similarity @ self.dual.float()

    def forward(self, network: Tensor, counts: Tensor) -> Tensor:
        """``weight * network + (1 - weight) * kernel``, ``[B, T]`` (the network's predictions in
        the targets' units)."""
        return self.weight * network.float() + (1.0 - self.weight) * self.predict(counts)
