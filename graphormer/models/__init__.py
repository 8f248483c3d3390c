from graphormer.models.attention import BiasedMultiheadAttention
from graphormer.models.encoders import CategoricalEmbedding, GraphAttentionBias, NodeEncoder
from graphormer.models.geometry import (
    AngularCentrality,
    AngularMessages,
    DistanceMessages,
    GaussianDistanceEncoding,
    VectorHead,
    VectorMessages,
    cosine_switch,
    gaussian_grid,
)
from graphormer.models.graphormer import (
    Graphormer,
    GraphormerConfig,
    ogb_atom_feature_dims,
    ogb_bond_feature_dims,
)
from graphormer.models.layers import GraphormerLayer
from graphormer.models.molecule_features import MoleculeFeatureInput

__all__ = [
    "AngularCentrality",
    "AngularMessages",
    "BiasedMultiheadAttention",
    "CategoricalEmbedding",
    "DistanceMessages",
    "GaussianDistanceEncoding",
    "GraphAttentionBias",
    "Graphormer",
    "GraphormerConfig",
    "GraphormerLayer",
    "MoleculeFeatureInput",
    "NodeEncoder",
    "VectorHead",
    "VectorMessages",
    "cosine_switch",
    "gaussian_grid",
    "ogb_atom_feature_dims",
    "ogb_bond_feature_dims",
]
