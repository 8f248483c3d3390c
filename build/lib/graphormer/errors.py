"""Errors a user can fix, reported by the commands as one clear ``error:`` line, not a traceback
(:func:`graphormer.cli.common.run_reporting_errors`)."""

from __future__ import annotations

__all__ = ["ConfigError", "DataError", "UserFacingError"]


class UserFacingError(Exception):
    """Base of errors whose message says what is wrong and how to fix it."""


class ConfigError(UserFacingError, ValueError):
    """A configuration value is invalid; the message names the key and the fix."""


class DataError(UserFacingError, ValueError):
    """Input data cannot be used as given; the message names the file, column, rows or split."""
