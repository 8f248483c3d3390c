"""Shared helpers for the benchmarks: rdkit's NCI molecules featurised by OGB."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from ogb.utils import smiles2graph
from rdkit import Chem, RDConfig, RDLogger
from torch_geometric.data import Data


def nci_molecules() -> list[dict]:
    """OGB featurisations of the SMILES in rdkit's ``NCI/first_5K.smi`` that rdkit parses."""
    RDLogger.DisableLog("rdApp.*")
    path = Path(RDConfig.RDDataDir) / "NCI" / "first_5K.smi"
    smiles = [line.split()[0] for line in path.read_text().splitlines() if line.strip()]
    return [smiles2graph(s) for s in smiles if Chem.MolFromSmiles(s) is not None]


def to_data(graph: dict, y: float = 0.0) -> Data:
    return Data(
        x=torch.from_numpy(graph["node_feat"]),
        edge_index=torch.from_numpy(graph["edge_index"]),
        edge_attr=torch.from_numpy(graph["edge_feat"]),
        y=torch.tensor([[y]]),
        num_nodes=graph["num_nodes"],
    )


def model_preset(name: str) -> dict:
    """A model preset from ``configs/model/<name>.yaml``, composed by Hydra (defaults resolved)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    configs = Path(__file__).resolve().parents[1] / "configs"
    with initialize_config_dir(config_dir=str(configs), version_base="1.3"):
        cfg = compose("train", overrides=[f"model={name}", "output_dir=."])
    return OmegaConf.to_container(cfg.model, resolve=True)


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
