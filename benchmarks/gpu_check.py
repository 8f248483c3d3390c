"""Checks a machine with one CUDA GPU end to end, in under 8 minutes (issue #21).

    python benchmarks/gpu_check.py                   # on the GPU machine
    python benchmarks/gpu_check.py --device cpu      # a dry run of everything a CPU can run
    python benchmarks/gpu_check.py --out DIR         # where the report goes (default: gpu_check/)

Writes ``DIR/gpu_check.json`` (everything measured) and ``DIR/gpu_check.md`` (a readable summary,
also printed), and exits 1 when a check failed. The checks:

- ``gpu_tests``: the ``gpu``-marked tests (``pytest -m gpu``);
- ``training``: Graphormer-slim and -base trained briefly on real molecules (rdkit's NCI set, TPSA
  regression) in ``bf16-mixed`` and ``32-true``: the training loss falls, and evaluating the best
  checkpoint again reproduces the validation score training recorded;
- ``host_syncs``: during those runs, the host synchronisations of each training step, counted with
  ``torch.cuda.set_sync_debug_mode("warn")`` (one warning each), with where they come from;
  steps that log (``trainer.log_every_n_steps``) are counted apart;
- ``attention``: which attention kernels ran (SDPA's flash / efficient / cuDNN / math backends,
  or graphormer's own CPU kernel), from torch's profiler over one training step per model and
  precision;
- ``throughput``: training graphs/s and peak GPU memory, ours beside Hugging Face's Graphormer on
  identical batches (``benchmarks/train_throughput.py``), slim and base, random and size-grouped
  batches. Hugging Face's side needs ``pip install -e ".[reference]"``; without it that column
  says so.

The dry run (``--device cpu``) runs the same code on fewer molecules, a 2-layer base in training
and 2 batches per throughput scenario; it counts no synchronisations (a CPU has none to count).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import warnings
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))

MODELS = ("slim", "base")
PRECISIONS = ("bf16-mixed", "32-true")
THROUGHPUT = ("slim-random", "slim-grouped", "base-random", "base-grouped")
# Sizes per device: the GPU run fits in 8 minutes on one GPU (throughput on 2,048 molecules: 32
# batches of slim, base timed on 16); the dry run exercises the same code on a CPU in a few
# minutes (a 1-layer base in training, one batch of 16 molecules per throughput scenario).
SIZES = {
    "cuda": {
        "molecules": None,
        "epochs": 3,
        "batch_size": 64,
        "lr": 5e-4,
        "base_layers": None,
        "attention_molecules": 32,
        "throughput_molecules": 2048,
        "batches": None,
    },
    "cpu": {
        "molecules": 64,
        "epochs": 2,
        "batch_size": 8,
        "lr": 1e-3,
        "base_layers": 1,
        "attention_molecules": 8,
        "throughput_molecules": 16,
        "batches": 1,
    },
}
SYNC_MESSAGE = "synchronizing CUDA operation"


class CheckFailed(Exception):
    """A check ran and its result is wrong (the message says how)."""


def environment(device: str) -> dict[str, Any]:
    info: dict[str, Any] = {
        "device": device,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        info |= {
            "gpu": props.name,
            "gpu_memory_gb": round(props.total_memory / 2**30, 1),
            "capability": f"{props.major}.{props.minor}",
            "bf16": torch.cuda.is_bf16_supported(),
            "gpus_visible": torch.cuda.device_count(),
        }
    return info


# -- the gpu-marked tests -----------------------------------------------------------------------


def gpu_tests(device: str, out: Path) -> dict[str, Any]:
    """``pytest -m gpu`` in a child process; on a CPU every test must skip (no CUDA device)."""
    report = out / "gpu_tests.xml"
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "tests", "-q"]
    cmd += ["-p", "no:cacheprovider", f"--junitxml={report}"]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    seconds = time.perf_counter() - start
    if not report.exists():
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        raise CheckFailed(f"pytest wrote no report (exit {done.returncode}): {' | '.join(tail)}")
    suite = ElementTree.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    failed = [
        case.get("name")
        for case in suite.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    result = {**counts, "passed": counts["tests"] - counts["failures"] - counts["errors"]}
    result |= {"seconds": round(seconds, 1), "failed": failed}
    result["passed"] -= counts["skipped"]
    if failed or counts["tests"] == 0:
        raise CheckFailed(f"gpu tests failed: {failed or 'none collected'}", result)
    if device == "cuda" and counts["skipped"]:
        raise CheckFailed(f"{counts['skipped']} gpu tests skipped on a GPU machine", result)
    return result


# -- short training runs, with host synchronisations counted per step ---------------------------


def nci_csv(path: Path, limit: int | None) -> Path:
    """rdkit's NCI molecules with their TPSA (the demo dataset), the first ``limit`` of them."""
    from rdkit import RDConfig

    lines = Path(RDConfig.RDDataDir, "NCI", "first_5k.tpsa.csv").read_text().splitlines()
    rows = [line for line in lines if line and not line.startswith("#")]
    path.write_text("smiles,tpsa\n" + "\n".join(rows[:limit]) + "\n")
    return path


def sync_counter():
    """A Lightning callback counting host synchronisations between the ends of two training
    steps (the step, the batch's copy to the GPU and the data loading before it)."""
    import lightning.pytorch as pl

    class SyncCounter(pl.Callback):
        def __init__(self) -> None:
            self.steps: list[dict[str, Any]] = []
            self.losses: list[torch.Tensor] = []
            self._catcher = None
            self._caught: list = []

        def _open(self) -> None:
            self._catcher = warnings.catch_warnings(record=True)
            self._caught = self._catcher.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")

        def _close(self) -> list[str]:
            torch.cuda.set_sync_debug_mode("default")
            self._catcher.__exit__(None, None, None)
            self._catcher = None
            return [
                f"{'/'.join(Path(w.filename).parts[-2:])}:{w.lineno}"
                for w in self._caught
                if SYNC_MESSAGE in str(w.message)
            ]

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            if isinstance(loss, torch.Tensor):
                self.losses.append(loss.detach())  # read after training: no sync here
            if self._catcher is not None:
                where = self._close()
                # Lightning writes a step's logs after this hook, so a logging step's work falls
                # in this window or the next: both count as logging steps.
                every, step = trainer.log_every_n_steps, trainer.global_step
                logs = every > 0 and step % every in (0, 1)
                self.steps.append({"step": step, "syncs": where, "logs": logs})
            if pl_module.device.type == "cuda":
                self._open()

        def on_train_epoch_end(self, trainer, pl_module) -> None:
            # The window ends with the epoch: validation and checkpointing are not a step.
            if self._catcher is not None:
                self._close()

        def on_exception(self, trainer, pl_module, exception) -> None:
            if self._catcher is not None:
                self._close()

    return SyncCounter()


def sync_summary(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-step counts of host synchronisations, steps that log apart, and where they came from."""
    plain = [len(s["syncs"]) for s in steps if not s["logs"]]
    logging = [len(s["syncs"]) for s in steps if s["logs"]]
    where = Counter(loc for s in steps if not s["logs"] for loc in s["syncs"])
    per_step = {loc: round(n / max(len(plain), 1), 2) for loc, n in where.most_common(12)}
    return {
        "steps": len(plain),
        "median_per_step": statistics.median(plain) if plain else None,
        "max_per_step": max(plain) if plain else None,
        "logging_steps": len(logging),
        "median_per_logging_step": statistics.median(logging) if logging else None,
        "where_per_step": per_step,
    }


def train_once(model: str, precision: str, device: str, out: Path, csv: Path) -> dict[str, Any]:
    from hydra import compose, initialize_config_dir

    from graphormer.cli import CONFIGS
    from graphormer.cli.train import settings_from
    from graphormer.training import train
    from graphormer.training.evaluation import evaluate

    size = SIZES[device]
    run_dir = out / "runs" / f"{model}-{precision}"
    overrides = [
        "dataset=smiles_csv",
        f"dataset.path={csv}",
        "dataset.targets=[tpsa]",
        f"dataset.root={out / 'data'}",
        f"model=graphormer_{model}",
        f"trainer={'gpu' if device == 'cuda' else 'cpu'}",
        f"trainer.precision={precision}",
        f"trainer.max_epochs={size['epochs']}",
        "trainer.enable_progress_bar=false",
        "trainer.num_sanity_val_steps=0",
        f"datamodule.batch_size={size['batch_size']}",
        f"optim.lr={size['lr']}",
        f"output_dir={run_dir}",
    ]
    if model == "base" and size["base_layers"]:
        overrides.append(f"model.num_layers={size['base_layers']}")
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    counter = sync_counter()
    start = time.perf_counter()
    metrics = train(settings_from(cfg), callbacks=[counter])
    seconds = time.perf_counter() - start
    losses = [float(x) for x in counter.losses]
    quarter = max(len(losses) // 4, 1)
    first, last = statistics.mean(losses[:quarter]), statistics.mean(losses[-quarter:])
    metric = metrics["metric"]
    recorded = metrics["valid"][metric]
    again = evaluate(
        metrics["best_checkpoint"], split="valid", output=run_dir / "eval_metrics.json"
    )["valid"][metric]
    result = {
        "seconds": round(seconds, 1),
        "steps": len(losses),
        "loss_first_quarter": round(first, 4),
        "loss_last_quarter": round(last, 4),
        "metric": metric,
        "valid_recorded": recorded,
        "valid_evaluated": again,
        "precision": metrics["precision"],
    }
    if device == "cuda":
        result["host_syncs"] = sync_summary(counter.steps)
        result["peak_cuda_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        torch.cuda.reset_peak_memory_stats()
    problems = []
    if not last < first:
        problems.append(f"the training loss did not fall ({first:.4f} -> {last:.4f})")
    tolerance = 2e-2 if "bf16" in precision else 1e-3
    if abs(again - recorded) > tolerance * max(abs(recorded), 1.0):
        problems.append(f"eval gives valid {metric} {again:.4f}, training recorded {recorded:.4f}")
    if problems:
        raise CheckFailed("; ".join(problems), result)
    return result


# -- attention kernels --------------------------------------------------------------------------


def attention_backends(model: str, precision: str, device: str) -> dict[str, Any]:
    """The attention kernels one training step (forward and backward) of ``model`` runs."""
    from graphormer.data import GraphormerCollator, StructuralFeatures
    from graphormer.models import Graphormer, GraphormerConfig

    from common import model_preset, nci_graphs, to_data

    preset = model_preset(f"graphormer_{model}")
    if model == "base" and SIZES[device]["base_layers"]:
        preset["num_layers"] = SIZES[device]["base_layers"]
    config = GraphormerConfig(**preset, num_tasks=1)
    network = Graphormer(config).to(device).train()
    transform = StructuralFeatures(config.multi_hop_max_dist)
    graphs = [transform(to_data(g, 1.0)) for g in nci_graphs(SIZES[device]["attention_molecules"])]
    pad = 8 if device == "cuda" else 1
    batch = GraphormerCollator(max_hops=config.multi_hop_max_dist, pad_to_multiple=pad)(graphs)
    batch = batch.to(device)
    bf16 = "bf16" in precision
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities) as profile:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            out = network(batch)
        out.float().sum().backward()
    names = {
        event.key: event.count
        for event in profile.key_averages()
        if "attention" in event.key.lower() or "biased" in event.key.lower()
    }
    return dict(sorted(names.items()))


def backend_names(kernels: dict[str, int]) -> list[str]:
    """The SDPA backends (or graphormer's own kernel) among profiler op names."""
    found = []
    for key, label in (
        ("_flash_attention", "flash"),
        ("_efficient_attention", "efficient"),
        ("_cudnn_attention", "cudnn"),
        ("attention_math", "math"),
        ("_BiasedAttention", "graphormer-cpu-kernel"),
    ):
        if any(key.lower() in name.lower() for name in kernels):
            found.append(label)
    return found


# -- throughput beside Hugging Face's Graphormer ------------------------------------------------


def throughput(device: str) -> dict[str, Any]:
    import train_throughput

    size = SIZES[device]
    args = argparse.Namespace(
        threads=2, device=device, batches=size["batches"], molecules=size["throughput_molecules"]
    )
    try:
        import transformers  # noqa: F401

        reference = True
    except ImportError:
        reference = False
    rows = {}
    for name in THROUGHPUT:
        ours = train_throughput.child(args, name, reference=False)
        hf = (
            train_throughput.child(args, name, reference=True)
            if reference
            else {"error": 'not installed: pip install -e ".[reference]"'}
        )
        row = {"ours": ours, "huggingface": hf}
        if "error" not in ours and "error" not in hf:
            row["speed_ratio"] = round(ours["graphs_per_s"] / hf["graphs_per_s"], 2)
            if "peak_cuda_gb" in ours and "peak_cuda_gb" in hf:
                row["memory_ratio"] = round(ours["peak_cuda_gb"] / hf["peak_cuda_gb"], 2)
        rows[name] = row
    failed = [n for n, r in rows.items() if "error" in r["ours"]]
    if failed:
        raise CheckFailed(f"ours failed in {failed}: {rows[failed[0]]['ours']['error']}", rows)
    return rows


# -- the report ---------------------------------------------------------------------------------


def run_check(name: str, fn, report: dict[str, Any]) -> None:
    start = time.perf_counter()
    print(f"[gpu_check] {name} ...", file=sys.stderr, flush=True)
    try:
        result, status, problem = fn(), "passed", None
    except CheckFailed as failed:
        result = failed.args[1] if len(failed.args) > 1 else None
        status, problem = "failed", str(failed.args[0])
    except Exception as error:  # a crash is a failed check, reported with the others
        result, status = None, "failed"
        problem = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
    report["checks"][name] = {
        "status": status,
        "problem": problem,
        "seconds": round(time.perf_counter() - start, 1),
        "result": result,
    }


def summary(report: dict[str, Any]) -> str:
    env = report["environment"]
    lines = [f"# gpu_check on {env.get('gpu', env['device'])}", ""]
    lines.append(f"torch {env['torch']} (CUDA {env['cuda']}), python {env['python']}; ")
    lines.append(f"total {report['seconds']:.0f} s; {report['verdict']}")
    lines += ["", "| check | status | seconds | problem |", "|---|---|---|---|"]
    for name, check in report["checks"].items():
        lines.append(
            f"| {name} | {check['status']} | {check['seconds']} | {check['problem'] or ''} |"
        )
    tests = report["checks"].get("gpu_tests", {}).get("result")
    if tests:
        lines += [
            "",
            f"gpu tests: {tests['passed']} passed, {tests['skipped']} skipped, "
            f"{tests['failures'] + tests['errors']} failed ({tests['seconds']} s)",
        ]
    lines += ["", "## Training (NCI TPSA)", ""]
    lines.append(
        "| run | steps | loss first → last quarter | valid recorded | eval again | "
        "syncs/step (median, max) | syncs/logging step | peak GPU GB |"
    )
    lines.append("|---|---|---|---|---|---|---|---|")
    for name, check in report["checks"].items():
        run = check["result"] if name.startswith("train ") else None
        if not run:
            continue
        syncs = run.get("host_syncs") or {}
        lines.append(
            f"| {name[6:]} | {run['steps']} | {run['loss_first_quarter']} → "
            f"{run['loss_last_quarter']} | {run['valid_recorded']:.4f} | "
            f"{run['valid_evaluated']:.4f} | {syncs.get('median_per_step', '—')}, "
            f"{syncs.get('max_per_step', '—')} | {syncs.get('median_per_logging_step', '—')} | "
            f"{run.get('peak_cuda_gb', '—')} |"
        )
    for name, check in report["checks"].items():
        syncs = (check["result"] or {}).get("host_syncs") if name.startswith("train ") else None
        if syncs and syncs["where_per_step"]:
            where = ", ".join(f"{k} ({v})" for k, v in syncs["where_per_step"].items())
            lines.append(f"- {name[6:]}: synchronisations per step from {where}")
    attention = report["checks"].get("attention", {}).get("result")
    if attention:
        lines += ["", "## Attention kernels (one training step)", ""]
        for run, found in attention.items():
            lines.append(f"- {run}: {', '.join(found['backends']) or 'none found'}")
    rows = report["checks"].get("throughput", {}).get("result")
    if rows:
        lines += ["", "## Training throughput beside Hugging Face's Graphormer", ""]
        lines.append(
            "| scenario | ours graphs/s | HF graphs/s | speed ratio | ours peak GB | "
            "HF peak GB | memory ratio |"
        )
        lines.append("|---|---|---|---|---|---|---|")
        for name, row in rows.items():
            ours, hf = row["ours"], row["huggingface"]

            def cell(side, key):
                if "error" in side:
                    return side["error"]
                value = side.get(key)
                return "—" if value is None else f"{value:.2f}"

            lines.append(
                f"| {name} | {cell(ours, 'graphs_per_s')} | {cell(hf, 'graphs_per_s')} | "
                f"{row.get('speed_ratio', '—')} | {cell(ours, 'peak_cuda_gb')} | "
                f"{cell(hf, 'peak_cuda_gb')} | {row.get('memory_ratio', '—')} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--out", type=Path, default=Path("gpu_check"))
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            f"error: no CUDA GPU is visible (torch {torch.__version__}, built with CUDA "
            f"{torch.version.cuda}): run gpu_check.py on a machine with one CUDA GPU and a CUDA "
            "build of torch, or pass --device cpu for a dry run",
            file=sys.stderr,
        )
        return 2
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    report: dict[str, Any] = {"environment": environment(args.device), "checks": {}}
    run_check("gpu_tests", lambda: gpu_tests(args.device, out), report)
    csv = nci_csv(out / "nci_tpsa.csv", SIZES[args.device]["molecules"])
    for model in MODELS:
        for precision in PRECISIONS:
            run_check(
                f"train {model} {precision}",
                lambda m=model, p=precision: train_once(m, p, args.device, out, csv),
                report,
            )

    def attention() -> dict[str, Any]:
        found = {}
        for model in MODELS:
            for precision in PRECISIONS:
                kernels = attention_backends(model, precision, args.device)
                found[f"{model} {precision}"] = {
                    "backends": backend_names(kernels),
                    "ops": kernels,
                }
        return found

    run_check("attention", attention, report)
    run_check("throughput", lambda: throughput(args.device), report)
    report["seconds"] = round(time.perf_counter() - start, 1)
    failed = [n for n, c in report["checks"].items() if c["status"] != "passed"]
    report["verdict"] = f"FAILED: {', '.join(failed)}" if failed else "all checks passed"
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    text = summary(report)
    (out / "gpu_check.md").write_text(text)
    print(text)
    print(f"wrote {out / 'gpu_check.json'} and {out / 'gpu_check.md'}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
