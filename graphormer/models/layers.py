"""One Graphormer transformer layer (pre- or post-LayerNorm)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from graphormer.models.attention import BiasedMultiheadAttention
from graphormer.models.dropout import Dropout

__all__ = ["GraphormerLayer"]


class GraphormerLayer(nn.Module):
    """Self-attention with the structural bias, then a GELU feed-forward block, each residual.

    Pre-LN (default) normalises each block's input, as the paper does (Ying et al., 2021, Eq. 8);
    post-LN normalises after each residual sum, as the original Transformer.

    Args:
        hidden_dim (int): model width ``d``.
        ffn_dim (int): feed-forward width.
        num_heads (int): attention heads ``H``.
        dropout (float, optional): dropout after attention and feed-forward. (default: :obj:`0.1`)
        attention_dropout (float, optional): dropout on attention weights. (default: :obj:`0.1`)
        activation_dropout (float, optional): dropout after the GELU. (default: :obj:`0.1`)
        pre_layernorm (bool, optional): pre-LN if True, post-LN otherwise. (default: :obj:`True`)
        attention_activation (str, optional): the attention's ``"softmax"`` or ``"silu"``
            weights (:class:`BiasedMultiheadAttention`). (default: :obj:`"softmax"`)

    Shapes:
        - h ``[B, L, d]``, attn_bias ``[B, H, L, L]``, key_padding_mask ``[B, L]`` (optional: may
          be folded into ``attn_bias`` already) -> ``[B, L, d]``
    """

    def __init__(
        self,
        hidden_dim: int,
        ffn_dim: int,
        num_heads: int,
        dropout: float = 0.1,
        attention_dropout: float = 0.1,
        activation_dropout: float = 0.1,
        pre_layernorm: bool = True,
        attention_activation: str = "softmax",
    ) -> None:
        super().__init__()
        self.pre_layernorm = pre_layernorm
        self.attn = BiasedMultiheadAttention(
            hidden_dim, num_heads, dropout=attention_dropout, activation=attention_activation
        )
        self.attn_norm = nn.LayerNorm(hidden_dim)
        self.fc1 = nn.Linear(hidden_dim, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, hidden_dim)
        self.ffn_norm = nn.LayerNorm(hidden_dim)
        self.dropout = Dropout(dropout)
        self.activation_dropout = Dropout(activation_dropout)

    def forward(
        self,
        h: Tensor,
        attn_bias: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = False,
        packed: tuple[Tensor, int, int] | None = None,
        attn_gate: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """With ``packed=(tokens, B, L)``, ``h`` holds only the ``T`` real tokens of a padded
        batch, ``[T, d]``: every per-token operation (projections, LayerNorms, feed-forward) skips
        the padding; see :meth:`BiasedMultiheadAttention.forward`."""
        residual = h
        if self.pre_layernorm:
            h = self.attn_norm(h)
        h, weights = self.attn(
            h,
            attn_bias=attn_bias,
            key_padding_mask=key_padding_mask,
            need_weights=need_weights,
            average_attn_weights=False,
            packed=packed,
            attn_gate=attn_gate,
        )
        return self._finish(residual, h), weights

    def _finish(self, residual: Tensor, h: Tensor) -> Tensor:
        """The attention residual, then the feed-forward block."""
        h = residual + self.dropout(h)
        if not self.pre_layernorm:
            h = self.attn_norm(h)

        residual = h
        if self.pre_layernorm:
            h = self.ffn_norm(h)
        h = self.fc2(self.activation_dropout(F.gelu(self.fc1(h))))
        h = residual + self.dropout(h)
        if not self.pre_layernorm:
            h = self.ffn_norm(h)
        return h
