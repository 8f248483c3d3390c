import os
import sys
from pathlib import Path

import pytest

# tests/helpers.py holds the helpers the tests share.
sys.path.insert(0, str(Path(__file__).parent))

# Keep test runs quiet and fast on 2 cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from helpers import (  # noqa: E402
    TINY,
    nci_ogb_dataset,
    nci_table,
    run_script,
    untrained_checkpoint,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def ogb_root(tmp_path_factory) -> Path:
    """A dataset root holding OGB-layout ogbg-molhiv (binary), ogbg-molesol (regression) and
    ogbg-moltox21 (12 binary tasks with missing labels) made of rdkit's NCI molecules."""
    root = tmp_path_factory.mktemp("ogb")
    nci_ogb_dataset(root, "ogbg-molhiv", limit=400)
    nci_ogb_dataset(root, "ogbg-molesol", limit=300)
    nci_ogb_dataset(root, "ogbg-moltox21", limit=305)  # 12 tasks, missing labels, odd splits
    return root


@pytest.fixture(scope="session")
def nci_csv(tmp_path_factory) -> Path:
    """A SMILES CSV with a header, real TPSA targets, a few missing targets and invalid SMILES."""
    table = nci_table().iloc[:300].copy()
    table.loc[[5, 17], "tpsa"] = float("nan")
    table["binary"] = (table.tpsa > table.tpsa.median()).astype(float)
    table.loc[[5, 17], "binary"] = float("nan")
    bad = table.iloc[:3].copy()
    bad["smiles"] = ["C1CC", "not_a_smiles", "[Xx]"]
    rows = [table.iloc[:10], bad.iloc[:1], table.iloc[10:40], bad.iloc[1:], table.iloc[40:]]
    import pandas as pd

    csv = tmp_path_factory.mktemp("csv") / "molecules.csv"
    pd.concat(rows).to_csv(csv, index=False)
    return csv


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, ogb_root):
    """train.py on OGB-layout ogbg-molhiv (real NCI molecules) with a tiny model, as a user runs
    it: ``(work folder, run folder, output)``. Shared: tests read it, never change it."""
    work = tmp_path_factory.mktemp("train")
    out = work / "run"
    log = run_script(
        "train.py",
        [
            "dataset=ogbg-molhiv",
            f"dataset.root={ogb_root}",
            "trainer.max_epochs=3",
            f"hydra.run.dir={out}",
            *TINY,
        ],
        cwd=work,
    )
    return work, out, log


@pytest.fixture(scope="session")
def ddp_run(tmp_path_factory, ogb_root):
    """train.py under DDP on the CPU (two ranks), as a user runs it: OGB-layout ogbg-moltox21
    (12 tasks with missing labels), 2 epochs, FLAG on (``flag.m=2``), evaluation batches of 5 so
    that the ranks' shards are uneven: ``(run folder, output)``. One launch of two processes for
    the tests of DDP's evaluation and of FLAG under DDP. Shared: tests read it, never change it."""
    work = tmp_path_factory.mktemp("ddp")
    out = work / "run"
    log = run_script(
        "train.py",
        [
            "dataset=ogbg-moltox21",
            f"dataset.root={ogb_root}",
            "trainer=ddp",
            "trainer.accelerator=cpu",
            "trainer.devices=2",
            "trainer.max_epochs=2",
            "datamodule.eval_batch_size=5",
            "flag.m=2",
            f"hydra.run.dir={out}",
            *TINY,
        ],
        cwd=work,
    )
    return out, log


@pytest.fixture(scope="session")
def esol_checkpoint(tmp_path_factory, ogb_root) -> Path:
    """An untrained ogbg-molesol model whose standardisation statistics are far from (0, 1), so
    that a prediction path that forgets them is caught. Shared: tests read it, never change it."""
    path = tmp_path_factory.mktemp("esol") / "esol.ckpt"
    return untrained_checkpoint(
        path, ["dataset=ogbg-molesol", f"dataset.root={ogb_root}"], [-3.0], [2.5]
    )
