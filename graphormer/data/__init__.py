from graphormer.data.collate import GraphormerBatch, GraphormerCollator
from graphormer.data.datamodule import (
    GraphDataModule,
    IndexedSubset,
    SizeGroupedBatchSampler,
)
from graphormer.data.featurize import FeaturizedMolecules, featurize_smiles
from graphormer.data.ogb import (
    OGB_MOLECULE_DATASETS,
    DatasetNotFoundError,
    OGBGraphDataset,
    add_structural_features,
    ogb_task_info,
)
from graphormer.data.shortest_paths import batched_shortest_paths, shortest_paths
from graphormer.data.smiles import SmilesCsvDataset, random_split, scaffold_split
from graphormer.data.sources import (
    SOURCES,
    LoadedDataset,
    OGBSource,
    SmilesCsvSource,
    build_source,
)
from graphormer.data.tasks import TaskEvaluator, TaskInfo
from graphormer.data.transforms import STRUCTURAL_KEYS, StructuralFeatures, structural_features
from graphormer.data.zinc import ZINC_ATOM_TYPES, ZINC_BOND_TYPES, ZINCDataset, ZINCSource

__all__ = [
    "OGB_MOLECULE_DATASETS",
    "SOURCES",
    "STRUCTURAL_KEYS",
    "ZINC_ATOM_TYPES",
    "ZINC_BOND_TYPES",
    "DatasetNotFoundError",
    "FeaturizedMolecules",
    "GraphDataModule",
    "GraphormerBatch",
    "GraphormerCollator",
    "IndexedSubset",
    "LoadedDataset",
    "OGBGraphDataset",
    "OGBSource",
    "SizeGroupedBatchSampler",
    "SmilesCsvDataset",
    "SmilesCsvSource",
    "StructuralFeatures",
    "TaskEvaluator",
    "TaskInfo",
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
