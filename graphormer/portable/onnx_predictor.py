"""A model exported by ``graphormer-export`` run by ONNX Runtime: SMILES in, the Predictor's
table out, with RDKit, numpy and onnxruntime alone (no torch)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from graphormer.errors import ConfigError, DataError
from graphormer.portable.columns import molecule_columns, value_names
from graphormer.portable.dense import INPUT_NAMES, dense_inputs
from graphormer.portable.features import feature_set_names, feature_set_values
from graphormer.portable.molecules import blocked_rdkit_logs, featurize_one

__all__ = [
    "FEATURES_INPUT",
    "FORMAT_VERSION",
    "METADATA_KEY",
    "OnnxPredictions",
    "OnnxPredictor",
    "member_paths",
]

# The metadata entry of an exported file, and the version of its layout (bumped when the inputs
# or the metadata change, so that an old reader refuses a newer file rather than misreading it).
# A model reading molecule features has one more input (FEATURES_INPUT) and names them in the
# metadata (``molecule_features``); files without them are as before, and a reader older than
# that input refuses a file that has it (its inputs are checked), so the version stays.
METADATA_KEY = "graphormer"
FORMAT_VERSION = 1
# The input of the raw molecule features ``[B, D]`` float32 (NaN: missing) of a model that reads
# them, after INPUT_NAMES.
FEATURES_INPUT = "molecule_features"
# Molecules whose molecule features are computed at once (in parallel over the CPUs), as the
# torch Predictor's chunks: a bound on the memory of ``[n, D]`` features.
_FEATURE_CHUNK = 8192


def member_paths(output: str | Path, count: int) -> list[Path]:
    """The files of an exported model of ``count`` members: ``output`` holds member 0, and
    ``<stem>.member<i>.onnx`` beside it member ``i``."""
    output = Path(output)
    return [output] + [output.with_name(f"{output.stem}.member{i}.onnx") for i in range(1, count)]


@dataclass
class OnnxPredictions:
    """One row per input molecule, as :class:`graphormer.inference.Predictions` (molecule
    targets): ``values`` ``[n, T]`` (NaN without a prediction), ``errors``, and ``std`` (an
    ensemble's spread), ``lower`` / ``upper`` (calibrated intervals) or None."""

    values: np.ndarray
    errors: list[str]
    std: np.ndarray | None = None
    lower: np.ndarray | None = None
    upper: np.ndarray | None = None


class OnnxPredictor:
    """Scores SMILES with an exported model, featurising them as its training did.

    Args:
        path (str | Path): the ``.onnx`` file ``graphormer-export`` wrote (an ensemble's other
            members are read from beside it).
        batch_size (int, optional): molecules per run of the network. (default: :obj:`128`)
        max_atoms (int | None, optional): larger molecules get an error instead of a
            prediction. (default: :obj:`1000`)
        threads (int | None, optional): ONNX Runtime's intra-op threads; None for its default.

    Example::

        from graphormer.portable.onnx_predictor import OnnxPredictor
        table = OnnxPredictor("model.onnx").predict(["CCO", "c1ccccc1O"])
    """

    def __init__(
        self,
        path: str | Path,
        *,
        batch_size: int = 128,
        max_atoms: int | None = 1000,
        threads: int | None = None,
    ) -> None:
        import onnxruntime as ort

        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"{path} is not a file: give the .onnx file graphormer-export wrote")
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = int(threads)
            options.inter_op_num_threads = 1
        first = _session(ort, path, options)
        self.metadata = _metadata(first, path)
        sessions = [first]
        for name in self.metadata["members"][1:]:
            member = path.with_name(Path(name).name)
            if not member.is_file():
                raise DataError(f"{path} is an ensemble member, and its member {member} is missing")
            sessions.append(_session(ort, member, options))
        self.sessions = sessions
        self.path = path
        self.batch_size = int(batch_size)
        self.max_atoms = max_atoms
        self.task_type: str = self.metadata["task_type"]
        self.task_names: list[str] = list(self.metadata["task_names"])
        self.num_classes: int | None = self.metadata.get("num_classes")
        self.max_hops = int(self.metadata["max_hops"])
        self.calibration = _calibration(self.metadata.get("calibration"))
        # The sets of the model's molecule features (``rdkit2d+morgan_counts``); None without.
        self.feature_sets: str | None = (self.metadata["molecule_features"] or {}).get("sets")

    @property
    def spread(self) -> str | None:
        """``ensemble`` when the predictions have a spread (``std``), else None."""
        return "ensemble" if len(self.sessions) > 1 else None

    @property
    def is_multiclass(self) -> bool:
        return self.num_classes is not None

    @property
    def is_regression(self) -> bool:
        return self.task_type == "regression"

    def run(self, smiles: Sequence[str], interval: float | None = None) -> OnnxPredictions:
        """Predictions of every SMILES, in input order; ``interval`` (a coverage level such as
        0.9) adds the run's calibrated intervals (regression)."""
        if isinstance(smiles, str):
            raise TypeError(f"pass a list of SMILES, e.g. [{smiles!r}], not a single string")
        smiles = list(smiles)
        if interval is not None:
            self._check_interval(interval)
        width = self.num_classes or len(self.task_names)
        values = np.full((len(smiles), width), np.nan, dtype=np.float32)
        spread = np.full_like(values, np.nan) if self.spread else None
        errors = [""] * len(smiles)
        graphs: dict[int, dict] = {}
        with blocked_rdkit_logs():
            for i, text in enumerate(smiles):
                graph, errors[i] = featurize_one(text, self.max_atoms)
                if graph is not None:
                    graphs[i] = graph
        # Similar sizes batched together (little padding); rows put back in input order.
        order = sorted(graphs, key=lambda i: graphs[i]["num_nodes"])
        for begin in range(0, len(order), _FEATURE_CHUNK):
            chunk = order[begin : begin + _FEATURE_CHUNK]
            features = self._features([smiles[i] for i in chunk])  # [n, D] or None
            for start in range(0, len(chunk), self.batch_size):
                rows = np.array(chunk[start : start + self.batch_size])
                feeds = dense_inputs([graphs[i] for i in rows], self.max_hops)
                if features is not None:
                    feeds[FEATURES_INPUT] = features[start : start + len(rows)]
                outputs = np.stack([s.run(None, feeds)[0] for s in self.sessions])  # [M, B, T]
                values[rows] = outputs.mean(0)
                if spread is not None:
                    spread[rows] = outputs.std(0)
        result = OnnxPredictions(values, errors, spread)
        calibration = self.calibration
        if calibration is not None and calibration.calibrates_probabilities:
            result.values = calibration.calibrate(values).astype(np.float32)
        if interval is not None:
            lower, upper = calibration.intervals(values, spread, float(interval), self.spread)
            result.lower, result.upper = lower.astype(np.float32), upper.astype(np.float32)
        return result

    def _features(self, smiles: list[str]) -> np.ndarray | None:
        """``[n, D]`` float32 raw molecule features of ``smiles`` (NaN: missing; the model fills
        them as training did), or None for a model that reads none."""
        if self.feature_sets is None:
            return None
        return feature_set_values(self.feature_sets, smiles)

    def predict(self, smiles: Sequence[str], interval: float | None = None):
        """One row per SMILES, in order, as ``Predictor.predict`` writes it: ``smiles``, one
        column per task (``<task>_prob_<k>`` and the predicted class for a multi-class task),
        ``<name>_std`` for an ensemble, ``<name>_lower`` / ``_upper`` with ``interval``, and
        ``error`` (empty, or why the molecule has no prediction)."""
        import pandas as pd

        result = self.run(smiles, interval)
        columns: dict[str, Any] = {"smiles": pd.Series(list(smiles), dtype=object)}
        classes = self.num_classes if self.is_multiclass else None
        values = (result.values, result.std, result.lower, result.upper)
        columns.update(molecule_columns(self.task_names, *values, num_classes=classes))
        columns["error"] = np.array(result.errors, dtype=object)
        return pd.DataFrame(columns)

    def output_names(self) -> list[str]:
        """The value columns: the task names, or ``<task>_prob_<k>`` for a multi-class task."""
        return value_names(self.task_names, self.num_classes if self.is_multiclass else None)

    def _check_interval(self, interval: Any) -> None:
        if not self.is_regression:
            raise ConfigError(
                f"interval={interval} is for regression models; this one predicts probabilities"
            )
        if self.calibration is None or self.calibration.residual is None:
            raise ConfigError(
                f"interval={interval} needs the run's calibration, and this model was exported "
                "without one: export the run folder (ckpt=RUN), whose calibration.json it reads"
            )
        if isinstance(interval, bool) or not isinstance(interval, int | float):
            raise ConfigError(f"interval={interval!r} is not allowed: a level in (0, 1), e.g. 0.9")
        from graphormer.portable.calibration import conformal_radius

        conformal_radius(np.asarray(self.calibration.residual[0]), float(interval))


def _session(ort: Any, path: Path, options: Any) -> Any:
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime raises its own exception types for a bad file
        raise DataError(f"{path} cannot be read as an ONNX model ({error})") from error


def _metadata(session: Any, path: Path) -> dict:
    """The exported file's metadata, read as data (JSON), checked for this reader's format."""
    text = session.get_modelmeta().custom_metadata_map.get(METADATA_KEY)
    if text is None:
        raise DataError(
            f"{path} has no {METADATA_KEY!r} metadata: it was not written by graphormer-export"
        )
    try:
        values = json.loads(text)
        version = values["format_version"]
        names = [str(n) for n in values["task_names"]]
    except (ValueError, KeyError, TypeError) as error:
        raise DataError(
            f"{path}: its metadata cannot be read ({error}); export it again"
        ) from error
    if version != FORMAT_VERSION:
        raise DataError(
            f"{path} is in export format {version}, and this graphormer reads {FORMAT_VERSION}: "
            "export the checkpoint again with this version"
        )
    features = values.get("molecule_features")
    inputs = list(INPUT_NAMES) + ([FEATURES_INPUT] if features else [])
    if [i.name for i in session.get_inputs()] != inputs:
        raise DataError(f"{path}: its inputs are not graphormer-export's {inputs}")
    values["task_names"] = names
    values["molecule_features"] = _checked_features(features, path)
    return values


def _checked_features(features: Any, path: Path) -> dict | None:
    """The metadata's molecule features (their sets and names), checked against what this
    installation computes under the same names (another RDKit may list other descriptors), as
    the torch Predictor checks a checkpoint's."""
    if not features:
        return None
    try:
        sets, stored = str(features["sets"]), [str(n) for n in features["names"]]
        computed = feature_set_names(sets)
    except (KeyError, TypeError, ConfigError) as error:
        raise DataError(
            f"{path}: its molecule features cannot be read ({error}); export it again"
        ) from error
    if stored != computed:
        differ = sorted(set(stored) ^ set(computed))[:5] or "the same names in another order"
        raise DataError(
            f"{path} reads molecule features this installation computes differently (RDKit's "
            f"descriptor list differs: {differ}); predict with the RDKit version it was "
            "exported with"
        )
    return {"sets": sets, "names": stored}


def _calibration(values: dict | None) -> Any:
    """The run's calibration, as the Predictor applies it (None when it has none)."""
    if not values:
        return None
    # Its owner lives with training (it is fitted there); reading it imports that package.
    from graphormer.portable.calibration import Calibration

    return Calibration(**values)
