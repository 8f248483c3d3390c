"""What a run tells its user: lines on the console that also land in the run's log file."""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

__all__ = ["command", "quietly", "report"]

# Set inside quietly(): report() then writes to the run's log file only.
_quiet = False


def report(message: str, stream: TextIO | None = None, level: int = logging.INFO) -> None:
    """Prints ``message`` and appends it to the run's log file (Hydra's ``train.log``), so that
    the log holds the results and errors too, not only warnings; the console sees it once."""
    if not _quiet:
        print(message, file=stream or sys.stdout, flush=True)
    record = logging.LogRecord("graphormer", level, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


@contextlib.contextmanager
def quietly() -> Iterator[None]:
    """Work that repeats what the run already told its user (the calibration after training
    reads the data again): its lines go to the log file only and its warnings are not shown, so
    that the run's last lines stay its results. Errors still end the run as they do."""
    global _quiet
    before = _quiet
    _quiet = True
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        _quiet = before


def command(name: str) -> str:
    """How the user runs graphormer's command ``name`` (``train``, ``eval``, ...), in the form
    they started this one: ``python scripts/eval.py`` beside the script they ran
    (``python scripts/train.py``), else the installed console command ``graphormer-eval``. For
    the hints a command prints (``evaluate with: ...``), so that they work as printed."""
    script = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if script is not None and script.suffix == ".py" and script.parent.name == "scripts":
        sibling = script.with_name(f"{name}.py")
        if sibling.is_file():
            return f"python {sibling}"
    return f"graphormer-{name}"
