"""A non-editable install works on its own: the wheel carries the configs, and the console
commands run from an empty folder (no repository, no scripts/, no configs/ beside them)."""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from helpers import REPO


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """graphormer built into a wheel and installed (without its dependencies, which this
    environment has) into a folder of its own; the folder."""
    work = tmp_path_factory.mktemp("install")
    # The build runs on a copy, so that it leaves nothing (build/, *.egg-info) in the repository.
    source = work / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(
        REPO / "graphormer", source / "graphormer", ignore=shutil.ignore_patterns("__pycache__")
    )
    wheels = work / "wheels"
    # No build isolation: the build uses this environment's setuptools (the test extra) and
    # touches no network.
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["-w", str(wheels), str(source)],
        check=True,
        capture_output=True,
        cwd=work,
    )
    (wheel,) = wheels.glob("graphormer-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "graphormer/configs/train.yaml" in names
    assert "graphormer/configs/dataset/nci_tpsa.yaml" in names
    assert "graphormer/serving/static/index.html" in names  # the server's page
    assert "graphormer/serving/static/app.js" in names
    site = work / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site)]
        + [str(wheel)],
        check=True,
        capture_output=True,
        cwd=work,
    )
    return site


def run_installed(site: Path, command: str, args, cwd: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        # The installed copy first, ahead of the repository's editable install.
        "PYTHONPATH": str(site),
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    }
    return subprocess.run(
        [str(site / "bin" / command), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )


def test_the_installed_package_is_the_one_that_runs(installed, tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import graphormer, graphormer.testing as t; print(graphormer.__file__); print(t.CONFIGS)",
        ],
        env={**os.environ, "PYTHONPATH": str(installed)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    module, configs = result.stdout.split()
    assert Path(module).is_relative_to(installed)
    assert Path(configs, "model", "graphormer_tiny.yaml").is_file()  # model_preset's configs


def test_graphormer_train_runs_the_demo_from_an_empty_folder(installed, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    run = empty / "run"
    result = run_installed(
        installed,
        "graphormer-train",
        [
            "experiment=demo",
            "trainer.max_epochs=1",
            "trainer.enable_progress_bar=false",
            f"dataset.root={tmp_path / 'data'}",
            f"hydra.run.dir={run}",
        ],
        cwd=empty,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["dataset"] == "nci_tpsa" and metrics["test"]["rmse"] > 0
    evaluated = run_installed(
        installed,
        "graphormer-eval",
        [f"ckpt={metrics['best_checkpoint']}", f"output={tmp_path / 'eval.json'}"]
        + [f"hydra.run.dir={tmp_path / 'eval'}"],
        cwd=empty,
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    scores = json.loads((tmp_path / "eval.json").read_text())
    assert scores["test"]["rmse"] == pytest.approx(metrics["test"]["rmse"], abs=1e-5)


@pytest.mark.parametrize(
    "command",
    [
        "graphormer-train",
        "graphormer-eval",
        "graphormer-predict",
        "graphormer-explain",
        "graphormer-convert",
        "graphormer-prepare",
        "graphormer-export",
        "graphormer-serve",
    ],
)
def test_every_command_answers_help(installed, tmp_path, command):
    result = run_installed(installed, command, ["--help"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert command.removeprefix("graphormer-") in result.stdout
