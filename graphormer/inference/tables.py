"""The tables of a prediction: one row per molecule (``layout=wide``: one column per task, and
per atom or bond target a list column), or one row per atom and bond (``layout=long``)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from rdkit import Chem

from graphormer.data.tasks import ATOM, ATOM_VECTOR, BOND, Level, TaskInfo
from graphormer.errors import ConfigError
from graphormer.portable.columns import molecule_columns

__all__ = ["LAYOUTS", "OutputNames", "Predictions", "format_atom_list", "format_vector_list"]

# The layouts of predict.py's table (``layout=``).
LAYOUTS = ("wide", "long")


@dataclass
class Predictions:
    """One row per input molecule, in input order.

    Attributes:
        values: ``[n, T]`` float32: probabilities for binary tasks, the targets' units for
            regression; ``[n, C]`` class probabilities for a multi-class task; NaN where the
            molecule could not be featurised.
        errors: ``""``, or why the molecule has no prediction.
        embeddings: ``[n, hidden_dim]`` float32 graph-token final states (NaN rows where there is
            no prediction), or None when not asked for.
        std: ``[n, T]`` the spread of the values: over an ensemble's members or MC-dropout
            passes (of probabilities for binary tasks); None for a single deterministic model.
        lower, upper: ``[n, T]`` calibrated intervals (regression, ``interval=``), or None.
        atoms: for a model of atom targets (issue #18), one ``[n_atoms, T_atom]`` float32
            array per molecule in RDKit's atom order (probabilities for binary atom tasks;
            None where there is no prediction); None otherwise.
        bonds: for a model of bond targets, one ``[n_bonds, T_bond]`` float32 array per
            molecule in RDKit's bond order (per listed edge for graphs); None otherwise.
        atom_vectors: for a model of per-atom vectors (forces), one ``[n_atoms, T_vec, 3]``
            float32 array per molecule in atom order; None otherwise.
        item_extras: per item level (``atom``, ``bond``, ``atom_vector``) and column suffix
            (``std``: the spread over an ensemble's members or MC-dropout passes; ``lower``,
            ``upper``: the calibrated intervals, of atoms and bonds), one ``[n_items, T]``
            array per molecule (a vector's ``[n_atoms, T, 3]``: a std per component; None
            where there is no prediction); empty for a single model without intervals.
    """

    values: np.ndarray
    errors: list[str]
    embeddings: np.ndarray | None = None
    std: np.ndarray | None = None
    lower: np.ndarray | None = None
    upper: np.ndarray | None = None
    atoms: list[np.ndarray | None] | None = None
    bonds: list[np.ndarray | None] | None = None
    atom_vectors: list[np.ndarray | None] | None = None

    @classmethod
    def empty(cls, n: int, task: TaskInfo, hidden_dim: int, spread: str | None) -> Predictions:
        """``n`` rows without a prediction (NaN values, no error yet), filled batch by batch:
        embeddings of ``hidden_dim`` (0: none), a ``std`` where there is a ``spread`` (its
        source, ``Predictor.spread``), and a list per item level of ``task``."""
        values = np.full((n, task.num_outputs), np.nan, dtype=np.float32)
        return cls(
            values,
            [""] * n,
            np.full((n, hidden_dim), np.nan, dtype=np.float32) if hidden_dim else None,
            np.full_like(values, np.nan) if spread else None,
            **{f"{level.name}s": [None] * n for level in task.item_levels},
        )

    item_extras: dict[str, dict[str, list[np.ndarray | None]]] = field(default_factory=dict)

    def fill(
        self,
        rows: np.ndarray,
        out,
        std,
        states,
        per_level: dict[str, list],
        item_std: dict[str, list] | None = None,
    ) -> None:
        """Puts a batch's predictions at its input ``rows`` (``item_std``: each level's
        spread, per graph)."""
        self.values[rows] = out
        for name, arrays in per_level.items():
            found = getattr(self, f"{name}s")  # None: a level the predictions leave out
            for i, array in zip(rows.tolist(), arrays if found is not None else (), strict=False):
                found[i] = array
        for name, arrays in (item_std or {}).items():
            level = self.item_extras.setdefault(name, {})
            found = level.setdefault("std", [None] * len(self.errors))
            for i, array in zip(rows.tolist(), arrays, strict=True):
                found[i] = array
        if self.std is not None:
            self.std[rows] = std
        if self.embeddings is not None:
            self.embeddings[rows] = states


@dataclass(frozen=True)
class OutputNames:
    """What a model's outputs are called in its tables.

    Attributes:
        task: the task predicted (auxiliary atom targets left out).
        task_names: one name per molecule task.
        atom_task_names: one name per atom target (empty without).
        bond_task_names: one name per bond target (empty without).
        atom_vector_task_names: one name per per-atom vector target (empty without); the long
            layout's columns are ``<name>_x``, ``<name>_y``, ``<name>_z``.
    """

    task: TaskInfo
    task_names: list[str]
    atom_task_names: list[str]
    bond_task_names: list[str]
    atom_vector_task_names: list[str] = field(default_factory=list)

    @classmethod
    def of(
        cls,
        task: TaskInfo,
        task_names: Sequence[str] | None = None,
        atom_task_names: Sequence[str] | None = None,
        bond_task_names: Sequence[str] | None = None,
        atom_vector_task_names: Sequence[str] | None = None,
    ) -> OutputNames:
        """The names of a model of ``task``'s outputs: the given ones, checked, or numbered
        (``task_i``, ``atom_i``, ``bond_i``, ``atom_vector_i``)."""
        # Auxiliary atom targets (issue #22) are trained, never predicted.
        predicted = task.without_auxiliary()
        num_tasks = predicted.num_tasks
        names = list(task_names) if task_names else [f"task_{i}" for i in range(num_tasks)]
        if len(names) != num_tasks:
            raise ValueError(f"{len(names)} task names for {num_tasks} tasks: {names}")
        given = {ATOM: atom_task_names, BOND: bond_task_names, ATOM_VECTOR: atom_vector_task_names}
        if task.atom_auxiliary:
            given[ATOM] = None  # the names of the auxiliary targets, if given, name no output
        found = {}
        for level, chosen in given.items():
            count = level.tasks(predicted)
            chosen = list(chosen or [f"{level.name}_{i}" for i in range(count)])
            if len(chosen) != count:
                raise ValueError(f"{len(chosen)} {level.noun} task names for {count}: {chosen}")
            found[level] = chosen
        return cls(predicted, names, found[ATOM], found[BOND], found[ATOM_VECTOR])

    def level_columns(self, level: Level) -> list[str]:
        """The long layout's value columns of ``level``: one per target, a vector's as
        ``<name>_x``, ``<name>_y``, ``<name>_z``."""
        names = {
            ATOM: self.atom_task_names,
            BOND: self.bond_task_names,
            ATOM_VECTOR: self.atom_vector_task_names,
        }[level]
        if level.components == 1:
            return list(names)
        return [f"{name}_{axis}" for name in names for axis in "xyz"]

    def long_table(self, smiles: Sequence[str | Chem.Mol], result: Predictions) -> pd.DataFrame:
        """The long layout (``layout=long``; ``smiles``: SMILES, or RDKit molecules such as a
        structure file's atoms): one row per atom of every molecule (``row``, the input's
        position; ``atom_index``, RDKit's; ``element``; one column per atom target, and
        ``<name>_x``, ``<name>_y``, ``<name>_z`` per vector target; ``error``) for a model of
        atom targets or vectors, one row per bond (``row``, ``bond_index``,
        RDKit's; ``begin_atom``, ``end_atom``; ``bond_type``; one column per bond target;
        ``error``) for a model of bond targets, and for a model of both, the two stacked with a
        ``level`` column (``atom`` or ``bond``), each molecule's atoms then its bonds, the
        other level's columns empty. A molecule without a prediction keeps one row, with empty
        indices and the reason in ``error``."""
        atoms = self._atom_rows(smiles, result)
        if atoms is None and result.bonds is None:
            raise ConfigError(
                "layout=long writes one row per atom or bond, and this model predicts no atom "
                "or bond targets: use layout=wide"
            )
        if result.bonds is None:
            return atoms
        bonds = self._bond_rows(smiles, result)
        if atoms is None:
            return bonds
        atoms.insert(1, "level", "atom")
        bonds.insert(1, "level", "bond")
        table = pd.concat([atoms, bonds], ignore_index=True)
        table = table.sort_values(["row", "level"], kind="stable", ignore_index=True)
        # A molecule without a prediction has one error row per level: keep one. A molecule
        # without bonds keeps its atom rows, not the bond level's empty placeholder.
        failed = table["error"].astype(str).ne("") & table.duplicated(["row"], keep="first")
        placeholder = table["level"].eq("bond") & table["bond_index"].isna()
        placeholder &= table["error"].astype(str).eq("")
        table = table[~(failed | placeholder)].reset_index(drop=True)
        columns = ["row", "level", "atom_index", "element", "bond_index", "begin_atom"]
        columns += ["end_atom", "bond_type"]
        targets = [c for c in [*atoms.columns, *bonds.columns] if c not in {*columns, "error"}]
        return table[[*columns, *dict.fromkeys(targets), "error"]]

    def _bond_rows(self, smiles: Sequence[str], result: Predictions) -> pd.DataFrame:
        """One row per bond of every molecule (see :meth:`long_table`)."""
        return self._item_rows(BOND, smiles, result)

    def _atom_rows(self, smiles: Sequence[str], result: Predictions) -> pd.DataFrame | None:
        """One row per atom of every molecule (see :meth:`long_table`): the atom targets'
        columns, then the vectors' ``x``, ``y``, ``z``; None for a model of neither."""
        tables = [
            self._item_rows(level, smiles, result)
            for level in (ATOM, ATOM_VECTOR)
            if getattr(result, f"{level.name}s") is not None
        ]
        if not tables:
            return None
        table = tables[0]
        for other in tables[1:]:  # the same rows: each molecule's atoms, or its error row
            # the vectors' columns (and their spread's), between the atoms' and the error
            for name in other.columns[2 + len(_ITEM_COLUMNS[ATOM_VECTOR.name]) : -1]:
                table.insert(len(table.columns) - 1, name, other[name])
        return table

    def _item_rows(self, level: Level, smiles: Sequence[str], result: Predictions) -> pd.DataFrame:
        """One row per item (atom, bond) of ``level`` of every molecule: ``row``, its index,
        what it is (:data:`_ITEM_COLUMNS`), one column per target, ``error``."""
        arrays = getattr(result, f"{level.name}s")
        names = self.level_columns(level)
        spec = _ITEM_COLUMNS[level.name]
        extras = result.item_extras.get(level.name, {})
        rows, indices, values, errors = [], [], [], []
        extra_values: dict[str, list] = {suffix: [] for suffix in extras}
        described: dict[str, list] = {column: [] for column, _ in spec}
        for position, (text, items) in enumerate(zip(smiles, arrays, strict=True)):
            # A molecule without a prediction, or without bonds (an ion, one atom), keeps a row.
            if items is None or not len(items):
                rows.append(position)
                indices.append(pd.NA)
                for column, kind in spec:
                    described[column].append(pd.NA if kind == "Int64" else None)
                values.append(np.full(len(names), np.nan, dtype=np.float32))
                for suffix in extras:
                    extra_values[suffix].append(np.full(len(names), np.nan, dtype=np.float32))
                errors.append(result.errors[position])
                continue
            mol = text if isinstance(text, Chem.Mol) else Chem.MolFromSmiles(text)
            found = _describe(level, mol)
            rows += [position] * len(items)
            indices += range(len(items))
            for column, _ in spec:
                described[column] += found[column]
            values += [item.reshape(-1) for item in items]  # a vector's [T, 3] -> [3 T]
            for suffix, arrays in extras.items():
                extra_values[suffix] += [item.reshape(-1) for item in arrays[position]]
            errors += [""] * len(items)
        stacked = np.stack(values) if values else np.zeros((0, len(names)))
        index = "bond_index" if level is BOND else "atom_index"  # a vector's items are atoms
        columns = {"row": rows, index: pd.array(indices, dtype="Int64")}
        for column, kind in spec:
            columns[column] = (
                pd.array(described[column], dtype="Int64")
                if kind == "Int64"
                else pd.Series(described[column], dtype=object)
            )
        table = pd.DataFrame(columns)
        for t, name in enumerate(names):
            table[name] = stacked[:, t]
            for suffix, found in extra_values.items():
                table[f"{name}_{suffix}"] = np.stack(found)[:, t] if found else np.zeros(0)
        table["error"] = pd.Series(errors, dtype=object)
        return table

    def table(self, inputs: pd.DataFrame, result: Predictions) -> pd.DataFrame:
        """``inputs`` with one column per task and an ``error`` column appended. A name already
        taken by an input column gets a ``_pred`` suffix (a CSV of training data holds the
        targets' true values under the tasks' names)."""
        if len(inputs) != len(result.errors):
            raise ValueError(f"{len(inputs)} input rows but {len(result.errors)} results")
        out = inputs
        spread = (result.std, result.lower, result.upper)
        added = molecule_columns(self.task_names, result.values, *spread, self._classes)
        for level, level_names in ((ATOM, self.atom_task_names), (BOND, self.bond_task_names)):
            arrays = getattr(result, f"{level.name}s")
            if arrays is None:
                continue
            # One list per molecule and target (RDKit's atom or bond order), written as the
            # training CSV reads them; its spread and bounds beside it, as a molecule's.
            found = {"": arrays, **result.item_extras.get(level.name, {})}
            for t, name in enumerate(level_names):
                for suffix, lists in found.items():
                    added[f"{name}_{suffix}" if suffix else name] = np.array(
                        [None if a is None else format_atom_list(a[:, t]) for a in lists],
                        dtype=object,
                    )
        if result.atom_vectors is not None:
            # One list of [x, y, z] per atom, per molecule and vector target; an ensemble's or
            # MC dropout's spread beside it alike (a std per component).
            found = {"": result.atom_vectors, **result.item_extras.get(ATOM_VECTOR.name, {})}
            for t, name in enumerate(self.atom_vector_task_names):
                for suffix, lists in found.items():
                    added[f"{name}_{suffix}" if suffix else name] = np.array(
                        [None if a is None else format_vector_list(a[:, t]) for a in lists],
                        dtype=object,
                    )
        added["error"] = np.array(result.errors, dtype=object)
        taken = set(map(str, out.columns))
        renamed = []
        columns = {}
        for name, column in added.items():
            label = name
            while label in taken:
                label += "_pred"
            if label != name:
                renamed.append(f"{name} -> {label}")
            columns[label] = column
            taken.add(label)
        # One concatenation: a column at a time fragments the frame (hundreds of descriptor
        # targets of a descriptor pre-training checkpoint).
        out = pd.concat([out, pd.DataFrame(columns, index=out.index)], axis=1)
        if renamed:
            warnings.warn(
                f"the input already has column(s) named like outputs; outputs renamed: "
                f"{', '.join(renamed)}",
                stacklevel=2,
            )
        return out

    def outputs(self, values: np.ndarray) -> dict[str, Any]:
        """The output columns of predictions ``values``: one per task, named after it; for a
        multi-class task ``<task>_prob_<k>`` (the probability of class ``k``, one per class) and
        ``<task>``, the predicted class (empty where there is no prediction)."""
        return molecule_columns(self.task_names, values, num_classes=self._classes)

    @property
    def _classes(self) -> int | None:
        return self.task.num_classes if self.task.is_multiclass else None


# What the long layout says of each item beside its index: column and dtype.
_ITEM_COLUMNS = {
    "atom": (("element", "object"),),
    "atom_vector": (("element", "object"),),
    "bond": (("begin_atom", "Int64"), ("end_atom", "Int64"), ("bond_type", "object")),
}


def _describe(level: Level, mol: Chem.Mol) -> dict[str, list]:
    """The :data:`_ITEM_COLUMNS` of every atom (bond) of ``mol``, in RDKit's order."""
    if level is not BOND:
        return {"element": [a.GetSymbol() for a in mol.GetAtoms()]}
    bonds = list(mol.GetBonds())
    return {
        "begin_atom": [b.GetBeginAtomIdx() for b in bonds],
        "end_atom": [b.GetEndAtomIdx() for b in bonds],
        "bond_type": [str(b.GetBondType()) for b in bonds],
    }


def format_atom_list(values: np.ndarray) -> str:
    """Per-atom values as one CSV cell, ``[0.123, -0.3]``: the format training reads."""
    return "[" + ", ".join("nan" if v != v else f"{float(v):.6g}" for v in values) + "]"


def format_vector_list(vectors: np.ndarray) -> str:
    """Per-atom 3-vectors ``[n, 3]`` as one CSV cell, a JSON list of ``[x, y, z]``."""
    return "[" + ", ".join(format_atom_list(v) for v in vectors) + "]"
