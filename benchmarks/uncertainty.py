"""How sure is the model? Ensembles, conformal intervals and calibrated probabilities, offline.

    python benchmarks/uncertainty.py --work /tmp/uncertainty [--molecules 2000] [--members 5]
        [--epochs 8] [--plot docs/images/uncertainty_tpsa.png] [--heads | --only-heads]

Real molecules (rdkit's NCI set) with the topological polar surface area rdkit computes (the
offline demo's target), a seeded random split 60/20/20 (split-conformal intervals assume
validation and test molecules are exchangeable), Graphormer-tiny as in ``experiment=demo``.
Prints:

- regression: each member's test RMSE, their mean, and the ensemble's; the coverage and mean width
  of the 80/90/95% intervals on the test split, for the ensemble (normalised by its spread) and
  for a single member (plain residual quantiles); Spearman's correlation of the ensemble's spread
  with its absolute error;
- binary (TPSA above the training median): the test split's expected calibration error before
  and after temperature scaling and isotonic regression, both fitted on the validation split.

- with ``--heads``: one model trained with ``loss=mve`` (mean-variance estimation) and one with
  ``loss=evidential`` (deep evidential regression), each predicting its own std: test RMSE, the
  coverage of the Gaussian intervals ``mean ± z·std`` their std gives, the coverage of
  split-conformal intervals normalised by that std (fitted on the validation split), and
  Spearman's correlation of the std with the absolute error.

``--plot`` draws predicted against true TPSA with the ensemble's 90% intervals for the test
molecules (PIL only).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pandas as pd
from hydra import compose, initialize_config_dir

from graphormer.cli import CONFIGS
from graphormer.cli.train import run as train_run
from graphormer.data.splits import random_split
from graphormer.inference.predictor import Predictor
from graphormer.testing import nci_table
from graphormer.training.evaluation import evaluate, score_members
from graphormer.uncertainty import conformal_radius, spearman

LEVELS = ("0.8", "0.9", "0.95")


def train(work: Path, name: str, csv: Path, epochs: int, *overrides: str) -> dict:
    values = [
        "dataset=smiles_csv",
        f"dataset.path={csv}",
        f"dataset.root={work / 'data'}",
        "dataset.split=random",
        "dataset.split_ratios=[0.6,0.2,0.2]",
        "model=graphormer_tiny",
        "optim.lr=3e-3",
        f"trainer.max_epochs={epochs}",
        "trainer.enable_progress_bar=false",
        f"output_dir={work / name}",
        "~logger",
        *overrides,
    ]
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=values)
    return train_run(cfg)


def coverage_line(label: str, found: dict) -> str:
    cells = []
    for level in LEVELS:
        entry = found["intervals"][level]["tpsa"]
        cells.append(
            f"{float(level):.0%}: {entry['coverage']:.1%} (width {entry['mean_width']:.1f})"
        )
    return f"{label:<34}" + "  ".join(cells)


def heads(work: Path, csv: Path, epochs: int) -> None:
    """The spread heads (``loss=mve``, ``loss=evidential``) on the same molecules and split."""
    data = pd.read_csv(csv)
    split = random_split(len(data), (0.6, 0.2, 0.2), 0)
    for loss in ("mve", "evidential"):
        found = train(work, loss, csv, epochs, "dataset.targets=[tpsa]", f"loss={loss}")
        predictor = Predictor.from_checkpoint(found["best_checkpoint"], device="cpu")
        result = {}
        for name in ("valid", "test"):
            rows = split[name].numpy()
            run = predictor.run(data.smiles.iloc[rows].tolist())
            result[name] = (data.tpsa.iloc[rows].to_numpy(), run.values[:, 0], run.std[:, 0])
        y, mean, std = result["test"]
        error = np.abs(y - mean)
        gaussian, conformal = [], []
        for level in map(float, LEVELS):
            z = NormalDist().inv_cdf(0.5 + level / 2)
            gaussian.append(f"{float(level):.0%}: {(error <= z * std).mean():.1%}")
            vy, vmean, vstd = result["valid"]
            q = conformal_radius(np.abs(vy - vmean) / vstd, level)
            conformal.append(f"{float(level):.0%}: {(error <= q * std).mean():.1%}")
        rmse = float(np.sqrt(np.mean(error**2)))
        print(
            f"loss={loss}: test RMSE {rmse:.2f}, Spearman(std, |error|) {spearman(std, error):.3f}"
        )
        print(f"  {'its Gaussian intervals':<32}" + "  ".join(gaussian))
        print(f"  {'std-normalised conformal':<32}" + "  ".join(conformal))


def plot(path: Path, y: np.ndarray, mean: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> None:
    from PIL import Image, ImageDraw

    size, margin = 640, 60
    top = float(max(y.max(), upper.max())) * 1.02
    low = min(0.0, float(min(y.min(), lower.min())))

    def at(x: float, v: float) -> tuple[float, float]:
        v = min(max(v, low), top)  # bars beyond the frame end at it
        span = size - 2 * margin
        return margin + (x - low) / (top - low) * span, size - margin - (v - low) / (
            top - low
        ) * span

    image = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(image)
    draw.rectangle([margin, margin, size - margin, size - margin], outline="black")
    draw.line([at(low, low), at(top, top)], fill=(150, 150, 150), width=1)
    inside = (y >= lower) & (y <= upper)
    for t, m, lo, hi, ok in zip(y, mean, lower, upper, inside, strict=True):
        colour = (70, 110, 200) if ok else (210, 60, 60)
        draw.line([at(t, lo), at(t, hi)], fill=colour + (0,), width=1)
        x, v = at(t, m)
        draw.ellipse([x - 2, v - 2, x + 2, v + 2], fill=colour)
    for tick in range(0, int(top) + 1, 50):
        x, _ = at(tick, low)
        _, v = at(low, tick)
        draw.text((x - 8, size - margin + 6), str(tick), fill="black")
        draw.text((margin - 28, v - 6), str(tick), fill="black")
    draw.text((size / 2 - 60, size - 28), "true TPSA (A^2)", fill="black")
    draw.text((8, 20), "predicted TPSA (A^2) with its 90% interval, ensemble", fill="black")
    draw.text(
        (margin + 8, margin + 8),
        f"{inside.mean():.0%} of {len(y)} test molecules inside (red: outside)",
        fill="black",
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--molecules", type=int, default=2000)
    parser.add_argument("--members", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--heads", action="store_true", help="also the mve and evidential heads")
    parser.add_argument("--only-heads", action="store_true", help="the heads alone")
    args = parser.parse_args()
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    table = nci_table().iloc[: args.molecules].copy()
    table["polar"] = (table.tpsa > table.tpsa.median()).astype(float)
    csv = work / "tpsa.csv"
    table.to_csv(csv, index=False)
    if args.only_heads:
        heads(work, csv, args.epochs)
        return

    ensemble = train(
        work,
        "ensemble",
        csv,
        args.epochs,
        "dataset.targets=[tpsa]",
        f"ensemble.size={args.members}",
    )
    tests = [m["test"]["rmse"] for m in ensemble["members"]]
    print(
        f"molecules: {len(table)} (random split 60/20/20), {args.members} members, {args.epochs} epochs"
    )
    print("members' test RMSE: " + ", ".join(f"{v:.2f}" for v in tests))
    print(
        f"single model (members' mean) test RMSE {np.mean(tests):.2f}; ensemble {ensemble['test']['rmse']:.2f}"
    )
    found = ensemble["uncertainty"]["test"]
    print(coverage_line("ensemble, normalised intervals", found))
    member = work / "ensemble" / "members" / "0"
    single = evaluate(member, split="test", output=work / "member0.json", accelerator="cpu")
    print(coverage_line("single model, residual intervals", single["uncertainty"]["test"]))
    print(f"Spearman(ensemble std, |error|) on test: {found['std_error_spearman']['tpsa']:.3f}")

    binary = train(
        work,
        "binary",
        csv,
        args.epochs,
        "dataset.targets=[polar]",
        "dataset.task_type=binary",
        "calibration=temperature",
    )
    best = Path(binary["best_checkpoint"])
    for method in ("temperature", "isotonic"):
        # Fitted on the validation split, scored on the test split (the run keeps its own).
        folder = work / f"binary_{method}"
        folder.mkdir(exist_ok=True)
        result = score_members(
            [best],
            splits=["test"],
            accelerator="cpu",
            fit_calibration=method,
            calibration_dir=folder,
        )
        ece = result["uncertainty"]["test"]
        print(
            f"binary test ROC-AUC {result['test']['rocauc']:.3f}: ECE {ece['ece_before']['polar']:.4f} "
            f"-> {ece['ece_after']['polar']:.4f} after {method}"
        )

    if args.heads:
        heads(work, csv, args.epochs)

    if args.plot:
        predictor = Predictor.from_checkpoint(work / "ensemble", device="cpu")
        data = pd.read_csv(csv)
        # The test molecules of the seeded split, as training drew them.
        split = random_split(len(data), (0.6, 0.2, 0.2), 0)["test"].numpy()
        result = predictor.run(data.smiles.iloc[split].tolist(), interval=0.9)
        plot(
            args.plot,
            data.tpsa.iloc[split].to_numpy(),
            result.values[:, 0],
            result.lower[:, 0],
            result.upper[:, 0],
        )
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
