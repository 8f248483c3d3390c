"""One molecule's attention maps: per layer and head, averaged, and rolled out over layers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from rdkit import Chem

from graphormer.errors import DataError
from graphormer.inference.inputs import (
    attach_molecule_features,
    embed_positions,
    featurize,
    graph_input,
)
from graphormer.runner import item_arrays

__all__ = [
    "GRAPH_TOKEN",
    "AttentionMaps",
    "atom_labels",
    "attention_maps",
    "attention_rollout",
    "depict_structure",
    "structure_attention_maps",
]

# The label of Graphormer's graph token (row and column 0 of every map).
GRAPH_TOKEN = "graph"


def atom_labels(smiles: str | Chem.Mol) -> list[str]:
    """``["graph", "C0", "C1", "O2", ...]``: the graph token, then each atom's element and its
    rdkit index (the numbers RDKit draws with ``addAtomIndices``), of a SMILES or a molecule."""
    mol = smiles if isinstance(smiles, Chem.Mol) else Chem.MolFromSmiles(smiles)
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
        atom_vector_predictions: a model of per-atom vectors' (forces) ``[x, y, z]`` per atom,
            by vector target name; empty otherwise.
        molecule: what is drawn when it is not ``smiles`` parsed (a structure's atoms with
            the bonds their positions imply, in the file's atom order); None otherwise.
    """

    smiles: str
    labels: list[str]
    weights: np.ndarray
    predictions: dict[str, float] = field(default_factory=dict)
    atom_predictions: dict[str, list[float]] = field(default_factory=dict)
    bond_predictions: dict[str, list[float]] = field(default_factory=dict)
    atom_contributions: dict[str, list[float]] = field(default_factory=dict)
    atom_vector_predictions: dict[str, list[list[float]]] = field(default_factory=dict)
    molecule: Chem.Mol | None = None

    @property
    def drawn(self) -> str | Chem.Mol:
        """What the pictures draw: :attr:`molecule`, or the SMILES."""
        return self.molecule if self.molecule is not None else self.smiles

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
    give them. A model trained with conformers reads each molecule's, as prediction does
    (the same method and seed): its maps and values are the mean over them."""
    predictor._check_smiles_allowed()
    featurized = featurize(smiles, predictor.max_atoms, bool(predictor.task.bond_tasks))
    positions = embed_positions(featurized, smiles, predictor.conformers)
    for i, error in enumerate(featurized.errors):
        if error:
            raise DataError(f"SMILES {smiles[i]!r} (item {i}): {error}")
    attach_molecule_features(predictor.molecule_features, featurized, smiles, None)
    return _maps(predictor, featurized.graphs, list(smiles), [None] * len(smiles), positions)


def structure_attention_maps(predictor: Any, graphs: list, where: str) -> list[AttentionMaps]:
    """:func:`attention_maps` of a structure file's frames (``graphs``: elements and
    positions, as ``predict.py input=FILE`` reads them; ``where`` names the file in errors),
    each drawn as its atoms with the bonds their positions imply (:func:`depict_structure`)."""
    from graphormer.data.sources.ase import element_molecules

    inputs = []
    for i, graph in enumerate(graphs):
        try:
            inputs.append(
                graph_input(
                    graph,
                    predictor.module.config,
                    predictor.categorical_columns,
                    predictor.max_atoms,
                    bool(predictor.task.bond_tasks),
                )
            )
        except DataError as error:
            text = str(error).replace("graph: graph 0", "graph", 1)
            raise DataError(f"cannot explain frame {i} of {where}: {text}") from error
    molecules = [
        depict_structure(mol, graph.pos.numpy())
        for mol, graph in zip(element_molecules(graphs), graphs, strict=True)
    ]
    names = [Chem.MolToSmiles(mol) for mol in molecules]
    return _maps(predictor, inputs, names, molecules, None)


def depict_structure(mol: Chem.Mol, positions: np.ndarray) -> Chem.Mol:
    """A structure's atoms (``mol``: elements in file order, no bonds) with the bonds RDKit
    reads from their ``positions`` ``[N, 3]`` (covalent radii), laid out in 2D for drawing;
    atom ``i`` stays the file's atom ``i``."""
    from rdkit.Chem import rdDepictor, rdDetermineBonds

    mol = Chem.RWMol(mol)
    conformer = Chem.Conformer(mol.GetNumAtoms())
    for i, xyz in enumerate(np.asarray(positions, dtype=np.float64)):
        conformer.SetAtomPosition(i, xyz.tolist())
    mol.AddConformer(conformer, assignId=True)
    rdDetermineBonds.DetermineConnectivity(mol)
    mol = mol.GetMol()
    mol.RemoveAllConformers()
    rdDepictor.Compute2DCoords(mol)
    return mol


def _one_pass(predictor: Any, batch: Any) -> dict[str, Any]:
    """One forward pass of ``batch`` (on the CPU): the outputs as users read them, every
    layer's attention ``[B, L, H, N+1, N+1]``, each item level's arrays per graph and a
    ``token_sum`` model's atom contributions ``[B, N, T]`` (None for other models)."""
    contributions = None
    model = predictor.module.model
    explains_atoms = (
        model.config.readout == "token_sum"
        and model.head is not None
        and not predictor.task.is_multiclass
    )
    per_level: dict[str, list] = {}
    with predictor._inference():
        on_device = batch.to(predictor.device)
        h = None
        if predictor.task.item_levels:
            levels, attention = predictor.module.forward_levels(on_device, return_attention=True)
            out = levels["molecule"]
            per_level = item_arrays(predictor.task, levels, batch)
        elif explains_atoms:
            # One pass: the prediction and the atoms' terms from the same final states.
            h, attention = model.encode(on_device, return_attention=True)
            out = predictor.module.molecule_units(model.molecule_output(h, on_device), on_device)
        else:
            out, attention = predictor.module(on_device, return_attention=True)
        if explains_atoms:
            if h is None:  # a model of atom or bond targets too: the same kernels again
                h, _ = model.encode(on_device, return_attention=True)
            # Each atom's additive term in the targets' units (logits for binary tasks):
            # the target standardisation scales it; its mean is the graph token's part. With a
            # fingerprint kernel the network makes only its share of the prediction (the
            # kernel's part is the molecule's, as the graph token's is).
            per_atom = model.atom_contributions(h, on_device).float()
            scale = predictor.module.target_std.float() * predictor.module.network_share
            contributions = (per_atom * scale).cpu().numpy()
    return {
        "values": predictor._outputs(out),
        "attention": torch.stack([a.float() for a in attention], dim=1).cpu().numpy(),
        "levels": per_level,
        "contributions": contributions,
    }


def _maps(
    predictor: Any,
    graphs: list,
    names: list[str],
    molecules: list[Chem.Mol | None],
    positions: list[np.ndarray] | None,
) -> list[AttentionMaps]:
    """The maps of ``graphs`` (``names``: their SMILES; ``molecules``: what is drawn where
    not the SMILES), in one padded batch per conformer of ``positions`` (``[C, N, 3]`` per
    graph; None: the graphs' own positions, if any), averaged over the conformers."""
    passes = []
    for c in range(1 if positions is None else len(positions[0])):
        if positions is not None:
            for graph, pos in zip(graphs, positions, strict=True):
                graph.pos = torch.from_numpy(pos[c])  # [N, 3]
        batch = predictor.collator(graphs)  # the same padding for every conformer
        passes.append(_one_pass(predictor, batch))

    def mean(key: str) -> np.ndarray | None:
        return None if passes[0][key] is None else np.mean([p[key] for p in passes], axis=0)

    values, stacked, contributions = mean("values"), mean("attention"), mean("contributions")
    per_level = {
        name: [np.mean([p["levels"][name][b] for p in passes], axis=0) for b in range(len(arrays))]
        for name, arrays in passes[0]["levels"].items()
    }
    atoms, bonds, vectors = (per_level.get(k) for k in ("atom", "bond", "atom_vector"))
    node_mask = batch.node_mask
    maps = []
    for b, text in enumerate(names):
        # The graph token (0) and this molecule's atoms, whose rows and columns the collator
        # places first; everything after them is padding.
        keep = np.concatenate([[0], node_mask[b].nonzero().squeeze(1).numpy() + 1])
        weights = stacked[b][:, :, keep][:, :, :, keep]  # [L, H, n+1, n+1]
        maps.append(
            AttentionMaps(
                smiles=text,
                labels=atom_labels(molecules[b] if molecules[b] is not None else text),
                weights=weights.astype(np.float32),
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
                atom_vector_predictions={
                    name: vectors[b][:, t].tolist()
                    for t, name in enumerate(predictor.names.atom_vector_task_names)
                }
                if vectors is not None
                else {},
                molecule=molecules[b],
            )
        )
    return maps
