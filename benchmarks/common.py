"""Timing helpers for the benchmarks, the one way they run ``scripts/train.py``, and the pieces
the side-by-side benchmarks share (``versus_chemprop.py``, ``moleculeace.py``): a chemprop run, a
graphormer run on a split file, their test predictions, the descriptor pre-training made once per
``--work`` folder. The molecules and model presets come from :mod:`graphormer.testing`, the one
copy the tests share."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from graphormer.testing import model_preset, nci_graphs, to_data

__all__ = [
    "REPO",
    "add_lever_argument",
    "add_threads_argument",
    "add_pretrain_arguments",
    "best_of",
    "chemprop_predictions",
    "check_pretrain_record",
    "check_threads_record",
    "dimenet_plus_plus",
    "failed",
    "lever_rows",
    "merge_results",
    "model_preset",
    "nci_graphs",
    "pretrain",
    "rmse",
    "run_chemprop",
    "run_graphormer",
    "run_timed",
    "single_thread",
    "test_predictions",
    "to_data",
    "train_command",
    "triplets",
]

REPO = Path(__file__).resolve().parents[1]


def train_command(out: Path, *overrides: str) -> list[str]:
    """This checkout's ``scripts/train.py`` into the run folder ``out``, without a progress bar,
    with ``overrides``."""
    return [
        sys.executable,
        str(REPO / "scripts" / "train.py"),
        f"hydra.run.dir={out}",
        "trainer.enable_progress_bar=false",
        *overrides,
    ]


def failed(name: str, returncode: int, output: str) -> SystemExit:
    """The exit of a benchmark whose child ``name`` failed: its ``output`` (the caller keeps its
    tail) and, when a signal killed it (a negative ``returncode``), which one. Such a child
    prints nothing of its own: on Linux a SIGKILL is, as a rule, the kernel's out-of-memory
    killer."""
    why = ""
    if returncode < 0:
        signal_name = signal.Signals(-returncode).name
        why = f" (killed by {signal_name}"
        if -returncode == signal.SIGKILL:
            why += ": out of memory, as a rule; run fewer benchmark processes at a time"
        why += ")"
    return SystemExit(f"{name} failed{why}:\n{output}")


def run_timed(command: list[str], name: str, show: bool = False, threads: int = 1) -> float:
    """Runs ``command`` with this checkout first on ``PYTHONPATH`` and ``threads`` threads (0:
    torch's default); its wall seconds. A failure ends the benchmark with the command's last
    output; ``show`` prints the output of a success too (a benchmark's figures)."""
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if threads:
            env[key] = str(threads)
        else:
            env.pop(key, None)
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}".rstrip(os.pathsep)
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    if result.returncode:
        raise failed(name, result.returncode, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    if show:
        print(result.stdout, end="", flush=True)
    return wall


def best_of(fn, repeats: int = 3) -> float:
    """Fastest wall time of ``repeats`` calls, in seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def single_thread() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)


def triplets(edge_index: torch.Tensor, num_nodes: int, shift: torch.Tensor | None = None):
    """DimeNet's triplets k -> j -> i without torch-sparse: for each edge j -> i, every edge
    k -> j; the same tuple as ``torch_geometric.nn.models.dimenet.triplets`` (``i``, ``j`` of
    each edge, then per triplet its atoms ``idx_i``, ``idx_j``, ``idx_k`` and its edges
    ``idx_kj``, ``idx_ji``). Without ``shift`` every triplet with k == i is dropped (PyG's
    rule). With ``shift`` ``[E, 3]`` (each edge's cell shift of its source, periodic pairs) only
    the backtracks are: k == i with the two shifts summing to zero, k's image being i itself;
    k == i through another image is a real neighbour."""
    row, col = edge_index  # j -> i
    order = torch.argsort(col, stable=True)  # edges grouped by their target
    incoming = torch.bincount(col, minlength=num_nodes)
    start = torch.cumsum(incoming, 0) - incoming
    count = incoming[row]  # for edge j -> i: the edges into j
    idx_ji = torch.arange(len(row)).repeat_interleave(count)
    offset = torch.arange(int(count.sum())) - (torch.cumsum(count, 0) - count).repeat_interleave(
        count
    )
    idx_kj = order[start[row].repeat_interleave(count) + offset]
    idx_i, idx_j, idx_k = col[idx_ji], row[idx_ji], row[idx_kj]
    back = idx_i == idx_k
    if shift is not None:
        back &= (shift[idx_kj] + shift[idx_ji]).abs().amax(dim=-1) < 1e-4
    keep = ~back
    return col, row, idx_i[keep], idx_j[keep], idx_k[keep], idx_kj[keep], idx_ji[keep]


def rmse(pred: np.ndarray, true: np.ndarray) -> float:
    """sqrt(mean((y - y')^2)): OGB's Evaluator's formula, used for every tool's predictions."""
    return float(np.sqrt(np.mean((np.asarray(pred) - np.asarray(true)) ** 2)))


def chemprop_predictions(out: Path) -> np.ndarray:
    """A finished chemprop run's test predictions, in its split file's test order."""
    found = sorted(out.rglob("test_predictions.csv"))
    if not found:
        raise SystemExit(f"chemprop wrote no test_predictions.csv under {out}")
    return pd.read_csv(found[0])["y"].to_numpy(dtype=float)


def run_chemprop(
    args: argparse.Namespace,
    csv: Path,
    split: Path,
    out: Path,
    seed: int,
    binary: bool = False,
    descriptors: bool = False,
) -> tuple[np.ndarray, float]:
    """chemprop's defaults (``args.chemprop``, ``args.epochs``) on ``csv``'s ``smiles`` and ``y``
    with chemprop's ``split`` file, into ``out``: its test predictions and wall seconds.
    ``descriptors`` adds RDKit's normalised 2D descriptors (``v1_rdkit_2d_normalized``)."""
    command = [
        args.chemprop,
        "train",
        "-i",
        str(csv),
        "-s",
        "smiles",
        "--target-columns",
        "y",
        "-t",
        "classification" if binary else "regression",
        "--splits-file",
        str(split),
        "--epochs",
        str(args.epochs),
        "--pytorch-seed",
        str(seed),
        "-o",
        str(out),
        "-n",
        "0",
        "--accelerator",
        "cpu",
        "--devices",
        "1",
    ]
    if descriptors:
        command += ["--molecule-featurizers", "v1_rdkit_2d_normalized"]
    wall = run_timed(command, str(out), threads=getattr(args, "threads", 1))
    return chemprop_predictions(out), wall


def merge_results(path: Path, results: list[dict]) -> None:
    """Add ``results`` (dicts with a ``row`` name) to the JSON list at ``path``: a row of the same
    name is replaced, every other row kept, so the commands of one benchmark can share a file."""
    ran = {r["row"] for r in results}
    kept = json.loads(path.read_text()) if path.exists() else []
    path.write_text(json.dumps([r for r in kept if r["row"] not in ran] + results, indent=1))


def dimenet_plus_plus(
    cutoff: float, num_spherical: int = 7, num_radial: int = 6, num_blocks: int = 3
):
    """PyG's ``DimeNetPlusPlus`` at the size the 3D benchmarks give it (64 wide, 3 blocks, one
    output): one definition for the molecular and the periodic rows. ``num_blocks=0`` keeps its
    embedding and first output block alone: each atom's energy a network of the sum, over its
    neighbours, of a radial filter times an embedding of the pair's two elements and distance
    (an embedded-atom form, no angles)."""
    from torch_geometric.nn.models import DimeNetPlusPlus

    return DimeNetPlusPlus(
        hidden_channels=64,
        out_channels=1,
        num_blocks=num_blocks,
        int_emb_size=32,
        basis_emb_size=8,
        out_emb_channels=64,
        num_spherical=num_spherical,
        num_radial=num_radial,
        cutoff=cutoff,
    )


def add_lever_argument(parser: argparse.ArgumentParser) -> None:
    """``--lever NAME KEY=VALUE ...`` (repeatable): one more graphormer row, see
    :func:`lever_rows`."""
    parser.add_argument(
        "--lever",
        nargs="+",
        action="append",
        default=[],
        metavar="NAME KEY=VALUE",
        help="one more graphormer row: its name, then settings added to train.py's defaults "
        "(+pretrained: fine-tuned from the pre-training)",
    )


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    """``--threads N``: the threads of every training run, graphormer's and chemprop's."""
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="threads per training run, every tool alike (default 1; 0: torch's default). "
        "A --work keeps the runs of one setting",
    )


def check_threads_record(args: argparse.Namespace) -> None:
    """``--threads`` is recorded in ``work/threads.json`` at the first run, and another value
    refused there: the work folder's finished runs, reused, would be timed at another setting."""
    if args.threads < 0:
        raise SystemExit(
            f"error: --threads {args.threads}: give 1 or more, or 0 for torch's default"
        )
    record = args.work / "threads.json"
    if record.is_file():
        before = json.loads(record.read_text())["threads"]
        if before != args.threads:
            raise SystemExit(
                f"error: --work {args.work} holds runs timed with --threads {before}, not "
                f"{args.threads}; give this setting another --work"
            )
    elif (args.work / "runs").is_dir() and args.threads != 1:
        raise SystemExit(
            f"error: --work {args.work} holds runs timed on one thread; give --threads "
            f"{args.threads} another --work"
        )
    args.work.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"threads": args.threads}))


def lever_rows(
    fixed: dict[str, list[str]], names: Sequence[str], levers: list[list[str]], work: Path
) -> dict[str, list[str]]:
    """The graphormer rows: the ``fixed`` ones and each ``--lever NAME KEY=VALUE ...`` (a NAME
    among ``names``, the script's rows, is refused). A lever's
    settings are written to ``work/levers/NAME.json`` the first time, and a lever reusing NAME
    with other settings is refused (its finished runs would be reused under the wrong name)."""
    rows = dict(fixed)
    for name, *settings in levers:
        if name in names or name in rows:
            raise SystemExit(f"error: --lever {name} is already a row; give the lever a new name")
        if not settings or not all(s == "+pretrained" or "=" in s for s in settings):
            raise SystemExit(f"error: --lever {name} needs KEY=VALUE settings, got {settings}")
        record = work / "levers" / f"{name}.json"
        if record.is_file() and json.loads(record.read_text()) != settings:
            raise SystemExit(
                f"error: --lever {name} ran before with {json.loads(record.read_text())}, not "
                f"{settings}; give these settings another name"
            )
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(settings))
        rows[name] = settings
    return rows


def run_graphormer(
    args: argparse.Namespace,
    csv: Path,
    split: Path,
    out: Path,
    seed: int,
    extra: list[str],
    pretrained: str | None = None,
    binary: bool = False,
) -> tuple[dict, float]:
    """``train.py``'s defaults on ``csv``'s ``smiles`` and ``y`` with the split file ``split``,
    ``args.epochs`` epochs, into ``out`` (a finished run there is reused): its ``metrics.json``
    and wall seconds. ``extra`` are more settings; ``"+pretrained"`` among them stands for
    ``pretrained=`` the checkpoint ``pretrained``."""
    command = train_command(
        out,
        "dataset=smiles_csv",
        f"dataset.path={csv}",
        "dataset.targets=[y]",
        f"dataset.task_type={'binary' if binary else 'regression'}",
        f"dataset.split_file={split}",
        f"dataset.root={args.work / 'cache'}",
        f"trainer.max_epochs={args.epochs}",
        f"seed={seed}",
        *(f"pretrained={pretrained}" if item == "+pretrained" else item for item in extra),
    )
    if (out / "metrics.json").is_file() and (out / "wall.json").is_file():
        wall = json.loads((out / "wall.json").read_text())["wall_s"]
    else:
        shutil.rmtree(out, ignore_errors=True)
        wall = run_timed(command, str(out), threads=getattr(args, "threads", 1))
    (out / "wall.json").write_text(json.dumps({"wall_s": wall}))
    return json.loads((out / "metrics.json").read_text()), wall


def test_predictions(row: str, out: Path, smiles: list[str]) -> np.ndarray:
    """One finished run's predictions for the test molecules ``smiles`` (in the split file's
    order): chemprop's own test_predictions.csv, graphormer's best checkpoint through
    :class:`~graphormer.Predictor`."""
    if row.startswith("chemprop"):
        return chemprop_predictions(out)
    from graphormer import Predictor

    best = Path(json.loads((out / "graphormer" / "metrics.json").read_text())["best_checkpoint"])
    moved = out / "graphormer" / "checkpoints" / best.name  # the work folder may have moved
    best = moved if moved.is_file() else best
    predicted = Predictor.from_checkpoint(str(best), device="cpu").predict(smiles)["y"]
    return predicted.to_numpy(float).reshape(-1)


def similarity_table(splits: dict[str, tuple[Sequence[str], dict]]) -> str:
    """The markdown table of how close each set's held-out molecules are to its training ones:
    per set (``{name: (smiles, split)}``, the split's ``train``/``valid``/``test`` rows), the
    median over the validation and over the test molecules of each one's highest Tanimoto
    similarity to a training molecule (ECFP4 bits), and what ``dataset.molecule_features=auto``
    and ``model.num_layers=auto`` choose (the data's own rule,
    :func:`graphormer.data.descriptors.analogue_features`, on the validation molecules)."""
    from graphormer.data.descriptors import analogue_features, nearest_similarity_median
    from graphormer.models.graphormer import resolve_depth

    lines = [
        "| set | validation vs train | test vs train | `molecule_features=auto` | layers |",
        "|---|---|---|---|---|",
    ]
    for name, (smiles, split) in splits.items():
        train = [smiles[i] for i in split["train"]]
        chosen, valid = analogue_features(train, [smiles[i] for i in split["valid"]], len(smiles))
        test = nearest_similarity_median(train, [smiles[i] for i in split["test"]])
        shown = "-" if valid is None else f"{valid:.2f}"
        depth = resolve_depth("auto", analogues=chosen == "morgan_counts")
        lines.append(f"| {name} | {shown} | {test:.2f} | {chosen or 'the graph alone'} | {depth} |")
    return "\n".join(lines)


def add_pretrain_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--pretrain-*`` options of the descriptor pre-training recipe."""
    parser.add_argument("--pretrain-epochs", type=int, default=10)  # the recipe's
    parser.add_argument(
        "--pretrain-smiles",
        type=Path,
        default=None,
        help="a CSV (.csv or .csv.gz) of unlabelled SMILES to pre-train on (default: rdkit's NCI 5K)",
    )
    parser.add_argument(
        "--pretrain-size", type=int, default=None, help="a seeded sample of this many of them"
    )
    parser.add_argument(
        "--pretrain-threads",
        type=int,
        choices=(1, 0),
        default=1,
        help="1: the pre-training runs on one thread like every other run; 0: torch's default",
    )
    parser.add_argument(
        "--pretrain-overrides",
        nargs="*",
        default=[],
        help="settings of the pre-training run beyond the recipe's, e.g. "
        "dataset.atom_descriptor_targets=false (molecule-level descriptors alone)",
    )


def pretrain_smiles(args: argparse.Namespace, held_out: set[str]) -> list[str]:
    """The unlabelled SMILES to pre-train on: rdkit's NCI set, or ``--pretrain-smiles`` (a CSV,
    gzipped or not, with a ``smiles`` or ``SMILES`` column), less every molecule of
    ``held_out`` (canonical SMILES of the evaluated sets), then a seeded sample of
    ``--pretrain-size``."""
    from rdkit import Chem, RDLogger

    RDLogger.DisableLog("rdApp.*")
    if args.pretrain_smiles is None:
        from graphormer.testing import nci_smiles

        smiles = list(nci_smiles())
    else:
        table = pd.read_csv(args.pretrain_smiles)
        column = next((c for c in ("smiles", "SMILES") if c in table.columns), None)
        if column is None:
            raise SystemExit(
                f"error: --pretrain-smiles {args.pretrain_smiles} has no smiles or SMILES column "
                f"(columns: {list(table.columns)}); name the SMILES column smiles"
            )
        smiles = [str(s) for s in table[column]]
    order = np.random.default_rng(0).permutation(len(smiles))
    kept = []
    for i in order:
        mol = Chem.MolFromSmiles(smiles[i])
        if mol is not None and Chem.MolToSmiles(mol) not in held_out:
            kept.append(smiles[i])
            if args.pretrain_size is not None and len(kept) == args.pretrain_size:
                break
    return kept


def check_pretrain_record(args: argparse.Namespace) -> dict:
    """The pre-training settings the arguments ask for; an ``error:`` when ``--work`` holds a
    pre-training made with others (its fine-tuned rows would be reported under these)."""
    settings = {
        "smiles": str(args.pretrain_smiles or "rdkit NCI first_5K.smi"),
        "size": args.pretrain_size,
        "epochs": args.pretrain_epochs,
    }
    if args.pretrain_overrides:  # absent otherwise, so that earlier records still match
        settings["overrides"] = list(args.pretrain_overrides)
    record = args.work / "pretrain" / "settings.json"
    if record.is_file() and json.loads(record.read_text()) != settings:
        raise SystemExit(
            f"error: {record.parent} was pre-trained with {record.read_text()}, not {settings}; "
            "give the same --pretrain-* arguments, or another --work for another pre-training"
        )
    return settings


def pretrain(args: argparse.Namespace, held_out) -> tuple[str, float]:
    """The descriptor pre-training run (``experiment=descriptor_pretrain``), made once per
    ``--work`` folder: its best checkpoint and wall seconds. ``held_out`` is called, only when
    the run is made, for the canonical SMILES to leave out of the pre-training molecules."""
    out = args.work / "pretrain"
    settings = check_pretrain_record(args)
    record = out / "settings.json"
    if not (out / "metrics.json").is_file():
        smiles = args.work / "data" / "pretrain_smiles.csv"
        smiles.parent.mkdir(parents=True, exist_ok=True)
        pd.DataFrame({"smiles": pretrain_smiles(args, held_out())}).to_csv(smiles, index=False)
        if out.exists():
            shutil.rmtree(out)
        command = train_command(
            out,
            "experiment=descriptor_pretrain",
            f"dataset.path={smiles}",
            f"dataset.root={args.work / 'cache'}",
            f"trainer.max_epochs={args.pretrain_epochs}",
            *args.pretrain_overrides,
        )
        wall = run_timed(command, "pretrain", threads=args.pretrain_threads)
        (out / "wall.json").write_text(json.dumps({"wall_s": wall}))
        record.write_text(json.dumps(settings))
    wall = json.loads((out / "wall.json").read_text())["wall_s"]
    return json.loads((out / "metrics.json").read_text())["best_checkpoint"], wall
