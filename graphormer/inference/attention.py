"""One molecule's attention maps: per layer and head, averaged, and rolled out over layers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from rdkit import Chem

from graphormer.errors import DataError
from graphormer.inference.inputs import attach_molecule_features, featurize
from graphormer.runner import item_arrays

__all__ = ["GRAPH_TOKEN", "AttentionMaps", "atom_labels", "attention_maps", "attention_rollout"]

# The label of Graphormer's graph token (row and column 0 of every map).
GRAPH_TOKEN = "graph"


def atom_labels(smiles: str) -> list[str]:
    """``["graph", "C0", "C1", "O2", ...]``: the graph token, then each atom's element and its
    rdkit index (the numbers RDKit draws with ``addAtomIndices``)."""
    mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        raise ValueError(f"rdkit cannot parse SMILES {smiles!r}")
    return [GRAPH_TOKEN, *(f"{a.GetSymbol()}{a.GetIdx()}" for a in mol.GetAtoms())]


def attention_rollout(weights: np.ndarray, residual: float = 0.5) -> np.ndarray:
    """Attention rollout (Abnar & Zuidema, 2020, `arXiv:2005.00928
    <https://arxiv.org/abs/2005.00928>`_): how much each position's final state draws on each
    input position, through every layer.

    Each layer's head-averaged map is mixed with the identity for the residual connection,
    ``A' = residual * I + (1 - residual) * A`` (rows still sum to 1), and the layers are
    multiplied, first layer rightmost.

    Args:
        weights (np.ndarray): ``[L, H, n, n]`` or ``[L, n, n]`` row-stochastic maps.
        residual (float, optional): weight of the identity. (default: :obj:`0.5`)

    Returns:
        ``[n, n]``, row-stochastic.
    """
    maps = weights.mean(axis=1) if weights.ndim == 4 else weights  # [L, n, n]
    maps = maps.astype(np.float64)
    eye = np.eye(maps.shape[-1])
    rolled = eye
    for layer in maps:
        rolled = (residual * eye + (1.0 - residual) * layer) @ rolled
    return rolled


@dataclass
class AttentionMaps:
    """Attention of a trained Graphormer over one molecule, without padding.

    Index 0 of every map is the graph token, index ``i + 1`` the atom of rdkit index ``i``;
    each row (a query) sums to 1 over the atoms and the graph token.

    Attributes:
        smiles: the molecule.
        labels: ``n + 1`` tick labels, ``["graph", "C0", ...]``.
        weights: ``[L, H, n + 1, n + 1]`` float32, per layer and head.
        predictions: the model's output for this molecule, by task name.
        atom_predictions: a model of atom targets' values per atom (RDKit's order), by atom
            target name (issue #18); empty otherwise.
        bond_predictions: a model of bond targets' values per bond (RDKit's bond order), by
            bond target name; empty otherwise.
        atom_contributions: a ``token_sum`` model's additive term of each atom (RDKit's order)
            in the target's units (logits for a binary task), by task name (issue #22): the
            prediction is the graph token's part plus their sum; empty for other readouts and
            multi-class tasks.
    """

    smiles: str
    labels: list[str]
    weights: np.ndarray
    predictions: dict[str, float] = field(default_factory=dict)
    atom_predictions: dict[str, list[float]] = field(default_factory=dict)
    bond_predictions: dict[str, list[float]] = field(default_factory=dict)
    atom_contributions: dict[str, list[float]] = field(default_factory=dict)

    @property
    def num_layers(self) -> int:
        return self.weights.shape[0]

    @property
    def num_heads(self) -> int:
        return self.weights.shape[1]

    @property
    def num_atoms(self) -> int:
        return self.weights.shape[-1] - 1

    def mean_over_heads(self) -> np.ndarray:
        """``[L, n + 1, n + 1]``."""
        return self.weights.mean(axis=1)

    def rollout(self) -> np.ndarray:
        """``[n + 1, n + 1]`` attention rolled out over all layers (:func:`attention_rollout`)."""
        return attention_rollout(self.weights)

    def graph_token_attention(self, layer: int | None = None) -> np.ndarray:
        """``[n]``: the attention the graph token pays each atom, averaged over heads, at
        ``layer`` (0-based), or rolled out over all layers when ``layer`` is None. The graph
        token's share to itself is left out, so the values sum to at most 1."""
        row = self.rollout()[0] if layer is None else self.mean_over_heads()[layer, 0]
        return np.asarray(row[1:], dtype=np.float64)


def attention_maps(predictor: Any, smiles: list[str]) -> list[AttentionMaps]:
    """:meth:`attention` for several molecules, computed in one padded batch; each map is
    cut to its own molecule (no padding). ``predictor``: the
    :class:`~graphormer.inference.predictor.Predictor` whose model, featurisation and runner
    give them."""
    predictor._check_smiles_allowed()
    featurized = featurize(smiles, predictor.max_atoms, bool(predictor.task.bond_tasks))
    for i, error in enumerate(featurized.errors):
        if error:
            raise DataError(f"SMILES {smiles[i]!r} (item {i}): {error}")
    attach_molecule_features(predictor.molecule_features, featurized, smiles, None)
    batch = predictor.collator(featurized.graphs)
    atoms = bonds = contributions = None
    model = predictor.module.model
    explains_atoms = (
        model.config.readout == "token_sum"
        and model.head is not None
        and not predictor.task.is_multiclass
    )
    with predictor._inference():
        on_device = batch.to(predictor.device)
        h = None
        if predictor.task.atom_tasks or predictor.task.bond_tasks:
            levels, attention = predictor.module.forward_levels(on_device, return_attention=True)
            out = levels["molecule"]
            per_level = item_arrays(predictor.task, levels, batch)
            atoms, bonds = per_level.get("atom"), per_level.get("bond")
        elif explains_atoms:
            # One pass: the prediction and the atoms' terms from the same final states.
            h, attention = model.encode(on_device, return_attention=True)
            out = predictor.module.to_units(model.molecule_output(h, on_device))
        else:
            out, attention = predictor.module(on_device, return_attention=True)
        if explains_atoms:
            if h is None:  # a model of atom or bond targets too: the same kernels again
                h, _ = model.encode(on_device, return_attention=True)
            # Each atom's additive term in the targets' units (logits for binary tasks):
            # the target standardisation scales it; its mean is the graph token's part.
            per_atom = model.atom_contributions(h, on_device).float()
            contributions = (per_atom * predictor.module.target_std.float()).cpu().numpy()
    values = predictor._outputs(out)
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
                    for k, v in predictor.outputs(values[b : b + 1]).items()
                },
                atom_predictions={
                    name: atoms[b][:, t].tolist()
                    for t, name in enumerate(predictor.atom_task_names)
                }
                if atoms is not None
                else {},
                bond_predictions={
                    name: bonds[b][:, t].tolist()
                    for t, name in enumerate(predictor.bond_task_names)
                }
                if bonds is not None
                else {},
                atom_contributions={
                    name: contributions[b][node_mask[b].numpy()][:, t].tolist()
                    for t, name in enumerate(predictor.task_names)
                }
                if contributions is not None
                else {},
            )
        )
    return maps
