"""The initialisation of linear layers: BERT's, as Microsoft's Graphormer uses it."""

from __future__ import annotations

from torch import nn

__all__ = ["bert_init_"]


def bert_init_(*layers: nn.Linear) -> None:
    """N(0, 0.02) weights and zero biases (where a layer has one), in place, layer by layer in
    the order given (the draws, and so a seeded model, depend on it)."""
    for layer in layers:
        nn.init.normal_(layer.weight, std=0.02)
        if layer.bias is not None:
            nn.init.zeros_(layer.bias)
