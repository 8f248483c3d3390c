"""Training throughput and peak memory, real molecules, the model presets.

    python benchmarks/train_throughput.py                 # slim and base, 2 CPU threads
    python benchmarks/train_throughput.py --models slim --steps 40 --reference
    python benchmarks/train_throughput.py --device cuda --models base small slim

Each run is its own process so that its peak RSS is its own. One step = collate a batch of rdkit
NCI molecules (cached structural features), forward, masked loss, backward, gradient clipping at
5.0, AdamW, in train mode (all dropouts on). Batches are drawn as training draws them
(size-grouped) and, for comparison, uniformly at random.

``--reference`` also runs Hugging Face's Graphormer (transformers <= 4.57, its Cython
preprocessing needs Cython < 3) with the same size, batches and optimiser: install those two
yourself; they are not dependencies of this project.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

PRESETS = {"slim": "graphormer_slim", "small": "graphormer_small", "base": "graphormer_base"}
REFERENCE = {"slim": "~190 graphs/s, 1.6 GB peak RSS", "base": "~16 graphs/s, 5-7 GB peak RSS"}


def batch_indices(sizes, batch_size: int, batching: str) -> list[list[int]]:
    import torch

    from graphormer.data import SizeGroupedBatchSampler

    if batching == "grouped":
        return list(SizeGroupedBatchSampler(torch.as_tensor(sizes), batch_size, seed=0))
    order = torch.randperm(len(sizes), generator=torch.Generator().manual_seed(0))
    return [b.tolist() for b in order.split(batch_size)]


def run_reference(
    model_name: str, batch_size: int, steps: int, threads: int, batching: str
) -> dict:
    """Hugging Face's Graphormer, same size, batches and optimiser."""
    import torch
    from transformers import GraphormerConfig as HFConfig
    from transformers import GraphormerForGraphClassification
    from transformers.models.deprecated.graphormer.collating_graphormer import (
        GraphormerDataCollator,
        preprocess_item,
    )

    from common import model_preset, nci_graphs

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    molecules = nci_graphs()
    start = time.perf_counter()
    items = [
        preprocess_item(
            {
                "edge_index": g["edge_index"],
                "edge_attr": g["edge_feat"],
                "node_feat": g["node_feat"],
                "num_nodes": g["num_nodes"],
                "y": [g["num_nodes"] / 30.0],
            }
        )
        for g in molecules
    ]
    preprocess_rate = len(items) / (time.perf_counter() - start)
    preset = model_preset(PRESETS[model_name])
    config = HFConfig(
        num_classes=1,
        num_hidden_layers=preset["num_layers"],
        embedding_dim=preset["hidden_dim"],
        hidden_size=preset["hidden_dim"],
        ffn_embedding_dim=preset["ffn_dim"],
        num_attention_heads=preset["num_heads"],
    )
    model = GraphormerForGraphClassification(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    collate = GraphormerDataCollator()
    batches = iter(batch_indices([g["num_nodes"] for g in molecules], batch_size, batching))

    def step() -> int:
        batch = collate([items[i] for i in next(batches)])
        labels = batch.pop("labels").float()
        loss = model(**batch, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        optimizer.step()
        return len(labels)

    for _ in range(3):
        step()
    start = time.perf_counter()
    seen = sum(step() for _ in range(steps))
    return {
        "model": f"HF {model_name}",
        "params": sum(p.numel() for p in model.parameters()),
        "graphs_per_s": seen / (time.perf_counter() - start),
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "peak_cuda_gb": None,
        "preprocess_per_s": preprocess_rate,
    }


def run_one(
    model_name: str, batch_size: int, steps: int, threads: int, device: str, batching: str
) -> dict:
    import torch

    from graphormer.data import GraphormerCollator, StructuralFeatures
    from graphormer.models import Graphormer, GraphormerConfig
    from graphormer.training import masked_loss

    from common import model_preset, nci_graphs, to_data

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    transform = StructuralFeatures(5)
    graphs = [transform(to_data(g, y=float(g["num_nodes"]))) for g in nci_graphs()]
    collate = GraphormerCollator(max_hops=5, pad_to_multiple=8)
    preset = model_preset(PRESETS[model_name])
    model = Graphormer(GraphormerConfig(**preset, num_tasks=1)).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batches = iter(batch_indices([g.num_nodes for g in graphs], batch_size, batching))

    def step() -> int:
        batch = collate([graphs[i] for i in next(batches)])
        batch = batch.to(device)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            pred = model(batch).float()
        loss = masked_loss(pred, batch.y / 30.0, "l1")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        optimizer.step()
        return batch.num_graphs

    for _ in range(3):  # warm-up
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    seen = sum(step() for _ in range(steps))
    if device == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    return {
        "model": model_name,
        "params": sum(p.numel() for p in model.parameters()),
        "graphs_per_s": seen / elapsed,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "peak_cuda_gb": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["slim", "base"], choices=list(PRESETS))
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--batching", nargs="+", default=["grouped", "random"], choices=["grouped", "random"]
    )
    parser.add_argument(
        "--reference",
        action="store_true",
        help="also run Hugging Face's port (needs transformers<=4.57, Cython<3)",
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--hf", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        if args.hf:
            result = run_reference(
                args.one, args.batch_size, args.steps, args.threads, args.batching[0]
            )
        else:
            result = run_one(
                args.one, args.batch_size, args.steps, args.threads, args.device, args.batching[0]
            )
        print(json.dumps(result))
        return
    print(
        f"batch {args.batch_size}, {args.threads} threads, {args.steps} timed steps "
        f"(a quarter for base/small on CPU), {args.device}, train mode"
    )
    for name in args.models:
        steps = args.steps if name == "slim" or args.device != "cpu" else max(args.steps // 4, 3)
        for batching in args.batching:
            for hf in [False, True] if args.reference else [False]:
                cmd = [
                    sys.executable,
                    __file__,
                    "--one",
                    name,
                    "--batch-size",
                    str(args.batch_size),
                    "--steps",
                    str(steps),
                    "--threads",
                    str(args.threads),
                    "--device",
                    args.device,
                    "--batching",
                    batching,
                ]
                out = (
                    subprocess.run(
                        cmd + (["--hf"] if hf else []), capture_output=True, text=True, check=True
                    )
                    .stdout.strip()
                    .splitlines()[-1]
                )
                r = json.loads(out)
                memory = f"{r['peak_rss_gb']:.2f} GB peak RSS"
                if r["peak_cuda_gb"] is not None:
                    memory += f", {r['peak_cuda_gb']:.2f} GB peak CUDA"
                label = f"{'HF ' if hf else ''}{name} {batching}"
                extra = f", HF preprocessing {r['preprocess_per_s']:.0f} graphs/s" if hf else ""
                print(
                    f"{label:>18} ({r['params'] / 1e6:6.2f}M params): "
                    f"{r['graphs_per_s']:8.1f} graphs/s, {memory}{extra}"
                )
    print(
        "DESIGN notes' earlier reference figures (HF port, 2 threads, batch 64): "
        + "; ".join(f"{k}: {v}" for k, v in REFERENCE.items())
    )


if __name__ == "__main__":
    main()
