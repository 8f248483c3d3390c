"""PCQM4Mv2 at full scale: processing cost, storage, and a training process's memory and data rate.

    python benchmarks/pcqm4mv2_scale.py --root /tmp/pcqm_full [--molecules 3746620] [--workers 4]

Builds a PCQM4Mv2-layout dataset of the official size (3,746,620 molecules, official split sizes)
by repeating rdkit's real NCI molecules, then, each step in a fresh process:

1. processes it through graphormer's own code (``ogb.lsc``'s loader reads the CSV; SMILES are
   featurised by OGB's ``smiles2graph`` in several processes): wall time, peak RSS, disk size;
2. loads it: the in-memory size of the compact arrays against OGB's int64 ``Data`` storage, and
   the process's RSS after loading and setting up the datamodule;
3. trains: ``scripts/train.py dataset=pcqm4mv2`` with the slim model, ``num_workers`` DataLoader
   workers computing the structural features, for a fixed number of steps; peak memory of the
   whole process tree (RSS of the main process, and PSS summed over main and workers, which
   counts the shared memory-mapped pages once);
4. the data rate of one worker: graphs/s that one DataLoader worker delivers (collation with
   structural features computed on the fly), and of ``num_workers`` workers together.

Needs psutil (installed with lightning). Takes ~15 minutes on 2 cores at full size.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SIZES = {"train": 3_378_606, "valid": 73_545, "test-dev": 147_037, "test-challenge": 147_432}


def build(root: Path, molecules: int) -> None:
    from graphormer.testing import nci_table, write_pcqm4mv2_layout

    if (root / "pcqm4m-v2" / "raw" / "data.csv.gz").is_file():
        return
    table = nci_table()
    repeats = -(-molecules // len(table))
    index = np.tile(np.arange(len(table)), repeats)[:molecules]
    smiles = table.smiles.to_numpy()[index].tolist()
    gaps = 3.0 + table.tpsa.to_numpy()[index] / 40.0
    scale = molecules / sum(SIZES.values())
    sizes = {k: int(v * scale) for k, v in SIZES.items()}
    sizes["train"] += molecules - sum(sizes.values())
    start = time.perf_counter()
    write_pcqm4mv2_layout(root, smiles, gaps, sizes)
    print(f"built {molecules:,} molecules in {time.perf_counter() - start:.0f} s: {sizes}")


class TreeMemory:
    """Polls a process tree: the main process's peak RSS and the peak of PSS summed over it."""

    def __init__(self, pid: int) -> None:
        import psutil

        self.root = psutil.Process(pid)
        self.peak_rss = self.peak_pss = 0
        self.peak_processes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            try:
                processes = [self.root, *self.root.children(recursive=True)]
                self.peak_rss = max(self.peak_rss, self.root.memory_info().rss)
                pss = 0
                for p in processes:
                    try:
                        pss += p.memory_full_info().pss
                    except (psutil.NoSuchProcess, psutil.AccessDenied):
                        pass
                self.peak_pss = max(self.peak_pss, pss)
                self.peak_processes = max(self.peak_processes, len(processes))
            except psutil.NoSuchProcess:
                return
            time.sleep(0.5)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def run_measured(command: list[str], env: dict | None = None) -> tuple[float, TreeMemory, str]:
    start = time.perf_counter()
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
    )
    memory = TreeMemory(process.pid)
    output, _ = process.communicate()
    memory.stop()
    if process.returncode:
        raise SystemExit(f"{command} failed:\n{output[-4000:]}")
    return time.perf_counter() - start, memory, output


def step_process(root: Path, processes: int) -> dict:
    code = (
        "from graphormer.data.sources.pcqm4mv2 import PCQM4Mv2Source; import json; "
        f"print(json.dumps(PCQM4Mv2Source(root={str(root)!r}, processes={processes}).prepare()))"
    )
    seconds, memory, output = run_measured([sys.executable, "-c", code])
    info = json.loads(output.strip().splitlines()[-1])
    return {
        "seconds": seconds,
        "graphs_per_s": info["graphs"] / seconds,
        "failed": info["failed"],
        "disk_gb": info["bytes"] / 1e9,
        "peak_pss_gb": memory.peak_pss / 2**30,
        "peak_main_rss_gb": memory.peak_rss / 2**30,
    }


def step_load(root: Path) -> dict:
    code = f"""
import json, resource, numpy as np
from graphormer.data import GraphDataModule, build_source
source = build_source({{"source": "pcqm4mv2", "root": {str(root)!r}}})
module = GraphDataModule(source, batch_size=256, num_workers=0)
module.prepare_data(); module.setup("fit")
d = module.loaded.dataset
ours = sum(a.nbytes for a in (d.x, d.edge_index, d.edge_attr, d.node_ptr, d.edge_ptr)) + d.y.numel() * 4
n, e, g = d.x.shape[0], d.edge_index.shape[1], len(d)
ogb = n * 9 * 8 + e * 2 * 8 + e * 3 * 8 + g * 8 + 3 * (g + 1) * 8  # int64 x, edges, bonds; y; slices
import psutil
print(json.dumps({{"graphs": g, "ours_gb": ours / 1e9, "ogb_int64_gb": ogb / 1e9,
    "rss_after_setup_gb": psutil.Process().memory_info().rss / 2**30}}))
"""
    _, _, output = run_measured([sys.executable, "-c", code])
    return json.loads(output.strip().splitlines()[-1])


def step_worker_rate(root: Path, workers: int, batches: int) -> dict:
    code = f"""
import json, time, torch
from graphormer.data import GraphDataModule, build_source
rates = {{}}
for workers in (1, {workers}):
    source = build_source({{"source": "pcqm4mv2", "root": {str(root)!r}}})
    module = GraphDataModule(source, batch_size=256, num_workers=workers)
    module.prepare_data(); module.setup("fit")
    loader = iter(module.train_dataloader())
    next(loader)  # workers started
    start, seen = time.perf_counter(), 0
    for _ in range({batches}):
        seen += next(loader).num_graphs
    rates[workers] = seen / (time.perf_counter() - start)
print(json.dumps(rates))
"""
    _, _, output = run_measured([sys.executable, "-c", code], env={"OMP_NUM_THREADS": "1"})
    rates = json.loads(output.strip().splitlines()[-1])
    return {
        "graphs_per_s_one_worker": rates["1"],
        f"graphs_per_s_{workers}_workers": rates[str(workers)],
    }


def step_train(root: Path, workers: int, steps: int, out: Path, max_nodes: int) -> dict:
    command = [
        sys.executable,
        str(REPO / "scripts" / "train.py"),
        "dataset=pcqm4mv2",
        f"dataset.root={root}",
        "model=graphormer_slim",
        f"datamodule.num_workers={workers}",
        "datamodule.batch_size=256",
        f"datamodule.max_nodes={max_nodes}",
        f"trainer.max_steps={steps}",
        "+trainer.limit_val_batches=20",
        f"trainer.val_check_interval={steps}",
        "trainer.num_sanity_val_steps=0",
        f"hydra.run.dir={out}",
    ]
    seconds, memory, output = run_measured(command)
    return {
        "train_seconds": seconds,
        "peak_main_rss_gb": memory.peak_rss / 2**30,
        "peak_tree_pss_gb": memory.peak_pss / 2**30,
        "processes": memory.peak_processes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--molecules", type=int, default=sum(SIZES.values()))
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument(
        "--max-nodes",
        type=int,
        default=128,
        help="training skips larger molecules; the largest padded batch sets the peak memory "
        "(rdkit's NCI molecules reach 122 atoms, far more than PCQM4Mv2's)",
    )
    args = parser.parse_args()
    build(args.root, args.molecules)
    results = {}
    if not (args.root / "pcqm4m-v2" / "processed" / "compact_v1").is_dir():
        results["process"] = step_process(args.root, args.processes)
        print("process:", results["process"], flush=True)
    results["load"] = step_load(args.root)
    print("load:", results["load"], flush=True)
    results["workers"] = step_worker_rate(args.root, args.workers, args.batches)
    print("workers:", results["workers"], flush=True)
    out = args.root / f"run-{time.strftime('%H%M%S')}"
    results["train"] = step_train(args.root, args.workers, args.steps, out, args.max_nodes)
    print("train:", results["train"], flush=True)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
