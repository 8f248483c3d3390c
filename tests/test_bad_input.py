"""Bad input is an error before training, never a number after it, and a user-fixable error is
one ``error:`` line naming the input and the fix (issue 10)."""

import shutil

import numpy as np
import pandas as pd
import pytest

from graphormer.data import GraphDataModule, OGBGraphDataset, SmilesCsvSource, StructuralFeatures
from graphormer.errors import DataError

from helpers import TINY, call, nci_table, start_script


def write_csv(path, smiles, **columns):
    pd.DataFrame({"smiles": smiles, **columns}).to_csv(path, index=False)
    return str(path)


def load(path, tmp_path, targets=("y",), **kwargs):
    source = SmilesCsvSource(path, targets=list(targets), root=str(tmp_path / "cache"), **kwargs)
    module = GraphDataModule(source, batch_size=8)
    module.prepare_data()
    module.setup("fit")
    return module


SMILES = nci_table().smiles[:40].tolist()


def test_infinite_targets_are_named_by_row(tmp_path):
    y = np.linspace(1, 2, 40)
    y[[3, 17]] = np.inf
    path = write_csv(tmp_path / "inf.csv", SMILES, y=y)
    with pytest.raises(DataError, match=r"infinite values at rows 3, 17"):
        load(path, tmp_path)


def test_a_target_column_without_values(tmp_path):
    path = write_csv(tmp_path / "empty.csv", SMILES, y=[np.nan] * 40, z=np.ones(40))
    with pytest.raises(DataError, match="target column 'y' .* has no values"):
        load(path, tmp_path, targets=("z", "y"))


def test_binary_labels_must_be_zero_or_one(tmp_path):
    labels = np.tile([0.0, 1.0], 20)
    labels[[5, 9]] = [2.0, -1.0]
    path = write_csv(tmp_path / "labels.csv", SMILES, y=labels)
    with pytest.raises(DataError, match=r"other than 0 and 1 \(\[-1.0, 2.0\]\) at rows \[5, 9\]"):
        load(path, tmp_path, task_type="binary")
    labels[[5, 9]] = np.nan  # missing labels are fine
    write_csv(tmp_path / "labels.csv", SMILES, y=labels)
    assert load(path, tmp_path, task_type="binary").split_sizes()["train"] > 0


def test_an_empty_split_names_the_split_sizes(tmp_path):
    acyclic = ["CCO", "CCN", "CCC", "CCCl", "CC(=O)O", "CCOC", "NCCO", "CC#N", "CCS", "OCCO"] * 2
    path = write_csv(tmp_path / "acyclic.csv", acyclic, y=np.arange(20.0))
    # Every acyclic molecule has the empty scaffold: one group, which no split can divide.
    with pytest.raises(DataError, match=r"train and valid split\(s\) hold no graphs .*test 20"):
        load(path, tmp_path)
    assert load(path, tmp_path, split="random").split_sizes() == {
        "train": 16,
        "valid": 2,
        "test": 2,
    }


def test_too_few_molecules(tmp_path):
    path = write_csv(tmp_path / "one.csv", ["CCO"], y=[1.0])
    with pytest.raises(DataError, match=r"holds 1 molecule\(s\) .* give more molecules"):
        load(path, tmp_path)


@pytest.mark.parametrize(
    "content, message",
    [
        ("smiles,y\nCCO,1\n".encode("utf-16"), "not UTF-8 text"),
        (bytes(range(256)) * 4, "not UTF-8 text"),
        (b"smiles,y\nCCO,1\x00\n", "NUL bytes"),
        (b'smiles,y\nCCO,1\nCCN,"2\n', "cannot be read as a CSV"),
        (b"", "cannot be read as a CSV"),
    ],
)
def test_files_that_are_not_utf8_csv(tmp_path, content, message):
    path = tmp_path / "bad.csv"
    path.write_bytes(content)
    with pytest.raises(DataError, match=message) as error:
        load(str(path), tmp_path)
    assert str(path) in str(error.value)


def test_corrupt_caches_name_the_file_and_the_fix(tmp_path, ogb_root):
    path = write_csv(tmp_path / "ok.csv", SMILES, y=np.linspace(0, 1, 40))
    load(path, tmp_path)
    (cache,) = (tmp_path / "cache").rglob("graphs.pt")
    cache.write_bytes(cache.read_bytes()[:300])
    with pytest.raises(DataError, match=f"cache {cache} cannot be read.*Delete the folder"):
        load(path, tmp_path)

    root = tmp_path / "ogb"
    shutil.copytree(ogb_root / "ogbg_molesol", root / "ogbg_molesol")
    OGBGraphDataset("ogbg-molesol", str(root), pre_transform=StructuralFeatures(5))
    cache = (
        root / "ogbg_molesol" / "processed" / "structural_v2_hops5" / "geometric_data_processed.pt"
    )
    cache.write_bytes(b"not a cache")
    with pytest.raises(DataError, match="cannot be read .* run again to rebuild it"):
        OGBGraphDataset("ogbg-molesol", str(root), pre_transform=StructuralFeatures(5))


# -- through the scripts: one line, no traceback ---------------------------------------------


def run_all(commands, cwd):
    """Runs several scripts at once (each start costs seconds of imports); their results."""
    processes = [start_script(script, args, cwd) for script, args in commands]
    return [(p.wait(timeout=600), *p.communicate()) for p in processes]


def test_user_errors_are_one_line_without_a_traceback(tmp_path, ogb_root):
    molhiv = ["dataset=ogbg-molhiv", f"dataset.root={ogb_root}", *TINY]
    csv = write_csv(tmp_path / "m.csv", SMILES, y=np.linspace(0, 1, 40))
    cases = [
        (
            "train.py",
            ["datamodule.batch_size=-4"],
            "datamodule.batch_size=-4 is not allowed: an integer >= 1",
        ),
        ("train.py", ["model.num_heads=7"], "must be divisible by model.num_heads"),
        ("train.py", ["loss=hinge"], "loss='hinge' is not allowed: one of auto, bce, ce, l1, mse"),
        (
            "train.py",
            ["datamodule.max_nodes=2", "model.multi_hop_max_dist=1"],
            "training graphs have more than datamodule.max_nodes=2 nodes",
        ),
        ("train.py", ["datamodule.max_nodes=2"], "datamodule.max_hops=5 is not allowed: at most 1"),
        ("train.py", ["dataset.source=somewhere"], "dataset.source='somewhere' is not a dataset"),
        (
            "train.py",
            [
                "dataset=smiles_csv",
                f"dataset.path={csv}",
                "dataset.targets=[y]",
                "dataset.split_ratios=[0.5,0.6,0.1]",
            ],
            "dataset.split_ratios must be three non-negative fractions summing to 1",
        ),
        ("eval.py", [], "ckpt is required: pass ckpt="),
        ("eval.py", [f"ckpt={tmp_path / 'none.ckpt'}"], "does not exist"),
    ]
    commands = []
    for i, (script, args, _) in enumerate(cases):
        base = molhiv if script == "train.py" else []
        commands.append((script, [*base, *args, f"hydra.run.dir={tmp_path / str(i)}"]))
    # The first and the last (one error of each command) in processes of their own, as the shell
    # sees them, started first so that they run meanwhile; the others through the same main()
    # in-process (each process start costs seconds of imports).
    processes = [start_script(*commands[i], tmp_path) for i in (0, -1)]
    inside = [call(script, args, tmp_path) for script, args in commands[1:-1]]
    outside = []
    for process in processes:
        out, err = process.communicate(timeout=600)
        outside.append((process.returncode, out, err))
    results = [outside[0], *((c.returncode, c.stdout, c.stderr) for c in inside), outside[1]]
    for (_, args, expected), (code, out, err) in zip(cases, results, strict=True):
        assert code == 1, (args, out[-2000:], err[-3000:])
        assert "Traceback" not in err, (args, err[-3000:])
        lines = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(lines) == 1 and expected in lines[0], (args, err[-3000:])
    # A training run that failed before anything was trained leaves no run folder behind
    # (issue 20): its reason is the error line on the console.
    assert not any(
        (tmp_path / str(i)).exists() for i, case in enumerate(cases) if case[0] == "train.py"
    )


def test_help_lists_the_applications_own_keys(tmp_path):
    expected = {
        "train.py": ("ckpt_path=FILE", "pretrained=FILE", "dataset.root=DIR", "dataset:", "model:"),
        "eval.py": ("graphormer-eval", "ckpt=FILE", "split=NAME", "Example:"),
        "predict.py": ("graphormer-predict", "input=FILE.csv", "embeddings=FILE", "Example:"),
        "explain.py": ("graphormer-explain", "output=DIR", "size=N", "Example:"),
        "convert.py": ("graphormer-convert", "source=PATH", "trust_source=BOOL", "Example:"),
        "prepare.py": ("graphormer-prepare", "dataset=NAME", "datamodule.max_hops=N"),
    }
    # In-process (the same main()); test_install asks each installed command for --help in a
    # process of its own.
    for script, keys in expected.items():
        result = call(script, ["--help"], tmp_path)
        code, out, err = result.returncode, result.stdout, result.stderr
        assert code == 0, (script, err[-2000:])
        for key in keys:
            assert key in out, (script, key)
        if script != "train.py":  # the others list their own keys, not train's groups
            assert "powered by Hydra" not in out and "model:" not in out, script


def test_ddp_with_fewer_validation_graphs_than_ranks_does_not_hang(tmp_path):
    """Two CPU ranks, one validation graph and one test graph: the rank with an empty shard
    still joins every collective, and the metrics see each graph once."""
    csv = write_csv(tmp_path / "few.csv", SMILES[:20], y=np.linspace(0, 1, 20))
    out = tmp_path / "ddp"
    ((code, stdout, stderr),) = run_all(
        [
            (
                "train.py",
                [
                    "dataset=smiles_csv",
                    f"dataset.path={csv}",
                    "dataset.targets=[y]",
                    "dataset.split=random",
                    "dataset.split_ratios=[0.9,0.05,0.05]",
                    f"dataset.root={tmp_path / 'cache'}",
                    "trainer=ddp",
                    "trainer.accelerator=cpu",
                    "trainer.devices=2",
                    "trainer.max_epochs=2",
                    f"hydra.run.dir={out}",
                    *TINY,
                ],
            )
        ],
        tmp_path,
    )
    assert code == 0, stderr[-4000:]
    assert "data: smiles_csv: train 18, valid 1, test 1" in stdout
    assert "precision: 32-true; devices: 2" in stdout  # no silent bf16 on the CPU
    assert (out / "metrics.json").is_file()


class _Payload:
    """Unpickling this runs code (writes a file): what a tampered cache file could hold."""

    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


def test_a_tampered_cache_marker_is_never_unpickled(tmp_path, ogb_root):
    import torch

    from graphormer.data import DatasetCacheError

    root = tmp_path / "ogb"
    shutil.copytree(ogb_root / "ogbg_molesol", root / "ogbg_molesol")
    OGBGraphDataset("ogbg-molesol", str(root), pre_transform=StructuralFeatures(5))
    processed = root / "ogbg_molesol" / "processed" / "structural_v2_hops5"
    victim = tmp_path / "victim.txt"
    # PyG itself would read this file with weights_only=False, running the payload.
    torch.save(_Payload(str(victim)), processed / "pre_transform.pt")
    with pytest.raises(DatasetCacheError, match="holds more than data"):
        OGBGraphDataset("ogbg-molesol", str(root), pre_transform=StructuralFeatures(5))
    assert not victim.exists()
