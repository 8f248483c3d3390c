"""Errors a user can fix, reported by the scripts as one clear message rather than a traceback."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["UserFacingError", "run_reporting_errors"]


class UserFacingError(Exception):
    """Base of errors whose message says what is wrong and how to fix it."""


def run_reporting_errors(entry: Callable[[Any], Any], cfg: Any) -> None:
    """Runs a script's entry function; a :class:`UserFacingError` ends it with its message and
    exit status 1. Warnings (skipped SMILES rows, say) also go to the run's log file."""
    logging.captureWarnings(True)
    try:
        entry(cfg)
    except UserFacingError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
