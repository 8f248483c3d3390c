import shutil
import urllib.error
from pathlib import Path
from unittest import mock

import numpy as np
import pandas as pd
import pytest
import torch

from graphormer.data import (
    DatasetNotFoundError,
    GraphDataModule,
    OGBGraphDataset,
    OGBSource,
    SmilesCsvSource,
    StructuralFeatures,
    ogb_task_info,
    scaffold_split,
)
from graphormer.errors import DataError

from helpers import nci_table


def test_task_info_comes_from_ogb_metadata():
    hiv, pcba, esol = (ogb_task_info(n) for n in ("ogbg-molhiv", "ogbg-molpcba", "ogbg-molesol"))
    assert (hiv.task_type, hiv.num_tasks, hiv.metric) == ("binary classification", 1, "rocauc")
    assert (pcba.num_tasks, pcba.metric) == (128, "ap")
    assert (esol.task_type, esol.metric) == ("regression", "rmse")
    assert hiv.higher_is_better and not esol.higher_is_better
    with pytest.raises(ValueError, match="ogbg-molhiv"):
        ogb_task_info("ogbg-molhiv2")


def test_ogb_loader_reads_our_layout_with_cached_features(ogb_root):
    dataset = OGBGraphDataset("ogbg-molhiv", str(ogb_root), pre_transform=StructuralFeatures(5))
    assert len(dataset) == 400
    split = dataset.get_idx_split()
    assert [len(split[k]) for k in ("train", "valid", "test")] == [320, 40, 40]
    tpsa = nci_table().tpsa.to_numpy()[:400]
    labels = (tpsa > np.median(tpsa)).astype(int)
    assert [int(dataset[i].y) for i in range(400)] == labels.tolist()
    graph = dataset[7]
    n = graph.num_nodes
    assert graph.spatial_pos.shape == (n * n,) and graph.edge_path.shape == (n * n, 5)
    # OGB's loader added the inverse edges; our features see the full directed edge list.
    assert torch.equal(graph.in_degree.long(), torch.bincount(graph.edge_index[1], minlength=n))


def test_cache_is_keyed_by_preprocessing_settings(ogb_root):
    a = OGBGraphDataset("ogbg-molesol", str(ogb_root), pre_transform=StructuralFeatures(2))
    b = OGBGraphDataset("ogbg-molesol", str(ogb_root), pre_transform=StructuralFeatures(4))
    assert a[0].edge_path.size(-1) == 2 and b[0].edge_path.size(-1) == 4
    folder = ogb_root / "ogbg_molesol" / "processed"
    assert {"structural_v2_hops2", "structural_v2_hops4"} <= {p.name for p in folder.iterdir()}
    plain = OGBGraphDataset("ogbg-molesol", str(ogb_root), pre_transform=None)
    assert "spatial_pos" not in plain[0]


def test_missing_dataset_without_network_is_a_clear_error(tmp_path, monkeypatch):
    def offline(url, folder, log=True):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr("ogb.utils.url.download_url", offline)
    monkeypatch.setattr("builtins.input", lambda *a: pytest.fail("prompted for input"))
    with pytest.raises(DatasetNotFoundError) as error:
        OGBGraphDataset("ogbg-molbace", str(tmp_path))
    message = str(error.value)
    assert "ogbg-molbace" in message and "http" in message and "bace.zip" in message
    assert str(tmp_path) in message and "dataset.root" in message
    # The failed attempt leaves nothing behind that would make OGB prompt next time.
    assert not (tmp_path / "ogbg_molbace").exists()
    with pytest.raises(DatasetNotFoundError):
        OGBGraphDataset("ogbg-molbace", str(tmp_path))


def test_outdated_folder_errors_instead_of_prompting(ogb_root, tmp_path, monkeypatch):
    monkeypatch.setattr("builtins.input", lambda *a: pytest.fail("prompted for input"))
    shutil.copytree(ogb_root / "ogbg_molesol", tmp_path / "ogbg_molesol")
    (tmp_path / "ogbg_molesol" / "RELEASE_v1.txt").unlink()
    with pytest.raises(DatasetNotFoundError, match="RELEASE_v1.txt"):
        OGBGraphDataset("ogbg-molesol", str(tmp_path))


def test_smiles_csv_skips_invalid_rows_and_keeps_labels_aligned(nci_csv, tmp_path):
    source = SmilesCsvSource(str(nci_csv), targets=["tpsa"], root=str(tmp_path))
    with pytest.warns(UserWarning, match=r"skipped 3 row\(s\).*rows 10, 41, 42"):
        loaded = source.load(StructuralFeatures(5))
    table = pd.read_csv(nci_csv)
    dataset = loaded.dataset
    assert len(dataset) == len(table) - 3
    for i in range(0, len(dataset), 7):
        row = int(dataset[i].row)
        expected = table.tpsa.iloc[row]
        got = float(dataset[i].y)
        assert (np.isnan(expected) and np.isnan(got)) or got == pytest.approx(expected)
    assert sum(torch.isnan(dataset[i].y).any().item() for i in range(len(dataset))) == 2
    # The scaffold split covers every graph exactly once.
    parts = torch.cat([loaded.split[k] for k in ("train", "valid", "test")])
    assert torch.equal(parts.sort().values, torch.arange(len(dataset)))
    assert len(loaded.split["train"]) >= 0.75 * len(dataset)


def test_smiles_csv_bad_input_errors(tmp_path):
    csv = tmp_path / "bad.csv"
    pd.DataFrame({"smiles": ["CCO", "CC"], "y": ["1.0", "high"]}).to_csv(csv, index=False)
    with pytest.raises(ValueError, match="non-numeric value 'high' at row 1"):
        SmilesCsvSource(str(csv), targets=["y"], root=str(tmp_path)).load(None)
    with pytest.raises(ValueError, match=r"no column\(s\) \['logS'\]"):
        SmilesCsvSource(str(csv), targets=["logS"], root=str(tmp_path)).load(None)
    with pytest.raises(DataError, match="dataset.path"):
        SmilesCsvSource(str(tmp_path / "none.csv"), targets=["y"], root=str(tmp_path)).load(None)
    with pytest.raises(ValueError, match="task_type"):
        SmilesCsvSource(str(csv), targets=["y"], task_type="ordinal")


def test_a_gzipped_smiles_csv_reads_as_the_plain_one(nci_csv, tmp_path):
    import gzip

    from graphormer.data.sources.smiles_csv import read_csv_table

    packed = tmp_path / "nci.csv.gz"
    packed.write_bytes(gzip.compress(Path(nci_csv).read_bytes()))
    pd.testing.assert_frame_equal(
        read_csv_table(str(packed), None, None), read_csv_table(str(nci_csv), None, None)
    )
    torn = tmp_path / "torn.csv.gz"
    torn.write_bytes(packed.read_bytes()[:200])
    with pytest.raises(DataError, match=r"dataset.path=.*torn.csv.gz is a damaged gzip file"):
        read_csv_table(str(torn), None, None)


def test_scaffold_split_keeps_scaffolds_together():
    smiles = ["c1ccccc1C", "c1ccccc1CC", "c1ccccc1O", "C1CCCCC1N", "C1CCCCC1O", "CCO", "CCN", "C"]
    split = scaffold_split(smiles, (0.5, 0.25, 0.25))
    side = {int(i): k for k, idx in split.items() for i in idx}
    assert side[0] == side[1] == side[2]  # benzene scaffold
    assert side[3] == side[4]  # cyclohexane scaffold


def test_datamodule_skips_large_training_graphs_only(ogb_root, caplog):
    module = GraphDataModule(OGBSource("ogbg-molhiv", str(ogb_root)), batch_size=32, max_nodes=20)
    module.prepare_data()
    with caplog.at_level("WARNING"):
        module.setup("fit")
    assert "training skips" in caplog.text
    assert (module.sizes[module.train_index] <= 20).all()
    seen = torch.cat([b.index for b in module.val_dataloader()])
    assert torch.equal(seen.sort().values, module.loaded.split["valid"].sort().values)
    batch = next(iter(module.train_dataloader()))
    assert batch.x.size(1) <= 23 and (batch.x.size(1) + 1) % 8 == 0


def test_size_grouped_batches_cover_every_graph_and_pad_little():
    from graphormer.data import SizeGroupedBatchSampler

    sizes = torch.tensor([len(s) for s in nci_table().smiles[:1000]])  # a skewed size spread
    sampler = SizeGroupedBatchSampler(sizes, batch_size=32, seed=3)
    first, second = list(sampler), list(sampler)
    for epoch in (first, second):
        flat = sorted(i for batch in epoch for i in batch)
        assert flat == list(range(1000)) and len(epoch) == len(sampler) == 32
    assert first != second  # a new order every epoch

    def padding(batches):
        return sum(int(sizes[b].max()) * len(b) - int(sizes[b].sum()) for b in batches)

    random = torch.randperm(1000, generator=torch.Generator().manual_seed(0)).split(32)
    assert padding(first) < padding([b.tolist() for b in random]) / 3

    ranks = [
        list(SizeGroupedBatchSampler(sizes, 32, num_replicas=3, rank=r, seed=3)) for r in range(3)
    ]
    assert len({len(r) for r in ranks}) == 1  # equal batch counts: no rank waits at a collective
    covered = {i for r in ranks for batch in r for i in batch}
    assert covered == set(range(1000))


def test_on_the_fly_mode_gives_the_same_batches(ogb_root):
    cached = GraphDataModule(OGBSource("ogbg-molesol", str(ogb_root)), batch_size=16)
    fly = GraphDataModule(OGBSource("ogbg-molesol", str(ogb_root)), batch_size=16, on_the_fly=True)
    for module in (cached, fly):
        module.prepare_data()
        module.setup("fit")
    assert "spatial_pos" not in fly.loaded.dataset[0]
    for a, b in zip(cached.val_dataloader(), fly.val_dataloader(), strict=True):
        for name in ("index", "x", "spatial_pos", "edge_path", "in_degree", "edge_attr", "y"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name


def test_dataset_settings_that_cannot_build_a_source_are_config_errors():
    from graphormer.data import build_source
    from graphormer.errors import ConfigError

    with pytest.raises(ConfigError, match="source=ogb are not usable: .*'name'"):
        build_source({"source": "ogb"})
    for processes in ("4", 2.5, 0):
        with pytest.raises(ConfigError, match="dataset.processes must be an integer >= 1"):
            build_source({"source": "pcqm4mv2", "processes": processes})
    with pytest.raises(ConfigError, match="source=zinc are not usable: .*'unknown'|does not take"):
        build_source({"source": "zinc", "unknown": 1})
    with pytest.raises(ConfigError, match="is not a dataset source"):
        build_source({"source": "builtins.open"})


def test_every_source_answers_the_contract(ogb_root, tmp_path):
    """Training, evaluation and prediction ask sources, never name a dataset: every source in
    the table keeps the contract, and each dataset's quirks are its own answers."""
    import subprocess
    import sys

    from graphormer.data import SOURCES, Source, build_source
    from graphormer.testing import nci_tu, shape_graphs

    torch.save(shape_graphs(6), tmp_path / "graphs.pt")
    nci_tu(tmp_path, "NCI_TU", limit=20)
    settings = {
        "ogb": {"name": "ogbg-moltox21", "root": str(ogb_root)},
        "smiles_csv": {"path": "x.csv", "targets": ["a", "b"]},
        "pcqm4mv2": {"root": str(tmp_path)},
        "zinc": {"root": str(tmp_path)},
        "pyg_file": {"path": str(tmp_path / "graphs.pt")},
        "tu": {"name": "NCI_TU", "root": str(tmp_path)},
        "ogbg_ppa": {"root": str(tmp_path)},
        "lrgb": {"name": "Peptides-func", "root": str(tmp_path)},
        "ase": {"path": "x.extxyz"},
        "oc20": {"path": "is2re"},
    }
    assert set(settings) == set(SOURCES)
    sources = {kind: build_source({"source": kind, **s}) for kind, s in settings.items()}
    for kind, source in sources.items():
        assert isinstance(source, Source), kind
        assert source.name and source.root, kind
        assert source.task_info().num_tasks >= 1, kind
    # Sources with vocabularies of their own (not OGB's molecule featurisation) refuse SMILES.
    own = ["zinc", "pyg_file", "tu", "ogbg_ppa", "ase", "oc20"]
    assert [k for k, s in sources.items() if s.feature_dims() is not None] == own
    assert [k for k, s in sources.items() if s.smiles_refusal() is not None] == own
    assert sources["smiles_csv"].task_names() == ["a", "b"]
    assert sources["ogb"].task_names() == []  # the test layout maps molecules, not labels
    # Only PCQM4Mv2's unlabelled splits have a file format of their own.
    writes = [(k, s) for k, s in sources.items() for s in ("test-dev", "valid", "test")]
    assert [ks for ks in writes if sources[ks[0]].writes_predictions(ks[1])] == [
        ("pcqm4mv2", "test-dev")
    ]
    path = sources["pcqm4mv2"].write_predictions("test-dev", torch.arange(3.0), tmp_path / "out")
    assert path.name == "y_pred_pcqm4m-v2_test-dev.npz"
    assert np.load(path)["y_pred"].tolist() == [0.0, 1.0, 2.0]
    # The official size goes through OGB's writer; either way the file appears whole, with
    # nothing partial beside it, or not at all.
    out = tmp_path / "official"
    path = sources["pcqm4mv2"].write_predictions("test-dev", torch.ones(147_037), out)
    assert np.load(path)["y_pred"].shape == (147_037,)
    assert [p.name for p in out.iterdir()] == ["y_pred_pcqm4m-v2_test-dev.npz"]
    out = tmp_path / "interrupted"

    def torn(file, **arrays):  # numpy's writer, interrupted halfway through the file
        name = str(file) if str(file).endswith(".npz") else f"{file}.npz"
        Path(name).write_bytes(b"PK\x03\x04")
        raise KeyboardInterrupt

    with mock.patch("numpy.savez_compressed", side_effect=torn):
        with pytest.raises(KeyboardInterrupt):
            sources["pcqm4mv2"].write_predictions("test-dev", torch.ones(147_037), out)
    assert list(out.iterdir()) == []

    # The data package stands on its own: nothing above it, no Hydra.
    code = (
        "import sys, graphormer.data; print(sorted(k for k in sys.modules if k.startswith("
        "('graphormer.training', 'graphormer.inference', 'hydra', 'omegaconf'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
