"""LMDB files, read-only: OC20's released ``data.lmdb`` (:mod:`.oc20`) and fairchem's
``*.aselmdb`` (:mod:`.ase`). ``lmdb`` is an optional package (the ``oc20`` extra)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from graphormer.errors import ConfigError, DataError


def lmdb_module():
    """The ``lmdb`` package.

    Raises:
        ConfigError: it is not installed (naming the extra that installs it).
    """
    try:
        import lmdb
    except ImportError as error:
        raise ConfigError(
            "OC20's LMDB files (dataset=oc20, *.aselmdb) are read with the lmdb package, "
            "which is not installed: pip install 'graphormer[oc20]' (or pip install lmdb)"
        ) from error
    return lmdb


@contextmanager
def open_lmdb(path: str) -> Iterator[Any]:
    """A read transaction of the LMDB file ``path`` (read-only, no lock file).

    Raises:
        ConfigError: ``lmdb`` is not installed.
        DataError: ``path`` is not an LMDB file.
    """
    lmdb = lmdb_module()
    try:
        env = lmdb.open(path, subdir=False, readonly=True, lock=False, readahead=False)
    except lmdb.Error as error:
        raise DataError(f"{path}: not an LMDB file ({error})") from error
    with env, env.begin() as txn:
        yield txn
