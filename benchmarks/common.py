"""Timing helpers for the benchmarks. The molecules and model presets come from
:mod:`graphormer.testing`, the one copy the tests share."""

from __future__ import annotations

import os
import time

import torch

from graphormer.testing import model_preset, nci_graphs, to_data

__all__ = ["best_of", "model_preset", "nci_graphs", "single_thread", "to_data"]


def best_of(fn, repeats: int = 3) -> float:
    """Fastest wall time of ``repeats`` calls, in seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def single_thread() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
