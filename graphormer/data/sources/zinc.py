"""ZINC (Dwivedi et al., 2020, "Benchmarking Graph Neural Networks", arXiv:2003.00982): molecules
with ZINC's own categorical atom and bond types, constrained solubility regression scored by MAE.

Read through PyG's ``torch_geometric.datasets.ZINC`` (its URLs, download and raw layout:
``<root>/ZINC/raw/{train,val,test}.pickle`` and, for the 12k subset, ``{train,val,test}.index``),
with four traps removed:
- PyG's ``process()`` reads the raw pickles with ``pickle.load``, which runs whatever code a file
  names: here a restricted unpickler allows exactly what ZINC's files hold (lists of dicts of
  tensors), and a storage inside a tensor is read with ``torch.load(weights_only=True)``;
- PyG's ``load`` falls back to ``torch.load(weights_only=False)``: the processed file is read as
  data only, and PyG's own ``pre_transform.pt`` marker is checked before PyG unpickles it;
- PyG's ``download()`` first deletes ``raw/`` and waits on the network without a timeout: here a
  partial ``raw/`` is never deleted, and no network is one clear error that says what to fetch;
- PyG keeps one split per object and one processed folder whatever the preprocessing: here the
  three official splits live in one storage (as our other sources' graphs do), with the
  structural features cached under a folder named by their settings.
"""

from __future__ import annotations

import collections
import io
import os
import os.path as osp
import pickle
from collections.abc import Callable

import numpy as np
import torch
from torch_geometric.data import Data, InMemoryDataset
from torch_geometric.datasets import ZINC

from graphormer.data.sources.base import LoadedDataset, Source
from graphormer.data.sources.folders import (
    DatasetCacheError,
    DatasetNotFoundError,
    check_pyg_markers,
    corrupt_cache_message,
    download_failed,
    remove_empty_tree,
)
from graphormer.data.structure import StructuralFeatures, add_structural_features
from graphormer.data.tasks import TaskInfo
from graphormer.errors import ConfigError, DataError
from graphormer.safe_io import PYG_DATA, download_timeout, load_data, numpy_core

__all__ = [
    "ZINC_ATOM_TYPES",
    "ZINC_BOND_TYPES",
    "ZINCDataset",
    "ZINCSource",
    "read_zinc_pickle",
]

# ZINC's atom vocabulary as the benchmarking-gnns data lists it (``atom_dict``): element, then
# hydrogens and charge where SMILES writes them in brackets. Index = the stored atom type.
ZINC_ATOM_TYPES = (
    "C", "O", "N", "F", "C H1", "S", "Cl", "O -", "N H1 +", "Br",
    "N H3 +", "N H2 +", "N +", "N -", "S -", "I", "P", "O H1 +", "N H1 -", "O +",
    "S +", "P H1", "P H2", "C H2 -", "P +", "S H1 +", "C H1 -", "P H1 +",
)  # fmt: skip
# Bond types: 0 is "no bond" in the dense adjacency, so edges carry 1, 2 or 3 (kekulised).
ZINC_BOND_TYPES = ("NONE", "SINGLE", "DOUBLE", "TRIPLE")

SPLITS = {"train": "train", "valid": "val", "test": "test"}  # ours -> ZINC's file names
_KEYS = ("atom_type", "bond_type", "logP_SA_cycle_normalized")


# -- reading ZINC's raw pickles as data ----------------------------------------------------------


def _storage_from_bytes(data: bytes):
    # torch pickles a tensor's storage as torch.save'd bytes, rebuilt by
    # torch.storage._load_from_bytes, which unpickles them in full: read them as data only.
    return load_data(io.BytesIO(data))


def _allowed_globals() -> dict[tuple[str, str], object]:
    scalar = numpy_core().multiarray.scalar
    allowed = {
        ("torch._utils", "_rebuild_tensor_v2"): torch._utils._rebuild_tensor_v2,
        ("torch._utils", "_rebuild_tensor"): torch._utils._rebuild_tensor,
        ("torch.storage", "_load_from_bytes"): _storage_from_bytes,
        ("collections", "OrderedDict"): collections.OrderedDict,  # a tensor's (empty) hooks
        ("numpy", "dtype"): np.dtype,  # a numpy integer as num_atom
    }
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[(module, "scalar")] = scalar
    return allowed


class _ZincUnpickler(pickle.Unpickler):
    """Python's unpickler restricted to the globals ZINC's files name (the Python documentation's
    "restricting globals"): anything else, code above all, is refused before it is called."""

    _allowed = _allowed_globals()

    def find_class(self, module: str, name: str):
        found = self._allowed.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(f"it asks for {module}.{name}")
        return found


def read_zinc_pickle(path: str, url: str = ZINC.url) -> list[dict]:
    """The molecules of one of ZINC's raw ``<split>.pickle`` files, read as data only.

    Raises:
        DataError: the file names anything but tensors, numbers and containers (code is
            never run), or cannot be read, or does not hold a list of molecule dicts.
    """
    fix = f"replace it with the file from {url} (or delete it to download it again)"
    try:
        with open(path, "rb") as f:
            molecules = _ZincUnpickler(f).load()
    except pickle.UnpicklingError as error:
        # torch's weights-only refusal (a payload inside a tensor's storage) spans many lines.
        reason = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
        raise DataError(
            f"{path} holds more than data ({reason}), so it is not read: a dataset file is "
            f"data, never code; {fix}"
        ) from error
    except (EOFError, ValueError, TypeError, AttributeError, RuntimeError) as error:
        reason = str(error).strip().splitlines()[0][:160] if str(error).strip() else ""
        raise DataError(
            f"{path} is not a readable ZINC file ({type(error).__name__}: {reason}); {fix}"
        ) from error
    if not isinstance(molecules, list) or not all(isinstance(m, dict) for m in molecules):
        raise DataError(f"{path} does not hold a list of molecules (dicts); {fix}")
    return molecules


def _read_index(path: str, size: int) -> list[int]:
    """A subset's ``<split>.index``: one line of comma-separated positions in the split's pickle."""
    with open(path) as f:
        text = f.read().strip()
    try:
        index = [int(v) for v in text.split(",")] if text else []
    except ValueError as error:
        raise DataError(f"{path} is not a comma-separated list of integers ({error})") from error
    bad = [i for i in index if not 0 <= i < size]
    if bad:
        raise DataError(
            f"{path} lists positions {bad[:5]} outside the {size} molecules of its pickle"
        )
    return index


def _as_tensor(molecule: dict, key: str, where: str) -> torch.Tensor:
    if key not in molecule:
        raise DataError(f"{where} has no {key!r} (it has {sorted(map(str, molecule))})")
    value = molecule[key]
    if not isinstance(value, torch.Tensor | list | tuple | int | float | np.generic):
        raise DataError(f"{where}: {key!r} is a {type(value).__name__}, not a tensor")
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as error:
        raise DataError(f"{where}: {key!r} is not numeric ({error})") from error


def _graphs(molecules: list[dict], index: list[int], path: str) -> dict[str, list[torch.Tensor]]:
    """Node types, edges (both directions, from the dense adjacency), edge types and targets, as
    PyG's ZINC ``process()`` derives them."""
    out: dict[str, list[torch.Tensor]] = {"x": [], "edge_index": [], "edge_attr": [], "y": []}
    for position in index:
        where = f"molecule {position} of {path}"
        atoms = _as_tensor(molecules[position], "atom_type", where).long().view(-1)
        adjacency = _as_tensor(molecules[position], "bond_type", where).long()
        y = _as_tensor(molecules[position], "logP_SA_cycle_normalized", where).float().view(-1)
        n = atoms.numel()
        if n == 0 or adjacency.shape != (n, n) or y.numel() != 1:
            raise DataError(
                f"{where}: {n} atoms, a bond_type matrix of shape {list(adjacency.shape)} and "
                f"{y.numel()} target values (expected [{n}, {n}] and 1)"
            )
        edge_index = adjacency.nonzero().t()  # [2, E], row-major: as PyG orders them
        out["x"].append(atoms)
        out["edge_index"].append(edge_index)
        out["edge_attr"].append(adjacency[edge_index[0], edge_index[1]])
        out["y"].append(y)
    return out


def _check_vocabulary(values: torch.Tensor, low: int, names: tuple[str, ...], what: str, path):
    bad = values[(values < low) | (values >= len(names))]
    if bad.numel():
        raise DataError(
            f"{path} holds {what} {sorted(set(bad.tolist()))[:5]} outside ZINC's "
            f"{len(names)} {what}s ({low}..{len(names) - 1}): the model's tables are sized by "
            "the vocabulary; use ZINC's own files"
        )


# -- the dataset -------------------------------------------------------------------------------


class ZINCDataset(ZINC):
    """PyG's ZINC with the train, val and test splits in one storage, read safely, cached by
    preprocessing settings.

    Items are PyG ``Data`` with ``x`` ``[N, 1]`` (atom type, 0..27), ``edge_index`` ``[2, E]`` (each
    bond in both directions), ``edge_attr`` ``[E]`` (bond type, 1..3; both uint8) and ``y`` ``[1, 1]``
    (constrained solubility), plus the structural features of ``pre_transform``. The graphs are
    ordered train, then val, then test (each in its file's or index file's order); :attr:`split`
    gives their positions.

    Args:
        root (str): the ZINC folder (PyG's ``root``: it holds ``raw/``).
        subset (bool, optional): the 12k subset of Benchmarking GNNs (10,000 / 1,000 / 1,000)
            rather than all 249,456 molecules. (default: :obj:`True`)
        pre_transform (StructuralFeatures | None, optional): structural preprocessing, cached.
        transform (Callable | None, optional): applied on access.
    """

    def __init__(
        self,
        root: str,
        subset: bool = True,
        pre_transform: StructuralFeatures | None = None,
        transform: Callable | None = None,
    ) -> None:
        self.subset = bool(subset)
        self.cache_key = pre_transform.cache_key if pre_transform is not None else "plain"
        # Before PyG's _process unpickles its marker files in full.
        check_pyg_markers(
            osp.join(root, "subset" if subset else "full", "processed", self.cache_key)
        )
        # ZINC.__init__ would pick one split per object and read it with PyG's load(), whose
        # fallback unpickles in full: the folders, URLs and download stay ZINC's, the rest is ours.
        InMemoryDataset.__init__(self, root, transform, pre_transform)
        path = self.processed_paths[0]
        try:
            stored = load_data(path, [PYG_DATA])
            data, slices, sizes = stored["data"], stored["slices"], stored["split_sizes"]
        except Exception as error:  # truncated, corrupt, or holding more than data
            raise DatasetCacheError(corrupt_cache_message(path, error)) from error
        self.data, self.slices = data, slices  # InMemoryDataset's public setter
        bounds = np.cumsum([0, *sizes.tolist()])
        self.split = {
            ours: torch.arange(int(bounds[i]), int(bounds[i + 1])) for i, ours in enumerate(SPLITS)
        }

    @property
    def raw_file_names(self) -> list[str]:
        names = [f"{s}.pickle" for s in SPLITS.values()]
        # Only the subset reads the index files (PyG asks for them for the full set too).
        return names + [f"{s}.index" for s in SPLITS.values()] if self.subset else names

    @property
    def processed_dir(self) -> str:
        return osp.join(super().processed_dir, self.cache_key)

    @property
    def processed_file_names(self) -> list[str]:
        return ["graphs.pt"]

    def download(self) -> None:
        present = [f for f in os.listdir(self.raw_dir)] if osp.isdir(self.raw_dir) else []
        missing = [f for f in self.raw_file_names if f not in present]
        if present:
            # PyG's download() would delete raw/ first: never delete a user's files.
            raise DatasetNotFoundError(
                f"{self.raw_dir} lacks {missing} of ZINC's raw files; fetch them ({self.url} "
                f"holds the pickles, {self.split_url.format('<split>')} the index files) into "
                f"{self.raw_dir}, or delete {self.raw_dir} to download everything again"
            )
        try:
            with download_timeout():
                super().download()
        except Exception as error:  # no network, DNS failure, HTTP error, timeout ...
            for leftover in ("molecules.zip", "molecules.zip?dl=1"):
                if osp.isfile(osp.join(self.root, leftover)):
                    os.unlink(osp.join(self.root, leftover))
            remove_empty_tree(self.root)
            raise download_failed(
                "ZINC",
                self.raw_dir,
                self.url,
                error,
                f"on a machine with network access download {self.url}, unzip it into "
                f"{osp.abspath(self.root)} and rename its molecules/ folder to raw/ (giving "
                f"raw/train.pickle, val.pickle, test.pickle), add "
                f"{self.split_url.format('{train,val,test}')} to raw/, or point dataset.root= at "
                "the folder that holds ZINC/",
            ) from error

    def process(self) -> None:
        parts: dict[str, list[torch.Tensor]] = {"x": [], "edge_index": [], "edge_attr": [], "y": []}
        sizes = []
        for name in SPLITS.values():
            path = osp.join(self.raw_dir, f"{name}.pickle")
            molecules = read_zinc_pickle(path, self.url)
            index = list(range(len(molecules)))
            if self.subset:
                index = _read_index(osp.join(self.raw_dir, f"{name}.index"), len(molecules))
            graphs = _graphs(molecules, index, path)
            x = torch.cat(graphs["x"]) if graphs["x"] else torch.zeros(0, dtype=torch.long)
            edge_attr = torch.cat(graphs["edge_attr"]) if graphs["x"] else x
            _check_vocabulary(x, 0, ZINC_ATOM_TYPES, "atom type", path)
            _check_vocabulary(edge_attr, 1, ZINC_BOND_TYPES, "bond type", path)
            for key, values in graphs.items():
                parts[key] += values
            sizes.append(len(index))
        data, slices = _collate(parts)
        if self.pre_transform is not None:
            add_structural_features(data, slices, self.pre_transform)
        # Written whole, then renamed: a reader never sees half a file.
        partial = f"{self.processed_paths[0]}.partial-{os.getpid()}"
        torch.save({"data": data, "slices": slices, "split_sizes": torch.tensor(sizes)}, partial)
        os.replace(partial, self.processed_paths[0])


def _collate(parts: dict[str, list[torch.Tensor]]) -> tuple[Data, dict[str, torch.Tensor]]:
    """The storage ``InMemoryDataset.collate`` would build from the graphs (node ids stay local
    to each graph), without building one ``Data`` per molecule first. Atom and bond types are
    stored as uint8 (ZINC's vocabularies fit; the collator widens them)."""
    num_nodes = torch.tensor([len(x) for x in parts["x"]], dtype=torch.long)
    num_edges = torch.tensor([e.size(1) for e in parts["edge_index"]], dtype=torch.long)
    node_ptr = torch.cat([torch.zeros(1, dtype=torch.long), num_nodes.cumsum(0)])
    edge_ptr = torch.cat([torch.zeros(1, dtype=torch.long), num_edges.cumsum(0)])
    data = Data(
        x=torch.cat(parts["x"]).to(torch.uint8).view(-1, 1),
        edge_index=torch.cat(parts["edge_index"], dim=1),
        edge_attr=torch.cat(parts["edge_attr"]).to(torch.uint8),
        y=torch.cat(parts["y"]).view(-1, 1),
    )
    slices = {
        "x": node_ptr,
        "edge_index": edge_ptr,
        "edge_attr": edge_ptr.clone(),
        "y": torch.arange(len(num_nodes) + 1),
    }
    return data, slices


# -- the source --------------------------------------------------------------------------------


class ZINCSource(Source):
    """ZINC: constrained solubility (penalised logP) regression scored by MAE, with the official
    train/val/test split (``val`` is our ``valid``), on ZINC's own atom and bond vocabularies.

    Args:
        root (str, optional): the folder holding ``ZINC/``. (default: :obj:`"data"`)
        name (str, optional): label used in outputs. (default: :obj:`"zinc"`)
        subset (bool, optional): the 12k subset (``dataset=zinc``) or all 249,456 molecules
            (``dataset=zinc-full``). (default: :obj:`True`)
    """

    official_split = "ZINC's official train/val/test split (the benchmark's)"

    def __init__(self, root: str = "data", name: str = "zinc", subset: bool = True) -> None:
        if not isinstance(subset, bool):
            raise ConfigError(f"dataset.subset must be true or false, got {subset!r}")
        self.root = root
        self.name = name
        self.subset = subset
        self._task = TaskInfo(name, "regression", 1, "mae")

    def feature_dims(self) -> tuple[list[int], list[int]]:
        """Vocabulary sizes of the node and edge features: one atom-type column (28 types) and
        one bond-type column (4 rows: "no bond" stays unused), not OGB's 9 and 3 columns."""
        return [len(ZINC_ATOM_TYPES)], [len(ZINC_BOND_TYPES)]

    @property
    def folder(self) -> str:
        return osp.join(self.root, "ZINC")

    def load(self, pre_transform: StructuralFeatures | None = None) -> LoadedDataset:
        dataset = ZINCDataset(self.folder, self.subset, pre_transform=pre_transform)
        return LoadedDataset(dataset, dataset.split, self._task)

    def smiles_refusal(self) -> str:
        return (
            f"was trained on ZINC ({self.name}), whose graphs carry ZINC's own atom-type and "
            "bond-type vocabularies; prediction featurises SMILES the OGB way (smiles2graph), "
            "which this model cannot read: score it on ZINC with scripts/eval.py instead"
        )
