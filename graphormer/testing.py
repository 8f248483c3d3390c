"""Real molecules and model presets for tests and benchmarks (one copy, imported by both).

rdkit's wheel ships real molecules: ``NCI/first_5K.smi`` (5,000 SMILES) and ``first_5k.tpsa.csv``
(their topological polar surface area). This module featurises them with OGB's ``smiles2graph`` and
writes them in OGB's on-disk layout, so that tests run the real OGB loading code offline.
"""

from __future__ import annotations

import gzip
import pickle
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
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
    "emt_slabs",
    "write_aselmdb",
    "write_oc20_layout",
    "NCI_TPSA",
    "emt_frames",
    "model_preset",
    "nci_graphs",
    "nci_ogb_dataset",
    "nci_smiles",
    "nci_pcqm4mv2",
    "nci_rotatable_bonds",
    "rotatable_bonds",
    "nci_table",
    "nci_zinc",
    "nci_zinc_molecules",
    "nci_tu",
    "nci_zinc_splits",
    "protein_like_graphs",
    "shape_graphs",
    "to_data",
    "write_ogb_layout",
    "write_lrgb_layout",
    "write_pcqm4mv2_layout",
    "write_ppa_layout",
    "write_tu_layout",
    "write_zinc_layout",
    "zinc_molecule",
]

# The repository's configs/ folder (an editable install, as the README sets up).
CONFIGS = Path(__file__).resolve().parent / "configs"

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
    from graphormer.data.sources.ogb import ogb_task_info

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
    """A model preset from ``configs/model/<name>.yaml``, composed by Hydra (defaults resolved;
    ``num_layers: auto`` as for data that is not an analogue series: 12)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from graphormer.models.graphormer import resolve_depth

    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=[f"model={name}", "output_dir=."])
    preset = OmegaConf.to_container(cfg.model, resolve=True)
    preset["num_layers"] = resolve_depth(preset["num_layers"], analogues=False)
    return preset


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


def zinc_molecule(smiles: str) -> dict | None:
    """One molecule as ZINC's raw pickles hold it (``atom_type`` ``[N]`` long, the dense
    ``bond_type`` ``[N, N]`` long adjacency of kekulised bond types 1/2/3, ``num_atom``), or None
    when an atom has no type in ZINC's 28-type vocabulary or the molecule is in pieces. The
    target is left to :func:`nci_zinc_molecules`."""
    from graphormer.data.sources.zinc import ZINC_ATOM_TYPES

    vocabulary = {token: i for i, token in enumerate(ZINC_ATOM_TYPES)}
    mol = Chem.MolFromSmiles(smiles)
    if mol is None or mol.GetNumAtoms() == 0 or len(Chem.GetMolFrags(mol)) > 1:
        return None
    Chem.Kekulize(mol, clearAromaticFlags=True)
    types = []
    for atom in mol.GetAtoms():
        # ZINC writes an atom as SMILES brackets it: hydrogens and charge for charged or
        # chiral atoms ("C H1" is a stereocentre's [C@H]), the bare element otherwise.
        token = atom.GetSymbol()
        charge = atom.GetFormalCharge()
        if charge or atom.GetChiralTag() != Chem.ChiralType.CHI_UNSPECIFIED:
            hydrogens = atom.GetTotalNumHs()
            token += f" H{hydrogens}" if hydrogens else ""
            token += {0: "", 1: " +", -1: " -"}.get(charge, " ?")
        if token not in vocabulary:
            return None
        types.append(vocabulary[token])
    n = len(types)
    bonds = torch.zeros(n, n, dtype=torch.long)
    orders = {Chem.BondType.SINGLE: 1, Chem.BondType.DOUBLE: 2, Chem.BondType.TRIPLE: 3}
    for bond in mol.GetBonds():
        if bond.GetBondType() not in orders:
            return None
        i, j = bond.GetBeginAtomIdx(), bond.GetEndAtomIdx()
        bonds[i, j] = bonds[j, i] = orders[bond.GetBondType()]
    return {"atom_type": torch.tensor(types, dtype=torch.long), "bond_type": bonds, "num_atom": n}


@lru_cache(maxsize=2)
def nci_zinc_molecules(limit: int) -> tuple[dict, ...]:
    """The first ``limit`` NCI molecules that fit ZINC's vocabulary, in ZINC's raw format, with a
    real computed target in ``logP_SA_cycle_normalized``: Crippen logP minus the ring count (as
    ZINC's penalised logP subtracts cycles), standardised over these molecules."""
    from rdkit.Chem import Crippen, rdMolDescriptors

    RDLogger.DisableLog("rdApp.*")
    molecules, values = [], []
    for smiles in nci_table().smiles:
        molecule = zinc_molecule(smiles)
        if molecule is None:
            continue
        mol = Chem.MolFromSmiles(smiles)
        values.append(Crippen.MolLogP(mol) - rdMolDescriptors.CalcNumRings(mol))
        molecules.append(molecule)
        if len(molecules) == limit:
            break
    if len(molecules) < limit:
        raise ValueError(f"only {len(molecules)} NCI molecules fit ZINC's vocabulary")
    values = np.asarray(values)
    values = (values - values.mean()) / values.std()
    for molecule, value in zip(molecules, values, strict=True):
        molecule["logP_SA_cycle_normalized"] = torch.tensor([value], dtype=torch.float32)
    return tuple(molecules)


def nci_zinc_splits(
    sizes: tuple[int, int, int] = (300, 60, 60),
    subset_sizes: tuple[int, int, int] = (200, 40, 40),
    seed: int = 0,
) -> tuple[dict[str, list[dict]], dict[str, list[int]]]:
    """ZINC's ``train``/``val``/``test`` molecules (consecutive NCI molecules) and the subset's
    index lists (positions drawn without replacement, in random order, as index files list them)."""
    molecules = nci_zinc_molecules(sum(sizes))
    bounds = np.cumsum([0, *sizes])
    rng = np.random.default_rng(seed)
    splits, index = {}, {}
    for i, name in enumerate(("train", "val", "test")):
        splits[name] = list(molecules[bounds[i] : bounds[i + 1]])
        index[name] = rng.permutation(sizes[i])[: subset_sizes[i]].tolist()
    return splits, index


def write_zinc_layout(
    root: Path, splits: dict[str, list[dict]], index: dict[str, list[int]] | None = None
) -> Path:
    """Writes molecules in PyG's raw ZINC layout and returns ``root/ZINC``: ``raw/<split>.pickle``
    (a pickled list of molecule dicts, as ZINC's download holds them) and, for the subset,
    ``raw/<split>.index`` (one line of comma-separated positions)."""
    raw = Path(root) / "ZINC" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for name, molecules in splits.items():
        with open(raw / f"{name}.pickle", "wb") as f:
            pickle.dump(list(molecules), f)
    for name, positions in (index or {}).items():
        (raw / f"{name}.index").write_text(",".join(str(int(i)) for i in positions) + "\n")
    return raw.parent


def nci_zinc(
    root: Path,
    sizes: tuple[int, int, int] = (300, 60, 60),
    subset_sizes: tuple[int, int, int] = (200, 40, 40),
) -> Path:
    """A ZINC-layout dataset of real NCI molecules (see :func:`nci_zinc_splits`) under ``root``."""
    splits, index = nci_zinc_splits(sizes, subset_sizes)
    return write_zinc_layout(root, splits, index)


SHAPES = ("cycle", "tree", "ladder")


def shape_graphs(num_graphs: int, seed: int = 0, regression: bool = False) -> list[Data]:
    """Non-molecular graphs of three shape families (cycles, random trees, ladders) of 6-24
    nodes, as a user would save them for ``dataset=pyg_file`` (issue #17).

    ``x`` ``[N, 3]``: column 0 a categorical id in 0..3 (noise), columns 1-2 continuous; column 1
    is a level per graph (uniform in 850..1150, so that training fails without
    standardisation) plus noise per node.
    ``edge_attr`` ``[E, 1]`` a continuous weight (each undirected edge in both directions). ``y``:
    the shape (0, 1, 2), or with ``regression`` the mean of ``x[:, 1]`` over the nodes.
    """
    generator = torch.Generator().manual_seed(seed)
    graphs = []
    for i in range(num_graphs):
        shape = i % len(SHAPES)
        n = int(torch.randint(6, 25, (1,), generator=generator))
        if SHAPES[shape] == "cycle":
            pairs = [(k, (k + 1) % n) for k in range(n)]
        elif SHAPES[shape] == "tree":
            parents = [int(torch.randint(0, k, (1,), generator=generator)) for k in range(1, n)]
            pairs = [(p, k) for k, p in enumerate(parents, start=1)]
        else:
            n -= n % 2
            half = n // 2
            pairs = [(k, k + 1) for k in range(half - 1)]
            pairs += [(half + k, half + k + 1) for k in range(half - 1)]
            pairs += [(k, half + k) for k in range(half)]
        edges = torch.tensor(pairs, dtype=torch.long).t()
        edge_index = torch.cat([edges, edges.flip(0)], dim=1)
        weight = torch.rand(edges.size(1), 1, generator=generator)
        x = torch.cat(
            [
                torch.randint(0, 4, (n, 1), generator=generator).float(),
                # A level per graph (what regression learns) plus noise per node.
                1000
                + 300 * (torch.rand(1, generator=generator) - 0.5)
                + 10 * torch.randn(n, 1, generator=generator),
                torch.randn(n, 1, generator=generator),
            ],
            dim=1,
        )
        y = x[:, 1].mean().view(1, 1) if regression else torch.tensor([shape])
        graphs.append(Data(x=x, edge_index=edge_index, edge_attr=torch.cat([weight, weight]), y=y))
    return graphs


def write_tu_layout(root: Path, name: str, graphs: list[Data], labels: list[int]) -> Path:
    """``graphs`` in TU's raw layout, ``root/name/raw/name_*.txt``: 1-based edges (as given:
    both directions), graph indicator, graph labels, and node labels (``x[:, 0]``), node
    attributes (``x[:, 1:]``, floats), edge labels (``edge_attr[:, 0]``) when present: graphs
    without ``x`` (``num_nodes`` only) or ``edge_attr`` get no such files."""
    raw = Path(root) / name / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    edges, indicator, node_labels, attributes, edge_labels = [], [], [], [], []
    offset = 0
    for g, graph in enumerate(graphs):
        n = graph.num_nodes
        for a, b in graph.edge_index.t().tolist():
            edges.append(f"{a + 1 + offset}, {b + 1 + offset}")
        indicator += [str(g + 1)] * n
        if graph.x is not None:
            node_labels += [str(int(v)) for v in graph.x[:, 0].tolist()]
            attributes += [", ".join(f"{v:.6g}" for v in row) for row in graph.x[:, 1:].tolist()]
        if graph.edge_attr is not None:
            edge_labels += [str(int(v)) for v in graph.edge_attr[:, 0].tolist()]
        offset += n
    files = {
        "A": edges,
        "graph_indicator": indicator,
        "graph_labels": [str(int(v)) for v in labels],
    }
    if graphs[0].x is not None:
        files["node_labels"] = node_labels
        if graphs[0].x.size(1) > 1:
            files["node_attributes"] = attributes
    if graphs[0].edge_attr is not None:
        files["edge_labels"] = edge_labels
    for key, lines in files.items():
        (raw / f"{name}_{key}.txt").write_text("\n".join(lines) + "\n")
    return raw


CONTACT = 5.0


def _triangles(adjacency: np.ndarray, keep: np.ndarray) -> float:
    """Triangles of the graph ``adjacency`` ``[n, n]`` (bool) induced by the nodes ``keep``."""
    a = adjacency[np.ix_(keep, keep)].astype(np.float32)
    return float(((a @ a) * a).sum()) / 6


def protein_like_graphs(
    num_graphs: int, seed: int = 0, max_nodes: int = 620, noise: float = 0.1
) -> tuple[list[Data], list[int]]:
    """PROTEINS-like graphs with a label that depends on their structure (issue #17), made
    by a documented generator (TU's PROTEINS itself needs a download).

    As in PROTEINS (Borgwardt et al., 2005), a node is a secondary-structure element: ``x[:, 0]``
    its type (0 helix, 1 strand, 2 turn; drawn 45/35/20 %), ``x[:, 1]`` its length in residues
    (continuous: helix ~ N(11, 3), strand ~ N(5, 1.5), turn ~ N(3, 1), at least 1). Sizes are
    lognormal (mean ~39 nodes, 4 to ``max_nodes``). The elements follow a chain folded in 3D (a
    persistent random walk of 3.8-unit steps pulled towards its centre); edges join chain
    neighbours and elements closer than 6.5 units (both directions), ~4 directed edges per node.
    The label is 1 when the graph's density of mixed triangles (three elements in mutual
    contact, at least one helix and one strand: a packed alpha/beta motif) per node is above
    the median of the ``num_graphs``, then a ``noise`` share of labels is flipped (real labels
    are noisy too): a classifier's accuracy is capped near ``1 - noise``.

    Returns:
        the graphs (``x`` ``[N, 2]``, ``edge_index``, ``y``) and their labels.
    """
    rng = np.random.default_rng(seed)
    sizes = np.clip(rng.lognormal(3.5, 0.6, num_graphs).astype(int), 4, max_nodes)
    sizes[0] = max_nodes  # PROTEINS' largest graph has 620 nodes
    graphs, density = [], []
    for n in sizes:
        kind = rng.choice(3, size=n, p=rng.dirichlet([4.5, 3.5, 2.0]))
        length = np.choose(kind, [rng.normal(11, 3, n), rng.normal(5, 1.5, n), rng.normal(3, 1, n)])
        steps = np.zeros((n, 3))
        direction = rng.normal(size=3)
        position = np.zeros(3)
        for k in range(n):
            direction = 0.6 * direction / np.linalg.norm(direction) + rng.normal(size=3) * 0.8
            position = 0.9 * position + 3.8 * direction / np.linalg.norm(direction)
            steps[k] = position
        distance = np.linalg.norm(steps[:, None] - steps[None], axis=-1)
        adjacency = distance < CONTACT
        chain = np.arange(n - 1)
        adjacency[chain, chain + 1] = adjacency[chain + 1, chain] = True
        np.fill_diagonal(adjacency, False)

        every = np.ones(n, dtype=bool)
        total = _triangles(adjacency, every)
        # Inclusion-exclusion: all, less those without a helix, less those without a strand,
        # plus those with neither (turns only).
        mixed = (
            total
            - _triangles(adjacency, kind != 0)
            - _triangles(adjacency, kind != 1)
            + _triangles(adjacency, kind == 2)
        )
        density.append(mixed / (total + 1))
        edge_index = torch.from_numpy(np.stack(np.nonzero(adjacency))).long()
        x = torch.tensor(np.stack([kind, np.maximum(length, 1.0)], 1), dtype=torch.float)
        graphs.append(Data(x=x, edge_index=edge_index, num_nodes=int(n)))
    density = np.asarray(density)
    labels = (density > np.median(density)).astype(int)
    flip = rng.random(num_graphs) < noise
    labels = np.where(flip, 1 - labels, labels).tolist()
    for graph, label in zip(graphs, labels, strict=True):
        graph.y = torch.tensor([label])
    return graphs, labels


def nci_tu(root: Path, name: str = "NCI_TU", limit: int = 400, classes: int = 2) -> list[int]:
    """rdkit's NCI molecules as a TU dataset with float node attributes: node labels the atomic
    number's OGB id, node attributes [degree + 0.5 * hydrogens, formal charge + 0.1 * aromatic]
    (computed by rdkit), edge labels the bond type, graph labels the TPSA band (``classes``
    quantile bands). Returns the labels."""
    table = nci_table()
    graphs, tpsa = [], []
    for smiles, value in zip(table.smiles, table.tpsa, strict=True):
        molecule = Chem.MolFromSmiles(smiles)
        if molecule is None or molecule.GetNumAtoms() < 2:
            continue
        graph = smiles2graph(smiles)
        if graph["edge_index"].shape[1] == 0:
            continue
        atoms = molecule.GetAtoms()
        floats = [
            [a.GetDegree() + 0.5 * a.GetTotalNumHs(), a.GetFormalCharge() + 0.1 * a.GetIsAromatic()]
            for a in atoms
        ]
        x = torch.cat(
            [torch.as_tensor(graph["node_feat"][:, :1]).float(), torch.tensor(floats)], dim=1
        )
        edge_attr = torch.as_tensor(graph["edge_feat"][:, :1]).long()
        graphs.append(
            Data(x=x, edge_index=torch.as_tensor(graph["edge_index"]), edge_attr=edge_attr)
        )
        tpsa.append(float(value))
        if len(graphs) == limit:
            break
    edges = np.quantile(tpsa, np.linspace(0, 1, classes + 1)[1:-1])
    labels = [int(np.searchsorted(edges, v, side="right")) for v in tpsa]
    write_tu_layout(root, name, graphs, labels)
    return labels


def write_ppa_layout(root: Path, graphs: list[Data], labels: list[int]) -> Path:
    """``graphs`` (edges in both directions, the first half one way) in ogbg-ppa's OGB layout
    under ``root/ogbg_ppa``: each edge once with 7 float features (its ``edge_attr[:, 0]`` and
    six functions of it, as association scores in [0, 1]), no node features, integer labels,
    the ``species`` split (80/10/10 in order), ``RELEASE_v1.txt``."""
    folder = Path(root) / "ogbg_ppa"
    (folder / "raw").mkdir(parents=True, exist_ok=True)
    (folder / "split" / "species").mkdir(parents=True, exist_ok=True)
    edges, features, edge_counts = [], [], []
    for graph in graphs:
        once = graph.edge_index.size(1) // 2
        edges.append(graph.edge_index[:, :once].t().numpy())
        w = graph.edge_attr[:once, :1].numpy()
        features.append(np.concatenate([w, 1 - w, w**2, np.sqrt(w), w / 2, (1 - w) / 2, w * 0], 1))
        edge_counts.append(once)

    def write(path: Path, array: np.ndarray) -> None:
        with gzip.open(path, "wt") as f:
            pd.DataFrame(array).to_csv(f, header=False, index=False)

    write(folder / "raw" / "edge.csv.gz", np.concatenate(edges))
    write(folder / "raw" / "edge-feat.csv.gz", np.concatenate(features).round(4))
    write(folder / "raw" / "num-node-list.csv.gz", np.array([g.num_nodes for g in graphs]))
    write(folder / "raw" / "num-edge-list.csv.gz", np.array(edge_counts))
    write(folder / "raw" / "graph-label.csv.gz", np.array(labels, dtype=int))
    n = len(graphs)
    cut1, cut2 = int(0.8 * n), int(0.9 * n)
    for split, idx in (
        ("train", range(cut1)),
        ("valid", range(cut1, cut2)),
        ("test", range(cut2, n)),
    ):
        write(folder / "split" / "species" / f"{split}.csv.gz", np.array(list(idx)))
    (folder / "RELEASE_v1.txt").write_text("")
    return folder


def write_lrgb_layout(root: Path, key: str, sizes: tuple[int, int, int] = (160, 40, 40)) -> Path:
    """rdkit's NCI molecules in LRGB's peptide layout, ``root/key/raw/{train,val,test}.pt``:
    ``(x, edge_attr, edge_index, y)`` tuples featurised by OGB's ``smiles2graph``. Targets:
    ``peptides-struct`` 11 values (TPSA's standardised rank times 1.0, 1.1, ..., 2.0),
    ``peptides-func`` 10 labels (TPSA above its 0.3..0.7 quantiles)."""
    table = nci_table().iloc[: sum(sizes)]
    tpsa = torch.tensor(table.tpsa.to_numpy(), dtype=torch.float)
    if key == "peptides-struct":
        ranks = tpsa.argsort().argsort().float()  # TPSA's rank: no heavy tail
        scaled = (ranks - ranks.mean()) / ranks.std()
        y = torch.stack([scaled * (1 + 0.1 * k) for k in range(11)], 1)
    else:
        cuts = torch.quantile(tpsa, torch.linspace(0.3, 0.7, 10))
        y = (tpsa[:, None] > cuts[None]).float()
    raw = Path(root) / key / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    start = 0
    for name, size in zip(("train", "val", "test"), sizes, strict=True):
        graphs = []
        for i in range(start, start + size):
            g = smiles2graph(table.smiles.iloc[i])
            graphs.append(
                (
                    torch.as_tensor(g["node_feat"]),
                    torch.as_tensor(g["edge_feat"]),
                    torch.as_tensor(g["edge_index"]),
                    y[i : i + 1],
                )
            )
        torch.save(graphs, raw / f"{name}.pt")
        start += size
    return raw


def emt_frames(count: int) -> list:
    """``count`` ASE frames of small molecules (CH4, H2O, NH3, C2H6, CH3OH in turn) shaken off
    their geometry (seeded), with ASE's EMT energy and forces stored as calculator results: a
    3D data set with per-atom vector targets, in seconds (needs the ``3d`` extra)."""
    from ase.build import molecule
    from ase.calculators.emt import EMT
    from ase.calculators.singlepoint import SinglePointCalculator

    rng = np.random.default_rng(0)
    frames = []
    for i in range(count):
        atoms = molecule(("CH4", "H2O", "NH3", "C2H6", "CH3OH")[i % 5])
        atoms.positions += rng.normal(scale=0.08, size=atoms.positions.shape)
        atoms.calc = EMT()
        energy, forces = atoms.get_potential_energy(), atoms.get_forces()
        atoms.calc = SinglePointCalculator(atoms, energy=energy, forces=forces)
        frames.append(atoms)
    return frames


def rotatable_bonds(smiles: str) -> list[int]:
    """1 for each bond (RDKit's bond order) that RDKit's rotatable-bond SMARTS
    (``Lipinski.RotatableBondSmarts``: single, not in a ring, between two non-terminal atoms,
    neither of them in a triple bond) matches, else 0: a bond property a model must read from
    the atoms around the bond (ring membership, degree), not from the bond's own features."""
    from rdkit.Chem import Lipinski

    mol = Chem.MolFromSmiles(smiles)
    matched = {frozenset(m) for m in mol.GetSubstructMatches(Lipinski.RotatableBondSmarts)}
    return [
        int(frozenset((b.GetBeginAtomIdx(), b.GetEndAtomIdx())) in matched) for b in mol.GetBonds()
    ]


def nci_rotatable_bonds(count: int, max_atoms: int = 40) -> pd.DataFrame:
    """The first ``count`` NCI molecules of at most ``max_atoms`` atoms: ``smiles``,
    ``rotatable`` (a ``[0, 1, ...]`` list cell per molecule, :func:`rotatable_bonds`), ``heavy``
    (heavy atoms, a molecule-level target) and ``bond_type`` (RDKit's bond type per bond, as a
    ``|``-joined string, for per-bond-type baselines)."""
    RDLogger.DisableLog("rdApp.*")
    rows = []
    for smiles in nci_smiles():
        mol = Chem.MolFromSmiles(smiles)
        if mol.GetNumAtoms() > max_atoms:
            continue
        labels = rotatable_bonds(smiles)
        rows.append(
            {
                "smiles": smiles,
                "rotatable": "[" + ", ".join(map(str, labels)) + "]",
                "heavy": mol.GetNumAtoms(),
                "bond_type": "|".join(str(b.GetBondType()) for b in mol.GetBonds()),
            }
        )
        if len(rows) == count:
            break
    return pd.DataFrame(rows)


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def running_server(
    ckpt: str | Path, *overrides: str, timeout: float = 120, threads: int = 1
) -> Iterator[tuple[str, int]]:
    """``scripts/serve.py ckpt=...`` started on a free loopback port, as a user starts it (with
    ``threads`` CPU threads); yields its base URL and process id once ``GET /health`` answers,
    and stops it (and its workers, in its process group) after."""
    import os
    import signal
    import subprocess
    import sys
    import time
    import urllib.request

    port = free_port()
    script = Path(__file__).resolve().parents[1] / "scripts" / "serve.py"
    log = tempfile.TemporaryFile(mode="w+")
    process = subprocess.Popen(
        [sys.executable, str(script), f"ckpt={ckpt}", f"port={port}", *overrides],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(threads)},
        start_new_session=True,  # its own process group: the workers stop with it
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"serve.py exited with {process.returncode}:\n{log.read()}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"serve.py did not answer /health within {timeout} s")
            time.sleep(0.5)
        yield url, process.pid
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        log.close()


# EMT's metals (ase.calculators.emt) and small adsorbates it treats roughly.
SLAB_METALS = ("Cu", "Ag", "Au", "Ni", "Pd", "Pt", "Al")
ADSORBATES = ("H", "C", "N", "O", "OH", "CO")


def emt_slabs(count: int, seed: int = 0, relax_steps: int = 0, size: int = 2) -> list:
    """``count`` catalyst-like structures built offline with ASE: fcc(100) or fcc(111) slabs of
    EMT's metals (``size`` x ``size``, 3 layers, 6 A of vacuum, periodic in x and y) with an
    adsorbate at a random site, shaken off their lattice. Tags as OC20's (0 the fixed bottom
    layer, 1 the others, 2 the adsorbate); EMT's energy and forces stored as the calculator's
    results. With ``relax_steps``, a BFGS relaxation of the moving atoms (the bottom layer
    fixed) of at most that many steps: ``arrays["pos_relaxed"]`` and ``info["energy_relaxed"]``
    (IS2RE's targets), the frame keeping its initial positions."""
    from ase.build import add_adsorbate, fcc100, fcc111, molecule
    from ase.calculators.emt import EMT
    from ase.calculators.singlepoint import SinglePointCalculator
    from ase.constraints import FixAtoms
    from ase.optimize import BFGS

    rng = np.random.default_rng(seed)
    frames = []
    for _ in range(count):
        metal = SLAB_METALS[rng.integers(len(SLAB_METALS))]
        build = (fcc100, fcc111)[rng.integers(2)]
        slab = build(metal, size=(size, size, 3), vacuum=6.0)
        tags = slab.get_tags()  # ASE: 1 top layer .. 3 bottom layer
        bottom = tags == tags.max()
        name = ADSORBATES[rng.integers(len(ADSORBATES))]
        adsorbate, binding = name, 0
        if len(name) > 1:
            # O of OH and C of CO bind, the other atom above them (ASE's molecules point H and
            # O the other way).
            adsorbate = molecule(name)
            adsorbate.positions[:, 2] *= -1 if name == "OH" else 1
            binding = 1 if name == "CO" else 0
        offset = rng.uniform(0, 1, size=2) * slab.cell.lengths()[:2]
        height = float(rng.uniform(1.4, 2.0))
        add_adsorbate(slab, adsorbate, height, position=tuple(offset), mol_index=binding)
        slab.info.pop("adsorbate_info", None)  # ASE's site table: not a frame's value
        n_slab = len(bottom)
        oc20 = np.full(len(slab), 2)
        oc20[:n_slab] = np.where(bottom, 0, 1)
        slab.set_tags(oc20)
        slab.wrap()
        slab.positions += rng.normal(scale=0.05, size=slab.positions.shape) * (oc20 > 0)[:, None]
        slab.calc = EMT()
        energy, forces = slab.get_potential_energy(), slab.get_forces()
        if relax_steps:
            relaxed = slab.copy()
            relaxed.set_constraint(FixAtoms(mask=oc20 == 0))
            relaxed.calc = EMT()
            BFGS(relaxed, logfile=None).run(fmax=0.05, steps=relax_steps)
            slab.arrays["pos_relaxed"] = relaxed.positions.copy()
            slab.info["energy_relaxed"] = float(relaxed.get_potential_energy())
        slab.calc = SinglePointCalculator(slab, energy=energy, forces=forces)
        frames.append(slab)
    return frames


def oc20_record(atoms) -> Data:
    """An ASE frame of :func:`emt_slabs` (relaxed) as one record of OC20's IS2RE LMDBs: a PyG
    ``Data`` with OC20's field names."""
    return Data(
        atomic_numbers=torch.tensor(atoms.numbers, dtype=torch.float32),
        pos=torch.tensor(atoms.positions, dtype=torch.float32),
        pos_relaxed=torch.tensor(atoms.arrays["pos_relaxed"], dtype=torch.float32),
        cell=torch.tensor(np.asarray(atoms.cell), dtype=torch.float32).view(1, 3, 3),
        tags=torch.tensor(atoms.get_tags(), dtype=torch.long),
        y_relaxed=float(atoms.info["energy_relaxed"]),
        natoms=len(atoms),
        sid=int(abs(hash(atoms.get_chemical_formula())) % 10**6),
    )


def write_oc20_layout(root: Path, splits: dict[str, list]) -> Path:
    """OC20's IS2RE folder layout (``root/<split>/data.lmdb``) holding ``splits``' records,
    each value ``pickle.dumps`` of a record (OC20's own format: a PyG ``Data`` from
    :func:`oc20_record`, or any object a test wants refused), keyed ``"0"``, ``"1"``, ..."""
    import lmdb

    for split, records in splits.items():
        folder = Path(root) / split
        folder.mkdir(parents=True, exist_ok=True)
        env = lmdb.open(str(folder / "data.lmdb"), subdir=False, map_size=2**30, lock=False)
        with env.begin(write=True) as txn:
            for index, record in enumerate(records):
                txn.put(str(index).encode(), pickle.dumps(record, protocol=4))
        env.close()
    return Path(root)


def write_aselmdb(path: Path, frames: list) -> Path:
    """``frames`` as fairchem's ASE-LMDB file (``*.aselmdb``): row ids 1..N, each value the
    zlib-compressed JSON (ASE's encoding) of the row's fields (``numbers``, ``positions``,
    ``cell``, ``pbc``, ``tags``, the stored ``energy`` and ``forces``, ``key_value_pairs``
    from ``info``), and ``nextid``."""
    import zlib

    import lmdb
    from ase.io.jsonio import encode

    def packed(value) -> bytes:
        return zlib.compress(encode(value).encode("utf-8"))

    env = lmdb.open(str(path), subdir=False, map_size=2**30, lock=False)
    with env.begin(write=True) as txn:
        for index, atoms in enumerate(frames, start=1):
            row = {
                "numbers": atoms.numbers,
                "positions": atoms.positions,
                "cell": np.asarray(atoms.cell),
                "pbc": atoms.pbc,
                "tags": atoms.get_tags(),
                "key_value_pairs": {
                    k: v for k, v in atoms.info.items() if isinstance(v, int | float | str)
                },
                "data": {},
            }
            if atoms.calc is not None:
                row["energy"] = atoms.get_potential_energy()
                row["forces"] = atoms.get_forces()
            txn.put(str(index).encode("ascii"), packed(row))
        txn.put(b"nextid", packed(len(frames) + 1))
    env.close()
    return Path(path)
