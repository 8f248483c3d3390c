"""The random number generators' states as checkpoint data (tensors and plain values only)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from graphormer import checkpoint

__all__ = [
    "RNG_KEY",
    "capture_rng_state",
    "capture_rng_states_of_all_ranks",
    "restore_rng_state",
    "restore_rng_state_of_rank",
]

RNG_KEY = checkpoint.RNG_KEY  # the checkpoint entry (owned by graphormer.checkpoint)


def capture_rng_state() -> dict[str, Any]:
    """torch's (CPU and, when in use, CUDA), numpy's and Python's generator states."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)


def capture_rng_states_of_all_ranks(world_size: int) -> dict[str, Any]:
    """This process's states (:func:`capture_rng_state`) and, in a run of ``world_size`` > 1
    processes (the trainer's), every rank's as ``per_rank`` (rank order): each rank draws its
    own dropout masks, and a checkpoint is written by rank 0 alone, so without them a resumed
    run would give every rank rank 0's streams. Then a collective: every rank must call it, as
    every rank builds each checkpoint (Lightning's ``dump_checkpoint``)."""
    state = capture_rng_state()
    if world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
        size = torch.distributed.get_world_size()
        if size == world_size:
            gathered: list[Any] = [None] * size
            # Values this process made itself, never read from disk: pickling them between
            # the ranks is safe; the checkpoint stores them as tensors and plain values.
            torch.distributed.all_gather_object(gathered, state)
            state["per_rank"] = gathered
    return state


def restore_rng_state_of_rank(state: dict[str, Any], rank: int, world_size: int) -> bool:
    """Restores rank ``rank``'s own streams from a checkpoint's states; True when it could,
    False when the checkpoint holds no states of a run of ``world_size`` processes (written by
    one process, or by a different number), where rank 0's are restored on every rank."""
    per_rank = state.get("per_rank")
    if world_size > 1 and per_rank is not None and len(per_rank) == world_size:
        restore_rng_state(per_rank[rank])
        return True
    restore_rng_state(state)
    return world_size == 1 and per_rank is None
