"""Does pre-training help? Graphormer-slim from scratch against pre-train-then-fine-tune, offline.

    python benchmarks/pretrain_finetune.py --work /tmp/pretrain [--epochs 12] [--finetune-size 300]

Real molecules (rdkit's NCI set, 4,991 that parse) with targets rdkit computes:

- pre-training set: 4,000 molecules, nine descriptors at once (Crippen logP and molar
  refractivity, TPSA, H-bond donors and acceptors, rotatable bonds, rings, aromatic rings, heavy
  atoms), a supervised multi-task regression;
- fine-tuning set: other molecules (none of the pre-training ones), a target the pre-training
  never saw: QED, the drug-likeness score built from such descriptors.

Both fine-tuning runs use the same molecules, split, model, schedule and seed; only the
initialisation differs (``pretrained=`` the pre-training run's best checkpoint). Prints both test
RMSEs side by side, and the mean predictor's RMSE for scale.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
DESCRIPTORS = [
    "MolLogP",
    "MolMR",
    "TPSA",
    "NumHDonors",
    "NumHAcceptors",
    "NumRotatableBonds",
    "RingCount",
    "NumAromaticRings",
    "HeavyAtomCount",
]


def build(work: Path, finetune_size: int) -> tuple[Path, Path]:
    from rdkit import Chem, RDLogger
    from rdkit.Chem import QED, Descriptors

    from graphormer.testing import nci_smiles

    RDLogger.DisableLog("rdApp.*")
    smiles = list(nci_smiles())
    rng = np.random.default_rng(0)
    order = rng.permutation(len(smiles))
    pretrain, finetune = order[:4000], order[4000 : 4000 + finetune_size]
    rows = []
    for i in range(len(smiles)):
        mol = Chem.MolFromSmiles(smiles[i])
        row = {"smiles": smiles[i]}
        row.update({name: float(getattr(Descriptors, name)(mol)) for name in DESCRIPTORS})
        row["qed"] = float(QED.qed(mol))
        rows.append(row)
    table = pd.DataFrame(rows)
    work.mkdir(parents=True, exist_ok=True)
    pre, fine = work / "pretrain.csv", work / "finetune.csv"
    table.iloc[pretrain][["smiles", *DESCRIPTORS]].to_csv(pre, index=False)
    table.iloc[finetune][["smiles", "qed"]].to_csv(fine, index=False)
    return pre, fine


def train(work: Path, name: str, *overrides: str) -> dict:
    out = work / name
    if not (out / "metrics.json").is_file():
        command = [sys.executable, str(REPO / "scripts" / "train.py"), f"hydra.run.dir={out}"]
        result = subprocess.run([*command, *overrides], capture_output=True, text=True)
        if result.returncode:
            raise SystemExit(f"{name} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return json.loads((out / "metrics.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=12, help="pre-training epochs")
    parser.add_argument("--finetune-epochs", type=int, default=30)
    parser.add_argument("--finetune-size", type=int, default=300)
    args = parser.parse_args()
    pre, fine = build(args.work, args.finetune_size)
    common = ["model=graphormer_slim", "datamodule.batch_size=64", "seed=0"]
    pretrained = train(
        args.work,
        "pretrain",
        *common,
        "dataset=smiles_csv",
        f"dataset.path={pre}",
        f"dataset.targets=[{','.join(DESCRIPTORS)}]",
        "dataset.split=random",
        f"dataset.root={args.work / 'cache'}",
        f"trainer.max_epochs={args.epochs}",
        "optim.lr=1e-3",
    )
    finetune = [
        *common,
        "dataset=smiles_csv",
        f"dataset.path={fine}",
        "dataset.targets=[qed]",
        f"dataset.root={args.work / 'cache'}",
        f"trainer.max_epochs={args.finetune_epochs}",
        "optim.lr=5e-4",
    ]
    scratch = train(args.work, "scratch", *finetune)
    tuned = train(args.work, "finetuned", *finetune, f"pretrained={pretrained['best_checkpoint']}")
    qed = pd.read_csv(fine)["qed"].to_numpy()
    print(f"pre-training: {len(DESCRIPTORS)} descriptors of 4,000 molecules, {args.epochs} epochs")
    print(f"fine-tuning: QED of {len(qed)} other molecules (std {qed.std():.3f}), scaffold split")
    print(f"{'':<24}{'valid rmse':>12}{'test rmse':>12}")
    for label, result in (("from scratch", scratch), ("pre-trained, fine-tuned", tuned)):
        print(f"{label:<24}{result['valid']['rmse']:>12.4f}{result['test']['rmse']:>12.4f}")


if __name__ == "__main__":
    main()
