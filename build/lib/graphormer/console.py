"""What a run tells its user: lines on the console that also land in the run's log file."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

__all__ = ["report"]


def report(message: str, stream: TextIO | None = None, level: int = logging.INFO) -> None:
    """Prints ``message`` and appends it to the run's log file (Hydra's ``train.log``), so that
    the log holds the results and errors too, not only warnings; the console sees it once."""
    print(message, file=stream or sys.stdout, flush=True)
    record = logging.LogRecord("graphormer", level, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)
