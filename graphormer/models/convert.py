"""Microsoft's and Hugging Face's Graphormer weights in our layout, and ours in Microsoft's.

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

import argparse
import json
import logging
import pickle
import re
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from graphormer.errors import UserFacingError
from graphormer.models.graphormer import Graphormer, GraphormerConfig

__all__ = [
    "CONVENTIONS",
    "ConversionError",
    "IndexConvention",
    "Source",
    "convert_source",
    "from_huggingface",
    "from_microsoft",
    "read_source",
    "to_microsoft",
]

log = logging.getLogger(__name__)

MICROSOFT = "microsoft"
HUGGINGFACE = "huggingface"
_ENCODER = "encoder.graph_encoder."


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

# Hugging Face config.json names -> Microsoft's (fairseq args) names.
_HF_NAMES = {
    "num_hidden_layers": "encoder_layers",
    "embedding_dim": "encoder_embed_dim",
    "ffn_embedding_dim": "encoder_ffn_embed_dim",
    "num_attention_heads": "encoder_attention_heads",
    "activation_dropout": "act_dropout",
}
# What the shapes cannot tell, as Microsoft's task and graphormer_base architecture default them.
_DEFAULTS = {
    "multi_hop_max_dist": 5,
    "spatial_pos_max": 1024,
    "dropout": 0.0,
    "attention_dropout": 0.1,
    "act_dropout": 0.1,
    "activation_fn": "gelu",
}
# Per-layer parameter names: Microsoft's -> ours.
_LAYER_NAMES = {
    "self_attn.q_proj": "attn.q_proj",
    "self_attn.k_proj": "attn.k_proj",
    "self_attn.v_proj": "attn.v_proj",
    "self_attn.out_proj": "attn.out_proj",
    "self_attn_layer_norm": "attn_norm",
    "fc1": "fc1",
    "fc2": "fc2",
    "final_layer_norm": "ffn_norm",
}
_LAYER_KEY = re.compile(r"^encoder\.graph_encoder\.layers\.(\d+)\.(.+)\.(weight|bias)$")


# -- Microsoft layout -> ours -----------------------------------------------------------------


def from_microsoft(
    state_dict: Mapping[str, Tensor],
    settings: Mapping[str, Any] | None = None,
    *,
    convention: str | IndexConvention = MICROSOFT,
    atom_feature_dims: list[int] | None = None,
    bond_feature_dims: list[int] | None = None,
    num_tasks: int | None = None,
    source: str = "the state dict",
) -> tuple[GraphormerConfig, dict[str, Tensor]]:
    """Converts a Microsoft-layout state dict into a :class:`GraphormerConfig` and our state dict.

    Args:
        state_dict (Mapping[str, Tensor]): parameters named as Microsoft's ``GraphormerModel``
            (``encoder.graph_encoder.*``, ``encoder.embed_out.weight``...).
        settings (Mapping[str, Any] | None, optional): the architecture in Microsoft's argument
            names (``encoder_layers``, ``multi_hop_max_dist``, ``spatial_pos_max``, ``dropout``...);
            values the shapes give are checked against them. (default: :obj:`None`)
        convention (str | IndexConvention, optional): the index convention of the data pipeline
            the weights were trained with. (default: :obj:`"microsoft"`)
        atom_feature_dims, bond_feature_dims (list[int] | None, optional): vocabulary per feature
            column; None means OGB's molecule featurisation. (default: :obj:`None`)
        num_tasks (int | None, optional): outputs of a new head when the source has none.
        source (str, optional): how to name the input in errors.

    Returns:
        ``(config, state_dict)``: the converted model's settings and our state dict
        (:class:`Graphormer`'s keys).
    """
    rules = _convention(convention)
    # Microsoft trained with --fp16, so its checkpoints may hold float16 weights: ours are float32.
    state = {
        k: v.detach().cpu().float() if v.is_floating_point() else v.detach().cpu()
        for k, v in state_dict.items()
        if isinstance(v, Tensor)
    }
    arch = _architecture(state, dict(settings or {}), source)
    config = GraphormerConfig(
        num_layers=arch["encoder_layers"],
        hidden_dim=arch["encoder_embed_dim"],
        ffn_dim=arch["encoder_ffn_embed_dim"],
        num_heads=arch["encoder_attention_heads"],
        dropout=float(arch["dropout"]),
        attention_dropout=float(arch["attention_dropout"]),
        activation_dropout=float(arch["act_dropout"]),
        pre_layernorm=arch["pre_layernorm"],
        embedding_layernorm=arch["encoder_normalize_before"],
        final_layernorm=False,  # defined for pre-LN stacks but never applied by the source
        atom_feature_dims=atom_feature_dims,
        bond_feature_dims=bond_feature_dims,
        feature_stride=rules.stride,
        max_degree=arch["num_in_degree"] - 1 - rules.degree_shift,
        # Distances 0..509 keep their own rows; "510 or more" and unreachable share one.
        max_distance=rules.unreachable_distance - 1,
        unreachable_as_far=True,
        edge_encoding=arch["edge_type"],
        multi_hop_max_dist=arch["multi_hop_max_dist"],
        attention_max_distance=_attention_max_distance(arch["spatial_pos_max"], rules),
        head_bias="shared",
        num_tasks=_num_tasks(arch, "encoder.embed_out.weight" in state, num_tasks, source),
    )
    ours = _to_ours(state, config, rules, source)
    return config, ours


def _num_tasks(arch: dict[str, Any], has_head: bool, asked: int | None, source: str) -> int:
    if not has_head:
        return int(asked or arch.get("num_classes") or 1)
    if asked is not None and asked != arch["num_classes"]:
        raise ConversionError(
            f"{source} has an output layer of {arch['num_classes']} outputs, not num_tasks="
            f"{asked}; drop num_tasks (fine-tuning re-initialises the output layer anyway)"
        )
    return int(arch["num_classes"])


def _convention(convention: str | IndexConvention) -> IndexConvention:
    if isinstance(convention, IndexConvention):
        return convention
    if convention not in CONVENTIONS:
        raise ConversionError(
            f"convention={convention!r} is not one of {sorted(CONVENTIONS)}: say which data "
            "pipeline the weights were trained with"
        )
    return CONVENTIONS[convention]


def _architecture(state: dict[str, Tensor], given: dict[str, Any], source: str) -> dict[str, Any]:
    """The source's architecture in Microsoft's names: from the shapes, checked against ``given``."""
    required = [
        _ENCODER + "graph_node_feature.atom_encoder.weight",
        _ENCODER + "graph_node_feature.in_degree_encoder.weight",
        _ENCODER + "graph_node_feature.out_degree_encoder.weight",
        _ENCODER + "graph_attn_bias.spatial_pos_encoder.weight",
        _ENCODER + "graph_attn_bias.edge_encoder.weight",
        _ENCODER + "layers.0.fc1.weight",
    ]
    missing = [k for k in required if k not in state]
    if missing:
        raise ConversionError(
            f"{source} is not a Graphormer state dict in Microsoft's or Hugging Face's layout: it "
            f"has no {missing[0]} (its first keys: {sorted(state)[:3]})"
        )
    atoms = state[_ENCODER + "graph_node_feature.atom_encoder.weight"]
    spatial = state[_ENCODER + "graph_attn_bias.spatial_pos_encoder.weight"]
    edges = state[_ENCODER + "graph_attn_bias.edge_encoder.weight"]
    heads = spatial.size(1)
    layers = {int(m.group(1)) for k in state if (m := _LAYER_KEY.match(k))}
    if not layers or sorted(layers) != list(range(len(layers))):
        raise ConversionError(f"{source} has no complete encoder layers (found {sorted(layers)})")
    shapes: dict[str, Any] = {
        "encoder_layers": len(layers),
        "encoder_embed_dim": atoms.size(1),
        "encoder_ffn_embed_dim": state[_ENCODER + "layers.0.fc1.weight"].size(0),
        "encoder_attention_heads": heads,
        "num_atoms": atoms.size(0) - 1,
        "num_edges": edges.size(0) - 1,
        "num_in_degree": state[_ENCODER + "graph_node_feature.in_degree_encoder.weight"].size(0),
        "num_out_degree": state[_ENCODER + "graph_node_feature.out_degree_encoder.weight"].size(0),
        "num_spatial": spatial.size(0),
        "pre_layernorm": _ENCODER + "final_layer_norm.weight" in state,
        "encoder_normalize_before": _ENCODER + "emb_layer_norm.weight" in state,
    }
    hops = state.get(_ENCODER + "graph_attn_bias.edge_dis_encoder.weight")
    shapes["edge_type"] = "multi_hop" if hops is not None else "single_hop"
    if hops is not None:
        shapes["num_edge_dis"] = hops.numel() // (heads * heads)
    out = state.get("encoder.embed_out.weight")
    if out is not None:
        shapes["num_classes"] = out.size(0)

    conflicts = [
        f"{k}={given[k]!r} (the tensors say {v!r})"
        for k, v in shapes.items()
        if given.get(k) is not None and _normalise(given[k]) != v
    ]
    if conflicts:
        raise ConversionError(
            f"{source}: its settings (the file's own and any overrides) contradict its tensors: "
            f"{'; '.join(conflicts)}. Correct or drop these settings"
        )
    arch = {**_DEFAULTS, **{k: v for k, v in given.items() if v is not None}, **shapes}
    if str(arch["activation_fn"]).lower() != "gelu":
        raise ConversionError(
            f"{source} uses activation_fn={arch['activation_fn']!r}; graphormer's layers use GELU"
        )
    if given.get("embed_scale") is not None:
        raise ConversionError(f"{source} scales its embeddings (embed_scale); graphormer does not")
    if given.get("share_encoder_input_output_embed") or given.get("share_input_output_embed"):
        raise ConversionError(f"{source} shares input and output embeddings; graphormer does not")
    if arch["num_in_degree"] != arch["num_out_degree"]:
        raise ConversionError(
            f"{source} has {arch['num_in_degree']} in-degree but {arch['num_out_degree']} "
            "out-degree rows; graphormer's max_degree sizes both"
        )
    hop_count = int(arch["multi_hop_max_dist"])
    if arch["edge_type"] == "multi_hop" and not 1 <= hop_count <= arch["num_edge_dis"]:
        raise ConversionError(
            f"{source}: multi_hop_max_dist={hop_count} must be between 1 and num_edge_dis="
            f"{arch['num_edge_dis']} (the hop matrices it holds); set multi_hop_max_dist"
        )
    return arch


def _normalise(value: Any) -> Any:
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return value


def _attention_max_distance(spatial_pos_max: int, rules: IndexConvention) -> int | None:
    """Our ``attention_max_distance`` for a source's ``spatial_pos_max`` collator setting: pairs
    with ``distance + shift >= spatial_pos_max`` do not attend, unreachable pairs being at 510."""
    limit = int(spatial_pos_max) - 1 - rules.spatial_pos_max_shift
    if limit < 0:
        raise ConversionError(
            f"spatial_pos_max={spatial_pos_max} stops even a node attending to itself; give the "
            "value the model was trained with (settings.spatial_pos_max)"
        )
    return limit if limit < rules.unreachable_distance else None


def _to_ours(
    state: dict[str, Tensor],
    config: GraphormerConfig,
    rules: IndexConvention,
    source: str,
) -> dict[str, Tensor]:
    p = _ENCODER
    mapped: dict[str, Tensor] = {}
    used: set[str] = set()

    def take(key: str) -> Tensor:
        used.add(key)
        return state[key]

    node, bias = p + "graph_node_feature.", p + "graph_attn_bias."
    mapped["node_encoder.atom.embedding.weight"] = _gather_rows(
        take(node + "atom_encoder.weight"),
        *_feature_rows(config.atom_feature_dims, config.feature_stride, rules, rules.atom_shift),
        name="atom_encoder (num_atoms)",
        source=source,
    )
    edge_shift = (
        rules.multi_hop_edge_shift
        if config.edge_encoding == "multi_hop"
        else rules.single_hop_edge_shift
    )
    edge_table = take(bias + "edge_encoder.weight")
    if edge_table[0].abs().max() > 0:
        # The source adds its padding row to every pair without an edge; ours adds nothing.
        log.warning(
            "%s: row 0 (padding) of edge_encoder is not zero (left at its random initialisation "
            "when apply_graphormer_init is off), so the source model adds it to every pair "
            "without an edge; the converted model adds zero there, and its outputs differ",
            source,
        )
    mapped["attn_bias.edge.embedding.weight"] = _gather_rows(
        edge_table,
        *_feature_rows(config.bond_feature_dims, config.feature_stride, rules, edge_shift),
        name="edge_encoder (num_edges)",
        source=source,
    )
    for ours, theirs in (("in_degree", "in_degree_encoder"), ("out_degree", "out_degree_encoder")):
        table = take(node + f"{theirs}.weight")
        start = rules.degree_shift
        mapped[f"node_encoder.{ours}.weight"] = table[start : start + config.max_degree + 1]
    spatial = take(bias + "spatial_pos_encoder.weight")
    rows = config.max_distance + 2  # distances 0..max_distance, then "far or unreachable"
    if spatial.size(0) < rules.distance_shift + rows:
        raise ConversionError(
            f"{source} has {spatial.size(0)} spatial_pos_encoder rows; its own model indexes row "
            f"{rules.unreachable_distance + rules.distance_shift} for unreachable pairs, so it "
            "cannot be converted as a Microsoft or Hugging Face Graphormer"
        )
    mapped["attn_bias.spatial.weight"] = spatial[rules.distance_shift : rules.distance_shift + rows]
    mapped["attn_bias.graph_token_distance"] = take(
        bias + "graph_token_virtual_distance.weight"
    ).reshape(-1)
    if config.edge_encoding == "multi_hop":
        heads = config.num_heads
        hop_weight = take(bias + "edge_dis_encoder.weight").reshape(-1, heads, heads)
        mapped["attn_bias.hop_weight"] = hop_weight[: config.multi_hop_max_dist]  # [K, H, H]
        if hop_weight.size(0) > config.multi_hop_max_dist:
            log.info(
                "%s: edge_dis_encoder holds %d hop matrices; its model uses the first %d "
                "(multi_hop_max_dist), which are kept",
                source,
                hop_weight.size(0),
                config.multi_hop_max_dist,
            )
    mapped["graph_token"] = take(node + "graph_token.weight").reshape(1, 1, -1)
    if config.uses_embedding_layernorm:
        for part in ("weight", "bias"):
            mapped[f"input_norm.{part}"] = take(p + f"emb_layer_norm.{part}")
    for key in list(state):
        match = _LAYER_KEY.match(key)
        if match and match.group(2) in _LAYER_NAMES:
            index, name, part = match.groups()
            mapped[f"layers.{index}.{_LAYER_NAMES[name]}.{part}"] = take(key)
    head = {
        "encoder.lm_head_transform_weight.weight": "head_transform.weight",
        "encoder.lm_head_transform_weight.bias": "head_transform.bias",
        "encoder.layer_norm.weight": "head_norm.weight",
        "encoder.layer_norm.bias": "head_norm.bias",
        "encoder.embed_out.weight": "head.weight",
        "encoder.lm_output_learned_bias": "head_bias",
    }
    for theirs, ours in head.items():
        if theirs in state:
            mapped[ours] = take(theirs)

    # Present in the source but never used by its forward pass.
    ignored = {"encoder.masked_lm_pooler.weight", "encoder.masked_lm_pooler.bias"}
    if config.pre_layernorm:
        ignored |= {p + "final_layer_norm.weight", p + "final_layer_norm.bias"}
    ignored |= {k for k in state if k.endswith("._float_tensor") or k.endswith(".version")}
    unknown = sorted(set(state) - used - ignored)
    if unknown:
        raise ConversionError(
            f"{source} holds tensors graphormer has no place for: {', '.join(unknown[:6])}"
            + (f" and {len(unknown) - 6} more" if len(unknown) > 6 else "")
            + " (a variant of Graphormer this converter does not know; nothing was written)"
        )
    return _complete(mapped, config, source)


def _feature_rows(
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


def _gather_rows(
    table: Tensor,
    ours_rows: np.ndarray,
    their_rows: np.ndarray,
    needed: np.ndarray,
    *,
    name: str,
    source: str,
) -> Tensor:
    present = their_rows < table.size(0)
    if not present[needed].all():
        row = int(their_rows[needed & ~present][0])
        raise ConversionError(
            f"{source}: its {name} table has {table.size(0)} rows but the feature vocabulary "
            f"needs row {row}; give the feature dimensions the model was trained with "
            "(atom_feature_dims / bond_feature_dims)"
        )
    out = table.new_zeros(len(ours_rows), table.size(1))
    out[torch.from_numpy(ours_rows[present])] = table[torch.from_numpy(their_rows[present])]
    return out


def _complete(
    mapped: dict[str, Tensor], config: GraphormerConfig, source: str
) -> dict[str, Tensor]:
    """Our full state dict: the mapped tensors, and a fresh output layer if the source has none."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Graphormer(config)
    own = model.state_dict()
    wrong = [
        f"{k} {tuple(v.shape)} (expected {tuple(own[k].shape)})"
        for k, v in mapped.items()
        if k in own and own[k].shape != v.shape
    ]
    if wrong:
        raise ConversionError(f"{source}: tensors of unexpected shape: {'; '.join(wrong)}")
    missing = sorted(set(own) - set(mapped))
    if [k for k in missing if not k.startswith("head.") and k != "head_bias"]:
        raise ConversionError(f"{source} lacks tensors graphormer needs: {missing}")
    if missing:
        log.info("%s has no output layer: %s newly initialised", source, ", ".join(missing))
    return {k: (mapped[k] if k in mapped else v).clone().contiguous() for k, v in own.items()}


# -- Hugging Face layout -> ours --------------------------------------------------------------


def from_huggingface(
    state_dict: Mapping[str, Tensor],
    config: Mapping[str, Any],
    *,
    convention: str | IndexConvention = HUGGINGFACE,
    atom_feature_dims: list[int] | None = None,
    bond_feature_dims: list[int] | None = None,
    num_tasks: int | None = None,
    source: str = "the state dict",
) -> tuple[GraphormerConfig, dict[str, Tensor]]:
    """Converts a Hugging Face ``GraphormerForGraphClassification`` (or bare ``GraphormerModel``)
    state dict and its ``config.json`` values. Arguments as :func:`from_microsoft`."""
    return from_microsoft(
        huggingface_to_microsoft_names(state_dict),
        huggingface_settings(config, source),
        convention=convention,
        atom_feature_dims=atom_feature_dims,
        bond_feature_dims=bond_feature_dims,
        num_tasks=num_tasks,
        source=source,
    )


def huggingface_to_microsoft_names(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Hugging Face's parameter names mapped to Microsoft's (their modules are the same)."""
    out = {}
    for key, value in state_dict.items():
        key = key.removeprefix("graphormer.")
        if key.startswith("classifier.classifier."):
            key = "encoder.embed_out." + key.removeprefix("classifier.classifier.")
        elif key == "classifier.lm_output_learned_bias":
            key = "encoder.lm_output_learned_bias"
        elif not key.startswith("encoder."):
            key = "encoder." + key  # a bare GraphormerModel
        out[key] = value
    return out


def huggingface_settings(config: Mapping[str, Any], source: str = "config.json") -> dict[str, Any]:
    """A Hugging Face ``GraphormerConfig``'s values under Microsoft's argument names."""
    settings = {_HF_NAMES.get(k, k): v for k, v in config.items()}
    if config.get("bias") is False or config.get("kdim") or config.get("vdim"):
        raise ConversionError(
            f"{source} sets bias=false or kdim/vdim: graphormer's attention has biased "
            "projections of the model width"
        )
    return settings


# -- ours -> Microsoft layout -----------------------------------------------------------------


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
            output bias per task, distances kept apart beyond 509).
    """
    rules = CONVENTIONS[MICROSOFT]
    c = config
    problems = []
    if c.final_layernorm:
        problems.append("final_layernorm=true (Microsoft's encoder never applies one)")
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

    p = _ENCODER
    out: dict[str, Tensor] = {}
    ours_rows, their_rows, _ = _feature_rows(
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
    ours_rows, their_rows, _ = _feature_rows(
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
    ours_to_theirs = {v: k for k, v in _LAYER_NAMES.items()}
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


# -- reading sources --------------------------------------------------------------------------


@dataclass
class Source:
    """A checkpoint read from disk: its tensors, its layout and its own architecture settings."""

    path: Path
    layout: str
    state_dict: dict[str, Tensor]
    settings: dict[str, Any] = field(default_factory=dict)


# Globals a fairseq checkpoint may hold besides tensors: its ``args`` namespace and numpy scalars
# (training statistics). Each only rebuilds data; nothing else is unpickled without trust_source.
_SAFE_GLOBALS: list[Any] = [argparse.Namespace]


def _numpy_globals() -> list[Any]:
    """numpy's scalar and dtype constructors, under numpy 1's and numpy 2's module names."""
    scalar = getattr(getattr(np, "_core", None), "multiarray", None)
    scalar = scalar.scalar if scalar is not None else np.core.multiarray.scalar
    found: list[Any] = [
        (scalar, "numpy.core.multiarray.scalar"),
        (scalar, "numpy._core.multiarray.scalar"),
        np.dtype,
    ]
    found.extend(type(np.dtype(t)) for t in ("float64", "float32", "int64", "int32", "bool"))
    return found


def _allowed_names() -> set[str]:
    names = set()
    for entry in _SAFE_GLOBALS + _numpy_globals():
        if isinstance(entry, tuple):
            names.add(entry[1])
        else:
            names.add(f"{entry.__module__}.{entry.__qualname__}")
    return names


def read_source(path: str | Path, *, trust_source: bool = False) -> Source:
    """Reads a Microsoft fairseq checkpoint, a Hugging Face folder or a bare state dict.

    Args:
        path (str | Path): a ``.pt``/``.bin``/``.ckpt`` file, or a folder with ``config.json`` and
            ``model.safetensors`` or ``pytorch_model.bin``.
        trust_source (bool, optional): unpickle the file completely (it may run code), for a
            fairseq checkpoint that holds more than tensors, ``argparse.Namespace`` and numpy
            scalars. (default: :obj:`False`)
    """
    path = Path(path).expanduser()
    if path.is_dir():
        return _read_huggingface_folder(path, trust_source)
    if not path.is_file():
        raise ConversionError(
            f"source={path} does not exist: give a Microsoft checkpoint (.pt) or a Hugging Face "
            "model folder (config.json + model.safetensors or pytorch_model.bin)"
        )
    loaded = _torch_load(path, trust_source)
    if not isinstance(loaded, Mapping):
        raise ConversionError(f"source={path} holds a {type(loaded).__name__}, not a state dict")
    settings: dict[str, Any] = {}
    if "model" in loaded and isinstance(loaded["model"], Mapping):  # fairseq
        settings = _fairseq_settings(loaded)
        state = dict(loaded["model"])
    elif "state_dict" in loaded and isinstance(loaded["state_dict"], Mapping):
        state = dict(loaded["state_dict"])
        if any(k.startswith("model.node_encoder.") for k in state):
            raise ConversionError(
                f"source={path} is already a graphormer checkpoint: pass it to train.py as "
                "pretrained= or to eval.py as ckpt= directly"
            )
    else:
        state = dict(loaded)
    state = {k: v for k, v in state.items() if isinstance(v, Tensor)}
    layout = _detect_layout(state)
    if layout == HUGGINGFACE:
        state = huggingface_to_microsoft_names(state)
    return Source(path, layout, state, settings)


def _torch_load(path: Path, trust_source: bool) -> Any:
    if trust_source:
        try:
            return torch.load(path, map_location="cpu", weights_only=False)
        except ImportError as error:
            raise ConversionError(
                f"source={path} holds objects of a package that is not installed ({error}); "
                "install it to unpickle the file"
            ) from error
        except (pickle.UnpicklingError, RuntimeError, EOFError, zipfile.BadZipFile) as error:
            raise _unreadable(path, error) from error
    try:
        with torch.serialization.safe_globals(_SAFE_GLOBALS + _numpy_globals()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        needed = _unsafe_globals(path)
        if not needed:
            raise _unreadable(path, error) from error
        # Name what the file needs, but not torch's advice to turn the safety check off.
        raise ConversionError(
            f"source={path} holds Python objects beyond tensors and settings "
            f"({', '.join(needed)}); loading those can run code from the file. If you trust "
            "where it came from, add trust_source=true"
        ) from error
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError) as error:
        raise _unreadable(path, error) from error


def _unreadable(path: Path, error: Exception) -> ConversionError:
    text = str(error)
    # torch's weights-only message leads with advice to disable the check; keep only its cause.
    detail = text.split("WeightsUnpickler error:")[-1].strip().splitlines()[0] if text else ""
    return ConversionError(
        f"source={path} cannot be read as a PyTorch checkpoint ({type(error).__name__}: "
        f"{detail}); it is truncated, corrupt or another kind of file"
    )


def _unsafe_globals(path: Path) -> list[str]:
    try:
        found = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # an old (non-zip) format or a damaged file: say less, not fail
        return []
    allowed = _allowed_names()
    return [g for g in found if g not in allowed]


def _fairseq_settings(checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    """Architecture settings of a fairseq checkpoint: ``args`` (a Namespace) or ``cfg``'s
    ``model`` and ``task`` sections."""
    settings: dict[str, Any] = {}
    cfg = checkpoint.get("cfg")
    if isinstance(cfg, Mapping):
        for section in ("task", "model"):
            part = cfg.get(section)
            settings.update(_as_dict(part))
    settings.update(_as_dict(checkpoint.get("args")))
    return settings


def _as_dict(value: Any) -> dict[str, Any]:
    if isinstance(value, argparse.Namespace):
        return dict(vars(value))
    if isinstance(value, Mapping):
        return {str(k): v for k, v in value.items()}
    return {}


def _detect_layout(state: Mapping[str, Tensor]) -> str:
    if any(k.startswith(("classifier.", "graph_encoder.", "graphormer.")) for k in state):
        return HUGGINGFACE
    return MICROSOFT


def _read_huggingface_folder(path: Path, trust_source: bool) -> Source:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ConversionError(
            f"source={path} is a folder without config.json: give a Hugging Face model folder "
            "(as save_pretrained writes it) or a checkpoint file"
        )
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as error:
        raise ConversionError(f"{config_file} is not valid JSON ({error})") from error
    architectures = config.get("architectures") or []
    known = {"GraphormerForGraphClassification", "GraphormerModel"}
    if config.get("model_type", "graphormer") != "graphormer" or (
        architectures and not set(architectures) & known
    ):
        raise ConversionError(
            f"{config_file} describes {architectures or config.get('model_type')}, not a "
            "Graphormer (GraphormerForGraphClassification or GraphormerModel)"
        )
    safetensors_file = path / "model.safetensors"
    bin_file = path / "pytorch_model.bin"
    if safetensors_file.is_file():
        try:
            from safetensors.torch import load_file
        except ImportError as error:
            raise ConversionError(
                f"reading {safetensors_file} needs the safetensors package: "
                'pip install safetensors (or pip install -e ".[reference]")'
            ) from error
        state = load_file(str(safetensors_file))
    elif bin_file.is_file():
        state = _torch_load(bin_file, trust_source)
    else:
        raise ConversionError(
            f"source={path} has config.json but neither model.safetensors nor pytorch_model.bin "
            "(sharded checkpoints are not supported)"
        )
    return Source(path, HUGGINGFACE, huggingface_to_microsoft_names(state), dict(config))


def convert_source(
    source: Source,
    *,
    convention: str | None = None,
    settings: Mapping[str, Any] | None = None,
    atom_feature_dims: list[int] | None = None,
    bond_feature_dims: list[int] | None = None,
    num_tasks: int | None = None,
) -> tuple[GraphormerConfig, dict[str, Tensor]]:
    """Converts what :func:`read_source` read. ``settings`` (Microsoft's argument names, or Hugging
    Face's for a Hugging Face source) override the source's own; ``convention`` defaults to the
    source's layout."""
    overrides = dict(settings or {})
    if source.layout == HUGGINGFACE:
        base = huggingface_settings(source.settings, str(source.path))
        overrides = huggingface_settings(overrides, "the overrides")
    else:
        base = dict(source.settings)
    return from_microsoft(
        source.state_dict,
        {**base, **overrides},
        convention=convention or source.layout,
        atom_feature_dims=atom_feature_dims,
        bond_feature_dims=bond_feature_dims,
        num_tasks=num_tasks,
        source=f"source={source.path}",
    )
