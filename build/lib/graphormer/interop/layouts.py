"""The Microsoft and Hugging Face Graphormer layouts, and the index conventions of their tables.

Microsoft's Graphormer (fairseq; `github.com/microsoft/Graphormer`) and Hugging Face's port
(``transformers<5``, ``GraphormerForGraphClassification`` / ``GraphormerModel``) share parameter names
(``encoder.graph_encoder.{graph_node_feature,graph_attn_bias,layers.N}.*``, then the head:
``encoder.{lm_head_transform_weight,layer_norm}`` and ``encoder.embed_out`` +
``encoder.lm_output_learned_bias`` (Microsoft) or ``classifier.classifier`` +
``classifier.lm_output_learned_bias`` (Hugging Face)). Their embedding tables are indexed by ids
their data pipelines shift, which a conversion must undo row by row:

============================  =========================  =====================================
table                         Microsoft                  Hugging Face
============================  =========================  =====================================
atoms (``atom_encoder``)      ``v + 512 * column + 2``   ``v + 512 * column + 3``
edges, multi-hop paths        ``v + 512 * column + 3``   same
edges, single hop             ``v + 512 * column + 2``   same
in/out degree                 ``degree + 1``             same
spatial (``spatial_pos``)     ``distance + 1``; unreachable pairs are distance 510 (row 511)
============================  =========================  =====================================

Row 0 of every table is padding. ``edge_dis_encoder.weight`` (``[num_edge_dis * H * H, 1]``) is one
``[H, H]`` matrix per hop (``edge @ W[k]``); ``lm_output_learned_bias`` is one scalar for all outputs.

Everything else of the architecture is read from the tensors' shapes; a source's own settings
(fairseq ``args``/``cfg``, Hugging Face ``config.json``) are checked against them. What the shapes
cannot say: ``multi_hop_max_dist`` (default 5), ``spatial_pos_max`` (default 1024: no masking) and the
dropouts (default Microsoft's base: 0.0, 0.1, 0.1).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from graphormer.errors import UserFacingError

__all__ = [
    "CONVENTIONS",
    "ENCODER",
    "HUGGINGFACE",
    "MICROSOFT",
    "ConversionError",
    "LAYER_KEY",
    "LAYER_NAMES",
    "IndexConvention",
    "convention_named",
    "feature_rows",
]

MICROSOFT = "microsoft"
HUGGINGFACE = "huggingface"
# Where Microsoft's (and Hugging Face's) encoder keeps its parameters.
ENCODER = "encoder.graph_encoder."


class ConversionError(UserFacingError, ValueError):
    """A source checkpoint cannot be converted; the message names the input and the fix."""


@dataclass(frozen=True)
class IndexConvention:
    """Where a source's data pipeline puts each id in its embedding tables.

    Attributes:
        atom_shift: row of atom value ``v`` in feature column ``c`` is ``v + stride * c + atom_shift``.
        multi_hop_edge_shift, single_hop_edge_shift: the same for bond features, by edge type.
        degree_shift: row of degree ``d`` is ``d + degree_shift``.
        distance_shift: row of hop distance ``d`` is ``d + distance_shift``.
        stride: table rows per feature column.
        unreachable_distance: the distance the source's Floyd-Warshall gives unreachable pairs (and
            every pair at least that far).
        spatial_pos_max_shift: the collator stops pairs attending when ``distance + this`` reaches
            its ``spatial_pos_max`` (Microsoft compares the raw distance, Hugging Face the shifted).
    """

    atom_shift: int
    spatial_pos_max_shift: int
    multi_hop_edge_shift: int = 3
    single_hop_edge_shift: int = 2
    degree_shift: int = 1
    distance_shift: int = 1
    stride: int = 512
    unreachable_distance: int = 510


CONVENTIONS = {
    # Microsoft's wrapper adds 1 + 512 * column, its collator 1 more when padding.
    MICROSOFT: IndexConvention(atom_shift=2, spatial_pos_max_shift=0),
    # Hugging Face's preprocess_item adds 1 + 512 * column, then 1, then 1 again.
    HUGGINGFACE: IndexConvention(atom_shift=3, spatial_pos_max_shift=1),
}

# Per-layer parameter names: Microsoft's -> ours.
LAYER_NAMES = {
    "self_attn.q_proj": "attn.q_proj",
    "self_attn.k_proj": "attn.k_proj",
    "self_attn.v_proj": "attn.v_proj",
    "self_attn.out_proj": "attn.out_proj",
    "self_attn_layer_norm": "attn_norm",
    "fc1": "fc1",
    "fc2": "fc2",
    "final_layer_norm": "ffn_norm",
}
LAYER_KEY = re.compile(r"^encoder\.graph_encoder\.layers\.(\d+)\.(.+)\.(weight|bias)$")


def convention_named(convention: str | IndexConvention) -> IndexConvention:
    """The convention ``convention`` names (``microsoft`` or ``huggingface``), or itself."""
    if isinstance(convention, IndexConvention):
        return convention
    if convention not in CONVENTIONS:
        raise ConversionError(
            f"convention={convention!r} is not one of {sorted(CONVENTIONS)}: say which data "
            "pipeline the weights were trained with"
        )
    return CONVENTIONS[convention]


def feature_rows(
    dims: list[int], stride: int | None, rules: IndexConvention, shift: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For every row of our table: its row in the source's table, and whether a real feature value
    (inside the vocabulary) uses it."""
    sizes = [stride] * len(dims) if stride is not None else dims
    ours_rows, their_rows, needed = [], [], []
    offset = 0
    for column, (size, dim) in enumerate(zip(sizes, dims, strict=True)):
        values = np.arange(size)
        ours_rows.append(offset + values)
        their_rows.append(values + rules.stride * column + shift)
        needed.append(values < dim)
        offset += size
    return np.concatenate(ours_rows), np.concatenate(their_rows), np.concatenate(needed)
