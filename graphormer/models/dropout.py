"""Dropout whose CPU mask costs a quarter of a random number per element.

On CPU, ``torch.nn.functional.dropout`` draws one Bernoulli sample per element, which makes the
dropout masks of a small Graphormer's training step cost more than its matrix products. Here one
64-bit random word gives four 16-bit uniform numbers, and an element drops when its number falls
below ``round(p * 65536)``: the drop probability is ``p`` to within 2e-5, and the kept elements are
scaled by the inverse of the exact keep probability, so the expectation is unchanged. GPUs keep
PyTorch's fused kernels.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "Dropout",
    "check_dropout",
    "drop_mask",
    "dropout",
    "keep_mask",
    "twice_differentiable",
    "twice_differentiable_now",
]

_LEVELS = 65536  # 16-bit uniform numbers

# Open twice_differentiable() blocks: while any is, the CPU fast paths step aside.
_TWICE = 0


@contextlib.contextmanager
def twice_differentiable() -> Iterator[None]:
    """Within this block the CPU fast paths (this dropout, the attention kernel, the edge
    encoding's gradient) and, on every device, the fused attention kernels of
    ``scaled_dot_product_attention`` (CUDA's memory-efficient and cuDNN kernels have no second
    derivative) give way to plain PyTorch operations, whose backward passes can be
    differentiated again: a loss on forces that are an energy's gradient trains through a
    second derivative, and the fast paths' backward passes are differentiable once."""
    global _TWICE
    _TWICE += 1
    try:
        yield
    finally:
        _TWICE -= 1


def twice_differentiable_now() -> bool:
    """Whether a :func:`twice_differentiable` block is open."""
    return _TWICE > 0


def _uniform16(shape: torch.Size | tuple[int, ...]) -> Tensor:
    """Independent uniform 16-bit integers (int16, -32768..32767) of ``shape``, four to a random
    64-bit word of torch's default CPU generator."""
    count = math.prod(shape)
    words = torch.empty((count + 3) // 4, dtype=torch.int64).random_(-(2**63), None)
    return words.view(torch.int16)[:count].view(shape)


def _threshold(p: float) -> int | None:
    """The int16 value below which a :func:`_uniform16` number drops its element (probability
    ``round(p * 65536) / 65536``), or None when every element drops (it would overflow int16)."""
    levels = min(round(p * _LEVELS), _LEVELS)
    return None if levels >= _LEVELS else levels - _LEVELS // 2


def drop_mask(shape: torch.Size | tuple[int, ...], p: float) -> tuple[Tensor, float]:
    """A bool mask of ``shape`` (True = drop, each element independently) and the scale of the
    kept elements; drawn from torch's default CPU generator, so ``torch.manual_seed`` and saved
    RNG states reproduce it."""
    threshold = _threshold(p)
    if threshold is None:  # everything drops
        return torch.ones(shape, dtype=torch.bool), 0.0
    return _uniform16(shape) < threshold, _LEVELS / (_LEVELS // 2 - threshold)


def keep_mask(
    shape: torch.Size | tuple[int, ...], p: float, dtype: torch.dtype = torch.float32
) -> tuple[Tensor, float]:
    """:func:`drop_mask`'s complement from the same draw, as numbers: 1 where an element is kept,
    0 where it drops, in ``dtype``, and the scale of the kept elements.

    Multiplying by it gives the values of ``masked_fill(drop, 0)`` at a quarter of the time on
    CPU (``masked_fill`` with a bool mask is not vectorised there), except that a dropped
    negative number becomes -0.0 and a dropped infinity NaN (a non-finite loss stops a run
    anyway). The mask takes the dtype's bytes per element where a bool took one."""
    threshold = _threshold(p)
    if threshold is None:
        return torch.zeros(shape, dtype=dtype), 0.0
    keep = torch.empty(shape, dtype=dtype)
    torch.ge(_uniform16(shape), threshold, out=keep)
    return keep, _LEVELS / (_LEVELS // 2 - threshold)


def check_dropout(p: float) -> None:
    """Raises, as :class:`torch.nn.Dropout` does, unless ``0 <= p <= 1``."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")


def uses_fast_path(x: Tensor) -> bool:
    """CPU float32/64 tensors, outside torch.func transforms (whose vmap our autograd Functions
    do not implement), outside ``torch.compile`` (whose traced graphs cannot replay the
    64-to-16-bit view of the random words; the compiler fuses torch's own dropout instead) and
    outside :func:`twice_differentiable`."""
    return (
        x.device.type == "cpu"
        and not _TWICE
        and x.dtype in (torch.float32, torch.float64)
        and not torch._C._are_functorch_transforms_active()
        and not torch.compiler.is_compiling()
    )


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """:func:`torch.nn.functional.dropout` with the cheap CPU mask (see the module docstring)."""
    check_dropout(p)
    if not training or p == 0:
        return x
    if not uses_fast_path(x):
        return F.dropout(x, p, training)
    return _Dropout.apply(x, float(p))


class _Dropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, p: float) -> Tensor:
        keep, keep_scale = keep_mask(x.shape, p, x.dtype)
        ctx.save_for_backward(keep)
        ctx.keep_scale = keep_scale
        return torch.mul(x, keep).mul_(keep_scale)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        (keep,) = ctx.saved_tensors
        return torch.mul(grad, keep).mul_(ctx.keep_scale), None


class Dropout(nn.Dropout):
    """:class:`torch.nn.Dropout` with the cheap CPU mask of :func:`dropout`."""

    def forward(self, x: Tensor) -> Tensor:
        if self.inplace:
            return super().forward(x)
        return dropout(x, self.p, self.training)
