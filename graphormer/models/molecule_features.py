"""Molecule-level input features (RDKit descriptors, a file's numeric columns; issue #22): the
rule that turns raw values into model inputs, and their learned projection."""

from __future__ import annotations

import torch
from torch import Tensor

from graphormer.models.encoders import ContinuousProjection

__all__ = ["MOLECULE_FEATURE_RULE", "MoleculeFeatureInput"]

# The rule, stored with every checkpoint that reads molecule features (hyper-parameters) and
# shown in the docs: the statistics it names are buffers of MoleculeFeatureInput.
MOLECULE_FEATURE_RULE = (
    "non-finite values are replaced by the training split's median of the column; columns "
    "without a finite value, or constant, on the training split are dropped (zero input); the "
    "rest are standardised with the training split's mean and standard deviation and clipped "
    "to [-clip, clip]"
)


class MoleculeFeatureInput(ContinuousProjection):
    """Raw molecule features ``[B, D]`` -> a learned vector ``[B, out_dim]``, after
    :data:`MOLECULE_FEATURE_RULE` with statistics of the training split (buffers ``fill``,
    ``mean``, ``std``, ``keep``: saved with the weights, so that evaluation and prediction
    transform exactly as training did): a :class:`ContinuousProjection` whose standardisation
    also fills, drops and clips, since descriptors are missing, constant or heavy-tailed.

    Args:
        in_dim (int): raw features per molecule.
        out_dim (int): output width.
        clip (float, optional): bound of the standardised values (a few molecules far out, such
            as Ipc's 1e30s, cannot dominate). (default: :obj:`5.0`)

    Shapes:
        - input ``[B, in_dim]`` float (NaN / inf allowed) -> output ``[B, out_dim]``
    """

    def __init__(self, in_dim: int, out_dim: int, clip: float = 5.0) -> None:
        super().__init__(in_dim, out_dim)  # mean, std and the linear layer
        self.clip = float(clip)
        self.register_buffer("fill", torch.zeros(in_dim))
        self.register_buffer("keep", torch.ones(in_dim))

    @torch.no_grad()
    def fit(self, rows: Tensor) -> dict[str, list[int]]:
        """Sets the statistics from the training split's raw rows ``[n, in_dim]``; returns the
        dropped columns by reason (``no_finite_value``, ``constant``)."""
        rows = rows.double()
        finite = torch.isfinite(rows)
        none = ~finite.any(0)
        fill = torch.nanmedian(torch.where(finite, rows, torch.nan), dim=0).values
        fill = torch.nan_to_num(fill, nan=0.0)
        filled = torch.where(finite, rows, fill)
        mean = filled.mean(0) if len(rows) else torch.zeros_like(fill)
        std = filled.std(0, correction=0) if len(rows) else torch.zeros_like(fill)
        constant = ~none & (std <= 1e-12 * mean.abs().clamp(min=1.0))
        keep = ~(none | constant)
        self.fill.copy_(fill.to(self.fill))
        self.mean.copy_(torch.where(keep, mean, 0.0).to(self.mean))
        self.std.copy_(torch.where(keep, std, 1.0).to(self.std))
        self.keep.copy_(keep.to(self.keep))
        return {
            "no_finite_value": none.nonzero().view(-1).tolist(),
            "constant": constant.nonzero().view(-1).tolist(),
        }

    def standardise(self, values: Tensor) -> Tensor:
        """The model's view of raw ``values`` ``[B, in_dim]``: the rule applied."""
        values = values.float()
        values = torch.where(torch.isfinite(values), values, self.fill.float())
        standard = (values - self.mean.float()) / self.std.float()
        return standard.clamp(-self.clip, self.clip) * self.keep.float()

    def forward(self, values: Tensor) -> Tensor:
        weight = self.linear.weight
        return self.linear(self.standardise(values).to(weight.dtype))
