"""Hugging Face's Graphormer layout (``transformers<5``, ``GraphormerForGraphClassification`` /
``GraphormerModel``): Microsoft's modules under other prefixes, and ``config.json`` under other
argument names; converted by renaming both to Microsoft's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from graphormer.interop.layouts import HUGGINGFACE, ConversionError, IndexConvention
from graphormer.interop.microsoft import from_microsoft
from graphormer.models.graphormer import GraphormerConfig

__all__ = ["from_huggingface", "huggingface_settings", "huggingface_to_microsoft_names"]

# Hugging Face config.json names -> Microsoft's (fairseq args) names.
_HF_NAMES = {
    "num_hidden_layers": "encoder_layers",
    "embedding_dim": "encoder_embed_dim",
    "ffn_embedding_dim": "encoder_ffn_embed_dim",
    "num_attention_heads": "encoder_attention_heads",
    "activation_dropout": "act_dropout",
}


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
