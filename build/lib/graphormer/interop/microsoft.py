"""Microsoft's Graphormer layout (fairseq ``GraphormerModel``) into ours, tensors only.

The index conventions the tables are read with are :mod:`graphormer.interop.layouts`'; a Hugging
Face state dict reaches :func:`from_microsoft` renamed (:mod:`graphormer.interop.huggingface`);
the way back is :mod:`graphormer.interop.export`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from graphormer.interop.layouts import (
    ENCODER,
    LAYER_KEY,
    LAYER_NAMES,
    MICROSOFT,
    ConversionError,
    IndexConvention,
    convention_named,
    feature_rows,
)
from graphormer.models.graphormer import Graphormer, GraphormerConfig

__all__ = ["from_microsoft"]

log = logging.getLogger(__name__)

# What the shapes cannot tell, as Microsoft's task and graphormer_base architecture default them.
_DEFAULTS = {
    "multi_hop_max_dist": 5,
    "spatial_pos_max": 1024,
    "dropout": 0.0,
    "attention_dropout": 0.1,
    "act_dropout": 0.1,
    "activation_fn": "gelu",
}


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
    rules = convention_named(convention)
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


def _architecture(state: dict[str, Tensor], given: dict[str, Any], source: str) -> dict[str, Any]:
    """The source's architecture in Microsoft's names: from the shapes, checked against ``given``."""
    required = [
        ENCODER + "graph_node_feature.atom_encoder.weight",
        ENCODER + "graph_node_feature.in_degree_encoder.weight",
        ENCODER + "graph_node_feature.out_degree_encoder.weight",
        ENCODER + "graph_attn_bias.spatial_pos_encoder.weight",
        ENCODER + "graph_attn_bias.edge_encoder.weight",
        ENCODER + "layers.0.fc1.weight",
    ]
    missing = [k for k in required if k not in state]
    if missing:
        raise ConversionError(
            f"{source} is not a Graphormer state dict in Microsoft's or Hugging Face's layout: it "
            f"has no {missing[0]} (its first keys: {sorted(state)[:3]})"
        )
    atoms = state[ENCODER + "graph_node_feature.atom_encoder.weight"]
    spatial = state[ENCODER + "graph_attn_bias.spatial_pos_encoder.weight"]
    edges = state[ENCODER + "graph_attn_bias.edge_encoder.weight"]
    heads = spatial.size(1)
    layers = {int(m.group(1)) for k in state if (m := LAYER_KEY.match(k))}
    if not layers or sorted(layers) != list(range(len(layers))):
        raise ConversionError(f"{source} has no complete encoder layers (found {sorted(layers)})")
    shapes: dict[str, Any] = {
        "encoder_layers": len(layers),
        "encoder_embed_dim": atoms.size(1),
        "encoder_ffn_embed_dim": state[ENCODER + "layers.0.fc1.weight"].size(0),
        "encoder_attention_heads": heads,
        "num_atoms": atoms.size(0) - 1,
        "num_edges": edges.size(0) - 1,
        "num_in_degree": state[ENCODER + "graph_node_feature.in_degree_encoder.weight"].size(0),
        "num_out_degree": state[ENCODER + "graph_node_feature.out_degree_encoder.weight"].size(0),
        "num_spatial": spatial.size(0),
        "pre_layernorm": ENCODER + "final_layer_norm.weight" in state,
        "encoder_normalize_before": ENCODER + "emb_layer_norm.weight" in state,
    }
    hops = state.get(ENCODER + "graph_attn_bias.edge_dis_encoder.weight")
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
    p = ENCODER
    mapped: dict[str, Tensor] = {}
    used: set[str] = set()

    def take(key: str) -> Tensor:
        used.add(key)
        return state[key]

    node, bias = p + "graph_node_feature.", p + "graph_attn_bias."
    mapped["node_encoder.atom.embedding.weight"] = _gather_rows(
        take(node + "atom_encoder.weight"),
        *feature_rows(config.atom_feature_dims, config.feature_stride, rules, rules.atom_shift),
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
        *feature_rows(config.bond_feature_dims, config.feature_stride, rules, edge_shift),
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
        match = LAYER_KEY.match(key)
        if match and match.group(2) in LAYER_NAMES:
            index, name, part = match.groups()
            mapped[f"layers.{index}.{LAYER_NAMES[name]}.{part}"] = take(key)
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
