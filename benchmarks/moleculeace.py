"""Graphormer against chemprop v2 and fingerprint baselines on MoleculeACE's 30 activity sets.

    pip download MoleculeACE==3.0.0 --no-deps -d /tmp/mace     # the wheel; its files are read
    python benchmarks/moleculeace.py --data /tmp/mace/MoleculeACE-3.0.0-py3-none-any.whl \
        --work /tmp/mace-work [--sets CHEMBL2835_Ki CHEMBL2047_EC50 ...] [--smallest N] \
        [--rows graphormer graphormer+pretrained chemprop svm rf] [--seeds 0 1 2] [--epochs 40] \
        [--chemprop chemprop] [--pretrain-smiles FILE.csv[.gz] --pretrain-size N ...] \
        [--lever NAME KEY=VALUE ...] [--ensemble] [--threads N] [--similarity] [--report]

Data: MoleculeACE 3.0.0 (van Tilborg, Alenicheva and Grisoni, "Exposing the limitations of
molecular machine learning with activity cliffs", J. Chem. Inf. Model. 2022): 30 ChEMBL sets of
Ki or EC50 measurements, 615 to 3,657 molecules each, as CSVs ``smiles``, ``exp_mean [nM]``,
``y`` (-log10 of the value in nM, so pKi or pEC50 less 9: RMSE is the same), ``cliff_mol`` (1: the
molecule is in an activity-cliff pair) and ``split`` (the set's own train/test split, stratified by
cliffs). ``--data`` is the wheel (the package is never imported, its pinned dependencies never
installed), a folder holding it, or a folder of the CSVs.

Protocol: each set's own train/test split; validation is a seeded tenth of the training rows
(seed 0, the same rows for every model and every seed), so every model trains on the other nine
tenths. Seeds change the models' initialisation and batch order only. Rows:

- ``graphormer``: ``train.py``'s defaults (their ``dataset.molecule_features=auto`` gives Morgan
  counts beside the graph on every MoleculeACE set: see ``--similarity``);
  ``graphormer+pretrained``: the same, fine-tuned from
  ``experiment=descriptor_pretrain`` made once per ``--work`` on rdkit's NCI SMILES or
  ``--pretrain-smiles`` (every MoleculeACE molecule removed first), as in ``versus_chemprop.py``;
- ``chemprop``: chemprop v2's defaults (``--chemprop``, its own virtual environment);
- ``svm``: support vector regression with a Tanimoto kernel on ECFP4 counts (radius 2, 1,024
  bins), scikit-learn's precomputed kernel; ``rf``: a random forest on the same counts. These are
  the two classical models MoleculeACE found strongest; their one setting (the SVM's C, the
  forest's max_features) is chosen on the validation rows; ``svm+rf``: the mean of the two
  (the classical side's ensemble; its wall time the sum of theirs);
- ``--lever NAME KEY=VALUE ...`` (repeatable): one more row ``NAME``, ``train.py``'s defaults plus
  those settings (``--lever morgan dataset.molecule_features=morgan_counts``; ``+pretrained``
  among them fine-tunes from the pre-training, as ``graphormer+pretrained``). A lever's settings
  are kept beside its runs, and another lever under the same name is refused.

Scored here from each run's test predictions, one formula for every row: test RMSE, and RMSE on
the test molecules with ``cliff_mol`` = 1. Per set: mean ± std (numpy's, population) over the
seeds, wall seconds per run; then each row's wins over the sets (lowest mean test RMSE, and
lowest cliff RMSE) and its mean over the sets; then each graphormer row paired, set by set, with
the defaults (``graphormer``) and every baseline: on how many sets each RMSE is lower, the mean
difference with its standard error, and against chemprop the wall-time ratio. ``--ensemble``
adds the same tables for each row's ensemble over the seeds (``graphormer x3``: the mean of the
seeds' test predictions, its wall time the sum of theirs), paired with the baselines' ensembles
of as many seeds (the SVM's fit does not depend on the seed, so its ensemble is itself). Each
run's test predictions are kept with its scores; for runs finished before they were, the
ensemble reads them back from the run (graphormer's best checkpoint, chemprop's
``test_predictions.csv``) or refits the SVM or forest. Finished runs are
kept under ``--work`` and reused; ``--report`` prints the markdown table of the finished runs
and runs nothing; ``--similarity`` also prints, per set, the median over its validation and over
its test molecules of each one's highest Tanimoto similarity to a training molecule (ECFP4
bits): what
``dataset.molecule_features=auto`` decides by (``graphormer``'s defaults give Morgan counts beside
the graph at 0.5 or more, as on every MoleculeACE set). Every training run gets one thread
(``--threads N`` gives each N, 0 torch's default, in a ``--work`` of its own); run one process
at a time for comparable wall times.
"""

from __future__ import annotations

import argparse
import io
import json
import time
import zipfile
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

ROWS = ("graphormer", "graphormer+pretrained", "chemprop", "svm", "rf", "svm+rf")
BASELINES = ("chemprop", "svm", "rf", "svm+rf")  # the rows that are not graphormer's
GRAPHORMER_ROWS = {"graphormer": [], "graphormer+pretrained": ["+pretrained"]}
INSIDE_WHEEL = "MoleculeACE/Data/benchmark_data/"
COLUMNS = ("smiles", "y", "cliff_mol", "split")
VALID_SEED = 0  # the validation tenth of each set's training rows: one draw for every model


def read_sets(data: Path) -> dict[str, pd.DataFrame]:
    """Every MoleculeACE CSV under ``data`` (the wheel, a folder holding it, or a folder of the
    CSVs), by set name (``CHEMBL2835_Ki``)."""
    if data.is_dir():
        wheels = sorted(data.glob("MoleculeACE-*.whl"))
        csvs = sorted(data.glob("CHEMBL*.csv")) or sorted(data.rglob("benchmark_data/CHEMBL*.csv"))
        if csvs:
            return {p.stem: check_set(p.stem, pd.read_csv(p), p) for p in csvs}
        if not wheels:
            raise SystemExit(
                f"error: --data {data} holds neither MoleculeACE's wheel nor its CHEMBL*.csv "
                "files; pip download MoleculeACE==3.0.0 --no-deps -d DIR and give DIR"
            )
        data = wheels[-1]
    if not data.is_file() or not zipfile.is_zipfile(data):
        raise SystemExit(
            f"error: --data {data} is not MoleculeACE's wheel or a folder; "
            "pip download MoleculeACE==3.0.0 --no-deps -d DIR and give DIR"
        )
    sets = {}
    with zipfile.ZipFile(data) as wheel:
        for member in sorted(wheel.namelist()):
            if member.startswith(INSIDE_WHEEL) and member.endswith(".csv"):
                name = Path(member).stem
                table = pd.read_csv(io.BytesIO(wheel.read(member)))
                sets[name] = check_set(name, table, data)
    if not sets:
        raise SystemExit(f"error: --data {data} holds no {INSIDE_WHEEL}*.csv; is it MoleculeACE's?")
    return sets


def check_set(name: str, table: pd.DataFrame, source: Path) -> pd.DataFrame:
    missing = [c for c in COLUMNS if c not in table.columns]
    if missing:
        raise SystemExit(f"error: {name} in {source} lacks the columns {missing}")
    return table[list(COLUMNS)]


def split_rows(table: pd.DataFrame) -> dict[str, list[int]]:
    """The set's own test rows, and its training rows less a seeded tenth for validation."""
    train = np.flatnonzero(table["split"].to_numpy() == "train")
    test = np.flatnonzero(table["split"].to_numpy() == "test")
    order = np.random.default_rng(VALID_SEED).permutation(train)
    n_valid = max(1, round(len(train) / 10))
    return {
        "train": sorted(int(i) for i in order[n_valid:]),
        "valid": sorted(int(i) for i in order[:n_valid]),
        "test": [int(i) for i in test],
    }


def build_set(name: str, table: pd.DataFrame, work: Path) -> tuple[Path, Path, Path]:
    """The set's CSV (``smiles``, ``y``, ``cliff_mol``), graphormer's split file and chemprop's."""
    folder = work / "data"
    folder.mkdir(parents=True, exist_ok=True)
    csv, split_file, chemprop_split = (
        folder / f"{name}.csv",
        folder / f"{name}_split.json",
        folder / f"{name}_split_chemprop.json",
    )
    table[["smiles", "y", "cliff_mol"]].to_csv(csv, index=False)
    split = split_rows(table)
    split_file.write_text(json.dumps(split))
    chemprop_split.write_text(
        json.dumps([{"train": split["train"], "val": split["valid"], "test": split["test"]}])
    )
    return csv, split_file, chemprop_split


def ecfp4_counts(smiles: list[str]) -> np.ndarray:
    """ECFP4 (Morgan, radius 2) counts folded to 1,024 bins, [molecules, 1024] float."""
    from rdkit import Chem, RDLogger
    from rdkit.Chem import rdFingerprintGenerator

    RDLogger.DisableLog("rdApp.*")
    generator = rdFingerprintGenerator.GetMorganGenerator(radius=2, fpSize=1024)
    return np.stack(
        [generator.GetCountFingerprintAsNumPy(Chem.MolFromSmiles(s)) for s in smiles]
    ).astype(float)


def tanimoto_kernel(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The Tanimoto (Jaccard) similarity of count vectors, <a, b> / (|a|^2 + |b|^2 - <a, b>),
    [len(a), len(b)]: MoleculeACE's SVM kernel. Two empty fingerprints are identical (1)."""
    dot = a @ b.T
    denominator = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - dot
    return np.where(denominator > 0, dot / np.where(denominator > 0, denominator, 1), 1.0)


def run_classical(
    row: str, table: pd.DataFrame, split: dict, seed: int
) -> tuple[np.ndarray, float]:
    """The SVM or random forest on ECFP4 counts: its one setting chosen on the validation rows,
    then the test predictions of that model (trained on the training rows) and wall seconds;
    ``svm+rf``: the mean of the two models' predictions, and the sum of their seconds."""
    from sklearn.ensemble import RandomForestRegressor
    from sklearn.svm import SVR

    if row == "svm+rf":
        (svm, svm_wall), (forest, forest_wall) = (
            run_classical(one, table, split, seed) for one in ("svm", "rf")
        )
        return (svm + forest) / 2, svm_wall + forest_wall
    start = time.perf_counter()
    x = ecfp4_counts(list(table["smiles"]))
    y = table["y"].to_numpy(float)
    train, valid, test = (np.asarray(split[k]) for k in ("train", "valid", "test"))
    if row == "svm":
        gram = {
            k: tanimoto_kernel(x[rows], x[train]) for k, rows in (("valid", valid), ("test", test))
        }
        gram["train"] = tanimoto_kernel(x[train], x[train])
        fits = {}
        for c in (0.1, 1.0, 10.0, 100.0):
            model = SVR(kernel="precomputed", C=c).fit(gram["train"], y[train])
            fits[c] = (rmse(model.predict(gram["valid"]), y[valid]), model)
        best = min(fits.values(), key=lambda fit: fit[0])[1]
        pred = best.predict(gram["test"])
    else:
        fits = {}
        for features in ("sqrt", 0.33, 1.0):
            model = RandomForestRegressor(
                n_estimators=500, max_features=features, random_state=seed, n_jobs=1
            ).fit(x[train], y[train])
            fits[features] = (rmse(model.predict(x[valid]), y[valid]), model)
        best = min(fits.values(), key=lambda fit: fit[0])[1]
        pred = best.predict(x[test])
    return pred, time.perf_counter() - start


def scores(pred: np.ndarray, table: pd.DataFrame, split: dict) -> dict:
    """Test RMSE and RMSE over the test molecules in an activity-cliff pair."""
    test = np.asarray(split["test"])
    true, cliff = table["y"].to_numpy(float)[test], table["cliff_mol"].to_numpy()[test] == 1
    pred = np.asarray(pred, dtype=float).reshape(-1)
    return {
        "rmse": rmse(pred, true),
        "cliff_rmse": rmse(pred[cliff], true[cliff]) if cliff.any() else float("nan"),
    }


def run_one(args, name: str, row: str, seed: int, table: pd.DataFrame, pretrained) -> dict:
    csv, split_file, chemprop_split = build_set(name, table, args.work)
    split = json.loads(split_file.read_text())
    out = args.work / "runs" / name / row / f"seed{seed}"
    out.mkdir(parents=True, exist_ok=True)
    if row == "chemprop":
        pred, wall = run_chemprop(args, csv, chemprop_split, out / "chemprop", seed)
    elif row in args.graphormer_rows:
        extra = args.graphormer_rows[row]
        checkpoint = pretrained() if "+pretrained" in extra else None
        _, wall = run_graphormer(args, csv, split_file, out / "graphormer", seed, extra, checkpoint)
        pred = test_predictions(row, out, list(table["smiles"].iloc[split["test"]]))
    else:
        pred, wall = run_classical(row, table, split, seed)
    pred = np.asarray(pred, dtype=float).reshape(-1)
    return {**scores(pred, table, split), "wall_s": wall, "pred": pred.tolist()}


def member_predictions(args, name: str, row: str, seed: int, table: pd.DataFrame) -> np.ndarray:
    """A finished run's test predictions: kept in its ``result.json``, or (runs finished before
    they were kept) read back from the run's files, or the SVM or forest refitted (seeded, so
    the same model); added to ``result.json`` once found."""
    out = args.work / "runs" / name / row / f"seed{seed}"
    result = json.loads((out / "result.json").read_text())
    if "pred" not in result:
        split = split_rows(table)
        if row == "chemprop" or row in args.graphormer_rows:
            pred = test_predictions(row, out, list(table["smiles"].iloc[split["test"]]))
        else:
            pred = run_classical(row, table, split, seed)[0]
        result["pred"] = np.asarray(pred, dtype=float).reshape(-1).tolist()
        (out / "result.json").write_text(json.dumps(result))
    return np.asarray(result["pred"], dtype=float)


def ensembles(
    args, sets: list[str], every: dict[str, pd.DataFrame], results: dict
) -> tuple[dict[tuple[str, str], list[dict]], list[str]]:
    """Per set and row with every one of ``args.seeds`` finished: the ensemble ``ROW xN`` (the
    mean of the seeds' test predictions, scored as one run; its wall time the sum of theirs)."""
    n = len(args.seeds)
    found: dict[tuple[str, str], list[dict]] = {}
    for name in sets:
        split = split_rows(every[name])
        for row in args.rows:
            runs = results.get((name, row), [])
            if len(runs) < n:
                continue
            preds = [member_predictions(args, name, row, s, every[name]) for s in args.seeds]
            found[name, f"{row} x{n}"] = [
                {
                    **scores(np.mean(preds, axis=0), every[name], split),
                    "wall_s": float(sum(r["wall_s"] for r in runs)),
                }
            ]
    return found, [f"{row} x{n}" for row in args.rows]


def base_row(row: str) -> str:
    """The row an ensemble row (``chemprop x3``) is made of."""
    return row.split(" x", 1)[0]


def summary(
    results: dict[tuple[str, str], list[dict]], sizes: dict[str, int], rows: list[str]
) -> str:
    """The markdown table: per set and row, mean ± std over seeds of test and cliff RMSE and the
    wall seconds per run; then per row, its wins over the sets where every row finished (ties
    count for each) and its mean over those sets."""
    lines = [
        "| set (molecules) | model | test RMSE | cliff RMSE | wall s / run | seeds |",
        "|---|---|---|---|---|---|",
    ]
    means: dict[tuple[str, str], tuple[float, float]] = {}
    walls: dict[tuple[str, str], float] = {}
    sets = list(sizes)
    for name in sets:
        for row in rows:
            runs = results.get((name, row))
            if not runs:
                continue
            test = np.array([r["rmse"] for r in runs])
            cliff = np.array([r["cliff_rmse"] for r in runs])
            wall = np.mean([r["wall_s"] for r in runs])
            wall_text = f"{wall:.0f}" if wall >= 10 else f"{wall:.1f}"  # the SVM: under a second
            means[name, row] = (float(test.mean()), float(cliff.mean()))
            walls[name, row] = float(wall)
            lines.append(
                f"| {name} ({sizes[name]:,}) | {row} | {test.mean():.3f} ± {test.std():.3f} | "
                f"{cliff.mean():.3f} ± {cliff.std():.3f} | {wall_text} | {len(runs)} |"
            )
    complete = [n for n in sets if all((n, r) in means for r in rows)]
    lines += [
        "",
        f"Over the {len(complete)} set(s) where every row finished:",
        "",
        "| model | wins, test RMSE | wins, cliff RMSE | mean test RMSE | mean cliff RMSE |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        wins = [0, 0]
        for name in complete:
            for k in (0, 1):
                wins[k] += means[name, row][k] <= min(means[name, r][k] for r in rows)
        mean = [
            np.mean([means[n, row][k] for n in complete]) if complete else np.nan for k in (0, 1)
        ]
        lines.append(f"| {row} | {wins[0]} | {wins[1]} | {mean[0]:.3f} | {mean[1]:.3f} |")
    baselines = [r for r in rows if base_row(r) in BASELINES]
    plain = next((r for r in rows if base_row(r) == "graphormer"), None)  # the defaults
    for row in (r for r in rows if base_row(r) not in BASELINES):
        defaults = [plain] if plain is not None and row != plain else []
        for other in defaults + baselines:
            lines.append("\n" + paired(means, walls, complete, row, other))
    return "\n".join(lines)


def paired(
    means: dict[tuple[str, str], tuple[float, float]],
    walls: dict[tuple[str, str], float],
    sets: list[str],
    row: str,
    other: str,
) -> str:
    """One line comparing ``row`` with ``other`` set by set over ``sets``: on how many each
    RMSE is lower, the mean paired difference (``row`` less ``other``) with its standard error,
    and, against chemprop, the range and median of the wall-time ratio."""
    if not sets:
        return f"{row} against {other}: no set where both finished."
    n = len(sets)
    text = [f"{row} against {other} ({n} set(s)):"]
    for k, name in enumerate(("test", "cliff")):
        diff = np.array([means[s, row][k] - means[s, other][k] for s in sets])
        below = int((diff < 0).sum())
        se = diff.std(ddof=1) / np.sqrt(n) if n > 1 else float("nan")
        text.append(
            # rounded first, so that a difference of about nothing reads +0.000, never -0.000
            f"{name} RMSE lower on {below} of {n}, difference "
            f"{round(float(diff.mean()), 3) + 0.0:+.3f} ± {se:.3f};"
        )
    if base_row(other) == "chemprop":
        ratio = np.array([walls[s, row] / walls[s, other] for s in sets])
        text.append(
            f"wall time {ratio.min():.2f}x to {ratio.max():.2f}x {other}'s, "
            f"{np.median(ratio):.2f}x in the median, {sum(ratio <= 1)} of {n} at most {other}'s."
        )
    else:
        text[-1] = text[-1].rstrip(";") + "."
    return " ".join(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data", type=Path, required=True, help="MoleculeACE's wheel, its folder, or the CSVs'"
    )
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--sets", nargs="+", default=None, help="set names (default: every set)")
    parser.add_argument(
        "--smallest", type=int, default=None, help="only the N smallest of the chosen sets"
    )
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--chemprop", default="chemprop", help="the chemprop command")
    parser.add_argument(
        "--report", action="store_true", help="print the table of the finished runs; run nothing"
    )
    parser.add_argument(
        "--similarity",
        action="store_true",
        help="also print each set's held-out molecules' similarity to its training ones",
    )
    parser.add_argument(
        "--ensemble",
        action="store_true",
        help="also score each row's ensemble over the seeds (the mean of their predictions)",
    )
    add_lever_argument(parser)
    add_threads_argument(parser)
    add_pretrain_arguments(parser)
    args = parser.parse_args(argv)
    if args.ensemble and len(args.seeds) < 2:
        parser.error("--ensemble needs two or more --seeds (an ensemble of one model is the model)")
    args.work = args.work.resolve()
    check_threads_record(args)
    args.graphormer_rows = lever_rows(GRAPHORMER_ROWS, ROWS, args.lever, args.work)
    args.rows = list(args.rows) + [name for name, *_ in args.lever]
    every = read_sets(args.data)
    unknown = sorted(set(args.sets or []) - set(every))
    if unknown:
        raise SystemExit(
            f"error: --sets {unknown} are not MoleculeACE sets; choose among {sorted(every)}"
        )
    sets = sorted(args.sets or every, key=lambda n: (len(every[n]), n))
    if args.smallest is not None:
        sets = sets[: args.smallest]
    if any("+pretrained" in args.graphormer_rows.get(r, []) for r in args.rows):
        check_pretrain_record(args)  # before any finished run is reused under these settings
    made: list = []

    def pretrained() -> str:
        if not made:
            held_out = lambda: canonical(pd.concat(every.values())["smiles"])  # noqa: E731
            made.append(pretrain(args, held_out))
            print(f"descriptor pre-training: {made[0][1]:.0f} s", flush=True)
        return made[0][0]

    results: dict[tuple[str, str], list[dict]] = {}
    for name in sets:
        for row in args.rows:
            for seed in args.seeds:
                done = args.work / "runs" / name / row / f"seed{seed}" / "result.json"
                if not done.is_file():
                    if args.report:
                        continue
                    result = run_one(args, name, row, seed, every[name], pretrained)
                    done.write_text(json.dumps(result))
                    print(f"{name} {row} seed {seed}: {result}", flush=True)
                results.setdefault((name, row), []).append(json.loads(done.read_text()))
    print(f"\nepochs {args.epochs}, seeds {args.seeds}, CPU\n")
    print(summary(results, {n: len(every[n]) for n in sets}, args.rows))
    if args.ensemble:
        found, rows = ensembles(args, sets, every, results)
        print(
            f"\nEnsembles over seeds {args.seeds} (the mean of the seeds' test predictions; "
            "wall seconds the sum of theirs):\n"
        )
        print(summary(found, {n: len(every[n]) for n in sets}, rows))
    if args.similarity:
        splits = {n: (list(every[n]["smiles"]), split_rows(every[n])) for n in sets}
        print("\nHeld-out molecules' median nearest-neighbour similarity to the training ones:\n")
        print(similarity_table(splits))
    record = args.work / "pretrain" / "wall.json"
    if record.is_file() and any(
        "+pretrained" in args.graphormer_rows.get(r, []) for r in args.rows
    ):
        wall = json.loads(record.read_text())["wall_s"]
        settings = (args.work / "pretrain" / "settings.json").read_text()
        print(f"\ndescriptor pre-training (once, {settings}): {wall:.0f} s")


def canonical(smiles) -> set[str]:
    from rdkit import Chem, RDLogger

    RDLogger.DisableLog("rdApp.*")
    return {Chem.MolToSmiles(m) for m in map(Chem.MolFromSmiles, smiles) if m is not None}


if __name__ == "__main__":
    main()
