"""Training and inference throughput and peak memory, side by side with Hugging Face's Graphormer.

    python benchmarks/train_throughput.py                      # ours, every scenario
    python benchmarks/train_throughput.py --reference          # and Hugging Face's, with ratios
    python benchmarks/train_throughput.py --scenarios slim-random base-random --batches 10
    python benchmarks/train_throughput.py --device cuda --scenarios slim-random base-random
    python benchmarks/train_throughput.py --molecules 2048     # the first 2,048 molecules only

Every measurement runs in a fresh process (so that its peak RSS is its own) on the same 4,854
connected rdkit NCI molecules (the disconnected ones are left out: Hugging Face's collator pads
their unreachable pairs' path features to 510 hops, which no batch of ours does), in the same
batches (the same graphs, in the same order), with the same model dimensions, table sizes and
dropouts, the same L1 loss, gradient clipping at 5.0 and AdamW. Per batch, collation is timed
apart from the step (forward, loss, backward, clipping, optimiser step; forward only for
inference); structural preprocessing happens once before and is not timed.

Reported per scenario: graphs/s over the epoch (all timed graphs / the sum of step times; an
epoch is all batches, or the first ``--batches`` of them), graphs/s of the median step, the
collation time per batch, and the process's peak RSS. ``--reference`` needs Hugging Face's port
(transformers <= 4.57, whose Cython preprocessing needs Cython < 3): ``pip install -e
".[reference]"``.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

PRESETS = {"slim": "graphormer_slim", "base": "graphormer_base"}
# Hugging Face's table sizes (its collator offsets each feature column by 512), so that both
# models have the same embedding tables: 512 rows per atom/bond column, 512 degrees, 512
# spatial entries (Microsoft's layout; unreachable pairs share the "far" entry).
SAME_TABLES = {"feature_stride": 512, "max_degree": 511, "max_distance": 509}
# Hugging Face's head reads the graph token alone (the paper's readout), whatever our preset's.
SAME_HEAD = {"readout": "token"}
NO_DROPOUT = {"dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0}


@dataclass(frozen=True)
class Scenario:
    model: str
    batching: str  # "random" or "grouped"
    train: bool = True
    batch_size: int = 64
    overrides: dict = field(default_factory=dict)
    max_tokens: int | None = None
    reference: bool = True  # whether Hugging Face's port runs it too
    batches: int | None = None  # timed batches (None = the whole epoch); --batches overrides
    bf16: bool = False  # bf16 autocast on the CPU too (both sides), as trainer.precision=bf16-mixed


SCENARIOS = {
    "slim-random": Scenario("slim", "random"),
    "slim-grouped": Scenario("slim", "grouped"),
    "slim-random-nodropout": Scenario("slim", "random", overrides=NO_DROPOUT),
    "slim-inference": Scenario("slim", "random", train=False, batch_size=256),
    # base: the first 16 batches of the epoch (a whole epoch takes ~10 minutes a side on 2 cores)
    "base-random": Scenario("base", "random", batches=16),
    "base-grouped": Scenario("base", "grouped", batches=16),
    # the whole epoch, so that its batches include the largest (122-atom) molecule
    "base-random-budget": Scenario("base", "random", max_tokens=2048, reference=False),
    "base-grouped-bf16": Scenario("base", "grouped", batches=16, bf16=True),
}


def connected(graph: dict) -> bool:
    import numpy as np

    n = graph["num_nodes"]
    parent = np.arange(n)

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a, b in graph["edge_index"].T:
        parent[root(a)] = root(b)
    return len({root(i) for i in range(n)}) == 1


def molecules(limit: int | None = None) -> list[dict]:
    """The connected NCI molecules (the first ``limit`` of them)."""
    from common import nci_graphs

    # Nearly all are connected: twice the molecules asked for (and a few) are enough to featurise.
    return [g for g in nci_graphs(None if limit is None else 2 * limit + 16) if connected(g)][
        :limit
    ]


def plan(sizes: list[int], scenario: Scenario, pad_to_multiple: int) -> list[list[int]]:
    """The batches of one epoch, identical for both implementations (seed 0), drawn as the
    datamodule draws them (``datamodule.max_tokens`` included)."""
    import torch

    from graphormer.data import SizeGroupedBatchSampler
    from graphormer.data.sampling import budget_batch_size

    sizes_t = torch.as_tensor(sizes)
    if scenario.batching == "grouped":
        sampler = SizeGroupedBatchSampler(
            sizes_t,
            scenario.batch_size,
            max_tokens=scenario.max_tokens,
            pad_to_multiple=pad_to_multiple,
        )
        return list(sampler)
    batch_size = scenario.batch_size
    if scenario.max_tokens is not None:  # as the datamodule without size grouping
        batch_size = budget_batch_size(max(sizes), batch_size, scenario.max_tokens, pad_to_multiple)
    order = torch.randperm(len(sizes), generator=torch.Generator().manual_seed(0))
    return [b.tolist() for b in order.split(batch_size)]


def timed(batches, collate, step) -> dict:
    """Collation and step times over ``batches``, after three warm-up steps."""
    for batch in batches[:3]:
        step(collate(batch))
    collate_s, step_s, graphs = [], [], []
    for batch in batches:
        start = time.perf_counter()
        collated = collate(batch)
        collate_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        step(collated)
        step_s.append(time.perf_counter() - start)
        graphs.append(len(batch))
    return {
        "graphs_per_s": sum(graphs) / sum(step_s),
        "median_step_graphs_per_s": statistics.median(
            g / t for g, t in zip(graphs, step_s, strict=True)
        ),
        "collate_ms": 1e3 * statistics.mean(collate_s),
        "batches": len(batches),
        "graphs": sum(graphs),
        "max_batch_tokens": None,
    }


def run_ours(
    scenario: Scenario, batches_limit: int | None, threads: int, device: str, limit=None
) -> dict:
    import torch

    from graphormer.data import GraphormerCollator, StructuralFeatures
    from graphormer.models import Graphormer, GraphormerConfig
    from graphormer.training import masked_loss
    from graphormer.training.module import build_adamw

    from common import model_preset, to_data

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    graphs = molecules(limit)
    transform = StructuralFeatures(5)
    data = [transform(to_data(g, y=g["num_nodes"] / 30.0)) for g in graphs]
    pad = 8 if device == "cuda" else 1
    collator = GraphormerCollator(max_hops=5, pad_to_multiple=pad)
    config = {
        **model_preset(PRESETS[scenario.model]),
        **SAME_TABLES,
        **SAME_HEAD,
        **scenario.overrides,
    }
    config["unreachable_as_far"] = True
    model = Graphormer(GraphormerConfig(**config, num_tasks=1)).to(device)
    model.train(scenario.train)
    # The optimiser train.py builds (fused where safe); Hugging Face's side gets torch's default.
    optimizer = build_adamw(
        model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01
    )
    batches = plan([g["num_nodes"] for g in graphs], scenario, pad)[:batches_limit]
    tokens = []

    def collate(batch):
        out = collator([data[i] for i in batch]).to(device)
        tokens.append(out.x.size(0) * (out.x.size(1) + 1))
        return out

    bf16 = device == "cuda" or scenario.bf16

    def train_step(batch) -> None:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            pred = model(batch).float()
        loss = masked_loss(pred, batch.y, "l1")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        optimizer.step()
        if device == "cuda":
            torch.cuda.synchronize()

    def predict_step(batch) -> None:
        with torch.inference_mode():
            with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
                model(batch).float().cpu()

    result = timed(batches, collate, train_step if scenario.train else predict_step)
    result["max_batch_tokens"] = max(tokens)
    result["params"] = sum(p.numel() for p in model.parameters())
    result["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    if device == "cuda":
        result["peak_cuda_gb"] = torch.cuda.max_memory_allocated() / 2**30
    return result


def run_reference(
    scenario: Scenario, batches_limit: int | None, threads: int, device: str = "cpu", limit=None
) -> dict:
    """Hugging Face's Graphormer, same molecules, batches, size, dropouts, loss and optimiser
    (and, on a GPU, the same bf16 autocast as ours)."""
    import torch
    from transformers import GraphormerConfig as HFConfig
    from transformers import GraphormerForGraphClassification
    from transformers.models.deprecated.graphormer.collating_graphormer import (
        GraphormerDataCollator,
        preprocess_item,
    )

    from graphormer.models import GraphormerConfig

    from common import model_preset

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    graphs = molecules(limit)
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
        for g in graphs
    ]
    preset = {**model_preset(PRESETS[scenario.model]), **scenario.overrides}
    ours = GraphormerConfig(**preset)  # the settings as our model resolves them
    config = HFConfig(
        num_classes=1,
        num_hidden_layers=preset["num_layers"],
        embedding_dim=preset["hidden_dim"],
        hidden_size=preset["hidden_dim"],
        ffn_embedding_dim=preset["ffn_dim"],
        num_attention_heads=preset["num_heads"],
        dropout=preset["dropout"],
        attention_dropout=preset["attention_dropout"],
        activation_dropout=preset["activation_dropout"],
        pre_layernorm=preset["pre_layernorm"],
        encoder_normalize_before=ours.uses_embedding_layernorm,
    )
    model = GraphormerForGraphClassification(config).to(device).train(scenario.train)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    collator = GraphormerDataCollator()
    # The same batches as ours: on a GPU ours pads to multiples of 8, which size-grouping sees.
    pad = 8 if device == "cuda" else 1
    batches = plan([g["num_nodes"] for g in graphs], scenario, pad)[:batches_limit]
    bf16 = device == "cuda" or scenario.bf16

    def collate(batch):
        return {k: v.to(device) for k, v in collator([items[i] for i in batch]).items()}

    def train_step(batch) -> None:
        labels = batch.pop("labels").float().view(-1, 1)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            logits = model(**batch).logits.float().view(-1, 1)
        loss = torch.nn.functional.l1_loss(logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        optimizer.step()
        if device == "cuda":
            torch.cuda.synchronize()

    def predict_step(batch) -> None:
        batch.pop("labels")
        with torch.inference_mode():
            with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
                model(**batch).logits.float().cpu()

    result = timed(batches, collate, train_step if scenario.train else predict_step)
    result["params"] = sum(p.numel() for p in model.parameters())
    result["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    if device == "cuda":
        result["peak_cuda_gb"] = torch.cuda.max_memory_allocated() / 2**30
    return result


def child(args, name: str, reference: bool) -> dict:
    cmd = [sys.executable, __file__, "--one", name, "--threads", str(args.threads)]
    cmd += ["--device", args.device]
    if getattr(args, "molecules", None):
        cmd += ["--molecules", str(args.molecules)]
    batches = args.batches or SCENARIOS[name].batches
    if batches:
        cmd += ["--batches", str(batches)]
    if reference:
        cmd.append("--hf")
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=SCENARIOS)
    parser.add_argument(
        "--batches", type=int, default=None, help="time the first N batches of each epoch"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--molecules", type=int, default=None, help="use the first N connected molecules"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--reference",
        action="store_true",
        help="also run Hugging Face's port (pip install -e '.[reference]')",
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--hf", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        scenario = SCENARIOS[args.one]
        if args.hf:
            result = run_reference(
                scenario, args.batches, args.threads, args.device, args.molecules
            )
        else:
            result = run_ours(scenario, args.batches, args.threads, args.device, args.molecules)
        print(json.dumps(result))
        return

    epoch = f"first {args.batches} batches" if args.batches else "whole epoch (base: 16 batches)"
    print(
        f"{args.device}, {args.threads} threads, {len(molecules(args.molecules))} connected NCI molecules, "
        f"timed: {epoch}; graphs/s per epoch | of the median step; collation ms/batch apart"
    )
    header = "| scenario | ours graphs/s | median step | collate ms | peak RSS GB |"
    rule = "|---|---|---|---|---|"
    if args.reference:
        header += " HF graphs/s | HF median step | HF collate ms | HF peak RSS GB | speed ratio | median ratio | RSS ratio |"
        rule += "---|---|---|---|---|---|---|"
    print(header)
    print(rule)
    for name in args.scenarios:
        ours = child(args, name, reference=False)
        if "error" in ours:
            print(f"| {name} | failed: {ours['error']} |")
            continue
        row = (
            f"| {name} | {ours['graphs_per_s']:.1f} | {ours['median_step_graphs_per_s']:.1f} | "
            f"{ours['collate_ms']:.1f} | {ours['peak_rss_gb']:.2f} |"
        )
        if args.reference and SCENARIOS[name].reference:
            hf = child(args, name, reference=True)
            if "error" in hf:
                row += f" failed: {hf['error']} |"
            else:
                row += (
                    f" {hf['graphs_per_s']:.1f} | {hf['median_step_graphs_per_s']:.1f} | "
                    f"{hf['collate_ms']:.1f} | {hf['peak_rss_gb']:.2f} | "
                    f"{ours['graphs_per_s'] / hf['graphs_per_s']:.2f} | "
                    f"{ours['median_step_graphs_per_s'] / hf['median_step_graphs_per_s']:.2f} | "
                    f"{ours['peak_rss_gb'] / hf['peak_rss_gb']:.2f} |"
                )
        elif args.reference:
            row += " — | — | — | — | — | — | — |"
        print(row, flush=True)
        detail = f"{ours['params'] / 1e6:.2f}M params, {ours['batches']} batches"
        detail += f", largest batch {ours['max_batch_tokens']} padded nodes"
        if "peak_cuda_gb" in ours:
            detail += f", {ours['peak_cuda_gb']:.2f} GB peak CUDA"
        print(f"<!-- {name}: {detail} -->")


if __name__ == "__main__":
    main()
