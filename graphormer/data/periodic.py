"""Periodic images of a structure in a cell (crystals, catalyst slabs): the neighbours each atom
has across the cell's boundary, as extra nodes.

Graphormer-3D's OC20 recipe (microsoft/Graphormer ``graphormer/tasks/is2re.py``, ``PBCDataset``)
replicates the cell -1, 0, +1 times along each periodic direction (8 images of a slab, periodic
in x and y) and keeps the image atoms within 8 A of an adsorbate atom (tag 2). Here the same
images, of every atom (an adsorbate's own images included, so that one split by the boundary
keeps its bonds), within ``cutoff`` of an anchor: the adsorbate atoms when the structure has
tags, else every atom (a crystal), or every atom whatever the tags (``around="all"``: each
atom's whole periodic neighbourhood, for targets that every atom contributes to, such as a
slab's total energy and forces). Each image carries its source atom's index: the model shares
its source's state (:class:`~graphormer.models.Graphormer`), and outputs and losses are the
real atoms' only.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch
from torch_geometric.data import Data

from graphormer.errors import ConfigError, DataError

__all__ = [
    "ADSORBATE_TAG",
    "ATOM_INTEGER_KEYS",
    "PBC_AROUND",
    "PBC_CUTOFF",
    "cell_offsets",
    "check_cell",
    "checked_around",
    "checked_cutoff",
    "periodic_images",
    "with_images",
]

# Per-node integers a periodic structure's graph carries beside x (the collator pads them).
ATOM_INTEGER_KEYS = ("tags", "image_of")
# OC20's tags: 0 fixed subsurface slab atoms, 1 surface atoms, 2 adsorbate atoms.
ADSORBATE_TAG = 2
# Microsoft's PBCDataset.cutoff (Angstrom).
PBC_CUTOFF = 8.0
# Which atoms anchor the images: the adsorbate's (Microsoft's; every atom without adsorbate
# tags), or every atom's.
PBC_AROUND = ("adsorbate", "all")
# Atoms spread over this many cell lengths along a periodic direction are refused: the -1..+1
# images of one would miss the nearest copies of another.
_SPAN = 1.5


def checked_cutoff(pbc_cutoff: object) -> float:
    """``dataset.pbc_cutoff`` as a float, or :class:`ConfigError` naming it when it is not a
    distance > 0."""
    if isinstance(pbc_cutoff, bool) or not isinstance(pbc_cutoff, int | float) or pbc_cutoff <= 0:
        raise ConfigError(
            f"dataset.pbc_cutoff={pbc_cutoff!r} is not allowed: a distance > 0 in Angstrom"
        )
    return float(pbc_cutoff)


def checked_around(pbc_around: object) -> str:
    """``dataset.pbc_around`` (one of :data:`PBC_AROUND`), or :class:`ConfigError` naming it."""
    if pbc_around not in PBC_AROUND:
        raise ConfigError(
            f"dataset.pbc_around={pbc_around!r} is not allowed: adsorbate (images near the "
            "adsorbate atoms, Microsoft's) or all (images near every atom)"
        )
    return str(pbc_around)


def cell_offsets(pbc: np.ndarray) -> np.ndarray:
    """``[M, 3]`` integer cell shifts in {-1, 0, 1} along the periodic directions, the zero
    shift (the cell itself) excluded: 8 for a slab periodic in x and y, 26 for a crystal."""
    ranges = [(-1, 0, 1) if periodic else (0,) for periodic in np.asarray(pbc, dtype=bool)]
    shifts = [s for s in itertools.product(*ranges) if any(s)]
    return np.asarray(shifts, dtype=np.int64).reshape(-1, 3)


def check_cell(cell: np.ndarray, pbc: np.ndarray, positions: np.ndarray, where: str) -> None:
    """Raises :class:`DataError` naming ``where`` for a cell the images cannot be built from:
    zero volume (with any periodic direction), or an atom outside the cell of the others.

    "Outside" means that along a periodic direction the atoms' fractional coordinates span
    1.5 cells or more: then no one cell holds them all, and the -1, 0, +1 images of one atom
    no longer hold its nearest copies of the farthest (``atoms.wrap()`` moves every atom into
    the cell, which leaves the structure the same). A structure shifted as a whole by lattice
    vectors is not outside. Non-periodic directions are not checked: a slab's vacuum or a
    cluster's box bounds nothing."""
    cell = np.asarray(cell, dtype=np.float64).reshape(3, 3)
    volume = abs(float(np.linalg.det(cell)))
    if volume < 1e-6:
        raise DataError(
            f"{where}: the cell {cell.tolist()} has zero volume and pbc is "
            f"{np.asarray(pbc).tolist()}: give a periodic structure its three cell vectors "
            "(atoms.cell), or set pbc=False for a molecule"
        )
    periodic = np.asarray(pbc, dtype=bool)
    fractional = np.asarray(positions, dtype=np.float64) @ np.linalg.inv(cell)  # [N, 3]
    if not len(fractional):
        return
    span = np.where(periodic, fractional.max(0) - fractional.min(0), 0.0)  # [3]
    if (span >= _SPAN).any():
        axis = int(np.argmax(span))
        high, low = int(fractional[:, axis].argmax()), int(fractional[:, axis].argmin())
        raise DataError(
            f"{where}: atom {high} lies outside the cell of the others ({span[axis]:.2f} cell "
            f"lengths from atom {low} along periodic cell vector {axis}): wrap the positions "
            "into the cell (ASE: atoms.wrap())"
        )


def periodic_images(
    positions: np.ndarray,
    cell: np.ndarray,
    pbc: np.ndarray,
    tags: np.ndarray | None = None,
    cutoff: float = PBC_CUTOFF,
    around: str = "adsorbate",
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The image atoms of a periodic structure within ``cutoff`` of an anchor atom.

    Args:
        positions (np.ndarray): ``[N, 3]`` Angstrom.
        cell (np.ndarray): ``[3, 3]`` cell vectors (rows).
        pbc (np.ndarray): ``[3]`` bool, the periodic directions.
        tags (np.ndarray | None, optional): ``[N]`` OC20's tags; the anchors are the atoms
            tagged :data:`ADSORBATE_TAG` when any is, else every atom. (default: None)
        cutoff (float, optional): Angstrom. (default: :data:`PBC_CUTOFF`)
        around (str, optional): ``adsorbate`` (as above) or ``all``: every atom anchors,
            whatever the tags. (default: :obj:`"adsorbate"`)

    Returns:
        ``(image_positions [M, 3], source [M], shift [M, 3])``: each kept image's position, the
        index of the atom it copies and its cell shift (``position = positions[source] + shift
        @ cell``), in the order of the shifts of :func:`cell_offsets` then of the atoms.
    """
    around = checked_around(around)
    positions = np.asarray(positions, dtype=np.float64).reshape(-1, 3)
    cell = np.asarray(cell, dtype=np.float64).reshape(3, 3)
    shifts = cell_offsets(pbc)  # [S, 3]
    n = len(positions)
    if len(shifts) == 0 or n == 0:
        return np.zeros((0, 3)), np.zeros(0, dtype=np.int64), np.zeros((0, 3), dtype=np.int64)
    anchors = positions
    if tags is not None and around == "adsorbate":
        tags = np.asarray(tags).reshape(-1)
        if (tags == ADSORBATE_TAG).any():
            anchors = positions[tags == ADSORBATE_TAG]
    images = positions[None, :, :] + (shifts @ cell)[:, None, :]  # [S, N, 3]
    images = images.reshape(-1, 3)
    # Distance of every image to every anchor: [S*N, A]; S*N*A stays small (27 x 300 x 300
    # for OC20's largest systems with every atom an anchor).
    gap = images[:, None, :] - anchors[None, :, :]
    kept = (np.einsum("ijk,ijk->ij", gap, gap) < cutoff * cutoff).any(axis=1)  # [S*N]
    source = np.tile(np.arange(n, dtype=np.int64), len(shifts))[kept]
    shift = np.repeat(shifts, n, axis=0)[kept]
    return images[kept], source, shift


def with_images(
    graph: Data,
    cell: np.ndarray,
    pbc: np.ndarray,
    tags: np.ndarray | None,
    cutoff: float,
    where: str,
    around: str = "adsorbate",
) -> Data:
    """``graph`` (a structure's atoms: ``x`` ``[N, F]``, ``pos`` ``[N, 3]``, optional per-atom
    labels) with its periodic images appended as extra nodes: ``x`` and ``tags`` copied from
    their source atoms, ``pos`` shifted, ``image_of`` ``[N + M]`` (the source atom's index, -1
    for the real atoms) and per-atom labels NaN at the images (outputs and losses are the real
    atoms'). ``cell`` ``[3, 3]`` and ``pbc`` ``[3]`` are kept on the graph. ``around`` chooses
    the anchors as in :func:`periodic_images`.

    Raises:
        DataError: the cell has zero volume or an atom lies outside it (:func:`check_cell`).
    """
    positions = graph.pos.double().numpy()
    check_cell(cell, pbc, positions, where)
    image_pos, source, _ = periodic_images(positions, cell, pbc, tags, cutoff, around)
    n, m = len(positions), len(source)
    index = torch.from_numpy(source)
    out = graph.clone()
    out.x = torch.cat([graph.x, graph.x[index]])
    out.pos = torch.cat([graph.pos, torch.from_numpy(image_pos).to(graph.pos.dtype)])
    out.image_of = torch.cat([torch.full((n,), -1, dtype=torch.long), index])
    if tags is not None:
        tags = torch.as_tensor(np.asarray(tags, dtype=np.int64)).view(-1)
        out.tags = torch.cat([tags, tags[index]])
    for key in ("y_atom", "y_atom_vector"):
        labels = graph.get(key)
        if labels is not None:
            blank = labels.new_full((m, *labels.shape[1:]), float("nan"))
            out[key] = torch.cat([labels, blank])
    out.cell = torch.as_tensor(np.asarray(cell, dtype=np.float32)).view(1, 3, 3)
    out.pbc = torch.as_tensor(np.asarray(pbc, dtype=bool)).view(1, 3)
    out.num_nodes = n + m
    return out
