"""A prediction's inputs: SMILES featurised as the model's training data were (molecule
features, bond edges), PyG graphs checked against the model's tables, and batches by size."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor
from torch_geometric.data import Data

from graphormer import checkpoint as checkpoints
from graphormer.checkpoint import CheckpointError
from graphormer.data.conformers import embed_many
from graphormer.data.descriptors import MoleculeFeatures
from graphormer.data.featurize import (
    FeaturizedMolecules,
    featurize_smiles,
    molecule_bond_edges,
    smiles_feature_dims,
)
from graphormer.data.periodic import ATOM_INTEGER_KEYS
from graphormer.data.sampling import pack_by_tokens
from graphormer.data.sources.pyg_file import read_graphs
from graphormer.errors import DataError

__all__ = [
    "PAIRS_PER_MOLECULE",
    "attach_molecule_features",
    "conformer_mean",
    "embed_positions",
    "featurize",
    "graph_input",
    "size_batches",
]

# A batch holds at most batch_size molecules and at most batch_size * 64^2 attention entries per
# head, so that a few very large molecules never build one huge padded batch.
PAIRS_PER_MOLECULE = 64 * 64
# Long inputs get a progress bar.
_PROGRESS_MIN = 1000


def graph_input(
    graph: Any,
    config: Any,
    categorical_columns: tuple[list[int] | None, list[int] | None],
    max_atoms: int | None,
    bond_targets: bool,
) -> Data:
    """One graph as the model reads it, or a DataError saying why it cannot be."""
    if not isinstance(graph, Data):
        raise DataError(f"a {type(graph).__name__}, not a torch_geometric.data.Data")
    node_columns, edge_columns = categorical_columns
    x, edge_attr = graph.get("x"), graph.get("edge_attr")
    if node_columns is None:  # every column categorical (OGB-style sources)
        node_columns = list(range(x.view(x.size(0), -1).size(1))) if x is not None else []
    if edge_columns is None:
        width = edge_attr.view(edge_attr.size(0), -1).size(1) if edge_attr is not None else 0
        edge_columns = list(range(width))
    read = read_graphs([graph], "graph", node_columns, edge_columns, with_labels=False)
    nodes = int(read.slices["x"][1])
    if max_atoms is not None and nodes > max_atoms:
        raise DataError(f"{nodes} nodes, more than max_atoms={max_atoms}")
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
    for key in ATOM_INTEGER_KEYS:  # tags and periodic images: kept as the collator reads them
        if graph.get(key) is not None:
            data[key] = graph[key].long().view(-1)
    if bond_targets:  # an edge-level model predicts every listed edge (pyg_file)
        data.bond_edge = torch.arange(data.edge_index.size(1), dtype=torch.long)
    return data


def featurize(
    smiles: Sequence[str], max_atoms: int | None, bond_targets: bool
) -> FeaturizedMolecules:
    """OGB's featurisation of ``smiles`` (None and a reason where it fails); a model of bond
    targets also gets each graph's bond edges (bond k of a molecule is its edge 2k)."""
    featurized = featurize_smiles(smiles, max_atoms)
    if bond_targets:
        for graph in featurized.graphs:
            if graph is not None:
                graph.bond_edge = molecule_bond_edges(graph)
    return featurized


def attach_molecule_features(
    features: MoleculeFeatures | None,
    featurized: FeaturizedMolecules,
    smiles: Sequence[str],
    table: pd.DataFrame | None,
) -> None:
    """Gives each valid graph its raw ``molecule_features`` ``[1, D]``, computed as the
    training data's were (the model applies the training statistics)."""
    if features is None or not len(featurized.valid):
        return
    if table is not None:
        table = table.reset_index(drop=True)
    values = features.compute(smiles, table, "the input")
    for i in featurized.valid.tolist():
        featurized.graphs[i].molecule_features = torch.from_numpy(values[i]).view(1, -1)


def embed_positions(
    featurized: FeaturizedMolecules, smiles: Sequence[str], num_conformers: int
) -> list[np.ndarray | None] | None:
    """Each featurised molecule's ``[C, N, 3]`` conformers, by the method and seed training
    used (``dataset.conformers=rdkit``); a molecule RDKit cannot embed loses its graph and
    gets an error, never zero positions (None at such rows). None when ``num_conformers`` is
    0 (a model that reads no positions from SMILES)."""
    if not num_conformers:
        return None
    valid = featurized.valid.tolist()
    found = embed_many([smiles[i] for i in valid], num_conformers)
    positions: list[np.ndarray | None] = [None] * len(featurized.graphs)
    for i, pos in zip(valid, found, strict=True):
        if pos is None or pos.shape[1] != featurized.graphs[i].num_nodes:
            featurized.graphs[i] = None
            featurized.errors[i] = (
                f"RDKit could not embed {num_conformers} conformer(s) of this molecule, and the "
                "model reads atom positions"
            )
        else:
            positions[i] = pos
    featurized.__dict__.pop("valid", None)  # the cached positions of the molecules left
    return positions


def conformer_mean(
    predict: Callable[[list, bool], tuple],
    graphs: list,
    conformers: list | None,
    embeddings: bool,
) -> tuple:
    """``predict(graphs, embeddings)`` (values, std, states, per-level arrays and their spread, as
    ``Predictor._predict_batch`` gives them) of each conformer ``[C, N, 3]`` of the graphs in
    turn, averaged: a prediction from SMILES is the mean over its conformers. ``conformers``
    None: the graphs as they are."""
    if conformers is None:
        return predict(graphs, embeddings)
    found = []
    for c in range(len(conformers[0])):
        for graph, pos in zip(graphs, conformers, strict=True):
            graph.pos = torch.from_numpy(pos[c])  # [N, 3]
        found.append(predict(graphs, embeddings))

    def mean(parts: Sequence[Any]) -> Any:
        return None if parts[0] is None else np.mean(np.stack(parts), axis=0)

    def per_level(k: int) -> dict[str, list] | None:
        if found[0][k] is None:
            return None
        return {
            name: [mean([f[k][name][i] for f in found]) for i in range(len(arrays))]
            for name, arrays in found[0][k].items()
        }

    # values, std, states; then the per-level arrays and their spread, each averaged
    return (*(mean([f[k] for f in found]) for k in range(3)), per_level(3), per_level(4))


def size_batches(featurized: FeaturizedMolecules, batch_size: int) -> Iterator[Tensor]:
    """Positions of the valid molecules in batches of similar size (smallest first)."""
    valid = featurized.valid
    if not len(valid):
        return
    order = valid[torch.argsort(featurized.num_atoms[valid], stable=True)]
    # A molecule's cost: its attention pairs, graph token included.
    pairs = ((featurized.num_atoms[order] + 1) ** 2).tolist()
    counts = pack_by_tokens(pairs, batch_size, batch_size * PAIRS_PER_MOLECULE)
    yield from order.split(counts)


def stored_molecule_features(
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


def smiles_list(smiles: Sequence[str]) -> list:
    if isinstance(smiles, str):
        # A string is a sequence of characters: never read "CCO" as three molecules.
        raise TypeError(f"pass a list of SMILES, e.g. [{smiles!r}], not a single string")
    return list(smiles)


def molecule_features_problem(config: Any) -> str | None:
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


def progress_bar(total: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        unit="mol",
        desc="predicting",
        # Off a terminal (a log file, a pipe) a redrawn bar is noise.
        disable=not enabled or total < _PROGRESS_MIN or not sys.stderr.isatty(),
        leave=False,
    )
