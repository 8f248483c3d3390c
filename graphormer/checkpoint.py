"""The one checkpoint record: what a graphormer checkpoint holds, written and read here alone.

A checkpoint is a Lightning checkpoint (so that ``Trainer.fit(ckpt_path=...)`` resumes it) read
as data, never as code (``weights_only``, see :mod:`graphormer.safe_io`). Beside Lightning's own
entries it holds:

- ``hyper_parameters``: ``model`` (the network's settings), ``task`` (name, type, tasks, metric),
  ``data`` (the dataset and datamodule settings of the run, or None for converted weights), and
  the training settings (optimiser, loss, FLAG, target normalisation);
- ``graphormer`` (:data:`META_KEY`): ``format_version``, the package ``version`` that wrote it,
  the training ``precision``, the SHA-256 of the weights, the digest of the training data
  (``data_digest``: :meth:`GraphDataModule.data_digest`, which a resume compares), and for
  converted weights where they came from (``converted_from``).

Format versions: 1 is every checkpoint written before the format had a number (the same layout,
no ``format_version``); 2 adds the number; 3 adds ``checkpoint_sha256``, a digest of everything
a resume reads (weights, optimiser and scheduler states, loops, callbacks, random streams,
hyper-parameters), so that an altered file is refused, not resumed. A file of a newer format than this package reads is
refused with a message saying so, rather than misread.
"""

from __future__ import annotations

import hashlib
import pickle
import warnings
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import graphormer
from graphormer.errors import UserFacingError
from graphormer.outputs import atomic_path
from graphormer.safe_io import load_data, unpickling_reason

__all__ = [
    "FORMAT_VERSION",
    "META_KEY",
    "DATA_DIGEST",
    "checkpoint_digest",
    "CheckpointError",
    "CheckpointRecord",
    "data_files",
    "load",
    "meta_entry",
    "save",
    "seal",
    "weights_digest",
]

FORMAT_VERSION = 3
# Where graphormer keeps its own entry in a checkpoint (format, version, precision, digest).
META_KEY = "graphormer"
_DIGEST = "weights_sha256"
_WHOLE_DIGEST = "checkpoint_sha256"
# The digest of the data a run trained on, in the graphormer entry (absent: converted weights,
# or a checkpoint written before it was kept).
DATA_DIGEST = "data_digest"
_REQUIRED = ("model", "task", "data")


class CheckpointError(UserFacingError, ValueError):
    """A checkpoint is missing, unreadable, or not one that graphormer wrote."""


def weights_digest(state_dict: Mapping[str, Any]) -> str:
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


def _feed(digest: Any, value: Any) -> None:
    """Feeds ``value`` to ``digest`` in a form that survives a save and a load: mappings in key
    order, sequences item by item, tensors as dtype, shape and bytes, scalars as their repr."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        digest.update(f"T{tensor.dtype}{tuple(tensor.shape)}|".encode())
        flat = tensor.reshape(-1)  # a 0-dim tensor cannot be viewed as bytes
        digest.update(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
    elif isinstance(value, Mapping):
        digest.update(f"M{len(value)}|".encode())
        for key in sorted(value, key=repr):
            _feed(digest, key)
            _feed(digest, value[key])
    elif isinstance(value, list | tuple):
        digest.update(f"S{len(value)}|".encode())
        for item in value:
            _feed(digest, item)
    else:
        digest.update(f"{type(value).__name__}:{value!r}|".encode())


def checkpoint_digest(checkpoint: Mapping[str, Any]) -> str:
    """SHA-256 over every entry of a checkpoint but graphormer's own (which holds it)."""
    digest = hashlib.sha256()
    _feed(digest, {k: v for k, v in checkpoint.items() if k != META_KEY})
    return digest.hexdigest()


def seal(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """Writes the digest of the whole ``checkpoint`` into its ``graphormer`` entry (which
    :func:`meta_entry` made); called last, when nothing else will be added to it."""
    checkpoint[META_KEY][_WHOLE_DIGEST] = checkpoint_digest(checkpoint)
    return checkpoint


def meta_entry(
    state_dict: Mapping[str, Any], precision: str | None, **extra: Any
) -> dict[str, Any]:
    """The ``graphormer`` entry of a checkpoint holding ``state_dict``: format, version,
    precision, the weights' digest, and ``extra`` values (e.g. ``converted_from``)."""
    return {
        "format_version": FORMAT_VERSION,
        "version": graphormer.__version__,
        "precision": precision,
        _DIGEST: weights_digest(state_dict),
        **extra,
    }


@dataclass(frozen=True)
class CheckpointRecord:
    """A checkpoint read back: its settings, weights and metadata.

    Attributes:
        path: the file it was read from.
        state_dict: the module's tensors (``model.*``, ``target_mean``, ``target_std``).
        hyper_parameters: the module's arguments (``model``, ``task``, ``data``, optimiser ...).
        meta: the ``graphormer`` entry (format, version, precision, digest, ``converted_from``).
        format_version: 1 for files written before the format was numbered.
    """

    path: Path
    state_dict: dict[str, torch.Tensor]
    hyper_parameters: dict[str, Any]
    meta: dict[str, Any]
    format_version: int

    @property
    def model(self) -> dict[str, Any]:
        return dict(self.hyper_parameters.get("model") or {})

    @property
    def task(self) -> dict[str, Any]:
        return dict(self.hyper_parameters.get("task") or {})

    @property
    def data(self) -> dict[str, Any] | None:
        """The run's ``dataset`` and ``datamodule`` settings; None for converted weights."""
        data = self.hyper_parameters.get("data")
        return dict(data) if isinstance(data, Mapping) else None

    @property
    def data_digest(self) -> str | None:
        """The digest of the training data (graphs, labels, splits), None if not recorded."""
        value = self.meta.get(DATA_DIGEST)
        return str(value) if value else None

    @property
    def precision(self) -> str | None:
        """The precision the run trained in (None if not recorded)."""
        value = self.meta.get("precision")
        return str(value) if value else None


def save(
    path: str | Path,
    state_dict: Mapping[str, torch.Tensor],
    hyper_parameters: Mapping[str, Any],
    *,
    precision: str | None = None,
    **extra: Any,
) -> Path:
    """Writes a checkpoint that :func:`load` (and ``pretrained=``, ``eval.py``, the Predictor)
    reads: for weights that no Lightning run wrote (conversion, tools). The file appears whole
    or not at all (written under a temporary name, then renamed)."""
    import lightning

    state_dict = dict(state_dict)
    checkpoint = {
        "state_dict": state_dict,
        "hyper_parameters": dict(hyper_parameters),
        "pytorch-lightning_version": lightning.__version__,
        META_KEY: meta_entry(state_dict, precision, **extra),
    }
    seal(checkpoint)
    path = Path(path)
    with atomic_path(path) as partial:
        torch.save(checkpoint, partial)
    return path


# The dataset settings that name files a run reads its data from (``root`` is a folder the
# run also writes its caches to).
DATA_FILE_KEYS = ("path", "split_file")


def data_files(path: str | Path) -> dict[str, str]:
    """The files the run of checkpoint ``path`` read its data from, by their ``dataset.`` key
    (``dataset.path``, ``dataset.split_file``): inputs that no output may replace. A quick look
    at the settings (the weights are neither read nor verified); empty for converted weights and
    for a file that cannot be read, which :func:`load` then refuses in its own words."""
    try:
        checkpoint = load_data(path, mmap=True)
        dataset = checkpoint["hyper_parameters"]["data"]["dataset"]
        found = {f"dataset.{key}": dataset.get(key) for key in DATA_FILE_KEYS}
    except Exception:  # any damage: load() names it when the command reads the file
        return {}
    return {
        key: str(value)
        for key, value in found.items()
        if isinstance(value, str) and value and not value.startswith("rdkit:")
    }


def load(path: str | Path) -> CheckpointRecord:
    """Reads a checkpoint written by graphormer (tensors and plain values only) and verifies the
    digest of its weights.

    Raises:
        CheckpointError: the file is missing, unreadable, holds more than data, was not written
            by graphormer, is of a newer format, or its weights do not match their digest.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(
            f"checkpoint {path} does not exist; pass ckpt= the path train.py printed "
            "(outputs/.../checkpoints/best-*.ckpt or last.ckpt)"
        )
    try:
        checkpoint = load_data(path)
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
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        raise CheckpointError(f"{path} is not a Lightning checkpoint (no state_dict)")
    hparams = checkpoint.get("hyper_parameters")
    missing = [k for k in _REQUIRED if not isinstance(hparams, dict) or k not in hparams]
    if missing:
        raise CheckpointError(
            f"{path} was not written by graphormer's train.py: its hyper_parameters lack {missing}"
        )
    meta = checkpoint.get(META_KEY)
    meta = dict(meta) if isinstance(meta, dict) else {}
    version = meta.get("format_version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise CheckpointError(f"checkpoint {path} has an invalid format_version {version!r}")
    if version > FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {path} is of format {version}, written by graphormer "
            f"{meta.get('version', '?')}; this graphormer ({graphormer.__version__}) reads formats "
            f"up to {FORMAT_VERSION}: upgrade graphormer to read it"
        )
    _verify_digest(path, checkpoint["state_dict"], meta)
    if version >= 3:
        _verify_whole(path, checkpoint, meta)
    _check_finite(path, checkpoint)
    return CheckpointRecord(path, checkpoint["state_dict"], dict(hparams), meta, version)


def _verify_digest(path: Path, state_dict: dict[str, Any], meta: dict[str, Any]) -> None:
    stored = meta.get(_DIGEST)
    if stored is None:
        warnings.warn(
            f"checkpoint {path} carries no digest of its weights (written by another tool), so "
            "damage to it cannot be detected",
            stacklevel=3,
        )
        return
    if weights_digest(state_dict) != stored:
        raise CheckpointError(
            f"the weights in checkpoint {path} do not match the digest stored when it was saved: "
            "the file was altered or damaged after training. Use another checkpoint of the run "
            "(e.g. last.ckpt) or copy it again from its source."
        )


def _verify_whole(path: Path, checkpoint: dict[str, Any], meta: dict[str, Any]) -> None:
    if checkpoint_digest(checkpoint) != meta.get(_WHOLE_DIGEST):
        raise CheckpointError(
            f"checkpoint {path} was altered or damaged after it was saved: its settings, "
            "optimiser, scheduler, loop or random states do not match the digest stored with "
            "them. Use another checkpoint of the run (e.g. last.ckpt or best-*.ckpt) or copy it "
            "again from its source."
        )


def _nonfinite_tensors(value: Any, name: str) -> list[str]:
    if isinstance(value, torch.Tensor):
        finite = not value.is_floating_point() or bool(torch.isfinite(value).all())
        return [] if finite else [name]
    if isinstance(value, Mapping):
        items = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        return []
    return [bad for key, item in items for bad in _nonfinite_tensors(item, f"{name}.{key}")]


def _check_finite(path: Path, checkpoint: dict[str, Any]) -> None:
    """Weights (or optimiser moments) that are NaN or infinite only ever give NaN."""
    bad = [
        *_nonfinite_tensors(checkpoint["state_dict"], "state_dict"),
        *_nonfinite_tensors(checkpoint.get("optimizer_states") or [], "optimizer_states"),
    ]
    if bad:
        shown = ", ".join(n.split(".", 1)[1] if n.startswith("state_dict.") else n for n in bad[:3])
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise CheckpointError(
            f"checkpoint {path} holds NaN or infinite values in {shown}{more}: the run that wrote "
            "it had diverged, or the file was edited. Use an earlier checkpoint of the run, or "
            "retrain (a lower optim.lr)"
        )
