"""A run folder holds one run: never overwritten silently, claimed before Hydra writes to it."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["RUN_MARKER", "claim_run_dir", "is_first_process"]

RUN_MARKER = ".graphormer-run"
# What a run leaves in its folder: finding any of them means the folder is taken.
_RECORDS = ("metrics.json", "checkpoints", "logs", "tb", ".hydra", RUN_MARKER)
_RANK_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID")


def is_first_process() -> bool:
    """False in the other ranks of a distributed launch, which share the first rank's folder."""
    return all(os.environ.get(name, "0") in ("", "0") for name in _RANK_VARIABLES)


def claim_run_dir(run_dir: str | Path, resuming: bool) -> str | None:
    """Claims ``run_dir`` for a new run; returns an error message if another run's records are
    there and this run does not resume (``ckpt_path=``), else None."""
    run_dir = Path(run_dir)
    if not is_first_process():
        return None
    run_dir.mkdir(parents=True, exist_ok=True)
    records = _RECORDS
    if any(name in os.environ for name in _RANK_VARIABLES):
        # torchrun / SLURM: every rank runs Hydra into this folder and may write .hydra/ before
        # this rank gets here; a previous run still shows by its other records.
        records = tuple(name for name in _RECORDS if name != ".hydra")
    taken = [name for name in records if (run_dir / name).exists()]
    if not taken:
        try:  # exclusive creation: of two runs that start together, exactly one gets the folder
            (run_dir / RUN_MARKER).open("x").close()
            return None
        except FileExistsError:
            taken = [RUN_MARKER]
    if resuming:
        (run_dir / RUN_MARKER).touch()
        return None
    return (
        f"the run folder {run_dir} already holds a run ({', '.join(taken)}); it is never "
        f"overwritten. Continue that run with ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}, "
        "or choose another folder with hydra.run.dir=DIR (or leave it out for a new one)"
    )
