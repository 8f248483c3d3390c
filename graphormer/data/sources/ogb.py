"""OGB graph-property datasets through OGB's own loader, made safe for current torch and for CI.

``ogb`` 1.3.6's ``PygGraphPropPredDataset`` has three traps this subclass removes:
- it loads its processed file with ``torch.load`` and torch's ``weights_only=True`` default (torch >=
  2.6), which rejects PyG's storage classes: we allow-list exactly those classes;
- it asks ``input()`` when a dataset folder lacks ``RELEASE_v<version>.txt``, and again before a
  download over 1 GB: we never prompt, and fail with an actionable error instead;
- it always writes ``processed/geometric_data_processed.pt``, so a changed ``pre_transform`` reuses a
  stale file: our processed files live in a folder named by the preprocessing settings.
Everything else (raw CSV parsing, labels, official splits) is OGB's code, unchanged.
"""

from __future__ import annotations

import os
import os.path as osp
import pickle
import shutil
import warnings
import zipfile
from collections.abc import Callable

import numpy as np
import pandas as pd
import torch
from ogb.graphproppred import PygGraphPropPredDataset
from torch_geometric.data import Data, InMemoryDataset

from graphormer.data.conformers import (
    CONFORMER_SEED,
    RandomConformer,
    check_conformer_settings,
    embed_many,
    unembedded_message,
)
from graphormer.data.descriptors import (
    ATOM_DESCRIPTORS,
    MoleculeFeatures,
    atom_descriptor_values,
    auxiliary_atoms_apply,
)
from graphormer.data.sources.base import LoadedDataset, Source
from graphormer.data.sources.folders import (
    DatasetCacheError,
    DatasetNotFoundError,
    check_pyg_markers,
    check_release,
    corrupt_cache_message,
    remove_empty_tree,
)
from graphormer.data.sources.graph_cache import input_digest
from graphormer.data.structure import StructuralFeatures, add_structural_features
from graphormer.data.tasks import TaskInfo, ogb_master_table
from graphormer.errors import ConfigError, DataError
from graphormer.outputs import atomic_path
from graphormer.safe_io import PYG_DATA, allow, download_timeout, load_data

__all__ = [
    "OGB_MOLECULE_DATASETS",
    "OGBGraphDataset",
    "OGBSource",
    "ogb_folder",
    "ogb_task_info",
]

OGB_MOLECULE_DATASETS = (
    "ogbg-molhiv",
    "ogbg-molpcba",
    "ogbg-moltox21",
    "ogbg-molbace",
    "ogbg-molbbbp",
    "ogbg-molclintox",
    "ogbg-molmuv",
    "ogbg-molsider",
    "ogbg-moltoxcast",
    "ogbg-molesol",
    "ogbg-molfreesolv",
    "ogbg-mollipo",
)


def ogb_task_info(name: str) -> TaskInfo:
    """Task type, number of tasks and metric of an OGB dataset, from OGB's own metadata."""
    table = ogb_master_table()
    if name not in table:
        known = ", ".join(OGB_MOLECULE_DATASETS)
        raise ConfigError(f"unknown OGB dataset {name!r}; molecule datasets: {known}")
    meta = table[name]
    multiclass = meta["task type"] == "multiclass classification"
    return TaskInfo(
        name=name,
        task_type=meta["task type"],
        num_tasks=int(meta["num tasks"]),
        metric=meta["eval metric"],
        num_classes=int(meta["num classes"]) if multiclass else None,
    )


def ogb_folder(name: str, root: str) -> str:
    """The folder OGB keeps ``name`` in under ``root``: ``ogbg_molhiv``, or ``ogbg_molhiv_pyg``
    where that exists (a PyG-specific download)."""
    folder = osp.join(root, "_".join(name.split("-")))
    return folder + "_pyg" if osp.exists(folder + "_pyg") else folder


class OGBGraphDataset(PygGraphPropPredDataset):
    """OGB's ``PygGraphPropPredDataset`` with safe loading, no prompts and a keyed cache.

    Args:
        name (str): OGB dataset name, e.g. ``ogbg-molhiv``.
        root (str): folder holding the datasets (OGB's ``root``).
        pre_transform (StructuralFeatures | None): structural preprocessing, cached on disk.
        transform (Callable | None): applied on access.
    """

    def __init__(
        self,
        name: str,
        root: str = "data",
        pre_transform: StructuralFeatures | None = None,
        transform: Callable | None = None,
    ) -> None:
        task = ogb_task_info(name)  # validates the name first
        self.task = task
        folder = ogb_folder(name, root)
        version = ogb_master_table()[name]["version"]
        check_release(name, folder, f"RELEASE_v{version}.txt")
        # Processed files live under a folder named by the preprocessing settings.
        self.cache_key = pre_transform.cache_key if pre_transform is not None else "plain"
        allow(PYG_DATA)  # OGB reads its processed file with torch.load(weights_only=True)
        check_pyg_markers(osp.join(folder, "processed", self.cache_key))
        try:
            super().__init__(name, root, transform=transform, pre_transform=pre_transform)
        except (pickle.UnpicklingError, RuntimeError, EOFError, zipfile.BadZipFile) as error:
            cache = osp.join(self.processed_dir, self.processed_file_names)
            if not osp.isfile(cache):
                raise
            # OGB's own torch.load of the cache failed: name the file and the fix.
            raise DatasetCacheError(corrupt_cache_message(cache, error)) from error

    @property
    def processed_dir(self) -> str:
        return osp.join(self.root, "processed", self.cache_key)

    def download(self) -> None:
        url = self.meta_info["url"]
        try:
            from ogb.utils.url import download_url, extract_zip

            with download_timeout():
                path = download_url(url, self.original_root)
        except Exception as error:  # no network, DNS failure, HTTP error, timeout ...
            remove_empty_tree(self.root)
            raise DatasetNotFoundError(
                f"{self.name} is not in {osp.abspath(self.root)} and could not be downloaded from "
                f"{url} ({type(error).__name__}: {error}). "
                f"Fix: download {url} on a machine with network access, unzip it into "
                f"{osp.abspath(self.original_root)} (giving {osp.abspath(self.root)}/raw/, "
                f"split/, RELEASE_v{self.meta_info['version']}.txt), or point dataset.root= at the "
                "folder that already holds it."
            ) from error
        extract_zip(path, self.original_root)
        os.unlink(path)
        shutil.rmtree(self.root)
        shutil.move(osp.join(self.original_root, self.download_name), self.root)

    def process(self) -> None:
        # OGB's own process() reads the raw CSVs and labels, collates and saves. Its per-graph
        # pre_transform loop is bypassed: the structural features are added to the whole
        # collated storage in one batched pass, in `collate` below, before OGB saves it once
        # (per-graph calls would cost ~0.4 ms each in Python overhead alone).
        self._structural, self.pre_transform = self.pre_transform, None
        try:
            super().process()
        finally:
            self.pre_transform, self._structural = self._structural, None

    def collate(self, data_list: list[Data]) -> tuple[Data, dict]:
        data, slices = InMemoryDataset.collate(data_list)
        if getattr(self, "_structural", None) is not None:
            add_structural_features(data, slices, self._structural)
        return data, slices


class OGBSource(Source):
    """An OGB graph-property dataset with its official split.

    Args:
        name (str): e.g. ``ogbg-molhiv``.
        root (str, optional): folder holding datasets. (default: :obj:`"data"`)
        molecule_features (str | None, optional): extra model inputs per molecule (from the
            SMILES of ``mapping/mol.csv.gz``), computed once and cached beside the processed
            graphs: ``"rdkit2d"``, RDKit's 2D descriptors; ``"morgan_counts"``, its Morgan
            (ECFP4) count fingerprint in 2,048 bins; ``"rdkit2d+morgan_counts"``, both.
            (default: :obj:`None`)
        auxiliary_atom_descriptors (bool | str, optional): RDKit's per-atom descriptors
            (:data:`~graphormer.data.descriptors.ATOM_DESCRIPTORS`, of the same SMILES)
            regressed from the atoms' final states as an auxiliary task beside OGB's targets
            (issue #22), as ``dataset=smiles_csv`` does: ``"auto"`` (the configs' default) on
            regression datasets (ogbg-molesol, ogbg-molfreesolv, ogbg-mollipo), True on any
            molecule dataset, False off. Logged and scored (``atom_mae``), never a
            result: OGB's metric alone selects checkpoints, and predictions are of molecules.
            (default: :obj:`False`: checkpoints made before it rebuild unchanged)
        conformers (str | None, optional): ``"rdkit"``: atom positions for the molecule sets,
            embedded from ``mapping/mol.csv.gz``'s SMILES as ``dataset=smiles_csv`` embeds
            them (:mod:`graphormer.data.conformers`), in the graphs' atom order (OGB's graphs
            are ``smiles2graph`` of the same SMILES: heavy atoms in RDKit's order), cached
            beside the processed graphs. A molecule RDKit cannot embed is named in one warning
            and left out of every split, never given zero positions. (default: :obj:`None`)
        num_conformers (int, optional): conformers kept per molecule (a random one each time
            training reads a graph; evaluation and prediction take their mean).
            (default: :obj:`1`)
    """

    official_split = "OGB's official split (the one its leaderboard compares)"

    def __init__(
        self,
        name: str,
        root: str = "data",
        molecule_features: str | None = None,
        auxiliary_atom_descriptors: bool | str = False,
        conformers: str | None = None,
        num_conformers: int = 1,
    ) -> None:
        self.name = name
        self.root = root
        check_conformer_settings(conformers, num_conformers)
        if conformers is not None and name not in OGB_MOLECULE_DATASETS:
            raise ConfigError(
                f"dataset.conformers={conformers} embeds molecules from their SMILES, and "
                f"{name} is not a molecule dataset: drop dataset.conformers"
            )
        self.conformers = conformers
        self.num_conformers = num_conformers
        if molecule_features == "auto":
            raise ConfigError(
                f"dataset.molecule_features=auto chooses from a CSV's split (dataset=smiles_csv); "
                f"for {name} name the features: rdkit2d, morgan_counts, rdkit2d+morgan_counts "
                "or null"
            )
        self.features = MoleculeFeatures(molecule_features)
        task = ogb_task_info(name)
        blockers = [] if name in OGB_MOLECULE_DATASETS else [f"{name} is not a molecule dataset"]
        self.auxiliary_atom_descriptors = auxiliary_atoms_apply(
            auxiliary_atom_descriptors, task.task_type == "regression", blockers
        )
        if self.auxiliary_atom_descriptors:
            task = task.with_auxiliary_atoms(len(ATOM_DESCRIPTORS))
        self._task = task

    def molecule_features(self) -> MoleculeFeatures | None:
        """The molecule-level input features (issue #22), or None."""
        return self.features if self.features.enabled else None

    def atom_task_names(self) -> list[str]:
        """The auxiliary per-atom descriptors' names, when they are trained."""
        return list(ATOM_DESCRIPTORS) if self.auxiliary_atom_descriptors else []

    def load(self, pre_transform: StructuralFeatures | None = None) -> LoadedDataset:
        dataset = OGBGraphDataset(self.name, self.root, pre_transform=pre_transform)
        split = dataset.get_idx_split()
        if self.molecule_features() is not None:
            self._attach_molecule_features(dataset)
        if self.auxiliary_atom_descriptors:
            self._attach_atom_descriptors(dataset)
        split = {k: split[k] for k in ("train", "valid", "test")}
        if self.conformers is not None:
            split = self._attach_conformers(dataset, split)
        dataset._data_list = None  # graphs built before would lack the new attributes
        return LoadedDataset(dataset, split, self._task)

    def has_positions(self) -> bool:
        return self.conformers is not None

    def prediction_conformers(self) -> int:
        """``dataset.num_conformers`` RDKit conformers per SMILES (their mean is predicted)."""
        return self.num_conformers if self.conformers is not None else 0

    def _attach_conformers(
        self, dataset: OGBGraphDataset, split: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """Gives every graph ``pos`` ``[atoms, 3]`` (and, with several, ``conformers``
        ``[atoms, C, 3]``, read at random by the dataset's transform): RDKit's conformers of the
        folder's SMILES, computed once and cached (NaN for a molecule RDKit cannot embed, or
        whose SMILES do not parse to its graph's atoms in order). Returns ``split`` without
        those molecules, named in one warning."""
        setting, count = "dataset.conformers", self.num_conformers
        names = [str(self.conformers), str(count), str(CONFORMER_SEED)]
        path = self._cache_path("conformers", names, setting)
        nodes = dataset.slices["x"]
        sizes = nodes.diff()

        def compute() -> torch.Tensor:
            smiles, mapping = self._mapping_smiles(setting)
            if len(smiles) != len(dataset):
                raise DataError(
                    f"{mapping} holds {len(smiles)} SMILES for {len(dataset)} graphs: "
                    f"re-download the dataset (delete its folder), or drop {setting}"
                )
            # OGB's first atom feature is the atomic number's index (atomic number - 1).
            elements = (dataset._data.x[:, 0] + 1).split(sizes.tolist())
            values = []
            for text, pos, atoms in zip(smiles, embed_many(smiles, count), elements, strict=True):
                if pos is None or pos.shape[1] != len(atoms) or not _same_elements(text, atoms):
                    values.append(np.full((len(atoms), count, 3), np.nan, dtype=np.float32))
                else:
                    values.append(pos.transpose(1, 0, 2))  # [C, N, 3] -> [N, C, 3]
            return torch.from_numpy(np.concatenate(values))

        values = self._cached(path, compute)
        if values.shape != (int(nodes[-1]), count, 3):
            raise DataError(corrupt_cache_message(path, ValueError(f"shape {tuple(values.shape)}")))
        dataset._data.pos = values[:, 0].contiguous()  # [atoms, 3]
        dataset.slices["pos"] = nodes.clone()
        if count > 1:
            dataset._data.conformers = values
            dataset.slices["conformers"] = nodes.clone()
            dataset.transform = RandomConformer()  # a random conformer each read in training
        graph_of_node = torch.repeat_interleave(torch.arange(len(sizes)), sizes)
        unembedded = torch.zeros(len(sizes), dtype=torch.bool)
        unembedded[graph_of_node[torch.isnan(values).flatten(1).any(1)]] = True
        if not unembedded.any():
            return split
        smiles, mapping = self._mapping_smiles(setting)
        rows = torch.nonzero(unembedded).view(-1).tolist()
        warnings.warn(unembedded_message(mapping, rows, [smiles[r] for r in rows]), stacklevel=2)
        return {k: index[~unembedded[index]] for k, index in split.items()}

    def _mapping_smiles(self, setting: str) -> tuple[list[str], str]:
        """Every molecule's SMILES, in graph order, from the folder's ``mapping/mol.csv.gz``."""
        mapping = self._mapping_path(setting)
        return pd.read_csv(mapping)["smiles"].tolist(), mapping

    def _mapping_path(self, setting: str) -> str:
        mapping = osp.join(ogb_folder(self.name, self.root), "mapping", "mol.csv.gz")
        if not osp.isfile(mapping):
            raise DataError(
                f"{setting} needs each molecule's SMILES, but {mapping} does not exist: "
                "re-download the dataset (delete its folder)"
            )
        return mapping

    def _cache_path(self, kind: str, names: list[str], setting: str) -> str:
        """Where values computed from the folder's SMILES are cached: keyed by what is computed
        and by the SMILES file's content, so that a folder rewritten with other molecules (a
        user's own OGB-layout set, rebuilt) never reuses another set's values."""
        key = input_digest([self._mapping_path(setting)], names)
        return osp.join(ogb_folder(self.name, self.root), "processed", f"{kind}_{key}.pt")

    @staticmethod
    def _cached(path: str, compute: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The tensor file at ``path``, or ``compute()`` saved there first."""
        if osp.isfile(path):
            try:
                return load_data(path, [])
            except Exception as error:  # truncated or not a tensor file
                raise DataError(corrupt_cache_message(path, error)) from error
        values = compute()
        # Whole or not at all: an interrupted write never leaves a truncated cache (the
        # datamodule's prepare lock already makes concurrent runs take turns).
        with atomic_path(path) as partial:
            torch.save(values, partial)
        return values

    def _attach_molecule_features(self, dataset: OGBGraphDataset) -> None:
        """Gives every graph its raw ``molecule_features`` ``[1, D]``, computed from the
        folder's SMILES once and cached (keyed by the feature names) as a tensor file."""
        names = self.features.names()
        path = self._cache_path("molecule_features", names, "dataset.molecule_features")

        def compute() -> torch.Tensor:
            smiles, mapping = self._mapping_smiles("dataset.molecule_features")
            return torch.from_numpy(self.features.compute(smiles, None, mapping))

        values = self._cached(path, compute)
        count = len(dataset)
        if values.shape != (count, len(names)):
            raise DataError(corrupt_cache_message(path, ValueError(f"shape {tuple(values.shape)}")))
        # One [1, D] row per graph, through the collated storage's slices.
        dataset._data.molecule_features = values
        dataset.slices["molecule_features"] = torch.arange(count + 1)

    def _attach_atom_descriptors(self, dataset: OGBGraphDataset) -> None:
        """Gives every graph its auxiliary atom labels ``y_atom`` ``[atoms, 6]``: RDKit's
        per-atom descriptors of the folder's SMILES, in RDKit's atom order, which is the order
        of OGB's graphs (``smiles2graph`` parses the same SMILES; checked atom by atom against
        the graphs' atomic numbers); computed once and cached."""
        setting = "dataset.auxiliary_atom_descriptors"
        path = self._cache_path("atom_descriptors", list(ATOM_DESCRIPTORS), setting)
        nodes = dataset.slices["x"]

        def compute() -> torch.Tensor:
            smiles, mapping = self._mapping_smiles(setting)
            if len(smiles) != len(dataset):
                raise DataError(
                    f"{mapping} holds {len(smiles)} SMILES for {len(dataset)} graphs: "
                    "re-download the dataset (delete its folder), or set "
                    f"{setting}=false"
                )
            values = atom_descriptor_values(smiles)
            # OGB's first atom feature is the atomic number's index (atomic number - 1).
            elements = (dataset._data.x[:, 0] + 1).split(nodes.diff().tolist())
            unmatched = [
                index
                for index, (atoms, graph) in enumerate(zip(values, elements, strict=True))
                if atoms is None or not _same_elements(smiles[index], graph)
            ]
            if len(unmatched) * 2 > len(smiles):
                raise DataError(
                    f"{mapping}: the SMILES of {len(unmatched)} of {len(smiles)} molecules do "
                    "not parse to their graphs' atoms in order (the file does not belong to "
                    f"these graphs): re-download the dataset (delete its folder), or set "
                    f"{setting}=false"
                )
            for index in unmatched:
                values[index] = np.full((len(elements[index]), len(ATOM_DESCRIPTORS)), np.nan)
            if unmatched:
                shown = ", ".join(f"{i} ({smiles[i]!r})" for i in unmatched[:3])
                warnings.warn(
                    f"{setting}: {len(unmatched)} molecule(s) of {mapping} do not parse to "
                    f"their graphs' atoms in order ({shown}{' ...' if len(unmatched) > 3 else ''}"
                    "; 0-based): their atoms have no auxiliary labels (missing, masked in the "
                    "loss); every other molecule keeps its own",
                    stacklevel=2,
                )
            return torch.from_numpy(np.concatenate(values).astype(np.float32))

        values = self._cached(path, compute)
        if values.shape != (int(nodes[-1]), len(ATOM_DESCRIPTORS)):
            raise DataError(corrupt_cache_message(path, ValueError(f"shape {tuple(values.shape)}")))
        dataset._data.y_atom = values
        dataset.slices["y_atom"] = nodes.clone()

    def task_names(self) -> list[str] | None:
        """OGB's label columns: every column of the dataset folder's ``mapping/mol.csv.gz`` but
        ``smiles`` and ``mol_id``; None when the folder does not hold it."""
        path = osp.join(ogb_folder(self.name, self.root), "mapping", "mol.csv.gz")
        if not osp.isfile(path):
            return None
        try:
            columns = pd.read_csv(path, nrows=0).columns
        except (OSError, ValueError):
            return None
        return [str(c) for c in columns if c not in ("smiles", "mol_id")]


def _same_elements(smiles: str, elements: torch.Tensor) -> bool:
    """Whether RDKit parses ``smiles`` to the atomic numbers ``elements``, in order."""
    from rdkit import Chem, RDLogger

    RDLogger.DisableLog("rdApp.*")
    mol = Chem.MolFromSmiles(smiles) if isinstance(smiles, str) else None
    if mol is None:
        return False
    return [atom.GetAtomicNum() for atom in mol.GetAtoms()] == elements.tolist()
