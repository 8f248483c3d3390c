"""benchmarks/docs_pictures.py: the worked examples' tables it trains the pictures' models on."""

import ast
import sys
from pathlib import Path

import pandas as pd
from rdkit import Chem

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import docs_pictures  # noqa: E402


def test_the_tables_hold_one_label_per_atom_and_per_bond_of_each_example_molecule(tmp_path):
    charges, rotatable = docs_pictures._write_tables(tmp_path)
    atoms, bonds = pd.read_csv(charges), pd.read_csv(rotatable)
    # The first 400 lines of rdkit's NCI file, less those that do not parse or exceed 40 atoms.
    assert 300 < len(atoms) < 400 and list(atoms.smiles) == list(bonds.smiles)
    for smiles, charge, rotatable_cell in zip(
        atoms.smiles, atoms.charge, bonds.rotatable, strict=True
    ):
        mol = Chem.MolFromSmiles(smiles)
        assert mol.GetNumAtoms() <= 40
        if isinstance(charge, str):  # else empty: a charge rdkit could not compute
            assert len(ast.literal_eval(charge)) == mol.GetNumAtoms()
        labels = ast.literal_eval(rotatable_cell)
        assert len(labels) == mol.GetNumBonds() and set(labels) <= {0, 1}
    # The ester's C-O, O-C and C-ring bonds, as the bond example's printout names them.
    assert docs_pictures.rotatable_bonds("CCOC(=O)c1ccccc1") == [0, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0]
