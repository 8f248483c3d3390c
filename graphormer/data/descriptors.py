"""Molecule-level input features (issue #22): RDKit's 2D descriptors and a user's own numeric
columns, one vector per molecule. One owner for what they are, how they are computed (in
parallel) and how a file's columns are read, so that training, evaluation and prediction agree;
the sets computed from SMILES alone live in :mod:`graphormer.portable.features` (no torch, for
the ONNX predictor) and are re-exported here.

The values kept here are raw (float32, NaN where a descriptor is undefined, infinite or beyond
float32); the rule that makes them model inputs (training-split median for non-finite values,
standardisation, clipping, dropped columns) is :class:`~graphormer.models.MoleculeFeatureInput`'s,
whose statistics the checkpoint keeps.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from graphormer.errors import ConfigError, DataError

# The features computed from SMILES alone have a torch-free owner (the ONNX predictor computes
# them too); re-exported here, where training and the torch Predictor import them.
from graphormer.portable.features import (
    MOLECULE_FEATURE_SETS,
    MORGAN_BITS,
    MORGAN_RADIUS,
    _in_chunks,
    _not_float32_to_nan,
    feature_set_names,
    feature_set_values,
    feature_sets,
    morgan_count_values,
    rdkit2d_names,
    rdkit2d_values,
)

__all__ = [
    "ANALOGUE_MAX_MOLECULES",
    "ANALOGUE_SIMILARITY",
    "analogue_features",
    "over_analogue_cap",
    "ATOM_DESCRIPTORS",
    "MOLECULE_FEATURE_SETS",
    "MORGAN_BITS",
    "MORGAN_RADIUS",
    "MoleculeFeatures",
    "atom_descriptor_values",
    "auxiliary_atoms_apply",
    "feature_sets",
    "morgan_count_values",
    "nearest_similarity_median",
    "rdkit2d_names",
    "rdkit2d_values",
    "require_columns",
    "SIMILARITY_SAMPLE",
]

# ``dataset.molecule_features=auto`` (dataset=smiles_csv) gives the model Morgan counts when the
# validation molecules' median nearest-neighbour Tanimoto similarity to the training molecules
# (ECFP4 bits) is at least this: held-out molecules that are analogues of training ones, as in a
# series of bioactivity measurements, where the counts cut MoleculeACE's test errors by a sixth
# to a quarter; below it (scaffold splits measured 0.30 to 0.38, MoleculeACE's splits 0.59 to
# 0.86) they made solubility's and FreeSolv's errors worse by a quarter or more.
# docs/benchmarks/moleculeace.md has the figures.
ANALOGUE_SIMILARITY = 0.5
# ... and only for sets of at most this many molecules: the counts were measured to help on sets
# of 615 to 3,657 molecules, and they cost 8 kB of float32 per molecule (8 GB for a million).
ANALOGUE_MAX_MOLECULES = 50_000
# The similarity's median is taken over a seeded sample of at most this many held-out molecules
# (each compared with every training one), so that deciding costs seconds on any set.
SIMILARITY_SAMPLE = 1_000
# RDKit's per-atom descriptors (``dataset.atom_descriptor_targets``), in column order: the atom
# contributions of RDKit's molecule-level MolLogP, MolMR, TPSA and LabuteASA (Wildman and Crippen
# 1999; Ertl et al. 2000; Labute 2000), Gasteiger-Marsili partial charges and Kier-Hall E-state
# indices. Local quantities of each atom's neighbourhood, at any molecule size.
ATOM_DESCRIPTORS = (
    "crippen_logp",
    "crippen_mr",
    "tpsa",
    "labute_asa",
    "gasteiger_charge",
    "estate",
)


def _atom_descriptor_chunk(smiles: Sequence[str]) -> list[np.ndarray | None]:
    """One ``[atoms, len(ATOM_DESCRIPTORS)]`` float64 array per SMILES (None: unparsable)."""
    from rdkit import Chem, RDLogger
    from rdkit.Chem import rdMolDescriptors, rdPartialCharges
    from rdkit.Chem.EState import EState

    RDLogger.DisableLog("rdApp.*")
    out: list[np.ndarray | None] = []
    for text in smiles:
        mol = Chem.MolFromSmiles(text) if isinstance(text, str) else None
        if mol is None:
            out.append(None)
            continue
        atoms = mol.GetNumAtoms()
        values = np.full((atoms, len(ATOM_DESCRIPTORS)), np.nan)
        if atoms:
            # The additive ones on the molecule with explicit hydrogens (appended after the
            # heavy atoms, whose indices stay), each hydrogen's share added to its heavy atom:
            # every heavy atom's group contribution, summing to the molecule's MolLogP, MolMR
            # and TPSA (LabuteASA adds a global hydrogen term to its atoms' sum).
            with_h = Chem.AddHs(mol)
            crippen = rdMolDescriptors._CalcCrippenContribs(with_h)
            additive = np.column_stack(
                [
                    [logp for logp, _ in crippen],
                    [mr for _, mr in crippen],
                    list(rdMolDescriptors._CalcTPSAContribs(with_h)),
                    list(rdMolDescriptors._CalcLabuteASAContribs(with_h)[0]),
                ]
            )
            heavy = additive[:atoms].copy()
            for atom in list(with_h.GetAtoms())[atoms:]:
                for neighbour in atom.GetNeighbors():
                    heavy[neighbour.GetIdx()] += additive[atom.GetIdx()]
            values[:, :4] = heavy
            rdPartialCharges.ComputeGasteigerCharges(mol)
            values[:, 4] = [a.GetDoubleProp("_GasteigerCharge") for a in mol.GetAtoms()]
            values[:, 5] = EState.EStateIndices(mol)
        out.append(values)
    return out


def nearest_similarity_median(
    reference: Sequence[str], queries: Sequence[str], sample: int = SIMILARITY_SAMPLE
) -> float:
    """The median over ``queries`` of each one's highest Tanimoto similarity to any of
    ``reference`` (Morgan bits, radius :data:`MORGAN_RADIUS`, :data:`MORGAN_BITS` bins): how
    close held-out molecules are to the training ones. Over more than ``sample`` queries, the
    median of a seeded sample of ``sample`` of them (seed 0: the same every time). SMILES RDKit
    cannot parse are left out; 0.0 when either side is empty."""
    from rdkit import Chem, DataStructs, RDLogger
    from rdkit.Chem import rdFingerprintGenerator

    RDLogger.DisableLog("rdApp.*")
    if len(queries) > sample:
        picked = np.random.default_rng(0).choice(len(queries), sample, replace=False)
        queries = [queries[int(i)] for i in np.sort(picked)]
    generator = rdFingerprintGenerator.GetMorganGenerator(radius=MORGAN_RADIUS, fpSize=MORGAN_BITS)

    def bits(smiles: Sequence[str]) -> list:
        mols = (Chem.MolFromSmiles(s) if isinstance(s, str) else None for s in smiles)
        return [generator.GetFingerprint(m) for m in mols if m is not None]

    known, held = bits(reference), bits(queries)
    if not known or not held:
        return 0.0
    nearest = [max(DataStructs.BulkTanimotoSimilarity(f, known)) for f in held]
    return float(np.median(nearest))


def over_analogue_cap(molecules: int) -> bool:
    """Whether a set of ``molecules`` is beyond :data:`ANALOGUE_MAX_MOLECULES`, where
    ``dataset.molecule_features=auto`` gives the graph alone without measuring similarity."""
    return molecules > ANALOGUE_MAX_MOLECULES


def analogue_features(
    train: Sequence[str], held: Sequence[str], molecules: int
) -> tuple[str | None, float | None]:
    """``dataset.molecule_features=auto``'s rule, one place for the data and the benchmarks:
    ``("morgan_counts", median)`` when the ``held``-out molecules' median nearest-neighbour
    similarity to the ``train`` ones (:func:`nearest_similarity_median`) is at least
    :data:`ANALOGUE_SIMILARITY`, ``(None, median)`` below it, and ``(None, None)`` for a set of
    more than :data:`ANALOGUE_MAX_MOLECULES` ``molecules`` (not measured)."""
    if over_analogue_cap(molecules):
        return None, None
    similarity = nearest_similarity_median(train, held)
    return ("morgan_counts" if similarity >= ANALOGUE_SIMILARITY else None), similarity


def auxiliary_atoms_apply(setting: bool | str, regression: bool, blockers: Sequence[str]) -> bool:
    """Whether RDKit's per-atom descriptors are regressed as an auxiliary task (issue #22): one
    rule for every source of molecules. ``setting`` is ``dataset.auxiliary_atom_descriptors``
    (``auto``, true or false); ``regression``: the molecule targets are regression, where it
    was measured to help and ``auto`` turns it on; ``blockers``: why it cannot apply to this
    dataset (its atom level is taken, ...), which ``auto`` respects and ``true`` is refused over.
    """
    if setting not in (True, False, "auto"):
        raise ConfigError(
            f"dataset.auxiliary_atom_descriptors must be auto, true or false, got {setting!r}"
        )
    if setting == "auto":
        return regression and not blockers
    if setting and blockers:
        raise ConfigError(
            f"dataset.auxiliary_atom_descriptors=true cannot apply: {'; '.join(blockers)}. "
            "Set dataset.auxiliary_atom_descriptors=false (or auto)"
        )
    return bool(setting)


def atom_descriptor_values(
    smiles: Sequence[str], workers: int | None = None
) -> list[np.ndarray | None]:
    """RDKit's per-atom descriptors (:data:`ATOM_DESCRIPTORS`) of each SMILES: one float32
    ``[atoms, len(ATOM_DESCRIPTORS)]`` array in RDKit's atom order (hydrogens implicit, as the
    molecule's graph), NaN where a value is not finite (a Gasteiger charge RDKit cannot assign);
    None for a SMILES RDKit cannot parse. Computed over ``workers`` processes as
    :func:`rdkit2d_values`."""
    parts = _in_chunks(_atom_descriptor_chunk, list(smiles), workers)
    return [None if v is None else _not_float32_to_nan(v) for part in parts for v in part]


@dataclass
class MoleculeFeatures:
    """Which molecule-level features a dataset gives its model: RDKit's 2D descriptors
    (``descriptors="rdkit2d"``), Morgan count fingerprints (``"morgan_counts"``), both
    (``"rdkit2d+morgan_counts"``), and/or numeric columns of the input file (``columns``).

    Args:
        descriptors (str | None): names of :data:`MOLECULE_FEATURE_SETS` joined with ``+``, or
            None.
        columns (Sequence[str]): numeric columns of the CSV (empty cells are missing values).
    """

    descriptors: str | None = None
    columns: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        feature_sets(self.descriptors)  # refuses an unknown name
        if isinstance(self.columns, str):
            self.columns = [self.columns]
        self.columns = [str(c) for c in self.columns or ()]
        if len(set(self.columns)) != len(self.columns):
            raise ConfigError(f"dataset.feature_columns={self.columns} lists a column twice")

    @property
    def enabled(self) -> bool:
        return self.descriptors is not None or bool(self.columns)

    def names(self) -> list[str]:
        """One name per feature: each set's in order (``rdkit2d:MolLogP``, ...,
        ``morgan_counts:0``, ...), then the columns'."""
        return feature_set_names(self.descriptors) + list(self.columns)

    def compute(
        self, smiles: Sequence[str], table: pd.DataFrame | None = None, where: str = "the input"
    ) -> np.ndarray:
        """``[n, D]`` float32 raw features of ``smiles`` (NaN = missing); the columns are read
        from ``table``, whose rows are the molecules'."""
        parts = [feature_set_values(self.descriptors, smiles)] if self.descriptors else []
        if self.columns:
            parts.append(read_feature_columns(table, self.columns, where, len(smiles)))
        return np.concatenate(parts, axis=1) if parts else np.zeros((len(smiles), 0), np.float32)


def require_columns(
    table: pd.DataFrame, columns: Sequence[str], where: str, role: str, fix: str
) -> None:
    """Refuse a table lacking any of ``columns``: one error naming the absent ones, what they are
    read as (``role``), the columns the table has, and ``fix``.

    Raises:
        DataError: ``{where} has no column(s) [...]{role}; its columns are [...]{fix}``.
    """
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise DataError(
            f"{where} has no column(s) {missing}{role}; its columns are "
            f"{list(map(str, table.columns))}{fix}"
        )


def read_feature_columns(
    table: pd.DataFrame | None, columns: Sequence[str], where: str, rows: int
) -> np.ndarray:
    """``[rows, len(columns)]`` float32 values of ``columns`` of ``table`` (empty cells NaN).

    Raises:
        DataError: a column is absent, or a cell is not a number (naming its row and column).
    """
    if table is None:
        raise DataError(
            f"the model reads feature column(s) {list(columns)} (dataset.feature_columns) but "
            f"{where} gives only SMILES: give a CSV holding those columns"
        )
    require_columns(
        table,
        columns,
        where,
        role=", which the model reads as molecule features (dataset.feature_columns)",
        fix=": add them",
    )
    if len(table) != rows:
        raise ValueError(f"{len(table)} table rows for {rows} molecules")
    out = np.empty((rows, len(columns)), dtype=np.float32)
    for j, column in enumerate(columns):
        cells = table[column]
        values = pd.to_numeric(cells, errors="coerce")
        bad = values.isna() & cells.notna() & (cells.astype(str).str.strip() != "")
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            raise DataError(
                f"feature column {column!r} of {where} holds a non-numeric value "
                f"{cells.iloc[row]!r} at row {row} (0-based, header excluded); feature columns "
                "must be numbers or empty (empty = missing, filled with the training median)"
            )
        array = np.array(values, dtype=np.float64)  # a copy: pandas may hand out a read-only view
        array[~np.isfinite(array) | (np.abs(array) > np.finfo(np.float32).max)] = np.nan
        out[:, j] = array
    return out
