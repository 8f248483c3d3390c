"""The one policy for reading files as data: what ``torch.load(weights_only=True)`` may rebuild,
numpy's renamed modules, and how long a download may wait.

Every file graphormer reads (checkpoints, dataset caches, OGB's split files, ZINC's pickles,
published weights) is data, never code. The policy:

- Files are read with ``torch.load(weights_only=True)``. The classes beyond torch's own that a file
  may rebuild are named in fixed groups here (:data:`PYG_DATA`, :data:`NUMPY_ARRAYS`,
  :data:`NUMPY_SCALARS`, :data:`ARGPARSE_NAMESPACE`) and allow-listed process-wide with
  :func:`allow`. Each group only rebuilds data: none runs code of the file's choosing.
- torch's ``safe_globals`` context manager is not used: on exit it removes its classes even where
  they were allow-listed before (by PyG, or by an outer context), so nested readers break each
  other. A process-wide list only grows, and each entry is harmless.
- A refusal is explained by what the file asks for (:func:`unpickling_reason`,
  :func:`unsafe_globals`), never by torch's advice to switch the check off.
- Records stored as plain pickles (OC20's LMDB files of PyG ``Data``) are read by
  :func:`loads_records`: an unpickler that rebuilds only the classes of :data:`PICKLED_PYG`
  and refuses any other, and sets state only on instances (never on an allow-listed class or
  function itself). torch's own ``torch.storage._load_from_bytes``, which such pickles name
  for every tensor, unpickles its bytes in full (``weights_only=False``); here those bytes are
  read with ``weights_only=True`` instead.
"""

from __future__ import annotations

import functools
import io
import pickle
import re
import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "ARGPARSE_NAMESPACE",
    "DOWNLOAD_TIMEOUT_S",
    "NUMPY_ARRAYS",
    "NUMPY_SCALARS",
    "PYG_DATA",
    "allow",
    "allowed_names",
    "PICKLED_PYG",
    "RefusedClassError",
    "download_timeout",
    "load_data",
    "load_trusted",
    "loads_records",
    "numpy_core",
    "unpickling_reason",
    "unsafe_globals",
]

# How long one network read of a download may stall before it is given up (a hang otherwise,
# on a machine without network).
DOWNLOAD_TIMEOUT_S = 60.0

# Group names for :func:`allow`.
PYG_DATA = "pyg_data"  # collated PyG Data objects (OGB, ZINC and SMILES caches)
NUMPY_ARRAYS = "numpy_arrays"  # numpy arrays (OGB's split_dict.pt)
NUMPY_SCALARS = "numpy_scalars"  # numpy scalars and dtypes (fairseq statistics, ZINC's counts)
ARGPARSE_NAMESPACE = "argparse_namespace"  # fairseq's ``args``


def numpy_core():
    """numpy's core package: ``numpy._core`` in numpy 2, ``numpy.core`` in numpy 1."""
    return getattr(np, "_core", None) or np.core


_DTYPES = ("float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8", "bool")


def _group(name: str) -> list[Any]:
    if name == PYG_DATA:
        from torch_geometric.data import Data
        from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
        from torch_geometric.data.storage import EdgeStorage, GlobalStorage, NodeStorage

        return [Data, DataEdgeAttr, DataTensorAttr, GlobalStorage, NodeStorage, EdgeStorage]
    dtypes = [np.dtype, *(type(np.dtype(t)) for t in _DTYPES)]
    if name == NUMPY_ARRAYS:
        return [numpy_core().multiarray._reconstruct, np.ndarray, *dtypes]
    if name == NUMPY_SCALARS:
        scalar = numpy_core().multiarray.scalar
        # Pickles name the function by the module of the numpy that wrote them.
        return [
            (scalar, "numpy.core.multiarray.scalar"),
            (scalar, "numpy._core.multiarray.scalar"),
            *dtypes,
        ]
    if name == ARGPARSE_NAMESPACE:
        import argparse

        return [argparse.Namespace]
    raise ValueError(f"no allow-list group named {name!r}")


_GROUPS = (PYG_DATA, NUMPY_ARRAYS, NUMPY_SCALARS, ARGPARSE_NAMESPACE)
_allowed: set[str] = set()


def allow(*groups: str) -> None:
    """Allow-lists the classes of ``groups`` for every ``weights_only`` load of this process.
    Idempotent."""
    for name in groups:
        if name not in _allowed:
            torch.serialization.add_safe_globals(_group(name))
            _allowed.add(name)


def allowed_names(groups: Sequence[str] = _GROUPS) -> set[str]:
    """The dotted names of the globals ``groups`` allow, as a checkpoint names them."""
    names = set()
    for name in groups:
        for entry in _group(name):
            if isinstance(entry, tuple):
                names.add(entry[1])
            else:
                names.add(f"{entry.__module__}.{entry.__qualname__}")
    return names


def load_data(
    source: str | Path | Any, groups: Sequence[str] = (), map_location="cpu", mmap: bool = False
) -> Any:
    """``torch.load(source, weights_only=True)`` with the classes of ``groups`` allowed. Errors
    are torch's (:class:`pickle.UnpicklingError` for a refused class); callers name the file and
    the fix, with :func:`unpickling_reason` for the cause. ``mmap``: tensors stay on disk until
    read (for a look at a large file's settings)."""
    allow(*groups)
    return torch.load(source, map_location=map_location, weights_only=True, mmap=mmap)


class RefusedClassError(pickle.UnpicklingError):
    """A pickled record names a class outside the allow-list of :func:`loads_records`."""


def load_trusted(path: str | Path) -> Any:
    """A full unpickle of ``path``, which can run code: only for a file its user vouched for
    (``convert.py trust_source=true`` on a Microsoft or Hugging Face pickle). Every other read
    of a pickle goes through :func:`load_data` or :func:`loads_records`."""
    return torch.load(path, map_location="cpu", weights_only=False)


def _storage_from_bytes(data: bytes) -> Any:
    # torch.storage._load_from_bytes, with the check torch's own version leaves off.
    return torch.load(io.BytesIO(data), weights_only=True)


def _rebuild_tensor(*args: Any) -> torch.Tensor:
    # torch._utils._rebuild_tensor_v2, refusing backward hooks: torch never pickles any (its
    # Note "Don't serialize hooks"), and a record's would be called at a later backward pass.
    hooks = args[5] if len(args) > 5 else None
    if hooks:
        raise RefusedClassError(f"a tensor's backward hooks {list(hooks.values())!r}")
    return torch._utils._rebuild_tensor_v2(*args)


# Built once: the look-ups cost more than a small record's unpickling.
@functools.cache
def _pickled_pyg() -> dict[tuple[str, str], Any]:
    from torch_geometric.data import Data
    from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
    from torch_geometric.data.storage import GlobalStorage

    core = numpy_core().multiarray
    found = {
        ("torch_geometric.data.data", "Data"): Data,
        ("torch_geometric.data.data", "DataEdgeAttr"): DataEdgeAttr,
        ("torch_geometric.data.data", "DataTensorAttr"): DataTensorAttr,
        ("torch_geometric.data.storage", "GlobalStorage"): GlobalStorage,
        ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
        ("torch.storage", "_load_from_bytes"): _storage_from_bytes,
        ("collections", "OrderedDict"): __import__("collections").OrderedDict,
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
    }
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        found[(module, "_reconstruct")] = core._reconstruct
        found[(module, "scalar")] = core.scalar
    return found


# :func:`loads_records`'s allow-list: what pickled PyG ``Data`` records hold (OC20's LMDBs).
PICKLED_PYG = "pickled_pyg"


@functools.cache
def _built_classes() -> tuple[type, ...]:
    from torch_geometric.data import Data
    from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
    from torch_geometric.data.storage import GlobalStorage

    return (Data, DataEdgeAttr, DataTensorAttr, GlobalStorage, dict, np.ndarray, np.dtype)


# The pure-Python unpickler, because its opcode table can be narrowed: the C one applies BUILD
# (``__setstate__`` or setattr) to whatever is on the stack, an allow-listed class or function
# included, which would rewrite it for the whole process (torch's own ``weights_only``
# unpickler likewise builds only instances).
class _RecordUnpickler(pickle._Unpickler):  # type: ignore[name-defined]
    dispatch = dict(pickle._Unpickler.dispatch)  # type: ignore[attr-defined]

    def __init__(self, file, allowed: dict[tuple[str, str], Any]) -> None:
        super().__init__(file)
        self.allowed = allowed
        self.built = _built_classes()

    def load_build(self) -> None:
        target = self.stack[-2]
        if isinstance(target, type) or not isinstance(target, self.built):
            name = getattr(target, "__qualname__", type(target).__qualname__)
            raise RefusedClassError(f"{getattr(target, '__module__', '?')}.{name} (set in place)")
        super().load_build()

    dispatch[pickle.BUILD[0]] = load_build

    def find_class(self, module: str, name: str) -> Any:
        found = self.allowed.get((module, name))
        if found is None:
            raise RefusedClassError(f"{module}.{name}")
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise RefusedClassError(f"a persistent id {pid!r}")


def loads_records(data: bytes, group: str = PICKLED_PYG) -> Any:
    """One plain-pickled record (an LMDB value) rebuilt from the classes of ``group`` only.

    Raises:
        RefusedClassError: the record names any other class or function (its name is the
            message); never runs it.
    """
    if group != PICKLED_PYG:
        raise ValueError(f"no record allow-list named {group!r}")
    return _RecordUnpickler(io.BytesIO(data), _pickled_pyg()).load()


def unpickling_reason(error: Exception) -> str:
    """Why a ``weights_only`` load refused a file, without torch's advice to unpickle it fully."""
    text = str(error)
    found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
    if found:
        return f"it holds an object of class {found.group(1)}, not only tensors and plain values"
    text = text.split("WeightsUnpickler error:")[-1]
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    if "weights_only" in first.lower() or "weights only" in first.lower():
        return "it holds objects other than tensors and plain values"
    return first


def unsafe_globals(path: str | Path, groups: Sequence[str] = _GROUPS) -> list[str]:
    """The globals a checkpoint file names beyond torch's and ``groups``' (empty when the file
    cannot be inspected: an old non-zip format, or damage)."""
    try:
        found = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:
        return []
    allowed = allowed_names(groups)
    return [name for name in found if name not in allowed]


@contextmanager
def download_timeout(seconds: float = DOWNLOAD_TIMEOUT_S) -> Iterator[None]:
    """Network reads inside give up after ``seconds`` instead of hanging."""
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(seconds)
    try:
        yield
    finally:
        socket.setdefaulttimeout(previous)
