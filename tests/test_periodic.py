"""Periodic images (graphormer.data.periodic) against ASE's neighbour list, and a model that reads
them: energies unchanged by shifting every atom by a lattice vector or wrapping positions into
the cell, outputs per real atom only, shared-weight blocks."""

import numpy as np
import pytest
import torch

pytest.importorskip("ase")

from ase.build import add_adsorbate, bulk, fcc100  # noqa: E402
from ase.neighborlist import neighbor_list  # noqa: E402
from torch_geometric.data import Data  # noqa: E402

from graphormer.data.periodic import (  # noqa: E402
    ADSORBATE_TAG,
    cell_offsets,
    check_cell,
    periodic_images,
)
from graphormer.errors import ConfigError, DataError  # noqa: E402
from graphormer.models import Graphormer, GraphormerConfig  # noqa: E402

from helpers import periodic_batch, periodic_graph  # noqa: E402


def _crystal(seed: int = 0):
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((2, 2, 2))  # 32 atoms, 7.2 A cube
    atoms.rattle(0.1, seed=seed)
    return atoms


def _slab():
    atoms = fcc100("Cu", size=(3, 3, 2), vacuum=6.0)  # periodic in x and y
    add_adsorbate(atoms, "O", 1.5, position=(0.4, 0.3))  # near a corner: across the boundary
    atoms.rattle(0.05, seed=1)
    return atoms


def _image_set(atoms, cutoff, tags=None, around="adsorbate"):
    cell, pbc = atoms.cell, atoms.pbc
    images, source, shift = periodic_images(atoms.positions, cell, pbc, tags, cutoff, around)
    np.testing.assert_allclose(images, atoms.positions[source] + shift @ np.asarray(atoms.cell))
    return {(int(j), *map(int, s)) for j, s in zip(source, shift, strict=True)}


def test_offsets_are_the_neighbouring_cells_along_periodic_directions():
    assert len(cell_offsets([True, True, False])) == 8  # Microsoft's 8 images of a slab
    assert len(cell_offsets([True, True, True])) == 26
    assert len(cell_offsets([False, False, False])) == 0
    assert not cell_offsets([True, True, False])[:, 2].any()


@pytest.mark.parametrize("cutoff", [3.0, 5.0])
def test_every_pair_ase_finds_across_the_boundary_is_an_image(cutoff):
    atoms = _crystal()
    kept = _image_set(atoms, cutoff)
    i, j, shifts = neighbor_list("ijS", atoms, cutoff)
    across = [(int(b), *map(int, s)) for b, s in zip(j, shifts, strict=True) if s.any()]
    assert across, "the test structure must have neighbours across the boundary"
    assert set(across) <= kept
    # and nothing farther than the cutoff from every atom is kept
    far = _image_set(atoms, cutoff)
    images, _, _ = periodic_images(atoms.positions, atoms.cell, atoms.pbc, None, cutoff)
    nearest = np.linalg.norm(images[:, None] - atoms.positions[None], axis=-1).min(1)
    assert (nearest < cutoff).all() and len(far) == len(images)


def test_a_slab_keeps_the_images_near_its_adsorbate():
    atoms = _slab()
    tags = np.zeros(len(atoms), dtype=int)
    tags[-1] = ADSORBATE_TAG
    cutoff = 4.0
    kept = _image_set(atoms, cutoff, tags)
    i, j, shifts = neighbor_list("ijS", atoms, cutoff)
    adsorbate = len(atoms) - 1
    expected = {
        (int(b), *map(int, s)) for a, b, s in zip(i, j, shifts, strict=True) if a == adsorbate
    }
    expected = {e for e in expected if any(e[1:])}
    assert expected and expected <= kept
    assert all(s[3] == 0 for s in kept)  # z is not periodic
    # without tags every atom anchors: more images
    assert len(_image_set(atoms, cutoff)) > len(kept)


def test_images_around_every_atom_give_each_atom_all_its_periodic_neighbours():
    atoms = _slab()
    tags = np.zeros(len(atoms), dtype=int)
    tags[-1] = ADSORBATE_TAG
    cutoff = 4.0
    i, j, shifts = neighbor_list("ijS", atoms, cutoff)
    across = {(int(b), *map(int, s)) for b, s in zip(j, shifts, strict=True) if s.any()}
    everywhere = _image_set(atoms, cutoff, tags, around="all")
    assert across <= everywhere  # every atom's neighbours across the boundary, tags or not
    assert everywhere == _image_set(atoms, cutoff)  # as a structure without tags
    # around the adsorbate only, slab atoms far from it miss some of theirs
    assert not across <= _image_set(atoms, cutoff, tags)
    with pytest.raises(ConfigError, match="dataset.pbc_around='everywhere' is not allowed"):
        periodic_images(atoms.positions, atoms.cell, atoms.pbc, tags, cutoff, "everywhere")


def test_a_flat_cell_and_an_atom_far_outside_are_errors():
    atoms = _crystal()
    flat = np.asarray(atoms.cell).copy()
    flat[2] = 0.0
    with pytest.raises(DataError, match="zero volume"):
        check_cell(flat, atoms.pbc, atoms.positions, "frame 0")
    far = atoms.positions.copy()
    far[3] += 1.2 * np.asarray(atoms.cell)[0]
    far[3] += 0.8 * np.asarray(atoms.cell)[0]
    with pytest.raises(DataError, match="atom 3 lies outside the cell of the others.*atoms.wrap"):
        check_cell(atoms.cell, atoms.pbc, far, "frame 0")
    # the whole structure a few cells away is not outside
    check_cell(atoms.cell, atoms.pbc, atoms.positions - 3 * np.asarray(atoms.cell)[1], "frame 0")
    # a slab's vacuum direction is not periodic: an atom above the box is fine there
    slab = _slab()
    high = slab.positions.copy()
    high[-1, 2] += 3 * slab.cell[2, 2]
    check_cell(slab.cell, slab.pbc, high, "frame 0")


def _model(**settings) -> Graphormer:
    torch.manual_seed(0)
    values = dict(num_layers=2, hidden_dim=16, ffn_dim=16, num_heads=2, dropout=0.0)
    values.update(attention_dropout=0.0, activation_dropout=0.0, channels="3d", num_kernels=8)
    values.update(atom_feature_dims=[119], bond_feature_dims=[1], readout="token_sum")
    model = Graphormer(GraphormerConfig(**{**values, **settings})).double().eval()
    with torch.no_grad():  # away from the initialisation's near-zero weights
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


@torch.no_grad()
def test_energy_unchanged_by_a_lattice_shift_and_by_wrapping():
    atoms = _crystal()
    cell = np.asarray(atoms.cell)
    start = atoms.positions.copy()
    start[:5] -= 0.15 * cell[0]  # a few atoms just outside the cell, as files hold them
    wrapped = atoms.copy()
    wrapped.positions = start
    wrapped.wrap()
    shifted = start + cell[1] - cell[2]
    model = _model(cutoff=3.0)  # the periodic neighbours within 3 A: all present as images
    energies = [
        float(model(periodic_batch([periodic_graph(atoms, positions, 3.0)])))
        for positions in (start, wrapped.positions, shifted)
    ]
    assert not np.allclose(start, wrapped.positions)
    np.testing.assert_allclose(energies[1:], [energies[0]] * 2, rtol=0, atol=1e-5)
    # the images matter: the same atoms without them are another structure
    lone = periodic_graph(atoms, start, 3.0)
    alone = Data(**{k: lone[k][: len(atoms)] for k in ("x", "pos")}, y=lone.y)
    alone.edge_index, alone.edge_attr = lone.edge_index, lone.edge_attr
    alone.num_nodes = len(atoms)
    assert abs(float(model(periodic_batch([alone]))) - energies[0]) > 1e-3


@torch.no_grad()
def test_a_tagged_slab_shifted_by_lattice_vectors_keeps_its_energy():
    atoms = _slab()
    tags = np.ones(len(atoms), dtype=int)
    tags[-1] = ADSORBATE_TAG
    cell = np.asarray(atoms.cell)
    model = _model(num_tags=3, readout_min_tag=1)
    energies = [
        float(model(periodic_batch([periodic_graph(atoms, atoms.positions + shift, 6.0, tags)])))
        for shift in (0 * cell[0], 2 * cell[0] - cell[1], -3 * cell[1])
    ]
    np.testing.assert_allclose(energies[1:], [energies[0]] * 2, rtol=0, atol=1e-5)


@torch.no_grad()
def test_outputs_are_the_real_atoms_and_images_hold_their_sources_state():
    atoms = _slab()
    tags = np.ones(len(atoms), dtype=int)
    tags[-1] = ADSORBATE_TAG
    graph = periodic_graph(atoms, atoms.positions, 6.0, tags)
    n = len(atoms)
    assert graph.num_nodes > n and (graph.image_of[n:] >= 0).all()
    model = _model(atom_vector_tasks=1, num_tags=3)
    batch = periodic_batch([graph])
    out = model.forward_levels(batch)
    vectors = out["atom_vector"][0]
    assert vectors[:n].abs().sum() > 0 and vectors[n:].abs().sum() == 0
    h = model.encode(batch)[0][0, 1:]  # [N + M, d]
    torch.testing.assert_close(h[n:], h[graph.image_of[n:]])
    # the per-atom readout sums real atoms only: zeroing the images' states changes nothing
    # but the graph token's reading of them, which is masked too
    assert batch.atom_mask.sum() == n


@torch.no_grad()
def test_readout_min_tag_sums_the_atoms_that_move():
    atoms = _slab()
    tags = np.ones(len(atoms), dtype=int)
    tags[:9] = 0  # the bottom layer is fixed
    tags[-1] = ADSORBATE_TAG
    graph = periodic_graph(atoms, atoms.positions, 4.0, tags)
    model = _model(num_tags=3, readout_min_tag=1)
    batch = periodic_batch([graph])
    h = model.encode(batch)[0]
    contributions = model.atom_contributions(h, batch)[0, :, 0]
    assert (contributions[:9] == 0).all() and (contributions[9 : len(atoms)] != 0).all()
    assert (contributions[len(atoms) :] == 0).all()
    untagged = periodic_graph(atoms, atoms.positions, 4.0)
    with pytest.raises(DataError, match="model.num_tags=3"):
        model(periodic_batch([untagged]))


@torch.no_grad()
def test_blocks_repeat_the_layers_with_the_same_weights():
    once, twice = _model(num_layers=2), _model(num_layers=2, blocks=2)
    assert sum(p.numel() for p in once.parameters()) == sum(p.numel() for p in twice.parameters())
    twice.load_state_dict(once.state_dict())
    graph = periodic_graph(_crystal(), _crystal().positions, 3.0)
    four = _model(num_layers=4)
    state = dict(once.state_dict())
    for name, value in once.state_dict().items():  # layers 2, 3 are copies of 0, 1
        if name.startswith("layers."):
            index, rest = name.split(".", 2)[1:]
            state[f"layers.{int(index) + 2}.{rest}"] = value
    four.load_state_dict(state)
    batch = periodic_batch([graph])
    torch.testing.assert_close(twice(batch), four(batch))
    assert not torch.allclose(twice(batch), once(batch))


def test_fine_tuning_takes_the_tags_and_blocks_with_the_architecture():
    from graphormer.training.pretrained import architecture

    stored = {"num_layers": 2, "num_tags": 3, "blocks": 4, "readout_min_tag": 1, "dropout": 0.1}
    assert architecture(stored) == {"num_layers": 2, "num_tags": 3, "blocks": 4}


def test_an_unknown_anchor_is_refused_even_without_images_to_build():
    molecule = bulk("Cu", "fcc", a=3.6)
    with pytest.raises(ConfigError, match="dataset.pbc_around='bogus' is not allowed"):
        periodic_images(molecule.positions, molecule.cell, [False] * 3, None, 4.0, "bogus")
