"""A newcomer's first hour (issue 20): resuming with only the checkpoint, Ctrl-C that says how to
continue, fine-tuning a converted model with one command, run folders that hold one run each, and
misspelt keys named with the keys that exist. Each through the scripts' applications: in a
subprocess where the process itself is what is tested (Ctrl-C, two processes, one refusal as
the shell sees it), else in-process (tests/helpers.call: the same main(), without the seconds
of imports a new process costs)."""

import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from helpers import (
    REPO,
    TINY,
    call_failing,
    call_script,
    read_json,
    run_failing,
    start_script,
)

# Lightning's notices that a resume expects (its own checkpoints, a moved folder).
EXPECTED_WARNINGS = ("exists and is not empty", "dirpath has changed")


def train_args(ogb_root, out, *extra):
    return [
        "dataset=ogbg-molhiv",
        f"dataset.root={ogb_root}",
        f"hydra.run.dir={out}",
        *TINY,
        "model.dropout=0.1",
        *extra,
    ]


def start(args, cwd) -> subprocess.Popen:
    # A shell starts background jobs (`pytest &`, nohup) with SIGINT ignored, and a child keeps
    # an ignored signal: the run is started with Ctrl-C handled, as a terminal gives it.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return start_script("train.py", args, cwd)
    finally:
        signal.signal(signal.SIGINT, previous)


def wait_for(condition, process, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        assert process.poll() is None, f"the run ended before {what}: {process.stderr.read()}"
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def base_run(tmp_path_factory, ogb_root):
    """A finished 2-epoch run with settings other than the defaults (dataset, model, batch size);
    tests copy it before resuming it."""
    work = tmp_path_factory.mktemp("base")
    call_script("train.py", train_args(ogb_root, work / "run", "trainer.max_epochs=2"), cwd=work)
    return work / "run"


def copy_of(run: Path, tmp_path: Path, name: str = "run") -> Path:
    target = tmp_path / name
    shutil.copytree(run, target)
    return target


# -- 1. a resume needs only its checkpoint ---------------------------------------------------


def test_a_resume_takes_its_runs_settings_and_refuses_changes_that_break_it(base_run, tmp_path):
    # A moved copy of the run, resumed from an empty folder elsewhere with nothing but the
    # checkpoint and more epochs: the run's dataset, model and batch size come with it.
    run = copy_of(base_run, tmp_path)
    work = tmp_path / "elsewhere"
    work.mkdir()
    last = run / "checkpoints" / "last.ckpt"
    log = call_script("train.py", [f"ckpt_path={last}", "trainer.max_epochs=3"], cwd=work)
    assert f"resuming {last} with its run's settings ({run / '.hydra' / 'config.yaml'})" in log
    assert "changed by this command: trainer.max_epochs 2 -> 3" in log
    assert "model: 36,869 parameters" in log and "epoch 3/3" in log and "epoch 1/" not in log
    assert not any(w in log for w in EXPECTED_WARNINGS)
    assert list(work.iterdir()) == []  # no new, empty run folder: it continued in its own
    metrics = read_json(run / "metrics.json")
    assert metrics["epochs"] == 3
    # One last.ckpt, the newest; the best checkpoint of the copy replaced in the copy.
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == sorted({"last.ckpt", Path(metrics["best_checkpoint"]).name})
    assert metrics["last_checkpoint"] == str(last)
    assert torch.load(last, weights_only=True)["epoch"] == 2
    # The run's composed config now says 3 epochs: the next resume continues from there.
    assert "max_epochs: 3" in (run / ".hydra" / "config.yaml").read_text()

    before = (run / "metrics.json").read_bytes()
    refused = call_failing("train.py", [f"ckpt_path={last}", "model.num_layers=4"], cwd=work)
    assert refused.stderr.startswith("error: model.num_layers=4 (the run has 3) would change")
    assert "resume_strict=false" in refused.stderr and len(refused.stderr.splitlines()) == 1
    refused = call_failing("train.py", [f"ckpt_path={last}", "model=graphormer_slim"], cwd=work)
    assert refused.stderr.startswith(
        "error: model=graphormer_slim (the run has model=graphormer_tiny)"
    )
    assert (run / "metrics.json").read_bytes() == before
    assert len(list((run / ".hydra").glob("resume-*"))) == 1  # the refused left no record
    # model.num_layers=auto on the command line stands for the number the run has: no change.
    log = call_script("train.py", [f"ckpt_path={last}", "model.num_layers=auto"], cwd=work)
    assert "resuming" in log and "changed by this command" not in log
    assert "num_layers: 3" in (run / ".hydra" / "config.yaml").read_text()

    log = call_script(
        "train.py",
        [f"ckpt_path={last}", "seed=7", "resume_strict=false", "trainer.max_epochs=4"],
        cwd=work,
    )
    assert "seed 42 -> 7" in log and "no longer an exact continuation" in log
    assert read_json(run / "metrics.json")["epochs"] == 4


# -- 2. Ctrl-C says what happened and how to continue ------------------------------------------


def test_ctrl_c_reports_the_saved_epoch_and_the_command_that_resumes_it(ogb_root, tmp_path):
    out = tmp_path / "run"
    process = start(train_args(ogb_root, out, "trainer.max_epochs=20"), tmp_path)
    last = out / "checkpoints" / "last.ckpt"
    try:
        wait_for(last.is_file, process, "the first checkpoint")
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, stderr
    epochs = torch.load(last, weights_only=True)["epoch"] + 1
    assert f"interrupted (Ctrl-C) after epoch {epochs} of 20; saved: {last}" in stderr
    metrics = read_json(out / "metrics.json")
    assert metrics["interrupted"] is True and metrics["epochs"] == epochs
    assert metrics["last_checkpoint"] == str(last) and metrics["test"] is None
    command = stderr.split("resume with: ")[1].splitlines()[0]
    words = shlex.split(command)
    assert words == ["python", str(REPO / "scripts" / "train.py"), f"ckpt_path={last}"]
    # The command works as printed (here with fewer epochs, to end soon).
    log = call_script("train.py", [*words[2:], f"trainer.max_epochs={epochs + 1}"], cwd=tmp_path)
    assert f"epoch {epochs + 1}/{epochs + 1}" in log
    metrics = read_json(out / "metrics.json")
    assert "interrupted" not in metrics and metrics["epochs"] == epochs + 1


# -- 3. fine-tuning a converted model with one command -------------------------------------


def test_pretrained_brings_its_architecture(ogb_root, tmp_path):
    from graphormer.interop import convert_checkpoint

    from helpers import microsoft_config, random_model, write_fairseq

    config = microsoft_config(num_tasks=1)
    source = write_fairseq(tmp_path / "ms.pt", config, random_model(config))
    converted, _ = convert_checkpoint(source, tmp_path / "converted.ckpt")
    common = [
        f"pretrained={converted}",
        "dataset=ogbg-molhiv",
        f"dataset.root={ogb_root}",
        "trainer.max_epochs=1",
        "trainer.enable_progress_bar=false",
    ]
    out = tmp_path / "run"
    log = call_script("train.py", [*common, "model.dropout=0.2", f"hydra.run.dir={out}"], tmp_path)
    assert (
        f"pretrained={converted}: the network's architecture is the checkpoint's (num_layers=2 "
        "hidden_dim=32 ffn_dim=48 num_heads=4 pre_layernorm=false, ...); from this command: "
        "model.dropout; give model=NAME to choose another"
    ) in log
    assert log.count("copied 46 tensors") == 1  # once, without a logger prefix
    from graphormer import checkpoint
    from graphormer.training.pretrained import architecture

    trained = checkpoint.load(out / "checkpoints" / "last.ckpt").model
    assert architecture(trained) == architecture(config.to_dict())
    assert trained["dropout"] == 0.2  # model.KEY= on the command line sets that key
    # Its resume rebuilds the checkpoint's network, and needs the pretrained file no more.
    converted.rename(tmp_path / "moved.ckpt")
    log = call_script(
        "train.py",
        [f"ckpt_path={out / 'checkpoints' / 'last.ckpt'}", "trainer.max_epochs=2"],
        tmp_path,
    )
    assert "epoch 2/2" in log and "model: 204,721 parameters" in log
    converted = (tmp_path / "moved.ckpt").rename(converted)
    # A model chosen on the command line wins, and is checked against the checkpoint.
    failed = tmp_path / "failed"
    result = call_failing(
        "train.py", [*common, "model=graphormer_tiny", f"hydra.run.dir={failed}"], tmp_path
    )
    assert result.stderr.startswith(f"error: pretrained={converted} does not fit this model")
    assert "model.num_layers 2 vs 3" in result.stderr
    # 4. Nothing was trained there: no run folder is left behind.
    assert not failed.exists()


# -- 4. misspelt keys ----------------------------------------------------------------------


def test_a_misspelt_key_names_the_keys_that_exist(tmp_path):
    result = run_failing("train.py", ["trainer.max_epoch=5"], cwd=tmp_path)
    assert result.stderr.startswith(
        "error: trainer.max_epoch is not a key of this config: did you mean trainer.max_epochs"
    )
    assert len(result.stderr.splitlines()) == 1 and "To append" not in result.stderr
    result = call_failing("train.py", ["dataset=smiles_csv", "dataset.target=x"], cwd=tmp_path)
    # dataset.atom_targets (#18) is a close match too: named after it.
    assert "did you mean dataset.targets" in result.stderr
    assert "the keys of dataset are " in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_folder_where_nothing_was_trained_is_removed(tmp_path):
    from graphormer.rundir import RUN_MARKER, claim_run_dir, discard_if_untrained

    for name, trained in (("failed", False), ("trained", True)):
        folder = tmp_path / name
        assert claim_run_dir(folder) is None
        (folder / ".hydra").mkdir()
        (folder / "checkpoints").mkdir()
        (folder / "train.log").write_text("error: ...")
        if trained:
            (folder / "checkpoints" / "last.ckpt").write_bytes(b"")
        discard_if_untrained(folder)
    assert not (tmp_path / "failed").exists()
    assert (tmp_path / "trained" / "checkpoints" / "last.ckpt").exists()
    # A folder of the user's own is never claimed (tests/test_file_safety.py), so never removed.
    # A folder this process did not create is never touched.
    (tmp_path / "old" / ".hydra").mkdir(parents=True)
    (tmp_path / "old" / RUN_MARKER).touch()
    assert not discard_if_untrained(tmp_path / "old")
    assert (tmp_path / "old" / RUN_MARKER).exists()


# -- 5. run folders ------------------------------------------------------------------------


def test_output_dir_and_other_runs_folders_are_guarded_too(base_run, ogb_root, tmp_path):
    run = copy_of(base_run, tmp_path)
    before = (run / "metrics.json").read_bytes()
    result = call_failing(
        "train.py", [*train_args(ogb_root, tmp_path / "new"), f"output_dir={run}"], tmp_path
    )
    assert result.stderr.startswith(f"error: the run folder {run} already holds a run")
    assert not (tmp_path / "new").exists()  # the folder Hydra would have used is gone too
    other = copy_of(base_run, tmp_path, "other")
    result = call_failing(
        "train.py",
        [f"ckpt_path={other / 'checkpoints' / 'last.ckpt'}", f"hydra.run.dir={run}"],
        tmp_path,
    )
    assert "is not one of its checkpoints" in result.stderr
    assert (run / "metrics.json").read_bytes() == before


def test_two_resumes_of_one_folder_never_run_at_once(base_run, tmp_path):
    run = copy_of(base_run, tmp_path)
    last = run / "checkpoints" / "last.ckpt"
    first = start([f"ckpt_path={last}", "trainer.max_epochs=50"], tmp_path)
    try:
        # Hydra records the resume's command once the folder is claimed (and locked).
        wait_for(lambda: list((run / ".hydra").glob("resume-*")), first, "the first claim")
        # This process is the second: the lock is the first process's, whatever asks for it.
        second = call_failing("train.py", [f"ckpt_path={last}"], tmp_path)
        assert f"error: the run folder {run} is in use by another running process" in (
            second.stderr
        )
    finally:
        first.kill()
        first.wait()


def test_the_folder_guard_suggests_only_a_checkpoint_that_exists(tmp_path):
    from graphormer.rundir import claim_run_dir

    # Killed between the best and the last save of its first epoch: no last.ckpt.
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    best = tmp_path / "run" / "checkpoints" / "best-epoch000.ckpt"
    best.write_bytes(b"")
    message = claim_run_dir(tmp_path / "run")
    assert f"ckpt_path={best}," in message and "last.ckpt" not in message
    (tmp_path / "empty" / "checkpoints").mkdir(parents=True)
    message = claim_run_dir(tmp_path / "empty")
    assert "ckpt_path" not in message and "no checkpoint to continue from" in message
