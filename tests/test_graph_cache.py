"""The disk cache of tu, pyg_file and lrgb graphs and their structural features (issue #17): a
second run reads it instead of preparing the graphs again; a changed input file is read anew."""

import pytest
import torch

import graphormer.data.sources.graph_cache as graph_cache
from graphormer.data import DatasetCacheError, StructuralFeatures, build_source
from graphormer.testing import protein_like_graphs, shape_graphs, write_lrgb_layout, write_tu_layout


def refuse(what):
    def refused(*args, **kwargs):
        raise AssertionError(f"{what} ran although the cache holds its result")

    return refused


def loaded(settings, hops=3):
    loaded = build_source(settings).load(StructuralFeatures(hops))
    return loaded.dataset, loaded.split


def assert_same(first, second):
    (a, split_a), (b, split_b) = first, second
    assert len(a) == len(b) and split_a.keys() == split_b.keys()
    assert all(torch.equal(split_a[k], split_b[k]) for k in split_a)
    for i in (0, len(a) // 2, len(a) - 1):
        g, h = a[i], b[i]
        assert g.keys() == h.keys()
        for key in g.keys():
            assert torch.equal(g[key], h[key]), (i, key)


def no_preparing(patch):
    """Reading raw inputs and computing structural features fail: only the cache can answer."""
    patch.setattr(graph_cache, "add_structural_features", refuse("structure"))
    patch.setattr("graphormer.data.sources.tu.read_tu_graphs", refuse("the TU reader"))
    patch.setattr("graphormer.data.sources.pyg_file.read_graph_file", refuse("the file reader"))
    patch.setattr("graphormer.data.sources.lrgb._read_split", refuse("the LRGB reader"))


def test_a_second_tu_run_reads_the_cache_and_a_changed_file_is_read_again(tmp_path, monkeypatch):
    graphs, labels = protein_like_graphs(40, seed=1, max_nodes=40)
    write_tu_layout(tmp_path, "PROT", graphs, labels)
    settings = {"source": "tu", "name": "PROT", "root": str(tmp_path)}
    first = loaded(settings)
    with monkeypatch.context() as patch:
        no_preparing(patch)
        patch.setattr("graphormer.data.sources.pyg_file.read_graphs", refuse("read_graphs"))
        assert_same(first, loaded(settings))
        with pytest.raises(AssertionError, match="structure ran"):
            loaded(settings, hops=2)  # another max_hops: other features, not cached yet
    # A label changed in the raw files: the graphs are read again and carry it.
    labels[0] = 1 - labels[0]
    write_tu_layout(tmp_path, "PROT", graphs, labels)
    dataset, _ = loaded(settings)
    assert int(dataset[0].y) == labels[0]
    assert len(list((tmp_path / "PROT" / "processed").iterdir())) == 2
    # Node attributes left out: another key too.
    again = build_source({**settings, "use_node_attr": False}).load(StructuralFeatures(3))
    assert "x_continuous" not in again.dataset[0]


def test_a_second_pyg_file_run_reads_the_cache_and_a_changed_file_is_read_again(
    tmp_path, monkeypatch
):
    path = tmp_path / "graphs.pt"
    torch.save(shape_graphs(30, seed=2), path)
    settings = {
        "source": "pyg_file",
        "path": str(path),
        "root": str(tmp_path / "cache"),
        "task_type": "multiclass",
        "categorical_node_columns": [0],
    }
    first = loaded(settings)
    with monkeypatch.context() as patch:
        no_preparing(patch)
        assert_same(first, loaded(settings))
    torch.save(shape_graphs(31, seed=2), path)  # the file changed: one graph more
    assert len(loaded(settings)[0]) == 31
    # Other categorical columns read the same file otherwise: their own cache.
    other = build_source({**settings, "categorical_node_columns": []})
    assert other.continuous_dims() == (3, 1)


def test_a_second_lrgb_run_reads_the_cache(tmp_path, monkeypatch):
    write_lrgb_layout(tmp_path, "peptides-func", sizes=(12, 4, 4))
    settings = {"source": "lrgb", "name": "Peptides-func", "root": str(tmp_path)}
    first = loaded(settings)
    with monkeypatch.context() as patch:
        no_preparing(patch)
        assert_same(first, loaded(settings))


def test_a_damaged_cache_is_an_error_naming_the_folder_to_delete(tmp_path):
    graphs, labels = protein_like_graphs(12, seed=1, max_nodes=20)
    write_tu_layout(tmp_path, "PROT", graphs, labels)
    settings = {"source": "tu", "name": "PROT", "root": str(tmp_path)}
    loaded(settings)
    (folder,) = (tmp_path / "PROT" / "processed").iterdir()
    (folder / "structural_v2_hops3.pt").write_bytes(b"not a torch file")
    with pytest.raises(DatasetCacheError) as error:
        loaded(settings)
    message = str(error.value)
    assert f"Delete the folder {folder} and run again" in message
    assert "structural_v2_hops3.pt cannot be read" in message
