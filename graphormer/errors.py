"""Errors a user can fix, reported by the scripts as one clear message rather than a traceback."""

__all__ = ["UserFacingError"]


class UserFacingError(Exception):
    """Base of errors whose message says what is wrong and how to fix it."""
