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
    "RunRecord",
    "TrainingState",
    "data_files",
    "load",
    "meta_entry",
    "read_training_state",
    "save",
    "saved_epoch",
    "seal",
    "store_averaged_weights",
    "weights_digest",
    "write_training_state",
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
# The entries a fine-tuning run adds: the parameter names copied from ``pretrained=``, their
# pre-trained values (``pretrained_decay`` pulls toward them), and whether the output layer was
# fitted by ``pretrained_head=probe`` (its warm-up follows).
PRETRAINED_KEY = "graphormer_pretrained_parameters"
ANCHOR_KEY = "graphormer_pretrained_anchor"
PROBED_KEY = "graphormer_probed_head"
# Every rank's random streams (dropout, ...), so that a resume continues exactly.
RNG_KEY = "graphormer_rng_states"


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
class RunRecord:
    """The settings a run stored with its weights (a checkpoint's ``hyper_parameters``, which are
    also a :class:`~graphormer.training.module.GraphormerModule`'s ``hparams``), read through one
    type: every stored setting is asked for here, never by dict path elsewhere.

    Attributes:
        model: the network's settings (``num_tasks`` included).
        task: the task's :class:`~graphormer.data.tasks.TaskInfo` fields.
        dataset: the run's dataset settings; None for converted weights.
        datamodule: the run's datamodule settings; None for converted weights.
        molecule_features: the molecule-feature settings (their column ``names``), or None.
        training: every other stored setting (optimiser, loss, FLAG, normalisation, ...).
    """

    model: Mapping[str, Any]
    task: Mapping[str, Any]
    dataset: Mapping[str, Any] | None
    datamodule: Mapping[str, Any] | None
    molecule_features: Mapping[str, Any] | None
    training: Mapping[str, Any]

    @classmethod
    def of(cls, hyper_parameters: Mapping[str, Any]) -> RunRecord:
        """The settings of ``hyper_parameters`` (a checkpoint's, or a module's ``hparams``)."""
        data = hyper_parameters.get("data")
        data = dict(data) if isinstance(data, Mapping) else {}

        def part(value: Any) -> dict[str, Any] | None:
            return dict(value) if isinstance(value, Mapping) else None

        return cls(
            model=dict(hyper_parameters.get("model") or {}),
            task=dict(hyper_parameters.get("task") or {}),
            dataset=part(data.get("dataset")),
            datamodule=part(data.get("datamodule")),
            molecule_features=part(data.get("molecule_features")),
            training={
                k: v for k, v in hyper_parameters.items() if k not in ("model", "task", "data")
            },
        )

    @property
    def network(self) -> dict[str, Any]:
        """The network's settings without ``num_tasks`` (which the task sets)."""
        return {k: v for k, v in self.model.items() if k != "num_tasks"}

    @property
    def has_data(self) -> bool:
        """Whether the run recorded the data it trained on (converted weights do not)."""
        return self.dataset is not None and self.datamodule is not None

    @property
    def max_hops(self) -> int | None:
        """The paths' length the run read (``datamodule.max_hops``), None if not recorded."""
        return (self.datamodule or {}).get("max_hops")

    @property
    def pad_to_multiple(self) -> int | None:
        return (self.datamodule or {}).get("pad_to_multiple")

    def dataset_setting(self, key: str) -> Any:
        """One ``dataset.`` setting of the run, None if not recorded."""
        return (self.dataset or {}).get(key)

    def molecule_feature_names(self) -> list[str]:
        """The molecule features' column names, as the run recorded them (empty if none)."""
        return list((self.molecule_features or {}).get("names") or [])

    def trained(self, key: str, default: Any = None) -> Any:
        """One training setting (``loss``, ``normalize_targets``, ``flag``, ``lr`` ...)."""
        return self.training.get(key, default)


@dataclass(frozen=True)
class TrainingState:
    """What a run keeps in a checkpoint beside the weights for its resume: the parameters
    copied from ``pretrained=`` and their pre-trained values, whether the head was probed, the
    training data's digest, the random streams (None when not kept)."""

    pretrained_parameters: frozenset[str]
    pretrained_anchor: dict[str, torch.Tensor]
    probed_head: bool
    data_digest: str | None
    rng_states: Any = None


def write_training_state(
    checkpoint: dict[str, Any],
    *,
    pretrained_parameters: frozenset[str],
    pretrained_anchor: Mapping[str, torch.Tensor],
    probed_head: bool,
    precision: str | None,
    data_digest: str | None,
    rng_states: Any,
) -> None:
    """Writes a training run's own entries into a Lightning ``checkpoint`` being saved (the
    fine-tuning state and the ``graphormer`` entry); :func:`seal` follows, last."""
    if pretrained_parameters:
        # A resume rebuilds the same optimiser groups (its weights come from here, not from
        # pretrained=).
        checkpoint[PRETRAINED_KEY] = sorted(pretrained_parameters)
    if probed_head:
        checkpoint[PROBED_KEY] = True
    if pretrained_anchor:
        checkpoint[ANCHOR_KEY] = {
            name: t.detach().cpu() for name, t in sorted(pretrained_anchor.items())
        }
    digest = {DATA_DIGEST: data_digest} if data_digest else {}
    checkpoint[META_KEY] = meta_entry(checkpoint["state_dict"], precision, **digest)
    # Tensors and plain values (weights_only-loadable).
    checkpoint[RNG_KEY] = rng_states


def read_training_state(checkpoint: Mapping[str, Any]) -> TrainingState:
    """The entries :func:`write_training_state` wrote (absent ones: nothing copied, no
    digest), from a Lightning checkpoint being restored."""
    meta = checkpoint.get(META_KEY)
    digest = meta.get(DATA_DIGEST) if isinstance(meta, Mapping) else None
    return TrainingState(
        pretrained_parameters=frozenset(checkpoint.get(PRETRAINED_KEY, ())),
        pretrained_anchor=dict(checkpoint.get(ANCHOR_KEY, {})),
        probed_head=bool(checkpoint.get(PROBED_KEY, False)),
        data_digest=str(digest) if digest else None,
        rng_states=checkpoint.get(RNG_KEY),
    )


def store_averaged_weights(
    checkpoint: dict[str, Any], state_key: str, average: Mapping[str, torch.Tensor]
) -> None:
    """A checkpoint of a run that averages its weights holds the average as its weights (what
    evaluation and prediction read) and the training weights in the averaging callback's state
    ``state_key`` (what a resume continues from)."""
    weights = {}
    for name, tensor in average.items():
        weights[name] = checkpoint["state_dict"][name]
        checkpoint["state_dict"][name] = tensor.to(weights[name].dtype).cpu()
    checkpoint["callbacks"][state_key]["weights"] = weights


def saved_epoch(path: str | Path) -> int:
    """The training epoch a Lightning checkpoint was saved in (a quick look: nothing verified)."""
    return int(load_data(path, mmap=True)["epoch"])


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
    def run(self) -> RunRecord:
        """The run's stored settings, typed."""
        return RunRecord.of(self.hyper_parameters)

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
        settings = RunRecord.of(checkpoint["hyper_parameters"])
        found = {f"dataset.{key}": settings.dataset_setting(key) for key in DATA_FILE_KEYS}
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
