"""Timing helpers for the benchmarks, and the one way they run ``scripts/train.py``. The
molecules and model presets come from :mod:`graphormer.testing`, the one copy the tests share."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from graphormer.testing import model_preset, nci_graphs, to_data

__all__ = [
    "REPO",
    "best_of",
    "model_preset",
    "nci_graphs",
    "run_timed",
    "single_thread",
    "to_data",
    "train_command",
]

REPO = Path(__file__).resolve().parents[1]


def train_command(out: Path, *overrides: str) -> list[str]:
    """This checkout's ``scripts/train.py`` into the run folder ``out``, without a progress bar,
    with ``overrides``."""
    return [
        sys.executable,
        str(REPO / "scripts" / "train.py"),
        f"hydra.run.dir={out}",
        "trainer.enable_progress_bar=false",
        *overrides,
    ]


def run_timed(command: list[str], name: str, one_thread: bool = True, show: bool = False) -> float:
    """Runs ``command`` with this checkout first on ``PYTHONPATH`` (and, with ``one_thread``,
    one thread); its wall seconds. A failure ends the benchmark with the command's last output;
    ``show`` prints the output of a success too (a benchmark's figures)."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    if one_thread:
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}".rstrip(os.pathsep)
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    if result.returncode:
        raise SystemExit(f"{name} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    if show:
        print(result.stdout, end="", flush=True)
    return wall


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
