"""Issue 42: a user's file is never lost. Inputs stay inputs whatever ``overwrite=`` says
(those a checkpoint names included), only regular files or new paths are written, a run folder
is new or a run's own, and what cannot be written (a read-only folder, a file where a folder
belongs, a folder where a file belongs) is one ``error:`` line naming the key and the fix.
The commands run in-process (tests/helpers.call), as their console commands do."""

import hashlib
import os
import stat
import subprocess
from pathlib import Path

import pytest

from graphormer.errors import ConfigError, DataError
from graphormer.outputs import atomic_path, check_outputs, folder_problem
from graphormer.rundir import claim_run_dir, discard_if_untrained

from helpers import (
    call_failing,
    call_script,
    microsoft_config,
    nci_table,
    random_model,
    tpsa_run_args,
    write_fairseq,
)


def digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def digests(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (hidden ones too) and its SHA-256."""
    return {str(p.relative_to(folder)): digest(p) for p in folder.rglob("*") if p.is_file()}


def one_error_line(result: subprocess.CompletedProcess) -> str:
    """The command stopped with exit status 1 and one ``error:`` line, no traceback."""
    lines = result.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("error: "), result.stderr[-3000:]
    assert "Error executing job" not in result.stderr, result.stderr[-3000:]
    return lines[-1]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A finished one-epoch run (calibration.json, metrics.json, checkpoints) on a CSV of 120
    molecules; shared, so every test checks it is left byte for byte as it was."""
    work = tmp_path_factory.mktemp("run")
    csv = work / "molecules.csv"
    nci_table().iloc[:120].to_csv(csv, index=False)
    out = work / "run"
    call_script("train.py", tpsa_run_args(csv, out, "trainer.max_epochs=1"), cwd=work)
    assert (out / "calibration.json").is_file()
    return out


@pytest.fixture
def read_only(tmp_path) -> Path:
    """A folder nothing can be created in, also by root (an immutable folder); skipped where the
    file system offers neither."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", str(folder)], capture_output=True)
    try:
        (folder / "probe").touch()
        writable = True
    except OSError:
        writable = False
    try:
        if writable:
            (folder / "probe").unlink()
            pytest.skip("cannot make a read-only folder here (root without chattr)")
        yield folder
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(folder)], capture_output=True)
        folder.chmod(0o755)


@pytest.fixture
def device(tmp_path) -> Path:
    """A copy of /dev/full (writes to it fail with 'No space left on device')."""
    path = tmp_path / "full"
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
    except (PermissionError, OSError) as error:
        pytest.skip(f"mknod is not permitted here ({error})")
    return path


def converted_source(tmp_path) -> Path:
    config = microsoft_config()
    return write_fairseq(tmp_path / "checkpoint_best.pt", config, random_model(config))


# -- inputs are inputs, whatever overwrite= says --------------------------------------------


def test_no_output_replaces_what_a_checkpoint_reads(run, tmp_path):
    csv = run.parent / "molecules.csv"
    calibration = run / "calibration.json"
    best = next((run / "checkpoints").glob("best-*.ckpt"))
    before = {**digests(run), "csv": digest(csv)}
    cases = [
        ("eval.py", [f"ckpt={best}", f"output={csv}"], "checkpoint's dataset.path"),
        ("eval.py", [f"ckpt={run}", f"output={csv}"], "checkpoint's dataset.path"),
        ("eval.py", [f"ckpt={best}", f"output={calibration}"], "run's calibration.json"),
        ("eval.py", [f"ckpt={best}", f"output={run / 'metrics.json'}"], "run's metrics.json"),
        ("predict.py", [f"ckpt={best}", "smiles=[CCO]", f"output={csv}"], "dataset.path"),
        ("predict.py", [f"ckpt={best}", "smiles=[CCO]", f"output={calibration}"], "calibration"),
    ]
    for script, args, named in cases:
        result = call_failing(script, [*args, "overwrite=true"], cwd=tmp_path)
        line = one_error_line(result)
        assert named in line and "whatever overwrite= says" in line, line
    assert {**digests(run), "csv": digest(csv)} == before


# -- only regular files (or new paths) are written ------------------------------------------


def test_a_device_output_is_refused_and_left_a_device(run, device, tmp_path):
    best = next((run / "checkpoints").glob("best-*.ckpt"))
    source = converted_source(tmp_path)
    cases = [
        ("predict.py", [f"ckpt={best}", "smiles=[CCO]"]),
        ("eval.py", [f"ckpt={best}"]),
        ("convert.py", [f"source={source}"]),
    ]
    for script, args in cases:
        for overwrite in ("false", "true"):
            result = call_failing(
                script, [*args, f"output={device}", f"overwrite={overwrite}"], cwd=tmp_path
            )
            assert f"output={device} is a device, not a file" in one_error_line(result)
            assert stat.S_ISCHR(os.stat(device).st_mode)
            assert os.stat(device).st_rdev == os.makedev(1, 7)


def test_atomic_writes_never_replace_a_device_or_a_folder(device, tmp_path):
    for path in (device, tmp_path):
        with pytest.raises(DataError, match="not a file"), atomic_path(path) as partial:
            partial.write_text("never renamed onto it")
    assert stat.S_ISCHR(os.stat(device).st_mode)
    assert not list(tmp_path.glob(".*partial*"))


# -- run folders: new, or a run's own -------------------------------------------------------


def test_a_run_folder_of_the_users_files_is_refused_and_kept(tmp_path):
    csv = tmp_path / "molecules.csv"
    nci_table().iloc[:60].to_csv(csv, index=False)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "train.log").write_text("my notes\n")
    (mine / "ensemble.json").write_text('{"mine": true}\n')
    (mine / "calibration.json").write_text('{"mine": true}\n')
    before = digests(mine)
    runs = [
        (tpsa_run_args(csv, mine, "trainer.max_epochs=1"), tmp_path),
        # a run that would fail later (an unknown target) must not clean up the user's files
        (tpsa_run_args(csv, mine, "dataset.targets=[nope]"), tmp_path),
        # hydra.run.dir=. from inside the folder
        (tpsa_run_args(csv, Path("."), "trainer.max_epochs=1"), mine),
    ]
    for args, cwd in runs:
        line = one_error_line(call_failing("train.py", args, cwd=cwd))
        assert "already holds files that are not a run's" in line
        assert "calibration.json, ensemble.json, train.log" in line and "hydra.run.dir=" in line
    assert digests(mine) == before
    assert sorted(p.name for p in mine.iterdir()) == sorted(before)


def test_a_failed_new_run_removes_only_what_it_created(tmp_path):
    folder = tmp_path / "new"
    assert claim_run_dir(folder) is None
    (folder / ".hydra").mkdir()
    (folder / "train.log").write_text("error: ...")
    assert discard_if_untrained(folder)
    assert not folder.exists()
    # An empty folder the user made is claimed (it holds nothing to lose) and stays.
    (tmp_path / "empty").mkdir()
    assert claim_run_dir(tmp_path / "empty") is None
    (tmp_path / "empty" / "train.log").write_text("error: ...")
    assert discard_if_untrained(tmp_path / "empty")
    assert list((tmp_path / "empty").iterdir()) == []
    # A folder that already held anything is never claimed, so never cleaned up.
    (tmp_path / "user").mkdir()
    (tmp_path / "user" / "notes.txt").write_text("mine")
    assert "not a run's (notes.txt)" in claim_run_dir(tmp_path / "user")
    assert not discard_if_untrained(tmp_path / "user")
    assert (tmp_path / "user" / "notes.txt").read_text() == "mine"


def test_other_commands_never_write_their_hydra_files_into_a_training_run(run, tmp_path):
    best = next((run / "checkpoints").glob("best-*.ckpt"))
    before = digests(run)
    for script, args in (
        ("eval.py", [f"ckpt={best}"]),
        ("predict.py", [f"ckpt={best}", "smiles=CCO"]),
    ):
        line = one_error_line(call_failing(script, [*args, f"hydra.run.dir={run}"], tmp_path))
        assert f"hydra.run.dir={run}" in line and "training run's folder" in line
    assert digests(run) == before


# -- what cannot be written is one error line -----------------------------------------------


@pytest.fixture
def places(run, tmp_path) -> dict:
    """The run's best checkpoint and CSV, a converted source, and a file and a folder (named
    like an output) of the user's."""
    a_file = tmp_path / "a_file"
    a_file.write_text("keep me")
    a_folder = tmp_path / "a_folder.npy"
    a_folder.mkdir()
    best = next((run / "checkpoints").glob("best-*.ckpt"))
    return {"best": best, "csv": run.parent / "molecules.csv", "file": a_file, "folder": a_folder}


def refused(cases, cwd: Path) -> None:
    for script, args, named in cases:
        line = one_error_line(call_failing(script, args, cwd=cwd))
        assert named in line, (script, args, line)


def test_unwritable_run_folders_are_one_error_line(places, read_only, tmp_path):
    train = tpsa_run_args(places["csv"], tmp_path / "new", "trainer.max_epochs=1")
    best, a_file = places["best"], places["file"]
    cases = [
        ("train.py", [*train, f"hydra.run.dir={a_file}"], "is not a folder"),
        ("train.py", [*train, f"hydra.run.dir={read_only}"], "cannot be written"),
        ("train.py", [*train, f"hydra.run.dir={read_only / 'run'}"], "cannot be written"),
        ("eval.py", [f"ckpt={best}", f"hydra.run.dir={a_file}"], "hydra.run.dir="),
        ("predict.py", [f"ckpt={best}", "smiles=CCO", f"hydra.run.dir={read_only}"], "hydra.run"),
    ]
    refused(cases, tmp_path)
    assert a_file.read_text() == "keep me" and list(read_only.iterdir()) == []


def test_unwritable_dataset_roots_are_one_error_line(places, read_only, tmp_path):
    train = tpsa_run_args(places["csv"], tmp_path / "new", "trainer.max_epochs=1")
    cases = [
        ("train.py", [*train, f"dataset.root={places['file']}"], "dataset.root="),
        ("train.py", [*train, f"dataset.root={read_only}"], "dataset.root="),
        ("eval.py", [f"ckpt={places['best']}", f"dataset.root={read_only}"], "dataset.root="),
    ]
    refused(cases, tmp_path)
    assert not (tmp_path / "new").exists()  # the failed run left no folder behind
    assert places["file"].read_text() == "keep me" and list(read_only.iterdir()) == []


def test_outputs_that_cannot_be_written_are_one_error_line(places, read_only, tmp_path):
    best, a_file, a_folder = places["best"], places["file"], places["folder"]
    source = converted_source(tmp_path)
    cases = [
        ("eval.py", [f"ckpt={best}", f"output={read_only / 'e.json'}"], "writable folder"),
        ("predict.py", [f"ckpt={best}", "smiles=CCO", f"output={read_only / 'p.csv'}"], "output="),
        ("convert.py", [f"source={source}", f"output={read_only / 'c.ckpt'}"], "writable"),
        ("explain.py", [f"ckpt={best}", "smiles=CCO", f"output={read_only / 'pics'}"], "writable"),
        # a folder where a file is written, and the reverse
        ("eval.py", [f"ckpt={best}", f"output={a_folder}", "overwrite=true"], "is a folder"),
        ("convert.py", [f"source={source}", f"output={a_folder}"], "is a folder"),
        ("predict.py", [f"ckpt={best}", "smiles=CCO", f"embeddings={a_folder}"], "is a folder"),
        ("explain.py", [f"ckpt={best}", "smiles=CCO", f"output={a_file}"], "is a file"),
    ]
    refused(cases, tmp_path)
    assert a_file.read_text() == "keep me" and list(read_only.iterdir()) == []
    assert list(a_folder.iterdir()) == []


def test_the_rules_live_in_outputs(tmp_path, device, read_only):
    (tmp_path / "dir").mkdir()
    assert folder_problem(tmp_path / "new" / "deeper") is None
    assert "is not a folder" in folder_problem(device)
    assert "cannot be written" in folder_problem(read_only / "sub")
    with pytest.raises(ConfigError, match="is a device"):
        check_outputs({"output": device}, {}, overwrite=True)
    with pytest.raises(ConfigError, match="is a folder"):
        check_outputs({"output": tmp_path / "dir"}, {}, overwrite=True)
    with pytest.raises(ConfigError, match="writable folder"):
        check_outputs({"output": read_only / "x.csv"}, {}, overwrite=True)
    check_outputs({"output": tmp_path / "dir"}, {}, overwrite=True, folders=("output",))
