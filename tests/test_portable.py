"""The numpy twins of the torch data path (issue 40): what the ONNX predictor computes without
torch equals what training and the Predictor compute."""

import subprocess
import sys

import numpy as np
import pytest

from graphormer.data.collate import GraphormerCollator
from graphormer.data.featurize import featurize_smiles
from graphormer.portable.dense import INPUT_NAMES, dense_inputs
from graphormer.portable.molecules import blocked_rdkit_logs, featurize_one

from helpers import REPO, nci_smiles


@pytest.mark.parametrize("pad_to_multiple", [1, 8])
def test_dense_inputs_equal_the_collator(pad_to_multiple):
    """The numpy batch is the collator's, array for array (salts: unreachable pairs)."""
    smiles = [*nci_smiles()[:46], "C[N+](C)(C)C.[Cl-]", "O"]
    with blocked_rdkit_logs():
        graphs = [featurize_one(s, None)[0] for s in smiles]
    found = dense_inputs(graphs, max_hops=5, pad_to_multiple=pad_to_multiple)
    batch = GraphormerCollator(max_hops=5, pad_to_multiple=pad_to_multiple)(
        featurize_smiles(smiles).graphs
    )
    for name in INPUT_NAMES:
        expected = getattr(batch, name).numpy()
        assert found[name].shape == expected.shape, name
        np.testing.assert_array_equal(found[name], expected.astype(found[name].dtype), name)


def test_the_portable_modules_load_without_torch():
    """The ONNX predictor reads a run's calibration (intervals, calibrated probabilities): none
    of graphormer.portable may import torch, or a deployment would need it after all."""
    code = (
        "import sys, graphormer.portable.calibration, graphormer.portable.onnx_predictor\n"
        "import graphormer.portable.dense, graphormer.portable.paths\n"
        "loaded = [m for m in ('torch', 'lightning', 'torch_geometric') if m in sys.modules]\n"
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
