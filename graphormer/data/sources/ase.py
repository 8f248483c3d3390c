"""Structures any ASE reader takes: extended XYZ, ASE's ``.db``, ``.traj``
(``dataset=ase dataset.path=FILE``), for models that read atom positions (``model.channels=3d``).

Each frame becomes one graph without bonds: ``x`` ``[N, 1]`` the element (atomic number - 1, the
first column of OGB's atom features, so that the distance encoding's atom types agree with
molecules from SMILES), ``pos`` ``[N, 3]`` in Angstrom, ``y`` ``[1, T]`` from the frames'
``info`` keys or their stored calculator results (``energy``), NaN where a frame lacks one, and
per-atom vectors (``forces``, or any ``arrays`` key) as ``y_atom_vector`` ``[N, T_vec, 3]``.
A periodic frame (``pbc`` along any cell vector) also gets its periodic images as extra nodes
(:mod:`graphormer.data.periodic`), and a frame with ASE ``tags`` its atoms' tags. ASE is an
optional dependency (``pip install 'graphormer[3d]'``).
"""

from __future__ import annotations

import os.path as osp
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Data, InMemoryDataset

from graphormer.data.periodic import PBC_CUTOFF, checked_around, checked_cutoff, with_images
from graphormer.data.sources.base import LoadedDataset, Source
from graphormer.data.sources.graph_cache import GraphCache, input_digest
from graphormer.data.sources.lmdb_files import lmdb_module, open_lmdb
from graphormer.data.sources.pyg_file import GraphFile, InMemoryGraphs
from graphormer.data.splits import column_split, file_split, file_split_setting, random_split
from graphormer.data.structure import StructuralFeatures
from graphormer.data.tasks import user_task
from graphormer.errors import ConfigError, DataError

__all__ = [
    "ELEMENTS",
    "STRUCTURE_SUFFIXES",
    "AseSource",
    "StructureSource",
    "element_molecules",
    "read_structures",
    "structure_graphs",
    "structures_to_graphs",
]

# The structure files this source reads (what predict.py's input= takes as structures).
STRUCTURE_SUFFIXES = (".extxyz", ".xyz", ".db", ".traj", ".aselmdb")

# Atom types: atomic numbers 1-118 as OGB's first atom feature (Z - 1) holds them, plus its
# "misc" entry; the model's element table has these rows.
ELEMENTS = 119

SPLITS = ("random", "column", "file")

# The per-atom vector target of ``relaxed_positions`` (IS2RE's relaxed minus initial positions).
POSITION_CHANGE = "position_change"


def read_structures(path: str, key: str = "dataset.path") -> list:
    """Every frame of ``path`` as ASE ``Atoms`` (``ase.io.read(path, index=":")``; an ASE
    database's rows with their key-value pairs in ``info``).

    Raises:
        ConfigError: ASE is not installed.
        DataError: the file is missing or ASE cannot read it.
    """
    read_structures_exists(path, key)
    import ase.io

    try:
        if path.endswith(".db"):
            frames = _read_database(path)
        elif path.endswith(".aselmdb"):
            frames = _read_aselmdb(path)
        else:
            frames = ase.io.read(path, index=":")
    except Exception as error:  # ASE raises many kinds for a file it cannot parse
        raise DataError(
            f"{key}={path}: ASE cannot read it ({type(error).__name__}: {error}); give "
            "an extended XYZ, ASE .db or .traj file"
        ) from error
    if not isinstance(frames, list):
        frames = [frames]
    if not frames:
        raise DataError(f"{key}={path} holds no structures")
    return frames


def element_molecules(graphs: Sequence[Data]) -> list:
    """Each structure's atoms as an RDKit molecule without bonds (elements only, in file
    order): what the long layout of a prediction describes its atoms by."""
    from rdkit import Chem

    molecules = []
    for graph in graphs:
        mol = Chem.RWMol()
        x = graph.x
        if graph.get("image_of") is not None:  # periodic images are not atoms of the frame
            x = x[graph.image_of < 0]
        for number in (x[:, 0] + 1).tolist():  # the first atom feature holds Z - 1
            mol.AddAtom(Chem.Atom(int(number) if number < ELEMENTS else 0))
        molecules.append(mol.GetMol())
    return molecules


def structure_graphs(
    path: str, key: str = "input", pbc_cutoff: float = PBC_CUTOFF, pbc_around: str = "adsorbate"
) -> list[Data]:
    """Every frame of a structure file as a graph to predict (elements and positions, periodic
    images within ``pbc_cutoff`` of the atoms ``pbc_around`` names; no targets), in file
    order."""
    where = f"{key}={path}"
    frames = read_structures(path, key)
    return structures_to_graphs(frames, [], [], where, pbc_cutoff=pbc_cutoff, pbc_around=pbc_around)


def _read_database(path: str) -> list:
    """The rows of an ASE database, each row's key-value pairs in its ``info`` (``ase.io.read``
    drops them)."""
    import ase.db

    frames = []
    with ase.db.connect(path, serial=True) as db:
        for row in db.select():
            atoms = row.toatoms()
            atoms.info.update(row.key_value_pairs)
            frames.append(atoms)
    return frames


# The entries of fairchem's ASE-LMDB files that are not rows.
_ASELMDB_RESERVED = (b"nextid", b"deleted_ids", b"metadata")


def _read_aselmdb(path: str) -> list:
    """The rows of fairchem's ASE-LMDB file (``*.aselmdb``), in the order of their ids: each
    value is zlib-compressed JSON in ASE's encoding (``ase.io.jsonio``, which builds arrays and
    a fixed set of ASE objects, never code), a row of an ASE database with its key-value pairs
    in ``info``."""
    import zlib

    from ase.db.row import AtomsRow
    from ase.io.jsonio import decode

    rows = []
    with open_lmdb(path) as txn:
        for key, value in txn.cursor():
            if key in _ASELMDB_RESERVED:
                continue
            row = AtomsRow(decode(zlib.decompress(value).decode("utf-8")))
            atoms = row.toatoms()
            atoms.info.update(row.key_value_pairs)
            rows.append((int(key.decode("ascii")), atoms))
    return [atoms for _, atoms in sorted(rows, key=lambda pair: pair[0])]


def _frame_value(atoms, key: str) -> Any:
    """A frame's ``info[key]``, else its stored calculator result ``key``, else None."""
    if key in atoms.info:
        return atoms.info[key]
    calc = atoms.calc
    if calc is not None and key in getattr(calc, "results", {}):
        return calc.results[key]
    return None


def _atom_value(atoms, key: str) -> Any:
    """A frame's per-atom ``arrays[key]``, else its calculator result ``key`` (forces)."""
    if key in atoms.arrays:
        return atoms.arrays[key]
    return _frame_value(atoms, key)


def structures_to_graphs(
    frames: Sequence,
    targets: Sequence[str],
    atom_vector_targets: Sequence[str],
    where: str,
    pbc_cutoff: float = PBC_CUTOFF,
    relaxed_positions: str | None = None,
    pbc_around: str = "adsorbate",
) -> list[Data]:
    """One bond-less graph per frame (see the module's docstring).

    ``relaxed_positions`` names an ``arrays`` key holding each atom's relaxed position
    (IS2RE): the last per-atom vector target becomes ``relaxed - initial`` of the atoms that
    move (tag > 0 when the frame has tags; NaN for fixed atoms).

    Raises:
        DataError: a periodic frame with a cell of zero volume or an atom outside it, an
            element outside 1-118, a target no frame holds, a non-numeric target, or a
            per-atom vector not shaped ``[N, 3]``.
    """
    pbc_around = checked_around(pbc_around)
    graphs = []
    found = dict.fromkeys([*targets, *atom_vector_targets], False)
    if relaxed_positions:
        found[relaxed_positions] = False
    for index, atoms in enumerate(frames):
        numbers = np.asarray(atoms.numbers, dtype=np.int64)
        if len(numbers) == 0 or numbers.min() < 1 or numbers.max() > ELEMENTS - 1:
            raise DataError(f"{where}: frame {index} has no atoms, or an element outside 1-118")
        y = np.full(len(targets), np.nan, dtype=np.float32)
        for j, key in enumerate(targets):
            value = _frame_value(atoms, key)
            if value is None:
                continue
            try:
                y[j] = float(np.asarray(value, dtype=np.float64).reshape(()))
            except (TypeError, ValueError) as error:
                raise DataError(
                    f"{where}: frame {index}'s {key!r} is {value!r}, not one number; "
                    "dataset.targets names scalar info keys or the calculator's energy"
                ) from error
            found[key] = True
        width = len(atom_vector_targets) + bool(relaxed_positions)
        vectors = np.full((len(numbers), width, 3), np.nan, dtype=np.float32)
        for j, key in enumerate(atom_vector_targets):
            value = _atom_value(atoms, key)
            if value is None:
                continue
            value = np.asarray(value, dtype=np.float64)
            if value.shape != (len(numbers), 3):
                raise DataError(
                    f"{where}: frame {index}'s {key!r} has shape {value.shape}, not "
                    f"[{len(numbers)}, 3] (one 3-vector per atom)"
                )
            vectors[:, j] = value
            found[key] = True
        tags = atoms.arrays.get("tags")
        if relaxed_positions:
            relaxed = atoms.arrays.get(relaxed_positions)
            if relaxed is not None:
                moves = np.ones(len(numbers), dtype=bool) if tags is None else tags > 0
                change = np.asarray(relaxed, dtype=np.float64) - atoms.positions
                vectors[:, -1] = np.where(moves[:, None], change, np.nan)
                found[relaxed_positions] = True
        graph = Data(
            x=torch.from_numpy(numbers - 1).view(-1, 1),
            edge_index=torch.zeros(2, 0, dtype=torch.long),
            edge_attr=torch.zeros(0, 1, dtype=torch.long),
            pos=torch.from_numpy(np.asarray(atoms.positions, dtype=np.float32)),
            y=torch.from_numpy(y).view(1, -1),
            num_nodes=len(numbers),
        )
        if vectors.shape[1]:
            graph.y_atom_vector = torch.from_numpy(vectors)
        if np.any(atoms.pbc):
            graph = with_images(
                graph,
                atoms.cell.array,
                atoms.pbc,
                tags,
                pbc_cutoff,
                f"{where}: frame {index}",
                pbc_around,
            )
        elif tags is not None:
            graph.tags = torch.from_numpy(np.asarray(tags, dtype=np.int64))
        graphs.append(graph)
    missing = [key for key, seen in found.items() if not seen]
    if missing:
        raise DataError(
            f"{where}: no frame holds {missing} (in info, arrays or the stored calculator "
            f"results; frame 0 has info {sorted(frames[0].info)} and arrays "
            f"{sorted(frames[0].arrays)}): check dataset.targets / dataset.atom_vector_targets"
        )
    return graphs


class StructureSource(Source):
    """A source of atomic structures (a structure file, OC20's LMDBs): each atom's one feature
    is its element, every graph has positions, and periodic structures gain their images within
    ``self.pbc_cutoff``."""

    pbc_cutoff: float

    def feature_dims(self) -> tuple[list[int], list[int]]:
        return [ELEMENTS], [1]

    def categorical_columns(
        self,
        counts: tuple[int, int] | None = None,  # noqa: ARG002
    ) -> tuple[list[int], list[int]]:
        return [0], [0]

    def has_positions(self) -> bool:
        return True

    def periodic_cutoff(self) -> float:
        return self.pbc_cutoff

    def periodic_around(self) -> str:
        return self.pbc_around


class AseSource(StructureSource):
    """Structures from any file ASE reads, with scalar targets per frame.

    Args:
        path (str): the file (extended XYZ, ASE ``.db``, ``.traj``; all frames are read).
        targets (Sequence[str], optional): per-frame targets: ``info`` keys, or results the
            file stores from a calculator (``energy``). (default: :obj:`("energy",)`)
        atom_vector_targets (Sequence[str], optional): per-atom 3-vectors (``forces``, or an
            ``arrays`` key), kept on each graph as ``y_atom_vector`` and trained by the vector
            head (``model.atom_vector_tasks``). (default: :obj:`()`)
        task_type (str, optional): ``regression`` (the only one for now). (default:
            :obj:`"regression"`)
        metric (str | None, optional): ``rmse`` (default) or ``mae``.
        split (str, optional): ``random``, ``column`` (each frame's ``info[split_column]``
            names train, valid or test) or ``file`` (frames listed per split in
            ``split_file``). (default: :obj:`"random"`)
        split_ratios (Sequence[float], optional): train/valid/test fractions of ``random``.
        split_seed (int, optional): its seed. (default: :obj:`0`)
        split_column (str | None, optional): the ``info`` key of ``split="column"``.
        split_file (str | None, optional): a JSON file ``{"train": [frames], ...}`` of 0-based
            frame numbers; given, it implies ``split="file"``.
        root (str, optional): cache folder. (default: :obj:`"data"`)
        name (str, optional): label used in outputs. (default: :obj:`"ase"`)
        pbc_cutoff (float, optional): a periodic frame's images within this many Angstrom of
            an adsorbate atom (tag 2), or of any atom without tags or with ``pbc_around="all"``,
            become extra nodes. (default: :obj:`8.0`, Microsoft's OC20 recipe)
        relaxed_positions (str | None, optional): an ``arrays`` key holding each atom's
            relaxed position (IS2RE): the change from the frame's positions becomes the per-atom
            vector target ``position_change`` of the atoms that move (tag > 0). (default: None)
        reported (Sequence[str], optional): metrics logged beside ``metric``: ``ewt`` (OC20's
            energy within 0.02 of the label). (default: :obj:`()`)
        pbc_around (str, optional): ``adsorbate``: images near the adsorbate atoms when a
            frame has any (Microsoft's), else near every atom; ``all``: near every atom, so
            that each atom sees its whole periodic neighbourhood (a slab's total energy and
            every atom's force). (default: :obj:`"adsorbate"`)
    """

    _METRICS = {"regression": ("rmse", "mae")}

    def __init__(
        self,
        path: str,
        targets: Sequence[str] = ("energy",),
        atom_vector_targets: Sequence[str] = (),
        task_type: str = "regression",
        metric: str | None = None,
        split: str = "random",
        split_ratios: Sequence[float] = (0.8, 0.1, 0.1),
        split_seed: int = 0,
        split_column: str | None = None,
        split_file: str | None = None,
        root: str = "data",
        name: str = "ase",
        pbc_cutoff: float = PBC_CUTOFF,
        relaxed_positions: str | None = None,
        reported: Sequence[str] = (),
        pbc_around: str = "adsorbate",
    ) -> None:
        targets = [targets] if isinstance(targets, str) else list(targets or ())
        if isinstance(atom_vector_targets, str):
            atom_vector_targets = [atom_vector_targets]
        if not targets:
            raise ConfigError(
                "dataset.targets is empty: name at least one per-frame target (an info key, "
                "or energy from the stored calculator results)"
            )
        split = file_split_setting(split, split_file, "random")
        if split not in SPLITS:
            raise ConfigError(f"dataset.split must be one of {', '.join(SPLITS)}, got {split!r}")
        if split == "column" and not split_column:
            raise ConfigError(
                "dataset.split=column needs dataset.split_column=KEY (an info key holding "
                "train, valid or test for each frame)"
            )
        self.pbc_cutoff = checked_cutoff(pbc_cutoff)
        self.pbc_around = checked_around(pbc_around)
        self.relaxed_positions = str(relaxed_positions) if relaxed_positions else None
        self._task = user_task(
            name,
            task_type,
            metric,
            len(targets),
            None,
            self._METRICS,
            atom_vector_tasks=len(atom_vector_targets or ()) + bool(self.relaxed_positions),
        )
        if reported:
            # One name on the command line (dataset.reported=ewt) is a string, not its letters.
            reported = [reported] if isinstance(reported, str) else list(reported)
            try:
                self._task = replace(self._task, reported=tuple(reported))
            except ValueError as error:
                raise ConfigError(f"dataset.reported={list(reported)}: {error}") from error
        self.path = str(path)
        self.targets = [str(t) for t in targets]
        self.atom_vector_targets = [str(t) for t in atom_vector_targets or ()]
        self._keep_split(split, split_ratios, split_seed, split_file, split_column)
        self.root = root
        self.name = name
        self._graphs: GraphFile | None = None
        self._graph_cache: GraphCache | None = None

    def task_names(self) -> list[str]:
        return list(self.targets)

    def atom_vector_task_names(self) -> list[str]:
        """The per-atom vector targets (``forces``; ``position_change`` last with
        ``relaxed_positions``)."""
        return self.atom_vector_targets + [POSITION_CHANGE] * bool(self.relaxed_positions)

    def smiles_refusal(self) -> str:
        return (
            f"was trained on structures from a file ({self.path}), which carry positions, not "
            "on molecules featurised from SMILES: predict structures with predict.py "
            "input=FILE.extxyz (or .db, .traj)"
        )

    def graphs(self) -> GraphFile:
        """The file's graphs, read once (from the cache when an earlier run read this file's
        content with these settings)."""
        if self._graphs is None:
            self._graphs, _ = self._cache().graphs(self._read, GraphFile)
        return self._graphs

    def _read(self) -> tuple[GraphFile, dict]:
        where = f"dataset.path={self.path}"
        frames = read_structures(self.path)
        graphs = structures_to_graphs(
            frames,
            self.targets,
            self.atom_vector_targets,
            where,
            self.pbc_cutoff,
            self.relaxed_positions,
            self.pbc_around,
        )
        splits = None
        if self.split == "column":
            splits = [str(atoms.info.get(self.split_column, "")) for atoms in frames]
        data, slices = InMemoryDataset.collate(graphs)
        return GraphFile(data, slices, splits, [ELEMENTS], [1], 0, 0), {}

    def _cache(self) -> GraphCache:
        # Named once: the name hashes the whole file.
        if self._graph_cache is None:
            read_structures_exists(self.path)
            settings = ["ase", self.targets, self.atom_vector_targets, self.split_column]
            if self.relaxed_positions or self.pbc_cutoff != PBC_CUTOFF:
                # Only when set: caches of files read before keep their names.
                settings += [self.pbc_cutoff, self.relaxed_positions]
            if self.pbc_around != "adsorbate":
                settings.append(self.pbc_around)
            digest = input_digest([self.path], settings)
            stem = osp.splitext(osp.basename(self.path))[0]
            self._graph_cache = GraphCache(osp.join(self.root, "ase", f"{stem}_{digest}"))
        return self._graph_cache

    def load(self, pre_transform: StructuralFeatures | None = None) -> LoadedDataset:
        task = self.task_info()
        graphs = self.graphs()
        dataset = InMemoryGraphs.structured(graphs, self._cache(), pre_transform)
        n = graphs.num_graphs
        if self.split == "file":
            split = file_split(self.split_file, n, range(n), unit="graph")
        elif self.split == "column":
            split = column_split(graphs.splits, range(n), self.split_column)
        else:
            split = random_split(n, self.split_ratios, self.split_seed)
        return LoadedDataset(dataset, split, task)


def read_structures_exists(path: str, key: str = "dataset.path") -> None:
    """ASE is installed and ``path`` exists (before a cache is named by its content)."""
    try:
        import ase  # noqa: F401
    except ImportError as error:
        raise ConfigError(
            "dataset=ase reads structure files with ASE, which is not installed: "
            "pip install 'graphormer[3d]' (or pip install ase)"
        ) from error
    if not osp.isfile(path):
        raise DataError(
            f"{key}={path!r} does not exist; give an extended XYZ, ASE .db or .traj file"
        )
    if path.endswith(".aselmdb"):
        lmdb_module()  # one error naming the extra, before the file is read
