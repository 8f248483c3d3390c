"""Output heads on the nodes' final states (issue #18): per-atom and per-bond targets."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from graphormer.models.encoders import CategoricalEmbedding
from graphormer.models.init import bert_init_

__all__ = ["BondHead", "NodeHead"]


class NodeHead(nn.Module):
    """One prediction per node from its final hidden state, shaped as the graph token's head
    (transform, GELU, LayerNorm, output layer), with weights of its own.

    Args:
        hidden_dim (int): width of the node states.
        num_tasks (int): outputs per node.

    Shapes:
        - input: ``[B, N, hidden_dim]`` node states (the graph token excluded)
        - output: ``[B, N, num_tasks]``
    """

    def __init__(self, hidden_dim: int, num_tasks: int) -> None:
        super().__init__()
        self.transform = nn.Linear(hidden_dim, hidden_dim)
        self.norm = nn.LayerNorm(hidden_dim)
        self.out = nn.Linear(hidden_dim, num_tasks)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bert_init_(self.transform, self.out)
        self.norm.reset_parameters()

    def forward(self, h: Tensor) -> Tensor:
        return self.out(self.norm(F.gelu(self.transform(h))))


class BondHead(nn.Module):
    """One prediction per bond (edge) from its two atoms' final states, the same for i-j as for
    j-i: the states enter as ``h_i + h_j`` and ``h_i * h_j`` (both symmetric), beside an
    embedding of the bond's own categorical features (bond type, conjugation, ...), then the
    node head's transform, GELU, LayerNorm and output layer.

    Args:
        hidden_dim (int): width of the node states.
        num_tasks (int): outputs per bond.
        bond_feature_dims (Sequence[int]): vocabulary of each categorical edge feature (empty:
            the bond's features are not read).
        feature_stride (int | None, optional): table rows per feature column, as the model's
            edge encoder lays them out. (default: :obj:`None`)

    Shapes:
        - input: ``h`` ``[B, N, hidden_dim]`` node states (the graph token excluded),
          ``bond_atoms`` ``[B, M, 2]`` long, ``bond_attr`` ``[B, M, F_e]`` long
        - output: ``[B, M, num_tasks]``
    """

    def __init__(
        self,
        hidden_dim: int,
        num_tasks: int,
        bond_feature_dims: Sequence[int] = (),
        feature_stride: int | None = None,
    ) -> None:
        super().__init__()
        self.pair = nn.Linear(2 * hidden_dim, hidden_dim)
        self.edge = (
            CategoricalEmbedding(bond_feature_dims, hidden_dim, stride=feature_stride)
            if len(bond_feature_dims)
            else None
        )
        self.norm = nn.LayerNorm(hidden_dim)
        self.out = nn.Linear(hidden_dim, num_tasks)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bert_init_(self.pair, self.out)
        if self.edge is not None:
            self.edge.reset_parameters()
        self.norm.reset_parameters()

    def forward(self, h: Tensor, bond_atoms: Tensor, bond_attr: Tensor | None) -> Tensor:
        b, m = bond_atoms.shape[:2]
        index = bond_atoms.reshape(b, m * 2, 1).expand(-1, -1, h.size(-1))  # [B, 2M, d]
        ends = torch.gather(h, 1, index).view(b, m, 2, h.size(-1))  # [B, M, 2, d]
        h_i, h_j = ends[:, :, 0], ends[:, :, 1]
        z = self.pair(torch.cat([h_i + h_j, h_i * h_j], dim=-1))  # [B, M, d]
        if self.edge is not None and bond_attr is not None:
            z = z + self.edge(bond_attr).to(z.dtype)
        elif self.edge is not None:
            # A batch of bond-less molecules: the table still takes part in the graph (a zero
            # gradient), so that DDP without find_unused_parameters does not stall.
            z = z + sum(p.sum() for p in self.edge.parameters()).to(z.dtype) * 0
        return self.out(self.norm(F.gelu(z)))
