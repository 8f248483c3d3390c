"""A run folder holds one run: never overwritten silently, claimed before Hydra writes to it,
held by one process at a time, and removed again when a run fails before anything was trained."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import IO

from graphormer.outputs import folder_problem

__all__ = [
    "ENSEMBLE_FILE",
    "RUN_MARKER",
    "claim_run_dir",
    "discard_if_untrained",
    "is_first_process",
    "newest_checkpoint",
    "release_run_dir",
    "run_dir_of",
]

RUN_MARKER = ".graphormer-run"
# An ensemble's description, at the top of its run folder (graphormer.training.ensemble).
ENSEMBLE_FILE = "ensemble.json"
# What a run leaves in its folder: finding any of them means the folder is taken.
_RECORDS = ("metrics.json", "checkpoints", "logs", "tb", ".hydra", "members", "folds", RUN_MARKER)
# Hydra's log of a train.py run, in its run folder.
_HYDRA_LOG = "train.log"
_RANK_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID")
# The folders this process claimed: the open marker (its lock lasts as long as the process),
# whether the run is new (so that a failed new run can be cleaned up) and whether this launch
# created the folder itself (an empty folder the user made stays).
_HELD: dict[Path, tuple[IO[str] | None, bool, bool]] = {}


def is_first_process() -> bool:
    """False in the other ranks of a distributed launch, which share the first rank's folder."""
    return all(os.environ.get(name, "0") in ("", "0") for name in _RANK_VARIABLES)


def run_dir_of(ckpt_path: str | Path) -> Path | None:
    """The run folder a checkpoint belongs to (``RUN/checkpoints/x.ckpt``), or None for a file
    kept elsewhere. An ensemble's folder is its own run folder (``ckpt_path=RUN`` resumes the
    ensemble)."""
    path = Path(ckpt_path).expanduser().absolute()
    if (path / ENSEMBLE_FILE).is_file():
        return path
    if path.parent.name != "checkpoints":
        return None
    return path.parent.parent


def newest_checkpoint(run_dir: str | Path) -> Path | None:
    """The checkpoint a resume of ``run_dir`` should start from: ``last.ckpt`` if it exists, else
    the newest other checkpoint (a run killed between its best and its last save), else None."""
    folder = Path(run_dir) / "checkpoints"
    if (folder / "last.ckpt").is_file():
        return folder / "last.ckpt"
    found = [p for p in folder.glob("*.ckpt") if p.is_file()] if folder.is_dir() else []
    return max(found, key=lambda p: p.stat().st_mtime_ns) if found else None


def _resume_advice(run_dir: Path) -> str:
    checkpoint = newest_checkpoint(run_dir)
    if checkpoint is None:
        return "It holds no checkpoint to continue from: "
    return f"Continue that run with ckpt_path={checkpoint}, or "


def _lock(run_dir: Path) -> IO[str] | None | str:
    """Holds the folder's lock (an ``flock`` on its marker) for the rest of this process; the
    error message if another process holds it."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: no lock
        return None
    handle = (run_dir / RUN_MARKER).open("a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return (
            f"the run folder {run_dir} is in use by another running process (a run or a "
            "resume of it); wait for it to end, or choose another folder with hydra.run.dir=DIR"
        )
    return handle


def claim_run_dir(run_dir: str | Path, resume_from: str | Path | None = None) -> str | None:
    """Claims ``run_dir`` for this process; returns an error message if it cannot, else None.

    A folder that holds another run's records is refused, unless ``resume_from`` (``ckpt_path=``)
    is a checkpoint of this very folder; a resume may also start a new, empty folder. The folder
    stays locked while this process lives: two processes never write one run at once.
    """
    run_dir = Path(run_dir).absolute()
    if not is_first_process():
        return None
    problem = folder_problem(run_dir)
    if problem is not None:
        return (
            f"the run folder {run_dir} {problem}; choose a writable folder with "
            "hydra.run.dir=DIR (or leave it out for a new one)"
        )
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    records, launched = _RECORDS, ()
    if any(name in os.environ for name in _RANK_VARIABLES):
        # torchrun / SLURM: every rank runs Hydra into this folder and may write .hydra/ and
        # its log before this rank gets here; a previous run still shows by its other records.
        records = tuple(name for name in _RECORDS if name != ".hydra")
        launched = (".hydra", _HYDRA_LOG)
        created = True  # by this launch's ranks, which may have got here first
    taken = [name for name in records if (run_dir / name).exists()]
    # A folder is new (empty) or a run's own: a user's files are never written among, appended
    # to, or removed with a failed run's.
    foreign = sorted(p.name for p in run_dir.iterdir() if p.name not in launched)
    if not taken and foreign:
        shown = ", ".join(foreign[:5]) + (
            f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
        )
        return (
            f"the run folder {run_dir} already holds files that are not a run's ({shown}): a "
            "run writes into a new or empty folder, never among other files; choose another "
            "folder with hydra.run.dir=DIR (or leave it out for a new one)"
        )
    new = False
    if not taken:
        try:  # exclusive creation: of two runs that start together, exactly one gets the folder
            (run_dir / RUN_MARKER).open("x").close()
            new = True
        except FileExistsError:
            taken = [RUN_MARKER]
    if taken:
        if resume_from is None:
            return (
                f"the run folder {run_dir} already holds a run ({', '.join(taken)}); it is never "
                f"overwritten. {_resume_advice(run_dir)}choose another folder with "
                "hydra.run.dir=DIR (or leave it out for a new one)"
            )
        if run_dir_of(resume_from) != run_dir:
            return (
                f"the run folder {run_dir} already holds another run ({', '.join(taken)}), and "
                f"ckpt_path={resume_from} is not one of its checkpoints: a resume continues in "
                "its own run folder (leave hydra.run.dir out) or starts a new, empty one"
            )
    held = _lock(run_dir)
    if isinstance(held, str):
        return held
    _HELD[run_dir] = (held, new, created)
    return None


def release_run_dir(run_dir: str | Path) -> None:
    """Lets go of a folder this process claimed (its lock), before the process ends."""
    handle, _, _ = _HELD.pop(Path(run_dir).absolute(), (None, False, False))
    if handle is not None:
        handle.close()


def discard_if_untrained(run_dir: str | Path) -> bool:
    """Removes a new run this process started when nothing was trained in it (no checkpoint, no
    ``metrics.json``): a failed start leaves no empty run behind. Only what the run created is
    removed (a new run's folder was empty when claimed), the folder itself only if this launch
    made it; returns whether the run was removed."""
    run_dir = Path(run_dir).absolute()
    handle, new, created = _HELD.get(run_dir, (None, False, False))
    if not new or (run_dir / "metrics.json").exists():
        return False
    if any((run_dir / "checkpoints").glob("*.ckpt")) or _has_logged_metrics(run_dir):
        return False
    # An ensemble's members and a cross-validation's folds are runs inside this one.
    inner = ("members/*/", "folds/*/", "folds/*/members/*/")
    if any(any(run_dir.glob(f"{where}checkpoints/*.ckpt")) for where in inner):
        return False
    for name in ("checkpoints", "logs", "tb", ".hydra", "members", "folds"):
        shutil.rmtree(run_dir / name, ignore_errors=True)
    for name in ("train.log", ENSEMBLE_FILE, RUN_MARKER):
        (run_dir / name).unlink(missing_ok=True)
    if handle is not None:
        handle.close()
    del _HELD[run_dir]
    if created:
        try:
            run_dir.rmdir()  # only if empty: what appeared there since the claim keeps it
        except OSError:
            return False
    return True


def _has_logged_metrics(run_dir: Path) -> bool:
    """Whether a logger recorded any step (CSV's metrics.csv, TensorBoard events beyond the
    header it writes when it starts)."""
    if any((run_dir / "logs").rglob("metrics.csv")):
        return True
    return any(p.stat().st_size > 1024 for p in (run_dir / "tb").rglob("events.*"))
