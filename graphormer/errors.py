"""Errors a user can fix, reported by the scripts as one clear ``error:`` line, not a traceback."""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Callable
from typing import Any

__all__ = ["ConfigError", "DataError", "UserFacingError", "run_reporting_errors"]


class UserFacingError(Exception):
    """Base of errors whose message says what is wrong and how to fix it."""


class ConfigError(UserFacingError, ValueError):
    """A configuration value is invalid; the message names the key and the fix."""


class DataError(UserFacingError, ValueError):
    """Input data cannot be used as given; the message names the file, column, rows or split."""


def run_reporting_errors(entry: Callable[[Any], Any], cfg: Any) -> None:
    """Runs a script's entry function. A :class:`UserFacingError` (or a missing mandatory config
    value) ends it with one ``error:`` line on stderr and exit status 1; a bug keeps its
    traceback. Warnings (skipped SMILES rows, say) also go to the run's log file."""
    from omegaconf.errors import MissingMandatoryValue

    logging.captureWarnings(True)
    # Warnings as one line ("UserWarning: skipped 3 rows ..."), not file, line and source.
    warnings.formatwarning = _one_line_warning
    try:
        entry(cfg)
    except UserFacingError as error:
        _fail(str(error))
    except MissingMandatoryValue as error:
        key = getattr(error, "full_key", None) or "a required value"
        _fail(f"{key} is required: pass {key}=... on the command line (see --help)")


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    return f"{category.__name__}: {message}"


def _fail(message: str) -> None:
    from graphormer.console import report

    report(f"error: {message}", stream=sys.stderr, level=logging.ERROR)
    sys.exit(1)
