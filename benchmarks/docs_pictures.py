"""The documentation's pictures, made again from scratch and offline by the commands the docs give.

    python benchmarks/docs_pictures.py                       # all of them into docs/images/
    python benchmarks/docs_pictures.py --out /tmp/pictures --work /tmp/pictures-work
    python benchmarks/docs_pictures.py --only atoms bonds    # some of them

Each picture comes from the worked example whose figures the docs quote, run through the real
commands (``scripts/train.py``, ``scripts/explain.py``, ``benchmarks/uncertainty.py``) on one thread:

- ``atoms``: Gasteiger charges of rdkit's NCI molecules (the first 400 lines of ``first_5K.smi``,
  at most 40 atoms) as an atom target, ``graphormer_tiny``, 12 epochs; ``explain.py`` on
  paracetamol writes ``atoms_charge.png``, kept as ``atoms_paracetamol.png``;
- ``bonds``: rdkit's rotatable-bond rule on the same lines as a binary bond target, 8 epochs;
  ``explain.py`` on phenacetin writes ``bonds_rotatable.png``, kept as ``bonds_phenacetin.png``;
- ``demo``: the offline demo (``experiment=demo``: TPSA); ``explain.py`` on aspirin writes
  ``layers.png`` and ``contributions_tpsa.png``, kept as ``explain_aspirin.png`` and
  ``contributions_aspirin.png``;
- ``uncertainty``: ``benchmarks/uncertainty.py --epochs 16 --plot``, a five-member ensemble on
  2,000 NCI molecules' TPSA, drawn as ``uncertainty_tpsa.png``.

Runs and data go to ``--work`` (a temporary folder unless given). Takes about 10 to 20 minutes on
2 cores, most of it the ensemble. Pictures of a run on another machine can differ in detail: the
training runs are deterministic on one machine, not across machines.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import pandas as pd
from atom_bond_targets import gasteiger_charges

from graphormer.testing import NCI_SMILES, rotatable_bonds

from common import REPO, run_timed, train_command

PICTURES = ("atoms", "bonds", "demo", "uncertainty")

# The worked examples' molecules: the first lines of rdkit's NCI file, at most 40 atoms.
_LINES, _MAX_ATOMS = 400, 40


def _example_smiles() -> list[str]:
    from rdkit import Chem, RDLogger

    RDLogger.DisableLog("rdApp.*")
    smiles = [line.split()[0] for line in NCI_SMILES.read_text().splitlines()[:_LINES]]
    return [
        s
        for s in smiles
        if (mol := Chem.MolFromSmiles(s)) is not None and mol.GetNumAtoms() <= _MAX_ATOMS
    ]


def _list_cell(values: list[float] | None, fmt: str) -> str | None:
    return None if values is None else "[" + ", ".join(format(v, fmt) for v in values) + "]"


def _write_tables(work: Path) -> tuple[Path, Path]:
    """``charges.csv`` and ``rotatable.csv`` of the atom and bond worked examples."""
    from rdkit import Chem

    smiles = _example_smiles()
    charges = work / "charges.csv"
    pd.DataFrame(
        {
            "smiles": smiles,
            "charge": [_list_cell(gasteiger_charges(Chem.MolFromSmiles(s)), ".4f") for s in smiles],
        }
    ).to_csv(charges, index=False)
    rotatable = work / "rotatable.csv"
    pd.DataFrame(
        {"smiles": smiles, "rotatable": [_list_cell(rotatable_bonds(s), "d") for s in smiles]}
    ).to_csv(rotatable, index=False)
    return charges, rotatable


def _train(work: Path, name: str, *overrides: str) -> Path:
    """``scripts/train.py`` into ``work/name``; its best checkpoint."""
    out = work / name
    run_timed(train_command(out, f"dataset.root={work / 'data'}", *overrides), f"training {name}")
    return Path(json.loads((out / "metrics.json").read_text())["best_checkpoint"])


def _explain(work: Path, name: str, ckpt: Path, smiles: str) -> Path:
    """``scripts/explain.py`` on one molecule; the folder of its pictures."""
    out = work / f"explain_{name}"
    command = [
        sys.executable,
        str(REPO / "scripts" / "explain.py"),
        f"ckpt={ckpt}",
        f'smiles="{smiles}"',
        f"output={out}",
        f"hydra.run.dir={work / 'hydra' / name}",
        "device=cpu",
    ]
    run_timed(command, f"explaining {name}")
    return out / "mol_0"


def _keep(made: Path, out: Path, name: str) -> None:
    shutil.copyfile(made, out / name)
    print(f"{out / name}  (from {made})", flush=True)


def make(picture: str, work: Path, out: Path) -> None:
    if picture in ("atoms", "bonds"):
        charges, rotatable = _write_tables(work)
    if picture == "atoms":
        ckpt = _train(
            work,
            "charges",
            "dataset=smiles_csv",
            f"dataset.path={charges}",
            "dataset.targets=[]",
            "dataset.atom_targets=[charge]",
            "dataset.atom_task_type=regression",
            "model=graphormer_tiny",
            "optim.lr=2e-3",
            "trainer.max_epochs=12",
        )
        folder = _explain(work, "paracetamol", ckpt, "CC(=O)Nc1ccc(O)cc1")
        _keep(folder / "atoms_charge.png", out, "atoms_paracetamol.png")
    elif picture == "bonds":
        ckpt = _train(
            work,
            "rotatable",
            "dataset=smiles_csv",
            f"dataset.path={rotatable}",
            "dataset.targets=[]",
            "dataset.bond_targets=[rotatable]",
            "dataset.bond_task_type=binary",
            "model=graphormer_tiny",
            "optim.lr=2e-3",
            "trainer.max_epochs=8",
        )
        folder = _explain(work, "phenacetin", ckpt, "CC(=O)Nc1ccc(OCC)cc1")
        _keep(folder / "bonds_rotatable.png", out, "bonds_phenacetin.png")
    elif picture == "demo":
        ckpt = _train(work, "demo", "experiment=demo")
        folder = _explain(work, "aspirin", ckpt, "CC(=O)Oc1ccccc1C(=O)O")
        _keep(folder / "layers.png", out, "explain_aspirin.png")
        _keep(folder / "contributions_tpsa.png", out, "contributions_aspirin.png")
    else:
        command = [
            sys.executable,
            str(REPO / "benchmarks" / "uncertainty.py"),
            f"--work={work / 'uncertainty'}",
            "--epochs=16",
            f"--plot={out / 'uncertainty_tpsa.png'}",
        ]
        # Its figures go with the picture in the docs: print them.
        run_timed(command, "benchmarks/uncertainty.py", show=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=REPO / "docs" / "images", help="the pictures' folder"
    )
    parser.add_argument("--work", type=Path, default=None, help="runs and data (default: a temp)")
    parser.add_argument("--only", nargs="+", choices=PICTURES, default=list(PICTURES))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as temporary:
        work = (args.work or Path(temporary)).resolve()
        work.mkdir(parents=True, exist_ok=True)
        for picture in args.only:
            make(picture, work, args.out.resolve())


if __name__ == "__main__":
    main()
