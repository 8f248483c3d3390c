"""OGB graph-property datasets through OGB's own loader, made safe for current torch and for CI.

``ogb`` 1.3.6's ``PygGraphPropPredDataset`` has three traps this subclass removes:
- it loads its processed file with ``torch.load`` and torch's ``weights_only=True`` default (torch >=
  2.6), which rejects PyG's storage classes: we allow-list exactly those classes;
- it asks ``input()`` when a dataset folder lacks ``RELEASE_v<version>.txt``, and again before a
  download over 1 GB: we never prompt, and fail with an actionable error instead;
- it always writes ``processed/geometric_data_processed.pt``, so a changed ``pre_transform`` reuses a
  stale file: our processed files live in a folder named by the preprocessing settings.
Everything else (raw CSV parsing, labels, official splits) is OGB's code, unchanged.
"""

from __future__ import annotations

import os
import os.path as osp
import pickle
import shutil
import socket
import zipfile
from collections.abc import Callable
from contextlib import contextmanager

import torch
from ogb.graphproppred import PygGraphPropPredDataset
from torch_geometric.data import Data, InMemoryDataset
from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
from torch_geometric.data.storage import EdgeStorage, GlobalStorage, NodeStorage

from graphormer.data.tasks import TaskInfo, ogb_master_table
from graphormer.data.transforms import STRUCTURAL_KEYS, StructuralFeatures, structural_features
from graphormer.errors import ConfigError, DataError, UserFacingError

__all__ = [
    "DatasetCacheError",
    "DatasetNotFoundError",
    "OGB_MOLECULE_DATASETS",
    "OGBGraphDataset",
    "add_structural_features",
    "ogb_task_info",
    "allow_pyg_classes",
    "check_pyg_markers",
    "corrupt_cache_message",
]

OGB_MOLECULE_DATASETS = (
    "ogbg-molhiv",
    "ogbg-molpcba",
    "ogbg-moltox21",
    "ogbg-molbace",
    "ogbg-molbbbp",
    "ogbg-molclintox",
    "ogbg-molmuv",
    "ogbg-molsider",
    "ogbg-moltoxcast",
    "ogbg-molesol",
    "ogbg-molfreesolv",
    "ogbg-mollipo",
)

# The classes a collated PyG ``Data`` pickles to, beyond those PyG allow-lists itself.
_PYG_CLASSES = [Data, DataEdgeAttr, DataTensorAttr, GlobalStorage, NodeStorage, EdgeStorage]

_DOWNLOAD_TIMEOUT_S = 60


class DatasetNotFoundError(UserFacingError, FileNotFoundError):
    """A dataset is neither on disk nor downloadable; the message says where to put it."""


class DatasetCacheError(DataError):
    """A processed dataset file cannot be read; the message names it and how to rebuild it."""


def allow_pyg_classes() -> None:
    """Let ``torch.load(weights_only=True)`` read collated PyG ``Data`` objects (and nothing else
    new). Idempotent; a process-wide allow-list, as PyG itself keeps for ``Data``. (torch's
    ``safe_globals`` context manager is not used: on exit it removes its classes even when they
    were allow-listed before, which breaks PyG's own list when contexts nest.)"""
    torch.serialization.add_safe_globals(_PYG_CLASSES)


def corrupt_cache_message(path: str, error: Exception, folder: str | None = None) -> str:
    """What to say when a dataset cache (a file, or the ``folder`` of several) cannot be read:
    the cache, the reason, the folder to delete so that the next run rebuilds it."""
    reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
    reason = reason.split(". ")[0][:160]
    return (
        f"the dataset cache {path} cannot be read ({type(error).__name__}: {reason}); it is "
        f"truncated or corrupt. Delete the folder {folder or osp.dirname(path)} and run again to "
        "rebuild it"
    )


def check_pyg_markers(processed_dir: str) -> None:
    """PyG reads ``pre_transform.pt`` and ``pre_filter.pt`` of a processed folder with
    ``torch.load(weights_only=False)``, i.e. it unpickles them in full. It writes plain strings
    there, so anything a safe load refuses was put there by someone else: refuse it first."""
    for name in ("pre_transform.pt", "pre_filter.pt"):
        path = osp.join(processed_dir, name)
        if not osp.isfile(path):
            continue
        try:
            torch.load(path, weights_only=True)
        except Exception as error:
            raise DatasetCacheError(
                f"the dataset cache file {path} holds more than data ({type(error).__name__}), "
                f"so it is not read. Delete the folder {processed_dir} and run again to rebuild it"
            ) from error


def ogb_task_info(name: str) -> TaskInfo:
    """Task type, number of tasks and metric of an OGB dataset, from OGB's own metadata."""
    table = ogb_master_table()
    if name not in table:
        known = ", ".join(OGB_MOLECULE_DATASETS)
        raise ConfigError(f"unknown OGB dataset {name!r}; molecule datasets: {known}")
    meta = table[name]
    return TaskInfo(
        name=name,
        task_type=meta["task type"],
        num_tasks=int(meta["num tasks"]),
        metric=meta["eval metric"],
    )


def add_structural_features(data: Data, slices: dict, transform: StructuralFeatures) -> None:
    """Adds ``transform``'s features to a collated ``InMemoryDataset`` storage, all graphs at once.

    The collated storage already holds every graph's ``edge_index`` with local node ids, which is
    exactly what the batched shortest-path search takes: no per-graph ``Data`` is ever built.
    """
    node_ptr = slices["x"] if "x" in slices else None
    if node_ptr is None:
        raise ValueError("graphs need node features `x` for Graphormer")
    edge_ptr = slices["edge_index"]
    num_nodes = (node_ptr[1:] - node_ptr[:-1]).numpy()
    num_edges = (edge_ptr[1:] - edge_ptr[:-1]).numpy()
    feats = structural_features(data.edge_index, num_nodes, num_edges, transform.max_hops)
    for key in STRUCTURAL_KEYS:
        data[key] = feats[key]
    slices["in_degree"] = node_ptr.clone()
    slices["out_degree"] = node_ptr.clone()
    slices["spatial_pos"] = feats["pair_ptr"].clone()
    slices["edge_path"] = feats["pair_ptr"].clone()


class OGBGraphDataset(PygGraphPropPredDataset):
    """OGB's ``PygGraphPropPredDataset`` with safe loading, no prompts and a keyed cache.

    Args:
        name (str): OGB dataset name, e.g. ``ogbg-molhiv``.
        root (str): folder holding the datasets (OGB's ``root``).
        pre_transform (StructuralFeatures | None): structural preprocessing, cached on disk.
        transform (Callable | None): applied on access.
    """

    def __init__(
        self,
        name: str,
        root: str = "data",
        pre_transform: StructuralFeatures | None = None,
        transform: Callable | None = None,
    ) -> None:
        task = ogb_task_info(name)  # validates the name first
        self.task = task
        dir_name = "_".join(name.split("-"))
        if osp.exists(osp.join(root, dir_name + "_pyg")):
            dir_name += "_pyg"
        folder = osp.join(root, dir_name)
        version = ogb_master_table()[name]["version"]
        _check_release(name, folder, f"RELEASE_v{version}.txt")
        # Processed files live under a folder named by the preprocessing settings.
        self.cache_key = pre_transform.cache_key if pre_transform is not None else "plain"
        allow_pyg_classes()
        check_pyg_markers(osp.join(folder, "processed", self.cache_key))
        try:
            super().__init__(name, root, transform=transform, pre_transform=pre_transform)
        except (pickle.UnpicklingError, RuntimeError, EOFError, zipfile.BadZipFile) as error:
            cache = osp.join(self.processed_dir, self.processed_file_names)
            if not osp.isfile(cache):
                raise
            # OGB's own torch.load of the cache failed: name the file and the fix.
            raise DatasetCacheError(corrupt_cache_message(cache, error)) from error

    @property
    def processed_dir(self) -> str:
        return osp.join(self.root, "processed", self.cache_key)

    def download(self) -> None:
        url = self.meta_info["url"]
        try:
            from ogb.utils.url import download_url, extract_zip

            with _socket_timeout(_DOWNLOAD_TIMEOUT_S):
                path = download_url(url, self.original_root)
        except Exception as error:  # no network, DNS failure, HTTP error, timeout ...
            _remove_empty_tree(self.root)
            raise DatasetNotFoundError(
                f"{self.name} is not in {osp.abspath(self.root)} and could not be downloaded from "
                f"{url} ({type(error).__name__}: {error}).\n"
                f"Fix: download {url} on a machine with network access, unzip it into "
                f"{osp.abspath(self.original_root)} (giving {osp.abspath(self.root)}/raw/, "
                f"split/, RELEASE_v{self.meta_info['version']}.txt), or point dataset.root= at the "
                "folder that already holds it."
            ) from error
        extract_zip(path, self.original_root)
        os.unlink(path)
        shutil.rmtree(self.root)
        shutil.move(osp.join(self.original_root, self.download_name), self.root)

    def process(self) -> None:
        # OGB's own process() reads the raw CSVs and labels, collates and saves. Its per-graph
        # pre_transform loop is bypassed: the structural features are added to the whole
        # collated storage in one batched pass, in `collate` below, before OGB saves it once
        # (per-graph calls would cost ~0.4 ms each in Python overhead alone).
        self._structural, self.pre_transform = self.pre_transform, None
        try:
            super().process()
        finally:
            self.pre_transform, self._structural = self._structural, None

    def collate(self, data_list: list[Data]) -> tuple[Data, dict]:
        data, slices = InMemoryDataset.collate(data_list)
        if getattr(self, "_structural", None) is not None:
            add_structural_features(data, slices, self._structural)
        return data, slices


def _check_release(name: str, folder: str, release_file: str) -> None:
    """OGB would ask ``input()`` here; an empty leftover folder is removed, anything else errors."""
    if not osp.isdir(folder) or osp.exists(osp.join(folder, release_file)):
        return
    if _remove_empty_tree(folder):
        return
    raise DatasetNotFoundError(
        f"{folder} holds a copy of {name} without {release_file}, which OGB uses to mark an "
        f"outdated release. Fix: delete {folder} to download the current release, or, if it is a "
        f"current copy, create an empty {osp.join(folder, release_file)}."
    )


def _remove_empty_tree(folder: str) -> bool:
    """Removes ``folder`` if it holds no files at any depth (the leftovers of a failed download)."""
    if not osp.isdir(folder):
        return True
    for _, _, files in os.walk(folder):
        if files:
            return False
    shutil.rmtree(folder)
    return True


@contextmanager
def _socket_timeout(seconds: float):
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(seconds)
    try:
        yield
    finally:
        socket.setdefaulttimeout(previous)
