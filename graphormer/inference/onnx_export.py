"""A trained model as ONNX: the network of every member, taking the dense inputs the collator
builds (dynamic batch and atom axes) and giving what the Predictor reports (probabilities for
binary and multi-class tasks, the targets' units for regression: the run's standardisation is in
the graph), with the run's task, calibration and metrics as the file's metadata, so that
:class:`~graphormer.portable.onnx_predictor.OnnxPredictor` needs neither torch nor the checkpoint.
A model that reads molecule features computed from SMILES (``dataset.molecule_features``) takes
their raw values as one more input, ``molecule_features`` ``[B, D]`` (NaN allowed: the model's
training-split fill and standardisation are in the graph), and the metadata names them.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from graphormer.batch import GraphormerBatch
from graphormer.errors import ConfigError
from graphormer.inference.predictor import Predictor
from graphormer.portable.dense import INPUT_NAMES, dense_inputs
from graphormer.portable.features import feature_set_values
from graphormer.portable.molecules import blocked_rdkit_logs, featurize_one
from graphormer.portable.onnx_predictor import (
    FEATURES_INPUT,
    FORMAT_VERSION,
    METADATA_KEY,
    member_paths,
)
from graphormer.runner import probabilities

__all__ = ["OnnxNetwork", "export_onnx", "max_difference", "member_paths", "run_metrics"]

# The opset of the exported graphs (ONNX Runtime 1.16 and later run it).
OPSET = 18


class OnnxNetwork(nn.Module):
    """One member's network on the dense inputs (and the raw molecule features ``[B, D]`` of a
    model that reads them), giving the Predictor's outputs ``[B, T]``."""

    def __init__(self, module: Any) -> None:
        super().__init__()
        self.module = module
        self.task = module.task

    def forward(
        self,
        x: Tensor,
        in_degree: Tensor,
        out_degree: Tensor,
        spatial_pos: Tensor,
        edge_path: Tensor,
        edge_attr: Tensor,
        node_mask: Tensor,
        molecule_features: Tensor | None = None,
    ) -> Tensor:
        batch = GraphormerBatch(
            x=x,
            in_degree=in_degree,
            out_degree=out_degree,
            spatial_pos=spatial_pos,
            edge_path=edge_path,
            edge_attr=edge_attr,
            node_mask=node_mask,
            molecule_features=molecule_features,
        )
        # The targets' units; probabilities for classification (the runner's one rule).
        return probabilities(self.task, self.module(batch))


def export_onnx(
    predictor: Predictor, output: str | Path, metrics: dict | None = None
) -> list[Path]:
    """Writes each member of ``predictor``'s model as ONNX: ``output`` (member 0) and, for an
    ensemble, ``<stem>.member<i>.onnx`` beside it; every file carries the metadata. Returns the
    files written."""
    _check_exportable(predictor)
    output = Path(output)
    paths = member_paths(output, len(predictor.modules))
    metadata = json.dumps(_metadata(predictor, [p.name for p in paths], metrics or {}))
    example = _example_inputs(predictor.collator.max_hops, _feature_sets(predictor))
    for member, path in zip(predictor.modules, paths, strict=True):
        # The wrapper in eval mode too: the exporter restores the wrapper's mode afterwards,
        # recursively, which would leave the predictor's members with dropout on.
        network = OnnxNetwork(member.float().cpu()).eval()
        _export_one(network, example, path, metadata)
    return paths


def _check_exportable(predictor: Predictor) -> None:
    if predictor.smiles_refusal is not None:
        raise ConfigError(f"{predictor.smiles_refusal}; an ONNX model reads SMILES")
    if predictor.task.atom_tasks or predictor.task.bond_tasks:
        raise ConfigError(
            "this model predicts atom or bond targets; the ONNX export covers molecule targets: "
            "serve it with graphormer.Predictor"
        )
    features = predictor.molecule_features
    if features is not None and features.columns:
        raise ConfigError(
            f"this model reads molecule features from a file's columns "
            f"(dataset.feature_columns={features.columns}), and the ONNX predictor takes SMILES "
            "only: serve it with graphormer.Predictor (predict.py input=FILE.csv)"
        )
    if predictor.mc_dropout:
        raise ConfigError("mc_dropout runs a model many times with dropout; export without it")


def _metadata(predictor: Predictor, members: list[str], metrics: dict) -> dict:
    task = predictor.task
    calibration = predictor.calibration
    return {
        "format_version": FORMAT_VERSION,
        "task_type": task.task_type,
        "task_names": list(predictor.task_names),
        "num_classes": int(task.num_classes) if task.is_multiclass else None,
        "max_hops": int(predictor.collator.max_hops),
        "hidden_dim": int(predictor.hidden_dim),
        "training_smiles_column": predictor.training_smiles_column,
        "molecule_features": _feature_metadata(predictor),
        "members": members,
        "calibration": dict(calibration.__dict__) if calibration is not None else None,
        "metrics": metrics,
    }


def _feature_sets(predictor: Predictor) -> str | None:
    """The ``dataset.molecule_features`` sets the model reads (``rdkit2d+morgan_counts``), or
    None for a model without molecule features."""
    features = predictor.molecule_features
    return features.descriptors if features is not None else None


def _feature_metadata(predictor: Predictor) -> dict | None:
    """The molecule features of the file's ``molecule_features`` input: their sets and one name
    per column (the ONNX predictor refuses an RDKit that names them otherwise); None without."""
    sets = _feature_sets(predictor)
    if sets is None:
        return None
    return {"sets": sets, "names": predictor.molecule_features.names()}


def _example_inputs(max_hops: int, feature_sets: str | None) -> tuple[Tensor, ...]:
    """Two molecules of different sizes (so that padding is traced) as the network's inputs,
    with their raw molecule features when the model reads ``feature_sets``."""
    smiles = ("CC(=O)Oc1ccccc1C(=O)O", "CCO")
    with blocked_rdkit_logs():
        graphs = [featurize_one(s, None)[0] for s in smiles]
    arrays = dense_inputs(graphs, max_hops)
    example = tuple(torch.from_numpy(arrays[name]) for name in INPUT_NAMES)
    if feature_sets is None:
        return example
    return (*example, torch.from_numpy(feature_set_values(feature_sets, smiles, workers=1)))


def _export_one(network: OnnxNetwork, example: tuple, path: Path, metadata: str) -> None:
    import onnx

    batch, atoms, edges = "batch", "atoms", "edges"
    names = list(INPUT_NAMES)
    dynamic = {
        "x": {0: batch, 1: atoms},
        "in_degree": {0: batch, 1: atoms},
        "out_degree": {0: batch, 1: atoms},
        "spatial_pos": {0: batch, 1: atoms, 2: atoms},
        "edge_path": {0: batch, 1: atoms, 2: atoms},
        "edge_attr": {0: edges},
        "node_mask": {0: batch, 1: atoms},
        "outputs": {0: batch},
    }
    if len(example) > len(INPUT_NAMES):  # the raw molecule features [B, D]
        names.append(FEATURES_INPUT)
        dynamic[FEATURES_INPUT] = {0: batch}
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            network,
            example,
            str(path),
            input_names=names,
            output_names=["outputs"],
            dynamic_axes=dynamic,
            opset_version=OPSET,
            dynamo=False,
        )
    model = onnx.load(str(path))
    entry = model.metadata_props.add()
    entry.key, entry.value = METADATA_KEY, metadata
    onnx.save(model, str(path))


def max_difference(predictor: Predictor, onnx_path: str | Path, smiles: list[str]) -> float:
    """The largest absolute difference between the torch Predictor's and ONNX Runtime's
    predictions of ``smiles`` (both calibrated alike; unpredictable SMILES skipped)."""
    from graphormer.portable.onnx_predictor import OnnxPredictor

    expected = predictor.run(smiles).values
    found = OnnxPredictor(onnx_path).run(smiles).values
    both = ~np.isnan(expected) & ~np.isnan(found)
    return float(np.abs(expected[both] - found[both]).max(initial=0.0))


def run_metrics(ckpt: Any) -> dict[str, float]:
    """The validation and test scores of the run ``ckpt`` names (its ``metrics.json``, read as data), for
    ``GET /model``; empty when the checkpoint has no run folder."""
    from graphormer.training.members import resolve_members

    folder = resolve_members(ckpt).folder
    path = folder / "metrics.json" if folder is not None else None
    if path is None or not path.is_file():
        return {}
    try:
        values = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {
        str(k): float(v)
        for k, v in values.items()
        if str(k).startswith(("val/", "test/"))
        and isinstance(v, int | float)
        and not isinstance(v, bool)
        and math.isfinite(v)
    }
