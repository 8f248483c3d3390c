"""dataset=oc20: OC20's IS2RE LMDB folders, their records read through graphormer.safe_io's
allow-list (a record holding any other class is refused, never run), each validation folder a
split of its own, and the errors of a wrong layout and a missing lmdb."""

import datetime
import os

import numpy as np
import pytest
import torch

from graphormer.data.sources import build_source
from graphormer.data.sources.graph_cache import input_digest
from graphormer.errors import ConfigError, DataError
from graphormer.testing import emt_slabs, oc20_record, write_oc20_layout

from helpers import (
    IS2RE_TINY,
    call_script,
    compose_train,
    read_json,
    tiny_3d,
    train_config,
    without_module,
)

pytest.importorskip("lmdb", reason="dataset=oc20 needs the oc20 extra (pip install lmdb)")
pytest.importorskip("ase", reason="the test structures are built with ASE")

FOLDERS = ("train", "val_id", "val_ood_ads", "val_ood_cat", "val_ood_both")


class Shell:
    """A class no OC20 record holds: unpickling it would run os.system."""

    def __reduce__(self):
        import os

        return (os.system, ("echo unpickled > /dev/null",))


@pytest.fixture(scope="module")
def slabs():
    return [oc20_record(a) for a in emt_slabs(30, seed=11, relax_steps=6)]


def _layout(root, slabs, sizes=(14, 4, 4, 4, 4)):
    start, splits = 0, {}
    for folder, size in zip(FOLDERS, sizes, strict=True):
        if size:
            splits[folder] = slabs[start : start + size]
            start += size
    return write_oc20_layout(root, splits)


def _source(path, tmp_path, **extra):
    return build_source({"source": "oc20", "path": str(path), "root": str(tmp_path), **extra})


def test_records_become_periodic_graphs_with_the_position_change(tmp_path, slabs):
    path = _layout(tmp_path / "is2re", slabs)
    source = _source(path, tmp_path / "data")
    loaded = source.load()
    assert {k: len(v) for k, v in loaded.split.items()} == {
        "train": 14,
        "val_id": 4,
        "val_ood_ads": 4,
        "val_ood_cat": 4,
        "val_ood_both": 4,
        "valid": 4,
    }
    assert loaded.evaluated == FOLDERS[1:]
    assert source.task_info().reported == ("ewt",)
    first = loaded.dataset[0]
    record = slabs[0]
    n = record.natoms
    assert first.num_nodes > n and (first.image_of[n:] >= 0).all()
    assert float(first.y) == pytest.approx(record.y_relaxed)
    moving = record.tags > 0
    change = first.y_atom_vector[:n, 0]
    torch.testing.assert_close(change[moving], (record.pos_relaxed - record.pos)[moving])
    assert torch.isnan(change[~moving]).all()


def test_a_record_holding_another_class_is_refused_and_never_run(tmp_path, slabs, monkeypatch):
    bad = oc20_record_with(slabs[1], Shell())
    path = write_oc20_layout(tmp_path / "bad", {"train": [slabs[0], bad], "val_id": [slabs[2]]})
    ran = []
    monkeypatch.setattr("os.system", lambda command: ran.append(command))
    with pytest.raises(DataError, match=r"train/data.lmdb: record 1 holds .*posix.system.*refused"):
        _source(path, tmp_path / "data").graphs()
    assert ran == []
    # a harmless class outside the allow-list is refused alike
    dated = {"a": datetime.date(2020, 1, 1)}
    path = write_oc20_layout(tmp_path / "bad2", {"train": [dated], "val_id": [slabs[2]]})
    with pytest.raises(DataError, match="record 0 holds an object of class datetime.date"):
        _source(path, tmp_path / "data").graphs()


def oc20_record_with(record, value):
    out = record.clone()
    out.extra = value
    return out


def test_a_wrong_layout_and_a_missing_lmdb_are_errors(tmp_path, slabs, monkeypatch):
    only_train = _layout(tmp_path / "one", slabs, sizes=(4, 0, 0, 0, 0))
    with pytest.raises(DataError, match="holds \\['train'\\], not the layout .*val_id"):
        _source(only_train, tmp_path / "data").graphs()
    with pytest.raises(DataError, match="is not a folder"):
        _source(tmp_path / "nowhere", tmp_path / "data").graphs()
    path = write_oc20_layout(tmp_path / "fields", {"train": [{"pos": 1}], "val_id": [slabs[0]]})
    with pytest.raises(DataError, match="record 0 lacks \\['atomic_numbers', 'cell', 'tags'\\]"):
        _source(path, tmp_path / "data").graphs()
    without_module(monkeypatch, "lmdb")
    with pytest.raises(ConfigError, match="pip install 'graphormer\\[oc20\\]'"):
        _source(only_train, tmp_path / "data").graphs()


def test_train_then_evaluate_each_validation_folder(tmp_path, slabs):
    path = _layout(tmp_path / "is2re", slabs)
    run = tmp_path / "run"
    cfg = compose_train(
        [
            "dataset=oc20",
            f"dataset.path={path}",
            *IS2RE_TINY,
            *tiny_3d(tmp_path),
        ]
    )
    result = train_config(cfg)
    assert np.isfinite(result["valid"]["mae"]) and result["test"] is None
    best = read_json(run / "metrics.json")["best_checkpoint"]
    out = tmp_path / "eval.json"
    log = call_script("eval.py", [f"ckpt={best}", "split=all", f"output={out}"], cwd=tmp_path)
    scores = read_json(out)
    for folder in FOLDERS[1:]:
        assert folder in log and np.isfinite(scores[folder]["mae"])
        assert 0 <= scores[folder]["ewt"] <= 1


def test_the_oc20_recipe_is_microsofts_script(tmp_path):
    from omegaconf import OmegaConf

    from graphormer.models import Graphormer, GraphormerConfig
    from graphormer.training.settings import RunSettings

    cfg = compose_train(["experiment=oc20_is2re", "dataset.path=/oc20", f"output_dir={tmp_path}"])
    settings = RunSettings.from_dict(OmegaConf.to_container(cfg, resolve=True))
    model = settings.model
    assert (model["num_layers"], model["blocks"], model["hidden_dim"], model["ffn_dim"]) == (
        12,
        4,
        768,
        768,
    )
    assert (model["num_heads"], model["num_kernels"], model["channels"]) == (48, 128, "3d")
    assert (model["num_tags"], model["readout_min_tag"]) == (3, 1)
    optim, trainer = settings.optim, settings.trainer
    assert (optim.lr, optim.warmup_steps, optim.total_steps) == (3e-4, 10000, 1_000_000)
    assert optim.betas == (0.9, 0.98) and optim.eps == 1e-6 and optim.weight_decay == 0.001
    assert (trainer.max_steps, trainer.precision, trainer.gradient_clip_val) == (
        1_000_000,
        "16-mixed",
        5.0,
    )
    assert settings.datamodule.batch_size == 2 and settings.seed == 1
    assert settings.loss == "l1" and settings.item_loss == "l1"
    assert settings.loss_weights == {"atom_vector": 15.0}
    assert settings.loss_weights_end == {"atom_vector": 1.0}
    assert settings.dataset["source"] == "oc20" and settings.dataset["pbc_cutoff"] == 8.0
    network = Graphormer(
        GraphormerConfig.from_dict(
            {
                **model,
                "atom_feature_dims": [119],
                "bond_feature_dims": [1],
                "atom_vector_tasks": 1,
            }
        )
    )
    assert len(network.layers) == 12  # 48 layer passes, 12 layers' weights


def _pickled_global(module, name):
    # SHORT_BINUNICODE module, SHORT_BINUNICODE name, STACK_GLOBAL (protocol 4)
    text = b"".join(b"\x8c" + bytes([len(s)]) + s.encode() for s in (module, name))
    return text + b"\x93"


def test_a_record_cannot_write_into_an_allowed_class_or_function():
    """BUILD with a (None, {name: value}) state runs setattr on its target: a record whose
    target is an allow-listed global itself would rewrite it for the whole process."""
    import torch._utils
    from torch_geometric.data.data import DataTensorAttr

    from graphormer.safe_io import RefusedClassError, loads_records

    def setattr_record(module, name, attribute, value):
        state = b"N}\x8c" + bytes([len(attribute)]) + attribute.encode() + value + b"s\x86"
        return b"\x80\x04" + _pickled_global(module, name) + state + b"b."

    defaults = torch._utils._rebuild_tensor_v2.__defaults__
    poisoned = setattr_record("torch._utils", "_rebuild_tensor_v2", "__defaults__", b"\x88\x85")
    with pytest.raises(RefusedClassError, match="_rebuild_tensor"):
        loads_records(poisoned)
    assert torch._utils._rebuild_tensor_v2.__defaults__ == defaults
    marked = setattr_record("torch_geometric.data.data", "DataTensorAttr", "marker", b"\x88")
    with pytest.raises(RefusedClassError, match="DataTensorAttr"):
        loads_records(marked)
    assert not hasattr(DataTensorAttr, "marker")


def test_a_cutoff_that_is_not_a_distance_names_the_key(tmp_path):
    for bad in (0, -1.0, True, "far"):
        with pytest.raises(ConfigError, match=f"dataset.pbc_cutoff={bad!r} is not allowed"):
            _source(tmp_path / "is2re", tmp_path / "data", pbc_cutoff=bad)
    with pytest.raises(ConfigError, match="dataset.pbc_around='slab' is not allowed"):
        _source(tmp_path / "is2re", tmp_path / "data", pbc_around="slab")


def test_images_near_every_atom_are_more_and_cached_apart(tmp_path, slabs):
    path = _layout(tmp_path / "is2re", slabs[:6], sizes=(2, 1, 1, 1, 1))
    near = _source(path, tmp_path / "data", pbc_cutoff=4.0)
    everywhere = _source(path, tmp_path / "data", pbc_cutoff=4.0, pbc_around="all")
    counts = [s.graphs().data.x.size(0) for s in (near, everywhere)]
    assert counts[1] > counts[0]
    assert near._cache().folder != everywhere._cache().folder
    # the default's cache keeps the name it had before the setting existed
    files = [near._file(s) for s in near.folders()]
    before = input_digest(files, ["oc20", "y_relaxed", True, [True, True, False], 4.0])
    assert os.path.basename(near._cache().folder) == before


def test_a_record_cannot_plant_a_backward_hook_on_a_tensor():
    """torch never pickles hooks; a record's would be called with the gradient at a later
    backward pass (here OrderedDict, which fails on a tensor: any allow-listed callable)."""
    import collections
    import pickle

    from graphormer.safe_io import RefusedClassError, loads_records

    class Hooked:
        def __reduce__(self):
            rebuild, args = torch.zeros(2).__reduce_ex__(2)
            hooks = collections.OrderedDict({0: collections.OrderedDict})
            return rebuild, (*args[:4], True, hooks, *args[6:])

    with pytest.raises(RefusedClassError, match="backward hooks"):
        loads_records(pickle.dumps(Hooked()))
    plain = loads_records(pickle.dumps(torch.arange(3.0).requires_grad_()))
    torch.testing.assert_close(plain, torch.arange(3.0))
    assert plain._backward_hooks is None or not plain._backward_hooks
