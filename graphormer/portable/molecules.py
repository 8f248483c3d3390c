"""One SMILES to OGB's molecule graph (numpy arrays), or the reason it has none: the featuriser
of every SMILES here (``graphormer.data.featurize`` for training and the torch predictor, the ONNX
predictor without torch), so that every path sees a molecule exactly as training did."""

from __future__ import annotations

import re
from contextlib import nullcontext

from ogb.utils import smiles2graph
from rdkit import Chem, rdBase

__all__ = ["blocked_rdkit_logs", "featurize_one", "smiles_error"]

# rdkit prefixes each logged line with a time stamp, and parse errors with this phrase.
_LOG_PREFIX = re.compile(r"^\[\d\d:\d\d:\d\d\] ")
_PARSE_PREFIX = "SMILES Parse Error: "


def featurize_one(value: object, max_atoms: int | None) -> tuple[dict | None, str]:
    """OGB's ``smiles2graph`` of one SMILES (``node_feat`` ``[N, 9]``, ``edge_index`` ``[2, E]``,
    ``edge_feat`` ``[E, 3]``, ``num_nodes``), or None and why not. Call it inside
    :func:`blocked_rdkit_logs`: the reasons are returned, not printed."""
    if not isinstance(value, str) or not value.strip():
        return None, "empty SMILES"
    if any(c.isspace() for c in value.strip()):
        # rdkit reads a SMILES up to the first blank and takes the rest as a name: "CC\tC" would
        # be ethane, silently (#20).
        head = value.strip().split()[0]
        return None, (
            f"whitespace inside the SMILES {value!r} (rdkit would read only {head!r}); a "
            "tab-separated file read as a CSV? remove it, or give a .tsv"
        )
    # OGB's own function rather than a copy of its body: that is what guarantees training's
    # featurisation. It parses the SMILES once; rdkit is asked again only when it fails.
    try:
        graph = smiles2graph(value)
    except Exception:  # rdkit returns None for a SMILES it cannot parse; OGB then fails
        if Chem.MolFromSmiles(value) is None:
            return None, f"invalid SMILES: {smiles_error(value)}"
        raise
    atoms = int(graph["num_nodes"])
    if atoms == 0:
        return None, "the molecule has no atoms"
    if max_atoms is not None and atoms > max_atoms:
        return None, f"{atoms} atoms, more than max_atoms={max_atoms}"
    return graph, ""


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


def blocked_rdkit_logs():
    """rdkit's logging off (its messages of unparsable SMILES are collected per molecule)."""
    blocker = getattr(rdBase, "BlockLogs", None)
    return blocker() if blocker is not None else nullcontext()
