"""A user's own molecules from a CSV of SMILES, featurised exactly like OGB's molecule datasets."""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import logging
import os.path as osp
import warnings
import zlib
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
from rdkit.Chem.Scaffolds import MurckoScaffold
from torch_geometric.data import InMemoryDataset

from graphormer.data.conformers import (
    RandomConformer,
    check_conformer_settings,
    embed_many,
    unembedded_message,
)
from graphormer.data.descriptors import (
    ANALOGUE_MAX_MOLECULES,
    ANALOGUE_SIMILARITY,
    ATOM_DESCRIPTORS,
    MoleculeFeatures,
    analogue_features,
    atom_descriptor_values,
    auxiliary_atoms_apply,
    morgan_count_values,
    over_analogue_cap,
    rdkit2d_names,
    rdkit2d_values,
    require_columns,
)
from graphormer.data.featurize import featurize_smiles, molecule_bond_edges
from graphormer.data.sources.base import LoadedDataset, Source
from graphormer.data.sources.folders import check_pyg_markers, corrupt_cache_message
from graphormer.data.splits import (
    column_split,
    file_split,
    file_split_setting,
    group_split,
    random_split,
)
from graphormer.data.structure import StructuralFeatures, add_structural_features
from graphormer.data.tasks import (
    ATOM,
    BOND,
    Level,
    TaskInfo,
    check_class_labels,
    user_task,
    warn_absent_classes,
)
from graphormer.errors import ConfigError, DataError
from graphormer.safe_io import PYG_DATA, allow, load_data

log = logging.getLogger(__name__)

__all__ = ["SmilesCsvDataset", "SmilesCsvSource", "load_cache", "resolve_path"]

_SHOWN_ROWS = 5


class SmilesCsvDataset(InMemoryDataset):
    """Molecules from ``path`` (a CSV with a SMILES column and target columns).

    Each SMILES goes through ``ogb.utils.smiles2graph`` (9 atom and 3 bond categorical features,
    as in OGB). Missing targets (empty cells, NaN) are kept as NaN and masked by the loss and the
    metrics. Rows whose SMILES rdkit cannot parse, or that have no atoms, are skipped with one
    warning that counts them and names the first rows; every graph keeps its CSV row in ``row``
    so labels stay aligned.

    Args:
        path (str): the CSV file.
        smiles_column (str): column holding SMILES.
        targets (Sequence[str]): target columns.
        root (str): cache folder; processed files go under ``root/smiles_csv/<name>``.
        pre_transform (StructuralFeatures | None): structural preprocessing, cached.
        columns (Sequence[str] | None): column names of a CSV without a header row.
        comment (str | None): lines starting with this character are skipped.
        atom_targets (Sequence[str]): columns of per-atom targets (issue #18): each cell a list
            ``[0.12, -0.30, ...]`` of one number per atom in RDKit's atom order (hydrogens
            implicit); an empty cell or a ``nan`` entry is a missing label. Stored per graph as
            ``y_atom`` ``[num_nodes, len(atom_targets)]``.
        bond_targets (Sequence[str]): columns of per-bond targets, the same way: one number per
            bond in RDKit's bond order. Stored per graph as ``y_bond``
            ``[num_bonds, len(bond_targets)]`` and ``bond_edge`` (bond ``k`` is edge ``2k``).
        molecule_features (MoleculeFeatures | None): molecule-level input features (issue
            #22), stored raw per graph as ``molecule_features`` ``[1, D]`` (NaN = missing).
        descriptor_targets (bool): the targets are RDKit's 2D descriptors of each molecule
            (descriptor pre-training, issue #22), as ``sign(v) * log(1 + |v|)`` so that
            heavy-tailed ones (Ipc reaches 1e40) do not swamp the others; ``targets`` names them.
        atom_descriptor_targets (bool): the atom targets are RDKit's per-atom descriptors
            (:data:`~graphormer.data.descriptors.ATOM_DESCRIPTORS`, descriptor pre-training);
            ``atom_targets`` names them.
        conformers (str | None): ``"rdkit"``: atom positions from RDKit (ETKDGv3 + MMFF94,
            :mod:`graphormer.data.conformers`), stored as ``pos`` ``[num_nodes, 3]`` and, with
            several, ``conformers`` ``[num_nodes, C, 3]``; molecules RDKit cannot embed are
            left out with one warning. None: no positions.
        num_conformers (int): conformers kept per molecule (a random one each time a graph
            is read).
    """

    def __init__(
        self,
        path: str,
        smiles_column: str,
        targets: Sequence[str],
        root: str = "data",
        pre_transform: StructuralFeatures | None = None,
        columns: Sequence[str] | None = None,
        comment: str | None = None,
        atom_targets: Sequence[str] = (),
        bond_targets: Sequence[str] = (),
        molecule_features: MoleculeFeatures | None = None,
        descriptor_targets: bool = False,
        atom_descriptor_targets: bool = False,
        conformers: str | None = None,
        num_conformers: int = 1,
    ) -> None:
        path = resolve_path(path)
        if not osp.isfile(path):
            raise DataError(
                f"dataset.path={path!r} does not exist; give the path of a CSV file of SMILES"
            )
        if not targets and not atom_targets and not bond_targets:
            raise ConfigError(
                "dataset.targets is empty: name at least one target column (or atom / bond "
                "target columns in dataset.atom_targets / dataset.bond_targets)"
            )
        self.csv_path = osp.abspath(path)
        self.smiles_column = smiles_column
        self.targets = [str(t) for t in targets]
        self.atom_targets = [str(t) for t in atom_targets]
        self.bond_targets = [str(t) for t in bond_targets]
        self.columns = list(columns) if columns else None
        self.comment = comment
        self.molecule_features = molecule_features
        self.descriptor_targets = descriptor_targets
        self.atom_descriptor_targets = atom_descriptor_targets
        self.conformers = conformers
        self.num_conformers = num_conformers
        self.cache_key = pre_transform.cache_key if pre_transform is not None else "plain"
        # The cache is keyed by the file's content and the columns read, never by its name alone.
        with open(self.csv_path, "rb") as f:
            digest = hashlib.sha1(f.read())
        read = [smiles_column, self.targets, self.columns, comment]
        if self.atom_targets:  # so that caches made before atom targets keep their key
            read.append(self.atom_targets)
        if self.bond_targets:  # likewise before bond targets
            read.append({"bond_targets": self.bond_targets})
        if molecule_features is not None and molecule_features.enabled:  # likewise (#22)
            read.append(["molecule_features", molecule_features.names()])
        if descriptor_targets:
            read.append("descriptor_targets")
        if atom_descriptor_targets:
            read.append("atom_descriptor_targets")
        if conformers is not None:  # cached beside the graphs, keyed by how they were made
            read.append({"conformers": conformers, "num_conformers": num_conformers, "v": 1})
        digest.update(json.dumps(read).encode())
        stem = osp.splitext(osp.basename(path))[0]
        folder = osp.join(root, "smiles_csv", f"{stem}_{digest.hexdigest()[:12]}")
        allow(PYG_DATA)
        check_pyg_markers(osp.join(folder, "processed", self.cache_key))
        # Several conformers: a random one each time a graph is read (each epoch).
        transform = RandomConformer() if conformers is not None and num_conformers > 1 else None
        super().__init__(folder, transform=transform, pre_transform=pre_transform, log=False)
        # Not PyG's load(): when the safe load fails it unpickles the file in full, and a
        # dataset file is data, never code. `data` is InMemoryDataset's public setter.
        self.data, self.slices = load_cache(self.processed_paths[0])
        try:
            with open(self.processed_paths[1]) as f:
                meta = json.load(f)
            meta["skipped_rows"], meta["scaffolds"]  # noqa: B018  (both must be there)
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise DataError(corrupt_cache_message(self.processed_paths[1], error)) from error
        self.skipped_rows: list[int] = meta["skipped_rows"]
        # Bemis-Murcko scaffold of each kept molecule, computed once while processing.
        self.scaffolds: list[str] = meta["scaffolds"]
        if self.skipped_rows:
            warnings.warn(_skipped_message(self.csv_path, self.skipped_rows), stacklevel=2)
        unembedded = meta.get("unembedded", [])
        if unembedded:
            rows = [row for row, _ in unembedded]
            smiles = [smiles for _, smiles in unembedded]
            warnings.warn(unembedded_message(self.csv_path, rows, smiles), stacklevel=2)

    @property
    def raw_file_names(self) -> list[str]:
        return []

    @property
    def processed_dir(self) -> str:
        return osp.join(self.root, "processed", self.cache_key)

    @property
    def processed_file_names(self) -> list[str]:
        return ["graphs.pt", "meta.json"]

    def download(self) -> None:
        pass

    def read_table(self) -> pd.DataFrame:
        """The CSV as a table, every row in order (the rows graphs' ``row`` counts)."""
        return self._read()

    def _read(self) -> pd.DataFrame:
        return read_csv_table(self.csv_path, self.columns, self.comment)

    def _refuse_duplicate_columns(self, table: pd.DataFrame) -> None:
        # pandas renames a repeated header name to name.1 and reads the first silently (#20).
        names = (
            [str(c) for c in self.columns] if self.columns else _header(self.csv_path, self.comment)
        )
        wanted = {str(c) for c in [self.smiles_column, *self._read_columns()]}
        repeated = sorted({n for n in names if names.count(n) > 1 and n in wanted})
        if repeated:
            raise DataError(
                f"{self.csv_path} has more than one column named {', '.join(map(repr, repeated))}: "
                "which one to use is ambiguous; rename the columns so that each name is unique"
            )

    def _read_columns(self) -> list[str]:
        """The columns read besides SMILES: targets (unless computed), atom and bond targets,
        features."""
        targets = [] if self.descriptor_targets else self.targets
        features = self.molecule_features.columns if self.molecule_features else []
        return [*targets, *self._atom_columns, *self.bond_targets, *features]

    @property
    def _atom_columns(self) -> list[str]:
        """The atom target columns read from the CSV (none when RDKit computes them)."""
        return [] if self.atom_descriptor_targets else self.atom_targets

    def _atom_labels(
        self,
        atom_lists: list[list[list[float] | None]],
        row: int,
        atoms: int,
        smiles: str,
        level: str = "atom",
    ) -> torch.Tensor:
        """``[atoms, T_atom]`` labels of one molecule (NaN = missing); with ``level="bond"``
        ``[bonds, T_bond]`` of the bond targets."""
        columns = self.atom_targets if level == "atom" else self.bond_targets
        y = torch.full((atoms, len(columns)), float("nan"))
        for t, (column, lists) in enumerate(zip(columns, atom_lists, strict=True)):
            values = lists[row]
            if values is None:  # an empty cell: no atom (bond) of this molecule is labelled
                continue
            if len(values) != atoms:
                raise DataError(
                    f"{level} target column {column!r} of {self.csv_path} lists {len(values)} "
                    f"value(s) at row {row} (0-based, header excluded), but its SMILES "
                    f"{smiles!r} has {atoms} {level}s: give one value per {level}, in RDKit's "
                    f"{level} order with hydrogens implicit (nan for an unlabelled {level})"
                )
            y[:, t] = torch.tensor(values, dtype=torch.float32)
        return y

    def process(self) -> None:
        table = self._read()
        self._refuse_duplicate_columns(table)
        require_columns(
            table,
            [self.smiles_column, *self._read_columns()],
            self.csv_path,
            role="",
            fix=". Set dataset.smiles_column / dataset.targets / dataset.atom_targets / "
            "dataset.bond_targets / dataset.feature_columns.",
        )
        atom_lists = [
            [
                _parse_list(cell, row, column, self.csv_path)
                for row, cell in enumerate(table[column])
            ]
            for column in self._atom_columns
        ]
        bond_lists = [
            [
                _parse_list(cell, row, column, self.csv_path, "bond")
                for row, cell in enumerate(table[column])
            ]
            for column in self.bond_targets
        ]
        smiles = table[self.smiles_column].tolist()
        features = None
        if self.molecule_features is not None and self.molecule_features.enabled:
            features = self.molecule_features.compute(smiles, table, self.csv_path)
        atom_values = atom_descriptor_values(smiles) if self.atom_descriptor_targets else None
        labels = np.empty((len(table), len(self.targets)), dtype=np.float32)
        if self.descriptor_targets:
            raw = rdkit2d_values(smiles)
            labels[:] = np.sign(raw) * np.log1p(np.abs(raw))  # NaN stays NaN (a missing label)
        for j, column in enumerate([] if self.descriptor_targets else self.targets):
            values = pd.to_numeric(table[column], errors="coerce")
            bad = values.isna() & table[column].notna()
            if bad.any():
                row = int(np.flatnonzero(bad.to_numpy())[0])
                raise DataError(
                    f"target column {column!r} of {self.csv_path} holds a non-numeric value "
                    f"{table[column].iloc[row]!r} at row {row}; targets must be numbers or empty"
                )
            array = values.to_numpy(dtype=np.float64)
            infinite = np.flatnonzero(np.isinf(array))
            if len(infinite):
                raise DataError(
                    f"target column {column!r} of {self.csv_path} holds infinite values at rows "
                    f"{_rows_text(infinite)}; fix or empty those cells (empty = missing label)"
                )
            if np.isnan(array).all():
                raise DataError(
                    f"target column {column!r} of {self.csv_path} has no values: every cell is "
                    "empty; check dataset.targets"
                )
            with np.errstate(over="ignore"):  # refused just below, with the rows
                labels[:, j] = array.astype(np.float32)
            overflow = np.flatnonzero(np.isinf(labels[:, j]))
            if len(overflow):
                raise DataError(
                    f"target column {column!r} of {self.csv_path} holds values too large for "
                    f"float32 (beyond ±3.4e38) at rows {_rows_text(overflow)}; fix or empty "
                    "those cells (empty = missing label), or rescale the column"
                )

        column = table[self.smiles_column].tolist()
        molecules = featurize_smiles(column)
        positions, unembedded = None, []
        if self.conformers is not None:
            parsed = [row for row, g in enumerate(molecules.graphs) if g is not None]
            embedded = embed_many([column[row] for row in parsed], self.num_conformers)
            positions = dict(zip(parsed, embedded, strict=True))
        graphs, skipped, scaffolds = [], [], []
        for row, graph in enumerate(molecules.graphs):
            if graph is None:
                skipped.append(row)
                continue
            if positions is not None:
                pos = positions[row]
                if pos is None or pos.shape[1] != graph.num_nodes:
                    unembedded.append([row, str(column[row])])
                    continue
                graph.pos = torch.from_numpy(pos[0])  # [N, 3]
                if self.num_conformers > 1:
                    graph.conformers = torch.from_numpy(pos).transpose(0, 1).contiguous()
            graph.y = torch.from_numpy(labels[row]).view(1, -1)
            graph.row = torch.tensor([row])
            if features is not None:
                graph.molecule_features = torch.from_numpy(features[row]).view(1, -1)
            if atom_values is not None:
                if atom_values[row] is None or len(atom_values[row]) != graph.num_nodes:
                    raise DataError(  # both parse the same SMILES: a disagreement is RDKit's
                        f"row {row} of {self.csv_path} ({column[row]!r}): RDKit's per-atom "
                        f"descriptors do not match its {graph.num_nodes} atoms; remove the row "
                        "or set dataset.atom_descriptor_targets=false"
                    )
                graph.y_atom = torch.from_numpy(atom_values[row])
            elif self.atom_targets:
                graph.y_atom = self._atom_labels(atom_lists, row, graph.num_nodes, column[row])
            if self.bond_targets:
                graph.bond_edge = molecule_bond_edges(graph)
                graph.y_bond = self._atom_labels(
                    bond_lists, row, len(graph.bond_edge), column[row], "bond"
                )
            graphs.append(graph)
            scaffolds.append(
                MurckoScaffold.MurckoScaffoldSmiles(smiles=column[row], includeChirality=True)
            )
        if len(graphs) < 3:
            raise DataError(
                f"{self.csv_path} holds {len(graphs)} molecule(s) rdkit can parse in column "
                f"{self.smiles_column!r}: training needs train, validation and test molecules; "
                "give more molecules"
            )
        data, slices = self.collate(graphs)
        if self.pre_transform is not None:
            add_structural_features(data, slices, self.pre_transform)
        torch.save((data, slices), self.processed_paths[0])
        with open(self.processed_paths[1], "w") as f:
            meta = {"skipped_rows": skipped, "scaffolds": scaffolds}
            if self.conformers is not None:
                meta["unembedded"] = unembedded
            json.dump(meta, f)


def read_csv_table(
    csv_path: str, columns: Sequence[str] | None, comment: str | None
) -> pd.DataFrame:
    """A user's CSV as a table: UTF-8 text, gzipped or not (``.csv.gz``, told by its first
    bytes), whole comment lines skipped, ``columns`` naming the columns of a file without a
    header row."""
    try:
        with _open_text(csv_path) as f:
            text = f.read()
    except (gzip.BadGzipFile, EOFError, zlib.error) as error:
        raise DataError(
            f"dataset.path={csv_path} is a damaged gzip file ({error}): compress the CSV "
            "again, or give it uncompressed"
        ) from error
    except UnicodeDecodeError as error:
        raise DataError(
            f"dataset.path={csv_path} is not UTF-8 text (byte {error.start} cannot be "
            "decoded; a binary, UTF-16 or Latin-1 file?): save it as a UTF-8 CSV"
        ) from error
    if "\x00" in text:
        raise DataError(
            f"dataset.path={csv_path} holds NUL bytes, so it is not a text CSV (a binary "
            "or UTF-16 file?): save it as a UTF-8 CSV"
        )
    if comment:
        # Whole comment lines only: pandas' own `comment` also cuts lines at the character,
        # and '#' is SMILES' triple bond.
        text = "".join(line for line in text.splitlines(True) if not line.startswith(comment))
    header = None if columns else "infer"
    try:
        return pd.read_csv(io.StringIO(text), header=header, names=columns)
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else "no data"
        raise DataError(
            f"dataset.path={csv_path} cannot be read as a CSV ({first}): give a "
            "comma-separated file with a header row, or dataset.columns for one without"
        ) from error


def load_cache(path: str) -> tuple:
    """A cached ``(data, slices)`` pair, read as data only (tensors, plain values and PyG's
    allow-listed storage classes); an unreadable file is an error naming it and the fix."""
    try:
        data, slices = load_data(path, [PYG_DATA])
    except Exception as error:  # truncated, corrupt, or holding objects other than data
        raise DataError(corrupt_cache_message(path, error)) from error
    return data, slices


def _parse_list(
    cell: object, row: int, column: str, path: str, level: str = "atom"
) -> list[float] | None:
    """One list cell of per-atom (per-bond) values: ``[0.12, -0.30, nan]``; None for an empty
    cell. Read as text, never evaluated."""
    if cell is None or (isinstance(cell, float) and np.isnan(cell)):
        return None
    text = str(cell).strip()
    if not text:
        return None

    def malformed(why: str) -> DataError:
        return DataError(
            f"{level} target column {column!r} of {path} holds {text[:60]!r} at row {row} "
            f"(0-based, header excluded), which is not a list of numbers ({why}): write one "
            f"number per {level} as [0.12, -0.30, ...], nan for an unlabelled {level}, or leave "
            "the cell empty"
        )

    if not (text.startswith("[") and text.endswith("]")):
        raise malformed("it must start with [ and end with ]")
    inner = text[1:-1].strip()
    if not inner:
        return []
    values = []
    for entry in inner.split(","):
        entry = entry.strip()
        try:
            value = float(entry)
        except ValueError:
            raise malformed(f"{entry!r} is not a number") from None
        if np.isinf(value) or abs(value) > 3.4e38:
            raise malformed(f"{entry!r} is not a finite float32")
        values.append(value)
    return values


def _header(path: str, comment: str | None) -> list[str]:
    """The names of the header row as the file holds them (pandas renames repeated ones); read
    after :func:`read_csv_table`, which names a file that cannot be read."""
    with _open_text(path, newline="") as f:
        lines = (line for line in f if not (comment and line.startswith(comment)))
        return next(csv.reader(lines), [])


def _open_text(path: str, newline: str | None = None):
    """A user's CSV opened as UTF-8 text, gzipped or not (told by its first bytes): the one
    reading of the file that its table and its header row share."""
    with open(path, "rb") as f:
        gzipped = f.read(2) == b"\x1f\x8b"
    return (gzip.open if gzipped else open)(path, "rt", encoding="utf-8", newline=newline)


def _rows_text(rows: Sequence[int]) -> str:
    shown = ", ".join(str(int(r)) for r in rows[:_SHOWN_ROWS])
    more = f" and {len(rows) - _SHOWN_ROWS} more" if len(rows) > _SHOWN_ROWS else ""
    return f"{shown}{more} (0-based, header excluded)"


def resolve_path(path: str) -> str:
    """``rdkit:REL`` names a file shipped in rdkit's data folder (``RDConfig.RDDataDir``)."""
    if path.startswith("rdkit:"):
        from rdkit import RDConfig

        return osp.join(RDConfig.RDDataDir, path[len("rdkit:") :])
    return osp.expanduser(path)


def _skipped_message(path: str, rows: list[int]) -> str:
    shown = ", ".join(str(r) for r in rows[:_SHOWN_ROWS])
    more = f" and {len(rows) - _SHOWN_ROWS} more" if len(rows) > _SHOWN_ROWS else ""
    return (
        f"skipped {len(rows)} row(s) of {path} whose SMILES rdkit cannot parse "
        f"(rows {shown}{more}; 0-based, header excluded); the other rows keep their labels"
    )


class SmilesCsvSource(Source):
    """A CSV of SMILES and targets, featurised like OGB, with a scaffold or random split.

    Args:
        path (str): the CSV file.
        targets (Sequence[str]): target columns.
        task_type (str): ``"binary"`` (0/1 targets, BCE, ROC-AUC), ``"regression"`` (MSE, RMSE)
            or ``"multiclass"`` (one integer class-id column, cross-entropy, accuracy or ``f1``).
        smiles_column (str, optional): the column holding the SMILES. (default: :obj:`"smiles"`)
        split (str, optional): ``"scaffold"``, ``"random"``, ``"column"`` (each row's split is
            named in ``split_column``: train, valid or test) or ``"file"`` (rows listed per split
            in ``split_file``). (default: :obj:`"scaffold"`)
        split_ratios (Sequence[float], optional): train/valid/test fractions.
        split_seed (int, optional): seed of the random split. (default: :obj:`0`)
        split_column (str | None, optional): the column of ``split="column"``.
        split_file (str | None, optional): a JSON file ``{"train": [rows], "valid": [rows],
            "test": [rows]}`` of 0-based CSV rows (header excluded); given, it implies
            ``split="file"``.
        metric (str | None, optional): OGB metric name; default ``rocauc`` / ``rmse``.
        root (str, optional): cache folder. (default: :obj:`"data"`)
        name (str, optional): label used in outputs. (default: :obj:`"smiles_csv"`)
        columns (Sequence[str] | None, optional): column names for a CSV without a header row.
        comment (str | None, optional): skip lines starting with this character.
        num_classes (int | None, optional): classes of a multi-class task; None: the largest
            label + 1.
        atom_targets (Sequence[str], optional): columns of per-atom targets, each cell a list
            of one number per atom in RDKit's atom order (issue #18). ``targets`` may then be
            empty (atoms alone). (default: :obj:`()`)
        atom_task_type (str, optional): ``"regression"`` (MSE; MAE and RMSE over every
            labelled atom) or ``"binary"`` (0/1 labels, BCE, ROC-AUC). (default:
            :obj:`"regression"`)
        bond_targets (Sequence[str], optional): columns of per-bond targets, each cell a list
            of one number per bond in RDKit's bond order (issue #18). (default: :obj:`()`)
        bond_task_type (str, optional): as ``atom_task_type``, of the bond targets.
            (default: :obj:`"regression"`)
        molecule_features (str | None, optional): extra model inputs per molecule:
            ``"rdkit2d"``, RDKit's 2D descriptors; ``"morgan_counts"``, its Morgan (ECFP4)
            count fingerprint in 2,048 bins; ``"rdkit2d+morgan_counts"``, both; ``"auto"``
            (``train.py``'s default), Morgan counts when the validation molecules are analogues
            of the training ones (median nearest-neighbour Tanimoto similarity at least
            :data:`~graphormer.data.descriptors.ANALOGUE_SIMILARITY`; sets of at most
            :data:`~graphormer.data.descriptors.ANALOGUE_MAX_MOLECULES` molecules), else none:
            chosen when the data loads, logged, and saved with the run as the set it chose.
            (default:
            :obj:`None`)
        feature_columns (Sequence[str], optional): numeric columns of the CSV given to the model
            as molecule features too (empty cells are missing). (default: :obj:`()`)
        descriptor_targets (bool, optional): the targets are RDKit's 2D descriptors computed
            from the SMILES (``experiment=descriptor_pretrain``); ``targets`` must then be empty.
            (default: :obj:`False`)
        atom_descriptor_targets (bool, optional): the atom targets are RDKit's per-atom
            descriptors (:data:`~graphormer.data.descriptors.ATOM_DESCRIPTORS`: Crippen logP and
            MR, TPSA and Labute ASA contributions with each atom's hydrogens, Gasteiger charge,
            E-state index), regressed beside ``descriptor_targets`` by
            ``experiment=descriptor_pretrain``; ``atom_targets`` must then be empty.
            (default: :obj:`False`)
        auxiliary_atom_descriptors (bool | str, optional): RDKit's per-atom descriptors (those
            of ``atom_descriptor_targets``) regressed beside the molecule targets as an
            auxiliary task (issue #22): a second loss on the atoms' final states that is
            logged (``val/atom_mae``) but never selects checkpoints and is never predicted.
            ``"auto"`` (``train.py``'s default) turns it on for regression targets without
            atom, bond or descriptor targets; ``True`` asks for it (an error where it cannot
            apply); ``False`` leaves it off. (default: :obj:`False`, as checkpoints made before
            it)
        conformers (str | None, optional): ``"rdkit"`` gives each molecule atom positions
            (RDKit ETKDGv3 with a fixed seed, then MMFF94), computed once in a process pool and
            cached with the graphs, for models with ``model.channels=3d`` or ``both``; a
            molecule RDKit cannot embed is named in one warning and left out. (default: None)
        num_conformers (int, optional): conformers kept per molecule; training reads a random
            one each epoch. (default: :obj:`1`)
    """

    SPLITS = ("scaffold", "random", "column", "file")
    _METRICS = {"binary": ("rocauc", "ap"), "regression": ("rmse",), "multiclass": ("acc", "f1")}

    def __init__(
        self,
        path: str,
        targets: Sequence[str],
        task_type: str = "regression",
        smiles_column: str = "smiles",
        split: str = "scaffold",
        split_ratios: Sequence[float] = (0.8, 0.1, 0.1),
        split_seed: int = 0,
        metric: str | None = None,
        root: str = "data",
        name: str = "smiles_csv",
        columns: Sequence[str] | None = None,
        comment: str | None = None,
        num_classes: int | None = None,
        split_column: str | None = None,
        split_file: str | None = None,
        atom_targets: Sequence[str] = (),
        atom_task_type: str = "regression",
        bond_targets: Sequence[str] = (),
        bond_task_type: str = "regression",
        molecule_features: str | None = None,
        feature_columns: Sequence[str] = (),
        descriptor_targets: bool = False,
        atom_descriptor_targets: bool = False,
        auxiliary_atom_descriptors: bool | str = False,
        conformers: str | None = None,
        num_conformers: int = 1,
    ) -> None:
        check_conformer_settings(conformers, num_conformers)
        self.conformers = conformers
        self.num_conformers = num_conformers
        # auto: chosen in load(), from the split (the file's own columns are read either way).
        self.auto_features = molecule_features == "auto"
        self.features = MoleculeFeatures(
            None if self.auto_features else molecule_features, list(feature_columns or ())
        )
        self.auto_choice: dict | None = None
        self.descriptor_targets = bool(descriptor_targets)
        if self.descriptor_targets:
            if targets or task_type != "regression":
                raise ConfigError(
                    "dataset.descriptor_targets=true computes the targets (RDKit's 2D "
                    "descriptors): leave dataset.targets empty and dataset.task_type=regression"
                )
            targets = rdkit2d_names()
        if isinstance(atom_targets, str):
            atom_targets = [atom_targets]
        if isinstance(targets, str):
            targets = [targets]
        if isinstance(bond_targets, str):
            bond_targets = [bond_targets]
        self.auxiliary_atom_descriptors = _auxiliary_atom_descriptors(
            auxiliary_atom_descriptors,
            bool(targets),
            task_type,
            bool(atom_targets) or bool(atom_descriptor_targets),
            bool(bond_targets),
            self.descriptor_targets,
            atom_task_type,
        )
        # Auxiliary: the same atom labels, trained for the molecule targets' sake.
        self.atom_descriptor_targets = bool(atom_descriptor_targets) or (
            self.auxiliary_atom_descriptors
        )
        if self.atom_descriptor_targets:
            if atom_targets or atom_task_type != "regression":
                raise ConfigError(
                    "dataset.atom_descriptor_targets=true computes the atom targets (RDKit's "
                    "per-atom descriptors): leave dataset.atom_targets empty and "
                    "dataset.atom_task_type=regression"
                )
            atom_targets = list(ATOM_DESCRIPTORS)
        self.bond_targets = [str(t) for t in bond_targets or ()]
        self.bond_task_type = bond_task_type
        self.atom_targets = [str(t) for t in atom_targets or ()]
        self.atom_task_type = atom_task_type
        # The file is the split; scaffold is only the config's default.
        split = file_split_setting(split, split_file, default="scaffold")
        if split == "column" and not split_column:
            raise ConfigError(
                "dataset.split=column needs dataset.split_column=NAME (a column holding train, "
                "valid or test for each row)"
            )
        if split_column and split != "column":
            raise ConfigError(
                f"dataset.split_column={split_column} is read only with dataset.split=column "
                f"(dataset.split is {split}): add dataset.split=column, or drop split_column"
            )
        if task_type not in self._METRICS:
            raise ConfigError(
                f"dataset.task_type must be 'binary', 'regression' or 'multiclass', got "
                f"{task_type!r}"
            )
        if split not in self.SPLITS:
            raise ConfigError(
                f"dataset.split must be one of {', '.join(self.SPLITS)}, got {split!r}"
            )
        metric = metric or self._METRICS[task_type][0]
        if metric not in self._METRICS[task_type]:
            raise ConfigError(
                f"dataset.metric={metric!r} does not fit task_type={task_type!r}; choose one of "
                f"{list(self._METRICS[task_type])}"
            )
        if not targets and not self.atom_targets and not self.bond_targets:
            raise ConfigError(
                "dataset.targets is empty: name at least one target column (or atom / bond "
                "target columns in dataset.atom_targets / dataset.bond_targets)"
            )
        if task_type == "multiclass" and len(targets) != 1:
            raise ConfigError(
                f"dataset.task_type=multiclass takes one target column (the class ids), got "
                f"{list(targets)}"
            )
        if num_classes is not None and (
            isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2
        ):
            raise ConfigError(f"dataset.num_classes must be an integer >= 2, got {num_classes!r}")
        self.path = path
        self.targets = list(targets)
        self.smiles_column_name = smiles_column
        self._keep_split(
            split,
            split_ratios,
            split_seed,
            resolve_path(split_file) if split_file else None,
            split_column,
        )
        self.root = root
        self.name = name
        self.columns = list(columns) if columns else None
        self.comment = comment
        self.task_type = task_type
        self.metric = metric
        self.num_classes = num_classes
        self._task = None
        if task_type != "multiclass" or num_classes is not None:
            self._task = user_task(
                name,
                task_type,
                metric,
                len(self.targets),
                num_classes,
                self._METRICS,
                len(self.atom_targets),
                atom_task_type,
                len(self.bond_targets),
                bond_task_type,
                self.auxiliary_atom_descriptors,
            )

    def task_info(self) -> TaskInfo:
        if self._task is None:
            # Multi-class without dataset.num_classes: as many classes as the labels name.
            table = read_csv_table(resolve_path(self.path), self.columns, self.comment)
            target = self.targets[0]
            if target not in table.columns:
                raise DataError(
                    f"{self.path} has no column {target!r}; its columns are {list(table.columns)}"
                )
            labels = torch.tensor(
                pd.to_numeric(table[target], errors="coerce").to_numpy(dtype=float)
            )
            where = f"target column {target!r} of {self.path}"
            rows = "row(s) (0-based, header excluded)"  # the table's positions are its rows
            classes = check_class_labels(labels, None, where, noun=rows)
            self._task = user_task(
                self.name,
                "multiclass",
                self.metric,
                1,
                classes,
                self._METRICS,
                len(self.atom_targets),
                self.atom_task_type,
                len(self.bond_targets),
                self.bond_task_type,
                self.auxiliary_atom_descriptors,
            )
        return self._task

    def task_names(self) -> list[str]:
        """The target columns."""
        return [str(t) for t in self.targets]

    def atom_task_names(self) -> list[str]:
        """The atom target columns."""
        return list(self.atom_targets)

    def bond_task_names(self) -> list[str]:
        """The bond target columns."""
        return list(self.bond_targets)

    def smiles_column(self) -> str:
        return self.smiles_column_name

    def input_rows(self, dataset: SmilesCsvDataset) -> torch.Tensor:
        """The CSV row of each molecule (rows rdkit could not parse have none)."""
        return dataset.row.view(-1)

    def molecule_features(self) -> MoleculeFeatures | None:
        """The molecule-level input features (issue #22), or None; with
        ``molecule_features=auto``, what :meth:`load` chose."""
        return self.features if self.features.enabled else None

    def resolves_on_load(self) -> bool:
        return self.auto_features

    def _stored_features(self) -> MoleculeFeatures | None:
        """The features the processed graphs are cached with: all of them, or with ``auto`` the
        file's columns alone (the choice depends on the split, not on the cache)."""
        if not self.auto_features:
            return self.molecule_features()
        columns = MoleculeFeatures(None, self.features.columns)
        return columns if columns.enabled else None

    def resolved_settings(self) -> dict:
        """``{"molecule_features": the set chosen}`` once ``auto`` has chosen (what a checkpoint
        keeps, so that evaluation and prediction read the same inputs); else empty."""
        if self.auto_choice is None:
            return {}
        return {"molecule_features": self.auto_choice["molecule_features"]}

    def _choose_features(self, dataset: SmilesCsvDataset, split: dict) -> None:
        """``molecule_features=auto``: Morgan counts when the validation molecules (the test
        ones without validation) are analogues of the training ones and the set holds at most
        :data:`~graphormer.data.descriptors.ANALOGUE_MAX_MOLECULES` molecules, attached to
        every graph before any file column; the choice is logged and kept in
        :attr:`auto_choice`."""
        columns = self.features.columns
        chosen, similarity = None, None
        if not over_analogue_cap(len(dataset)):  # else not even read
            held = split["valid"] if len(split["valid"]) else split["test"]
            table = dataset.read_table()
            column = table[self.smiles_column_name].tolist()
            smiles = [column[r] for r in dataset.row.view(-1).tolist()]  # one per graph
            chosen, similarity = analogue_features(
                [smiles[int(i)] for i in split["train"]],
                [smiles[int(i)] for i in held],
                len(dataset),
            )
        if similarity is None:
            self.features = MoleculeFeatures(None, columns)
            self.auto_choice = {"molecule_features": None, "molecules": len(dataset)}
            log.info(
                "dataset.molecule_features=auto: %d molecules, more than the %d up to which "
                "Morgan counts are given: the graph alone (dataset.molecule_features="
                "morgan_counts gives them anyway)",
                len(dataset),
                ANALOGUE_MAX_MOLECULES,
            )
            return
        self.features = MoleculeFeatures(chosen, columns)
        self.auto_choice = {
            "molecule_features": chosen,
            "similarity": round(similarity, 4),
            "threshold": ANALOGUE_SIMILARITY,
        }
        log.info(
            "dataset.molecule_features=auto: the validation molecules' median nearest-neighbour "
            "similarity to the training ones is %.2f (%s %.2f): %s",
            similarity,
            ">=" if chosen else "<",
            ANALOGUE_SIMILARITY,
            "Morgan counts beside the graph" if chosen else "the graph alone",
        )
        if chosen is None:
            return
        values = torch.from_numpy(morgan_count_values(smiles))  # [graphs, MORGAN_BITS]
        data = dataset._data
        if columns:  # the file's columns, already per graph: the counts go first
            values = torch.cat([values, data.molecule_features.view(len(smiles), -1)], 1)
        # One [1, D] row per graph, through the collated storage's slices.
        data.molecule_features = values
        dataset.slices["molecule_features"] = torch.arange(len(smiles) + 1)

    def has_positions(self) -> bool:
        return self.conformers is not None

    def prediction_conformers(self) -> int:
        """``dataset.num_conformers`` RDKit conformers per SMILES (their mean is predicted)."""
        return self.num_conformers if self.conformers is not None else 0

    def split_groups(self, dataset: SmilesCsvDataset) -> list[str]:
        """Bemis-Murcko scaffolds: a scaffold's molecules stay in one fold."""
        return list(dataset.scaffolds)

    def load(self, pre_transform: StructuralFeatures | None = None) -> LoadedDataset:
        dataset = SmilesCsvDataset(
            self.path,
            self.smiles_column_name,
            self.targets,
            self.root,
            pre_transform=pre_transform,
            columns=self.columns,
            comment=self.comment,
            atom_targets=self.atom_targets,
            bond_targets=self.bond_targets,
            # auto: the file's columns alone here; what auto chooses is attached below.
            molecule_features=self._stored_features(),
            descriptor_targets=self.descriptor_targets,
            atom_descriptor_targets=self.atom_descriptor_targets,
            conformers=self.conformers,
            num_conformers=self.num_conformers,
        )
        task = self.task_info()
        columns = {ATOM: self.atom_targets, BOND: self.bond_targets}
        for level in task.item_levels:
            if level.task_type(task) == "binary":
                _check_binary_items(dataset, columns[level], self.path, level)
        if task.is_classification:
            _check_binary_labels(dataset, self.targets, self.path)
        if task.is_multiclass:
            where = f"target column {self.targets[0]!r} of {self.path}"
            rows = "row(s) (0-based, header excluded)"
            check_class_labels(dataset.y, task.num_classes, where, dataset.row, rows)
        if self.split == "scaffold":
            split = group_split(dataset.scaffolds, self.split_ratios)
        elif self.split == "random":
            split = random_split(len(dataset), self.split_ratios, self.split_seed)
        else:
            table = dataset.read_table()
            rows = dataset.row.view(-1).tolist()
            if self.split == "column":
                if self.split_column not in table.columns:
                    raise DataError(
                        f"dataset.split_column={self.split_column!r} is not a column of "
                        f"{self.path}; its columns are {list(map(str, table.columns))}"
                    )
                split = column_split(table[self.split_column].tolist(), rows, self.split_column)
            else:
                split = file_split(self.split_file, len(table), rows)
        if self.targets:
            _check_labelled_splits(dataset, split, self.targets, self.path)
        for level, columns in ((ATOM, self.atom_targets), (BOND, self.bond_targets)):
            if columns:
                _check_labelled_atoms(dataset, split, columns, self.path, level.name)
        if task.is_multiclass:
            y = dataset.y.view(len(dataset), -1)
            warn_absent_classes(y[torch.as_tensor(split["train"])], task.num_classes, self.name)
        if self.auto_features:
            self._choose_features(dataset, split)
        return LoadedDataset(dataset, split, task)


def _check_binary_labels(dataset: SmilesCsvDataset, targets: list[str], path: str) -> None:
    y = dataset.y.view(len(dataset), -1)
    bad = ~(torch.isnan(y) | (y == 0) | (y == 1))
    if bad.any():
        column = int(bad.any(0).nonzero()[0])
        graphs = bad[:, column].nonzero().view(-1)
        rows = dataset.row.view(-1)[graphs].tolist()
        values = sorted({float(v) for v in y[graphs, column].tolist()})[:5]
        raise DataError(
            f"target column {targets[column]!r} of {path} holds values other than 0 and 1 "
            f"({values}) at rows {rows[:5]}{' and more' if len(rows) > 5 else ''} (0-based, "
            "header excluded), but dataset.task_type=binary: use 0/1 labels (empty = missing), "
            "or dataset.task_type=regression"
        )


def _atom_rows(
    dataset: SmilesCsvDataset, graphs: torch.Tensor, level: str = "atom"
) -> torch.Tensor:
    """The ``y_atom`` rows ``[atoms, T_atom]`` of the graphs ``graphs`` (dataset positions); with
    ``level="bond"`` the ``y_bond`` rows."""
    key = f"y_{level}"
    ptr = dataset.slices[key]
    starts, ends = ptr[graphs], ptr[graphs + 1]
    counts = ends - starts
    offsets = torch.repeat_interleave(starts - (counts.cumsum(0) - counts), counts)
    return getattr(dataset, key)[torch.arange(int(counts.sum())) + offsets]


def _check_binary_items(
    dataset: SmilesCsvDataset, targets: list[str], path: str, level: Level
) -> None:
    y = getattr(dataset, level.label)
    bad = ~(torch.isnan(y) | (y == 0) | (y == 1))
    if bad.any():
        column = int(bad.any(0).nonzero()[0])
        atom = int(bad[:, column].nonzero()[0])
        graph = int(torch.searchsorted(dataset.slices[level.label], atom, right=True)) - 1
        raise DataError(
            f"{level.name} target column {targets[column]!r} of {path} holds "
            f"{float(y[atom, column])} at row {int(dataset.row.view(-1)[graph])} (0-based, "
            f"header excluded), but dataset.{level.name}_task_type=binary: use 0/1 labels (nan = "
            f"unlabelled), or dataset.{level.name}_task_type=regression"
        )


def _check_labelled_atoms(
    dataset, split, targets: list[str], path: str, level: str = "atom"
) -> None:
    """Every atom (bond) target needs labelled atoms (bonds) in training, validation and test."""
    for name in ("train", "valid", "test"):
        indices = split.get(name) if isinstance(split, dict) else None
        if indices is None or len(indices) == 0:
            continue
        labelled = ~torch.isnan(_atom_rows(dataset, torch.as_tensor(indices), level))
        empty = [targets[t] for t in range(len(targets)) if not labelled[:, t].any()]
        if empty:
            raise DataError(
                f"{level} target column(s) {empty} of {path} have no labelled {level} among the "
                f"{len(indices)} molecules of the {name} split, so they cannot be trained or "
                "scored there: label more molecules, or change dataset.split / "
                "dataset.split_ratios"
            )


def _check_labelled_splits(dataset, split, targets: list[str], path: str) -> None:
    """A target without a label in the validation or test split has no score there (its RMSE
    would read inf, its ROC-AUC fail): refuse it before training (#20)."""
    y = dataset.y.view(len(dataset), -1)
    for name in ("valid", "test"):
        indices = split.get(name) if isinstance(split, dict) else None
        if indices is None or len(indices) == 0:
            continue
        labelled = ~torch.isnan(y[torch.as_tensor(indices)])  # [n, T]
        empty = [targets[t] for t in range(y.shape[1]) if not labelled[:, t].any()]
        if empty:
            raise DataError(
                f"target column(s) {empty} of {path} have no label among the {len(indices)} "
                f"molecules of the {name} split, so they cannot be scored there: label more "
                "molecules of those columns, or change dataset.split / dataset.split_ratios"
            )


def _auxiliary_atom_descriptors(
    setting: bool | str,
    molecule_targets: bool,
    task_type: str,
    atom_targets: bool,
    bond_targets: bool,
    descriptor_targets: bool,
    atom_task_type: str = "regression",
) -> bool:
    """Whether per-atom descriptors are regressed as an auxiliary task (issue #22):
    ``dataset.auxiliary_atom_descriptors`` resolved against the rest of the dataset settings."""
    blockers = [
        reason
        for reason, present in (
            ("it serves molecule targets and dataset.targets is empty", not molecule_targets),
            (
                "the atom level holds dataset.atom_targets (or atom_descriptor_targets)",
                atom_targets,
            ),
            ("dataset.bond_targets are given", bond_targets),
            ("dataset.descriptor_targets=true pre-trains on descriptors", descriptor_targets),
            (
                f"its atom targets are regression, not dataset.atom_task_type={atom_task_type}",
                atom_task_type != "regression",
            ),
        )
        if present
    ]
    return auxiliary_atoms_apply(setting, task_type == "regression", blockers)
