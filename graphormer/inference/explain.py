"""Attention pictures (PNG) and raw maps (``.npy``) of a molecule: :func:`write_explanation`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from graphormer.inference.attention import AttentionMaps
from graphormer.inference.pictures import (
    attention_legend,
    check_picture_size,
    draw_atom_values,
    draw_bond_values,
    draw_heads,
    draw_molecule,
    draw_molecules,
)
from graphormer.outputs import atomic_path

__all__ = ["norms", "write_explanation"]


def write_explanation(maps: AttentionMaps, folder: Path, size: int = 600) -> list[Path]:
    """Writes into ``folder``:

    - ``rollout.png``: the molecule (``size`` x ``size`` px) with atoms shaded by the attention the
      graph token pays them, rolled out over all layers;
    - ``layers.png``: the same per layer (0-based), one panel (``size // 2`` px) per layer, four
      to a row, then the rollout;
    - ``heads_layer<l>.png``: per-head heatmaps of layer ``l`` (rows: queries, columns: keys;
      labels ``graph``, ``C0``, ``O1``... match the atom numbers of the drawings);
    - ``attention.npy`` ``[L, H, n + 1, n + 1]`` and ``rollout.npy`` ``[n + 1, n + 1]`` (index 0
      is the graph token; rows sum to 1); ``summary.json``: SMILES, labels, predictions;
    - for a model of atom targets, ``atoms_<target>.png``: the molecule with each atom coloured
      by its predicted value (blue-white-red centred on zero for signed values), with a legend;
    - for a model of bond targets, ``bonds_<target>.png``: the molecule with each bond drawn in
      the colour of its predicted value (the same scales), with a legend;
    - for a ``model.readout=token_sum`` model (regression or binary), ``contributions_<task>.png``:
      the molecule with each atom coloured by its additive term of the prediction (target units;
      logits for binary tasks), blue-white-red centred on zero, with a legend;
    - for a model of per-atom vectors (forces), ``atoms_<target>.png``: each atom coloured by
      its vector's norm, which the legend says (the vectors are in ``summary.json``).

    A structure's frame is drawn as its atoms with the bonds their positions imply
    (``maps.molecule``), numbered in the file's atom order.
    """
    check_picture_size(size)
    folder.mkdir(parents=True, exist_ok=True)
    written = []

    def save(name: str, data: bytes) -> None:
        path = folder / name
        with atomic_path(path) as partial:
            partial.write_bytes(data)
        written.append(path)

    layers = maps.num_layers
    rollout = maps.graph_token_attention()
    save(
        "rollout.png",
        draw_molecule(
            maps.drawn,
            rollout,
            size=size,
            legend=(
                f"graph-token attention rolled out over {layers} layers "
                f"({attention_legend(rollout)})"
            ),
        ),
    )
    per_layer = [maps.graph_token_attention(layer) for layer in range(layers)]
    save(
        "layers.png",
        draw_molecules(
            maps.drawn,
            [*per_layer, rollout],
            legends=[
                *(f"layer {i} ({attention_legend(v)})" for i, v in enumerate(per_layer)),
                f"rollout ({attention_legend(rollout)})",
            ],
            panel=size // 2,
        ),
    )
    digits = len(str(layers - 1))
    for layer in range(layers):
        path = folder / f"heads_layer{layer:0{digits}d}.png"
        title = (
            f"{maps.smiles}  layer {layer}: attention of each query row over the keys, "
            "relative to a uniform row"
        )
        with atomic_path(path) as partial:
            draw_heads(maps.weights[layer], maps.labels, title=title).save(partial, optimize=True)
        written.append(path)
    for name, array in (("attention.npy", maps.weights), ("rollout.npy", maps.rollout())):
        with atomic_path(folder / name) as partial:
            np.save(partial, array.astype(np.float32))
        written.append(folder / name)
    for name, values in maps.atom_predictions.items():
        save(f"atoms_{name}.png", draw_atom_values(maps.drawn, np.asarray(values), name, size))
    for name, values in maps.bond_predictions.items():
        save(f"bonds_{name}.png", draw_bond_values(maps.drawn, np.asarray(values), name, size))
    for name, values in maps.atom_contributions.items():
        label = f"{name}, each atom's contribution"
        picture = draw_atom_values(maps.drawn, np.asarray(values), label, size)
        save(f"contributions_{name}.png", picture)
    for name, vectors in maps.atom_vector_predictions.items():
        # A vector has no colour: its length does (the direction is in summary.json).
        label = f"{name}, each atom's vector norm |(x, y, z)|"
        picture = draw_atom_values(maps.drawn, norms(vectors), label, size)
        save(f"atoms_{name}.png", picture)
    vectors = maps.atom_vector_predictions
    summary = {
        "smiles": maps.smiles,
        "labels": maps.labels,
        "predictions": maps.predictions,
        **({"atom_predictions": maps.atom_predictions} if maps.atom_predictions else {}),
        **({"bond_predictions": maps.bond_predictions} if maps.bond_predictions else {}),
        **({"atom_contributions": maps.atom_contributions} if maps.atom_contributions else {}),
        **({"atom_vector_predictions": vectors} if vectors else {}),
        **(
            {"atom_vector_norms": {k: norms(v).tolist() for k, v in vectors.items()}}
            if vectors
            else {}
        ),
        "layers": layers,
        "heads": maps.num_heads,
    }
    save("summary.json", (json.dumps(summary, indent=2) + "\n").encode())
    return written


def norms(vectors: list) -> np.ndarray:
    """``[n]``: the length of each atom's ``[x, y, z]``."""
    return np.linalg.norm(np.asarray(vectors, dtype=np.float64).reshape(-1, 3), axis=-1)
