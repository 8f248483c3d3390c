from graphormer.data.collate import GraphormerBatch, GraphormerCollator
from graphormer.data.shortest_paths import batched_shortest_paths, shortest_paths
from graphormer.data.transforms import STRUCTURAL_KEYS, StructuralFeatures, structural_features

__all__ = [
    "STRUCTURAL_KEYS",
    "GraphormerBatch",
    "GraphormerCollator",
    "StructuralFeatures",
    "batched_shortest_paths",
    "shortest_paths",
    "structural_features",
]
