"""SMILES to molecule graphs with OGB's ``smiles2graph``, and the reason for every molecule that
cannot be featurised (it keeps its place; it is never dropped). The one featuriser of SMILES: a
SMILES CSV is read with it for training, and ``graphormer.inference`` with it for prediction, so
that prediction sees molecules exactly as training did."""

from __future__ import annotations

import re
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from functools import cached_property

import torch
from ogb.utils import smiles2graph
from rdkit import Chem, rdBase
from torch_geometric.data import Data

__all__ = ["FeaturizedMolecules", "featurize_smiles", "smiles_error"]

# rdkit prefixes each logged line with a time stamp, and parse errors with this phrase.
_LOG_PREFIX = re.compile(r"^\[\d\d:\d\d:\d\d\] ")
_PARSE_PREFIX = "SMILES Parse Error: "


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
    with _blocked_rdkit_logs():
        for value in smiles:
            graph, error = _featurize_one(value, max_atoms)
            graphs.append(graph)
            errors.append(error)
            num_atoms.append(0 if graph is None else graph.num_nodes)
    return FeaturizedMolecules(graphs, errors, torch.tensor(num_atoms, dtype=torch.long))


def _featurize_one(value: object, max_atoms: int | None) -> tuple[Data | None, str]:
    if not isinstance(value, str) or not value.strip():
        return None, "empty SMILES"
    mol = Chem.MolFromSmiles(value)
    if mol is None:
        return None, f"invalid SMILES: {smiles_error(value)}"
    atoms = mol.GetNumAtoms()
    if atoms == 0:
        return None, "the molecule has no atoms"
    if max_atoms is not None and atoms > max_atoms:
        return None, f"{atoms} atoms, more than max_atoms={max_atoms}"
    # smiles2graph parses the SMILES again (~25% of featurisation time): calling OGB's own
    # function rather than a copy of its body is what guarantees training's featurisation.
    graph = smiles2graph(value)
    return (
        Data(
            x=torch.from_numpy(graph["node_feat"]),
            edge_index=torch.from_numpy(graph["edge_index"]),
            edge_attr=torch.from_numpy(graph["edge_feat"]),
            num_nodes=graph["num_nodes"],
        ),
        "",
    )


def smiles_error(smiles: str) -> str:
    """rdkit's own reason for rejecting ``smiles`` (its first logged line), for error messages."""
    capture_cls = getattr(rdBase, "CaptureErrorLog", None)  # newer rdkit releases only
    if capture_cls is None:
        return "rdkit cannot parse it"
    with capture_cls() as capture:
        Chem.MolFromSmiles(smiles)
    lines = [_LOG_PREFIX.sub("", line).strip() for line in capture.messages.splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        return "rdkit cannot parse it"
    return lines[0].removeprefix(_PARSE_PREFIX)


def _blocked_rdkit_logs():
    blocker = getattr(rdBase, "BlockLogs", None)
    return blocker() if blocker is not None else nullcontext()
