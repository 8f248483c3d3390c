"""Output heads on the nodes' final states (issue #18): per-atom targets."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["NodeHead"]


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
        for layer in (self.transform, self.out):
            nn.init.normal_(layer.weight, std=0.02)
            nn.init.zeros_(layer.bias)
        self.norm.reset_parameters()

    def forward(self, h: Tensor) -> Tensor:
        return self.out(self.norm(F.gelu(self.transform(h))))
