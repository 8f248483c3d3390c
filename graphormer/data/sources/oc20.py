"""OC20's IS2RE data as released (``dataset=oc20 dataset.path=DIR``): LMDB files of pickled PyG
``Data``, one folder per split (Chanussot et al., 2021, https://arxiv.org/abs/2010.09990)::

    DIR/train/data.lmdb
    DIR/val_id/data.lmdb        DIR/val_ood_ads/data.lmdb
    DIR/val_ood_cat/data.lmdb   DIR/val_ood_both/data.lmdb

Each record holds ``atomic_numbers`` ``[N]``, ``pos`` (the initial structure) and
``pos_relaxed`` ``[N, 3]``, ``cell`` ``[1, 3, 3]``, ``tags`` ``[N]`` (0 fixed subsurface, 1
surface, 2 adsorbate) and ``y_relaxed`` (the relaxed energy, eV). Records are plain pickles:
they are read only through :func:`graphormer.safe_io.loads_records`, which rebuilds the PyG,
torch, numpy and builtin classes such records hold and refuses any other, never with
``pickle.load``. ``lmdb`` is an optional dependency (``pip install 'graphormer[oc20]'``).

Each structure becomes a graph as :mod:`~graphormer.data.sources.ase`'s frames do (the element,
positions, tags, periodic images within ``pbc_cutoff`` of the adsorbate), the relaxed energy its
target and the position change of the moving atoms (``pos_relaxed - pos``, tag > 0) its per-atom
vector target ``position_change``. Training validates on ``val_id``; every validation folder
present is a split of its own, scored by ``eval.py split=all`` (or ``split=val_ood_ads``).
"""

from __future__ import annotations

import os.path as osp
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch
from torch_geometric.data import Data, InMemoryDataset

from graphormer.data.periodic import PBC_CUTOFF, checked_around, checked_cutoff, with_images
from graphormer.data.sources.ase import ELEMENTS, POSITION_CHANGE, StructureSource
from graphormer.data.sources.base import LoadedDataset
from graphormer.data.sources.graph_cache import GraphCache, input_digest
from graphormer.data.sources.lmdb_files import lmdb_module, open_lmdb
from graphormer.data.sources.pyg_file import GraphFile, InMemoryGraphs
from graphormer.data.structure import StructuralFeatures
from graphormer.data.tasks import user_task
from graphormer.errors import ConfigError, DataError
from graphormer.safe_io import RefusedClassError, loads_records

__all__ = ["OC20_SPLITS", "Oc20Source", "read_lmdb_records"]

# OC20's IS2RE folders with labels, in the order they are reported (Microsoft's --valid-subset).
VALIDATION_FOLDERS = ("val_id", "val_ood_ads", "val_ood_cat", "val_ood_both")
OC20_SPLITS = ("train", *VALIDATION_FOLDERS)
# What an IS2RE record must hold.
_FIELDS = ("atomic_numbers", "pos", "cell", "tags")


def read_lmdb_records(path: str) -> list[dict]:
    """Every record of an OC20 LMDB file (``data.lmdb``), in the order of their integer keys,
    as plain dicts of its fields (tensors, numbers).

    Raises:
        ConfigError: ``lmdb`` is not installed.
        DataError: the file is not an LMDB of integer-keyed records, or a record holds a class
            outside the allow-list (named, never run).
    """
    records = []
    with open_lmdb(path) as txn:
        keyed = []
        for key, value in txn.cursor():
            if key == b"length":  # fairchem's newer files also store the count
                continue
            try:
                keyed.append((int(key.decode("ascii")), value))
            except ValueError as error:
                raise DataError(
                    f"{path}: the key {key[:40]!r} is not a record number; OC20's IS2RE "
                    "LMDBs key each record by its index (0, 1, ...)"
                ) from error
        for index, value in sorted(keyed, key=lambda pair: pair[0]):
            try:
                record = loads_records(value)
            except RefusedClassError as error:
                raise DataError(
                    f"{path}: record {index} holds an object of class {error}, not only PyG "
                    "Data, tensors, numpy arrays and plain values: refused (it is never "
                    "unpickled); OC20's released files hold only those"
                ) from error
            except Exception as error:  # damage: pickle raises many kinds
                raise DataError(
                    f"{path}: record {index} cannot be read ({type(error).__name__}: {error})"
                ) from error
            records.append(_fields(record, path, index))
    return records


def _fields(record, path: str, index: int) -> dict:
    """A record's fields: a PyG 2 ``Data``'s store, a PyG 1 ``Data``'s attributes, or a dict."""
    if isinstance(record, Data):
        stored = record.__dict__
        fields = dict(record.to_dict()) if "_store" in stored else dict(stored)
    elif isinstance(record, dict):
        fields = dict(record)
    else:
        raise DataError(
            f"{path}: record {index} is a {type(record).__name__}, not a PyG Data of one structure"
        )
    missing = [key for key in _FIELDS if fields.get(key) is None]
    if missing:
        raise DataError(
            f"{path}: record {index} lacks {missing} (it holds {sorted(fields)}); an IS2RE "
            "record holds atomic_numbers, pos, pos_relaxed, cell, tags and y_relaxed"
        )
    return fields


def record_graph(
    fields: dict,
    target: str,
    position_change: bool,
    pbc: Sequence[bool],
    pbc_cutoff: float,
    where: str,
    pbc_around: str = "adsorbate",
) -> Data:
    """One IS2RE record as a graph (see the module's docstring)."""
    numbers = np.asarray(fields["atomic_numbers"], dtype=np.float64).reshape(-1).round()
    numbers = numbers.astype(np.int64)
    if len(numbers) == 0 or numbers.min() < 1 or numbers.max() > ELEMENTS - 1:
        raise DataError(f"{where}: no atoms, or an element outside 1-118")
    pos = torch.as_tensor(np.asarray(fields["pos"], dtype=np.float32)).view(-1, 3)
    value = fields.get(target)
    y = float("nan") if value is None else float(np.asarray(value, dtype=np.float64).reshape(()))
    graph = Data(
        x=torch.from_numpy(numbers - 1).view(-1, 1),
        edge_index=torch.zeros(2, 0, dtype=torch.long),
        edge_attr=torch.zeros(0, 1, dtype=torch.long),
        pos=pos,
        y=torch.tensor([[y]], dtype=torch.float32),
        num_nodes=len(numbers),
    )
    tags = np.asarray(fields["tags"], dtype=np.int64).reshape(-1)
    if position_change:
        change = torch.full((len(numbers), 1, 3), float("nan"))
        relaxed = fields.get("pos_relaxed")
        if relaxed is not None:
            moved = torch.as_tensor(np.asarray(relaxed, dtype=np.float32)).view(-1, 3) - pos
            change[:, 0] = torch.where(torch.from_numpy(tags > 0)[:, None], moved, change[:, 0])
        graph.y_atom_vector = change
    cell = np.asarray(fields["cell"], dtype=np.float64).reshape(3, 3)
    pbc = np.asarray(pbc, dtype=bool)
    return with_images(graph, cell, pbc, tags, pbc_cutoff, where, pbc_around)


class Oc20Source(StructureSource):
    """OC20's IS2RE LMDB folders (see the module's docstring).

    Args:
        path (str): the folder holding ``train/`` and the validation folders.
        target (str, optional): the record field of the energy. (default: :obj:`"y_relaxed"`)
        position_change (bool, optional): the moving atoms' relaxed minus initial positions as
            the per-atom vector target ``position_change`` (Graphormer-3D's auxiliary
            target). (default: :obj:`True`)
        pbc (Sequence[bool], optional): the periodic cell directions (OC20's slabs: x and y).
            (default: :obj:`(True, True, False)`)
        pbc_cutoff (float, optional): periodic images within this many Angstrom of an adsorbate
            atom (of any atom with ``pbc_around="all"``) join as extra nodes. (default:
            :obj:`8.0`, Microsoft's)
        pbc_around (str, optional): ``adsorbate`` (Microsoft's) or ``all``: images near every
            atom instead. (default: :obj:`"adsorbate"`)
        metric (str, optional): ``mae`` (OC20's) or ``rmse``. (default: :obj:`"mae"`)
        root (str, optional): cache folder. (default: :obj:`"data"`)
        name (str, optional): label used in outputs. (default: :obj:`"oc20"`)
    """

    official_split = "OC20's train and validation folders"

    def __init__(
        self,
        path: str,
        target: str = "y_relaxed",
        position_change: bool = True,
        pbc: Sequence[bool] = (True, True, False),
        pbc_cutoff: float = PBC_CUTOFF,
        metric: str = "mae",
        root: str = "data",
        name: str = "oc20",
        pbc_around: str = "adsorbate",
    ) -> None:
        pbc = [bool(p) for p in pbc]
        if len(pbc) != 3:
            raise ConfigError(f"dataset.pbc={pbc} is not allowed: three booleans (x, y, z)")
        task = user_task(
            name,
            "regression",
            metric,
            1,
            None,
            {"regression": ("mae", "rmse")},
            atom_vector_tasks=int(bool(position_change)),
        )
        # OC20's energy within threshold beside the MAE.
        self._task = replace(task, reported=("ewt",) if task.metric == "mae" else ())
        self.path = str(path)
        self.target = str(target)
        self.position_change = bool(position_change)
        self.pbc = pbc
        self.pbc_cutoff = checked_cutoff(pbc_cutoff)
        self.pbc_around = checked_around(pbc_around)
        self.root = root
        self.name = name
        self._graphs: GraphFile | None = None
        self._graph_cache: GraphCache | None = None

    def task_names(self) -> list[str]:
        return [self.target]

    def atom_vector_task_names(self) -> list[str]:
        return [POSITION_CHANGE] if self.position_change else []

    def smiles_refusal(self) -> str:
        return (
            f"was trained on OC20's structures ({self.path}), not on molecules from SMILES: "
            "predict structures with predict.py input=FILE.extxyz (or .db, .traj)"
        )

    def folders(self) -> list[str]:
        """The split folders present (train first), each holding ``data.lmdb``.

        Raises:
            ConfigError: ``lmdb`` is missing.
            DataError: ``path`` is not a folder, or it has no ``train/data.lmdb`` or no
                validation folder (the layout is named).
        """
        lmdb_module()
        if not osp.isdir(self.path):
            raise DataError(f"dataset.path={self.path!r} is not a folder; {_LAYOUT}")
        present = [s for s in OC20_SPLITS if osp.isfile(self._file(s))]
        if "train" not in present or len(present) < 2:
            raise DataError(
                f"dataset.path={self.path} holds {present or 'no split folders'}, not the "
                f"layout of OC20's IS2RE LMDBs; {_LAYOUT}"
            )
        return present

    def _file(self, split: str) -> str:
        return osp.join(self.path, split, "data.lmdb")

    def graphs(self) -> GraphFile:
        """Every present folder's graphs, read once (cached by the files' content)."""
        if self._graphs is None:
            self._graphs, _ = self._cache().graphs(self._read, GraphFile)
        return self._graphs

    def _read(self) -> tuple[GraphFile, dict]:
        graphs, splits = [], []
        for split in self.folders():
            path = self._file(split)
            for index, fields in enumerate(read_lmdb_records(path)):
                where = f"dataset.path={self.path}: {split} record {index}"
                graphs.append(
                    record_graph(
                        fields,
                        self.target,
                        self.position_change,
                        self.pbc,
                        self.pbc_cutoff,
                        where,
                        self.pbc_around,
                    )
                )
                splits.append(split)
        data, slices = InMemoryDataset.collate(graphs)
        return GraphFile(data, slices, splits, [ELEMENTS], [1], 0, 0), {}

    def _cache(self) -> GraphCache:
        if self._graph_cache is None:
            files = [self._file(s) for s in self.folders()]
            settings = ["oc20", self.target, self.position_change, self.pbc, self.pbc_cutoff]
            if self.pbc_around != "adsorbate":  # only when set: earlier caches keep their names
                settings.append(self.pbc_around)
            digest = input_digest(files, settings)
            self._graph_cache = GraphCache(osp.join(self.root, "oc20", digest))
        return self._graph_cache

    def load(self, pre_transform: StructuralFeatures | None = None) -> LoadedDataset:
        graphs = self.graphs()
        dataset = InMemoryGraphs.structured(graphs, self._cache(), pre_transform)
        names = np.asarray(graphs.splits)
        split = {name: torch.from_numpy(np.flatnonzero(names == name)) for name in OC20_SPLITS}
        split = {name: index for name, index in split.items() if len(index)}
        folders = [name for name in VALIDATION_FOLDERS if name in split]
        # Training validates (and selects checkpoints) on the in-domain folder, or the first
        # present; eval.py scores every folder on its own.
        split["valid"] = split[folders[0]]
        return LoadedDataset(
            dataset, split, self.task_info(), ("train", "valid", *folders), evaluated=tuple(folders)
        )


_LAYOUT = (
    "give the folder of OC20's IS2RE LMDBs: DIR/train/data.lmdb and one or more of "
    "DIR/val_id, val_ood_ads, val_ood_cat, val_ood_both (each with data.lmdb)"
)
