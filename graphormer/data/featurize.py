"""SMILES to molecule graphs with OGB's ``smiles2graph``, and the reason for every molecule that
cannot be featurised (it keeps its place; it is never dropped). The one featuriser of SMILES: a
SMILES CSV is read with it for training, and ``graphormer.inference`` with it for prediction, so
that prediction sees molecules exactly as training did, and PCQM4Mv2's compact arrays are made
with it too."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch
from torch_geometric.data import Data

from graphormer.errors import DataError
from graphormer.portable.molecules import blocked_rdkit_logs, featurize_one, smiles_error

__all__ = [
    "FeaturizedMolecules",
    "featurize_compact",
    "featurize_smiles",
    "molecule_bond_edges",
    "smiles_error",
    "smiles_feature_dims",
]


@dataclass
class FeaturizedMolecules:
    """Graphs of the molecules that could be featurised, and why the others could not.

    Attributes:
        graphs: one entry per input: a PyG ``Data`` (``x``, ``edge_index``, ``edge_attr`` as
            ``ogb.utils.smiles2graph`` makes them) or None.
        errors: one entry per input: ``""``, or a message saying why there is no graph.
        num_atoms: ``[n]`` atoms per molecule (0 where there is no graph).
    """

    graphs: list[Data | None]
    errors: list[str]
    num_atoms: torch.Tensor

    @cached_property
    def valid(self) -> torch.Tensor:
        """Positions of the inputs that have a graph, ascending."""
        return torch.tensor(
            [i for i, g in enumerate(self.graphs) if g is not None], dtype=torch.long
        )


def featurize_smiles(smiles: Sequence[object], max_atoms: int | None = None) -> FeaturizedMolecules:
    """Featurises each SMILES with OGB's ``smiles2graph``, the featurisation every molecule
    dataset here trains on (OGB's own files were made with it, and so is a SMILES CSV).

    Args:
        smiles (Sequence): SMILES strings; anything else (None, NaN, a number) is an error entry.
        max_atoms (int | None, optional): molecules with more atoms get an error entry instead of
            a graph (attention memory grows with the square of the atom count). (default: None)
    """
    graphs: list[Data | None] = []
    errors: list[str] = []
    num_atoms: list[int] = []
    # Messages of unparsable SMILES are collected per molecule below, not printed.
    with blocked_rdkit_logs():
        for value in smiles:
            graph, error = featurize_one(value, max_atoms)
            graphs.append(None if graph is None else _as_data(graph))
            errors.append(error)
            num_atoms.append(0 if graph is None else int(graph["num_nodes"]))
    return FeaturizedMolecules(graphs, errors, torch.tensor(num_atoms, dtype=torch.long))


def featurize_compact(smiles: Sequence[object]) -> dict[str, np.ndarray]:
    """:func:`featurize_smiles` of many SMILES as flat compact arrays (PCQM4Mv2's 3.7M molecules
    are stored so).

    Returns ``x`` ``[N, 9]`` uint8, ``edge_index`` ``[2, E]`` int16 local node ids (each bond in
    both directions, as OGB lists them), ``edge_attr`` ``[E, 3]`` uint8, ``num_nodes`` and
    ``num_edges`` ``[G]`` int32, and ``failed`` (positions that have no graph, e.g. SMILES rdkit
    cannot parse; they are kept as graphs without atoms, so that indices stay the input's).
    """
    xs, edges, attrs, nodes, edge_counts, failed = [], [], [], [], [], []
    with blocked_rdkit_logs():
        for position, value in enumerate(smiles):
            graph, _ = featurize_one(value, None)
            if graph is None:
                failed.append(position)
                nodes.append(0)
                edge_counts.append(0)
                continue
            xs.append(graph["node_feat"])
            edges.append(graph["edge_index"])
            attrs.append(graph["edge_feat"])
            nodes.append(graph["num_nodes"])
            edge_counts.append(graph["edge_index"].shape[1])
    return {
        "x": _stack(xs, (0, 9), np.uint8, axis=0),
        "edge_index": _stack(edges, (2, 0), np.int16, axis=1),
        "edge_attr": _stack(attrs, (0, 3), np.uint8, axis=0),
        "num_nodes": np.asarray(nodes, dtype=np.int32),
        "num_edges": np.asarray(edge_counts, dtype=np.int32),
        "failed": np.asarray(failed, dtype=np.int64),
    }


def _stack(parts: list[np.ndarray], empty: tuple[int, int], dtype, axis: int) -> np.ndarray:
    if not parts:
        return np.zeros(empty, dtype=dtype)
    out = np.concatenate(parts, axis=axis)
    if out.size and (out.min() < np.iinfo(dtype).min or out.max() > np.iinfo(dtype).max):
        raise DataError(f"a feature value does not fit {np.dtype(dtype).name}; widen the storage")
    return out.astype(dtype)


def smiles_feature_dims() -> tuple[list[int], list[int]]:
    """Vocabulary sizes of the atom (9) and bond (3) feature columns SMILES become here: OGB's."""
    from ogb.utils.features import get_atom_feature_dims, get_bond_feature_dims

    return list(get_atom_feature_dims()), list(get_bond_feature_dims())


def molecule_bond_edges(graph: Data) -> torch.Tensor:
    """``[num_bonds]`` the edge of each bond of a featurised molecule, in RDKit's bond order:
    OGB's ``smiles2graph`` lists bond ``k`` as edge ``2k`` (begin -> end atom) and ``2k + 1`` (the
    reverse), so bond ``k`` is edge ``2k`` (issue #18's bond targets are read so)."""
    return torch.arange(0, graph.edge_index.size(1), 2, dtype=torch.long)


def _as_data(graph: dict) -> Data:
    return Data(
        x=torch.from_numpy(graph["node_feat"]),
        edge_index=torch.from_numpy(graph["edge_index"]),
        edge_attr=torch.from_numpy(graph["edge_feat"]),
        num_nodes=graph["num_nodes"],
    )
