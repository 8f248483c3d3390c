"""Runs people can trust (issue 10): exact resume after a kill, the same results with or without
DataLoader workers, run folders that are never overwritten, checkpoints that never choose code."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from graphormer import checkpoint
from graphormer.training import CheckpointError, GraphormerModule

from helpers import REPO, TINY, call_failing, call_script, run_script

# Dropout on, so that the random streams matter for exactness.
NOISY = [*TINY, "model.dropout=0.1", "model.attention_dropout=0.1", "trainer.max_epochs=4"]


def train_args(ogb_root, out, *extra):
    return [
        "dataset=ogbg-molhiv",
        f"dataset.root={ogb_root}",
        f"hydra.run.dir={out}",
        *NOISY,
        *extra,
    ]


def final_state(out: Path) -> dict:
    return checkpoint.load(out / "checkpoints" / "last.ckpt").state_dict


def scores(out: Path) -> dict:
    metrics = json.loads((out / "metrics.json").read_text())
    return {k: metrics[k] for k in ("valid", "test", "epochs")}


def assert_same_weights(a: dict, b: dict, tol: float = 1e-6) -> None:
    assert a.keys() == b.keys()
    worst = max(float((a[k].float() - b[k].float()).abs().max()) for k in a if a[k].numel())
    assert worst <= tol, worst


# Loaded by the train.py child through PYTHONPATH (Python imports ``sitecustomize`` at start-up):
# the run SIGKILLs itself as soon as the checkpoint of the chosen epoch is in place. A kill sent
# from outside once that file appeared raced the run: on a busy CI machine the tiny run finished
# its remaining epochs before the watcher looked again.
KILL_HOOK = """
import os
import signal

from graphormer.training import callbacks

_save = callbacks.RunCheckpoint._save_checkpoint
_epoch = int(os.environ["GRAPHORMER_TEST_KILL_AFTER_EPOCH"])


def _save_then_die(self, trainer, filepath):
    _save(self, trainer, filepath)
    if os.path.basename(filepath) == "last.ckpt" and trainer.current_epoch >= _epoch:
        os.kill(os.getpid(), signal.SIGKILL)


callbacks.RunCheckpoint._save_checkpoint = _save_then_die
"""


def kill_after_epoch(args, cwd: Path, out: Path, epoch: int) -> None:
    """Runs train.py until it is SIGKILLed, at once after last.ckpt of ``epoch`` (0-based) is
    written."""
    hook = cwd / "kill_hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(KILL_HOOK)
    path = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH", "")) if p)
    env = {
        **os.environ,
        "PYTHONPATH": path,
        "GRAPHORMER_TEST_KILL_AFTER_EPOCH": str(epoch),
        "OMP_NUM_THREADS": "1",
    }
    process = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "train.py"), *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        timeout=600,
    )
    assert process.returncode == -signal.SIGKILL, (process.returncode, process.stderr[-3000:])


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory, ogb_root):
    """The run left alone: 4 epochs with dropout, size-grouped batches, no workers."""
    work = tmp_path_factory.mktemp("reference")
    call_script("train.py", train_args(ogb_root, work / "run"), cwd=work)
    return work / "run"


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory, ogb_root):
    """The same run, SIGKILLed once its epoch-1 checkpoint exists (of 4 epochs); tests copy it
    before resuming it in its own folder, or resume its checkpoint into a new folder."""
    work = tmp_path_factory.mktemp("killed")
    out = work / "run"
    kill_after_epoch(train_args(ogb_root, out), work, out, epoch=1)
    assert not (out / "metrics.json").exists()  # it really died mid-run
    assert torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)["epoch"] == 1
    return out


def test_killed_and_resumed_run_ends_exactly_like_the_uninterrupted_one(
    reference_run, killed_run, ogb_root, tmp_path
):
    out = tmp_path / "run"
    shutil.copytree(killed_run, out)
    log = call_script(
        "train.py",
        train_args(ogb_root, out, f"ckpt_path={out / 'checkpoints' / 'last.ckpt'}"),
        cwd=tmp_path,
    )
    # Weights, optimiser moments, learning-rate schedule, target statistics, data order and
    # dropout streams all continued where they stopped: the same final weights and metrics.
    assert_same_weights(final_state(out), final_state(reference_run))
    assert scores(out) == scores(reference_run)
    assert "data: ogbg-molhiv: train 320, valid 40, test 40" in log


def test_resume_into_a_new_folder_keeps_the_best_score(
    reference_run, killed_run, ogb_root, tmp_path
):
    resumed = tmp_path / "resumed"
    call_script(
        "train.py",
        train_args(ogb_root, resumed, f"ckpt_path={killed_run / 'checkpoints' / 'last.ckpt'}"),
        cwd=tmp_path,
    )
    # "best" counts every epoch of the run, including those before the resume.
    assert scores(resumed) == scores(reference_run)
    reference_best = json.loads((reference_run / "metrics.json").read_text())["best_checkpoint"]
    best = json.loads((resumed / "metrics.json").read_text())["best_checkpoint"]
    assert Path(best).name == Path(reference_best).name and Path(best).is_file()


def test_a_ddp_run_resumes_exactly_with_every_ranks_dropout_stream(ogb_root, tmp_path):
    """Under DDP each rank draws its own dropout masks and rank 0 alone writes checkpoints:
    a resume must give each rank back its own stream, not rank 0's. One epoch, then a second
    resumed, against two straight (the schedule fixed in steps, so that both runs share it)."""
    ddp = [
        "trainer=ddp",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "optim.total_steps=10",  # 320 graphs / (32 x 2 ranks) = 5 updates an epoch
        "optim.warmup_steps=1",
    ]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run_script("train.py", train_args(ogb_root, straight, *ddp, "trainer.max_epochs=2"), tmp_path)
    run_script("train.py", train_args(ogb_root, resumed, *ddp, "trainer.max_epochs=1"), tmp_path)
    last = resumed / "checkpoints" / "last.ckpt"
    stored = torch.load(last, weights_only=True)
    assert stored["epoch"] == 0  # one epoch: the override of NOISY's 4 took
    assert len(stored["graphormer_rng_states"]["per_rank"]) == 2
    log = run_script(
        "train.py",
        train_args(ogb_root, resumed, *ddp, "trainer.max_epochs=2", f"ckpt_path={last}"),
        tmp_path,
    )
    assert "rank 0's dropout stream" not in log
    assert_same_weights(final_state(resumed), final_state(straight))
    assert scores(resumed) == scores(straight)
    assert scores(straight)["epochs"] == 2


def test_each_rank_gets_its_own_stream_back_and_other_world_sizes_are_told():
    from graphormer.training.rng import capture_rng_state, restore_rng_state_of_rank

    states = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        states.append(capture_rng_state())
    draws = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        draws.append(torch.rand(3))
    stored = {**states[0], "per_rank": states}
    torch.manual_seed(99)
    assert restore_rng_state_of_rank(stored, 1, 2)  # rank 1 of 2: its own stream
    assert torch.equal(torch.rand(3), draws[1])
    # Another world size, or a checkpoint of one process under DDP: rank 0's, and False.
    assert not restore_rng_state_of_rank(stored, 2, 3)
    assert torch.equal(torch.rand(3), draws[0])
    assert not restore_rng_state_of_rank(states[0], 1, 2)
    assert torch.equal(torch.rand(3), draws[0])
    assert restore_rng_state_of_rank(states[1], 0, 1)  # one process, as before
    assert torch.equal(torch.rand(3), draws[1])


def test_a_ddp_resume_of_a_one_process_checkpoint_says_it_is_not_exact(
    killed_run, ogb_root, tmp_path
):
    ddp = ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2"]
    # The killed run's checkpoint (one process), continued for one epoch into a folder of its own.
    last = killed_run / "checkpoints" / "last.ckpt"
    epochs = torch.load(last, weights_only=True)["epoch"] + 2
    log = run_script(
        "train.py",
        train_args(
            ogb_root,
            tmp_path / "ddp",
            *ddp,
            f"trainer.max_epochs={epochs}",
            f"ckpt_path={last}",
            "resume_strict=false",
        ),
        tmp_path,
    )
    assert "every rank continues with rank 0's dropout stream" in log


def test_workers_do_not_change_the_results(reference_run, ogb_root, tmp_path):
    out = tmp_path / "run"
    call_script("train.py", train_args(ogb_root, out, "datamodule.num_workers=2"), cwd=tmp_path)
    assert_same_weights(final_state(out), final_state(reference_run))
    assert scores(out) == scores(reference_run)


def test_a_used_run_folder_is_never_overwritten(reference_run, ogb_root, tmp_path):
    before = (reference_run / "metrics.json").read_bytes()
    config = (reference_run / ".hydra" / "config.yaml").read_bytes()
    result = call_failing("train.py", train_args(ogb_root, reference_run), tmp_path)
    assert result.stderr.startswith("error: the run folder") and "ckpt_path=" in result.stderr
    assert (reference_run / "metrics.json").read_bytes() == before
    assert (reference_run / ".hydra" / "config.yaml").read_bytes() == config


def test_run_folders_are_claimed_once(tmp_path):
    from graphormer.rundir import claim_run_dir, release_run_dir

    assert claim_run_dir(tmp_path / "a") is None
    assert "already holds a run" in claim_run_dir(tmp_path / "a")
    # A resume of the folder's own checkpoint waits for the process that holds it.
    own = tmp_path / "a" / "checkpoints" / "last.ckpt"
    assert "in use by another running process" in claim_run_dir(tmp_path / "a", resume_from=own)
    release_run_dir(tmp_path / "a")
    assert claim_run_dir(tmp_path / "a", resume_from=own) is None
    # Another run's checkpoint may start a new folder, never continue into a used one.
    other = tmp_path / "b" / "checkpoints" / "last.ckpt"
    assert "not one of its checkpoints" in claim_run_dir(tmp_path / "a", resume_from=other)
    assert claim_run_dir(tmp_path / "new", resume_from=other) is None
    # The default folder carries microseconds: runs started in the same second do not share it.
    assert (
        "${now:%Y-%m-%d_%H-%M-%S_%f}"
        in (REPO / "graphormer" / "configs" / "train.yaml").read_text()
    )


def test_metrics_name_the_real_last_checkpoint_and_the_log_has_the_results(reference_run):
    metrics = json.loads((reference_run / "metrics.json").read_text())
    assert metrics["last_checkpoint"] == str(reference_run / "checkpoints" / "last.ckpt")
    log = (reference_run / "train.log").read_text()
    assert "best checkpoint:" in log and "valid rocauc:" in log and "data: ogbg-molhiv" in log
    assert "epoch 4/4" in log  # plain per-epoch lines when the output is not a terminal


# -- checkpoints are data, never code -------------------------------------------------------


def tampered(reference_run: Path, tmp_path: Path, name: str, edit) -> Path:
    stored = torch.load(reference_run / "checkpoints" / "last.ckpt", weights_only=True)
    edit(stored)
    # Sealed again after the edit: these tests reach the checks behind the digest.
    checkpoint.seal(stored)
    path = tmp_path / name
    torch.save(stored, path)
    return path


@pytest.mark.parametrize(
    "dataset",
    [
        {"_target_": "builtins.open", "_args_": ["VICTIM", "w"]},
        {"_target_": "os.system", "_args_": ["touch VICTIM"]},
        {"_target_": "graphormer.data.OGBSource", "_args_": ["VICTIM"], "name": "ogbg-molhiv"},
        {"source": "builtins.open", "path": "VICTIM"},
        {"source": "ogb", "name": "ogbg-molhiv", "root": {"_target_": "builtins.open"}},
    ],
)
def test_a_checkpoint_never_chooses_code(reference_run, tmp_path, dataset):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    dataset = json.loads(json.dumps(dataset).replace("VICTIM", str(victim)))

    def edit(checkpoint):
        checkpoint["hyper_parameters"]["data"]["dataset"] = dataset

    path = tampered(reference_run, tmp_path, "tampered.ckpt", edit)
    from graphormer.training import evaluate

    with pytest.raises(CheckpointError, match="unusable data settings"):
        evaluate(path, accelerator="cpu", output=tmp_path / "out.json")
    assert victim.read_text() == "precious"
    assert not (tmp_path / "out.json").exists()


def test_pickled_objects_are_refused_without_unpickling_advice(tmp_path):
    import datetime

    # A class no graphormer.safe_io group allows: the allow-list is process-wide, so a class one
    # reader allows (argparse.Namespace, for fairseq sources) may already be allowed here.
    path = tmp_path / "pickled.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": datetime.date(2021, 12, 1)}, path)
    with pytest.raises(CheckpointError) as error:
        GraphormerModule.from_checkpoint(path)
    message = str(error.value)
    assert "datetime.date" in message and "never runs code" in message
    assert "weights_only" not in message and "False" not in message


def test_altered_weights_are_detected(reference_run, tmp_path):
    import zipfile

    source = reference_run / "checkpoints" / "last.ckpt"
    data = bytearray(source.read_bytes())
    with zipfile.ZipFile(source) as archive:
        # The largest tensor record: flip 600 of its bytes, as a damaged copy would.
        records = [i for i in archive.infolist() if "/data/" in i.filename]
        info = max(records, key=lambda i: i.file_size)
    assert info.file_size >= 2400
    # The record's bytes follow its local header (30 bytes, the name, the extra field).
    header = 30 + len(info.filename.encode()) + len(info.extra)
    start = info.header_offset + header + info.file_size // 4
    for i in range(600):
        data[start + i] ^= 0x5A
    damaged = tmp_path / "damaged.ckpt"
    damaged.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="do not match the digest"):
        GraphormerModule.from_checkpoint(damaged)
    GraphormerModule.from_checkpoint(source)  # the original still loads


def test_an_unwritable_run_folder_fails_before_training(tmp_path, ogb_root):
    from graphormer.errors import ConfigError

    from helpers import compose_train, train_config

    out = tmp_path / "run"
    out.mkdir()
    (out / "checkpoints").write_text("a file where the checkpoint folder should be")
    cfg = compose_train(
        ["dataset=ogbg-molhiv", f"dataset.root={ogb_root}", f"output_dir={out}", *TINY]
    )
    started = time.perf_counter()
    with pytest.raises(ConfigError, match=f"cannot write checkpoints to {out / 'checkpoints'}"):
        train_config(cfg)
    assert time.perf_counter() - started < 10  # before any data is loaded or any epoch runs


def test_distributed_ranks_may_write_hydra_files_before_rank_zero_claims(tmp_path, monkeypatch):
    from graphormer.rundir import claim_run_dir

    folder = tmp_path / "shared"
    (folder / ".hydra").mkdir(parents=True)  # written by another rank of the same launch
    monkeypatch.setenv("RANK", "0")
    assert claim_run_dir(folder) is None
    (tmp_path / "old" / "checkpoints").mkdir(parents=True)  # a previous run's records
    assert "already holds a run" in claim_run_dir(tmp_path / "old")
    monkeypatch.setenv("RANK", "3")  # other ranks never claim
    assert claim_run_dir(tmp_path / "old") is None
