"""The on-disk cache of a source's flattened graphs and their structural features (issue #17),
for sources that read their input into memory themselves (``tu``, ``pyg_file``, ``lrgb``).

A cache folder is named by a digest of the input files' contents and of the settings that shape
the reading, so a changed file or setting never reuses a stale cache. It holds the graphs
(``graphs.pt``: PyG storage and slices; ``graphs.json``: the rest of the :class:`GraphFile`) and,
per structural setting, that setting's features (``<cache_key>.pt``: degrees, hop distances, edge
paths and their slices), so that a second run reads what the first computed. Everything is read
back as data (``weights_only``), written under a temporary name and renamed into place, under a
file lock (ranks and runs sharing the folder prepare it once).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import os.path as osp
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from graphormer.data.locks import exclusive_lock
from graphormer.data.sources.folders import DatasetCacheError, corrupt_cache_message
from graphormer.data.structure import STRUCTURAL_KEYS, StructuralFeatures, add_structural_features
from graphormer.outputs import atomic_path
from graphormer.safe_io import PYG_DATA, load_data

__all__ = ["GraphCache", "input_digest"]

# Bump when the stored layout changes, so that an old cache is rebuilt rather than misread.
CACHE_VERSION = 1
_CHUNK = 1 << 20


def input_digest(paths: Sequence[str], settings: Any) -> str:
    """A digest of the files ``paths`` (names and contents, in the given order) and of
    ``settings`` (JSON-serialisable: what else shapes the graphs read from them)."""
    digest = hashlib.sha1(f"graph-cache-v{CACHE_VERSION}".encode())
    for path in paths:
        digest.update(osp.basename(path).encode() + b"\0")
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
    digest.update(json.dumps(settings, sort_keys=True).encode())
    return digest.hexdigest()[:16]


class GraphCache:
    """The cache folder of one input (see the module's docstring).

    Args:
        folder (str): the folder (named by :func:`input_digest`); created when written.
    """

    def __init__(self, folder: str) -> None:
        self.folder = folder

    @property
    def graphs_path(self) -> str:
        return osp.join(self.folder, "graphs.pt")

    def structure_path(self, transform: StructuralFeatures) -> str:
        return osp.join(self.folder, f"{transform.cache_key}.pt")

    def graphs(self, build: Callable[[], tuple[Any, dict]], cls: type) -> tuple[Any, dict]:
        """The cached graphs (a ``cls``, :class:`GraphFile`) and ``extra`` values (plain JSON),
        or ``build()``'s, written to the cache for the next run."""
        with exclusive_lock(osp.join(self.folder, ".lock")):
            if osp.isfile(self.graphs_path):
                return self._read_graphs(cls)
            graphs, extra = build()
            meta = {
                f.name: getattr(graphs, f.name)
                for f in dataclasses.fields(graphs)
                if f.name not in ("data", "slices")
            }
            self._write(self.graphs_path, (graphs.data, graphs.slices), {**meta, "extra": extra})
        return graphs, extra

    def _read_graphs(self, cls: type) -> tuple[Any, dict]:
        data, slices = self._load(self.graphs_path)
        meta_path = osp.splitext(self.graphs_path)[0] + ".json"
        try:
            with open(meta_path) as f:
                meta = json.load(f)
            extra = meta.pop("extra")
            graphs = cls(data=data, slices=slices, **meta)
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise DatasetCacheError(corrupt_cache_message(meta_path, error)) from error
        return graphs, extra

    def add_structure(self, graphs: Any, transform: StructuralFeatures) -> None:
        """Adds ``transform``'s features to ``graphs`` (storage and slices, in place): read from
        the cache, or computed and written to it."""
        path = self.structure_path(transform)
        with exclusive_lock(osp.join(self.folder, ".lock")):
            if osp.isfile(path):
                features, slices = self._load(path)
                if set(features) != set(STRUCTURAL_KEYS) or set(slices) != set(STRUCTURAL_KEYS):
                    error = KeyError(f"holds {sorted(features)}, not {list(STRUCTURAL_KEYS)}")
                    raise DatasetCacheError(corrupt_cache_message(path, error))
            else:
                add_structural_features(graphs.data, graphs.slices, transform)
                features = {k: graphs.data[k] for k in STRUCTURAL_KEYS}
                slices = {k: graphs.slices[k] for k in STRUCTURAL_KEYS}
                self._write(path, (features, slices))
                return
        for key in STRUCTURAL_KEYS:
            graphs.data[key] = features[key]
            graphs.slices[key] = slices[key]

    def _load(self, path: str) -> Any:
        try:
            return load_data(path, [PYG_DATA])
        except Exception as error:  # truncated, corrupt, or holding objects other than data
            raise DatasetCacheError(corrupt_cache_message(path, error)) from error

    def _write(self, path: str, value: Any, meta: dict | None = None) -> None:
        import torch

        try:
            os.makedirs(self.folder, exist_ok=True)
            if meta is not None:
                with atomic_path(osp.splitext(path)[0] + ".json") as partial:
                    partial.write_text(json.dumps(meta) + "\n")
            with atomic_path(path) as partial:  # last: graphs.pt marks a complete cache
                torch.save(value, partial)
        except OSError as error:
            # A read-only dataset folder: the run goes on, preparing the data again next time.
            warnings.warn(
                f"the dataset cache {path} could not be written ({error.strerror or error}); "
                "the graphs are prepared again on every run. Make the folder writable (or point "
                "dataset.root= at a writable one) to cache them",
                stacklevel=3,
            )
