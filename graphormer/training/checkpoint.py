"""Reading checkpoints with errors that say what is wrong and what to do."""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from graphormer.errors import UserFacingError

__all__ = ["CheckpointError", "load_checkpoint_file", "load_module"]

_REQUIRED_HPARAMS = ("model", "task", "data")


class CheckpointError(UserFacingError, ValueError):
    """A checkpoint is missing, unreadable, or not one that graphormer's train.py wrote."""


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
    except (pickle.UnpicklingError, RuntimeError, EOFError, zipfile.BadZipFile, OSError) as error:
        raise CheckpointError(
            f"checkpoint {path} cannot be read ({type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''}); it is truncated, corrupt or "
            "not a PyTorch checkpoint. Use another checkpoint of the run (e.g. last.ckpt)."
        ) from error
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise CheckpointError(f"{path} is not a Lightning checkpoint (no state_dict)")
    hparams = checkpoint.get("hyper_parameters") or {}
    missing = [k for k in _REQUIRED_HPARAMS if k not in hparams]
    if missing:
        raise CheckpointError(
            f"{path} was not written by graphormer's train.py: its hyper_parameters lack {missing}"
        )
    return checkpoint


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
