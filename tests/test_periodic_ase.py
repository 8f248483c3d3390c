"""dataset=ase with periodic frames (pbc and a cell): images, tags, the tagged energy readout,
the IS2RE position-change target, and the errors of a flat cell and an atom outside the cell."""

import numpy as np
import pandas as pd
import pytest
from torch_geometric.data import Data
from torch_geometric.data.separate import separate

from graphormer.data.sources import build_source
from graphormer.errors import ConfigError, DataError
from graphormer.inference import Predictor
from graphormer.testing import emt_slabs, write_aselmdb

from helpers import (
    TINY,
    call_failing,
    call_script,
    compose_train,
    tiny_3d,
    train_config,
    without_module,
)

pytest.importorskip("ase", reason="dataset=ase needs the 3d extra (pip install ase)")
import ase.db  # noqa: E402
import ase.io  # noqa: E402


def _source(path, tmp_path, **extra):
    return build_source({"source": "ase", "path": str(path), "root": str(tmp_path), **extra})


def _graph(graphs, i):
    return separate(Data, graphs.data, i, graphs.slices, decrement=False)


def _write(path, frames):
    if str(path).endswith(".aselmdb"):
        write_aselmdb(path, frames)
    elif str(path).endswith(".db"):
        with ase.db.connect(path, append=False) as db:
            for atoms in frames:
                db.write(atoms)
    else:
        ase.io.write(path, frames)


@pytest.mark.parametrize("suffix", ["extxyz", "db", "traj", "aselmdb"])
def test_each_file_kind_gives_images_tags_and_real_atoms_first(tmp_path, suffix):
    frames = emt_slabs(3, seed=1)
    path = tmp_path / f"slabs.{suffix}"
    _write(path, frames)
    graphs = _source(path, tmp_path, pbc_cutoff=6.0).graphs()
    assert graphs.num_graphs == 3
    for i, atoms in enumerate(frames):
        g = _graph(graphs, i)
        n = len(atoms)
        assert g.num_nodes > n and (g.image_of[:n] == -1).all() and (g.image_of[n:] >= 0).all()
        assert g.tags[:n].tolist() == atoms.get_tags().tolist()
        assert (g.tags[n:] == g.tags[g.image_of[n:]]).all()
        np.testing.assert_allclose(g.pos[:n].numpy(), atoms.positions, atol=1e-5)
        assert float(g.y) == pytest.approx(atoms.get_potential_energy(), abs=1e-4)


def test_the_cutoff_decides_the_images_and_names_the_cache(tmp_path):
    path = tmp_path / "slabs.extxyz"
    _write(path, emt_slabs(2, seed=2))
    near = _source(path, tmp_path, pbc_cutoff=3.0).graphs()
    far = _source(path, tmp_path, pbc_cutoff=8.0).graphs()
    assert near.data.x.size(0) < far.data.x.size(0)
    with pytest.raises(ConfigError, match="dataset.pbc_cutoff=0"):
        _source(path, tmp_path, pbc_cutoff=0)
    # images near every atom, not only the adsorbate's: more of them, in a cache of their own
    everywhere = _source(path, tmp_path, pbc_cutoff=3.0, pbc_around="all").graphs()
    assert everywhere.data.x.size(0) > near.data.x.size(0)
    assert _source(path, tmp_path, pbc_cutoff=3.0).graphs().data.x.size(0) == near.data.x.size(0)
    with pytest.raises(ConfigError, match="dataset.pbc_around='every' is not allowed"):
        _source(path, tmp_path, pbc_around="every")
    # the default's cache keeps the name it had before pbc_around existed
    from graphormer.data.sources.graph_cache import input_digest

    digest = input_digest([str(path)], ["ase", ["energy"], [], None, 3.0, None])
    folder = _source(path, tmp_path, pbc_cutoff=3.0)._cache().folder
    assert folder.endswith(f"slabs_{digest}")
    assert _source(path, tmp_path, pbc_cutoff=3.0, pbc_around="all")._cache().folder != folder


def test_relaxed_positions_give_the_position_change_of_moving_atoms(tmp_path):
    frames = emt_slabs(2, seed=3, relax_steps=5)
    path = tmp_path / "is2re.extxyz"
    _write(path, frames)
    source = _source(path, tmp_path, targets=["energy_relaxed"], relaxed_positions="pos_relaxed")
    assert source.atom_vector_task_names() == ["position_change"]
    assert source.task_info().atom_vector_tasks == 1
    graphs = source.graphs()
    atoms = frames[0]
    n = len(atoms)
    first = _graph(graphs, 0).y_atom_vector
    change = first[:n, 0].numpy()
    moving = atoms.get_tags() > 0
    np.testing.assert_allclose(
        change[moving], (atoms.arrays["pos_relaxed"] - atoms.positions)[moving], atol=1e-5
    )
    assert np.isnan(change[~moving]).all() and np.isnan(first[n:].numpy()).all()


def test_a_flat_cell_and_an_atom_outside_the_cell_are_errors(tmp_path):
    frames = emt_slabs(2, seed=4)
    flat = [a.copy() for a in frames]
    flat[1].cell[2] = 0.0
    flat[1].pbc = True
    path = tmp_path / "flat.traj"
    _write(path, flat)
    with pytest.raises(DataError, match="frame 1: the cell .* has zero volume"):
        _source(path, tmp_path).graphs()
    outside = [a.copy() for a in frames]
    outside[0].positions[2] += 2.0 * outside[0].cell[0]
    path = tmp_path / "outside.traj"
    _write(path, outside)
    with pytest.raises(DataError, match="frame 0: atom 2 lies outside the cell .*atoms.wrap"):
        _source(path, tmp_path).graphs()
    # the command's own report: one error line
    result = call_failing(
        "train.py",
        ["dataset=ase", f"dataset.path={path}", f"dataset.root={tmp_path / 'data'}", *TINY],
        cwd=tmp_path,
    )
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "atoms.wrap()" in lines[0]


def test_train_a_tagged_periodic_model_then_predict_its_real_atoms(tmp_path):
    path = tmp_path / "slabs.extxyz"
    frames = emt_slabs(30, seed=5)
    _write(path, frames)
    cfg = compose_train(
        [
            "dataset=ase",
            f"dataset.path={path}",
            "dataset.pbc_cutoff=5.0",
            "dataset.pbc_around=all",
            "dataset.atom_vector_targets=[forces]",
            "model.num_tags=3",
            "model.readout_min_tag=1",
            *tiny_3d(tmp_path),
        ]
    )
    result = train_config(cfg)
    assert np.isfinite(result["test"]["rmse"]) and np.isfinite(result["test"]["atom_vector_mae"])
    best = result["best_checkpoint"]
    predictor = Predictor.from_checkpoint(best)
    # structure files get training's images: within 5 A of every atom
    assert predictor.periodic_cutoff == 5.0 and predictor.periodic_around == "all"
    trained = _source(path, tmp_path, pbc_cutoff=5.0, pbc_around="all").graphs()
    read = predictor.structure_graphs(str(path))
    assert [g.num_nodes for g in read] == [_graph(trained, i).num_nodes for i in range(30)]
    adsorbate = _source(path, tmp_path, pbc_cutoff=5.0).graphs()
    assert sum(g.num_nodes for g in read) > adsorbate.data.x.size(0)
    out = tmp_path / "long.csv"
    args = [f"ckpt={best}", f"input={path}", "layout=long", f"output={out}"]
    call_script("predict.py", [*args, f"hydra.run.dir={tmp_path / 'p'}"], cwd=tmp_path)
    long = pd.read_csv(out)
    # one row per real atom, never per image
    assert long.groupby("row").size().tolist() == [len(a) for a in frames]
    assert long.forces_x.notna().all()


def test_an_aselmdb_file_without_lmdb_names_the_extra(tmp_path, monkeypatch):

    path = tmp_path / "slabs.aselmdb"
    _write(path, emt_slabs(2, seed=6))
    without_module(monkeypatch, "lmdb")
    with pytest.raises(ConfigError, match="pip install 'graphormer\\[oc20\\]'"):
        _source(path, tmp_path).graphs()


def test_reported_takes_one_name_as_a_list_of_it(tmp_path):
    """``dataset.reported=ewt`` on the command line is a string: one metric, not its letters."""
    path = tmp_path / "absent.extxyz"
    assert _source(path, tmp_path, reported="ewt").task_info().reported == ("ewt",)
    with pytest.raises(ConfigError, match=r"dataset.reported=\['acc'\]: .*allowed \['ewt'\]"):
        _source(path, tmp_path, reported="acc")


def test_an_ensemble_takes_a_checkpoint_from_before_pbc_around_beside_one_that_stores_it():
    """A stored dataset config without ``pbc_around`` (written before it existed) was built with
    its default: members agree unless one names another value."""
    from types import SimpleNamespace

    from graphormer.checkpoint import CheckpointError
    from graphormer.training.members import check_members

    task = SimpleNamespace(without_auxiliary=lambda: SimpleNamespace(same_task=lambda _: True))

    def _member(**dataset):
        stored = {"source": "ase", "path": "slabs.extxyz", "pbc_cutoff": 6.0, **dataset}
        record = SimpleNamespace(max_hops=1, model={}, dataset=stored)
        return SimpleNamespace(task=task, run_record=record)

    records = [SimpleNamespace(path="old.ckpt"), SimpleNamespace(path="new.ckpt")]
    check_members(records, [_member(), _member(pbc_around="adsorbate")])
    with pytest.raises(CheckpointError, match="dataset.pbc_around: 'all' vs 'adsorbate'"):
        check_members(records, [_member(), _member(pbc_around="all")])
