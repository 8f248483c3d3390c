"""benchmarks/versus_periodic.py: DimeNet++ with cell shifts (its triplets, its agreement with PyG's
own forward without shifts, its invariances on a periodic slab, its forces)."""

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("ase")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import versus_periodic  # noqa: E402

from graphormer.testing import emt_slabs  # noqa: E402

from common import triplets  # noqa: E402


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    # Small bases (the benchmark's take 15 s to build); angles still enter through l = 1, 2.
    model = versus_periodic.PeriodicDimeNet(num_spherical=3, num_radial=3).double().eval()
    # PyG starts the output blocks' last layers at zero: every energy would be 0.
    for block in model.net.output_blocks:
        torch.nn.init.normal_(block.lin.weight, std=0.3)
    return model


def _inputs(frames):
    offsets, first = [], 0
    for frame in frames:
        offsets.append(first)
        first += len(frame)
    edge_index, shift = versus_periodic.periodic_pairs(frames, offsets)
    z = torch.cat([torch.from_numpy(f.numbers) for f in frames]).long()
    pos = torch.cat([torch.from_numpy(f.positions) for f in frames]).double()
    batch = torch.cat([torch.full((len(f),), n) for n, f in enumerate(frames)])
    return z, pos, batch, (edge_index, shift.double())


def _energy(model, frames):
    with torch.no_grad():
        return model.energy(*_inputs(frames))


def test_triplets_drop_only_the_backtrack_to_the_same_image():
    # One atom in a cell of 1 A along x: its images at +1 and -1 are its two neighbours.
    edge_index = torch.tensor([[0, 0], [0, 0]])
    shift = torch.tensor([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]])
    *_, idx_k, idx_kj, idx_ji = triplets(edge_index, 1, shift)
    # k -> j -> i along +1 then +1 (or -1, -1) reaches k's image 2 A away: kept; +1 then -1
    # comes back to i itself: dropped.
    assert sorted(zip(idx_kj.tolist(), idx_ji.tolist(), strict=True)) == [(0, 0), (1, 1)]
    assert idx_k.tolist() == [0, 0]
    # Without shifts (a molecule), PyG's rule: every k == i dropped.
    assert len(triplets(edge_index, 1)[-1]) == 0


@pytest.mark.parametrize("blocks", [3, 0])
def test_without_shifts_the_energy_is_pygs_own_dimenet(model, blocks, monkeypatch):
    import ase.build
    from torch_geometric.nn.models import dimenet

    if blocks != 3:  # --dimenet-blocks 0: the embedding and the first output block alone
        torch.manual_seed(1)
        model = versus_periodic.PeriodicDimeNet(3, 3, num_blocks=blocks).double().eval()
        assert len(model.net.interaction_blocks) == 0 and len(model.net.output_blocks) == 1
        torch.nn.init.normal_(model.net.output_blocks[0].lin.weight, std=0.3)
    frames = [ase.build.molecule("CH3CH2OH"), ase.build.molecule("C6H6")]
    z, pos, batch, pairs = _inputs(frames)
    assert not pairs[1].any()  # no periodic direction: every shift zero
    # PyG's neighbours and triplets need torch-cluster and torch-sparse: the same pairs and the
    # plain-torch triplets (PyG's rule, k != i) in their place.
    monkeypatch.setattr(dimenet, "radius_graph", lambda *args, **kwargs: pairs[0])
    monkeypatch.setattr(dimenet, "triplets", triplets)
    with torch.no_grad():
        ours, pygs = model.energy(z, pos, batch, pairs), model.net(z, pos, batch).view(-1)
    assert ours.shape == (2,) and ours.abs().min() > 1e-3
    torch.testing.assert_close(ours, pygs, rtol=0, atol=1e-5)


def test_slab_energy_is_the_same_after_translation_and_wrapping_into_the_cell(model):
    (slab,) = emt_slabs(1, seed=5)
    assert slab.pbc[:2].all() and not slab.pbc[2]
    energy = _energy(model, [slab])

    moved = slab.copy()
    moved.positions += [0.3, -0.7, 0.4]  # every atom, no wrapping: the same pairs
    torch.testing.assert_close(_energy(model, [moved]), energy, rtol=0, atol=1e-4)

    cell = slab.cell.array
    moved.positions += 0.37 * cell[0] + 0.61 * cell[1]
    before = moved.positions.copy()
    moved.wrap()
    # Some atoms went back by a lattice vector: their pairs now cross the boundary elsewhere.
    assert (abs(moved.positions - before).max(axis=1) > 1.0).any()
    torch.testing.assert_close(_energy(model, [moved]), energy, rtol=0, atol=1e-4)

    # Across the boundary matters: the same atoms without periodic neighbours differ.
    alone = slab.copy()
    alone.pbc = False
    assert abs(float(_energy(model, [alone]) - energy)) > 1e-3


def test_forces_are_the_energys_negative_finite_difference_gradient(model):
    (slab,) = emt_slabs(1, seed=6)
    z, pos, batch, pairs = _inputs([slab])
    _, forces = model(z, pos.clone(), batch, pairs)
    atom, step = len(slab) - 1, 1e-5  # the adsorbate's last atom, along x
    change = torch.zeros_like(pos)
    change[atom, 0] = step
    with torch.no_grad():
        up = model.energy(z, pos + change, batch, pairs)
        down = model.energy(z, pos - change, batch, pairs)
    expected = -(up - down) / (2 * step)
    assert abs(float(expected)) > 1e-3
    torch.testing.assert_close(forces[atom, 0].view(1), expected, rtol=1e-4, atol=1e-6)


def test_periodic_pairs_are_ases_neighbour_list():
    from ase.neighborlist import neighbor_list

    frames = emt_slabs(40, seed=3)  # holds a slanted fcc(111) slab spanning almost a whole cell
    edge_index, shift = versus_periodic.periodic_pairs(frames, [0] * len(frames))
    found, first = 0, 0
    for frame in frames:
        i, j, cells = neighbor_list("ijS", frame, versus_periodic.SCHNET_CUTOFF)
        ours = edge_index[:, first : first + len(i)]
        moved = shift[first : first + len(i)].double().numpy()
        expected = sorted(zip(j, i, map(tuple, (cells @ frame.cell).round(4)), strict=True))
        got = sorted(zip(*ours.tolist(), map(tuple, moved.round(4)), strict=True))
        assert got == expected
        first += len(i)
        found += len(i)
    assert found == edge_index.size(1)
