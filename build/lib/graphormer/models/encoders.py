"""Graphormer's input encodings: node + centrality embeddings, and the structural attention bias."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["CategoricalEmbedding", "GraphAttentionBias", "NodeEncoder"]


class CategoricalEmbedding(nn.Module):
    """Sum of one embedding per categorical feature column, from a single table.

    Args:
        feature_dims (Sequence[int]): vocabulary size of each column.
        embed_dim (int): output width.
        stride (int | None, optional): give every column ``stride`` table rows (the layout of
            Microsoft's Graphormer, 512 per column) instead of exactly ``feature_dims[i]``.
            (default: :obj:`None`)
        reduce (str, optional): ``"sum"`` or ``"mean"`` over the columns. (default: :obj:`"sum"`)

    Shapes:
        - input ``[..., F]`` long, column ``i`` in ``[0, feature_dims[i])``
        - output ``[..., embed_dim]``
    """

    def __init__(
        self,
        feature_dims: Sequence[int],
        embed_dim: int,
        stride: int | None = None,
        reduce: str = "sum",
    ) -> None:
        super().__init__()
        dims = [int(d) for d in feature_dims]
        if not dims or min(dims) < 1:
            raise ValueError(f"feature_dims must be positive sizes, got {list(feature_dims)}")
        if stride is not None and stride < max(dims):
            raise ValueError(
                f"feature_stride ({stride}) must be >= the largest vocabulary {max(dims)}"
            )
        if reduce not in ("sum", "mean"):
            raise ValueError(f"reduce must be 'sum' or 'mean', got {reduce!r}")
        sizes = [stride] * len(dims) if stride is not None else dims
        offsets = torch.tensor([0, *sizes[:-1]]).cumsum(0)
        self.feature_dims = dims
        self.reduce = reduce
        self.register_buffer("offsets", offsets, persistent=False)
        self.embedding = nn.Embedding(sum(sizes), embed_dim)

    def reset_parameters(self) -> None:
        nn.init.normal_(self.embedding.weight, std=0.02)

    def forward(self, features: Tensor) -> Tensor:
        if features.size(-1) != len(self.feature_dims):
            raise ValueError(
                f"expected {len(self.feature_dims)} feature columns, got {features.size(-1)}"
            )
        out = self.embedding(features + self.offsets)  # [..., F, d]
        return out.sum(-2) if self.reduce == "sum" else out.mean(-2)


class NodeEncoder(nn.Module):
    """Atom-feature embedding plus the centrality encoding (Ying et al., 2021, Eq. 5).

    Args:
        atom_feature_dims (Sequence[int]): vocabulary size of each node feature.
        hidden_dim (int): model width ``d``.
        max_degree (int): in/out-degrees above it share the last embedding.
        feature_stride (int | None, optional): see :class:`CategoricalEmbedding`.

    Shapes:
        - x ``[B, N, F]``, in_degree/out_degree ``[B, N]``, node_mask ``[B, N]`` -> ``[B, N, d]``
    """

    def __init__(
        self,
        atom_feature_dims: Sequence[int],
        hidden_dim: int,
        max_degree: int,
        feature_stride: int | None = None,
    ) -> None:
        super().__init__()
        self.max_degree = max_degree
        self.atom = CategoricalEmbedding(atom_feature_dims, hidden_dim, stride=feature_stride)
        self.in_degree = nn.Embedding(max_degree + 1, hidden_dim)
        self.out_degree = nn.Embedding(max_degree + 1, hidden_dim)

    def reset_parameters(self) -> None:
        self.atom.reset_parameters()
        for emb in (self.in_degree, self.out_degree):
            nn.init.normal_(emb.weight, std=0.02)

    def forward(
        self, x: Tensor, in_degree: Tensor, out_degree: Tensor, node_mask: Tensor
    ) -> Tensor:
        h = self.atom(x)
        h = h + self.in_degree(in_degree.clamp(max=self.max_degree))
        h = h + self.out_degree(out_degree.clamp(max=self.max_degree))
        # Zero the padding so that padded positions carry no information at all.
        return h * node_mask.unsqueeze(-1).to(h.dtype)


class GraphAttentionBias(nn.Module):
    """Per-head attention bias from graph structure (Ying et al., 2021, Eq. 6-7).

    The bias of pair ``(i, j)`` is the spatial encoding ``b_{phi(i,j)}`` (one learnable scalar per
    head and hop distance, with own entries for distances beyond ``max_distance`` and for unreachable
    pairs, or one entry for both with ``unreachable_as_far``) plus the edge encoding: for ``multi_hop``, the mean over the first ``min(dist, K)`` edges
    of a shortest path of (bond embedding @ a learnable ``[H, H]`` matrix of that hop); for
    ``single_hop``, the bond embedding of a direct edge. The graph token gets one learnable
    per-head scalar to and from every node.

    Each edge is embedded once, transformed once per hop (``[K, E, H]``), and the per-pair sum is an
    ``embedding_bag`` over the path's rows, so nothing of shape ``[B, N, N, K, F_e, H]`` (nor
    ``[B, N, N, K, H]``) is ever built.

    Args:
        num_heads (int): ``H``.
        bond_feature_dims (Sequence[int]): vocabulary size of each edge feature.
        max_distance (int): largest hop distance with its own spatial entry.
        edge_encoding (str): ``"multi_hop"`` or ``"single_hop"``.
        multi_hop_max_dist (int): ``K``, path edges used by ``multi_hop``.
        feature_stride (int | None, optional): see :class:`CategoricalEmbedding`.
        unreachable_as_far (bool, optional): unreachable pairs use the entry of pairs farther than
            ``max_distance`` (Microsoft's layout, where both are distance 510) rather than their
            own. (default: :obj:`False`)

    Shapes:
        - spatial_pos ``[B, N, N]``, edge_path ``[B, N, N, >=K]``, edge_attr ``[E, F_e]``
        - output ``[B, H, N + 1, N + 1]`` (graph token at index 0)
    """

    def __init__(
        self,
        num_heads: int,
        bond_feature_dims: Sequence[int],
        max_distance: int,
        edge_encoding: str = "multi_hop",
        multi_hop_max_dist: int = 5,
        feature_stride: int | None = None,
        unreachable_as_far: bool = False,
    ) -> None:
        super().__init__()
        if edge_encoding not in ("multi_hop", "single_hop"):
            raise ValueError(
                f"edge_encoding must be 'multi_hop' or 'single_hop', got {edge_encoding!r}"
            )
        if multi_hop_max_dist < 1:
            raise ValueError(f"multi_hop_max_dist must be >= 1, got {multi_hop_max_dist}")
        self.num_heads = num_heads
        self.max_distance = max_distance
        self.edge_encoding = edge_encoding
        self.multi_hop_max_dist = multi_hop_max_dist if edge_encoding == "multi_hop" else 1
        self.unreachable_as_far = unreachable_as_far
        # Rows: distances 0..max_distance, then "farther", then "unreachable" (unless it is "far").
        self.spatial = nn.Embedding(max_distance + (2 if unreachable_as_far else 3), num_heads)
        self.edge = CategoricalEmbedding(
            bond_feature_dims, num_heads, stride=feature_stride, reduce="mean"
        )
        if edge_encoding == "multi_hop":
            self.hop_weight = nn.Parameter(torch.empty(multi_hop_max_dist, num_heads, num_heads))
        else:
            self.register_parameter("hop_weight", None)
        self.graph_token_distance = nn.Parameter(torch.empty(num_heads))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.spatial.weight, std=0.02)
        self.edge.reset_parameters()
        if self.hop_weight is not None:
            nn.init.normal_(self.hop_weight, std=0.02)
        nn.init.normal_(self.graph_token_distance, std=0.02)

    def spatial_index(self, spatial_pos: Tensor) -> Tensor:
        far = self.max_distance + 1
        unreachable = far if self.unreachable_as_far else far + 1
        spatial_pos = spatial_pos.long()
        index = spatial_pos.clamp(max=far)
        return torch.where(spatial_pos < 0, torch.full_like(index, unreachable), index)

    def edge_bias(self, spatial_pos: Tensor, edge_path: Tensor, edge_attr: Tensor) -> Tensor:
        """Edge encoding ``[B, N, N, H]``."""
        hops = self.multi_hop_max_dist
        if edge_path.size(-1) < hops:
            # GraphormerConfig.check_hops refuses such settings before any batch is built.
            raise ValueError(
                f"edge_path has {edge_path.size(-1)} hops but the model's multi_hop_max_dist is "
                f"{hops}: raise the data's max_hops"
            )
        edge_emb = self.edge(edge_attr)  # [E, H], mean over the bond features
        num_edges = edge_emb.size(0)
        path = edge_path[..., :hops].long()  # [B, N, N, K]
        if self.hop_weight is None:
            # Single hop: only a direct edge (distance 1) contributes.
            direct = (spatial_pos == 1).unsqueeze(-1)
            path = torch.where(direct, path, torch.full_like(path, -1))
        flat = path.reshape(-1, hops)  # [B * N * N, K]
        # Only pairs with a path (a small fraction of a padded batch) are embedded.
        rows = (flat[:, 0] >= 0).nonzero().squeeze(1)  # [P]
        sub = flat[rows]  # [P, K]
        if self.hop_weight is not None:
            per_hop = torch.einsum("eh,khg->keg", edge_emb, self.hop_weight)  # [K, E, H]
            table = per_hop.reshape(hops * num_edges, self.num_heads)
            index = sub + torch.arange(hops, device=sub.device) * num_edges  # row of (hop, edge)
        else:
            table, index = edge_emb, sub
        pad_row = table.size(0)
        table = torch.cat([table, table.new_zeros(1, self.num_heads)])
        index = torch.where(sub >= 0, index, torch.full_like(index, pad_row))
        summed = F.embedding_bag(index, table, mode="sum", padding_idx=pad_row)  # [P, H]
        # Mean over the path's edges: divide by min(dist, K).
        count = spatial_pos.reshape(-1)[rows].long().clamp(min=1, max=hops)
        mean = summed / count.unsqueeze(-1).to(summed.dtype)
        out = mean.new_zeros(flat.size(0), self.num_heads).index_copy(0, rows, mean)
        return out.view(*path.shape[:-1], self.num_heads)  # [B, N, N, H]

    def forward(self, spatial_pos: Tensor, edge_path: Tensor, edge_attr: Tensor) -> Tensor:
        node_bias = self.spatial(self.spatial_index(spatial_pos))  # [B, N, N, H]
        node_bias = node_bias + self.edge_bias(spatial_pos, edge_path, edge_attr)
        node_bias = node_bias.permute(0, 3, 1, 2)  # [B, H, N, N]
        bias = F.pad(node_bias, (1, 0, 1, 0))  # [B, H, N+1, N+1], zero row/col for the token
        n1 = bias.size(-1)
        token = torch.zeros(n1, n1, dtype=bias.dtype, device=bias.device)
        token[0, :] = 1.0
        token[:, 0] = 1.0
        return bias + self.graph_token_distance.view(1, -1, 1, 1).to(bias.dtype) * token
