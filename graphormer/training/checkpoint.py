"""Reading and writing checkpoints: data, never code, with a digest of the weights and errors
that say what is wrong and what to do."""

from __future__ import annotations

import hashlib
import pickle
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch

from graphormer.errors import UserFacingError

__all__ = [
    "CheckpointError",
    "load_checkpoint_file",
    "load_module",
    "save_checkpoint_file",
    "unpickling_reason",
    "weights_digest",
]

_REQUIRED_HPARAMS = ("model", "task", "data")
# Where graphormer keeps its own metadata in a checkpoint (version, precision, weights digest).
META_KEY = "graphormer"
DIGEST_KEY = "weights_sha256"


class CheckpointError(UserFacingError, ValueError):
    """A checkpoint is missing, unreadable, or not one that graphormer's train.py wrote."""


def weights_digest(state_dict: dict[str, torch.Tensor]) -> str:
    """SHA-256 over every tensor's name, dtype, shape and bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(state_dict):
        tensor = state_dict[name]
        if not isinstance(tensor, torch.Tensor):
            continue
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def save_checkpoint_file(path: str | Path, checkpoint: dict[str, Any]) -> Path:
    """Writes a checkpoint dict (``state_dict`` plus plain values) with a digest of its weights,
    which :func:`load_checkpoint_file` verifies."""
    meta = dict(checkpoint.get(META_KEY) or {})
    meta[DIGEST_KEY] = weights_digest(checkpoint["state_dict"])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({**checkpoint, META_KEY: meta}, path)
    return path


def load_checkpoint_file(path: str | Path) -> dict[str, Any]:
    """Reads a Lightning checkpoint written by graphormer (tensors and plain values only)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(
            f"checkpoint {path} does not exist; pass ckpt= the path train.py printed "
            "(outputs/.../checkpoints/best-*.ckpt or last.ckpt)"
        )
    try:
        # weights_only: our checkpoints hold tensors and plain containers, nothing to execute.
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise CheckpointError(
            f"checkpoint {path} cannot be read as data ({unpickling_reason(error)}); graphormer "
            "never runs code from a checkpoint. Use a checkpoint written by graphormer's "
            "train.py or convert.py."
        ) from error
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise CheckpointError(
            f"checkpoint {path} cannot be read ({type(error).__name__}: {first}); it is "
            "truncated, corrupt or not a PyTorch checkpoint. Use another checkpoint of the run "
            "(e.g. last.ckpt)."
        ) from error
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise CheckpointError(f"{path} is not a Lightning checkpoint (no state_dict)")
    hparams = checkpoint.get("hyper_parameters") or {}
    missing = [k for k in _REQUIRED_HPARAMS if k not in hparams]
    if missing:
        raise CheckpointError(
            f"{path} was not written by graphormer's train.py: its hyper_parameters lack {missing}"
        )
    _verify_digest(path, checkpoint)
    return checkpoint


def unpickling_reason(error: Exception) -> str:
    """Why a ``weights_only`` load refused a file, without torch's advice to unpickle it fully."""
    text = str(error)
    found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
    if found:
        return f"it holds an object of class {found.group(1)}, not only tensors and plain values"
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    if "weights_only" in first.lower() or "weights only" in first.lower():
        return "it holds objects other than tensors and plain values"
    return first


def _verify_digest(path: Path, checkpoint: dict[str, Any]) -> None:
    meta = checkpoint.get(META_KEY)
    stored = meta.get(DIGEST_KEY) if isinstance(meta, dict) else None
    if stored is None:
        warnings.warn(
            f"checkpoint {path} carries no digest of its weights (written by graphormer < 0.2 or "
            "by another tool), so damage to it cannot be detected",
            stacklevel=3,
        )
        return
    state = checkpoint["state_dict"]
    if not isinstance(state, dict) or weights_digest(state) != stored:
        raise CheckpointError(
            f"the weights in checkpoint {path} do not match the digest stored when it was saved: "
            "the file was altered or damaged after training. Use another checkpoint of the run "
            "(e.g. last.ckpt) or copy it again from its source."
        )


def load_module(path: str | Path):
    """The :class:`GraphormerModule` of a checkpoint, on the CPU, in eval mode."""
    from graphormer.training.module import GraphormerModule

    checkpoint = load_checkpoint_file(path)
    try:
        module = GraphormerModule(**checkpoint["hyper_parameters"])
        module.load_state_dict(checkpoint["state_dict"])
    except (RuntimeError, ValueError, TypeError) as error:
        raise CheckpointError(
            f"checkpoint {path} does not match the model its own settings describe "
            f"({str(error).splitlines()[0]}); it was edited or written by an incompatible version"
        ) from error
    module.eval()
    return module, checkpoint
