"""The dense batch: the contract between the data pipeline (which builds it) and the model (which
reads it). It lives here, outside both packages, so that ``graphormer.models`` needs torch alone."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor

__all__ = ["GraphormerBatch"]


@dataclass
class GraphormerBatch:
    """A padded batch of ``B`` graphs of at most ``N`` nodes.

    Attributes:
        x: ``[B, N, F]`` long categorical node features (0 at padding).
        in_degree, out_degree: ``[B, N]`` long.
        spatial_pos: ``[B, N, N]`` int16 hop distances, -1 when unreachable or padding.
        edge_path: ``[B, N, N, K]`` rows of :attr:`edge_attr` along one shortest path, -1 past its
            end (int16 while the batch has fewer than 32,768 edges, else int32).
        edge_attr: ``[E, F_e]`` long categorical edge features of all graphs of the batch.
        node_mask: ``[B, N]`` bool, True at real nodes.
        y: ``[B, T]`` float targets (NaN where missing), or None.
        index: ``[B]`` long dataset indices of the graphs (for exact distributed evaluation).
        x_continuous: ``[B, N, F_c]`` float node features (0 at padding), or None.
        edge_attr_continuous: ``[E, F_ec]`` float edge features, or None.
        y_atom: ``[B, N, T_atom]`` float per-atom (per-node) targets, NaN where missing and at
            padding (so padding never counts in a loss or a metric), or None.
        bond_atoms: ``[B, M, 2]`` long positions (within each graph, as in :attr:`x`) of the two
            atoms of each bond (edge) that carries bond-level targets (issue #18); 0 at padding.
            None for a batch without bond targets.
        bond_edge: ``[B, M]`` long rows of :attr:`edge_attr` of each bond (0 at padding), or None.
        bond_mask: ``[B, M]`` bool, True at real bonds, or None.
        y_bond: ``[B, M, T_bond]`` float per-bond targets, NaN where missing and at padding, or
            None (a prediction batch of a bond model carries the bonds without labels).
        molecule_features: ``[B, D]`` float raw molecule-level features (RDKit descriptors,
            a file's columns; NaN where missing), or None (issue #22).
        pos: ``[B, N, 3]`` float atom positions in Angstrom (0 at padding), or None for graphs
            without them.
        y_atom_vector: ``[B, N, T_vec, 3]`` float per-atom vector targets (forces), NaN where
            missing and at padding, or None.
        tags: ``[B, N]`` long atom tags (OC20's 0 fixed, 1 surface, 2 adsorbate; 0 at
            padding), or None.
        image_of: ``[B, N]`` long: for a periodic image of an atom (an extra node, after the
            graph's real atoms; :mod:`graphormer.data.periodic`) the position of the atom it
            copies, -1 for real atoms and padding; None for a batch without images.
    """

    x: Tensor
    in_degree: Tensor
    out_degree: Tensor
    spatial_pos: Tensor
    edge_path: Tensor
    edge_attr: Tensor
    node_mask: Tensor
    y: Tensor | None = None
    index: Tensor | None = None
    x_continuous: Tensor | None = None
    edge_attr_continuous: Tensor | None = None
    y_atom: Tensor | None = None
    bond_atoms: Tensor | None = None
    bond_edge: Tensor | None = None
    bond_mask: Tensor | None = None
    y_bond: Tensor | None = None
    molecule_features: Tensor | None = None
    pos: Tensor | None = None
    y_atom_vector: Tensor | None = None
    tags: Tensor | None = None
    image_of: Tensor | None = None

    @property
    def num_graphs(self) -> int:
        return self.x.size(0)

    @property
    def atom_mask(self) -> Tensor:
        """``[B, N]`` bool, True at real atoms: :attr:`node_mask` without periodic images (the
        nodes whose outputs and labels count)."""
        if self.image_of is None:
            return self.node_mask
        return self.node_mask & (self.image_of < 0)

    def _apply(self, fn) -> GraphormerBatch:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return GraphormerBatch(
            **{k: fn(v) if isinstance(v, Tensor) else v for k, v in values.items()}
        )

    def to(self, device: torch.device | str, non_blocking: bool = False) -> GraphormerBatch:
        return self._apply(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> GraphormerBatch:
        return self._apply(lambda t: t.pin_memory())
