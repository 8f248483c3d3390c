"""Fine-tuning a new run from a checkpoint of ours (trained, or converted by
:mod:`graphormer.interop`) without ever loading it silently wrong."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graphormer import checkpoint as checkpoints
from graphormer.checkpoint import CheckpointError
from graphormer.models.graphormer import GraphormerConfig
from graphormer.training.module import GraphormerModule

__all__ = ["PretrainedReport", "architecture", "load_pretrained"]

log = logging.getLogger(__name__)

# Settings that change what the same tensors compute, or which tensors exist: a checkpoint trained
# with other values does not fit, even where names and shapes happen to agree (pre- vs post-LN).
_STRUCTURE = (
    "num_layers",
    "hidden_dim",
    "ffn_dim",
    "num_heads",
    "pre_layernorm",
    "uses_embedding_layernorm",
    "final_layernorm",
    "atom_feature_dims",
    "bond_feature_dims",
    "node_continuous_dim",
    "edge_continuous_dim",
    "feature_stride",
    "max_degree",
    "max_distance",
    "unreachable_as_far",
    "edge_encoding",
    "multi_hop_max_dist",
    "attention_max_distance",
)


def architecture(model: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of a checkpoint's ``model`` that make its network what it is (which tensors
    exist, their shapes, what they compute), by config key; regularisation (dropouts), the
    number of tasks and the output layer are the fine-tuning run's own."""
    keys = ["embedding_layernorm" if k == "uses_embedding_layernorm" else k for k in _STRUCTURE]
    return {k: model[k] for k in keys if k in model}


def _is_output_layer(name: str) -> bool:
    # The molecule output layer, the heads of atom and bond targets (issue #18) and the
    # molecule-feature input (issue #22: its features and training statistics are the new
    # dataset's) and the readout's map (issue #22: token_sum's is per task; token_mean's is new
    # whenever the checkpoint read the graph token alone): the new task's own.
    prefixes = (
        "model.head.",
        "model.atom_head.",
        "model.bond_head.",
        "model.molecule_input.",
        "model.readout.",
    )
    return name.startswith(prefixes) or name == "model.head_bias"


def _is_molecule_head(name: str) -> bool:
    return name.startswith(("model.head_transform.", "model.head_norm."))


@dataclass
class PretrainedReport:
    """What :func:`load_pretrained` copied, re-initialised and found not to fit.

    Attributes:
        path: the checkpoint.
        copied: our tensors initialised from it.
        num_parameters: the number of values in ``copied``.
        output_layer: the output layer's tensors, re-initialised for the new task.
        not_in_checkpoint: our tensors the checkpoint lacks (they keep their fresh initialisation).
        not_in_model: the checkpoint's network tensors this model has no place for.
        shape_mismatches: ``"name [checkpoint shape] vs [our shape]"`` for tensors not copied.
        setting_differences: ``"key: checkpoint value vs ours"`` for settings that change what the
            network computes.
        unused_head: the checkpoint's molecule head, left out by a model of atom targets alone
            (issue #18).
    """

    path: str
    copied: list[str] = field(default_factory=list)
    num_parameters: int = 0
    output_layer: list[str] = field(default_factory=list)
    not_in_checkpoint: list[str] = field(default_factory=list)
    not_in_model: list[str] = field(default_factory=list)
    shape_mismatches: list[str] = field(default_factory=list)
    setting_differences: list[str] = field(default_factory=list)
    unused_head: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        """True when every network tensor but the output layer was copied, with equal settings."""
        return not (
            self.not_in_checkpoint
            or self.not_in_model
            or self.shape_mismatches
            or self.setting_differences
        )

    def problems(self) -> str:
        parts = []
        if self.setting_differences:
            parts.append(
                "settings differ (checkpoint vs this model): " + _listing(self.setting_differences)
            )
        if self.shape_mismatches:
            parts.append(
                "shapes differ (checkpoint vs this model): " + _listing(self.shape_mismatches)
            )
        if self.not_in_model:
            parts.append("not in this model: " + _listing(self.not_in_model))
        if self.not_in_checkpoint:
            parts.append("not in the checkpoint: " + _listing(self.not_in_checkpoint))
        return "; ".join(parts)

    def summary(self) -> str:
        text = (
            f"pretrained={self.path}: copied {len(self.copied)} tensors "
            f"({self.num_parameters:,} parameters); re-initialised for the new task: "
            f"{', '.join(self.output_layer)}"
        )
        heads = sorted({name.split(".")[1] for name in self.output_layer})
        if "atom_head" in heads:
            text += " (new atom head: fine-tuning a molecule-level encoder into atom targets)"
        if "bond_head" in heads:
            text += " (new bond head: fine-tuning the encoder into bond targets)"
        if self.unused_head:
            text += (
                f"; left out (the checkpoint's molecule head; this model predicts atom or bond "
                f"targets alone): {_listing(self.unused_head)}"
            )
        if self.not_in_checkpoint:
            text += f"; re-initialised (not in the checkpoint): {_listing(self.not_in_checkpoint)}"
        return text


def _listing(items: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def load_pretrained(module: GraphormerModule, path: str, strict: bool = True) -> PretrainedReport:
    """Initialises ``module``'s network from a checkpoint of ours (trained or converted) to
    fine-tune it.

    Every network tensor is copied except the output layer, which is re-initialised for the new
    task as Microsoft's Graphormer does when fine-tuning; the target standardisation belongs to the
    new task and is not copied either. The checkpoint must fit: the same structural settings and,
    tensor for tensor, the same names and shapes.

    Args:
        module (GraphormerModule): the new run's module.
        path (str): a checkpoint written by ``train.py`` or ``scripts/convert.py``.
        strict (bool, optional): a checkpoint that does not fit is an error (the config key
            ``pretrained_strict``); if False, the tensors that fit are copied and a WARNING lists
            the rest. A checkpoint with no tensor in common is an error either way.
            (default: :obj:`True`)

    Returns:
        A :class:`PretrainedReport`, also logged.

    Raises:
        CheckpointError: the file is missing or unreadable, shares no tensor with the model, or
            (``strict``) does not fit it.
    """
    if not Path(path).is_file():
        raise CheckpointError(
            f"pretrained={path} does not exist; give a checkpoint written by train.py or "
            "scripts/convert.py"
        )
    record = checkpoints.load(path)
    state = record.state_dict
    own = module.state_dict()
    report = PretrainedReport(str(path))
    report.setting_differences = _setting_differences(record.model, module.config, path)
    theirs = {k: v for k, v in state.items() if k.startswith("model.") and not _is_output_layer(k)}
    mine = {k: v for k, v in own.items() if k.startswith("model.")}
    if module.config.num_tasks == 0:  # atom/bond targets alone: no molecule head to copy into
        report.unused_head = sorted(k for k in theirs if _is_molecule_head(k))
        theirs = {k: v for k, v in theirs.items() if not _is_molecule_head(k)}
    report.output_layer = sorted(k for k in mine if _is_output_layer(k))
    matched = {}
    for name, tensor in mine.items():
        if _is_output_layer(name):
            continue
        if name not in theirs:
            report.not_in_checkpoint.append(name)
        elif theirs[name].shape != tensor.shape:
            report.shape_mismatches.append(
                f"{name} {list(theirs[name].shape)} vs {list(tensor.shape)}"
            )
        else:
            matched[name] = theirs[name]
    report.not_in_model = sorted(k for k in theirs if k not in mine)
    report.copied = sorted(matched)
    report.num_parameters = sum(t.numel() for t in matched.values())
    if not matched:
        raise CheckpointError(
            f"pretrained={path} shares no tensor with this model (name and shape): "
            f"{report.problems()}. Use a checkpoint of this architecture"
        )
    if not report.fits:
        if strict:
            raise CheckpointError(
                f"pretrained={path} does not fit this model: {report.problems()}. Set the model "
                "options the checkpoint was trained with (its hyper_parameters.model), or "
                "pretrained_strict=false to copy only the tensors that fit"
            )
        log.warning("%s; copied only the tensors that fit: %s", report.summary(), report.problems())
    module.load_state_dict(matched, strict=False)
    # Debug only: train() reports the summary on the console and in train.log once.
    log.debug(report.summary())
    return report


def _setting_differences(
    stored: Mapping[str, Any], config: GraphormerConfig, path: str
) -> list[str]:
    try:
        theirs = GraphormerConfig.from_dict(
            {
                **stored,
                "num_tasks": config.num_tasks,
                "atom_tasks": config.atom_tasks,
                "bond_tasks": config.bond_tasks,
            }
        )
    except (TypeError, ValueError) as error:
        raise CheckpointError(
            f"pretrained={path} describes a model this version cannot build ({error})"
        ) from error
    differences = []
    for key in _STRUCTURE:
        a, b = getattr(theirs, key), getattr(config, key)
        if a != b:
            name = "embedding_layernorm" if key == "uses_embedding_layernorm" else key
            differences.append(f"model.{name} {a!r} vs {b!r}")
    return differences
