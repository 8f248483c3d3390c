"""The paper's learning-rate schedule: linear warm-up, then linear decay to an end rate."""

from __future__ import annotations

__all__ = ["warmup_linear_decay"]


def warmup_linear_decay(
    step: int, warmup_steps: int, total_steps: int, peak_lr: float, end_lr: float
) -> float:
    """Learning rate at optimiser step ``step`` (0-based).

    Rises linearly from ``peak_lr / warmup_steps`` to ``peak_lr`` over ``warmup_steps`` steps, then
    falls linearly to ``end_lr`` at ``total_steps`` and stays there (Microsoft's Graphormer uses
    the same polynomial decay with power 1).
    """
    if step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    if step >= total_steps:
        return end_lr
    remaining = (total_steps - step) / max(total_steps - warmup_steps, 1)
    return end_lr + (peak_lr - end_lr) * remaining
