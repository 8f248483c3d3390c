"""Every bad input is one ``error:`` line naming the key or file and the fix (issue 42): group
options, Hydra plugins, files whose contents disagree, absurd sizes, missing packages; the hints
a command prints are commands the user can run; SMILES need no quoting beyond the shell's."""

import gzip
import importlib.util
import shutil
import sys

import numpy as np
import pytest
from omegaconf import OmegaConf

from graphormer.cli import CONFIGS
from graphormer.cli.arguments import quote_smiles
from graphormer.console import command
from graphormer.data import GraphDataModule, SmilesCsvSource, build_source
from graphormer.errors import ConfigError, DataError
from graphormer.testing import nci_tu
from graphormer.training.precision import precision_arguments

from helpers import (
    REPO,
    call,
    call_failing,
    compose_train,
    nci_table,
    options,
    run_failing,
    tpsa_run_args,
)


def error_line(result) -> str:
    """The one line a failed command wrote to stderr: ``error: ...``."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-3000:]
    return lines[0]


@pytest.fixture(scope="module")
def tpsa_run(nci_csv, tmp_path_factory):
    """A one-epoch TINY run on the NCI CSV (whose three bad SMILES warn): its output and best
    checkpoint."""
    work = tmp_path_factory.mktemp("lines")
    out = work / "run"
    result = call("train.py", [*tpsa_run_args(nci_csv, out), "trainer.max_epochs=1"], cwd=work)
    assert result.returncode == 0, result.stderr[-3000:]
    return result, next((out / "checkpoints").glob("best*.ckpt"))


# -- the command line, before Hydra composes it --------------------------------------------------


def test_a_misspelt_group_option_is_one_line_with_the_closest_names(tmp_path):
    # As a user runs it: a process of its own, which stops before loading any data.
    result = run_failing("train.py", ["dataset=ogbg-molhiw"], cwd=tmp_path)
    line = error_line(result)
    assert line.startswith("error: dataset=ogbg-molhiw is not an option of dataset: ")
    assert "did you mean dataset=ogbg-molhiv?" in line
    assert ", ".join(options("dataset")) in line  # every option, in one line
    assert "Could not find" not in result.stderr and "HYDRA_FULL_ERROR" not in result.stderr


@pytest.mark.parametrize(
    ("script", "args", "expected"),
    [
        ("train.py", ["model=graphormer_slm"], "did you mean model=graphormer_slim or "),
        ("train.py", ["logger=mlfow"], "did you mean logger=mlflow?"),
        ("prepare.py", ["dataset=ogbg-molhiw"], "did you mean dataset=ogbg-molhiv?"),
        # A sweep: each of its values is checked, not its first alone.
        ("train.py", ["-m", "model=graphormer_tiny,graphormer_slm"], "model=graphormer_slim"),
        ("train.py", ["experiment=dmo"], "did you mean experiment=demo?"),
    ],
)
def test_group_options_of_every_command(tmp_path, script, args, expected):
    line = error_line(call_failing(script, args, cwd=tmp_path))
    assert expected in line and "is not an option of" in line
    assert not any(tmp_path.iterdir())  # no run folder


def test_an_unknown_key_of_any_command_names_the_close_keys(tmp_path):
    line = error_line(call_failing("predict.py", ["ckpt=x.ckpt", "batchsize=8"], cwd=tmp_path))
    assert line.startswith("error: batchsize is not a key of this config: did you mean batch_size?")
    line = error_line(call_failing("train.py", ["datset=ogbg-molhiv"], cwd=tmp_path))
    assert "did you mean dataset?" in line


def _optuna_sweeper_installed() -> bool:
    try:
        return importlib.util.find_spec("hydra_plugins.hydra_optuna_sweeper") is not None
    except ModuleNotFoundError:
        return False


@pytest.mark.skipif(_optuna_sweeper_installed(), reason="the Optuna sweeper is installed")
@pytest.mark.parametrize("args", [["-m", "hparams_search=optuna"], ["hparams_search=optuna"]])
def test_a_search_without_its_plugin_names_the_extra(tmp_path, args):
    line = error_line(call_failing("train.py", args, cwd=tmp_path))
    assert line == (
        "error: hparams_search=optuna needs Hydra's Optuna sweeper (hydra/sweeper=optuna), "
        "which is not installed: pip install 'graphormer[optuna]'"
    )


# -- SMILES on the command line ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("[CC(=O)O,c1ccccc1]", ["CC(=O)O", "c1ccccc1"]),
        ("[C#N,[NH4+]]", ["C#N", "[NH4+]"]),
        ("[[Na+].[Cl-],F/C=C\\F]", ["[Na+].[Cl-]", "F/C=C\\F"]),
        ('["CC(=O)O","[Na+].[Cl-]"]', ["CC(=O)O", "[Na+].[Cl-]"]),  # the quoted form still works
        ('[CCO,"C(=O)O"]', ["CCO", "C(=O)O"]),
        ("CC(=O)O", "CC(=O)O"),  # one SMILES
        ("[Na+].[Cl-]", "[Na+].[Cl-]"),  # one SMILES: its first bracket does not close the value
        ("C[C@H](N)O", "C[C@H](N)O"),
        ("CCO", "CCO"),
        ("[]", []),
    ],
)
def test_smiles_values_read_as_written(given, expected):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    (argument,) = quote_smiles([f"smiles={given}"], ["smiles"])
    assert OverridesParser.create().parse_override(argument).value() == expected
    # Other keys are Hydra's, as they were.
    assert quote_smiles([f"output={given}"], ["smiles"]) == [f"output={given}"]


def test_predict_and_explain_take_smiles_with_brackets_and_bonds(tpsa_run, tmp_path):
    _, best = tpsa_run
    result = call("predict.py", [f"ckpt={best}", "smiles=[CC(=O)O,C#N,[NH4+]]"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split()[0] for line in result.stdout.strip().splitlines()[1:]]
    assert rows == ["CC(=O)O", "C#N", "[NH4+]"]
    assert "predicted 3 of 3 molecules" in result.stderr
    out = tmp_path / "pictures"
    result = call("explain.py", [f"ckpt={best}", "smiles=CC(=O)O", f"output={out}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "mol_0" / "rollout.png").is_file()


# -- files ---------------------------------------------------------------------------------------


def test_a_gzipped_csv_trains_as_the_plain_one(tmp_path):
    table = nci_table().iloc[:60]
    plain = tmp_path / "mols.csv"
    table.to_csv(plain, index=False)
    packed = tmp_path / "mols.csv.gz"
    with gzip.open(packed, "wt") as f:
        table.to_csv(f, index=False)
    sizes = []
    for path in (plain, packed):
        source = SmilesCsvSource(str(path), targets=["tpsa"], root=str(tmp_path / "cache"))
        module = GraphDataModule(source, batch_size=8)
        module.prepare_data()
        module.setup("fit")
        sizes.append(module.loaded.split)
    assert all(np.array_equal(sizes[0][k], sizes[1][k]) for k in ("train", "valid", "test"))
    # A repeated column name is found in the gzipped header too (the check that crashed).
    with gzip.open(packed, "wt") as f:
        table[["smiles", "tpsa", "tpsa"]].to_csv(f, index=False)
    source = SmilesCsvSource(str(packed), targets=["tpsa"], root=str(tmp_path / "cache2"))
    with pytest.raises(DataError, match="more than one column named 'tpsa'"):
        GraphDataModule(source).prepare_data()


def test_every_dataset_option_names_its_dataset():
    for option in options("dataset"):  # outputs/${dataset.name}/... is the run folder
        assert "name" in OmegaConf.load(CONFIGS / "dataset" / f"{option}.yaml").keys(), option
    values = dict(compose_train(["dataset=ogbg-ppa"]).dataset)
    assert build_source(values).task_info().num_classes == 37
    with pytest.raises(ConfigError, match="dataset=ogbg-ppa reads OGB's ogbg-ppa only"):
        build_source({**values, "name": "ogbg-ppi"})


def test_a_corrupt_hugging_face_folder_is_named(tmp_path):
    from graphormer.interop import ConversionError
    from graphormer.interop.read import read_source

    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("[1]")
    with pytest.raises(ConversionError, match=r"config.json holds a JSON list"):
        read_source(folder)
    (folder / "config.json").write_text('{"model_type": "graphormer"}')
    (folder / "model.safetensors").write_bytes(b"\x40" + bytes(99))
    pytest.importorskip("safetensors")  # without it: the error names the package to install
    with pytest.raises(ConversionError, match=r"model.safetensors cannot be read as safetensors"):
        read_source(folder)


def _tu_copy(root, name, tmp_path, edit):
    """The TU dataset ``name`` copied under ``tmp_path`` as BAD, one of its files edited."""
    target = tmp_path / "BAD" / "raw"
    target.mkdir(parents=True)
    for file in (root / name / "raw").iterdir():
        shutil.copy(file, target / file.name.replace(f"{name}_", "BAD_"))
    edit(target)
    return build_source({"source": "tu", "name": "BAD", "root": str(tmp_path)})


@pytest.fixture(scope="module")
def tu_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("tu")
    nci_tu(root, "NCI_TU", limit=40)
    return root


def test_tu_files_that_disagree_name_the_file(tu_root, tmp_path):
    def drop_labels(raw):
        lines = (raw / "BAD_graph_labels.txt").read_text().splitlines()
        (raw / "BAD_graph_labels.txt").write_text("\n".join(lines[:-3]) + "\n")

    source = _tu_copy(tu_root, "NCI_TU", tmp_path / "a", drop_labels)
    with pytest.raises(DataError) as error:
        source.task_info()
    assert "BAD_graph_labels.txt has 37 lines, but BAD_graph_indicator.txt gives 40 graphs" in str(
        error.value
    )

    def far_edge(raw):
        lines = (raw / "BAD_A.txt").read_text().splitlines()
        lines[3] = "1, 99999"
        (raw / "BAD_A.txt").write_text("\n".join(lines) + "\n")

    source = _tu_copy(tu_root, "NCI_TU", tmp_path / "b", far_edge)
    with pytest.raises(DataError, match="BAD_A.txt joins nodes of different graphs, or names"):
        source.task_info()


# -- sizes and packages --------------------------------------------------------------------------


def test_absurd_padding_is_refused_before_any_batch(nci_csv, tmp_path):
    line = error_line(
        call_failing(
            "train.py",
            [*tpsa_run_args(nci_csv, tmp_path / "run"), "datamodule.pad_to_multiple=100000"],
            cwd=tmp_path,
        )
    )
    assert line.startswith("error: datamodule.pad_to_multiple=100000 pads every batch beyond")
    assert "at most 129" in line
    assert not (tmp_path / "run").exists()
    source = SmilesCsvSource(str(nci_csv), targets=["tpsa"], root=str(tmp_path / "cache"))
    # The largest useful multiple (one fixed shape) and the default stay allowed.
    assert GraphDataModule(source, pad_to_multiple=129).pad_to_multiple == 129
    assert GraphDataModule(source, max_nodes=4).pad_to_multiple in (1, 8)


@pytest.mark.parametrize("size", ["0", "-5", "100000"])
def test_absurd_picture_sizes_are_refused(tmp_path, size):
    out = tmp_path / "pictures"
    args = ["ckpt=any.ckpt", "smiles=CCO", f"output={out}", f"size={size}"]
    line = error_line(call_failing("explain.py", args, cwd=tmp_path))
    assert line == (
        f"error: size={size} is not a picture size: give the side in pixels, an integer from "
        "100 to 4000 (default 600)"
    )
    assert not out.exists()


@pytest.mark.skipif(
    importlib.util.find_spec("transformer_engine") is not None,
    reason="transformer_engine is installed",
)
def test_a_precision_whose_package_is_missing_names_it():
    with pytest.raises(ConfigError) as error:
        precision_arguments("transformer-engine")
    assert str(error.value).startswith(
        "trainer.precision=transformer-engine needs NVIDIA's Transformer Engine (the "
        "transformer_engine package), which is not installed: pip install"
    )
    assert precision_arguments("bf16-mixed") == {"precision": "bf16-mixed"}


# -- what a run prints ---------------------------------------------------------------------------


def test_hints_are_the_command_the_user_ran(monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(sys, "argv", ["scripts/train.py"])
    assert command("eval") == "python scripts/eval.py"
    monkeypatch.setattr(sys, "argv", [str(REPO / "scripts" / "convert.py")])
    assert command("train") == f"python {REPO / 'scripts' / 'train.py'}"
    monkeypatch.setattr(sys, "argv", ["/usr/local/bin/graphormer-train"])
    assert command("eval") == "graphormer-eval"


def test_a_runs_last_line_is_its_result(tpsa_run):
    result, best = tpsa_run
    lines = result.stdout.strip().splitlines()
    # The CSV's three bad SMILES are said once, before the results; the calibration that reads
    # the data again after them repeats neither that nor the data line.
    assert lines[-1] == f"evaluate with: python {REPO / 'scripts' / 'eval.py'} ckpt={best}"
    assert lines[-2].startswith("valid rmse: ")
    assert (result.stdout + result.stderr).count("skipped 3 row(s)") == 1
    assert result.stdout.count("data: smiles_csv") == 1


def test_a_value_hydra_cannot_read_says_how_to_quote_it(tmp_path):
    line = error_line(call_failing("train.py", ["dataset.path=mols(1).csv"], cwd=tmp_path))
    assert line.startswith("error: dataset.path=mols(1).csv cannot be read as KEY=VALUE (")
    assert line.endswith("""e.g. 'dataset.path="mols(1).csv"'""")


def test_a_required_value_is_named_before_hydra_needs_it(tmp_path):
    # dataset=tu's name is part of the run folder Hydra makes before the command starts.
    line = error_line(call_failing("train.py", ["dataset=tu"], cwd=tmp_path))
    assert line == (
        "error: dataset.name is required: pass dataset.name=... on the command line (see --help)"
    )
    assert not any(tmp_path.iterdir())
