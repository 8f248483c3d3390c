"""A trained checkpoint applied to new molecules: predictions, embeddings, attention maps."""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from torch import Tensor
from torch_geometric.data import Data

from graphormer import checkpoint as checkpoints
from graphormer.checkpoint import CheckpointError
from graphormer.data.collate import GraphormerCollator
from graphormer.data.descriptors import MoleculeFeatures
from graphormer.data.sampling import pack_by_tokens
from graphormer.data.tasks import ATOM_VECTOR
from graphormer.devices import DEFAULT_PRECISION, resolve_pad_to_multiple
from graphormer.errors import ConfigError, DataError
from graphormer.inference.attention import AttentionMaps, attention_maps
from graphormer.inference.inputs import (
    PAIRS_PER_MOLECULE,
    attach_molecule_features,
    conformer_mean,
    embed_positions,
    featurize,
    graph_input,
    molecule_features_problem,
    progress_bar,
    size_batches,
    smiles_list,
    stored_molecule_features,
)
from graphormer.inference.tables import LAYOUTS, OutputNames, Predictions, format_atom_list
from graphormer.runner import (
    ModelRunner,
    check_mc_dropout,
    probabilities,
    resolve_device,
)
from graphormer.training.module import GraphormerModule
from graphormer.training.tasknames import (
    level_task_names,
    read_atom_task_names,
    read_bond_task_names,
    read_task_names,
    stored_source,
)
from graphormer.uncertainty.calibration import Calibration, calibration_of
from graphormer.uncertainty.intervals import calibrated, check_interval, item_intervals

__all__ = [
    "LAYOUTS",
    "Predictions",
    "Predictor",
    "UnpredictableMoleculeWarning",
    "format_atom_list",
    "read_task_names",
]

# Molecules featurised, sorted and predicted at a time: bounds memory on long inputs while
# leaving enough molecules to sort into tightly padded batches.
_CHUNK = 8192


class UnpredictableMoleculeWarning(UserWarning):
    """Some molecules could not be featurised: their rows are kept with empty predictions."""


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
        atom_vector_task_names (Sequence[str] | None, optional): one name per per-atom vector
            target (forces); default ``atom_vector_i``. (default: :obj:`None`)
        conformers (int, optional): RDKit conformers embedded per SMILES, for a model trained
            on ``dataset.conformers``; the prediction is their mean. (default: :obj:`0`)

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
        atom_vector_task_names: Sequence[str] | None = None,
        conformers: int = 0,
    ) -> None:
        self.names = OutputNames.of(
            module.task, task_names, atom_task_names, bond_task_names, atom_vector_task_names
        )
        self.conformers = int(conformers)
        task = self.names.task
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        if max_atoms is not None and max_atoms < 1:
            raise ConfigError(f"max_atoms must be >= 1 (or null for no limit), got {max_atoms}")
        # Why SMILES cannot be predicted (a model of other graphs), said when SMILES are given:
        # predict_graphs still serves such a model.
        self.smiles_refusal = molecule_features_problem(module.config)
        self.categorical_columns: tuple[list[int] | None, list[int] | None] = (None, None)
        # The training source's periodic-image distance (from_checkpoint sets it), for
        # structure files; None: the default, PBC_CUTOFF.
        self.periodic_cutoff: float | None = None
        self.periodic_around = "adsorbate"
        self.modules = [module.eval(), *(m.eval() for m in members or [])]
        # Pass k of MC dropout is seeded by k, so that a prediction is reproducible.
        self.mc_dropout = check_mc_dropout(mc_dropout, len(self.modules), module.config)
        self.calibration = calibration
        self.module = self.modules[0]
        self.task = task
        self.task_names = self.names.task_names
        self.atom_task_names = self.names.atom_task_names
        self.bond_task_names = self.names.bond_task_names
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
        self.device = resolve_device(device)
        self.precision = str(precision)
        self._runner = ModelRunner(
            self.modules, self.mc_dropout, device=self.device, precision=self.precision
        )
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
        conformers: bool = True,
    ) -> Predictor:
        """A predictor for a checkpoint written by ``train.py`` (or converted into that format),
        a run folder (its best checkpoint), an ensemble's folder or a list of checkpoints (the
        members' mean and spread).

        The checkpoints are read as data (weights only, digest verified), never as code. Their
        structural settings and, unless ``precision`` is given, the training precision are used;
        the run's ``calibration.json`` (when fitted for these weights) calibrates binary
        probabilities and gives intervals. SMILES get conformers as training did (``dataset.
        conformers``) unless ``conformers`` is False (``model.channels=both`` then reads 2D).
        """
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
            molecule_features=stored_molecule_features(source, module.run_record, path),
            atom_vector_task_names=level_task_names(module, ATOM_VECTOR),
            conformers=source.prediction_conformers() if source is not None and conformers else 0,
        )
        if refusal is not None:
            predictor.smiles_refusal = f"checkpoint {path} {refusal}"
        if source is not None:
            config = module.config
            counts = (len(config.atom_feature_dims), len(config.bond_feature_dims))
            predictor.categorical_columns = source.categorical_columns(counts)
            # Structure files read for prediction get the images training's data had.
            predictor.periodic_cutoff = source.periodic_cutoff()
            predictor.periodic_around = source.periodic_around()
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
        smiles = smiles_list(smiles)
        result = self.run(smiles, progress=progress, features=features)
        # object dtype: the SMILES come back exactly as given (None stays None).
        inputs = pd.DataFrame({"smiles": pd.Series(list(smiles), dtype=object)})
        if layout == "long":
            return self.atom_table(smiles, result)
        return self.table(inputs, result)

    def atom_table(self, smiles: Sequence[str], result: Predictions) -> pd.DataFrame:
        """The long layout (``layout=long``): :meth:`OutputNames.long_table`."""
        return self.names.long_table(smiles, result)

    def table(self, inputs: pd.DataFrame, result: Predictions) -> pd.DataFrame:
        """``inputs`` with the output columns appended: :meth:`OutputNames.table`."""
        return self.names.table(inputs, result)

    def outputs(self, values: np.ndarray) -> dict[str, Any]:
        """The output columns of predictions ``values``: :meth:`OutputNames.outputs`."""
        return self.names.outputs(values)

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
        return attention_maps(self, smiles_list(smiles))

    @property
    def spread(self) -> str | None:
        """Where ``std`` comes from: ``ensemble``, ``mc`` (MC dropout), the model's own head
        (``mve``, ``evidential``) or None."""
        if len(self.modules) > 1:
            return "ensemble"
        if self.mc_dropout:
            return "mc"
        return self.module.loss_name if self.module.predicts_std else None

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
        smiles = smiles_list(smiles)
        if features is not None and len(features) != len(smiles):
            raise ValueError(f"{len(features)} feature rows for {len(smiles)} SMILES")
        self._check_smiles_allowed()
        if interval is not None:
            self._check_interval(interval)
        n = len(smiles)
        result = Predictions.empty(n, self.task, self.hidden_dim if embeddings else 0, self.spread)
        errors = result.errors
        bar = progress_bar(n, progress)
        try:
            for start in range(0, n, _CHUNK):
                begin = time.perf_counter()
                chunk = smiles[start : start + _CHUNK]
                featurized = featurize(chunk, self.max_atoms, bool(self.task.bond_tasks))
                positions = embed_positions(featurized, chunk, self.conformers)
                part = None if features is None else features.iloc[start : start + _CHUNK]
                attach_molecule_features(self.molecule_features, featurized, chunk, part)
                self.timings["featurize_s"] += time.perf_counter() - begin
                errors[start : start + len(featurized.errors)] = featurized.errors
                bar.update(len(featurized.errors) - len(featurized.valid))
                for rows in size_batches(featurized, self.batch_size):
                    graphs = [featurized.graphs[i] for i in rows]
                    conformers = None if positions is None else [positions[i] for i in rows]
                    found = conformer_mean(self._predict_batch, graphs, conformers, embeddings)
                    result.fill((start + rows).numpy(), *found)
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
        return self._finish(result, interval)

    def _finish(self, result: Predictions, interval: float | None) -> Predictions:
        """``result`` with the run's calibration applied: calibrated binary probabilities, and
        intervals at level ``interval`` (regression)."""
        result.values, bounds = calibrated(
            result.values, result.std, self.calibration, interval, self.spread
        )
        if bounds is not None:
            result.lower, result.upper = bounds
        if interval is not None:
            item_intervals(result, self.task, self.calibration, interval, self.spread)
        return result

    def _check_interval(self, interval: float) -> None:
        check_interval(self.task, self.calibration, interval, self.mc_dropout)

    def structure_graphs(self, path: str) -> list[Data]:
        """Every frame of a structure file (extended XYZ, ASE ``.db``, ``.traj``) as a graph to
        predict or explain, in file order, with the periodic images the training data had
        (its ``dataset.pbc_cutoff`` and ``dataset.pbc_around``)."""
        from graphormer.data.sources.ase import structure_graphs

        settings = {"pbc_cutoff": self.periodic_cutoff} if self.periodic_cutoff else {}
        return structure_graphs(path, "input", **settings, pbc_around=self.periodic_around)

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
        result = Predictions.empty(n, self.task, self.hidden_dim if embeddings else 0, self.spread)
        errors = result.errors
        inputs: dict[int, Data] = {}
        bond = bool(self.task.bond_tasks)
        for i, graph in enumerate(graphs):
            try:
                inputs[i] = graph_input(
                    graph, self.module.config, self.categorical_columns, self.max_atoms, bond
                )
            except DataError as error:
                # The checks name a one-graph list ("graph: graph 0 ..."): name the input's row.
                errors[i] = str(error).replace("graph: graph 0", f"graph {i}", 1)
                errors[i] = errors[i].replace(" before training)", ")")
        order = sorted(inputs, key=lambda i: inputs[i].num_nodes)
        pairs = [(inputs[i].num_nodes + 1) ** 2 for i in order]
        counts = pack_by_tokens(pairs, self.batch_size, self.batch_size * PAIRS_PER_MOLECULE)
        start = 0
        for count in counts:
            rows = np.array(order[start : start + count])
            start += count
            found = self._predict_batch([inputs[i] for i in rows], embeddings)
            result.fill(rows, *found)
        return self._finish(result, interval)

    def _check_smiles_allowed(self) -> None:
        if self.smiles_refusal is not None:
            raise CheckpointError(self.smiles_refusal)

    # -- internals ----------------------------------------------------------------------------

    def _predict_batch(
        self, graphs: list, embeddings: bool
    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, dict[str, list], dict | None]:
        """The mean prediction of a batch, its spread (members or MC passes; None for one
        deterministic model), the first model's graph states and, for a model of atom (bond)
        targets, each graph's ``[n_atoms, T_atom]`` (``[n_bonds, T_bond]``) predictions by
        level (``atom``, ``bond``) and their spread alike (None for one deterministic model)."""
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
        item_std = None
        try:
            with self._inference():
                batch = batch.to(self.device, non_blocking=True)
                mean, std = self._runner.predict(batch, self.task)
                if self.task.item_levels:
                    per_level, item_std = self._runner.predict_items(batch, self.task)
                states = captured[0].float().cpu().numpy() if embeddings else None
        finally:
            if hook is not None:
                hook.remove()
        end = time.perf_counter()
        self.timings["featurize_s"] += middle - begin
        self.timings["model_s"] += end - middle
        return mean, std, states, per_level, item_std

    def _outputs(self, out: Tensor) -> np.ndarray:
        return probabilities(self.task, out).cpu().numpy()

    def _inference(self) -> AbstractContextManager:
        """No autograd, and the training run's mixed precision."""
        return self._runner.inference()
