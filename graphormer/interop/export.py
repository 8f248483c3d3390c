"""Our network in Microsoft's Graphormer layout (fairseq ``GraphormerModel``), tensors only: the
inverse of :func:`graphormer.interop.microsoft.from_microsoft`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from graphormer.interop.layouts import (
    CONVENTIONS,
    ENCODER,
    LAYER_NAMES,
    MICROSOFT,
    ConversionError,
    IndexConvention,
    feature_rows,
)
from graphormer.models.graphormer import GraphormerConfig

__all__ = ["to_microsoft"]


def to_microsoft(
    config: GraphormerConfig, state_dict: Mapping[str, Tensor]
) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """Our model in Microsoft's layout: ``(settings, state_dict)``, the settings in Microsoft's
    argument names. :func:`from_microsoft` of the result gives back ``config`` and ``state_dict``
    exactly when ``config`` has the settings :func:`from_microsoft` produces (512-row feature
    tables, ``max_degree`` and ``max_distance`` as Microsoft's tables imply); other settings that
    Microsoft's model can express come back as an equivalent model.

    Raises:
        ConversionError: for settings Microsoft's model cannot express (a final LayerNorm, one
            output bias per task, distances kept apart beyond 509, a readout other than the
            graph token, molecule features, atom or bond heads).
    """
    rules = CONVENTIONS[MICROSOFT]
    c = config
    problems = []
    if c.final_layernorm:
        problems.append("final_layernorm=true (Microsoft's encoder never applies one)")
    if c.readout != "token":
        problems.append(f"readout={c.readout} (Microsoft's head reads the graph token alone)")
    if c.molecule_features_dim:
        problems.append("molecule features (Microsoft's model reads the graph alone)")
    if c.atom_tasks or c.bond_tasks or c.atom_vector_tasks:
        problems.append("atom or bond targets (Microsoft's model predicts molecules alone)")
    if c.channels != "2d":
        problems.append(f"model.channels={c.channels} (Microsoft's Graphormer reads no positions)")
    if problems and not c.num_tasks:  # no molecule head to read below
        raise ConversionError(
            "this model cannot be written in Microsoft's layout: " + "; ".join(problems)
        )
    state = {k: v.detach().cpu() for k, v in state_dict.items()}
    head_bias = state.get("head_bias")
    if head_bias is None:
        bias = state["head.bias"]
        if not torch.equal(bias, bias[:1].expand_as(bias)):
            problems.append("head_bias=per_task with different biases (Microsoft's is one scalar)")
        head_bias = bias[:1].clone()
    far = rules.unreachable_distance - 1
    if c.max_distance > far or (c.max_distance == far and not c.unreachable_as_far):
        problems.append(
            f"max_distance={c.max_distance} with unreachable_as_far={c.unreachable_as_far} "
            f"(Microsoft keeps distances 0..{far} apart and one row for the rest)"
        )
    limit = c.attention_max_distance
    if limit is not None and limit >= rules.unreachable_distance:
        problems.append(
            f"attention_max_distance={limit} (at most {rules.unreachable_distance - 1})"
        )
    if problems:
        raise ConversionError(
            "this model cannot be written in Microsoft's layout: " + "; ".join(problems)
        )

    p = ENCODER
    out: dict[str, Tensor] = {}
    ours_rows, their_rows, _ = feature_rows(
        c.atom_feature_dims, c.feature_stride, rules, rules.atom_shift
    )
    out[p + "graph_node_feature.atom_encoder.weight"] = _scatter_rows(
        state["node_encoder.atom.embedding.weight"], ours_rows, their_rows
    )
    for ours, theirs in (("in_degree", "in_degree_encoder"), ("out_degree", "out_degree_encoder")):
        table = state[f"node_encoder.{ours}.weight"]
        out[p + f"graph_node_feature.{theirs}.weight"] = torch.cat(
            [table.new_zeros(rules.degree_shift, table.size(1)), table]
        )
    out[p + "graph_node_feature.graph_token.weight"] = state["graph_token"].reshape(1, -1)

    edge_shift = (
        rules.multi_hop_edge_shift
        if c.edge_encoding == "multi_hop"
        else rules.single_hop_edge_shift
    )
    ours_rows, their_rows, _ = feature_rows(
        c.bond_feature_dims, c.feature_stride, rules, edge_shift
    )
    out[p + "graph_attn_bias.edge_encoder.weight"] = _scatter_rows(
        state["attn_bias.edge.embedding.weight"], ours_rows, their_rows
    )
    if c.edge_encoding == "multi_hop":
        out[p + "graph_attn_bias.edge_dis_encoder.weight"] = state["attn_bias.hop_weight"].reshape(
            -1, 1
        )
    out[p + "graph_attn_bias.spatial_pos_encoder.weight"] = _microsoft_spatial(
        state["attn_bias.spatial.weight"], c, rules
    )
    out[p + "graph_attn_bias.graph_token_virtual_distance.weight"] = state[
        "attn_bias.graph_token_distance"
    ].reshape(1, -1)
    if c.uses_embedding_layernorm:
        for part in ("weight", "bias"):
            out[p + f"emb_layer_norm.{part}"] = state[f"input_norm.{part}"]
    if c.pre_layernorm:
        # Microsoft's pre-LN encoder defines a final LayerNorm it never applies.
        out[p + "final_layer_norm.weight"] = torch.ones(c.hidden_dim)
        out[p + "final_layer_norm.bias"] = torch.zeros(c.hidden_dim)
    ours_to_theirs = {v: k for k, v in LAYER_NAMES.items()}
    for key, value in state.items():
        match = re.match(r"^layers\.(\d+)\.(.+)\.(weight|bias)$", key)
        if match:
            index, name, part = match.groups()
            out[p + f"layers.{index}.{ours_to_theirs[name]}.{part}"] = value
    out["encoder.masked_lm_pooler.weight"] = torch.zeros(c.hidden_dim, c.hidden_dim)  # unused
    out["encoder.masked_lm_pooler.bias"] = torch.zeros(c.hidden_dim)
    out["encoder.lm_head_transform_weight.weight"] = state["head_transform.weight"]
    out["encoder.lm_head_transform_weight.bias"] = state["head_transform.bias"]
    out["encoder.layer_norm.weight"] = state["head_norm.weight"]
    out["encoder.layer_norm.bias"] = state["head_norm.bias"]
    out["encoder.embed_out.weight"] = state["head.weight"]
    out["encoder.lm_output_learned_bias"] = head_bias.reshape(1)

    atoms = out[p + "graph_node_feature.atom_encoder.weight"]
    edges = out[p + "graph_attn_bias.edge_encoder.weight"]
    settings = {
        "arch": "graphormer_base",
        "encoder_layers": c.num_layers,
        "encoder_embed_dim": c.hidden_dim,
        "encoder_ffn_embed_dim": c.ffn_dim,
        "encoder_attention_heads": c.num_heads,
        "dropout": c.dropout,
        "attention_dropout": c.attention_dropout,
        "act_dropout": c.activation_dropout,
        "pre_layernorm": c.pre_layernorm,
        "encoder_normalize_before": c.uses_embedding_layernorm,
        "activation_fn": "gelu",
        "num_atoms": atoms.size(0) - 1,
        "num_edges": edges.size(0) - 1,
        "num_in_degree": c.max_degree + 1 + rules.degree_shift,
        "num_out_degree": c.max_degree + 1 + rules.degree_shift,
        "num_spatial": out[p + "graph_attn_bias.spatial_pos_encoder.weight"].size(0),
        "num_edge_dis": c.multi_hop_max_dist,
        "multi_hop_max_dist": c.multi_hop_max_dist,
        "edge_type": c.edge_encoding,
        # Microsoft masks pairs whose distance is >= spatial_pos_max; 1024 masks none.
        "spatial_pos_max": 1024 if limit is None else limit + 1,
        "num_classes": c.num_tasks,
    }
    return settings, {k: v.clone().contiguous() for k, v in out.items()}


def _scatter_rows(table: Tensor, ours_rows: np.ndarray, their_rows: np.ndarray) -> Tensor:
    # Row 0 is padding (zero); the rows no value reaches stay zero.
    out = table.new_zeros(int(their_rows.max()) + 1, table.size(1))
    out[torch.from_numpy(their_rows)] = table[torch.from_numpy(ours_rows)]
    return out


def _microsoft_spatial(table: Tensor, c: GraphormerConfig, rules: IndexConvention) -> Tensor:
    """Microsoft's 512-row spatial table: row ``d + 1`` for distance ``d`` (0..509), row 511 for
    unreachable pairs and pairs 510 or more apart."""
    far_row = c.max_distance + 1
    unreachable_row = far_row if c.unreachable_as_far else far_row + 1
    distances = torch.arange(rules.unreachable_distance)  # 0..509
    rows = distances.clamp(max=far_row)
    body = table[rows]
    pad = table.new_zeros(rules.distance_shift, table.size(1))
    return torch.cat([pad, body, table[unreachable_row : unreachable_row + 1]])
