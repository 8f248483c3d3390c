"""Graphormer's input encodings: node + centrality embeddings, and the structural attention bias."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from graphormer.models.dropout import uses_fast_path
from graphormer.models.init import bert_init_

__all__ = [
    "CategoricalEmbedding",
    "ContinuousProjection",
    "GraphAttentionBias",
    "NodeEncoder",
    "touch",
]


def touch(value: Tensor, *modules: nn.Module) -> Tensor:
    """``value`` plus zero times every parameter of ``modules``: a pass that skips them (a
    channel left out of a training step) still gives them a zero gradient, so that distributed
    training without ``find_unused_parameters`` does not stall waiting for theirs."""
    zero = sum(p.sum() for m in modules for p in m.parameters()) * 0
    return value + zero.to(value.dtype)


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


class ContinuousProjection(nn.Module):
    """A learned linear projection of a float feature vector, standardised first with the
    training split's statistics (buffers :attr:`mean` and :attr:`std`, saved with the weights, so
    that evaluation and prediction standardise exactly as training did; issue #17).

    Args:
        in_dim (int): width of the float vector.
        out_dim (int): output width.

    Shapes:
        - input ``[..., in_dim]`` float -> output ``[..., out_dim]``
    """

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        if in_dim < 1:
            raise ValueError(f"in_dim must be >= 1, got {in_dim}")
        self.register_buffer("mean", torch.zeros(in_dim))
        self.register_buffer("std", torch.ones(in_dim))
        self.linear = nn.Linear(in_dim, out_dim)

    def reset_parameters(self) -> None:
        bert_init_(self.linear)

    def set_statistics(self, mean: Tensor, std: Tensor) -> None:
        """Standardise with ``mean`` and ``std`` ``[in_dim]`` (a zero spread counts as 1)."""
        self.mean.copy_(mean.to(self.mean))
        self.std.copy_(torch.where(std > 1e-12, std, torch.ones_like(std)).to(self.std))

    def forward(self, values: Tensor) -> Tensor:
        weight = self.linear.weight
        standard = (values.to(weight.dtype) - self.mean.to(weight.dtype)) / self.std.to(
            weight.dtype
        )
        return self.linear(standard)


def _feature_inputs(
    feature_dims: Sequence[int],
    continuous_dim: int,
    out_dim: int,
    stride: int | None,
    reduce: str,
) -> tuple[CategoricalEmbedding | None, ContinuousProjection | None, nn.Parameter | None]:
    """The embeddings of one kind of input (nodes' or edges'): a categorical table when there are
    categorical features, a continuous projection when there are float ones, and a learned
    constant (left uninitialised for ``reset_parameters``) only when there are neither, so that
    featureless graphs still have an input."""
    categorical = (
        CategoricalEmbedding(feature_dims, out_dim, stride=stride, reduce=reduce)
        if len(feature_dims)
        else None
    )
    continuous = ContinuousProjection(continuous_dim, out_dim) if continuous_dim else None
    constant = None
    if categorical is None and continuous is None:
        constant = nn.Parameter(torch.empty(out_dim))
    return categorical, continuous, constant


def _input_width(name: str, values: Tensor | None, expected: int) -> None:
    width = 0 if values is None else values.size(-1)
    if width != expected:
        raise ValueError(
            f"the batch carries {width} continuous {name} feature column(s) but the model "
            f"reads {expected}"
        )


class NodeEncoder(nn.Module):
    """Node-feature embedding plus the centrality encoding (Ying et al., 2021, Eq. 5).

    Node inputs may be categorical (one embedding table), continuous (a
    :class:`ContinuousProjection`), both (summed) or absent (every node starts from one learned
    embedding, told apart by its centrality and the attention bias).

    Args:
        atom_feature_dims (Sequence[int]): vocabulary size of each categorical node feature
            (empty: none).
        hidden_dim (int): model width ``d``.
        max_degree (int): in/out-degrees above it share the last embedding.
        feature_stride (int | None, optional): see :class:`CategoricalEmbedding`.
        continuous_dim (int, optional): width of the continuous node features (0: none).
            (default: :obj:`0`)

    Shapes:
        - x ``[B, N, F]``, in_degree/out_degree ``[B, N]``, node_mask ``[B, N]``,
          x_continuous ``[B, N, F_c]`` -> ``[B, N, d]``
    """

    def __init__(
        self,
        atom_feature_dims: Sequence[int],
        hidden_dim: int,
        max_degree: int,
        feature_stride: int | None = None,
        continuous_dim: int = 0,
    ) -> None:
        super().__init__()
        self.max_degree = max_degree
        self.continuous_dim = continuous_dim
        self.atom, self.continuous, constant = _feature_inputs(
            atom_feature_dims, continuous_dim, hidden_dim, feature_stride, "sum"
        )
        self.register_parameter("node_embedding", constant)
        self.in_degree = nn.Embedding(max_degree + 1, hidden_dim)
        self.out_degree = nn.Embedding(max_degree + 1, hidden_dim)

    def reset_parameters(self) -> None:
        for part in (self.atom, self.continuous):
            if part is not None:
                part.reset_parameters()
        if self.node_embedding is not None:
            nn.init.normal_(self.node_embedding, std=0.02)
        for emb in (self.in_degree, self.out_degree):
            nn.init.normal_(emb.weight, std=0.02)

    def forward(
        self,
        x: Tensor,
        in_degree: Tensor,
        out_degree: Tensor,
        node_mask: Tensor,
        x_continuous: Tensor | None = None,
        structure: bool = True,
    ) -> Tensor:
        """``structure=False`` leaves out the degrees (a pass without the 2D channel)."""
        _input_width("node", x_continuous, self.continuous_dim)
        h = self.in_degree(in_degree.clamp(max=self.max_degree))
        if not structure:
            h = touch(torch.zeros_like(h), self.in_degree, self.out_degree)
        if self.atom is not None:
            h = self.atom(x) + h
        if self.continuous is not None:
            h = h + self.continuous(x_continuous).to(h.dtype)
        if self.node_embedding is not None:
            h = h + self.node_embedding.to(h.dtype)
        if structure:
            h = h + self.out_degree(out_degree.clamp(max=self.max_degree))
        # Zero the padding so that padded positions carry no information at all.
        return h * node_mask.unsqueeze(-1).to(h.dtype)


def path_sum(index: Tensor, table: Tensor, pad_row: int) -> Tensor:
    """``[P, H]``: for each row of ``index`` ``[P, K]``, the sum of ``table``'s rows it names
    (``pad_row``: none), as ``F.embedding_bag(mode="sum", padding_idx=pad_row)``.

    On the CPU the table's gradient is accumulated with one ``index_add_`` in the order of the
    index: the same sums as ``embedding_bag``'s own backward, added in another order, at a fifth
    of its time (that one sorts every index of the batch first: hundreds of thousands for a
    batch of drug-sized molecules). Other devices keep PyTorch's backward.
    """
    if not uses_fast_path(table):
        return F.embedding_bag(index, table, mode="sum", padding_idx=pad_row)
    return _PathSum.apply(index, table, pad_row)


class _PathSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, index: Tensor, table: Tensor, pad_row: int) -> Tensor:
        ctx.save_for_backward(index)
        ctx.rows, ctx.pad_row = table.size(0), pad_row
        return F.embedding_bag(index, table, mode="sum", padding_idx=pad_row)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        (index,) = ctx.saved_tensors
        hops = index.size(1)
        rows = grad.unsqueeze(1).expand(-1, hops, -1).reshape(-1, grad.size(1))  # [P * K, H]
        grad_table = grad.new_zeros(ctx.rows, grad.size(1)).index_add_(0, index.reshape(-1), rows)
        grad_table[ctx.pad_row] = 0
        return None, grad_table, None


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
        continuous_dim (int, optional): width of the continuous edge features, projected to
            ``H`` and added to the categorical embedding (0: none). With neither, every edge
            gets one learned ``[H]`` vector, so that paths still carry their length and hop
            transforms. (default: :obj:`0`)

    Shapes:
        - spatial_pos ``[B, N, N]``, edge_path ``[B, N, N, >=K]``, edge_attr ``[E, F_e]``,
          edge_attr_continuous ``[E, F_ec]``
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
        continuous_dim: int = 0,
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
        self.continuous_dim = continuous_dim
        self.edge, self.edge_continuous, constant = _feature_inputs(
            bond_feature_dims, continuous_dim, num_heads, feature_stride, "mean"
        )
        self.register_parameter("edge_embedding", constant)
        if edge_encoding == "multi_hop":
            self.hop_weight = nn.Parameter(torch.empty(multi_hop_max_dist, num_heads, num_heads))
        else:
            self.register_parameter("hop_weight", None)
        self.graph_token_distance = nn.Parameter(torch.empty(num_heads))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.spatial.weight, std=0.02)
        for part in (self.edge, self.edge_continuous):
            if part is not None:
                part.reset_parameters()
        if self.edge_embedding is not None:
            nn.init.normal_(self.edge_embedding, std=0.02)
        if self.hop_weight is not None:
            nn.init.normal_(self.hop_weight, std=0.02)
        nn.init.normal_(self.graph_token_distance, std=0.02)

    def spatial_index(self, spatial_pos: Tensor) -> Tensor:
        far = self.max_distance + 1
        unreachable = far if self.unreachable_as_far else far + 1
        spatial_pos = spatial_pos.long()
        index = spatial_pos.clamp(max=far)
        return torch.where(spatial_pos < 0, torch.full_like(index, unreachable), index)

    def edge_embeddings(self, edge_attr: Tensor, edge_attr_continuous: Tensor | None) -> Tensor:
        """``[E, H]``: each edge's categorical embedding (mean over its columns), plus the
        projection of its continuous features, or the one learned edge vector."""
        _input_width("edge", edge_attr_continuous, self.continuous_dim)
        if self.edge_embedding is not None:
            return self.edge_embedding.expand(edge_attr.size(0), -1)
        emb = self.edge(edge_attr) if self.edge is not None else None
        if self.edge_continuous is not None:
            projected = self.edge_continuous(edge_attr_continuous)
            emb = projected if emb is None else emb + projected.to(emb.dtype)
        return emb

    def edge_bias(
        self,
        spatial_pos: Tensor,
        edge_path: Tensor,
        edge_attr: Tensor,
        edge_attr_continuous: Tensor | None = None,
    ) -> Tensor:
        """Edge encoding ``[B, N, N, H]``."""
        hops = self.multi_hop_max_dist
        if edge_path.size(-1) < hops:
            # GraphormerConfig.check_hops refuses such settings before any batch is built.
            raise ValueError(
                f"edge_path has {edge_path.size(-1)} hops but the model's multi_hop_max_dist is "
                f"{hops}: raise the data's max_hops"
            )
        edge_emb = self.edge_embeddings(edge_attr, edge_attr_continuous)  # [E, H]
        num_edges = edge_emb.size(0)
        path = edge_path[..., :hops].long()  # [B, N, N, K]
        if self.hop_weight is None:
            # Single hop: only a direct edge (distance 1) contributes.
            direct = (spatial_pos == 1).unsqueeze(-1)
            path = torch.where(direct, path, torch.full_like(path, -1))
        flat = path.reshape(-1, hops)  # [B * N * N, K]
        if torch.onnx.is_in_onnx_export():
            # ONNX has no embedding_bag with a computed padding row: an exported network
            # embeds every pair's path (the same sums; pairs without a path stay zero).
            return self._gathered_edge_bias(edge_emb, flat, spatial_pos, path.shape[:-1])
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
        summed = path_sum(index, table, pad_row)  # [P, H]
        # Mean over the path's edges: divide by min(dist, K).
        count = spatial_pos.reshape(-1)[rows].long().clamp(min=1, max=hops)
        mean = summed / count.unsqueeze(-1).to(summed.dtype)
        out = mean.new_zeros(flat.size(0), self.num_heads).index_copy(0, rows, mean)
        return out.view(*path.shape[:-1], self.num_heads)  # [B, N, N, H]

    def _gathered_edge_bias(
        self, edge_emb: Tensor, flat: Tensor, spatial_pos: Tensor, shape: torch.Size
    ) -> Tensor:
        """:meth:`edge_bias` of every pair by gathering (no embedding_bag, no data-dependent
        shapes): ``flat`` ``[B * N * N, K]`` path edges, -1 past the path."""
        hops = flat.size(-1)
        if self.hop_weight is not None:
            per_hop = torch.einsum("eh,khg->keg", edge_emb, self.hop_weight)  # [K, E, H]
            table = per_hop.reshape(-1, self.num_heads)
            index = flat + torch.arange(hops, device=flat.device) * edge_emb.size(0)
        else:
            table, index = edge_emb, flat
        table = torch.cat([table, table.new_zeros(1, self.num_heads)])  # last row: no edge
        index = torch.where(flat >= 0, index, torch.full_like(index, table.size(0) - 1))
        summed = table[index].sum(1)  # [B * N * N, H]
        count = spatial_pos.reshape(-1).long().clamp(min=1, max=hops)
        return (summed / count.unsqueeze(-1).to(summed.dtype)).view(*shape, self.num_heads)

    def forward(
        self,
        spatial_pos: Tensor,
        edge_path: Tensor,
        edge_attr: Tensor,
        edge_attr_continuous: Tensor | None = None,
        structure: bool = True,
    ) -> Tensor:
        """``structure=False`` keeps only the graph token's bias (a pass without the 2D
        channel: no spatial or edge encoding)."""
        if structure:
            node_bias = self.spatial(self.spatial_index(spatial_pos))  # [B, N, N, H]
            edge = self.edge_bias(spatial_pos, edge_path, edge_attr, edge_attr_continuous)
            node_bias = (node_bias + edge).permute(0, 3, 1, 2)  # [B, H, N, N]
        else:
            b, n = spatial_pos.shape[:2]
            zeros = self.graph_token_distance.new_zeros(b, self.num_heads, n, n)
            node_bias = touch(zeros, self)  # [B, H, N, N]
        bias = F.pad(node_bias, (1, 0, 1, 0))  # [B, H, N+1, N+1], zero row/col for the token
        n1 = bias.size(-1)
        token = torch.zeros(n1, n1, dtype=bias.dtype, device=bias.device)
        token[0, :] = 1.0
        token[:, 0] = 1.0
        return bias + self.graph_token_distance.view(1, -1, 1, 1).to(bias.dtype) * token
