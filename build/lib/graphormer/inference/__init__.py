"""Using a trained model: predictions on new molecules, embeddings, and attention pictures."""

from graphormer.data.featurize import FeaturizedMolecules, featurize_smiles
from graphormer.inference.attention import AttentionMaps, atom_labels, attention_rollout
from graphormer.inference.explain import write_explanation
from graphormer.inference.predictor import (
    Predictions,
    Predictor,
    UnpredictableMoleculeWarning,
    read_task_names,
)

__all__ = [
    "AttentionMaps",
    "FeaturizedMolecules",
    "Predictions",
    "Predictor",
    "UnpredictableMoleculeWarning",
    "atom_labels",
    "attention_rollout",
    "featurize_smiles",
    "read_task_names",
    "write_explanation",
]
