from graphormer.data.collate import GraphormerBatch, GraphormerCollator
from graphormer.data.datamodule import GraphDataModule, IndexedSubset
from graphormer.data.featurize import FeaturizedMolecules, featurize_smiles
from graphormer.data.sampling import SizeGroupedBatchSampler
from graphormer.data.sources import (
    SOURCES,
    DatasetCacheError,
    DatasetNotFoundError,
    LoadedDataset,
    LRGBSource,
    OGBSource,
    PCQM4Mv2Source,
    PPASource,
    PygFileSource,
    SmilesCsvSource,
    Source,
    TUSource,
    ZINCSource,
    build_source,
)
from graphormer.data.sources.ogb import OGB_MOLECULE_DATASETS, OGBGraphDataset, ogb_task_info
from graphormer.data.sources.smiles_csv import SmilesCsvDataset
from graphormer.data.sources.zinc import ZINC_ATOM_TYPES, ZINC_BOND_TYPES, ZINCDataset
from graphormer.data.splits import random_split, scaffold_split
from graphormer.data.structure import (
    STRUCTURAL_KEYS,
    StructuralFeatures,
    add_structural_features,
    batched_shortest_paths,
    shortest_paths,
    structural_features,
)
from graphormer.data.tasks import TaskEvaluator, TaskInfo

__all__ = [
    "OGB_MOLECULE_DATASETS",
    "SOURCES",
    "STRUCTURAL_KEYS",
    "ZINC_ATOM_TYPES",
    "ZINC_BOND_TYPES",
    "DatasetCacheError",
    "DatasetNotFoundError",
    "FeaturizedMolecules",
    "GraphDataModule",
    "GraphormerBatch",
    "GraphormerCollator",
    "IndexedSubset",
    "LRGBSource",
    "LoadedDataset",
    "OGBGraphDataset",
    "OGBSource",
    "PCQM4Mv2Source",
    "PPASource",
    "PygFileSource",
    "SizeGroupedBatchSampler",
    "SmilesCsvDataset",
    "SmilesCsvSource",
    "Source",
    "StructuralFeatures",
    "TaskEvaluator",
    "TaskInfo",
    "TUSource",
    "ZINCDataset",
    "ZINCSource",
    "add_structural_features",
    "build_source",
    "featurize_smiles",
    "batched_shortest_paths",
    "ogb_task_info",
    "random_split",
    "scaffold_split",
    "shortest_paths",
    "structural_features",
]
