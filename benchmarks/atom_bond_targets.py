"""Atom and bond targets (issue #18): how well, and at what cost.

    python benchmarks/atom_bond_targets.py quality --work /tmp/abt       # bond task vs baseline
    python benchmarks/atom_bond_targets.py quality --work /tmp/abt --molecules 3000 --epochs 8
    python benchmarks/atom_bond_targets.py quality --work /tmp/abt --checkpoint CKPT  # score only
    python benchmarks/atom_bond_targets.py throughput --molecules 1024  # graphs/s per level set

``quality`` trains ``scripts/train.py`` (dataset=smiles_csv, model=graphormer_tiny) on RDKit's
rotatable bonds (``Lipinski.RotatableBondSmarts``, a binary bond target) of the first
``--molecules`` rdkit NCI molecules of at most 40 atoms, scaffold split, and prints its test
ROC-AUC and accuracy (threshold 0.5) over every test bond beside the per-bond-type baseline: each
RDKit bond type's rate of rotatable bonds in the training split (ROC-AUC of that rate as a score;
accuracy of predicting the type's majority label). ``--checkpoint`` scores a checkpoint of such a
run (for example one stopped early) instead of training.

``throughput`` times training steps (forward, the levels' masked losses, backward, clipping,
AdamW) of three models of the same size on the same batches, interleaved batch by batch (so that
a shared machine's load falls on all three alike): molecule targets only; + atom targets
(Gasteiger charges); + atom + bond targets (rotatable bonds). Structural preprocessing happens
once before and is not timed; nor is collation.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import numpy as np
import pandas as pd

from common import run_timed, train_command


def gasteiger_charges(mol) -> list[float] | None:
    """RDKit's Gasteiger charge of each atom of ``mol``, or None when one is not finite."""
    from rdkit.Chem import rdPartialCharges

    rdPartialCharges.ComputeGasteigerCharges(mol)
    values = [a.GetDoubleProp("_GasteigerCharge") for a in mol.GetAtoms()]
    return values if all(math.isfinite(v) for v in values) else None


def _table(count: int) -> pd.DataFrame:
    from rdkit import Chem

    from graphormer.testing import nci_rotatable_bonds

    table = nci_rotatable_bonds(count)
    charges = [gasteiger_charges(Chem.MolFromSmiles(s)) for s in table.smiles]
    table["charge"] = [
        None if c is None else "[" + ", ".join(f"{v:.4f}" for v in c) + "]" for c in charges
    ]
    return table


def quality(args: argparse.Namespace) -> None:
    from graphormer.data.sources.smiles_csv import SmilesCsvSource

    args.work.mkdir(parents=True, exist_ok=True)
    csv = args.work / "rotatable.csv"
    table = _table(args.molecules)
    table[["smiles", "rotatable"]].to_csv(csv, index=False)
    out = args.work / "run"
    if args.checkpoint is None and not (out / "metrics.json").is_file():
        command = train_command(
            out,
            "dataset=smiles_csv",
            f"dataset.path={csv}",
            "dataset.targets=[]",
            "dataset.bond_targets=[rotatable]",
            "dataset.bond_task_type=binary",
            f"dataset.root={args.work / 'data'}",
            "model=graphormer_tiny",
            f"trainer.max_epochs={args.epochs}",
            "datamodule.batch_size=64",
            "optim.lr=2e-3",
            "seed=0",
        )
        wall = run_timed(command, "training", threads=0)
        print(f"trained in {wall:.0f} s (shared machine)")
    checkpoint = args.checkpoint
    metrics = None
    if checkpoint is None:
        metrics = json.loads((out / "metrics.json").read_text())
        checkpoint = metrics["best_checkpoint"]

    from sklearn.metrics import roc_auc_score

    from graphormer.inference import Predictor

    source = SmilesCsvSource(
        str(csv), targets=[], bond_targets=["rotatable"], bond_task_type="binary",
        root=str(args.work / "data"),
    )  # fmt: skip
    loaded = source.load()
    rows = {
        split: loaded.dataset.row[loaded.split[split]].view(-1).tolist() for split in loaded.split
    }

    def bonds(split: str) -> tuple[np.ndarray, np.ndarray]:
        types = [t for r in rows[split] for t in table.bond_type[r].split("|") if t]
        labels = [v for r in rows[split] for v in json.loads(table.rotatable[r])]
        return np.array(types), np.array(labels, dtype=float)

    train_types, train_labels = bonds("train")
    test_types, test_labels = bonds("test")
    rates = {t: train_labels[train_types == t].mean() for t in set(train_types)}
    baseline = np.array([rates.get(t, train_labels.mean()) for t in test_types])
    predictor = Predictor.from_checkpoint(checkpoint, device="cpu")
    result = predictor.run([table.smiles[r] for r in rows["test"]])
    predicted = np.concatenate([b[:, 0] for b in result.bonds])
    print(
        f"{len(table)} molecules (train {len(rows['train'])}, valid {len(rows['valid'])}, test "
        f"{len(rows['test'])}; scaffold split), {len(test_labels)} test bonds, "
        f"{test_labels.mean():.1%} rotatable"
    )
    print(f"{'test bonds':<28}{'ROC-AUC':>10}{'accuracy':>10}")
    print(
        f"{'per-bond-type rate':<28}{roc_auc_score(test_labels, baseline):>10.4f}"
        f"{((baseline > 0.5) == test_labels).mean():>10.4f}"
    )
    print(
        f"{'Graphormer tiny':<28}{roc_auc_score(test_labels, predicted):>10.4f}"
        f"{((predicted > 0.5) == test_labels).mean():>10.4f}"
    )
    if metrics is not None:
        print(f"(training's own test bond_rocauc: {metrics['test']['bond_rocauc']:.4f})")
    print(f"checkpoint: {checkpoint}")


def throughput(args: argparse.Namespace) -> None:
    import torch
    from rdkit import Chem

    from graphormer.data import GraphormerCollator, StructuralFeatures
    from graphormer.data.featurize import featurize_smiles, molecule_bond_edges
    from graphormer.models import Graphormer, GraphormerConfig
    from graphormer.testing import model_preset
    from graphormer.training import masked_loss
    from graphormer.training.module import build_adamw

    torch.set_num_threads(args.threads)
    table = _table(args.molecules + 64)
    table = table[table.charge.notna()].head(args.molecules).reset_index(drop=True)
    graphs = featurize_smiles(table.smiles.tolist()).graphs
    transform = StructuralFeatures(5)
    data = []
    for graph, row in zip(graphs, table.itertuples(), strict=True):
        graph.y = torch.tensor([[Chem.MolFromSmiles(row.smiles).GetNumAtoms() / 30.0]])
        graph.y_atom = torch.tensor(json.loads(row.charge)).view(-1, 1)
        graph.bond_edge = molecule_bond_edges(graph)
        graph.y_bond = torch.tensor(json.loads(row.rotatable), dtype=torch.float).view(-1, 1)
        data.append(transform(graph))
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(0))
    batches = [b.tolist() for b in order.split(args.batch_size)][: args.batches]
    collator = GraphormerCollator(max_hops=5)
    preset = model_preset(f"graphormer_{args.model}")
    levels = {
        "molecule": {},
        "+atom": {"atom_tasks": 1},
        "+atom+bond": {"atom_tasks": 1, "bond_tasks": 1},
    }
    runs = {}
    for name, extra in levels.items():
        torch.manual_seed(0)  # the same encoder weights in all three
        model = Graphormer(GraphormerConfig(**preset, num_tasks=1, **extra)).train()
        optimizer = build_adamw(
            model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01
        )
        runs[name] = (model, optimizer, [])

    def step(model, optimizer, batch) -> None:
        out = model.forward_levels(batch)
        loss = masked_loss(out["molecule"], batch.y, "l1")
        if "atom" in out:
            loss = loss + masked_loss(out["atom"].flatten(0, 1), batch.y_atom.flatten(0, 1), "mse")
        if "bond" in out:
            loss = loss + masked_loss(out["bond"].flatten(0, 1), batch.y_bond.flatten(0, 1), "bce")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        optimizer.step()

    collated = [collator([data[i] for i in b]) for b in batches]
    for batch in collated[:2]:  # warm-up
        for model, optimizer, _ in runs.values():
            step(model, optimizer, batch)
    for batch in collated:
        for model, optimizer, times in runs.values():
            start = time.perf_counter()
            step(model, optimizer, batch)
            times.append(time.perf_counter() - start)
    graphs_total = sum(len(b) for b in batches)
    params = {n: sum(p.numel() for p in r[0].parameters()) for n, r in runs.items()}
    print(
        f"graphormer_{args.model}, {len(batches)} batches of {args.batch_size} NCI molecules "
        f"({graphs_total} graphs), {args.threads} threads, shared machine, interleaved per batch"
    )
    print(f"{'targets':<14}{'parameters':>12}{'graphs/s':>10}{'median':>10}{'vs molecule':>13}")
    base = graphs_total / sum(runs["molecule"][2])
    for name, (_, _, times) in runs.items():
        rate = graphs_total / sum(times)
        median = statistics.median(len(b) / t for b, t in zip(batches, times, strict=True))
        print(f"{name:<14}{params[name]:>12,}{rate:>10.1f}{median:>10.1f}{rate / base:>12.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    q = sub.add_parser("quality")
    q.add_argument("--work", type=Path, required=True)
    q.add_argument("--molecules", type=int, default=3000)
    q.add_argument("--epochs", type=int, default=8)
    q.add_argument("--checkpoint", type=Path, default=None)
    t = sub.add_parser("throughput")
    t.add_argument("--molecules", type=int, default=1024)
    t.add_argument("--batch-size", type=int, default=64)
    t.add_argument("--batches", type=int, default=None)
    t.add_argument("--model", default="slim", choices=["tiny", "slim", "base"])
    t.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    quality(args) if args.command == "quality" else throughput(args)


if __name__ == "__main__":
    main()
