"""A user's own molecules from a CSV of SMILES, featurised exactly like OGB's molecule datasets."""

from __future__ import annotations

import hashlib
import io
import json
import os.path as osp
import warnings
from collections import defaultdict
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch
from rdkit.Chem.Scaffolds import MurckoScaffold
from torch_geometric.data import InMemoryDataset

from graphormer.data.featurize import featurize_smiles
from graphormer.data.ogb import (
    add_structural_features,
    allow_pyg_classes,
    check_pyg_markers,
    corrupt_cache_message,
)
from graphormer.data.transforms import StructuralFeatures
from graphormer.errors import ConfigError, DataError

__all__ = ["SmilesCsvDataset", "group_split", "random_split", "scaffold_split"]

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
    ) -> None:
        path = resolve_path(path)
        if not osp.isfile(path):
            raise DataError(
                f"dataset.path={path!r} does not exist; give the path of a CSV file of SMILES"
            )
        if not targets:
            raise ConfigError("dataset.targets is empty: name at least one target column")
        self.csv_path = osp.abspath(path)
        self.smiles_column = smiles_column
        self.targets = [str(t) for t in targets]
        self.columns = list(columns) if columns else None
        self.comment = comment
        self.cache_key = pre_transform.cache_key if pre_transform is not None else "plain"
        # The cache is keyed by the file's content and the columns read, never by its name alone.
        with open(self.csv_path, "rb") as f:
            digest = hashlib.sha1(f.read())
        digest.update(json.dumps([smiles_column, self.targets, self.columns, comment]).encode())
        stem = osp.splitext(osp.basename(path))[0]
        folder = osp.join(root, "smiles_csv", f"{stem}_{digest.hexdigest()[:12]}")
        allow_pyg_classes()
        check_pyg_markers(osp.join(folder, "processed", self.cache_key))
        super().__init__(folder, pre_transform=pre_transform, log=False)
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

    def _read(self) -> pd.DataFrame:
        try:
            with open(self.csv_path, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError as error:
            raise DataError(
                f"dataset.path={self.csv_path} is not UTF-8 text (byte {error.start} cannot be "
                "decoded; a binary, UTF-16 or Latin-1 file?): save it as a UTF-8 CSV"
            ) from error
        if "\x00" in text:
            raise DataError(
                f"dataset.path={self.csv_path} holds NUL bytes, so it is not a text CSV (a binary "
                "or UTF-16 file?): save it as a UTF-8 CSV"
            )
        if self.comment:
            # Whole comment lines only: pandas' own `comment` also cuts lines at the character,
            # and '#' is SMILES' triple bond.
            text = "".join(
                line for line in text.splitlines(True) if not line.startswith(self.comment)
            )
        header = None if self.columns else "infer"
        try:
            return pd.read_csv(io.StringIO(text), header=header, names=self.columns)
        except (pd.errors.ParserError, pd.errors.EmptyDataError) as error:
            first = str(error).strip().splitlines()[0] if str(error).strip() else "no data"
            raise DataError(
                f"dataset.path={self.csv_path} cannot be read as a CSV ({first}): give a "
                "comma-separated file with a header row, or dataset.columns for one without"
            ) from error

    def process(self) -> None:
        table = self._read()
        missing = [c for c in [self.smiles_column, *self.targets] if c not in table.columns]
        if missing:
            raise DataError(
                f"{self.csv_path} has no column(s) {missing}; its columns are "
                f"{list(table.columns)}. Set dataset.smiles_column / dataset.targets."
            )
        labels = np.empty((len(table), len(self.targets)), dtype=np.float32)
        for j, column in enumerate(self.targets):
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
            labels[:, j] = array.astype(np.float32)

        column = table[self.smiles_column].tolist()
        molecules = featurize_smiles(column)
        graphs, skipped, scaffolds = [], [], []
        for row, graph in enumerate(molecules.graphs):
            if graph is None:
                skipped.append(row)
                continue
            graph.y = torch.from_numpy(labels[row]).view(1, -1)
            graph.row = torch.tensor([row])
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
            json.dump({"skipped_rows": skipped, "scaffolds": scaffolds}, f)


def load_cache(path: str) -> tuple:
    """A cached ``(data, slices)`` pair, read as data only (tensors, plain values and PyG's
    allow-listed storage classes); an unreadable file is an error naming it and the fix."""
    allow_pyg_classes()
    try:
        data, slices = torch.load(path, weights_only=True)
    except Exception as error:  # truncated, corrupt, or holding objects other than data
        raise DataError(corrupt_cache_message(path, error)) from error
    return data, slices


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


def _check_ratios(ratios: Sequence[float]) -> tuple[float, float, float]:
    if len(ratios) != 3 or min(ratios) < 0 or abs(sum(ratios) - 1.0) > 1e-6:
        raise ConfigError(
            f"dataset.split_ratios must be three non-negative fractions summing to 1, got "
            f"{list(ratios)}"
        )
    return float(ratios[0]), float(ratios[1]), float(ratios[2])


def scaffold_split(
    smiles: Sequence[str], ratios: Sequence[float] = (0.8, 0.1, 0.1)
) -> dict[str, torch.Tensor]:
    """Bemis-Murcko scaffold split, as OGB made its molecule splits: whole scaffold groups, the
    largest first, fill train, then valid, then test; deterministic."""
    scaffolds = [
        MurckoScaffold.MurckoScaffoldSmiles(smiles=s, includeChirality=True) for s in smiles
    ]
    return group_split(scaffolds, ratios)


def group_split(
    groups_of: Sequence[str], ratios: Sequence[float] = (0.8, 0.1, 0.1)
) -> dict[str, torch.Tensor]:
    """Splits items by group key (a scaffold): whole groups, the largest first, fill train, then
    valid, then test; deterministic."""
    train_ratio, valid_ratio, _ = _check_ratios(ratios)
    groups: dict[str, list[int]] = defaultdict(list)
    for i, key in enumerate(groups_of):
        groups[key].append(i)
    ordered = sorted(groups.values(), key=lambda g: (-len(g), g[0]))
    n = len(groups_of)
    train_cut, valid_cut = train_ratio * n, (train_ratio + valid_ratio) * n
    split: dict[str, list[int]] = {"train": [], "valid": [], "test": []}
    for group in ordered:
        if len(split["train"]) + len(group) <= train_cut:
            split["train"] += group
        elif len(split["train"]) + len(split["valid"]) + len(group) <= valid_cut:
            split["valid"] += group
        else:
            split["test"] += group
    return {k: torch.tensor(sorted(v), dtype=torch.long) for k, v in split.items()}


def random_split(
    num_graphs: int, ratios: Sequence[float] = (0.8, 0.1, 0.1), seed: int = 0
) -> dict[str, torch.Tensor]:
    """A seeded random split."""
    train_ratio, valid_ratio, _ = _check_ratios(ratios)
    order = torch.randperm(num_graphs, generator=torch.Generator().manual_seed(seed))
    a, b = int(train_ratio * num_graphs), int((train_ratio + valid_ratio) * num_graphs)
    return {
        "train": order[:a].sort().values,
        "valid": order[a:b].sort().values,
        "test": order[b:].sort().values,
    }
