"""PCQM4Mv2 (OGB-LSC): 3,746,620 molecules and their HOMO-LUMO gaps, read through ``ogb.lsc``'s own
loader and held compactly.

``ogb.lsc.PygPCQM4Mv2Dataset`` builds one int64 ``Data`` per SMILES in a Python loop and collates
all 3.7M in memory (several GB). Here ``ogb.lsc.PCQM4Mv2Dataset(only_smiles=True)`` reads OGB's raw
CSV and split, the SMILES are featurised by the one featuriser (``featurize_compact``: OGB's own
``smiles2graph``) in several processes, and the graphs are stored once as flat arrays of small
integers (``uint8`` atom and bond features and local node ids), memory-mapped when read: DataLoader workers share the pages instead of copying
them. Structural features are not cached for this dataset (3.7M molecules would need ~15 GB of
pair features); the collator computes them per batch, inside the DataLoader workers.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import os.path as osp
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset
from torch_geometric.data import Data

from graphormer.console import report
from graphormer.data.featurize import featurize_compact
from graphormer.data.sources.base import LoadedDataset, Source
from graphormer.data.sources.folders import (
    DatasetCacheError,
    DatasetNotFoundError,
    check_release,
    corrupt_cache_message,
    remove_empty_tree,
)
from graphormer.data.tasks import TaskInfo
from graphormer.errors import ConfigError, DataError
from graphormer.outputs import atomic_path
from graphormer.safe_io import NUMPY_ARRAYS, allow, download_timeout

__all__ = [
    "OFFICIAL_SIZES",
    "PCQM4MV2_SPLITS",
    "PCQM4Mv2Graphs",
    "PCQM4Mv2Source",
    "write_compact",
]

PCQM4MV2_SPLITS = ("train", "valid", "test-dev", "test-challenge")
LABELLED_SPLITS = ("train", "valid")
# The official split sizes, which the leaderboard's submission files must match.
OFFICIAL_SIZES = {
    "train": 3_378_606,
    "valid": 73_545,
    "test-dev": 147_037,
    "test-challenge": 147_432,
}
# Bump when the stored layout changes, so that an old cache is rebuilt rather than misread.
FORMAT = "compact_v1"
_ARRAYS = ("x", "edge_index", "edge_attr", "node_ptr", "edge_ptr", "y")


def write_compact(
    smiles: Sequence[str],
    labels: np.ndarray,
    split: dict[str, np.ndarray],
    folder: str,
    processes: int = 1,
    chunk: int = 20_000,
) -> dict[str, float]:
    """Featurises ``smiles`` with ``processes`` processes and writes the compact dataset to
    ``folder`` (written under a temporary name and renamed into place when complete, so that no
    reader ever sees half of it). Returns what it cost: seconds, graphs, failures, bytes."""
    start = time.perf_counter()
    chunks = [smiles[i : i + chunk] for i in range(0, len(smiles), chunk)]
    if processes > 1 and len(chunks) > 1:
        context = multiprocessing.get_context("spawn" if os.name != "posix" else "fork")
        with context.Pool(processes) as pool:
            parts = pool.map(featurize_compact, chunks, chunksize=1)
    else:
        parts = [featurize_compact(c) for c in chunks]
    num_nodes = np.concatenate([p["num_nodes"] for p in parts])
    num_edges = np.concatenate([p["num_edges"] for p in parts])
    offsets = np.cumsum([0] + [len(c) for c in chunks[:-1]])
    failed = np.concatenate([p["failed"] + o for p, o in zip(parts, offsets, strict=True)])
    arrays = {
        "x": np.concatenate([p.pop("x") for p in parts]),
        "edge_index": np.concatenate([p.pop("edge_index") for p in parts], axis=1),
        "edge_attr": np.concatenate([p.pop("edge_attr") for p in parts]),
        "node_ptr": np.concatenate([[0], np.cumsum(num_nodes, dtype=np.int64)]),
        "edge_ptr": np.concatenate([[0], np.cumsum(num_edges, dtype=np.int64)]),
        "y": np.asarray(labels, dtype=np.float32).reshape(-1),
    }
    del parts
    partial = f"{folder}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    os.makedirs(partial)
    for name, array in arrays.items():
        np.save(osp.join(partial, f"{name}.npy"), np.ascontiguousarray(array))
    np.savez(
        osp.join(partial, "split.npz"), **{k: np.asarray(v, np.int64) for k, v in split.items()}
    )
    meta = {"format": FORMAT, "num_graphs": len(smiles), "failed": failed.tolist()}
    with open(osp.join(partial, "meta.json"), "w") as f:
        json.dump(meta, f)
    if osp.isdir(folder):  # another process finished first: keep its copy
        shutil.rmtree(partial)
    else:
        os.replace(partial, folder)
    size = sum(osp.getsize(osp.join(folder, f)) for f in os.listdir(folder))
    return {
        "seconds": time.perf_counter() - start,
        "graphs": len(smiles),
        "failed": len(failed),
        "bytes": size,
    }


class PCQM4Mv2Graphs(Dataset):
    """The compact, memory-mapped graphs of :func:`write_compact`; items are PyG ``Data``.

    Args:
        folder (str): the folder :func:`write_compact` wrote.
    """

    def __init__(self, folder: str) -> None:
        self.folder = folder
        try:
            with open(osp.join(folder, "meta.json")) as f:
                self.meta = json.load(f)
            arrays = {k: np.load(osp.join(folder, f"{k}.npy"), mmap_mode="r") for k in _ARRAYS}
            with np.load(osp.join(folder, "split.npz"), allow_pickle=False) as split:
                self.split = {k: torch.from_numpy(split[k].copy()) for k in split.files}
        except (OSError, ValueError, KeyError) as error:
            raise DatasetCacheError(corrupt_cache_message(folder, error, folder=folder)) from error
        if self.meta.get("format") != FORMAT:
            raise DataError(f"{folder} holds another format; delete it to rebuild it")
        self.x, self.edge_index, self.edge_attr = (
            arrays["x"],
            arrays["edge_index"],
            arrays["edge_attr"],
        )
        self.node_ptr = np.asarray(arrays["node_ptr"])
        self.edge_ptr = np.asarray(arrays["edge_ptr"])
        self._y = torch.from_numpy(np.array(arrays["y"])).view(-1, 1)

    def __len__(self) -> int:
        return len(self.node_ptr) - 1

    @property
    def node_counts(self) -> torch.Tensor:
        """``[G]`` atoms per molecule."""
        return torch.from_numpy(np.diff(self.node_ptr))

    @property
    def y(self) -> torch.Tensor:
        """``[G, 1]`` HOMO-LUMO gaps in eV (NaN in the unlabelled test splits)."""
        return self._y

    @property
    def failed(self) -> list[int]:
        return self.meta["failed"]

    def __getitem__(self, index: int) -> Data:
        a, b = self.node_ptr[index], self.node_ptr[index + 1]
        c, d = self.edge_ptr[index], self.edge_ptr[index + 1]
        return Data(
            x=torch.from_numpy(np.array(self.x[a:b])),
            edge_index=torch.from_numpy(np.array(self.edge_index[:, c:d], dtype=np.int64)),
            edge_attr=torch.from_numpy(np.array(self.edge_attr[c:d])),
            y=self._y[index].view(1, 1),
            num_nodes=int(b - a),
        )


class PCQM4Mv2Source(Source):
    """OGB-LSC's PCQM4Mv2: HOMO-LUMO gap regression scored by MAE
    (``ogb.lsc.PCQM4Mv2Evaluator``), with the official split. ``valid`` is the labelled
    evaluation split; ``test-dev`` and ``test-challenge`` have no labels (``scripts/eval.py
    split=test-dev`` writes a leaderboard submission file for them).

    Args:
        root (str, optional): the folder holding ``pcqm4m-v2/`` (OGB's ``root``).
            (default: :obj:`"data"`)
        name (str, optional): label used in outputs. (default: :obj:`"pcqm4mv2"`)
        processes (int | None, optional): processes that featurise the SMILES once; None uses
            every core. (default: :obj:`None`)
    """

    official_split = "OGB-LSC's official split (test-dev and test-challenge are unlabelled)"

    def __init__(self, root: str = "data", name: str = "pcqm4mv2", processes: int | None = None):
        if processes is not None and (
            isinstance(processes, bool) or not isinstance(processes, int) or processes < 1
        ):
            raise ConfigError(
                f"dataset.processes must be an integer >= 1 or null, got {processes!r}"
            )
        self.root = root
        self.name = name
        self.processes = processes
        self._task = TaskInfo(name, "regression", 1, "mae")

    def node_counts(self, dataset: PCQM4Mv2Graphs) -> torch.Tensor:
        return dataset.node_counts

    def writes_predictions(self, split: str) -> bool:
        """test-dev and test-challenge: the leaderboard's submission files."""
        return split in PCQM4MV2_SPLITS and split not in LABELLED_SPLITS

    def write_predictions(self, split: str, y_pred: torch.Tensor, folder: Path) -> Path:
        """The leaderboard file for ``split`` (``y_pred_pcqm4m-v2_<split>.npz``), written by
        ``ogb.lsc.PCQM4Mv2Evaluator.save_test_submission`` when the split has the official size."""
        from ogb.lsc import PCQM4Mv2Evaluator

        y_pred = y_pred.view(-1).cpu().numpy().astype(np.float32)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"y_pred_pcqm4m-v2_{split}.npz"
        official = len(y_pred) == OFFICIAL_SIZES[split]
        # Written whole or not at all: an interrupted eval never leaves a truncated file that
        # looks like a submission.
        with atomic_path(path) as partial:
            if official:
                # OGB's writer (it checks the official size) into a folder of its own, then
                # moved into place.
                staging = partial.with_suffix("")
                staging.mkdir()
                try:
                    PCQM4Mv2Evaluator().save_test_submission(
                        {"y_pred": y_pred}, str(staging), split
                    )
                    os.replace(staging / path.name, partial)
                finally:
                    shutil.rmtree(staging, ignore_errors=True)
            else:
                # A subset gets the same file format, flagged.
                np.savez_compressed(partial, y_pred=y_pred)
        if official:
            report(f"submission: {path.resolve()} ({len(y_pred):,} predictions, {self.name})")
        else:
            report(
                f"submission: {path.resolve()} ({len(y_pred):,} predictions; the official "
                f"{split} split has {OFFICIAL_SIZES[split]:,}, so this is NOT a valid leaderboard "
                "submission)"
            )
        return path

    @property
    def folder(self) -> str:
        return osp.join(self.root, "pcqm4m-v2")

    @property
    def processed(self) -> str:
        return osp.join(self.folder, "processed", FORMAT)

    def load(self, pre_transform=None) -> LoadedDataset:  # noqa: ARG002  (never cached here)
        if not osp.isdir(self.processed):
            self.prepare()
        dataset = PCQM4Mv2Graphs(self.processed)
        return LoadedDataset(dataset, dataset.split, self._task, labelled=LABELLED_SPLITS)

    def prepare(self) -> dict[str, float]:
        """Reads OGB's raw CSV and split with ``ogb.lsc`` and writes the compact cache."""
        from ogb.lsc import PCQM4Mv2Dataset

        check_release("PCQM4Mv2", self.folder, "RELEASE_v1.txt")
        allow(NUMPY_ARRAYS)  # OGB's split_dict.pt holds numpy arrays
        try:
            with download_timeout():
                raw = PCQM4Mv2Dataset(root=self.root, only_smiles=True)
        except (OSError, SystemExit, ValueError) as error:  # no network; OGB exits on refusal
            remove_empty_tree(self.folder)
            url = "https://dgl-data.s3-accelerate.amazonaws.com/dataset/OGB-LSC/pcqm4m-v2.zip"
            raise DatasetNotFoundError(
                f"PCQM4Mv2 is not in {osp.abspath(self.folder)} and could not be downloaded "
                f"from {url} ({type(error).__name__}: {error}). Fix: download {url} on a "
                f"machine with network access, unzip it into {osp.abspath(self.root)} (giving "
                f"{osp.abspath(self.folder)}/raw/data.csv.gz and split_dict.pt), or point "
                "dataset.root= at the folder that holds pcqm4m-v2/."
            ) from error
        split = {k: np.asarray(v, dtype=np.int64) for k, v in raw.get_idx_split().items()}
        missing = [k for k in PCQM4MV2_SPLITS if k not in split]
        if missing:
            raise DataError(f"{self.folder}/split_dict.pt lacks the split(s) {missing}")
        labels = np.asarray(raw.labels, dtype=np.float64)
        for name in LABELLED_SPLITS:
            unlabelled = np.flatnonzero(np.isnan(labels[split[name]]))
            if len(unlabelled):
                raise DataError(
                    f"{len(unlabelled)} molecules of PCQM4Mv2's {name} split have no "
                    f"homolumogap in {self.folder}/raw/data.csv.gz; the file is damaged"
                )
        processes = self.processes or os.cpu_count() or 1
        return write_compact(raw.graphs, labels, split, self.processed, processes=processes)
