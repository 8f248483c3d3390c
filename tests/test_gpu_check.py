"""benchmarks/gpu_check.py: its verdicts on the pieces a CPU can check, and its dry run."""

import json
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import gpu_check  # noqa: E402


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a GPU")
def test_without_a_gpu_it_stops_in_one_clear_line(tmp_path, capsys):
    assert gpu_check.main(["--out", str(tmp_path / "report")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: no CUDA GPU is visible")
    assert "--device cpu" in err[0]
    assert not (tmp_path / "report").exists()


def test_host_synchronisations_are_counted_per_step_with_logging_steps_apart():
    steps = [
        {"step": 2, "syncs": ["module.py:10", "graphormer.py:372"], "logs": False},
        {"step": 3, "syncs": ["module.py:10"], "logs": False},
        {"step": 4, "syncs": ["module.py:10", "graphormer.py:372", "x.py:1"], "logs": False},
        {"step": 20, "syncs": ["a.py:1"] * 7, "logs": True},
    ]
    found = gpu_check.sync_summary(steps)
    assert (found["steps"], found["median_per_step"], found["max_per_step"]) == (3, 2, 3)
    assert (found["logging_steps"], found["median_per_logging_step"]) == (1, 7)
    assert found["where_per_step"] == {
        "module.py:10": 1.0,
        "graphormer.py:372": 0.67,
        "x.py:1": 0.33,
    }
    assert gpu_check.sync_summary([])["median_per_step"] is None


def test_the_sync_counter_counts_each_steps_warnings(monkeypatch):
    # torch's sync debug mode warns once per host synchronisation; the counter records the
    # warnings between the ends of two training steps (here emitted by hand, as a GPU would).
    modes = []
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    counter = gpu_check.sync_counter()
    module = SimpleNamespace(device=torch.device("cuda"))

    def step(number: int, syncs: int) -> None:
        for _ in range(syncs):
            warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=1)
        warnings.warn("some other warning", UserWarning, stacklevel=1)
        trainer = SimpleNamespace(log_every_n_steps=20, global_step=number)
        outputs = {"loss": torch.tensor(float(number))}
        counter.on_train_batch_end(trainer, module, outputs, None, number)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for number, syncs in [(1, 5), (2, 2), (3, 0), (20, 4)]:
            step(number, syncs)
        counter.on_train_epoch_end(None, module)
    # The first step has no window before it; step 20 logs.
    found = [(s["step"], len(s["syncs"]), s["logs"]) for s in counter.steps]
    assert found == [(2, 2, False), (3, 0, False), (20, 4, True)]
    assert counter.steps[0]["syncs"][0].startswith("tests/test_gpu_check.py:")
    assert [float(x) for x in counter.losses] == [1.0, 2.0, 3.0, 20.0]
    assert modes == ["warn", "default"] * 4


def test_attention_backends_are_named_from_the_profilers_ops():
    ops = {
        "aten::scaled_dot_product_attention": 12,
        "aten::_scaled_dot_product_efficient_attention": 12,
        "aten::_scaled_dot_product_efficient_attention_backward": 12,
    }
    assert gpu_check.backend_names(ops) == ["efficient"]
    assert gpu_check.backend_names({"aten::_scaled_dot_product_attention_math": 2}) == ["math"]
    cpu = {"autograd::engine::evaluate_function: _BiasedAttentionBackward": 3}
    assert gpu_check.backend_names(cpu) == ["graphormer-cpu-kernel"]


@pytest.mark.slow
def test_the_cpu_dry_run_runs_every_check(tmp_path):
    out = tmp_path / "report"
    assert gpu_check.main(["--device", "cpu", "--out", str(out)]) == 0
    report = json.loads((out / "gpu_check.json").read_text())
    checks = report["checks"]
    assert all(c["status"] == "passed" for c in checks.values()), report["verdict"]
    assert checks["gpu_tests"]["result"]["skipped"] == checks["gpu_tests"]["result"]["tests"] > 0
    for model in gpu_check.MODELS:
        for precision in gpu_check.PRECISIONS:
            run = checks[f"train {model} {precision}"]["result"]
            assert run["loss_last_quarter"] < run["loss_first_quarter"]
            assert run["precision"] == precision
    assert set(checks["attention"]["result"]) == {
        f"{m} {p}" for m in gpu_check.MODELS for p in gpu_check.PRECISIONS
    }
    rows = checks["throughput"]["result"]
    assert set(rows) == set(gpu_check.THROUGHPUT)
    assert all(row["ours"]["graphs_per_s"] > 0 for row in rows.values())
    summary = (out / "gpu_check.md").read_text()
    assert "all checks passed" in summary and "| slim-grouped |" in summary
