"""A trained checkpoint applied to new molecules: predictions, embeddings, attention maps."""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from rdkit import Chem
from torch import Tensor
from torch_geometric.data import Data

from graphormer import checkpoint as checkpoints
from graphormer.checkpoint import CheckpointError
from graphormer.data.collate import GraphormerCollator
from graphormer.data.descriptors import MoleculeFeatures
from graphormer.data.featurize import (
    FeaturizedMolecules,
    featurize_smiles,
    molecule_bond_edges,
    smiles_feature_dims,
)
from graphormer.data.sampling import pack_by_tokens
from graphormer.data.sources.pyg_file import read_graphs
from graphormer.devices import DEFAULT_PRECISION, PRECISIONS, resolve_pad_to_multiple
from graphormer.errors import ConfigError, DataError
from graphormer.inference.attention import AttentionMaps, atom_labels
from graphormer.portable.calibration import Calibration, conformal_radius
from graphormer.training.evaluation import has_dropout
from graphormer.training.module import GraphormerModule
from graphormer.training.tasknames import (
    read_atom_task_names,
    read_bond_task_names,
    read_task_names,
    stored_source,
)

__all__ = [
    "LAYOUTS",
    "Predictions",
    "Predictor",
    "UnpredictableMoleculeWarning",
    "format_atom_list",
    "read_task_names",
]

# Tables of atom predictions: one row per molecule (list columns) or one row per atom.
LAYOUTS = ("wide", "long")

# Molecules featurised, sorted and predicted at a time: bounds memory on long inputs while
# leaving enough molecules to sort into tightly padded batches.
_CHUNK = 8192
# Long inputs get a progress bar.
_PROGRESS_MIN = 1000
# A batch holds at most batch_size molecules and at most batch_size * 64^2 attention entries per
# head, so that a few very large molecules never build one huge padded batch.
_PAIRS_PER_MOLECULE = 64 * 64


class UnpredictableMoleculeWarning(UserWarning):
    """Some molecules could not be featurised: their rows are kept with empty predictions."""


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
    """

    values: np.ndarray
    errors: list[str]
    embeddings: np.ndarray | None = None
    std: np.ndarray | None = None
    lower: np.ndarray | None = None
    upper: np.ndarray | None = None
    atoms: list[np.ndarray | None] | None = None
    bonds: list[np.ndarray | None] | None = None


class Predictor:
    """Scores molecules with a trained Graphormer, featurising them as its training did.

    Molecules are featurised with OGB's ``smiles2graph`` and the checkpoint's structural settings,
    sorted by size into batches (then put back in input order), and run in the training run's
    precision. A SMILES that cannot be featurised keeps its row, with NaN predictions and a reason.

    Args:
        module (GraphormerModule): a trained module (see :meth:`GraphormerModule.from_checkpoint`).
        task_names (Sequence[str] | None, optional): one name per task; default ``task_i``.
        max_hops (int | None, optional): path edges per pair in the batches (training's
            ``datamodule.max_hops``); None for the model's ``multi_hop_max_dist``.
        pad_to_multiple (int | None, optional): batch padding, as in training; None for the
            device's default (8 on GPUs, 1 on the CPU). (default: :obj:`None`)
        device (str, optional): ``auto`` (a GPU if one is visible), ``cpu``, ``cuda``,
            ``cuda:1``... (default: :obj:`"auto"`)
        precision (str, optional): a Lightning precision name (``32-true``, ``bf16-mixed``,
            ``16-mixed``, ``bf16-true``, ``64-true``...). (default: :obj:`"32-true"`)
        batch_size (int, optional): molecules per batch. (default: :obj:`128`)
        max_atoms (int | None, optional): larger molecules get an error instead of a prediction;
            None for no limit. (default: :obj:`1000`)
        training_smiles_column (str | None, optional): the SMILES column of the training CSV,
            the default column of ``scripts/predict.py``. (default: :obj:`None`)
        members (Sequence[GraphormerModule] | None, optional): an ensemble's other members:
            the prediction is their mean (of probabilities for binary tasks), with their spread
            (``std``). (default: :obj:`None`)
        mc_dropout (int, optional): K >= 2: K passes of a single model with dropout on, their
            mean and spread (MC dropout, Gal & Ghahramani 2016). (default: :obj:`0`)
        calibration (Calibration | None, optional): the run's ``calibration.json``: calibrated
            probabilities for binary tasks, intervals for regression. (default: :obj:`None`)
        atom_task_names (Sequence[str] | None, optional): one name per atom target (issue #18);
            default ``atom_i``. (default: :obj:`None`)
        bond_task_names (Sequence[str] | None, optional): one name per bond target; default
            ``bond_i``. (default: :obj:`None`)

    The module is put in eval mode and moved to ``device`` (and to the precision's dtype).

    Example::

        from graphormer import Predictor
        predictor = Predictor.from_checkpoint("outputs/.../checkpoints/best-epoch042.ckpt")
        table = predictor.predict(["CCO", "c1ccccc1O"])   # pandas.DataFrame
        vectors = predictor.embed(["CCO", "c1ccccc1O"])   # [2, hidden_dim]
        maps = predictor.attention("c1ccccc1O")           # AttentionMaps
    """

    def __init__(
        self,
        module: Any,
        task_names: Sequence[str] | None = None,
        *,
        max_hops: int | None = None,
        pad_to_multiple: int | None = None,
        device: str = "auto",
        precision: str = DEFAULT_PRECISION,
        batch_size: int = 128,
        max_atoms: int | None = 1000,
        training_smiles_column: str | None = None,
        members: Sequence[Any] | None = None,
        mc_dropout: int = 0,
        calibration: Calibration | None = None,
        atom_task_names: Sequence[str] | None = None,
        bond_task_names: Sequence[str] | None = None,
        molecule_features: MoleculeFeatures | None = None,
    ) -> None:
        # Auxiliary atom targets (issue #22) are trained, never predicted.
        task = module.task.without_auxiliary()
        num_tasks = task.num_tasks
        names = list(task_names) if task_names else [f"task_{i}" for i in range(num_tasks)]
        if len(names) != num_tasks:
            raise ValueError(f"{len(names)} task names for {num_tasks} tasks: {names}")
        atom_tasks = task.atom_tasks
        atom_names = list(atom_task_names or [f"atom_{i}" for i in range(atom_tasks)])
        if module.task.atom_auxiliary:
            atom_names = []  # the names of the auxiliary targets, if given, name no output
        if len(atom_names) != atom_tasks:
            raise ValueError(f"{len(atom_names)} atom task names for {atom_tasks}: {atom_names}")
        bond_tasks = task.bond_tasks
        bond_names = list(bond_task_names or [f"bond_{i}" for i in range(bond_tasks)])
        if len(bond_names) != bond_tasks:
            raise ValueError(f"{len(bond_names)} bond task names for {bond_tasks}: {bond_names}")
        if (atom_tasks or bond_tasks) and (members or mc_dropout):
            raise ConfigError(
                "ensembles and MC dropout predict molecule targets only: give one checkpoint of "
                "a model of atom or bond targets (issue #18), without mc_dropout"
            )
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        if max_atoms is not None and max_atoms < 1:
            raise ConfigError(f"max_atoms must be >= 1 (or null for no limit), got {max_atoms}")
        # Why SMILES cannot be predicted (a model of other graphs), said when SMILES are given:
        # predict_graphs still serves such a model.
        self.smiles_refusal = _molecule_features_problem(module.config)
        self.categorical_columns: tuple[list[int] | None, list[int] | None] = (None, None)
        self.modules = [module.eval(), *(m.eval() for m in members or [])]
        if isinstance(mc_dropout, bool) or not isinstance(mc_dropout, int) or mc_dropout < 0:
            raise ConfigError(f"mc_dropout={mc_dropout!r} is not allowed: a number of passes >= 0")
        if mc_dropout == 1:
            raise ConfigError(
                "mc_dropout=1 is not allowed: one pass has no spread, so <task>_std would be "
                "empty; give mc_dropout=K passes with K >= 2 (e.g. 10), or 0 for none"
            )
        if mc_dropout and len(self.modules) > 1:
            raise ConfigError(
                f"mc_dropout={mc_dropout} is for a single model: an ensemble's {len(self.modules)} "
                "members already give the spread; drop mc_dropout, or give one checkpoint"
            )
        if mc_dropout and not has_dropout(module.config):
            raise ConfigError(
                f"mc_dropout={mc_dropout} needs dropout, but this model was trained without it "
                "(model.dropout, attention_dropout and activation_dropout are 0): train with "
                "model.dropout=0.1, or use an ensemble (ensemble.size=N)"
            )
        self.mc_dropout = int(mc_dropout)
        self.calibration = calibration
        self.module = self.modules[0]
        self.task = task
        self.task_names = names
        self.atom_task_names = atom_names
        self.bond_task_names = bond_names
        self.training_smiles_column = training_smiles_column
        width = len(molecule_features.names()) if molecule_features is not None else 0
        if width != module.config.molecule_features_dim:
            raise ConfigError(
                f"the model reads {module.config.molecule_features_dim} molecule feature(s) per "
                f"molecule (issue #22) but {width} are described: build the Predictor with "
                "Predictor.from_checkpoint, which reads them from the checkpoint"
            )
        # What the model reads besides the graph, computed from each SMILES (and an input
        # table's columns) as the training data's were; the checkpoint holds the statistics.
        self.molecule_features = molecule_features
        self.device = _device(device)
        self.precision = str(precision)
        if self.precision not in PRECISIONS:
            raise ConfigError(
                f"precision={precision!r} is not one of {sorted(PRECISIONS)}; set "
                f"precision={DEFAULT_PRECISION}"
            )
        weights_dtype, self._autocast_dtype = PRECISIONS[self.precision]
        for member in self.modules:
            member.to(device=self.device, dtype=weights_dtype)
        hops = max_hops or module.config.multi_hop_max_dist
        try:
            module.config.check_hops(int(hops), key="max_hops")
        except ValueError as error:
            raise ConfigError(str(error)) from error
        padding = resolve_pad_to_multiple(pad_to_multiple, gpu=self.device.type == "cuda")
        self.collator = GraphormerCollator(max_hops=int(hops), pad_to_multiple=padding)
        self.batch_size = int(batch_size)
        self.max_atoms = max_atoms
        # Seconds spent so far featurising (SMILES parsing, smiles2graph, structural features,
        # padding) and in the model (including moving batches to the device and back).
        self.timings = {"featurize_s": 0.0, "model_s": 0.0, "molecules": 0}

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path | Sequence[str | Path],
        *,
        device: str = "auto",
        precision: str | None = None,
        batch_size: int = 128,
        max_atoms: int | None = 1000,
        mc_dropout: int = 0,
        allow_missing: bool = False,
    ) -> Predictor:
        """A predictor for a checkpoint written by ``train.py`` (or converted into that format),
        a run folder (its best checkpoint), an ensemble's folder or a list of checkpoints (the
        members' mean and spread).

        The checkpoints are read as data (weights only, digest verified), never as code. Their
        structural settings and, unless ``precision`` is given, the training precision are used;
        the run's ``calibration.json`` (when fitted for these weights) calibrates binary
        probabilities and gives intervals.
        """
        from graphormer.training.evaluation import calibration_of
        from graphormer.training.members import check_members, resolve_members

        found = resolve_members(path, allow_missing)
        records = [checkpoints.load(p) for p in found.paths]
        modules = [GraphormerModule.from_checkpoint(r) for r in records]
        check_members(records, modules)
        record, module = records[0], modules[0]
        path = found.paths[0]
        source = stored_source(module)
        refusal = source.smiles_refusal() if source is not None else None
        predictor = cls(
            module,
            read_task_names(module),
            max_hops=module.run_record.max_hops,
            pad_to_multiple=module.run_record.pad_to_multiple,
            device=device,
            precision=precision or record.precision or DEFAULT_PRECISION,
            batch_size=batch_size,
            max_atoms=max_atoms,
            training_smiles_column=source.smiles_column() if source is not None else None,
            members=modules[1:],
            mc_dropout=mc_dropout,
            calibration=calibration_of(found.folder, records),
            atom_task_names=read_atom_task_names(module),
            bond_task_names=read_bond_task_names(module),
            molecule_features=_stored_molecule_features(source, module.run_record, path),
        )
        if refusal is not None:
            predictor.smiles_refusal = f"checkpoint {path} {refusal}"
        if source is not None:
            config = module.config
            counts = (len(config.atom_feature_dims), len(config.bond_feature_dims))
            predictor.categorical_columns = source.categorical_columns(counts)
        return predictor

    @property
    def hidden_dim(self) -> int:
        return self.module.config.hidden_dim

    # -- the public calls -------------------------------------------------------------------

    def predict(
        self,
        smiles: Sequence[str],
        progress: bool = False,
        layout: str = "wide",
        features: pd.DataFrame | None = None,
    ) -> pd.DataFrame:
        """One row per SMILES, in order: ``smiles``, one column per task (probabilities for
        binary tasks, original units for regression; empty where there is no prediction) and
        ``error`` (empty, or why that molecule has no prediction). A model of atom (bond)
        targets adds one list column per atom (bond) target (``[v0, v1, ...]`` in RDKit's atom
        (bond) order); with ``layout="long"`` the table has one row per atom and bond instead
        (:meth:`atom_table`). ``features``: a table with one row per SMILES holding the columns
        a model trained with ``dataset.feature_columns`` reads (issue #22)."""
        if layout not in LAYOUTS:
            raise ConfigError(f"layout={layout!r} is not one of {', '.join(LAYOUTS)}")
        smiles = _smiles_list(smiles)
        result = self.run(smiles, progress=progress, features=features)
        # object dtype: the SMILES come back exactly as given (None stays None).
        inputs = pd.DataFrame({"smiles": pd.Series(list(smiles), dtype=object)})
        if layout == "long":
            return self.atom_table(smiles, result)
        return self.table(inputs, result)

    def atom_table(self, smiles: Sequence[str], result: Predictions) -> pd.DataFrame:
        """The long layout (``layout=long``): one row per atom of every molecule (``row``, the
        input's position; ``atom_index``, RDKit's; ``element``; one column per atom target;
        ``error``) for a model of atom targets, one row per bond (``row``, ``bond_index``,
        RDKit's; ``begin_atom``, ``end_atom``; ``bond_type``; one column per bond target;
        ``error``) for a model of bond targets, and for a model of both, the two stacked with a
        ``level`` column (``atom`` or ``bond``), each molecule's atoms then its bonds, the
        other level's columns empty. A molecule without a prediction keeps one row, with empty
        indices and the reason in ``error``."""
        if result.atoms is None and result.bonds is None:
            raise ConfigError(
                "layout=long writes one row per atom or bond, and this model predicts no atom "
                "or bond targets: use layout=wide"
            )
        if result.bonds is None:
            return self._atom_rows(smiles, result)
        bonds = self._bond_rows(smiles, result)
        if result.atoms is None:
            return bonds
        atoms = self._atom_rows(smiles, result)
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
        columns += ["end_atom", "bond_type", *self.atom_task_names, *self.bond_task_names]
        return table[[*columns, "error"]]

    def _bond_rows(self, smiles: Sequence[str], result: Predictions) -> pd.DataFrame:
        """One row per bond of every molecule (see :meth:`atom_table`)."""
        rows, indices, begins, ends, types, values, errors = [], [], [], [], [], [], []
        width = len(self.bond_task_names)
        for position, (text, bonds) in enumerate(zip(smiles, result.bonds, strict=True)):
            # A molecule without a prediction, or without bonds (an ion, one atom), keeps a row.
            if bonds is None or not len(bonds):
                rows.append(position)
                indices.append(pd.NA)
                begins.append(pd.NA)
                ends.append(pd.NA)
                types.append(None)
                values.append(np.full(width, np.nan, dtype=np.float32))
                errors.append(result.errors[position])
                continue
            found = list(Chem.MolFromSmiles(text).GetBonds())
            rows += [position] * len(bonds)
            indices += range(len(bonds))
            begins += [b.GetBeginAtomIdx() for b in found]
            ends += [b.GetEndAtomIdx() for b in found]
            types += [str(b.GetBondType()) for b in found]
            values += list(bonds)
            errors += [""] * len(bonds)
        stacked = np.stack(values) if values else np.zeros((0, width))
        table = pd.DataFrame(
            {
                "row": rows,
                "bond_index": pd.array(indices, dtype="Int64"),
                "begin_atom": pd.array(begins, dtype="Int64"),
                "end_atom": pd.array(ends, dtype="Int64"),
                "bond_type": pd.Series(types, dtype=object),
            }
        )
        for t, name in enumerate(self.bond_task_names):
            table[name] = stacked[:, t]
        table["error"] = pd.Series(errors, dtype=object)
        return table

    def _atom_rows(self, smiles: Sequence[str], result: Predictions) -> pd.DataFrame:
        """One row per atom of every molecule (see :meth:`atom_table`)."""
        rows, indices, elements, values, errors = [], [], [], [], []
        for position, (text, atoms) in enumerate(zip(smiles, result.atoms, strict=True)):
            if atoms is None:
                rows.append(position)
                indices.append(pd.NA)
                elements.append(None)
                values.append(np.full(len(self.atom_task_names), np.nan, dtype=np.float32))
                errors.append(result.errors[position])
                continue
            symbols = [a.GetSymbol() for a in Chem.MolFromSmiles(text).GetAtoms()]
            rows += [position] * len(atoms)
            indices += range(len(atoms))
            elements += symbols
            values += list(atoms)
            errors += [""] * len(atoms)
        stacked = np.stack(values) if values else np.zeros((0, len(self.atom_task_names)))
        table = pd.DataFrame(
            {
                "row": rows,
                "atom_index": pd.array(indices, dtype="Int64"),
                "element": pd.Series(elements, dtype=object),
            }
        )
        for t, name in enumerate(self.atom_task_names):
            table[name] = stacked[:, t]
        table["error"] = pd.Series(errors, dtype=object)
        return table

    def embed(self, smiles: Sequence[str], progress: bool = False) -> np.ndarray:
        """``[n, hidden_dim]`` float32: each molecule's graph token after the last layer (what the
        prediction head's first layer reads; a ``token_mean`` or ``token_sum`` readout also reads
        the atoms' states, which this leaves out); NaN rows where a SMILES cannot be featurised."""
        return self.run(smiles, embeddings=True, progress=progress).embeddings

    def attention(self, smiles: str) -> AttentionMaps:
        """Every layer's per-head attention over one molecule's atoms and the graph token."""
        if not isinstance(smiles, str):
            raise TypeError("attention takes one SMILES string; attention_maps takes a list")
        return self.attention_maps([smiles])[0]

    def attention_maps(self, smiles: Sequence[str]) -> list[AttentionMaps]:
        """:meth:`attention` for several molecules, computed in one padded batch; each map is
        cut to its own molecule (no padding)."""
        smiles = _smiles_list(smiles)
        self._check_smiles_allowed()
        featurized = self._featurize(smiles)
        for i, error in enumerate(featurized.errors):
            if error:
                raise DataError(f"SMILES {smiles[i]!r} (item {i}): {error}")
        self._attach_molecule_features(featurized, smiles, None)
        batch = self.collator(featurized.graphs)
        atoms = bonds = contributions = None
        model = self.module.model
        explains_atoms = (
            model.config.readout == "token_sum"
            and model.head is not None
            and not self.task.is_multiclass
        )
        with self._inference():
            on_device = batch.to(self.device)
            h = None
            if self.task.atom_tasks or self.task.bond_tasks:
                levels, attention = self.module.forward_levels(on_device, return_attention=True)
                out = levels["molecule"]
                per_level = self._level_arrays(levels, batch)
                atoms, bonds = per_level.get("atom"), per_level.get("bond")
            elif explains_atoms:
                # One pass: the prediction and the atoms' terms from the same final states.
                h, attention = model.encode(on_device, return_attention=True)
                out = self.module.to_units(model.molecule_output(h, on_device))
            else:
                out, attention = self.module(on_device, return_attention=True)
            if explains_atoms:
                if h is None:  # a model of atom or bond targets too: the same kernels again
                    h, _ = model.encode(on_device, return_attention=True)
                # Each atom's additive term in the targets' units (logits for binary tasks):
                # the target standardisation scales it; its mean is the graph token's part.
                per_atom = model.atom_contributions(h, on_device).float()
                contributions = (per_atom * self.module.target_std.float()).cpu().numpy()
        values = self._outputs(out)
        stacked = torch.stack([a.float() for a in attention], dim=1).cpu()  # [B, L, H, N+1, N+1]
        node_mask = batch.node_mask
        maps = []
        for b, text in enumerate(smiles):
            # The graph token (0) and this molecule's atoms, whose rows and columns the collator
            # places first; everything after them is padding.
            keep = torch.cat([torch.tensor([0]), node_mask[b].nonzero().squeeze(1) + 1])
            weights = stacked[b][:, :, keep][:, :, :, keep]  # [L, H, n+1, n+1]
            maps.append(
                AttentionMaps(
                    smiles=text,
                    labels=atom_labels(text),
                    weights=weights.numpy(),
                    predictions={
                        k: None if pd.isna(v[0]) else v[0].item()
                        for k, v in self.outputs(values[b : b + 1]).items()
                    },
                    atom_predictions={
                        name: atoms[b][:, t].tolist() for t, name in enumerate(self.atom_task_names)
                    }
                    if atoms is not None
                    else {},
                    bond_predictions={
                        name: bonds[b][:, t].tolist() for t, name in enumerate(self.bond_task_names)
                    }
                    if bonds is not None
                    else {},
                    atom_contributions={
                        name: contributions[b][node_mask[b].numpy()][:, t].tolist()
                        for t, name in enumerate(self.task_names)
                    }
                    if contributions is not None
                    else {},
                )
            )
        return maps

    @property
    def spread(self) -> str | None:
        """Where ``std`` comes from: ``ensemble``, ``mc`` (MC dropout) or None."""
        if len(self.modules) > 1:
            return "ensemble"
        return "mc" if self.mc_dropout else None

    def run(
        self,
        smiles: Sequence[str],
        embeddings: bool = False,
        progress: bool = False,
        interval: float | None = None,
        features: pd.DataFrame | None = None,
    ) -> Predictions:
        """Predictions (and embeddings) of every SMILES, in input order; ``interval`` (a
        coverage level such as 0.9) adds calibrated intervals (regression); ``features``: the
        input table (one row per SMILES) of a model trained with ``dataset.feature_columns``."""
        smiles = _smiles_list(smiles)
        if features is not None and len(features) != len(smiles):
            raise ValueError(f"{len(features)} feature rows for {len(smiles)} SMILES")
        self._check_smiles_allowed()
        if interval is not None:
            self._check_interval(interval)
        n = len(smiles)
        values = np.full((n, self.task.num_outputs), np.nan, dtype=np.float32)
        spread = np.full_like(values, np.nan) if self.spread else None
        vectors = np.full((n, self.hidden_dim), np.nan, dtype=np.float32) if embeddings else None
        errors = [""] * n
        atoms: list | None = [None] * n if self.task.atom_tasks else None
        bonds: list | None = [None] * n if self.task.bond_tasks else None
        bar = _progress_bar(n, progress)
        try:
            for start in range(0, n, _CHUNK):
                begin = time.perf_counter()
                featurized = self._featurize(smiles[start : start + _CHUNK])
                part = None if features is None else features.iloc[start : start + _CHUNK]
                self._attach_molecule_features(featurized, smiles[start : start + _CHUNK], part)
                self.timings["featurize_s"] += time.perf_counter() - begin
                errors[start : start + len(featurized.errors)] = featurized.errors
                bar.update(len(featurized.errors) - len(featurized.valid))
                for rows in self._batches(featurized):
                    graphs = [featurized.graphs[i] for i in rows]
                    out, std, graph_states, per_level = self._predict_batch(
                        graphs, vectors is not None
                    )
                    values[start + rows.numpy()] = out
                    for level, found in (("atom", atoms), ("bond", bonds)):
                        if found is not None:
                            for i, array in zip(rows.tolist(), per_level[level], strict=True):
                                found[start + i] = array
                    if spread is not None:
                        spread[start + rows.numpy()] = std
                    if vectors is not None:
                        vectors[start + rows.numpy()] = graph_states
                    bar.update(len(rows))
        finally:
            bar.close()
        self.timings["molecules"] += n
        failed = [i for i, e in enumerate(errors) if e]
        if failed:
            warnings.warn(
                f"{len(failed)} of {n} molecules have no prediction (first: item {failed[0]}, "
                f"{errors[failed[0]]}); their rows are kept, with the reason in `error`",
                UnpredictableMoleculeWarning,
                stacklevel=2,
            )
        result = Predictions(values, errors, vectors, spread, atoms=atoms, bonds=bonds)
        return self._finish(result, interval)

    def _finish(self, result: Predictions, interval: float | None) -> Predictions:
        """``result`` with the run's calibration applied: calibrated binary probabilities, and
        intervals at level ``interval`` (regression)."""
        values, calibration = result.values, self.calibration
        if calibration is not None and calibration.calibrates_probabilities:
            result.values = calibration.calibrate(values).astype(np.float32)
        if interval is not None:
            lower, upper = calibration.intervals(values, result.std, interval, self.spread)
            result.lower, result.upper = lower.astype(np.float32), upper.astype(np.float32)
        return result

    def _check_interval(self, interval: float) -> None:
        if self.task.is_classification or self.task.is_multiclass:
            raise ConfigError(
                f"interval={interval} is for regression models; this one predicts "
                "probabilities (calibrated with the run's calibration, if it has one)"
            )
        if self.calibration is None or self.calibration.residual is None:
            raise ConfigError(
                f"interval={interval} needs the run's calibration (calibration.json beside "
                "checkpoints/, written at the end of training, for these very weights): give "
                "ckpt= the run folder or a checkpoint inside its checkpoints/ folder"
            )
        if isinstance(interval, bool) or not isinstance(interval, int | float):
            raise ConfigError(f"interval={interval!r} is not allowed: a level in (0, 1), e.g. 0.9")
        passes = self.calibration.mc_passes
        if self.mc_dropout and passes is not None and self.mc_dropout != passes:
            # The spread of K passes is another estimator for each K: the intervals' coverage
            # holds for the number of passes they were calibrated with.
            raise ConfigError(
                f"interval={interval} with mc_dropout={self.mc_dropout}: the run's intervals "
                f"were calibrated with {passes} MC-dropout passes; give mc_dropout={passes}, or "
                "drop mc_dropout for intervals from the plain residuals"
            )
        # Too few validation molecules for this level: said before anything is computed.
        conformal_radius(np.asarray(self.calibration.residual[0]), float(interval))

    def table(self, inputs: pd.DataFrame, result: Predictions) -> pd.DataFrame:
        """``inputs`` with one column per task and an ``error`` column appended. A name already
        taken by an input column gets a ``_pred`` suffix (a CSV of training data holds the
        targets' true values under the tasks' names)."""
        if len(inputs) != len(result.errors):
            raise ValueError(f"{len(inputs)} input rows but {len(result.errors)} results")
        out = inputs
        added = self.outputs(result.values)
        names = (
            [f"{self.task_names[0]}_prob_{k}" for k in range(self.task.num_classes)]
            if self.task.is_multiclass
            else self.task_names
        )
        for j, name in enumerate(names):
            if result.std is not None:
                added[f"{name}_std"] = result.std[:, j]
            if result.lower is not None:
                added[f"{name}_lower"] = result.lower[:, j]
                added[f"{name}_upper"] = result.upper[:, j]
        if result.atoms is not None:
            # One list per molecule and atom target, written as the training CSV reads them.
            for t, name in enumerate(self.atom_task_names):
                added[name] = np.array(
                    [None if a is None else format_atom_list(a[:, t]) for a in result.atoms],
                    dtype=object,
                )
        if result.bonds is not None:
            # Likewise per bond target, in RDKit's bond order.
            for t, name in enumerate(self.bond_task_names):
                added[name] = np.array(
                    [None if a is None else format_atom_list(a[:, t]) for a in result.bonds],
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
        if not self.task.is_multiclass:
            return {name: values[:, j] for j, name in enumerate(self.task_names)}
        name = self.task_names[0]
        columns: dict[str, Any] = {
            f"{name}_prob_{k}": values[:, k] for k in range(self.task.num_classes)
        }
        predicted = pd.array([pd.NA] * len(values), dtype="Int64")
        valid = ~np.isnan(values).any(-1)
        predicted[valid] = values[valid].argmax(-1)
        columns[name] = predicted
        return columns

    def predict_graphs(
        self, graphs: Sequence[Data], embeddings: bool = False, interval: float | None = None
    ) -> Predictions:
        """Predictions (and embeddings) of PyG graphs, in input order, for a model trained on any
        source: features split into categorical and continuous columns as its training data
        were (``x``, ``edge_attr``; ``num_nodes`` without ``x``). A graph that does not fit
        the model (other feature columns, a class id beyond its tables, a NaN, too many nodes)
        keeps its row with NaN predictions and the reason in ``errors``. An ensemble or MC
        dropout adds ``std``; ``interval`` calibrated intervals (regression), as :meth:`run`."""
        if self.molecule_features is not None:
            raise ConfigError(
                "this model reads molecule features (RDKit descriptors or a file's columns, "
                "issue #22), which are computed from SMILES: predict with SMILES (predict.py "
                "input=FILE.csv, or Predictor.predict)"
            )
        if interval is not None:
            self._check_interval(interval)
        graphs = list(graphs)
        n = len(graphs)
        values = np.full((n, self.task.num_outputs), np.nan, dtype=np.float32)
        spread = np.full_like(values, np.nan) if self.spread else None
        vectors = np.full((n, self.hidden_dim), np.nan, dtype=np.float32) if embeddings else None
        errors = [""] * n
        atoms: list | None = [None] * n if self.task.atom_tasks else None
        bonds: list | None = [None] * n if self.task.bond_tasks else None
        inputs: dict[int, Data] = {}
        for i, graph in enumerate(graphs):
            try:
                inputs[i] = self._graph_input(graph)
            except DataError as error:
                # The checks name a one-graph list ("graph: graph 0 ..."): name the input's row.
                errors[i] = str(error).replace("graph: graph 0", f"graph {i}", 1)
                errors[i] = errors[i].replace(" before training)", ")")
        order = sorted(inputs, key=lambda i: inputs[i].num_nodes)
        pairs = [(inputs[i].num_nodes + 1) ** 2 for i in order]
        counts = pack_by_tokens(pairs, self.batch_size, self.batch_size * _PAIRS_PER_MOLECULE)
        start = 0
        for count in counts:
            rows = np.array(order[start : start + count])
            start += count
            out, std, states, per_level = self._predict_batch([inputs[i] for i in rows], embeddings)
            values[rows] = out
            for level, found in (("atom", atoms), ("bond", bonds)):
                if found is not None:
                    for i, array in zip(rows.tolist(), per_level[level], strict=True):
                        found[i] = array
            if spread is not None:
                spread[rows] = std
            if vectors is not None:
                vectors[rows] = states
        result = Predictions(values, errors, vectors, spread, atoms=atoms, bonds=bonds)
        return self._finish(result, interval)

    def _graph_input(self, graph: Any) -> Data:
        """One graph as the model reads it, or a DataError saying why it cannot be."""
        if not isinstance(graph, Data):
            raise DataError(f"a {type(graph).__name__}, not a torch_geometric.data.Data")
        node_columns, edge_columns = self.categorical_columns
        x, edge_attr = graph.get("x"), graph.get("edge_attr")
        if node_columns is None:  # every column categorical (OGB-style sources)
            node_columns = list(range(x.view(x.size(0), -1).size(1))) if x is not None else []
        if edge_columns is None:
            width = edge_attr.view(edge_attr.size(0), -1).size(1) if edge_attr is not None else 0
            edge_columns = list(range(width))
        read = read_graphs([graph], "graph", node_columns, edge_columns, with_labels=False)
        config = self.module.config
        nodes = int(read.slices["x"][1])
        if self.max_atoms is not None and nodes > self.max_atoms:
            raise DataError(f"{nodes} nodes, more than max_atoms={self.max_atoms}")
        for kind, dims, width, model_dims, model_width in (
            ("node", read.node_dims, read.node_width, config.atom_feature_dims,
             config.node_continuous_dim),
            ("edge", read.edge_dims, read.edge_width, config.bond_feature_dims,
             config.edge_continuous_dim),
        ):  # fmt: skip
            if len(dims) != len(model_dims) or width != model_width:
                raise DataError(
                    f"{len(dims)} categorical and {width} continuous {kind} feature column(s); "
                    f"the model reads {len(model_dims)} and {model_width}"
                )
            beyond = [c for c, (d, m) in enumerate(zip(dims, model_dims, strict=True)) if d > m]
            if beyond:
                column = beyond[0]
                raise DataError(
                    f"{kind} feature column {column} holds id {dims[column] - 1}, beyond the "
                    f"model's {model_dims[column]} classes of that column"
                )
        # Structural features are computed per batch by the collator (its on-the-fly mode).
        data = read.data
        if self.task.bond_tasks:  # an edge-level model predicts every listed edge (pyg_file)
            data.bond_edge = torch.arange(data.edge_index.size(1), dtype=torch.long)
        return data

    def _featurize(self, smiles: Sequence[str]) -> FeaturizedMolecules:
        """OGB's featurisation of ``smiles`` (None and a reason where it fails); a model of bond
        targets also gets each graph's bond edges (bond k of a molecule is its edge 2k)."""
        featurized = featurize_smiles(smiles, self.max_atoms)
        if self.task.bond_tasks:
            for graph in featurized.graphs:
                if graph is not None:
                    graph.bond_edge = molecule_bond_edges(graph)
        return featurized

    def _check_smiles_allowed(self) -> None:
        if self.smiles_refusal is not None:
            raise CheckpointError(self.smiles_refusal)

    # -- internals ----------------------------------------------------------------------------

    def _attach_molecule_features(
        self, featurized: FeaturizedMolecules, smiles: Sequence[str], table: pd.DataFrame | None
    ) -> None:
        """Gives each valid graph its raw ``molecule_features`` ``[1, D]``, computed as the
        training data's were (the model applies the training statistics)."""
        if self.molecule_features is None or not len(featurized.valid):
            return
        if table is not None:
            table = table.reset_index(drop=True)
        values = self.molecule_features.compute(smiles, table, "the input")
        for i in featurized.valid.tolist():
            featurized.graphs[i].molecule_features = torch.from_numpy(values[i]).view(1, -1)

    def _batches(self, featurized: FeaturizedMolecules) -> Iterator[Tensor]:
        """Positions of the valid molecules in batches of similar size (smallest first)."""
        valid = featurized.valid
        if not len(valid):
            return
        order = valid[torch.argsort(featurized.num_atoms[valid], stable=True)]
        # A molecule's cost: its attention pairs, graph token included.
        pairs = ((featurized.num_atoms[order] + 1) ** 2).tolist()
        counts = pack_by_tokens(pairs, self.batch_size, self.batch_size * _PAIRS_PER_MOLECULE)
        yield from order.split(counts)

    def _predict_batch(
        self, graphs: list, embeddings: bool
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, dict[str, list[np.ndarray]]]:
        """The mean prediction of a batch, its spread (members or MC passes; None for one
        deterministic model), the first model's graph states and, for a model of atom (bond)
        targets, each graph's ``[n_atoms, T_atom]`` (``[n_bonds, T_bond]``) predictions by
        level (``atom``, ``bond``)."""
        begin = time.perf_counter()
        batch = self.collator(graphs)
        middle = time.perf_counter()
        captured: list[Tensor] = []
        hook = None
        per_level: dict[str, list[np.ndarray]] = {}
        if embeddings and self.module.model.head_transform is None:
            raise ConfigError(
                "embeddings are the graph token's state read by the molecule head, and this "
                "model predicts atom or bond targets alone"
            )
        if embeddings:
            # The graph token's final state is what the head's first layer reads: captured there,
            # so that predictions and embeddings come from one forward pass.
            hook = self.module.model.head_transform.register_forward_pre_hook(
                lambda _, args: captured.append(args[0])
            )
        outputs = []
        try:
            with self._inference():
                batch = batch.to(self.device, non_blocking=True)
                if self.task.atom_tasks or self.task.bond_tasks:
                    # One model (checked when built): every level at once.
                    levels = self.module.forward_levels(batch)
                    outputs.append(self._outputs(levels["molecule"]))
                    per_level = self._level_arrays(levels, batch)
                else:
                    for member in self.modules:
                        for k in range(max(1, self.mc_dropout)):
                            outputs.append(self._pass(member, batch, k))
                states = captured[0].float().cpu().numpy() if embeddings else None
        finally:
            if hook is not None:
                hook.remove()
        end = time.perf_counter()
        self.timings["featurize_s"] += middle - begin
        self.timings["model_s"] += end - middle
        stacked = np.stack(outputs)  # [members x passes, B, T]
        std = stacked.std(0) if len(outputs) > 1 else None
        return stacked.mean(0), std, states, per_level

    def _level_arrays(self, levels: dict[str, Tensor], batch: Any) -> dict[str, list[np.ndarray]]:
        """Each graph's real atoms ``[n_atoms, T_atom]`` and bonds ``[n_bonds, T_bond]`` (the
        collator keeps RDKit's orders; probabilities for binary levels)."""
        found = {}
        for level, mask, task_type in (
            ("atom", batch.node_mask, self.task.atom_task_type),
            ("bond", batch.bond_mask, self.task.bond_task_type),
        ):
            if level not in levels:
                continue
            values = levels[level].float()
            if task_type == "binary":
                values = torch.sigmoid(values)
            values, counts = values.cpu().numpy(), mask.sum(1).tolist()
            found[level] = [values[b, :n] for b, n in enumerate(counts)]
        return found

    def _pass(self, member: Any, batch: Any, k: int) -> np.ndarray:
        """One forward pass; with MC dropout, pass ``k`` has dropout on, seeded by ``k`` so that
        a prediction is reproducible."""
        if not self.mc_dropout:
            return self._outputs(member(batch))
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            torch.manual_seed(k)
            member.model.train()
            try:
                return self._outputs(member(batch))
            finally:
                member.eval()

    def _outputs(self, out: Tensor) -> np.ndarray:
        out = out.float()
        if self.task.is_classification:
            out = torch.sigmoid(out)  # the module gives logits; users read probabilities
        elif self.task.is_multiclass:
            out = torch.softmax(out, dim=-1)
        return out.cpu().numpy()

    @contextmanager
    def _inference(self) -> Iterator[None]:
        """No autograd, and the training run's mixed precision (as Lightning's plugin does)."""
        autocast = (
            torch.autocast(self.device.type, dtype=self._autocast_dtype)
            if self._autocast_dtype is not None
            else nullcontext()
        )
        with torch.inference_mode(), autocast:
            yield


def format_atom_list(values: np.ndarray) -> str:
    """Per-atom values as one CSV cell, ``[0.123, -0.3]``: the format training reads."""
    return "[" + ", ".join("nan" if v != v else f"{float(v):.6g}" for v in values) + "]"


def _stored_molecule_features(
    source: Any, run: checkpoints.RunRecord, path: Any
) -> MoleculeFeatures | None:
    """The molecule features a checkpoint's model reads (issue #22), checked against what this
    installation computes under the same names (another RDKit may list other descriptors)."""
    features = source.molecule_features() if source is not None else None
    if features is None:
        return None
    stored = run.molecule_feature_names()
    if stored and stored != features.names():
        differ = sorted(set(stored) ^ set(features.names()))[:5]
        raise CheckpointError(
            f"checkpoint {path} reads molecule features this installation computes "
            f"differently (RDKit's descriptor list differs: {differ}); predict with the RDKit "
            "version it was trained with"
        )
    return features


def _smiles_list(smiles: Sequence[str]) -> list:
    if isinstance(smiles, str):
        # A string is a sequence of characters: never read "CCO" as three molecules.
        raise TypeError(f"pass a list of SMILES, e.g. [{smiles!r}], not a single string")
    return list(smiles)


def _device(name: str) -> torch.device:
    name = str(name)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise ConfigError(
            f"device={name!r} is not a device name; use device=cpu, cuda, cuda:1 or auto"
        ) from error
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={name} but no CUDA device is visible; use device=cpu")
    if device.type == "cuda" and device.index is not None:
        if device.index >= torch.cuda.device_count():
            raise ConfigError(
                f"device={name} but only {torch.cuda.device_count()} CUDA device(s) are visible"
            )
    return device


def _molecule_features_problem(config: Any) -> str | None:
    """Why SMILES (OGB's 9 atom and 3 bond features) do not fit the model's tables; None when
    they do."""
    atoms, bonds = smiles_feature_dims()
    model_atoms, model_bonds = list(config.atom_feature_dims), list(config.bond_feature_dims)
    fits = (
        len(model_atoms) == len(atoms)
        and len(model_bonds) == len(bonds)
        and all(m >= o for m, o in zip(model_atoms, atoms, strict=True))
        and all(m >= o for m, o in zip(model_bonds, bonds, strict=True))
        and config.node_continuous_dim == 0
        and config.edge_continuous_dim == 0
    )
    if fits:
        return None
    return (
        f"this checkpoint's model reads {len(model_atoms)} node and {len(model_bonds)} edge "
        f"features (vocabularies {model_atoms} / {model_bonds}), not OGB's molecule "
        "featurisation of SMILES: it was trained on other graphs; predict its graphs with "
        "Predictor.predict_graphs (predict.py input=graphs.pt)"
    )


def _progress_bar(total: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        unit="mol",
        desc="predicting",
        # Off a terminal (a log file, a pipe) a redrawn bar is noise.
        disable=not enabled or total < _PROGRESS_MIN or not sys.stderr.isatty(),
        leave=False,
    )
