"""Reading a published Graphormer as data: a Microsoft fairseq checkpoint, a Hugging Face model
folder or a bare state dict in either layout.

Files are read by :mod:`graphormer.safe_io`'s policy (tensors, fairseq's ``args`` namespace and
numpy scalars only); ``trust_source`` is the one way to unpickle more, and the user's choice.
"""

from __future__ import annotations

import argparse
import json
import pickle
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor

from graphormer import safe_io
from graphormer.interop.huggingface import huggingface_to_microsoft_names
from graphormer.interop.layouts import HUGGINGFACE, MICROSOFT, ConversionError

__all__ = ["Source", "read_source"]

# What a fairseq checkpoint may hold besides tensors: its ``args`` namespace and numpy scalars
# (training statistics). Each only rebuilds data; nothing else is unpickled without trust_source.
_GROUPS = (safe_io.NUMPY_SCALARS, safe_io.ARGPARSE_NAMESPACE)


@dataclass
class Source:
    """A checkpoint read from disk: its tensors, its layout and its own architecture settings."""

    path: Path
    layout: str
    state_dict: dict[str, Tensor]
    settings: dict[str, Any] = field(default_factory=dict)


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
            return safe_io.load_trusted(path)
        except ImportError as error:
            raise ConversionError(
                f"source={path} holds objects of a package that is not installed ({error}); "
                "install it to unpickle the file"
            ) from error
        except (pickle.UnpicklingError, RuntimeError, EOFError, zipfile.BadZipFile) as error:
            raise _unreadable(path, error) from error
    try:
        return safe_io.load_data(path, groups=_GROUPS)
    except pickle.UnpicklingError as error:
        needed = safe_io.unsafe_globals(path, _GROUPS)
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
    return ConversionError(
        f"source={path} cannot be read as a PyTorch checkpoint ({type(error).__name__}: "
        f"{safe_io.unpickling_reason(error)}); it is truncated, corrupt or another kind of file"
    )


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
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ConversionError(f"{config_file} is not valid JSON ({error})") from error
    if not isinstance(config, dict):
        raise ConversionError(
            f"{config_file} holds a JSON {type(config).__name__}, not a model's settings "
            "(an object): download the model folder again"
        )
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
        try:
            state = load_file(str(safetensors_file))
        except Exception as error:  # safetensors' own error type: a truncated or foreign file
            reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise ConversionError(
                f"source={path}: {safetensors_file.name} cannot be read as safetensors "
                f"({type(error).__name__}: {reason}); it is truncated, corrupt or another kind "
                "of file: download the model folder again"
            ) from error
    elif bin_file.is_file():
        state = _torch_load(bin_file, trust_source)
    else:
        raise ConversionError(
            f"source={path} has config.json but neither model.safetensors nor pytorch_model.bin "
            "(sharded checkpoints are not supported)"
        )
    return Source(path, HUGGINGFACE, huggingface_to_microsoft_names(state), dict(config))
