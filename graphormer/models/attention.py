"""Multi-head attention with an additive per-head score bias and public q/k/v/out projections."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from graphormer.models.attention_kernel import biased_attention, use_own_kernel
from graphormer.models.dropout import check_dropout, dropout, twice_differentiable_now

__all__ = ["ACTIVATIONS", "BiasedMultiheadAttention"]

# How the scores become weights: normalised over the keys, or each one on its own.
ACTIVATIONS = ("softmax", "silu")


class BiasedMultiheadAttention(nn.Module):
    r"""Multi-head attention whose scores take an additive bias before the softmax:

    .. math::
        \mathrm{softmax}\left(\frac{QK^\top}{\sqrt{d_h}} + B\right) V

    as Graphormer needs for its spatial, edge and centrality encodings (Ying et al., 2021,
    `arXiv:2106.05234 <https://arxiv.org/abs/2106.05234>`_, Eq. 6). Unlike
    :class:`torch.nn.MultiheadAttention`, the query, key, value and output projections are public
    :class:`~torch.nn.Linear` layers, and :meth:`project` returns the per-head q, k and v. Weights
    convert to and from :class:`torch.nn.MultiheadAttention` (:meth:`from_torch`, :meth:`to_torch`,
    and :meth:`load_state_dict` of its state dict), and with no bias the outputs match it.

    With ``activation="silu"`` the weights are not normalised over the keys: each is
    :math:`\mathrm{SiLU}(q_i \cdot k_j / \sqrt{d_h} + B_{ij})`, times a multiplicative gate
    ``attn_gate`` where one is given (TorchMD-Net's equivariant transformer, Thoelke and De
    Fabritiis, 2022, https://arxiv.org/abs/2202.02541, gates them with a cosine cutoff of the
    distance), so that an atom's update is a sum over its neighbours, which grows with their
    number, rather than an average. Masked keys (the bias's most negative value, or
    ``key_padding_mask``) get weight 0.

    Args:
        embed_dim (int): model width ``E``.
        num_heads (int): number of heads ``H``; must divide ``embed_dim``.
        dropout (float, optional): dropout on the attention weights. (default: :obj:`0.0`)
        bias (bool, optional): whether the projections have biases. (default: :obj:`True`)
        batch_first (bool, optional): inputs are ``[B, L, E]`` if True, ``[L, B, E]`` otherwise.
            (default: :obj:`True`)
        activation (str, optional): ``"softmax"`` or ``"silu"`` (unnormalised weights, see
            above). (default: :obj:`"softmax"`)

    Shapes:
        - query ``[B, Lq, E]``, key/value ``[B, Lk, E]`` (batch_first)
        - attn_bias ``[B, H, Lq, Lk]`` or ``[B, Lq, Lk]`` (float, added to the scaled scores)
        - key_padding_mask ``[B, Lk]`` (bool, True = ignore that key)
        - attn_gate ``[B, 1 or H, Lq, Lk]`` (float, multiplies the weights; ``"silu"`` only)
        - output ``[B, Lq, E]``; weights ``[B, Lq, Lk]`` (averaged) or ``[B, H, Lq, Lk]``
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        batch_first: bool = True,
        activation: str = "softmax",
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"activation={activation!r} is not allowed: one of {', '.join(ACTIVATIONS)}"
            )
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(
                f"embed_dim and num_heads must be positive, got {embed_dim}, {num_heads}"
            )
        if embed_dim % num_heads != 0:
            raise ValueError(
                f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads}); "
                f"choose num_heads among the divisors of {embed_dim}"
            )
        check_dropout(dropout)
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.activation = activation
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # nn.MultiheadAttention's initialisation: Xavier-uniform over the packed [3E, E] in_proj
        # weight (so each [E, E] block gets the bound of a [3E, E] matrix), zero biases.
        bound = math.sqrt(6.0 / (self.embed_dim + 3 * self.embed_dim))
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.uniform_(proj.weight, -bound, bound)
            if proj.bias is not None:
                nn.init.zeros_(proj.bias)
        self.out_proj.reset_parameters()
        if self.out_proj.bias is not None:
            nn.init.zeros_(self.out_proj.bias)

    def _split_heads(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        # [B, L, E] -> [B, L, H, D] -> [B, H, L, D]
        return x.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)

    def project(
        self, query: Tensor, key: Tensor | None = None, value: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Per-head projections ``(q, k, v)``, each ``[B, H, L, head_dim]``.

        Inputs follow :attr:`batch_first`; ``key`` and ``value`` default to ``query``.
        """
        key = query if key is None else key
        value = key if value is None else value
        if not self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        return (
            self._split_heads(self.q_proj(query)),
            self._split_heads(self.k_proj(key)),
            self._split_heads(self.v_proj(value)),
        )

    def _additive_mask(
        self,
        attn_bias: Tensor | None,
        key_padding_mask: Tensor | None,
        batch: int,
        q_len: int,
        k_len: int,
        dtype: torch.dtype,
    ) -> Tensor | None:
        mask = None
        if attn_bias is not None:
            if attn_bias.dim() == 3:
                attn_bias = attn_bias.unsqueeze(1)  # [B, Lq, Lk] -> [B, 1, Lq, Lk]
            if attn_bias.dim() != 4 or attn_bias.shape[-2:] != (q_len, k_len):
                raise ValueError(
                    f"attn_bias must be [B, H, {q_len}, {k_len}] or [B, {q_len}, {k_len}], "
                    f"got {tuple(attn_bias.shape)}"
                )
            mask = attn_bias.to(dtype)
        if key_padding_mask is not None:
            if key_padding_mask.shape != (batch, k_len):
                raise ValueError(
                    f"key_padding_mask must be [{batch}, {k_len}], got "
                    f"{tuple(key_padding_mask.shape)}"
                )
            if key_padding_mask.dtype != torch.bool:
                raise ValueError("key_padding_mask must be a bool tensor (True = ignore that key)")
            pad = key_padding_mask[:, None, None, :]  # [B, 1, 1, Lk]
            if mask is None:
                mask = torch.zeros(batch, 1, 1, k_len, dtype=dtype, device=pad.device)
            # The dtype's most negative finite value rather than -inf: an all-masked row then
            # averages the values instead of returning NaN, and other rows are unchanged.
            mask = mask.masked_fill(pad, torch.finfo(dtype).min)
        return mask

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        attn_bias: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = False,
        average_attn_weights: bool = True,
        packed: tuple[Tensor, int, int] | None = None,
        attn_gate: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attends ``query`` to ``key``/``value`` (self-attention when they are None).

        With ``packed=(tokens, B, L)``, ``query`` holds only the ``T`` real tokens of a padded
        batch, ``[T, E]`` (``tokens``: each one's row in the flattened ``[B * L]`` batch): the
        projections run on those tokens alone (a padded batch of molecules of mixed sizes is
        mostly padding), which are scattered into the padded ``[B, H, L, D]`` layout for the
        attention itself. ``attn_bias`` or ``key_padding_mask`` (``[B, L]``) must then mask the
        padded keys (Graphormer's bias does); the output is ``[T, E]``, equal to :meth:`forward`
        on the padded batch at those rows. Packed batches are self-attention: ``key`` and
        ``value`` must be None.

        ``attn_gate`` multiplies the weights of ``activation="silu"`` (softmax weights take
        none: fold a mask into ``attn_bias``).

        Returns:
            ``(output, weights)``; ``weights`` is None unless ``need_weights``.
        """
        if attn_gate is not None and self.activation == "softmax":
            raise ValueError(
                "attn_gate multiplies unnormalised (activation='silu') weights; softmax "
                "weights take their masks in attn_bias"
            )
        if packed is not None:
            if key is not None or value is not None:
                raise ValueError(
                    "packed=(tokens, B, L) is self-attention over the packed tokens: pass key "
                    "and value as None (or attend the padded [B, L, E] batch without packed=)"
                )
            out, weights = self._forward_packed(
                query, *packed, attn_bias, key_padding_mask, need_weights, attn_gate
            )
            if weights is not None and average_attn_weights:
                weights = weights.mean(dim=1)
            return out, weights
        q, k, v = self.project(query, key, value)  # [B, H, L, D]
        batch, _, q_len, _ = q.shape
        mask = self._additive_mask(attn_bias, key_padding_mask, batch, q_len, k.size(2), q.dtype)
        out, weights = self._attend(q, k, v, mask, need_weights, attn_gate)
        out = out.transpose(1, 2).reshape(batch, q_len, self.embed_dim)  # [B, Lq, E]
        out = self.out_proj(out)
        if not self.batch_first:
            out = out.transpose(0, 1)
        if weights is not None and average_attn_weights:
            weights = weights.mean(dim=1)
        return out, weights

    def _forward_packed(
        self,
        x: Tensor,
        tokens: Tensor,
        batch: int,
        length: int,
        attn_bias: Tensor | None,
        key_padding_mask: Tensor | None,
        need_weights: bool,
        gate: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        heads, dim = self.num_heads, self.head_dim
        rows, columns = tokens // length, tokens % length  # each token's graph and position

        def scatter(t: Tensor) -> Tensor:  # [T, E] -> [B, H, L, D], zeros at padding
            # Written straight into the heads' layout (one pass; no copy to transpose).
            full = t.new_zeros(batch, heads, length, dim)
            full[rows, :, columns] = t.view(-1, heads, dim)
            return full

        # The modules themselves (not their weights), so that hooks and swapped-in layers apply.
        q, k, v = (scatter(proj(x)) for proj in (self.q_proj, self.k_proj, self.v_proj))
        mask = self._additive_mask(attn_bias, key_padding_mask, batch, length, length, q.dtype)
        out, weights = self._attend(q, k, v, mask, need_weights, gate)
        out = out[rows, :, columns]  # the real tokens' rows, [T, H, D]
        return self.out_proj(out.reshape(-1, self.embed_dim)), weights

    def _attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        need_weights: bool,
        gate: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """``(softmax(q k^T / sqrt(D) + mask) v, per-head weights or None)``, ``[B, H, Lq, D]``
        (``silu(...) * gate`` with ``activation="silu"``)."""
        dropout_p = self.dropout if self.training else 0.0
        if self.activation == "silu":
            scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # [B, H, Lq, Lk]
            if mask is not None:
                # A masked key's score is the dtype's most negative finite value, where SiLU
                # and its slope are exactly 0 (finite: no NaN in the gradient).
                scores = scores + mask
            weights = F.silu(scores)
            if gate is not None:
                weights = weights * gate.to(weights.dtype)
            out = dropout(weights, dropout_p, self.training) @ v
            return out, weights if need_weights else None
        if need_weights or twice_differentiable_now():
            # Plain operations: the weights to return, or a second derivative to take (the
            # fused kernels' backward passes are differentiable once).
            scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # [B, H, Lq, Lk]
            if mask is not None:
                scores = scores + mask
            weights = scores.softmax(dim=-1)
            out = dropout(weights, dropout_p, self.training) @ v
            return out, weights if need_weights else None
        if mask is not None and use_own_kernel(q, dropout_p):
            return biased_attention(q, k, v, mask, dropout_p), None
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p), None

    # -- interoperability with torch.nn.MultiheadAttention ------------------------------------

    @classmethod
    def from_torch(cls, mha: nn.MultiheadAttention) -> BiasedMultiheadAttention:
        """A copy of ``mha``'s weights and settings as a :class:`BiasedMultiheadAttention`."""
        _check_representable(mha)
        module = cls(
            mha.embed_dim,
            mha.num_heads,
            dropout=mha.dropout,
            bias=mha.in_proj_bias is not None,
            batch_first=mha.batch_first,
        )
        module = module.to(device=mha.in_proj_weight.device, dtype=mha.in_proj_weight.dtype)
        module.load_state_dict(mha.state_dict())
        return module

    def to_torch(self) -> nn.MultiheadAttention:
        """A :class:`torch.nn.MultiheadAttention` with these weights (``in_proj`` = [q; k; v])."""
        if self.activation != "softmax":
            raise ValueError(
                f"torch.nn.MultiheadAttention normalises its weights with a softmax; this "
                f"module's are {self.activation}: no such module computes the same"
            )
        has_bias = self.q_proj.bias is not None
        weight = self.q_proj.weight
        mha = nn.MultiheadAttention(
            self.embed_dim,
            self.num_heads,
            dropout=self.dropout,
            bias=has_bias,
            batch_first=self.batch_first,
            device=weight.device,
            dtype=weight.dtype,
        )
        with torch.no_grad():
            mha.in_proj_weight.copy_(
                torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])
            )
            mha.out_proj.weight.copy_(self.out_proj.weight)
            if has_bias:
                mha.in_proj_bias.copy_(
                    torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias])
                )
                mha.out_proj.bias.copy_(self.out_proj.bias)
        return mha

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        # Accept nn.MultiheadAttention's packed layout: in_proj_weight [3E, E] = [q; k; v].
        unsupported = [
            name
            for name in ("bias_k", "bias_v", "q_proj_weight", "k_proj_weight", "v_proj_weight")
            if prefix + name in state_dict
        ]
        if unsupported:
            raise ValueError(
                f"state dict holds {', '.join(prefix + n for n in unsupported)}: "
                "BiasedMultiheadAttention cannot represent add_bias_kv or kdim/vdim != embed_dim"
            )
        for name in ("weight", "bias"):
            packed = state_dict.pop(prefix + f"in_proj_{name}", None)
            if packed is None:
                continue
            if packed.size(0) != 3 * self.embed_dim:
                raise ValueError(
                    f"{prefix}in_proj_{name} has {packed.size(0)} rows, expected "
                    f"3 * embed_dim = {3 * self.embed_dim}"
                )
            for proj, part in zip(
                ("q_proj", "k_proj", "v_proj"), packed.chunk(3, dim=0), strict=True
            ):
                state_dict[f"{prefix}{proj}.{name}"] = part
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )

    def extra_repr(self) -> str:
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}, "
            f"batch_first={self.batch_first}"
            + (f", activation={self.activation}" if self.activation != "softmax" else "")
        )


def _check_representable(mha: nn.MultiheadAttention) -> None:
    problems = []
    if mha.bias_k is not None or mha.bias_v is not None:
        problems.append("add_bias_kv=True")
    if mha.add_zero_attn:
        problems.append("add_zero_attn=True")
    if not mha._qkv_same_embed_dim:
        problems.append(f"kdim/vdim ({mha.kdim}/{mha.vdim}) != embed_dim ({mha.embed_dim})")
    if problems:
        raise ValueError(
            "BiasedMultiheadAttention cannot represent nn.MultiheadAttention with "
            + ", ".join(problems)
        )
