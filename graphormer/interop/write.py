"""A published Graphormer written as a checkpoint of ours (:mod:`graphormer.checkpoint`), which
``pretrained=``, ``eval.py`` and the prediction tools read."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from graphormer import checkpoint as checkpoints
from graphormer.checkpoint import CheckpointError
from graphormer.data.tasks import TaskInfo
from graphormer.interop.huggingface import huggingface_settings
from graphormer.interop.layouts import HUGGINGFACE
from graphormer.interop.microsoft import from_microsoft
from graphormer.interop.read import Source, read_source
from graphormer.models.graphormer import AUTO_DEPTH, Graphormer, GraphormerConfig, resolve_depth

__all__ = ["convert_checkpoint", "convert_source", "fine_tune_overrides"]


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


def convert_checkpoint(
    source: str | Path,
    output: str | Path,
    *,
    trust_source: bool = False,
    convention: str | None = None,
    settings: Mapping[str, Any] | None = None,
    atom_feature_dims: list[int] | None = None,
    bond_feature_dims: list[int] | None = None,
    num_tasks: int | None = None,
    task: Mapping[str, Any] | None = None,
) -> tuple[Path, GraphormerConfig]:
    """Converts Microsoft's or Hugging Face's Graphormer weights into a checkpoint of ours, which
    ``pretrained=``, ``eval.py`` and the prediction tools read.

    Args:
        source (str | Path): a Microsoft fairseq checkpoint (``.pt``), a Hugging Face model folder
            (``config.json`` + ``model.safetensors`` or ``pytorch_model.bin``), or a bare state dict
            in either layout.
        output (str | Path): the checkpoint to write.
        trust_source (bool, optional): unpickle the whole source file (it can run code).
        convention (str | None, optional): ``microsoft`` or ``huggingface``: the data pipeline
            the weights were trained with; None for the source's own.
        settings (Mapping[str, Any] | None, optional): architecture settings the tensors cannot
            show, in the source's names (``multi_hop_max_dist``, ``spatial_pos_max``, ``dropout``,
            ``attention_dropout``, ``act_dropout``...); None values are ignored.
        atom_feature_dims, bond_feature_dims (list[int] | None, optional): vocabularies; None for
            OGB's molecule featurisation.
        num_tasks (int | None, optional): outputs of a new head when the source has none.
        task (Mapping[str, Any] | None, optional): ``name``, ``task_type``, ``metric`` of the
            model's task (defaults: the source's dataset name, regression for one output and
            binary classification for several, ``mae`` for a source trained with an L1 loss
            (Microsoft's PCQM4M runs), else ``rmse`` / ``rocauc``).

    Returns:
        ``(path, config)``: the written checkpoint and the converted model's settings.
    """
    read = read_source(source, trust_source=trust_source)
    overrides = {k: v for k, v in (settings or {}).items() if v is not None}
    config, state = convert_source(
        read,
        convention=convention,
        settings=overrides,
        atom_feature_dims=atom_feature_dims,
        bond_feature_dims=bond_feature_dims,
        num_tasks=num_tasks,
    )
    task_info = _task(read.settings, config.num_tasks, dict(task or {}))
    state_dict = {f"model.{k}": v for k, v in state.items()}
    state_dict["target_mean"] = torch.zeros(config.num_tasks)
    state_dict["target_std"] = torch.ones(config.num_tasks)
    hyper_parameters = {
        "model": config.to_dict(),
        "task": task_info,
        # A converted model has no training data of ours: eval.py needs a dataset given to it.
        "data": None,
        "normalize_targets": False,
    }
    # What GraphormerModule.from_checkpoint will build must accept this: the task, and the
    # network these weights exactly (strict: every name, every shape).
    TaskInfo(**task_info)
    Graphormer(config).load_state_dict(state)
    converted_from = {
        "source": str(read.path.resolve()),
        "layout": read.layout,
        "convention": convention or read.layout,
    }
    path = checkpoints.save(output, state_dict, hyper_parameters, converted_from=converted_from)
    return path, config


def _task(settings: Mapping[str, Any], num_tasks: int, given: dict[str, Any]) -> dict[str, Any]:
    criterion = str(settings.get("criterion") or "")
    task_type = given.get("task_type")
    if task_type is None:
        classify = "binary" in criterion or (num_tasks > 1 and "l1" not in criterion)
        task_type = "binary classification" if classify else "regression"
    if task_type not in ("binary classification", "regression"):
        raise CheckpointError(
            f"task.task_type={task_type!r}: give 'regression' or 'binary classification'"
        )
    # Microsoft's PCQM4M runs train with l1_loss and are scored by MAE, the other regressions RMSE.
    regression_metric = "mae" if "l1" in criterion else "rmse"
    metric = given.get("metric") or (
        "rocauc" if task_type == "binary classification" else regression_metric
    )
    name = given.get("name") or settings.get("dataset_name") or "converted"
    return {"name": str(name), "task_type": task_type, "num_tasks": num_tasks, "metric": metric}


def fine_tune_overrides(
    config: GraphormerConfig, presets: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """The ``train.py`` overrides that rebuild ``config``'s network: ``model=NAME`` for the preset
    with the fewest differing settings, then ``model.KEY=VALUE`` for each of those.

    Args:
        config (GraphormerConfig): the converted model's settings.
        presets (Mapping[str, Mapping[str, Any]]): the model presets by name (the composed
            ``configs/model/*.yaml``: :class:`GraphormerConfig` fields).

    ``num_tasks`` is left out: a fine-tuning run takes it from its dataset.
    """
    target = config.to_dict()
    keys = [f.name for f in fields(GraphormerConfig) if f.name != "num_tasks"]

    def differing(preset: Mapping[str, Any]) -> list[str]:
        # num_layers: auto follows the data of the fine-tuning run: always give the number.
        depth = preset.get("num_layers", AUTO_DEPTH)
        values = {**preset, "num_layers": resolve_depth(depth, analogues=False)}
        built = GraphormerConfig.from_dict({**values, "num_tasks": config.num_tasks}).to_dict()
        return [k for k in keys if built[k] != target[k] or (k == "num_layers" and depth == "auto")]

    if not presets:
        return [f"model.{k}={_override_value(target[k])}" for k in keys]
    name, different = min(
        ((name, differing(values)) for name, values in sorted(presets.items())),
        key=lambda found: len(found[1]),
    )
    return [f"model={name}", *(f"model.{k}={_override_value(target[k])}" for k in different)]


def _override_value(value: Any) -> str:
    """``value`` in Hydra's override grammar."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_override_value(v) for v in value) + "]"
    return str(value)
