"""Real molecules and model presets for tests and benchmarks (one copy, imported by both).

rdkit's wheel ships real molecules: ``NCI/first_5K.smi`` (5,000 SMILES) and ``first_5k.tpsa.csv``
(their topological polar surface area). This module featurises them with OGB's ``smiles2graph`` and
writes them in OGB's on-disk layout, so that tests run the real OGB loading code offline.
"""

from __future__ import annotations

import gzip
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from ogb.utils import smiles2graph
from rdkit import Chem, RDConfig, RDLogger
from torch_geometric.data import Data

__all__ = [
    "CONFIGS",
    "NCI_SMILES",
    "NCI_TPSA",
    "model_preset",
    "nci_graphs",
    "nci_ogb_dataset",
    "nci_smiles",
    "nci_pcqm4mv2",
    "nci_table",
    "to_data",
    "write_ogb_layout",
    "write_pcqm4mv2_layout",
]

# The repository's configs/ folder (an editable install, as the README sets up).
CONFIGS = Path(__file__).resolve().parents[1] / "configs"

NCI_SMILES = Path(RDConfig.RDDataDir) / "NCI" / "first_5K.smi"
NCI_TPSA = Path(RDConfig.RDDataDir) / "NCI" / "first_5k.tpsa.csv"


@lru_cache(maxsize=1)
def nci_table() -> pd.DataFrame:
    """rdkit's NCI molecules that parse and have a TPSA value: columns ``smiles``, ``tpsa``."""
    RDLogger.DisableLog("rdApp.*")
    table = pd.read_csv(NCI_TPSA, skiprows=1, header=None, names=["smiles", "tpsa"])
    valid = [
        Chem.MolFromSmiles(s) is not None and t == t
        for s, t in zip(table.smiles, table.tpsa, strict=True)
    ]
    return table[valid].reset_index(drop=True)


@lru_cache(maxsize=1)
def nci_smiles() -> tuple[str, ...]:
    """The SMILES of ``first_5K.smi`` that current rdkit parses (4,991 of 4,999)."""
    RDLogger.DisableLog("rdApp.*")
    lines = NCI_SMILES.read_text().splitlines()
    smiles = [line.split()[0] for line in lines if line.strip()]
    return tuple(s for s in smiles if Chem.MolFromSmiles(s) is not None)


@lru_cache(maxsize=4)
def nci_graphs(limit: int | None = None) -> tuple[dict, ...]:
    """OGB featurisations (``smiles2graph``) of the first ``limit`` valid NCI molecules."""
    return tuple(smiles2graph(s) for s in nci_smiles()[:limit])


def to_data(graph: dict, y: float | None = None) -> Data:
    data = Data(
        x=torch.from_numpy(graph["node_feat"]),
        edge_index=torch.from_numpy(graph["edge_index"]),
        edge_attr=torch.from_numpy(graph["edge_feat"]),
        num_nodes=graph["num_nodes"],
    )
    if y is not None:
        data.y = torch.tensor([[y]], dtype=torch.float)
    return data


def write_ogb_layout(root: Path, name: str, smiles: list[str], labels: np.ndarray) -> Path:
    """Writes molecules as OGB's raw files for dataset ``name`` under ``root`` and returns its folder.

    The layout is OGB's own (``raw/*.csv.gz`` with each bond once, ``split/scaffold/*.csv.gz``,
    ``mapping/mol.csv.gz``, ``RELEASE_v1.txt``), so the real ``PygGraphPropPredDataset`` reads it.
    """
    folder = root / "_".join(name.split("-"))
    (folder / "raw").mkdir(parents=True, exist_ok=True)
    (folder / "split" / "scaffold").mkdir(parents=True, exist_ok=True)
    (folder / "mapping").mkdir(parents=True, exist_ok=True)
    graphs = [smiles2graph(s) for s in smiles]
    edges, edge_feats, node_feats = [], [], []
    for g in graphs:
        # OGB lists each bond once; the loader adds the reverse edge (add_inverse_edge=True).
        once = slice(None, None, 2)
        edges.append(g["edge_index"][:, once].T)
        edge_feats.append(g["edge_feat"][once])
        node_feats.append(g["node_feat"])

    def write(path: Path, array: np.ndarray) -> None:
        with gzip.open(path, "wt") as f:
            pd.DataFrame(array).to_csv(f, header=False, index=False)

    write(folder / "raw" / "edge.csv.gz", np.concatenate(edges))
    write(folder / "raw" / "edge-feat.csv.gz", np.concatenate(edge_feats))
    write(folder / "raw" / "node-feat.csv.gz", np.concatenate(node_feats))
    write(folder / "raw" / "num-node-list.csv.gz", np.array([g["num_nodes"] for g in graphs]))
    write(
        folder / "raw" / "num-edge-list.csv.gz",
        np.array([g["edge_index"].shape[1] // 2 for g in graphs]),
    )
    labels = np.asarray(labels, dtype=float).reshape(len(smiles), -1)
    with gzip.open(folder / "raw" / "graph-label.csv.gz", "wt") as f:
        pd.DataFrame(labels).to_csv(f, header=False, index=False, na_rep="")
    n = len(smiles)
    order = np.arange(n)
    cut1, cut2 = int(0.8 * n), int(0.9 * n)
    for split, idx in (
        ("train", order[:cut1]),
        ("valid", order[cut1:cut2]),
        ("test", order[cut2:]),
    ):
        write(folder / "split" / "scaffold" / f"{split}.csv.gz", idx)
    with gzip.open(folder / "mapping" / "mol.csv.gz", "wt") as f:
        pd.DataFrame({"smiles": smiles}).to_csv(f, index=False)
    (folder / "RELEASE_v1.txt").write_text("")
    return folder


def nci_ogb_dataset(root: Path, name: str = "ogbg-molhiv", limit: int = 400) -> Path:
    """An OGB-layout copy of ``name`` made of NCI molecules. Classification labels are
    ``TPSA > median`` (a real, learnable property), regression labels the TPSA itself."""
    table = nci_table().iloc[:limit]
    tpsa = table.tpsa.to_numpy()
    from graphormer.data.ogb import ogb_task_info

    task = ogb_task_info(name)
    if task.is_classification:
        # Task t thresholds TPSA at a different quantile; multi-task sets miss ~20% of labels.
        quantiles = np.linspace(0.3, 0.7, task.num_tasks) if task.num_tasks > 1 else [0.5]
        labels = np.stack([(tpsa > np.quantile(tpsa, q)).astype(float) for q in quantiles], 1)
        if task.num_tasks > 1:
            missing = np.random.default_rng(0).random(labels.shape) < 0.2
            labels[missing] = np.nan
    else:
        labels = tpsa[:, None].repeat(task.num_tasks, 1)
    return write_ogb_layout(root, name, table.smiles.tolist(), labels)


def model_preset(name: str) -> dict:
    """A model preset from ``configs/model/<name>.yaml``, composed by Hydra (defaults resolved)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=[f"model={name}", "output_dir=."])
    return OmegaConf.to_container(cfg.model, resolve=True)


def write_pcqm4mv2_layout(
    root: Path, smiles: list[str], gaps: np.ndarray, sizes: dict[str, int]
) -> Path:
    """Writes molecules in OGB-LSC's PCQM4Mv2 layout under ``root`` (``pcqm4m-v2/raw/data.csv.gz``
    with ``idx,smiles,homolumogap``, ``split_dict.pt`` of numpy index arrays as OGB ships it,
    ``RELEASE_v1.txt``), splits in the order train, valid, test-dev, test-challenge; the test
    splits' gaps are left empty, as in OGB's file."""
    folder = Path(root) / "pcqm4m-v2"
    (folder / "raw").mkdir(parents=True, exist_ok=True)
    n = len(smiles)
    assert sum(sizes.values()) == n, (sizes, n)
    bounds = np.cumsum([0, *sizes.values()])
    split = {k: np.arange(bounds[i], bounds[i + 1]) for i, k in enumerate(sizes)}
    gaps = np.asarray(gaps, dtype=float).copy()
    for name in ("test-dev", "test-challenge"):
        gaps[split.get(name, [])] = np.nan
    table = pd.DataFrame({"idx": np.arange(n), "smiles": list(smiles), "homolumogap": gaps})
    table.to_csv(folder / "raw" / "data.csv.gz", index=False, compression="gzip")
    torch.save(split, folder / "split_dict.pt")
    (folder / "RELEASE_v1.txt").write_text("")
    return folder


def nci_pcqm4mv2(root: Path, limit: int = 300) -> Path:
    """A PCQM4Mv2-layout dataset of NCI molecules whose "gap" is a real computed property (TPSA,
    scaled to eV-like values), split 70/10/10/10."""
    table = nci_table().iloc[:limit]
    n = len(table)
    sizes = {"train": n - 3 * (n // 10), "valid": n // 10, "test-dev": n // 10}
    sizes["test-challenge"] = n // 10
    gaps = 3.0 + table.tpsa.to_numpy() / 40.0
    return write_pcqm4mv2_layout(root, table.smiles.tolist(), gaps, sizes)
