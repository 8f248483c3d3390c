"""One molecule's attention maps: per layer and head, averaged, and rolled out over layers."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from rdkit import Chem

__all__ = ["GRAPH_TOKEN", "AttentionMaps", "atom_labels", "attention_rollout"]

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
