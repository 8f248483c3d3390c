"""Graphormer-3D's encoding of atom positions and its per-atom vector head (Shi et al., 2022,
"Benchmarking Graphormer on Large-Scale Molecular Modeling Datasets",
https://arxiv.org/abs/2203.04810, Sec. 3; Luo et al., 2022, Transformer-M,
https://arxiv.org/abs/2210.01765)."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor, nn

from graphormer.models.init import bert_init_

__all__ = [
    "AngularCentrality",
    "AngularLayout",
    "AngularMessages",
    "DistanceMessages",
    "GaussianDistanceEncoding",
    "VectorHead",
    "VectorMessages",
    "cosine_switch",
    "gaussian_grid",
    "pair_distances",
]


def pair_distances(pos: Tensor) -> tuple[Tensor, Tensor]:
    """Distances ``[B, N, N]`` and unit vectors ``r_ij = (pos_j - pos_i) / d_ij`` ``[B, N, N, 3]``
    (zero on the diagonal), in float32 whatever the input's dtype when it is lower.

    The distance is ``sqrt(|x|^2 + 1e-12)`` rather than ``norm``: the norm's gradient at the
    diagonal's zero vector is NaN, and forces by autograd differentiate through it."""
    if pos.dtype in (torch.float16, torch.bfloat16):
        pos = pos.float()
    delta = pos.unsqueeze(1) - pos.unsqueeze(2)  # [B, N, N, 3]: delta[b, i, j] = pos_j - pos_i
    dist = delta.pow(2).sum(-1).add(1e-12).sqrt()  # [B, N, N]
    return dist, delta / dist.clamp(min=1e-5).unsqueeze(-1)


class _Gaussians(torch.autograd.Function):
    r""":math:`\psi_k(x) = \exp(-\frac12 z_k^2) / (\sqrt{2\pi}\sigma_k)`,
    :math:`z_k = (x - \mu_k) / \sigma_k`, for ``x`` ``[...]``, ``mu`` and ``sigma`` ``[K]``, as one
    function: autograd would keep five ``[..., K]`` intermediates and run twice as many passes
    over them, and these are the largest tensors of a 3D model. The backward pass is written in
    differentiable operations, so second derivatives (forces as an energy's gradient, trained)
    stay exact."""

    @staticmethod
    def forward(ctx, x: Tensor, mu: Tensor, sigma: Tensor) -> Tensor:
        inv = sigma.reciprocal()
        z = (x.unsqueeze(-1) - mu) * inv
        psi = torch.exp(z.square_().mul_(-0.5)).mul_(inv / math.sqrt(2 * math.pi))
        ctx.save_for_backward(x, mu, sigma, psi)
        return psi

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, mu, sigma, psi = ctx.saved_tensors
        inv = sigma.reciprocal()
        z = (x.unsqueeze(-1) - mu) * inv
        grad_psi = grad * psi
        # d psi / d z = -z psi; z is linear in x and mu, and d psi / d sigma = psi (z^2 - 1) / sigma.
        grad_z = grad_psi * z
        grad_x = grad_mu = grad_sigma = None
        if ctx.needs_input_grad[0]:
            grad_x = -(grad_z @ inv)
        flat = grad_z.reshape(-1, grad_z.size(-1))
        if ctx.needs_input_grad[1]:
            grad_mu = flat.sum(0) * inv
        if ctx.needs_input_grad[2]:
            grad_sigma = (flat * z.reshape(flat.shape) - grad_psi.reshape(flat.shape)).sum(0) * inv
        return grad_x, grad_mu, grad_sigma


class GaussianDistanceEncoding(nn.Module):
    r"""The attention bias and the atom inputs of Graphormer-3D's Gaussian distance encoding.

    For each ordered pair of atoms of types ``t_i``, ``t_j``, the distance ``d_ij`` goes through
    a learned affine map of its pair type, ``x_ij = gamma[t_i, t_j] d_ij + beta[t_i, t_j]``
    (initialised 1 and 0), and ``K`` Gaussian kernels with learned means and widths,
    :math:`\psi^k_{ij} = \exp(-\frac12 ((x_{ij} - \mu_k) / \sigma_k)^2) / (\sqrt{2\pi}\sigma_k)`
    (computed in float32 even under mixed precision: bf16 would round the distances). An MLP
    ``K -> K -> H`` (GELU) of the kernels is a per-head attention bias; ``Linear(K -> d)`` of
    :math:`\sum_j \psi_{ij}` is added to each atom's input (Graphormer-3D's 3D centrality).

    Pairs with a padded atom, and with ``cutoff`` pairs farther apart than it, get no kernels
    (their bias is masked by the caller through :attr:`far`; a far pair never attends).

    Two options reshape the centrality's sum (neither is Graphormer-3D's; both off by default):
    ``centrality_cutoff`` sums only the pairs closer than it, each faded to zero there by
    :func:`cosine_switch` (a local neighbour density, as an embedded-atom potential's), and
    ``centrality_gates`` scales each pair's kernels by a learned ``K``-vector of its pair type
    (initialised to ones) before the sum, so that each pair of elements contributes a radial
    function of its own shape and size, not one shared by all pairs up to ``gamma`` and
    ``beta``. ``centrality_basis="grid"`` sums :func:`gaussian_grid` of the distance over
    ``[0, centrality_cutoff]`` instead of the learned kernels: each atom's smooth histogram of
    its neighbours' distances (itself included), resolved to the grid's spacing. The attention
    bias and the kernels handed on (``pairs``) are unchanged.

    Args:
        num_heads (int): ``H``.
        hidden_dim (int): model width ``d``.
        num_atom_types (int): atom types, 0 (padding) included; the pair table has its square.
        num_kernels (int, optional): ``K``. (default: :obj:`128`)
        cutoff (float | None, optional): Angstrom; pairs beyond it are masked. (default: None)
        centrality_cutoff (float | None, optional): Angstrom; the centrality sums the pairs
            closer than it, faded smoothly. (default: None: every pair, Graphormer-3D's)
        centrality_gates (bool, optional): a learned gate of ``K`` per pair type on the
            centrality's kernels. (default: :obj:`False`)
        centrality_basis (str, optional): ``kernels`` (the learned kernels) or ``grid``
            (``K`` fixed Gaussians over ``[0, centrality_cutoff]``; needs the cutoff).
            (default: :obj:`"kernels"`)

    Shapes:
        - input: ``pos`` ``[B, N, 3]``, ``atom_type`` ``[B, N]`` long (0 at padding),
          ``node_mask`` ``[B, N]`` bool
        - output: bias ``[B, H, N, N]``, atom input ``[B, N, d]``, far ``[B, N, N]`` bool (pairs
          beyond the cutoff; all False without one)
    """

    def __init__(
        self,
        num_heads: int,
        hidden_dim: int,
        num_atom_types: int,
        num_kernels: int = 128,
        cutoff: float | None = None,
        centrality_cutoff: float | None = None,
        centrality_gates: bool = False,
        centrality_basis: str = "kernels",
    ) -> None:
        super().__init__()
        if centrality_basis not in ("kernels", "grid"):
            raise ValueError(f"centrality_basis={centrality_basis!r}: kernels or grid")
        if centrality_basis == "grid" and centrality_cutoff is None:
            raise ValueError("centrality_basis=grid spans [0, centrality_cutoff]: give the cutoff")
        if centrality_basis == "grid" and num_kernels < 2:
            raise ValueError(f"centrality_basis=grid needs at least 2 kernels, got {num_kernels}")
        self.centrality_basis = centrality_basis
        self.num_atom_types = num_atom_types
        self.cutoff = cutoff
        self.centrality_cutoff = centrality_cutoff
        self.gamma = nn.Embedding(num_atom_types * num_atom_types, 1)
        self.beta = nn.Embedding(num_atom_types * num_atom_types, 1)
        self.means = nn.Parameter(torch.empty(num_kernels))
        self.stds = nn.Parameter(torch.empty(num_kernels))
        self.bias_mlp = nn.Sequential(
            nn.Linear(num_kernels, num_kernels), nn.GELU(), nn.Linear(num_kernels, num_heads)
        )
        self.centrality = nn.Linear(num_kernels, hidden_dim)
        # Only when asked for: existing checkpoints keep their tensors.
        self.gates = (
            nn.Embedding(num_atom_types * num_atom_types, num_kernels) if centrality_gates else None
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.ones_(self.gamma.weight)
        nn.init.zeros_(self.beta.weight)
        # Spread over the 0-3 A of bonded and near neighbours, as Graphormer-3D initialises them.
        nn.init.uniform_(self.means, 0, 3)
        nn.init.uniform_(self.stds, 0, 3)
        bert_init_(*self.bias_mlp[::2], self.centrality)
        if self.gates is not None:
            nn.init.ones_(self.gates.weight)

    def kernels(self, dist: Tensor, atom_type: Tensor, pair_mask: Tensor) -> Tensor:
        """``[B, N, N, K]`` kernel values in ``dist``'s dtype (float32 or wider), zero where
        ``pair_mask`` is False."""
        types = self.num_atom_types
        pair_type = atom_type.unsqueeze(2) * types + atom_type.unsqueeze(1)  # [B, N, N]
        psi = self._gaussians(dist, pair_type)
        return psi * pair_mask.unsqueeze(-1).to(psi.dtype)

    def _gaussians(self, dist: Tensor, pair_type: Tensor) -> Tensor:
        """``[..., K]`` kernels of distances ``[...]`` of pairs of types ``pair_type``."""
        dtype = dist.dtype
        # The tables are read as plain vectors: an embedding lookup per pair costs more.
        gamma = self.gamma.weight.view(-1).to(dtype)[pair_type]
        beta = self.beta.weight.view(-1).to(dtype)[pair_type]
        x = gamma * dist + beta
        std = self.stds.to(dtype).abs() + 1e-5  # [K]
        return _Gaussians.apply(x, self.means.to(dtype), std)  # [..., K]

    def forward(
        self, pos: Tensor, atom_type: Tensor, node_mask: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        return self.encode(pos, atom_type, node_mask)[:3]

    def encode(
        self, pos: Tensor, atom_type: Tensor, node_mask: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, tuple[Tensor, ...]]:
        """:meth:`forward`'s three outputs and the pairs they were computed from:
        ``(batch, i, j, kernels [P, K], distances [P], unit vectors from i to j [P, 3])``,
        every ordered pair of real atoms within the cutoff (the diagonal included, its unit
        vector zero), row-major."""
        with torch.autocast(pos.device.type, enabled=False):
            dist, unit = pair_distances(pos)
            pair_mask = node_mask.unsqueeze(2) & node_mask.unsqueeze(1)  # [B, N, N]
            far = torch.zeros_like(pair_mask)
            if self.cutoff is not None:
                far = (dist > self.cutoff) & pair_mask
                pair_mask = pair_mask & ~far
            # Kernels of the pairs that enter the model only: a batch of mixed-size molecules is
            # mostly padded pairs, and [B, N, N, K] would be the model's largest tensor.
            batch, i, j = pair_mask.nonzero(as_tuple=True)  # [P] each, row-major order
            pair_type = atom_type[batch, i] * self.num_atom_types + atom_type[batch, j]
            distance = dist[batch, i, j]  # [P]
            psi = self._gaussians(distance, pair_type)  # [P, K] float32
        pairs = (batch, i, j, psi, distance, unit[batch, i, j])
        # The MLPs run in the weights' dtype (or autocast's): only the kernels need float32.
        psi = psi.to(self.centrality.weight.dtype)
        # A pair without kernels (padding, beyond the cutoff) gets the MLP of zero kernels, as
        # the dense form of the encoding computes it; the caller masks those pairs.
        b, n = pair_mask.shape[:2]
        empty = self.bias_mlp(psi.new_zeros(psi.size(-1)))  # [H]
        bias = empty.expand(b, n, n, -1).masked_scatter(
            pair_mask.unsqueeze(-1), self.bias_mlp(psi)
        )  # [B, N, N, H]
        summed = psi
        if self.centrality_basis == "grid":
            grid = gaussian_grid(distance, self.centrality_cutoff, psi.size(-1))
            summed = grid.to(psi.dtype)
        if self.gates is not None:
            summed = summed * self.gates(pair_type).to(psi.dtype)
        if self.centrality_cutoff is not None:
            switch = cosine_switch(distance, self.centrality_cutoff)  # [P], 0 beyond it
            summed = summed * switch.unsqueeze(-1).to(psi.dtype)
        sums = psi.new_zeros(b * n, psi.size(-1)).index_add(0, batch * n + i, summed)  # [B*N, K]
        atoms = self.centrality(sums.view(b, n, -1))  # [B, N, d]
        atoms = atoms * node_mask.unsqueeze(-1).to(atoms.dtype)
        return bias.permute(0, 3, 1, 2), atoms, far, pairs


def cosine_switch(distance: Tensor, cutoff: float) -> Tensor:
    """``0.5 (cos(pi d / cutoff) + 1)`` below ``cutoff``, 0 at and beyond it: smooth at both
    ends (its slope is 0 at 0 and at the cutoff), so an atom crossing the cutoff changes no
    energy abruptly."""
    inside = 0.5 * (torch.cos(distance * (math.pi / cutoff)) + 1)
    return torch.where(distance < cutoff, inside, torch.zeros_like(inside))


def gaussian_grid(distance: Tensor, cutoff: float, count: int) -> Tensor:
    """``[..., count]``: ``count`` Gaussians of a distance ``[...]`` on a fixed grid, SchNet's
    radial basis as PyG's ``GaussianSmearing`` builds it: centres evenly spaced from 0 to
    ``cutoff`` (both included), each as wide as the spacing ``delta``
    (``exp(-(d - mu_k)^2 / (2 delta^2))``, peak 1). Nothing is learned: every distance below
    the cutoff is resolved to the grid's spacing from the first step."""
    if count < 2:
        raise ValueError(f"a Gaussian grid needs at least 2 centres, got {count}")
    centres = torch.linspace(0.0, cutoff, count, dtype=distance.dtype, device=distance.device)
    spacing = cutoff / (count - 1)
    return torch.exp(-0.5 * ((distance.unsqueeze(-1) - centres) / spacing) ** 2)


class AngularCentrality(nn.Module):
    r"""Each atom's smooth histogram of the angles at which it sees its neighbours, added to its
    input: a three-body term beside Graphormer-3D's 3D centrality (a sum over pairs), as the
    angular symmetry functions of Behler-Parrinello and ANI potentials (Smith et al., 2017,
    https://arxiv.org/abs/1610.08935) describe an atom's environment. For atom ``i`` and each
    unordered pair of distinct neighbours ``j``, ``k`` closer than the cutoff ``r_a``, with
    :math:`\cos\theta_{jik} = \hat r_{ij} \cdot \hat r_{ik}` and :math:`C` the cosine switch:

    .. math::
        a_i = \sum_{j < k} C(d_{ij})\, C(d_{ik})\;
            A(\cos\theta_{jik}) \otimes R\big(\tfrac12 (d_{ij} + d_{ik})\big) \otimes
            (e_{t_j} \odot e_{t_k}), \qquad h_i \leftarrow h_i + \mathrm{Lin}(a_i)

    ``A`` is :data:`ANGLES` fixed Gaussians of the cosine spaced over ``[-1, 1]``, ``R``
    :data:`RADII` fixed Gaussians of the legs' mean length over ``[0, r_a]`` (both as
    :func:`gaussian_grid`), and ``e`` a learned :data:`ELEMENTS`-vector per atom type, whose
    products tell the pairs of neighbouring elements apart (ANI keeps one histogram per pair of
    elements; here the channels are shared and learned). Bond angles, which a sum of pair
    distances sees only through the 1-3 distance and its neighbours, enter the first layer
    directly; everything is smooth in the positions (forces as the energy's gradient differentiate
    through it) and invariant to rotations, translations, reflections and atom order.

    Args:
        hidden_dim (int): model width ``d``.
        num_atom_types (int): atom types, 0 (padding) included.
        cutoff (float): ``r_a``, Angstrom.

    Shapes:
        - input: the distance encoding's ``pairs`` (:meth:`GaussianDistanceEncoding.encode`:
          every ordered pair of real atoms, row-major), ``atom_type`` ``[B, N]``,
          ``node_mask`` ``[B, N]``
        - output: ``[B, N, d]``, zero at padding
    """

    ANGLES = 16
    RADII = 4
    ELEMENTS = 8

    def __init__(self, hidden_dim: int, num_atom_types: int, cutoff: float) -> None:
        super().__init__()
        self.cutoff = cutoff
        self.elements = nn.Embedding(num_atom_types, self.ELEMENTS)
        self.out = nn.Linear(self.ANGLES * self.RADII * self.ELEMENTS, hidden_dim)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.elements.weight)
        bert_init_(self.out)

    def forward(self, pairs: tuple[Tensor, ...], atom_type: Tensor, node_mask: Tensor) -> Tensor:
        graph, i, j, _, distance, unit = pairs
        b, n = node_mask.shape
        keep = (i != j) & (distance < self.cutoff)
        graph, i, j, distance, unit = graph[keep], i[keep], j[keep], distance[keep], unit[keep]
        row = graph * n + i  # [P'] each pair's centre atom, as a row of [B * N]
        first, second = neighbour_pairs(row, b * n)  # [T] each, rows of the pairs
        cosine = (unit[first] * unit[second]).sum(-1)  # [T]
        angles = gaussian_grid(cosine + 1, 2.0, self.ANGLES)  # centres over cos in [-1, 1]
        legs = 0.5 * (distance[first] + distance[second])
        radii = gaussian_grid(legs, self.cutoff, self.RADII)
        switch = cosine_switch(distance, self.cutoff)
        weight = switch[first] * switch[second]  # [T]
        shape = (angles.unsqueeze(2) * radii.unsqueeze(1)).flatten(1) * weight.unsqueeze(1)
        dtype = self.out.weight.dtype
        neighbours = self.elements(atom_type[graph, j]).to(shape.dtype)  # [P', E]
        species = neighbours[first] * neighbours[second]  # [T, E]
        terms = (shape.unsqueeze(2) * species.unsqueeze(1)).flatten(1)  # [T, A * R * E]
        sums = terms.new_zeros(b * n, terms.size(1)).index_add(0, row[first], terms)
        atoms = self.out(sums.to(dtype)).view(b, n, -1)
        return atoms * node_mask.unsqueeze(-1).to(atoms.dtype)


def neighbour_pairs(centre: Tensor, size: int) -> tuple[Tensor, Tensor]:
    """For pairs ``[P]`` sorted by their centre (any ``[0, size)`` index), every unordered
    pair of distinct pairs that share a centre, as two ``[T]`` indices into them (``first <
    second``): each atom's pairs of neighbours, the triplets of an angle."""
    count = torch.bincount(centre, minlength=size)  # [size]
    start = torch.cumsum(count, 0) - count
    index = torch.arange(centre.numel(), device=centre.device)
    later = count[centre] - (index - start[centre]) - 1  # pairs after each in its group
    first = torch.repeat_interleave(index, later)  # [T]
    offset = torch.cumsum(later, 0) - later  # where each pair's triplets begin
    step = torch.arange(first.numel(), device=centre.device) - offset[first]
    return first, first + 1 + step


class DistanceMessages(nn.Module):
    r"""Messages between atoms through continuous distance filters (SchNet's interaction,
    Schuett et al., 2017, https://arxiv.org/abs/1706.08566), as a residual block before a
    transformer layer. For each pair ``(i, j)``, ``i != j``, closer than the cutoff ``r_c``,
    the distance encoding's kernels (or :func:`gaussian_grid` of the distance, with
    ``model.message_basis=grid``) give a filter :math:`W_{ij} = \mathrm{MLP}(\psi_{ij})`
    that gates the neighbour's projected state, switched off smoothly towards the cutoff by
    :math:`C(d) = \frac12(\cos(\pi d / r_c) + 1)` (:func:`cosine_switch`):

    .. math::
        h_i \leftarrow h_i + \mathrm{MLP}\Big(\sum_j C(d_{ij})\, W_{ij} \odot
        \mathrm{Lin}(\mathrm{LN}(h_j))\Big)

    Attention mixes the atoms' states with weights that the distances bias; these messages
    carry each distance into what is passed, and sum (not average) over neighbours, so a count
    of near atoms (a local density) is one step away.

    Args:
        num_kernels (int): ``K`` of the distance encoding.
        hidden_dim (int): model width ``d``.

    Shapes:
        - input: ``h`` ``[R, d]`` rows of states, ``target`` and ``source`` ``[P]`` rows of
          ``h`` (each pair's ``i`` and ``j``), ``psi`` ``[P, K]``, ``switch`` ``[P]``
          (:func:`cosine_switch` of the pairs' distances, the same for every layer)
        - output: ``[R, d]``
    """

    def __init__(self, num_kernels: int, hidden_dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden_dim)
        self.inp = nn.Linear(hidden_dim, hidden_dim, bias=False)
        self.filter = nn.Sequential(
            nn.Linear(num_kernels, hidden_dim), nn.GELU(), nn.Linear(hidden_dim, hidden_dim)
        )
        self.out = nn.Sequential(
            nn.Linear(hidden_dim, hidden_dim), nn.GELU(), nn.Linear(hidden_dim, hidden_dim)
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.norm.reset_parameters()
        bert_init_(self.inp, *self.filter[::2], *self.out[::2])

    def forward(
        self, h: Tensor, target: Tensor, source: Tensor, psi: Tensor, switch: Tensor
    ) -> Tensor:
        x = self.inp(self.norm(h))  # [R, d]
        gate = self.filter(psi.to(x.dtype)) * switch.unsqueeze(-1).to(x.dtype)  # [P, d]
        messages = x.index_select(0, source) * gate
        # Summed in float32 at least: an atom of a slab has dozens of neighbours (bf16's
        # 8 bits of mantissa would drop the small ones).
        wide = torch.promote_types(messages.dtype, torch.float32)
        summed = x.new_zeros(x.shape, dtype=wide).index_add(0, target, messages.to(wide))
        return h + self.out(summed.to(x.dtype))


class VectorMessages(nn.Module):
    r"""Distance messages that also carry a vector state per atom (PaiNN's equivariant
    message and update, Schuett et al., 2021, https://arxiv.org/abs/2102.03150), as a residual
    block before a transformer layer. Each atom holds its state :math:`h_i` and ``d`` 3-vectors
    :math:`\vec v_i` (zero before the first block). For each pair ``(i, j)``, ``i != j``,
    closer than the cutoff, with :math:`\hat r_{ij}` the unit vector from ``i`` to ``j`` and
    :math:`C` the cosine switch, the neighbour's projected state gated by a filter of the
    pair's kernels (or :func:`gaussian_grid`, as :class:`DistanceMessages`) splits into
    three ``d``-vectors:

    .. math::
        (a_{ij}, b_{ij}, c_{ij}) = C(d_{ij})\, W(\psi_{ij}) \odot \phi(\mathrm{LN}(h_j)), \quad
        h_i \leftarrow h_i + \sum_j a_{ij}, \quad
        \vec v_i \leftarrow \vec v_i + \sum_j \big(b_{ij} \odot \vec v_j
            + c_{ij}\, \hat r_{ij}\big)

    then each atom mixes its own channels: with :math:`U \vec v_i` and :math:`V \vec v_i`
    linear maps over the channels and :math:`(e, f, g) = \mathrm{MLP}(\mathrm{LN}(h_i),
    \lVert V \vec v_i \rVert)`,

    .. math::
        \vec v_i \leftarrow \vec v_i + e \odot U \vec v_i, \quad
        h_i \leftarrow h_i + f \odot \langle U \vec v_i, V \vec v_i \rangle + g

    The scalar products of vectors summed from different neighbours carry the angles between
    them, which distances alone give only through many layers; the states stay invariant and
    the vectors rotate with the structure (an atom's force can be read from them linearly).

    Args:
        num_kernels (int): ``K`` of the distance encoding.
        hidden_dim (int): model width ``d``.

    Shapes:
        - input: ``h`` ``[R, d]`` rows of states, ``vectors`` ``[R, 3, d]`` (or None: zeros),
          ``target`` and ``source`` ``[P]`` rows (each pair's ``i`` and ``j``), ``psi``
          ``[P, K]``, ``switch`` ``[P]``, ``unit`` ``[P, 3]`` (from ``i`` to ``j``)
        - output: ``([R, d], [R, 3, d])``
    """

    def __init__(self, num_kernels: int, hidden_dim: int) -> None:
        super().__init__()
        d = hidden_dim
        self.norm = nn.LayerNorm(d)
        self.inp = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, 3 * d))
        self.filter = nn.Sequential(nn.Linear(num_kernels, d), nn.GELU(), nn.Linear(d, 3 * d))
        self.mix = nn.Linear(d, 2 * d, bias=False)  # U and V, over the channels
        self.update_norm = nn.LayerNorm(d)
        self.update = nn.Sequential(nn.Linear(2 * d, d), nn.GELU(), nn.Linear(d, 3 * d))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.norm.reset_parameters()
        self.update_norm.reset_parameters()
        bert_init_(*self.inp[::2], *self.filter[::2], self.mix, *self.update[::2])

    def forward(
        self,
        h: Tensor,
        vectors: Tensor | None,
        target: Tensor,
        source: Tensor,
        psi: Tensor,
        switch: Tensor,
        unit: Tensor,
    ) -> tuple[Tensor, Tensor]:
        rows, d = h.shape
        if vectors is None:
            vectors = h.new_zeros(rows, 3, d)
        x = self.inp(self.norm(h))  # [R, 3d]
        gate = self.filter(psi.to(x.dtype)) * switch.unsqueeze(-1).to(x.dtype)  # [P, 3d]
        a, b, c = (x.index_select(0, source) * gate).split(d, dim=-1)  # [P, d] each
        # Summed in float32 at least (an atom of a slab has dozens of neighbours), the unit
        # vectors kept in it.
        wide = torch.promote_types(x.dtype, torch.float32)
        moved = (vectors.index_select(0, source) * b.unsqueeze(1)).to(wide)  # [P, 3, d]
        moved = moved + unit.to(wide).unsqueeze(-1) * c.to(wide).unsqueeze(1)
        h = h + h.new_zeros(h.shape, dtype=wide).index_add(0, target, a.to(wide)).to(h.dtype)
        summed = vectors.new_zeros(vectors.shape, dtype=wide).index_add(0, target, moved)
        vectors = vectors + summed.to(vectors.dtype)
        u, v = self.mix(vectors).split(d, dim=-1)  # [R, 3, d] each
        # The norm's gradient is finite at zero vectors (the first block's, an isolated atom's).
        norm = (v.pow(2).sum(1) + 1e-8).sqrt()  # [R, d]
        e, f, g = self.update(torch.cat([self.update_norm(h), norm], dim=-1)).split(d, dim=-1)
        return h + f * (u * v).sum(1) + g, vectors + e.unsqueeze(1) * u


def direction_powers(unit: Tensor, degree: int) -> Tensor:
    r"""``[P, M]``: each unit vector's monomials of degree ``degree``, each times the square
    root of its multinomial coefficient, so that for two unit vectors ``a``, ``b`` the scalar
    product of their rows is ``(a . b) ** degree`` (the components of the symmetric tensor
    power :math:`\hat r^{\otimes l}`, each distinct one once), ``M = (l + 1)(l + 2) / 2`` with
    ``l = degree``."""
    columns = []
    for a in range(degree, -1, -1):
        for b in range(degree - a, -1, -1):
            c = degree - a - b
            weight = math.sqrt(
                math.factorial(degree) / (math.factorial(a) * math.factorial(b) * math.factorial(c))
            )
            columns.append(weight * unit[:, 0] ** a * unit[:, 1] ** b * unit[:, 2] ** c)
    return torch.stack(columns, dim=1)


class AngularLayout(NamedTuple):
    """The padded neighbour layout of :class:`AngularMessages` (:meth:`AngularMessages.layout`):
    each pair's row ``place`` ``[P]`` of the ``[R * width]`` slots, and per degree ``l`` the
    powers of the pairs' directions in those slots, ``[R, width, M_l]``."""

    place: Tensor
    width: int
    slots: tuple[Tensor, ...]


class AngularMessages(nn.Module):
    r"""Messages that read the angles between an atom's neighbours in every layer: each atom's
    filtered neighbour states, summed with the powers of the bond direction as weights,
    contracted to invariants (the three-body terms of the atomic cluster expansion, Drautz
    2019, https://doi.org/10.1103/PhysRevB.99.014104, and of MACE, Batatia et al., 2022,
    https://arxiv.org/abs/2206.07697, with Cartesian powers in place of spherical harmonics),
    as a residual block after the distance messages. For degrees :math:`l = 1 \ldots L`, with
    :math:`\hat r_{ij}` the unit vector from ``i`` to ``j``, :math:`C` the cosine switch and
    :math:`x_j = \mathrm{Lin}(\mathrm{LN}(h_j))`:

    .. math::
        A^{(l)}_i = \sum_j C(d_{ij})\, W_l(\psi_{ij}) \odot x_j \;\hat r_{ij}^{\otimes l},
        \qquad
        B^{(l)}_i = \big\langle A^{(l)}_i,\, U_l A^{(l)}_i \big\rangle
            = \sum_{j, k} (\hat r_{ij} \cdot \hat r_{ik})^l \,(\ldots)_j \odot U_l (\ldots)_k

    (``U_l`` mixes channels), and :math:`h_i \leftarrow h_i + \mathrm{MLP}(\mathrm{LN}(B^{(1)}_i,
    \ldots, B^{(L)}_i))`. Each :math:`B^{(l)}` is a sum over pairs of neighbours (each
    neighbour with itself included) of the ``l``-th power of the cosine of the angle between
    them, with learned radial and element weights on both legs: up to ``L`` the polynomials of
    the angle are resolved, in every layer, at the cost of a sum over pairs (not over
    triplets). Smooth in the positions and invariant to rotations, reflections, translations
    and atom order.

    With ``directional=True`` the block also sends messages along the pairs, DimeNet's idea
    (Gasteiger et al., 2020, https://arxiv.org/abs/2003.03123) at the cost of a sum over pairs:
    the pair with target ``j`` and source ``i`` contracts its direction with ``j``'s mixed
    densities, :math:`D^{(l)}_{ji} = \langle \hat r_{ji}^{\otimes l}, U_l A^{(l)}_j \rangle
    = \sum_k (\hat r_{ji} \cdot \hat r_{jk})^l\, U_l (\ldots)_k`, the angles that the bond
    ``j-i`` makes at ``j`` with ``j``'s neighbours, and sends it to ``i``:

    .. math::
        h_i \leftarrow h_i + \mathrm{Lin}\Big(\sum_j C(d_{ij})\, \mathrm{Lin}(\psi_{ij})
            \odot \mathrm{MLP}(D^{(1)}_{ji}, \ldots, D^{(L)}_{ji})\Big)

    An atom's own invariants sum its angles; these tell it, bond by bond, how each bond sits
    at its other end. With periodic images (``copies``), an image's densities are its source
    atom's, whose neighbourhood is complete.

    Args:
        num_kernels (int): ``K`` of the distance encoding.
        hidden_dim (int): model width ``d``.
        degree (int): ``L``, the highest power of the cosine.
        directional (bool, optional): the directional messages as well. (default: False)

    Shapes:
        - input: ``h`` ``[R, d]``, ``target`` and ``source`` ``[P]`` rows, ``psi`` ``[P, K]``,
          ``switch`` ``[P]``, ``unit`` ``[P, 3]`` (as :class:`VectorMessages`), and optionally
          ``copies`` ``[R]``, each row's source row (periodic images; None without), and
          ``layout``, :meth:`layout` of these pairs (computed here when None)
        - output: ``[R, d]``
    """

    def __init__(
        self, num_kernels: int, hidden_dim: int, degree: int, directional: bool = False
    ) -> None:
        super().__init__()
        d = hidden_dim
        self.degree = degree
        self.norm = nn.LayerNorm(d)
        self.inp = nn.Linear(d, d, bias=False)
        self.filter = nn.Sequential(nn.Linear(num_kernels, d), nn.GELU(), nn.Linear(d, degree * d))
        self.mix = nn.ModuleList(nn.Linear(d, d, bias=False) for _ in range(degree))
        self.out_norm = nn.LayerNorm(degree * d)
        self.out = nn.Sequential(nn.Linear(degree * d, d), nn.GELU(), nn.Linear(d, d))
        # Only when asked for: existing checkpoints keep exactly their tensors.
        self.edge_filter = self.edge_mlp = self.edge_out = None
        if directional:
            self.edge_filter = nn.Linear(num_kernels, d)
            self.edge_mlp = nn.Sequential(nn.Linear(degree * d, d), nn.GELU(), nn.Linear(d, d))
            self.edge_out = nn.Linear(d, d)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.norm.reset_parameters()
        self.out_norm.reset_parameters()
        bert_init_(self.inp, *self.filter[::2], *self.mix, *self.out[::2])
        if self.edge_mlp is not None:
            bert_init_(self.edge_filter, *self.edge_mlp[::2], self.edge_out)

    @staticmethod
    def layout(target: Tensor, unit: Tensor, rows: int, degree: int) -> AngularLayout:
        """Each atom's neighbours in slots of a padded ``[rows, S]`` layout and the powers of
        their directions there, for degrees ``1 .. degree``: geometry only, the same for every
        layer, so a network computes it once per batch (``layout=`` of :meth:`forward`)."""
        count = torch.bincount(target, minlength=rows)  # [R]
        order = torch.argsort(target, stable=True)
        start = torch.cumsum(count, 0) - count
        slot = torch.empty_like(target)
        slot[order] = torch.arange(target.numel(), device=target.device) - start[target[order]]
        width = int(count.max()) if target.numel() else 1
        place = target * width + slot  # [P] each pair's row of the padded layout
        # Summed in float32 at least, as the other messages.
        unit = unit.to(torch.promote_types(unit.dtype, torch.float32))
        slots = []
        for level in range(1, degree + 1):
            powers = direction_powers(unit, level)  # [P, M]
            padded = powers.new_zeros(rows * width, powers.size(1)).index_copy(0, place, powers)
            slots.append(padded.view(rows, width, -1))  # [R, S, M]
        return AngularLayout(place, width, tuple(slots))

    def forward(
        self,
        h: Tensor,
        target: Tensor,
        source: Tensor,
        psi: Tensor,
        switch: Tensor,
        unit: Tensor,
        copies: Tensor | None = None,
        layout: AngularLayout | None = None,
    ) -> Tensor:
        rows, d = h.shape
        x = self.inp(self.norm(h))  # [R, d]
        gate = self.filter(psi.to(x.dtype)) * switch.unsqueeze(-1).to(x.dtype)  # [P, L d]
        # Each atom's neighbours in slots of a padded [R, S] layout, so that each density is a
        # batched product [M, S] x [S, d] per atom: no [P, M, d] tensor of every pair's terms.
        if layout is None:
            layout = self.layout(target, unit, rows, self.degree)
        place, width = layout.place, layout.width
        # Summed in float32 at least, as the other messages.
        wide = torch.promote_types(x.dtype, torch.float32)
        values = (x.index_select(0, source).repeat(1, self.degree) * gate).to(wide)  # [P, L d]
        padded = values.new_zeros(rows * width, values.size(1)).index_copy(0, place, values)
        padded = padded.view(rows, width, self.degree, d)
        invariants, directions = [], []
        for level in range(1, self.degree + 1):
            slots = layout.slots[level - 1].to(wide)  # [R, S, M]
            density = slots.transpose(1, 2) @ padded[:, :, level - 1]  # [R, M, d]
            mixed = self.mix[level - 1](density.to(x.dtype)).to(wide)  # [R, M, d]
            invariants.append((density * mixed).sum(1))  # [R, d]
            if self.edge_mlp is not None:
                if copies is not None:  # an image's neighbourhood is its source atom's
                    mixed = mixed.index_select(0, copies)
                # Each pair's direction against its target's mixed density: the sum over the
                # target's neighbours k of cos^l of the angle between that pair and k.
                along = (slots @ mixed).view(rows * width, d)  # [R S, d]
                directions.append(along.index_select(0, place))  # [P, d]
        b = torch.cat(invariants, dim=-1).to(x.dtype)  # [R, L d]
        h = h + self.out(self.out_norm(b))
        if self.edge_mlp is None:
            return h
        # Directional messages (DimeNet's idea): the pair (target j, source i) tells i about
        # the angles at j that the bond j-i makes with j's other neighbours.
        edge = self.edge_mlp(torch.cat(directions, dim=-1).to(x.dtype))  # [P, d]
        edge = edge * (self.edge_filter(psi.to(x.dtype)) * switch.unsqueeze(-1).to(x.dtype))
        sent = x.new_zeros(x.shape, dtype=wide).index_add(0, source, edge.to(wide))
        return h + self.edge_out(sent.to(x.dtype))


class VectorHead(nn.Module):
    r"""Per-atom 3-vectors (forces, position changes) from the atoms' final states: Graphormer-3D's
    node head. One attention over the atoms (its own projections, the model's attention bias),
    then for each axis ``c`` :math:`o^c_i = \sum_j \alpha_{ij} r^c_{ij} v_j` with ``r_ij`` the
    unit vector from atom ``i`` to ``j``, and a linear readout of :math:`o^c_i`.

    Graphormer-3D reads each axis with its own linear layer; here one readout serves all three
    axes and has no bias, so that the output rotates exactly with the input (a per-axis map
    would not be equivariant, and a bias would point one way whatever the molecule's pose).

    Args:
        hidden_dim (int): width ``d`` of the atom states.
        num_heads (int): attention heads.
        num_tasks (int): vectors per atom.

    Shapes:
        - input: ``h`` ``[B, N, d]`` atom states (graph token excluded), ``pos`` ``[B, N, 3]``,
          ``attn_bias`` ``[B, H, N, N]`` (padding keys masked)
        - output: ``[B, N, num_tasks, 3]``
    """

    def __init__(self, hidden_dim: int, num_heads: int, num_tasks: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.q = nn.Linear(hidden_dim, hidden_dim)
        self.k = nn.Linear(hidden_dim, hidden_dim)
        self.v = nn.Linear(hidden_dim, hidden_dim)
        self.out = nn.Linear(hidden_dim, num_tasks, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bert_init_(self.q, self.k, self.v, self.out)

    def forward(self, h: Tensor, pos: Tensor, attn_bias: Tensor) -> Tensor:
        b, n, d = h.shape
        heads = self.num_heads

        def split(t: Tensor) -> Tensor:
            return t.view(b, n, heads, d // heads).transpose(1, 2)  # [B, H, N, d/H]

        q, k, v = split(self.q(h)), split(self.k(h)), split(self.v(h))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // heads)  # [B, H, N, N]
        wide = torch.promote_types(scores.dtype, torch.float32)
        alpha = torch.softmax(scores.to(wide) + attn_bias.to(wide), dim=-1)  # [B, H, N, N]
        _, unit = pair_distances(pos)  # [B, N, N, 3]
        # o[b, h, c, i] = sum_j alpha[b, h, i, j] r[b, i, j, c] v[b, h, j]
        weighted = alpha.unsqueeze(2) * unit.permute(0, 3, 1, 2).unsqueeze(1)  # [B, H, 3, N, N]
        o = weighted.to(v.dtype) @ v.unsqueeze(2)  # [B, H, 3, N, d/H]
        o = o.permute(0, 3, 2, 1, 4).reshape(b, n, 3, d)  # [B, N, 3, d]
        return self.out(o).transpose(-1, -2)  # [B, N, T, 3]
