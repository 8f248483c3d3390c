"""The CPU training kernel of biased attention: ``softmax(q k^T / sqrt(d) + bias) v`` with the
bias added inside the score matmul, keys padded for PyTorch's vectorised softmax and dropout
masks drawn from 16-bit slices of bulk random words (see :mod:`graphormer.models.dropout`).
Other devices, dtypes and inference use ``scaled_dot_product_attention``."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from graphormer.models.dropout import check_dropout, keep_mask, uses_fast_path

__all__ = ["biased_attention", "use_own_kernel"]

# PyTorch's CPU softmax is ~15x slower per element on rows shorter than one vector: shorter key
# rows are padded to this many (with -inf) for the softmax.
_SOFTMAX_MIN_KEYS = 16


def use_own_kernel(q: Tensor, dropout_p: float) -> bool:
    """Whether :func:`biased_attention` beats ``scaled_dot_product_attention`` here: on CPU, in
    float32/64, when training (SDPA's CPU flash kernel takes no dropout and no gradient for the
    bias, so it falls back to its unfused math path, which draws a float Bernoulli mask)."""
    return (
        uses_fast_path(q)
        and (dropout_p > 0 or torch.is_grad_enabled())
        and not torch.is_autocast_enabled("cpu")
    )


def biased_attention(
    q: Tensor, k: Tensor, v: Tensor, bias: Tensor, dropout_p: float = 0.0
) -> Tensor:
    r"""``softmax(q k^T / sqrt(d) + bias)`` with dropout on the weights, times ``v``.

    The same function as :func:`torch.nn.functional.scaled_dot_product_attention` with a float
    ``attn_mask``, computed so that training on CPU is cheap: the bias is added inside the score
    matmul (``baddbmm``), and the dropout mask comes from 16-bit slices of bulk random 64-bit
    words instead of one Bernoulli draw per weight (four times fewer random numbers; SDPA's CPU
    math path spends most of a training step drawing them). Each weight is dropped independently
    with probability ``round(p * 65536) / 65536`` (within 2e-5 of ``p``) and the kept ones are
    scaled by the inverse of the keep probability, so the expectation is exact. The mask is
    applied as a product with 0/1 numbers (:func:`~graphormer.models.dropout.keep_mask`; the
    same values as ``masked_fill``, which PyTorch does not vectorise on CPU). Backward keeps the
    softmax output and that mask, and writes the gradient of the weights over the recomputed
    dropped weights. The softmax and its gradient go to new tensors: PyTorch's CPU softmax
    written over its input is twice as slow on rows whose length is not a multiple of 16.

    Shapes:
        - q ``[B, H, Lq, D]``, k and v ``[B, H, Lk, D]``
        - bias ``[B, H, Lq, Lk]`` or broadcastable to it (its gradient keeps its shape)
        - output ``[B, H, Lq, D]``
    """
    if bias.dtype == torch.bool:
        raise ValueError("biased_attention adds a float bias; got a bool mask (use -inf instead)")
    check_dropout(dropout_p)
    if not uses_fast_path(q):  # other devices and dtypes: torch's kernel computes the same
        mask = bias.to(q.dtype)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    with torch.autocast("cpu", enabled=False):  # it computes in the inputs' own dtype
        return _BiasedAttention.apply(q, k, v, bias, float(dropout_p))


class _BiasedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, bias: Tensor, dropout_p: float) -> Tensor:
        batch, heads, q_len, dim = q.shape
        k_len = k.size(2)
        scale = 1.0 / math.sqrt(dim)
        rows = batch * heads
        q3 = q.reshape(rows, q_len, dim)
        k3 = k.reshape(rows, k_len, dim)
        v3 = v.reshape(rows, k_len, dim)
        bias3 = bias.to(q.dtype).expand(batch, heads, q_len, k_len).reshape(rows, q_len, k_len)
        if k_len < _SOFTMAX_MIN_KEYS:
            # PyTorch's CPU softmax runs a scalar loop, ~15x slower per element, over rows shorter
            # than one vector (16 floats). Pad the keys to 16 with zero keys and values that get
            # -inf scores, hence exactly zero weight (also when every real key is masked).
            pad = _SOFTMAX_MIN_KEYS - k_len
            k3 = F.pad(k3, (0, 0, 0, pad))
            v3 = F.pad(v3, (0, 0, 0, pad))
            bias3 = F.pad(bias3, (0, pad), value=-math.inf)
        scores = torch.baddbmm(bias3, q3, k3.transpose(1, 2), alpha=scale)
        # Into a new tensor: PyTorch's softmax written over its input ("out=") is twice as slow
        # on rows that are not a multiple of 16 long, with the same values.
        weights = torch.ops.aten._softmax(scores, -1, False)
        del scores
        # A row whose every score is -inf has no weights: zeros, as SDPA gives (not NaN).
        weights.nan_to_num_(0.0)
        keep, keep_scale = None, 1.0
        if dropout_p > 0:
            keep, keep_scale = keep_mask(weights.shape, dropout_p, weights.dtype)
            out = torch.bmm(torch.mul(weights, keep), v3).mul_(keep_scale)
        else:
            out = torch.bmm(weights, v3)
        ctx.save_for_backward(q3, k3, v3, weights, keep)
        ctx.keep_scale, ctx.scale = keep_scale, scale
        ctx.shapes = (q.shape, k.shape, bias.shape, bias.dtype)
        return out.view(batch, heads, q_len, dim)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor):
        q3, k3, v3, weights, keep = ctx.saved_tensors
        q_shape, k_shape, bias_shape, bias_dtype = ctx.shapes
        grad_out = grad_out.reshape(q3.shape)
        if keep is not None:
            dropped = torch.mul(weights, keep)
            grad_v = torch.bmm(dropped.transpose(1, 2), grad_out).mul_(ctx.keep_scale)
            grad_w = torch.bmm(grad_out, v3.transpose(1, 2), out=dropped)  # reuses the buffer
            grad_w.mul_(keep)
        else:
            grad_v = torch.bmm(weights.transpose(1, 2), grad_out)
            grad_w = torch.bmm(grad_out, v3.transpose(1, 2))
        # softmax backward, w * (g - sum(g * w)), into a new tensor (see forward)
        grad_s = torch.ops.aten._softmax_backward_data(grad_w, weights, -1, weights.dtype)
        del grad_w
        if keep is not None:
            grad_s.mul_(ctx.keep_scale)
        grad_q = torch.bmm(grad_s, k3).mul_(ctx.scale)
        grad_k = torch.bmm(grad_s.transpose(1, 2), q3).mul_(ctx.scale)
        k_len = k_shape[2]
        if k3.size(1) != k_len:  # keys padded for the softmax: drop their gradients
            grad_k, grad_v, grad_s = grad_k[:, :k_len], grad_v[:, :k_len], grad_s[..., :k_len]
        grad_bias = None
        if ctx.needs_input_grad[3]:
            grad_bias = grad_s.reshape(*q_shape[:3], k_len).sum_to_size(bias_shape)
            grad_bias = grad_bias.to(bias_dtype)
        return (
            grad_q.view(q_shape),
            grad_k.reshape(k_shape),
            grad_v.reshape(k_shape),
            grad_bias,
            None,
        )
