"""How trained models are run, decided once: the device and precision a pass runs in, the
members x MC-dropout passes (each dropout pass seeded, so a prediction is reproducible), and what
users read (probabilities of classification outputs, per-level values in the targets' units).

``Predictor`` (predict.py, explain.py, serving), ``evaluate`` (eval.py), ensembles and
cross-validation all run their models through here. A seam beside the checkpoint record: both
training (evaluation) and inference (prediction) use it, and training may not import inference.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import numpy as np
import torch
from torch import Tensor

from graphormer.data.tasks import ITEM_LEVELS, Level, TaskInfo
from graphormer.devices import DEFAULT_PRECISION, PRECISIONS
from graphormer.errors import ConfigError

__all__ = [
    "ModelRunner",
    "check_mc_dropout",
    "dropout_pass",
    "has_dropout",
    "inference_context",
    "item_arrays",
    "level_probabilities",
    "probabilities",
    "resolve_device",
]


def has_dropout(config: Any) -> bool:
    """Whether a network's settings drop anything (what MC dropout needs)."""
    rates = (config.dropout, config.attention_dropout, config.activation_dropout)
    return any((r or 0) > 0 for r in (*rates, config.input_dropout))


def check_mc_dropout(mc_dropout: Any, members: int, config: Any) -> int:
    """``mc_dropout`` K checked for ``members`` models of network settings ``config``: 0 (none)
    or K >= 2 passes of a single model trained with dropout.

    Raises:
        ConfigError: naming ``mc_dropout`` and the fix.
    """
    if isinstance(mc_dropout, bool) or not isinstance(mc_dropout, int) or mc_dropout < 0:
        raise ConfigError(f"mc_dropout={mc_dropout!r} is not allowed: a number of passes >= 0")
    if mc_dropout == 1:
        raise ConfigError(
            "mc_dropout=1 is not allowed: one pass has no spread, so <task>_std would be "
            "empty; give mc_dropout=K passes with K >= 2 (e.g. 10), or 0 for none"
        )
    if mc_dropout and members > 1:
        raise ConfigError(
            f"mc_dropout={mc_dropout} is for a single model: an ensemble's {members} "
            "members already give the spread; drop mc_dropout, or give one checkpoint"
        )
    if mc_dropout and not has_dropout(config):
        raise ConfigError(
            f"mc_dropout={mc_dropout} needs dropout, but this model was trained without it "
            "(model.dropout, attention_dropout and activation_dropout are 0): train with "
            "model.dropout=0.1, or use an ensemble (ensemble.size=N)"
        )
    return int(mc_dropout)


def resolve_device(name: str) -> torch.device:
    """The device ``device=NAME`` names (``auto``: a GPU if one is visible)."""
    name = str(name)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise ConfigError(
            f"device={name!r} is not a device name; use device=cpu, cuda, cuda:1 or auto"
        ) from error
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={name} but no CUDA device is visible; use device=cpu")
    if device.type == "cuda" and device.index is not None:
        if device.index >= torch.cuda.device_count():
            raise ConfigError(
                f"device={name} but only {torch.cuda.device_count()} CUDA device(s) are visible"
            )
    return device


def precision_dtypes(precision: str) -> tuple[torch.dtype, torch.dtype | None]:
    """The weights' dtype and the mixed-precision compute dtype (None: none) of a Lightning
    precision name."""
    if precision not in PRECISIONS:
        raise ConfigError(
            f"precision={precision!r} is not one of {sorted(PRECISIONS)}; set "
            f"precision={DEFAULT_PRECISION}"
        )
    return PRECISIONS[precision]


def probabilities(task: TaskInfo, out: Tensor) -> Tensor:
    """Molecule outputs as users read them (float32): probabilities for classification (the
    module gives logits), values in the targets' units for regression."""
    out = out.float()
    if task.is_classification:
        return torch.sigmoid(out)
    if task.is_multiclass:
        return torch.softmax(out, dim=-1)
    return out


def level_probabilities(task: TaskInfo, level: Level, values: Tensor) -> Tensor:
    """An item level's outputs as users read them: probabilities for binary atom (bond)
    targets, values in the targets' units for regression ones."""
    values = values.float()
    return torch.sigmoid(values) if level.task_type(task) == "binary" else values


def item_arrays(task: TaskInfo, levels: dict[str, Tensor], batch: Any) -> dict[str, list]:
    """Each graph's real atoms ``[n_atoms, T_atom]`` and bonds ``[n_bonds, T_bond]`` as numpy
    arrays, from a batch's per-level outputs ``levels`` (the collator keeps RDKit's orders;
    probabilities for binary levels)."""
    found = {}
    for level in ITEM_LEVELS:
        if level.name not in levels:
            continue
        values = level_probabilities(task, level, levels[level.name])
        values, counts = values.cpu().numpy(), getattr(batch, level.mask).sum(1).tolist()
        found[level.name] = [values[b, :n] for b, n in enumerate(counts)]
    return found


@contextmanager
def dropout_pass(module: Any, seed: int, device: torch.device | None = None) -> Iterator[None]:
    """One MC-dropout pass of ``module``: its network's dropout on, the random streams seeded
    with ``seed`` and put back afterwards (the caller's streams are left as they were)."""
    cuda = device is not None and torch.device(device).type == "cuda"
    with torch.random.fork_rng(devices=[device] if cuda else []):
        torch.manual_seed(seed)
        module.model.train()
        try:
            yield
        finally:
            module.eval()


def inference_context(
    device: torch.device, autocast_dtype: torch.dtype | None
) -> AbstractContextManager:
    """No autograd, and the training run's mixed precision (as Lightning's plugin does):
    autocast to ``autocast_dtype`` on ``device`` when given."""
    autocast = (
        torch.autocast(torch.device(device).type, dtype=autocast_dtype)
        if autocast_dtype is not None
        else nullcontext()
    )
    return _both(torch.inference_mode(), autocast)


@contextmanager
def _both(first: AbstractContextManager, second: AbstractContextManager) -> Iterator[None]:
    with first, second:
        yield


class ModelRunner:
    """Members x passes of trained modules over batches, on one device, in one precision.

    Args:
        modules (Sequence): the members (one module, or an ensemble's), in eval mode.
        mc_dropout (int, optional): dropout passes per member (0: one deterministic pass).
            (default: :obj:`0`)
        seed (int, optional): pass ``k`` is seeded with ``seed + k``. (default: :obj:`0`)
        device (torch.device | None, optional): where the passes run (seeded streams of a CUDA
            device are forked too). (default: :obj:`None`)
        precision (str | None, optional): a Lightning precision name: the members are moved to
            ``device`` and its weights' dtype, and :meth:`inference` autocasts to its compute
            dtype; None leaves them where they are (the trainer's plugin runs them).
            (default: :obj:`None`)
    """

    def __init__(
        self,
        modules: Sequence[Any],
        mc_dropout: int = 0,
        seed: int = 0,
        device: torch.device | None = None,
        precision: str | None = None,
    ) -> None:
        self.modules = list(modules)
        self.mc_dropout = int(mc_dropout)
        self.seed = int(seed)
        self.device = device
        self.compute_dtype: torch.dtype | None = None
        if precision is not None:
            weights_dtype, self.compute_dtype = precision_dtypes(str(precision))
            for member in self.modules:
                member.to(device=device, dtype=weights_dtype)

    def inference(self) -> AbstractContextManager:
        """No autograd, in the precision's compute dtype (:func:`inference_context`)."""
        return inference_context(self.device, self.compute_dtype)

    @property
    def num_passes(self) -> int:
        """Members x passes: how many outputs each input gets."""
        return len(self.modules) * max(1, self.mc_dropout)

    def passes(self, run: Callable[[Any], Any]) -> Iterator[Any]:
        """``run(member)`` for every member and pass, in order (member by member); with MC
        dropout, pass ``k`` of each member runs with dropout on, seeded by ``seed + k``."""
        for member in self.modules:
            for k in range(max(1, self.mc_dropout)):
                if not self.mc_dropout:
                    yield run(member)
                    continue
                with dropout_pass(member, self.seed + k, self.device):
                    yield run(member)

    def predict(self, batch: Any, task: TaskInfo) -> tuple[np.ndarray, np.ndarray | None]:
        """The mean molecule prediction ``[B, T]`` over members x passes (of probabilities for
        classification) and its spread: the passes' standard deviation, and with a head that
        predicts its own variance (``loss=mve|evidential``) the mixture's (the heads' mean
        variance plus the variance of their means); None for one deterministic pass of a
        model without such a head."""

        def one(member: Any) -> tuple[np.ndarray, np.ndarray | None]:
            if getattr(member, "predicts_std", False):
                mean, std = member.forward_distribution(batch)
                return probabilities(task, mean).cpu().numpy(), std.float().cpu().numpy() ** 2
            return probabilities(task, member(batch)).cpu().numpy(), None

        found = list(self.passes(one))
        means = np.stack([mean for mean, _ in found])  # [members x passes, B, T]
        if len(found) > 1:
            spread = means.std(0)
            heads = [variance for _, variance in found if variance is not None]
            if heads:
                spread = np.sqrt(means.var(0) + np.mean(heads, 0))
        else:
            variance = found[0][1]
            spread = None if variance is None else np.sqrt(variance)
        return means.mean(0), spread

    def predict_items(
        self, batch: Any, task: TaskInfo
    ) -> tuple[dict[str, list[np.ndarray]], dict[str, list[np.ndarray]] | None]:
        """Each item level's mean prediction over members x passes, one ``[n_items, T]`` array
        per graph (:func:`item_arrays`; of probabilities for binary levels; a vector level's
        ``[n_atoms, T, 3]``, averaged component by component, which is equivariant: the mean
        of rotated vectors is the rotated mean), and the passes' standard deviation alike, per
        component (None for one deterministic pass)."""

        def one(member: Any) -> dict[str, list[np.ndarray]]:
            levels = member.forward_levels(batch)
            return item_arrays(task, {v.name: levels[v.name] for v in task.item_levels}, batch)

        found = list(self.passes(one))
        means, spread = {}, {}
        for name in found[0]:
            stacked = [np.stack(arrays) for arrays in zip(*(f[name] for f in found), strict=True)]
            means[name] = [s.mean(0) for s in stacked]  # each [passes, n_items, T(, 3)]
            spread[name] = [s.std(0) for s in stacked]
        return means, (spread if len(found) > 1 else None)
