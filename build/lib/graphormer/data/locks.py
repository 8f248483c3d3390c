"""A file lock, so that processes sharing a file system prepare a dataset one at a time."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["exclusive_lock"]


@contextmanager
def exclusive_lock(path: str) -> Iterator[None]:
    """Holds an exclusive ``flock`` on ``path`` (created if needed) while the block runs.

    Other processes, on this machine or on another node of a shared POSIX file system, wait at
    the same lock. Where ``fcntl`` does not exist (Windows) the block runs unlocked.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        handle = open(path, "a")  # noqa: SIM115  (closed below)
    except OSError:
        # A read-only data folder: nothing can be written there, so there is no cache to race
        # on; reading it needs no lock.
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
