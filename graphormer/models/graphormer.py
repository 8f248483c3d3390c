"""The Graphormer network (Ying et al., NeurIPS 2021, "Do Transformers Really Perform Bad for Graph
Representation?", https://arxiv.org/abs/2106.05234)."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from graphormer.batch import GraphormerBatch
from graphormer.errors import DataError
from graphormer.models.attention import ACTIVATIONS
from graphormer.models.dropout import Dropout, twice_differentiable
from graphormer.models.encoders import GraphAttentionBias, NodeEncoder, touch
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
from graphormer.models.heads import BondHead, NodeHead
from graphormer.models.init import bert_init_
from graphormer.models.layers import GraphormerLayer
from graphormer.models.molecule_features import MoleculeFeatureInput

__all__ = [
    "CHANNELS",
    "READOUTS",
    "Graphormer",
    "GraphormerConfig",
    "ogb_atom_feature_dims",
    "ogb_bond_feature_dims",
]

# What the molecule head can read (GraphormerConfig.readout).
READOUTS = ("token", "token_mean", "token_sum")
# What the network reads (GraphormerConfig.channels): bonds, positions or both (Transformer-M).
CHANNELS = ("2d", "3d", "both")


def ogb_atom_feature_dims() -> list[int]:
    from ogb.utils.features import get_atom_feature_dims

    return list(get_atom_feature_dims())


def ogb_bond_feature_dims() -> list[int]:
    from ogb.utils.features import get_bond_feature_dims

    return list(get_bond_feature_dims())


@dataclass
class GraphormerConfig:
    """Hyperparameters of :class:`Graphormer`. Presets live in ``configs/model/``.

    Attributes:
        num_layers (int or auto): transformer layers. In a run's settings, ``auto`` (the slim
            preset's default) is 12, or 6 for an analogue series: a set to which
            ``dataset.molecule_features=auto`` gave Morgan counts (its held-out molecules are
            analogues of its training ones); the checkpoint keeps the number.
        hidden_dim, ffn_dim, num_heads: transformer size (``hidden_dim`` divisible by
            ``num_heads``).
        dropout, attention_dropout, activation_dropout: dropout rates.
        layerdrop: in training, each layer (with its message blocks) is skipped for a batch with
            this probability, independently (LayerDrop, Fan et al. 2019, arXiv 1909.11556;
            Microsoft's ``encoder_layerdrop``, Hugging Face's ``layerdrop``), which saves that
            share of the layers' time; evaluation and prediction run every layer (the passes of
            ``mc_dropout``, which run the network as in training, leave layers out too). 0 (the
            default): none.
        attention_activation: how each layer's attention turns scores into weights:
            ``"softmax"`` (the paper's, normalised over the keys) or ``"silu"`` (each weight
            SiLU of its score and bias, not normalised, so an atom's update
            sums over its neighbours instead of averaging them, as TorchMD-Net's equivariant
            transformer; masked pairs weigh 0, and with positions and ``cutoff`` each pair's
            weight fades to 0 at the cutoff by a cosine switch: with ``centrality_cutoff`` set
            too, the energy is then smooth as atoms cross the cutoff). Not part of Graphormer
            or Graphormer-3D. (default: softmax)
        input_dropout: dropout on the summed input embeddings; None uses ``dropout``
            (Microsoft's v1 code had its own rate, 0.0 in its molpcba recipe).
        pre_layernorm: pre-LN (the paper's choice) or post-LN layers.
        embedding_layernorm: a LayerNorm over the summed input embeddings (graph token included)
            before the first layer, Microsoft's ``encoder_normalize_before``; None follows
            ``pre_layernorm``. Microsoft's base and slim use post-LN layers with this LayerNorm.
        final_layernorm: a LayerNorm after the last layer (for pre-LN stacks, whose output is
            otherwise unnormalised; Microsoft's and Hugging Face's encoders define one for pre-LN
            but never apply it, so converted models leave it off).
        atom_feature_dims, bond_feature_dims: vocabulary per categorical node / edge feature;
            None means OGB's molecule featurisation (``ogb.utils.features``), an empty list no
            categorical feature.
        node_continuous_dim, edge_continuous_dim: width of the float node / edge feature
            vectors, each projected by a learned linear layer after standardisation with the
            training split's statistics (0: none). A graph with neither categorical nor
            continuous node (edge) features gets one learned node (edge) embedding.
        feature_stride: None for a compact embedding table; an int gives every feature column that
            many rows, as Microsoft's checkpoints do (512).
        max_degree: degrees above it share one centrality embedding.
        max_distance: hop distances above it share one spatial embedding.
        unreachable_as_far: unreachable pairs share the spatial embedding of pairs farther than
            ``max_distance`` instead of having their own. Microsoft's Floyd-Warshall reports both
            as distance 510, so ``max_distance=509`` with this reproduces its 512-row table.
        edge_encoding: ``"multi_hop"`` (paper default) or ``"single_hop"``.
        multi_hop_max_dist: path edges averaged by the multi-hop edge encoding.
        attention_max_distance: None, or pairs more than this many hops apart (and unreachable
            pairs) do not attend to each other, as the ``spatial_pos_max`` setting of Microsoft's
            and Hugging Face's collators does.
        head_bias: ``"per_task"`` (one output bias per task) or ``"shared"`` (one learned scalar
            added to every output, Microsoft's ``lm_output_learned_bias``).
        num_tasks: outputs of the prediction head (the graph token's); 0 only with
            ``atom_tasks`` (a model of atom targets alone).
        atom_tasks: outputs per atom of a node head on each atom's final state (issue #18);
            0 (the default) builds no node head, so every existing model is unchanged.
        bond_tasks: outputs per bond of a bond head on each bond's two atoms' final states and
            its own edge features (issue #18); 0 (the default) builds none.
        molecule_features_dim: raw molecule-level features per graph (RDKit descriptors, a
            file's columns; issue #22), read through :class:`MoleculeFeatureInput`; 0 (the
            default) builds nothing, so every existing model is unchanged.
        molecule_features_at: where they enter: ``"head"`` (beside the graph token's final
            state: the head's first layer reads both, which is a learned linear map of their
            concatenation) or ``"token"`` (a projection added to the graph token's input).
        readout: what the molecule head reads (issue #22): ``"token"`` (the graph token's final
            state alone, as the paper), ``"token_mean"`` (the graph token's state and the mean
            of the atoms' final states: the head's first layer reads both) or ``"token_sum"``
            (the graph token's head plus a sum over atoms of a learned linear contribution of
            each atom's final state: an additive term that grows with the molecule, as
            group-contribution models of extensive properties do).
        readout_init: the readout's map at initialisation (``token_sum`` and ``token_mean``):
            ``"normal"`` (N(0, 0.02), as every other linear map) or ``"zero"`` (the atoms'
            contributions start at zero, so that a large molecule's first outputs are not a sum
            of dozens of random terms).
        channels: what the network reads: ``"2d"`` (the bond graph: degrees, spatial and edge
            encodings; positions are ignored), ``"3d"`` (the atoms' own features and their
            positions through Graphormer-3D's Gaussian distance encoding; no degrees, hop
            distances or bond paths) or ``"both"`` (Transformer-M: each training batch draws 2D
            only, 3D only or both with ``channel_probs``; a batch without positions runs in 2D,
            so the model predicts from a SMILES alone).
        channel_probs: with ``channels="both"``, the probabilities of a training batch running
            ``[2d, 3d, both]`` (Transformer-M's 0.2 / 0.6 / 0.2); they sum to 1.
        num_kernels: Gaussian kernels of the distance encoding (``K``, 128 as Graphormer-3D).
        cutoff: None, or atom pairs farther apart than this (Angstrom) neither attend to each
            other nor enter the 3D centrality (for large structures).
        atom_vector_tasks: 3-vectors per atom (forces, position changes) of Graphormer-3D's
            vector head (:class:`~graphormer.models.geometry.VectorHead`); needs positions
            (``channels`` 3d or both); 0 (the default) builds none.
        forces: how the per-atom vectors (``atom_vector_tasks``) are predicted: ``"head"``
            (Graphormer-3D's vector head) or ``"gradient"`` (one vector per atom, the negative
            gradient of the first molecule output, the energy, with respect to the atom's
            position, each periodic image moving with its atom: forces that conserve energy
            where the energy is smooth, as SchNet's and DimeNet's (a hard ``cutoff``, or
            periodic images kept by distance, make it jump as atoms cross them); needs ``channels``
            3d or both (a 2D training step of ``both`` reads no positions: its forces are
            zeros and teach nothing) and one vector task, and costs
            about twice the time of a training step). The scale from the energy's units to
            the vectors' is :attr:`Graphormer.force_scale` (set by the training module).
        num_tags: rows of an embedding of each atom's tag (``batch.tags``; OC20's 0 fixed
            subsurface, 1 surface, 2 adsorbate: 3), added to its input as Graphormer-3D's
            ``tag_encoder``; 0 (the default) builds none.
        readout_min_tag: the per-atom part of a ``token_sum`` or ``token_mean`` readout counts
            the atoms whose tag is at least this; 1 is Graphormer-3D's energy over the atoms
            that move (tag > 0); 0 (the default) counts every atom.
        blocks: the layer stack runs this many times with the same weights (Graphormer-3D's
            ``--blocks``: 12 layers in 4 blocks are 48 layer passes with 12 layers' weights);
            1 (the default) runs it once.
        distance_messages: before each layer, a residual block of messages between atoms
            closer than ``message_cutoff`` through continuous filters of their distance
            kernels (SchNet's interaction; :class:`~graphormer.models.geometry.DistanceMessages`),
            so that distances shape what atoms pass to each other, not only how much they
            attend; needs ``channels`` 3d or both; not part of Graphormer-3D; False (the
            default) builds none.
        message_cutoff: Angstrom; the messages fade to zero at this distance (a cosine
            switch); at most ``cutoff`` when that is set. (default: 5.0, SchNet's)
        centrality_cutoff: Angstrom; the 3D centrality (each atom's summed kernels) sums the
            pairs closer than this only, each faded to zero there by a cosine switch: a local
            neighbour density; needs ``channels`` 3d or both. None (the default) sums every
            pair, as Graphormer-3D.
        centrality_gates: scale each pair's kernels in the 3D centrality by a learned vector
            of its pair of atom types (initialised to ones), so that each pair of elements adds
            a radial function of its own; needs ``channels`` 3d or both; False (the default) as
            Graphormer-3D. Neither option changes the attention bias.
        vector_messages: the distance messages also carry ``d`` 3-vectors per atom (PaiNN's
            equivariant message and update;
            :class:`~graphormer.models.geometry.VectorMessages`), whose scalar products give
            the states the angles between neighbours; with the vector head
            (``atom_vector_tasks``, ``forces="head"``) the forces add a linear map of the
            final vectors; needs ``distance_messages``; False (the default) as before.
        message_basis: what the distance messages' filters read: ``kernels`` (the default),
            the distance encoding's learned Gaussian kernels (the same ``psi`` as the attention
            bias); ``grid``, SchNet's fixed basis
            (:func:`~graphormer.models.geometry.gaussian_grid`: ``num_kernels`` Gaussians
            evenly spaced from 0 to ``message_cutoff``, each as wide as the spacing), which
            resolves every distance from the first step; the attention bias keeps the learned
            kernels, the centrality follows ``centrality_basis``. No parameter changes.
        centrality_basis: what the 3D centrality sums: ``kernels`` (the default), the
            distance encoding's learned kernels, as Graphormer-3D; ``grid``, the same fixed
            Gaussians as ``message_basis=grid`` over ``[0, centrality_cutoff]`` (each atom's
            smooth histogram of its neighbours' distances, itself included); needs
            ``centrality_cutoff``. The attention bias keeps the learned kernels. No parameter
            changes.
        angle_cutoff: Angstrom; each atom's input adds a smooth histogram of the angles
            between pairs of its neighbours closer than this, each pair's legs and elements
            (:class:`~graphormer.models.geometry.AngularCentrality`, a three-body term as ANI's
            angular symmetry functions); needs ``channels`` 3d or both; at most ``cutoff``.
            None (the default) builds none; not part of Graphormer-3D.
        angular_messages: after each layer's distance messages, a residual block that sums
            each atom's filtered neighbour states weighted by the powers 1 to this of the bond
            direction and adds their invariant contractions: sums over pairs of neighbours of
            the powers of the cosine of the angle between them, in every layer
            (:class:`~graphormer.models.geometry.AngularMessages`, the atomic cluster
            expansion's three-body terms); needs ``distance_messages``; 0 (the default) builds
            none; not part of Graphormer-3D.
        directional_messages: each angular block also sends along every pair ``(j, i)`` a
            message to ``i`` of the sums, over ``j``'s neighbours ``k``, of the powers of the
            cosine of the angle ``i j k``: the angles the bond makes at its other end, in
            every layer (DimeNet's directional messages, Gasteiger et al., 2020, through the
            angular block's densities instead of a sum over triplets); needs
            ``angular_messages``; False (the default) builds none; not part of Graphormer-3D.
    """

    num_layers: int = 12
    hidden_dim: int = 80
    ffn_dim: int = 80
    num_heads: int = 8
    dropout: float = 0.1
    attention_dropout: float = 0.1
    activation_dropout: float = 0.1
    input_dropout: float | None = None
    layerdrop: float = 0.0
    attention_activation: str = "softmax"
    pre_layernorm: bool = True
    atom_feature_dims: list[int] | None = None
    bond_feature_dims: list[int] | None = None
    node_continuous_dim: int = 0
    edge_continuous_dim: int = 0
    feature_stride: int | None = None
    max_degree: int = 64
    max_distance: int = 20
    edge_encoding: str = "multi_hop"
    multi_hop_max_dist: int = 5
    embedding_layernorm: bool | None = None
    final_layernorm: bool = False
    unreachable_as_far: bool = False
    attention_max_distance: int | None = None
    head_bias: str = "per_task"
    num_tasks: int = 1
    atom_tasks: int = 0
    bond_tasks: int = 0
    molecule_features_dim: int = 0
    molecule_features_at: str = "head"
    readout: str = "token"
    readout_init: str = "normal"
    channels: str = "2d"
    channel_probs: list[float] = field(default_factory=lambda: [0.2, 0.6, 0.2])
    num_kernels: int = 128
    cutoff: float | None = None
    atom_vector_tasks: int = 0
    forces: str = "head"
    num_tags: int = 0
    readout_min_tag: int = 0
    blocks: int = 1
    distance_messages: bool = False
    message_cutoff: float = 5.0
    centrality_cutoff: float | None = None
    centrality_gates: bool = False
    vector_messages: bool = False
    message_basis: str = "kernels"
    centrality_basis: str = "kernels"
    angle_cutoff: float | None = None
    angular_messages: int = 0
    directional_messages: bool = False

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_dim", "ffn_dim", "num_heads"):
            _integer(name, getattr(self, name), 1)
        _integer("atom_tasks", self.atom_tasks, 0)
        _integer("bond_tasks", self.bond_tasks, 0)
        _integer("atom_vector_tasks", self.atom_vector_tasks, 0)
        other_levels = self.atom_tasks or self.bond_tasks or self.atom_vector_tasks
        _integer("num_tasks", self.num_tasks, 0 if other_levels else 1)
        _integer("num_kernels", self.num_kernels, 1)
        _integer("num_tags", self.num_tags, 0)
        _integer("angular_messages", self.angular_messages, 0)
        _integer("readout_min_tag", self.readout_min_tag, 0)
        _integer("blocks", self.blocks, 1)
        for name in (
            "max_degree",
            "max_distance",
            "node_continuous_dim",
            "edge_continuous_dim",
            "molecule_features_dim",
        ):
            _integer(name, getattr(self, name), 0)
        _integer("multi_hop_max_dist", self.multi_hop_max_dist, 1)
        _integer("feature_stride", self.feature_stride, 1, optional=True)
        _integer("attention_max_distance", self.attention_max_distance, 0, optional=True)
        if self.attention_activation not in ACTIVATIONS:
            raise ValueError(
                f"model.attention_activation={self.attention_activation!r} is not allowed: "
                "softmax (the paper's) or silu (unnormalised weights)"
            )
        for name in ("dropout", "attention_dropout", "activation_dropout", "input_dropout"):
            value = getattr(self, name)
            if value is None and name == "input_dropout":
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
                raise ValueError(f"model.{name}={value!r} is not allowed: a rate in [0, 1]")
        drop = self.layerdrop
        if isinstance(drop, bool) or not isinstance(drop, int | float) or not 0 <= drop < 1:
            raise ValueError(
                f"model.layerdrop={drop!r} is not allowed: the chance in [0, 1) that training "
                "skips a layer for a batch (0: every layer runs)"
            )
        for name in ("pre_layernorm", "final_layernorm", "unreachable_as_far"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"model.{name}={getattr(self, name)!r} is not allowed: true or false"
                )
        if self.embedding_layernorm is not None and not isinstance(self.embedding_layernorm, bool):
            raise ValueError(
                f"model.embedding_layernorm={self.embedding_layernorm!r} is not allowed: true, "
                "false or null"
            )
        if self.hidden_dim % self.num_heads != 0:
            raise ValueError(
                f"model.hidden_dim ({self.hidden_dim}) must be divisible by model.num_heads "
                f"({self.num_heads})"
            )
        if self.edge_encoding not in ("multi_hop", "single_hop"):
            raise ValueError(
                f"model.edge_encoding must be 'multi_hop' or 'single_hop', got "
                f"{self.edge_encoding!r}"
            )
        if self.molecule_features_at not in ("head", "token"):
            raise ValueError(
                f"model.molecule_features_at must be 'head' or 'token', got "
                f"{self.molecule_features_at!r}"
            )
        if self.readout not in READOUTS:
            raise ValueError(
                f"model.readout must be one of {', '.join(READOUTS)}, got {self.readout!r}"
            )
        if self.readout_init not in ("normal", "zero"):
            raise ValueError(
                f"model.readout_init must be 'normal' or 'zero', got {self.readout_init!r}"
            )
        if self.readout_init == "zero" and self.readout == "token":
            raise ValueError(
                "model.readout_init=zero initialises the readout map of model.readout=token_sum "
                "or token_mean; model.readout=token has none (set one, or readout_init=normal)"
            )
        if self.head_bias not in ("per_task", "shared"):
            raise ValueError(
                f"model.head_bias must be 'per_task' or 'shared', got {self.head_bias!r}"
            )
        if self.atom_feature_dims is None:
            self.atom_feature_dims = ogb_atom_feature_dims()
        self._check_channels()
        if self.bond_feature_dims is None:
            self.bond_feature_dims = ogb_bond_feature_dims()
        for name in ("atom_feature_dims", "bond_feature_dims"):
            dims = getattr(self, name)
            if not isinstance(dims, list | tuple) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in dims
            ):
                raise ValueError(
                    f"model.{name}={dims!r} is not allowed: a list of vocabulary sizes >= 1 "
                    "(empty for none, or null for OGB's molecule features)"
                )
            setattr(self, name, [int(d) for d in dims])
        self._check_size()

    def _check_channels(self) -> None:
        if self.channels not in CHANNELS:
            raise ValueError(
                f"model.channels must be one of {', '.join(CHANNELS)}, got {self.channels!r}"
            )
        probs = self.channel_probs
        if (
            isinstance(probs, str)
            or not isinstance(probs, Sequence)  # a list, or Hydra's ListConfig
            or len(probs) != 3
            or not all(isinstance(p, int | float) and not isinstance(p, bool) for p in probs)
            or min(probs) < 0
            or abs(sum(probs) - 1) > 1e-6
        ):
            raise ValueError(
                f"model.channel_probs={probs!r} is not allowed: three probabilities for "
                "[2d, 3d, both] that sum to 1, e.g. [0.2, 0.6, 0.2]"
            )
        self.channel_probs = [float(p) for p in probs]
        self.cutoff = cutoff = _distance("cutoff", self.cutoff, optional=True)
        if self.channels == "2d" and self.atom_vector_tasks:
            raise ValueError(
                f"model.atom_vector_tasks={self.atom_vector_tasks} needs atom positions: set "
                "model.channels=3d or both"
            )
        if self.forces not in ("head", "gradient"):
            raise ValueError(
                f"model.forces={self.forces!r} is not allowed: head (the vector head) or "
                "gradient (forces as the energy's negative gradient)"
            )
        if self.forces == "gradient" and (
            self.channels == "2d" or self.atom_vector_tasks != 1 or self.num_tasks < 1
        ):
            raise ValueError(
                "model.forces=gradient predicts one vector per atom, the negative gradient of "
                "the first molecule target (the energy) with respect to the positions: it needs "
                "model.channels=3d or both, one molecule target and one per-atom vector target "
                f"(got channels={self.channels}, {self.num_tasks} molecule output(s), "
                f"{self.atom_vector_tasks} vector target(s))"
            )
        for name in ("distance_messages", "centrality_gates", "vector_messages"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"model.{name}={getattr(self, name)!r} is not allowed: true or false"
                )
        self.message_cutoff = _distance("message_cutoff", self.message_cutoff)
        self.centrality_cutoff = _distance(
            "centrality_cutoff", self.centrality_cutoff, optional=True
        )
        self.angle_cutoff = _distance("angle_cutoff", self.angle_cutoff, optional=True)
        for key, value in (
            ("centrality_cutoff", self.centrality_cutoff),
            ("centrality_gates", self.centrality_gates),
            ("angle_cutoff", self.angle_cutoff),
        ):
            if value not in (None, False) and self.channels == "2d":
                raise ValueError(
                    f"model.{key}={value} shapes the 3D centrality, which a 2D model does not "
                    "have: set model.channels=3d or both"
                )
        if self.distance_messages and self.channels == "2d":
            raise ValueError(
                "model.distance_messages=true passes messages through the atoms' distances: "
                "set model.channels=3d or both"
            )
        if self.angular_messages and not self.distance_messages:
            raise ValueError(
                f"model.angular_messages={self.angular_messages} adds angles to the distance "
                "messages: set model.distance_messages=true as well"
            )
        if self.directional_messages and not self.angular_messages:
            raise ValueError(
                "model.directional_messages=true sends each atom the angles its bonds make at "
                "their other end, which the angular messages compute: set "
                "model.angular_messages to 1 or more as well"
            )
        if self.vector_messages and not self.distance_messages:
            raise ValueError(
                "model.vector_messages=true adds vectors to the distance messages: set "
                "model.distance_messages=true as well"
            )
        # Each fixed grid spans 0 to its part's cutoff: (key, whether that part exists, the fix).
        bases = (
            ("message_basis", self.distance_messages, "model.distance_messages=true"),
            (
                "centrality_basis",
                self.centrality_cutoff is not None,
                "model.centrality_cutoff (Angstrom)",
            ),
        )
        for key, present, needed in bases:
            value = getattr(self, key)
            if value not in ("kernels", "grid"):
                raise ValueError(
                    f"model.{key}={value!r} is not allowed: kernels (the distance encoding's "
                    "learned kernels) or grid (SchNet's fixed Gaussian grid)"
                )
            if value == "grid" and not present:
                raise ValueError(f"model.{key}=grid spans 0 to its cutoff: set {needed} as well")
            if value == "grid" and self.num_kernels < 2:
                raise ValueError(
                    f"model.{key}=grid spaces model.num_kernels={self.num_kernels} Gaussians "
                    "from 0 to its cutoff: set model.num_kernels at least 2"
                )
        faded = (
            ("message_cutoff", self.message_cutoff if self.distance_messages else None, "messages"),
            ("centrality_cutoff", self.centrality_cutoff, "sum"),
            ("angle_cutoff", self.angle_cutoff, "angles"),
        )
        for key, reach, what in faded:
            if reach is not None and cutoff is not None and reach > cutoff:
                raise ValueError(
                    f"model.{key}={reach:g} reaches past model.cutoff={cutoff:g}, beyond which "
                    f"no pair exists (the {what} would stop abruptly there): set model.{key} "
                    "at most model.cutoff"
                )
        if self.channels != "2d" and not self.atom_feature_dims:
            raise ValueError(
                f"model.channels={self.channels} reads each atom's element from the first "
                "categorical atom feature, and model.atom_feature_dims is empty: give the "
                "atoms a categorical element column, or use model.channels=2d"
            )

    @property
    def uses_positions(self) -> bool:
        """Whether the network has the 3D encoding (``channels`` 3d or both)."""
        return self.channels != "2d"

    def estimated_parameters(self) -> int:
        """The parameter count of the network these settings build, from the settings alone
        (nothing is allocated)."""
        h, f, layers = self.hidden_dim, self.ffn_dim, self.num_layers
        per_layer = 4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h
        rows = sum(self.atom_feature_dims)
        edge_rows = sum(self.bond_feature_dims)
        if self.feature_stride is not None:
            rows = self.feature_stride * len(self.atom_feature_dims)
            edge_rows = self.feature_stride * len(self.bond_feature_dims)
        heads = self.num_heads
        # Atom rows, in- and out-degrees, the graph token; edge rows, spatial rows and the graph
        # token's distance per head.
        tables = (rows + 2 * (self.max_degree + 1) + 1) * h
        tables += (edge_rows + self.max_distance + 4) * heads
        if self.edge_encoding == "multi_hop":
            tables += self.multi_hop_max_dist * heads**2
        node_inputs, edge_inputs = self.node_continuous_dim, self.edge_continuous_dim
        tables += (node_inputs + 1) * h if node_inputs else 0
        tables += (edge_inputs + 1) * heads if edge_inputs else 0
        # A learned constant input where a graph has neither kind of feature.
        tables += h if not (self.atom_feature_dims or node_inputs) else 0
        tables += heads if not (self.bond_feature_dims or edge_inputs) else 0
        # The head's transform and LayerNorm, and the optional input and final LayerNorms.
        tables += h * h + 3 * h
        tables += 2 * h if self.uses_embedding_layernorm else 0
        tables += 2 * h if self.final_layernorm else 0
        atom_head = (h * h + 3 * h + (h + 1) * self.atom_tasks) if self.atom_tasks else 0
        bond_head = 0
        if self.bond_tasks:
            bond_head = 2 * h * h + 3 * h + (h + 1) * self.bond_tasks + edge_rows * h
        molecule = (self.molecule_features_dim + 1) * h if self.molecule_features_dim else 0
        readout = {"token": 0, "token_mean": h * h, "token_sum": h * self.num_tasks}
        molecule += readout[self.readout] if self.num_tasks else 0
        task_bias = self.num_tasks if self.head_bias == "per_task" else min(self.num_tasks, 1)
        heads = h * self.num_tasks + task_bias + atom_head + bond_head + molecule
        if self.uses_positions:
            k, types = self.num_kernels, self.atom_feature_dims[0] + 1
            tables += 2 * types * types + 2 * k + (k + 1) * (k + self.num_heads) + (k + 1) * h
            tables += types * types * k if self.centrality_gates else 0
        if self.angle_cutoff is not None:
            angular = AngularCentrality
            channels = angular.ANGLES * angular.RADII * angular.ELEMENTS
            tables += (self.atom_feature_dims[0] + 1) * angular.ELEMENTS + (channels + 1) * h
        if self.distance_messages:
            block = 14 * h * h + 15 * h if self.vector_messages else 4 * h * h + 5 * h
            tables += layers * ((self.num_kernels + 1) * h + block)
        if self.distance_messages and self.angular_messages:
            lv = self.angular_messages
            block = h * h + 2 * h + (self.num_kernels + 1) * h + (h + 1) * lv * h
            block += lv * h * h + 2 * lv * h + (lv * h + 1) * h + (h + 1) * h
            if self.directional_messages:
                block += (self.num_kernels + 1) * h + (lv * h + 1) * h + 2 * (h + 1) * h
            tables += layers * block
        if self.atom_vector_tasks and self.forces == "head":
            heads += 3 * (h * h + h) + h * self.atom_vector_tasks
            heads += h * self.atom_vector_tasks if self.vector_messages else 0
        tables += self.num_tags * h
        return layers * per_layer + tables + heads

    def _check_size(self) -> None:
        """A network that could never fit in this machine's memory is an error naming the
        setting, before anything is allocated (settings read from a checkpoint included)."""
        need = 4 * self.estimated_parameters()  # float32 weights alone
        memory = _physical_memory()
        # Half: training holds gradients and Adam's moments beside the weights, and a machine
        # never gives one process all of its memory.
        if memory and need > memory / 2:
            largest = max(
                ("num_layers", "hidden_dim", "ffn_dim", "max_degree", "max_distance"),
                key=lambda name: getattr(self, name) / _TYPICAL[name],
            )
            raise ValueError(
                f"model.{largest}={getattr(self, largest)} is not allowed: the network would "
                f"hold about {self.estimated_parameters():,} parameters ({need / 2**30:.1f} GiB in float32), "
                f"more than half of this machine's {memory / 2**30:.1f} GiB of memory"
            )

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> GraphormerConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            close = difflib.get_close_matches(unknown[0], sorted(known), n=3, cutoff=0.6)
            hint = f"did you mean {', '.join(f'model.{c}' for c in close)}? " if close else ""
            raise ValueError(
                f"unknown model option(s) {unknown}: {hint}valid options: {sorted(known)}"
            )
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def hops_needed(self) -> int:
        """Path edges per node pair the data must carry (``max_hops``): the multi-hop edge
        encoding reads ``multi_hop_max_dist`` of them, the single-hop one only the first."""
        return self.multi_hop_max_dist if self.edge_encoding == "multi_hop" else 1

    def check_hops(self, max_hops: int, key: str = "datamodule.max_hops") -> None:
        """Raises ``ValueError`` naming ``key`` if data cached or batched with ``max_hops`` path
        edges per pair is too short for this model (the one rule: training's settings, a
        checkpoint's stored ones and the Predictor's batches all ask here)."""
        if max_hops < self.hops_needed:
            raise ValueError(
                f"model.multi_hop_max_dist={self.multi_hop_max_dist} exceeds {key}={max_hops}: "
                f"the edge paths would be too short; raise {key} to at least {self.hops_needed}"
            )

    @property
    def uses_embedding_layernorm(self) -> bool:
        """Whether the summed input embeddings are normalised (``embedding_layernorm`` resolved)."""
        if self.embedding_layernorm is None:
            return self.pre_layernorm
        return self.embedding_layernorm


# model.num_layers=auto (the slim preset's default): 12 layers, or 6 for an analogue series, a set
# whose dataset.molecule_features=auto found its held-out molecules analogues of its training ones
# and gave Morgan counts beside the graph. On MoleculeACE's sets the shallower model scores as the
# deeper one at about two thirds of its time (docs/benchmarks/moleculeace.md).
AUTO_DEPTH = 12
ANALOGUE_DEPTH = 6


def resolve_depth(num_layers: int | str, analogues: bool) -> int | str:
    """``model.num_layers``: ``auto`` becomes :data:`ANALOGUE_DEPTH` when the data is an
    analogue series (``analogues``), else :data:`AUTO_DEPTH`; any other value is kept."""
    if num_layers == "auto":
        return ANALOGUE_DEPTH if analogues else AUTO_DEPTH
    return num_layers


# Sizes of the presets (slim), to name the setting that makes a network too large.
_TYPICAL = {
    "num_layers": 12,
    "hidden_dim": 80,
    "ffn_dim": 80,
    "max_degree": 64,
    "max_distance": 20,
}


def _integer(name: str, value: Any, least: int, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        null = " or null" if optional else ""
        raise ValueError(f"model.{name}={value!r} is not allowed: an integer >= {least}{null}")


def _distance(name: str, value: Any, optional: bool = False) -> float | None:
    """``value`` as a float distance > 0 (Angstrom), or None where ``optional``; else the
    ``model.<name>`` error."""
    if value is None and optional:
        return None
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and value > 0):
        null = ", or null" if optional else ""
        raise ValueError(f"model.{name}={value!r} is not allowed: a distance > 0 in Angstrom{null}")
    return float(value)


def _image_copies(image_of: Tensor | None) -> Tensor | None:
    """``[B * (N+1)]`` for each token of the padded layout (graph token first), the token whose
    state it holds: itself, or for a periodic image its source atom; None without images."""
    if image_of is None:
        return None
    b, n = image_of.shape
    length = n + 1
    base = torch.arange(b, device=image_of.device).unsqueeze(1) * length  # [B, 1]
    own = base + torch.arange(length, device=image_of.device)  # [B, N+1]
    source = F.pad(image_of, (1, 0), value=-1)  # [B, N+1]
    return torch.where(source >= 0, base + 1 + source, own).reshape(-1)


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: no check
        return None


# The layers run on packed real tokens unless these fill at least this share of a batch's rows.
_PACK_BELOW = 0.9


class Graphormer(nn.Module):
    """Graphormer: a transformer over the nodes of a graph plus a graph token, with centrality,
    spatial and edge encodings (Ying et al., 2021).

    Args:
        config (GraphormerConfig): hyperparameters.

    Shapes:
        - input: a :class:`~graphormer.data.GraphormerBatch` of ``B`` graphs padded to ``N`` nodes
        - output: ``[B, num_tasks]``; with ``return_attention`` also a list of
          ``num_layers * blocks`` per-head attention maps ``[B, H, N + 1, N + 1]`` (graph
          token at index 0)
    """

    def __init__(self, config: GraphormerConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.node_encoder = NodeEncoder(
            c.atom_feature_dims,
            c.hidden_dim,
            c.max_degree,
            c.feature_stride,
            c.node_continuous_dim,
        )
        self.attn_bias = GraphAttentionBias(
            c.num_heads,
            c.bond_feature_dims,
            c.max_distance,
            c.edge_encoding,
            c.multi_hop_max_dist,
            c.feature_stride,
            c.unreachable_as_far,
            c.edge_continuous_dim,
        )
        # The 3D channel (Graphormer-3D's encoding) only when asked for: 2D models and their
        # checkpoints keep exactly their tensors. Atom types are the first atom feature + 1.
        self.geometry = (
            GaussianDistanceEncoding(
                c.num_heads,
                c.hidden_dim,
                c.atom_feature_dims[0] + 1,
                c.num_kernels,
                c.cutoff,
                c.centrality_cutoff,
                c.centrality_gates,
                c.centrality_basis,
            )
            if c.uses_positions
            else None
        )
        # Only when asked for, as the 3D channel: existing checkpoints keep their tensors.
        self.angles = (
            AngularCentrality(c.hidden_dim, c.atom_feature_dims[0] + 1, c.angle_cutoff)
            if c.uses_positions and c.angle_cutoff is not None
            else None
        )
        messages = VectorMessages if c.vector_messages else DistanceMessages
        self.messages = (
            nn.ModuleList(messages(c.num_kernels, c.hidden_dim) for _ in range(c.num_layers))
            if c.distance_messages
            else None
        )
        self.angular = (
            nn.ModuleList(
                AngularMessages(
                    c.num_kernels, c.hidden_dim, c.angular_messages, c.directional_messages
                )
                for _ in range(c.num_layers)
            )
            if c.distance_messages and c.angular_messages
            else None
        )
        self.tag_encoder = nn.Embedding(c.num_tags, c.hidden_dim) if c.num_tags else None
        self.graph_token = nn.Parameter(torch.empty(1, 1, c.hidden_dim))
        # Microsoft's encoder_normalize_before: one LayerNorm over the summed input embeddings.
        self.input_norm = (
            nn.LayerNorm(c.hidden_dim) if c.uses_embedding_layernorm else nn.Identity()
        )
        self.input_dropout = Dropout(c.dropout if c.input_dropout is None else c.input_dropout)
        self.layers = nn.ModuleList(
            GraphormerLayer(
                c.hidden_dim,
                c.ffn_dim,
                c.num_heads,
                c.dropout,
                c.attention_dropout,
                c.activation_dropout,
                c.pre_layernorm,
                c.attention_activation,
            )
            for _ in range(c.num_layers)
        )
        self.final_norm = nn.LayerNorm(c.hidden_dim) if c.final_layernorm else nn.Identity()
        # The head as Microsoft's: transform, GELU, LayerNorm, then the output layer. A model of
        # atom targets alone (num_tasks 0) has none: parameters without a gradient would stall
        # distributed training.
        self.head_transform = self.head_norm = self.head = None
        if c.num_tasks:
            self.head_transform = nn.Linear(c.hidden_dim, c.hidden_dim)
            self.head_norm = nn.LayerNorm(c.hidden_dim)
            self.head = nn.Linear(c.hidden_dim, c.num_tasks, bias=c.head_bias != "shared")
        if c.head_bias == "shared" and c.num_tasks:
            self.head_bias = nn.Parameter(torch.zeros(1))
        else:
            self.register_parameter("head_bias", None)
        # Only when asked for: existing models and checkpoints keep exactly their tensors.
        self.atom_head = NodeHead(c.hidden_dim, c.atom_tasks) if c.atom_tasks else None
        self.vector_head = (
            VectorHead(c.hidden_dim, c.num_heads, c.atom_vector_tasks)
            if c.atom_vector_tasks and c.forces == "head"
            else None
        )
        # With vector messages the atoms' vectors add a linear (equivariant) readout to the head.
        self.vector_out = (
            nn.Linear(c.hidden_dim, c.atom_vector_tasks, bias=False)
            if self.vector_head is not None and c.vector_messages
            else None
        )
        if c.forces == "gradient":
            # The energy's units over the vectors' (both standardised in training); 1 until
            # the training module sets it from the training targets, kept in checkpoints.
            self.register_buffer("force_scale", torch.ones(1))
        self.bond_head = (
            BondHead(c.hidden_dim, c.bond_tasks, c.bond_feature_dims, c.feature_stride)
            if c.bond_tasks
            else None
        )
        # Likewise only when asked for (issue #22).
        self.molecule_input = (
            MoleculeFeatureInput(c.molecule_features_dim, c.hidden_dim)
            if c.molecule_features_dim
            else None
        )
        # The readout's own map (issue #22); none for the paper's graph-token readout, so every
        # existing model keeps exactly its tensors. Neither map has a bias: the head's has one.
        self.readout = None
        if c.num_tasks and c.readout == "token_mean":
            self.readout = nn.Linear(c.hidden_dim, c.hidden_dim, bias=False)
        elif c.num_tasks and c.readout == "token_sum":
            self.readout = nn.Linear(c.hidden_dim, c.num_tasks, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # BERT-style initialisation, as in Microsoft's Graphormer: N(0, 0.02) weights, zero biases.
        for module in self.modules():
            if isinstance(module, nn.Linear):
                bert_init_(module)
            elif isinstance(module, nn.LayerNorm):
                module.reset_parameters()
        self.node_encoder.reset_parameters()
        self.attn_bias.reset_parameters()
        if self.geometry is not None:
            self.geometry.reset_parameters()
        if self.angles is not None:
            self.angles.reset_parameters()
        nn.init.normal_(self.graph_token, std=0.02)
        if self.tag_encoder is not None:
            nn.init.normal_(self.tag_encoder.weight, std=0.02)
        if self.head_bias is not None:
            nn.init.zeros_(self.head_bias)
        if self.readout is not None and self.config.readout_init == "zero":
            nn.init.zeros_(self.readout.weight)

    def encode(
        self,
        batch: GraphormerBatch,
        return_attention: bool = False,
        perturb: Tensor | None = None,
    ) -> tuple[Tensor, list[Tensor]]:
        """Final hidden states ``[B, N + 1, d]`` (graph token first; zeros at padding) and the
        attention maps.

        ``perturb`` ``[B, N, d]`` is added to the node input embeddings (FLAG's adversarial
        perturbation; Kong et al., 2020), at real nodes only; the graph token is never perturbed.
        """
        h, attentions, *_ = self._encode(batch, return_attention, perturb)
        return h, attentions

    def channels(self, batch: GraphormerBatch) -> tuple[bool, bool]:
        """Whether this pass reads the bond graph (2D) and the positions (3D): ``channels``
        decides, and with ``both`` a training pass draws one of 2D, 3D and both with
        ``channel_probs`` (Transformer-M); a batch without positions runs in 2D."""
        mode = self.config.channels
        if mode == "2d":
            return True, False
        if batch.pos is None:
            if mode == "3d":
                # A user's error (predicting a 3D model from SMILES): one error line, not a
                # traceback.
                raise DataError(
                    "model.channels=3d reads atom positions and these graphs carry none: give "
                    "them positions (a structure file, graphs with pos, or predict.py "
                    "conformers=true for a model trained on dataset.conformers=rdkit), or "
                    "train with model.channels=both to predict from bonds alone"
                )
            return True, False
        if mode == "3d":
            return False, True
        if not self.training:
            return True, True
        # torch's generator: seeded runs draw the same channels.
        draw = int(torch.multinomial(torch.tensor(self.config.channel_probs), 1))
        return ((True, False), (False, True), (True, True))[draw]

    def _encode(
        self,
        batch: GraphormerBatch,
        return_attention: bool = False,
        perturb: Tensor | None = None,
    ) -> tuple[Tensor, list[Tensor], Tensor, Tensor | None]:
        """:meth:`encode`'s states and maps, the masked attention bias the layers read, and
        the atoms' vectors ``[B, N + 1, 3, d]`` of ``model.vector_messages`` (None without)."""
        node_mask = batch.node_mask
        use_2d, use_3d = self.channels(batch)
        h = self.node_encoder(
            batch.x, batch.in_degree, batch.out_degree, node_mask, batch.x_continuous, use_2d
        )  # [B, N, d]
        geometry = None
        if use_3d:
            atom_type = (batch.x[..., 0] + 1) * node_mask  # [B, N], 0 at padding
            geometry = self.geometry.encode(batch.pos, atom_type, node_mask)
            h = h + geometry[1].to(h.dtype)  # the 3D centrality
            if self.angles is not None:
                h = h + self.angles(geometry[3], atom_type, node_mask).to(h.dtype)
        elif self.geometry is not None:
            h = touch(h, self.geometry)
            if self.angles is not None:
                h = touch(h, self.angles)
            if self.messages is not None:
                h = touch(h, self.messages)
            if self.angular is not None:
                h = touch(h, self.angular)
        if self.tag_encoder is not None:
            h = h + self.tag_encoder(self._tags(batch)) * node_mask.unsqueeze(-1).to(h.dtype)
        if perturb is not None:
            h = h + perturb.to(h.dtype) * node_mask.unsqueeze(-1).to(h.dtype)
        token = self.graph_token.expand(h.size(0), -1, -1).to(h.dtype)  # [B, 1, d]
        if self.molecule_input is not None and self.config.molecule_features_at == "token":
            token = token + self._molecule_vector(batch).unsqueeze(1).to(h.dtype)
        h = torch.cat([token, h], dim=1)  # [B, N+1, d]
        h = self.input_dropout(self.input_norm(h))
        copies = _image_copies(batch.image_of)  # [B * (N+1)], or None without images
        if copies is not None:
            h = h.flatten(0, 1).index_select(0, copies).view_as(h)

        # The bias is computed once and shared by every layer, as in the paper; the padding mask
        # is folded into it once too. Keys at padding get the most negative value; the graph
        # token (column 0) is never masked, so no query row is empty.
        attn_bias = self.attn_bias(
            batch.spatial_pos,
            batch.edge_path,
            batch.edge_attr,
            batch.edge_attr_continuous,
            structure=use_2d,
        )
        if geometry is not None:
            # The distance bias beside the spatial and edge ones; none to or from the graph token.
            attn_bias = attn_bias + F.pad(geometry[0], (1, 0, 1, 0)).to(attn_bias.dtype)
        # Cast once to the dtype attention computes in (bf16 under autocast), not once per layer,
        # and mask with that dtype's own most negative value (float32's would overflow to -inf).
        dtype = attn_bias.dtype
        if torch.is_autocast_enabled(h.device.type):
            dtype = torch.get_autocast_dtype(h.device.type)
        key_padding_mask = F.pad(~node_mask, (1, 0), value=False)  # [B, N+1]
        masked = key_padding_mask[:, None, :]  # [B, 1, N+1]
        if geometry is not None:
            # Pairs beyond model.cutoff do not attend (the diagonal never is: no empty row).
            masked = masked | F.pad(geometry[2], (1, 0, 1, 0), value=False)
        limit = self.config.attention_max_distance
        if batch.image_of is not None:
            # The graph token reads the real atoms only: their count, not the images', is the
            # structure's (and the images are copies of them).
            images = F.pad(batch.image_of >= 0, (1, 0), value=False)  # [B, N+1]
            token_row = F.pad(images.unsqueeze(1), (0, 0, 0, h.size(1) - 1), value=False)
            masked = masked | token_row  # [B, N+1, N+1]: row 0 only
        if limit is not None and use_2d:
            # Pairs too far apart (or unreachable) do not attend; never the graph token.
            spatial_pos = batch.spatial_pos.long()
            too_far = (spatial_pos > limit) | (spatial_pos < 0)  # [B, N, N]
            masked = masked | F.pad(too_far, (1, 0, 1, 0), value=False)  # [B, N+1, N+1]
        gate = None
        if self.config.attention_activation == "silu":
            # Unnormalised weights: masked pairs are multiplied by 0, and within a cutoff each
            # pair's weight fades to 0 at it (smooth in the positions).
            gate = (~masked).unsqueeze(1).to(dtype)  # [B, 1, N+1 or 1, N+1]
            if geometry is not None and self.config.cutoff is not None:
                graph, i, j, _, distance, _ = geometry[3]
                fade = torch.ones_like(geometry[2], dtype=distance.dtype)  # [B, N, N]
                fade = fade.index_put((graph, i, j), cosine_switch(distance, self.config.cutoff))
                gate = gate * F.pad(fade, (1, 0, 1, 0), value=1.0).unsqueeze(1).to(dtype)
        attn_bias = attn_bias.to(dtype).masked_fill(
            masked[:, None], torch.finfo(dtype).min
        )  # [B, H, N+1, N+1]
        # The layers run on the real tokens only (graph tokens and nodes, packed [T, d]): a
        # padded batch of mixed-size molecules is mostly padding, which every per-token matmul
        # would otherwise compute. Padding rows come back as zeros. A batch of similar sizes
        # (little padding) skips the packing, which would then cost more than it saves.
        batch, length, width = h.shape
        real = F.pad(node_mask, (1, 0), value=True)  # [B, N+1]
        packed = row = None
        # An exported network keeps one path for every batch (ONNX shapes must not depend on
        # the data): the padded one.
        if not torch.onnx.is_in_onnx_export() and real.sum() < _PACK_BELOW * real.numel():
            tokens = real.reshape(-1).nonzero().squeeze(1)  # [T]
            packed = (tokens, batch, length)
            h = h.reshape(batch * length, width).index_select(0, tokens)  # [T, d]
            # Each padded row's packed row (-1 at padding).
            row = torch.full((batch * length,), -1, dtype=tokens.dtype, device=tokens.device)
            row.index_copy_(0, tokens, torch.arange(tokens.numel(), device=tokens.device))
            if copies is not None:
                # The copies' sources as rows of the packed tokens (sources are real tokens).
                copies = row[copies.index_select(0, tokens)]  # [T]
        pairs = vectors = layout = None
        if geometry is not None and self.messages is not None:
            pairs = self._message_pairs(geometry[3], length, row)
            if self.angular is not None:  # the neighbours' layout, shared by every layer
                layout = self.angular[0].layout(
                    pairs[0], pairs[4], h.numel() // width, self.config.angular_messages
                )
        attentions = []
        skip = self._skipped_layers()
        for block in range(self.config.blocks):  # Graphormer-3D's blocks share the layers' weights
            for index, layer in enumerate(self.layers):
                if skip is not None and skip[block][index]:
                    continue  # LayerDrop: this layer and its messages are left out this batch
                if pairs is not None:
                    shape = h.shape
                    if self.config.vector_messages:
                        h, vectors = self.messages[index](h.reshape(-1, width), vectors, *pairs)
                        h = h.view(shape)
                    else:
                        h = self.messages[index](h.reshape(-1, width), *pairs[:4]).view(shape)
                    if copies is not None:
                        h = h.flatten(0, -2).index_select(0, copies).view_as(h)
                        if vectors is not None:
                            vectors = vectors.index_select(0, copies)
                    if self.angular is not None:
                        # Each neighbour's state as its source atom's (images copied above).
                        h = self.angular[index](h.reshape(-1, width), *pairs, copies, layout)
                        h = h.view(shape)
                        if copies is not None:
                            h = h.flatten(0, -2).index_select(0, copies).view_as(h)
                h, weights = layer(
                    h, attn_bias, need_weights=return_attention, packed=packed, attn_gate=gate
                )
                if copies is not None:
                    # A periodic image is its source atom seen across the boundary: it holds
                    # the source's state in every layer, so an atom's state depends on its
                    # periodic neighbours only, not on which copy is the one in the cell.
                    h = h.flatten(0, -2).index_select(0, copies).view_as(h)
                if return_attention:
                    attentions.append(weights)
        h = self.final_norm(h)
        if vectors is not None:
            if packed is not None:
                vectors = vectors.new_zeros(batch * length, 3, width).index_copy(
                    0, packed[0], vectors
                )
            vectors = vectors.view(batch, length, 3, width)
            vectors = vectors * real[..., None, None].to(vectors.dtype)
        if packed is None:
            return h * real.unsqueeze(-1).to(h.dtype), attentions, attn_bias, vectors
        h = h.new_zeros(batch * length, width).index_copy(0, packed[0], h)
        return h.view(batch, length, width), attentions, attn_bias, vectors

    def _skipped_layers(self) -> list[list[bool]] | None:
        """``[blocks][layers]``: which layers training leaves out of this batch
        (``model.layerdrop``), drawn from torch's CPU generator (no device sync); None when
        every layer runs (evaluation, or no LayerDrop)."""
        if not self.training or not self.config.layerdrop:
            return None
        shape = (self.config.blocks, len(self.layers))
        return (torch.rand(shape) < self.config.layerdrop).tolist()

    def _message_pairs(
        self, pairs: tuple[Tensor, ...], length: int, row: Tensor | None
    ) -> tuple[Tensor, ...]:
        """The distance messages' ``(target rows, source rows, kernels, switch)``, and with
        ``model.vector_messages`` or ``model.angular_messages`` each pair's unit vector from
        target to source: the pairs of distinct atoms within ``message_cutoff``, as rows of the
        layers' states: padded ``[B * (N+1)]`` (the graph token is row 0 of each graph), or
        packed ``[T]`` through ``row``, each padded row's packed one. The kernels are the distance encoding's, or
        with ``model.message_basis=grid`` SchNet's fixed grid of as many Gaussians."""
        graph, i, j, psi, distance, unit = pairs
        keep = (i != j) & (distance < self.config.message_cutoff)
        graph, i, j, psi, distance, unit = (t[keep] for t in pairs)
        target, source = graph * length + 1 + i, graph * length + 1 + j
        if row is not None:
            target, source = row[target], row[source]
        if self.config.message_basis == "grid":
            psi = gaussian_grid(distance, self.config.message_cutoff, psi.size(-1))
        found = (target, source, psi, cosine_switch(distance, self.config.message_cutoff))
        if self.config.vector_messages or self.config.angular_messages:
            return (*found, unit)
        return found

    def forward(
        self,
        batch: GraphormerBatch,
        return_attention: bool = False,
        perturb: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        h, attentions = self.encode(batch, return_attention, perturb)
        out = self.molecule_output(h, batch)
        return (out, attentions) if return_attention else out

    def _molecule_vector(self, batch: GraphormerBatch) -> Tensor:
        """``[B, d]`` learned projection of the batch's molecule features."""
        if batch.molecule_features is None:
            raise ValueError(
                f"the model reads {self.config.molecule_features_dim} molecule features per "
                "graph (issue #22) but the batch carries none"
            )
        width = batch.molecule_features.size(-1)
        if width != self.config.molecule_features_dim:
            raise ValueError(
                f"the batch carries {width} molecule feature(s) per graph but the model reads "
                f"{self.config.molecule_features_dim}"
            )
        return self.molecule_input(batch.molecule_features)

    def molecule_output(self, h: Tensor, batch: GraphormerBatch) -> Tensor:
        """``[B, num_tasks]``: the molecule head on :meth:`encode`'s final states ``h`` through
        the configured readout (what :meth:`forward` returns)."""
        if self.head is None:  # atom targets alone
            return h.new_zeros(h.size(0), 0)
        state, atoms = self.head_inputs(h, batch)
        out = self.head(state)  # [B, T]
        if atoms is not None:
            out = out + self.readout(atoms)  # sum_i w . h_i: one contribution per atom
        if self.head_bias is not None:
            out = out + self.head_bias
        return out

    def head_inputs(self, h: Tensor, batch: GraphormerBatch) -> tuple[Tensor, Tensor | None]:
        """What the molecule output is linear in: the head's state ``[B, d]`` (the output
        layer ``head`` reads it) and, for a ``token_sum`` readout, the atoms' sum ``[B, d]``
        (``readout`` reads it; else None). The output is ``head(state) + readout(atoms)`` plus
        any shared bias; ``pretrained_head=probe`` fits those maps on a frozen network."""
        graph = h[:, 0]  # [B, d], the graph token's final state
        hidden = self.head_transform(graph)  # [B, d]
        if self.molecule_input is not None and self.config.molecule_features_at == "head":
            # W [state; features] + b, written as a sum of two linear maps.
            hidden = hidden + self._molecule_vector(batch).to(hidden.dtype)
        readout = self.config.readout
        atoms = None
        if readout != "token":
            counted = self.readout_atoms(batch)  # [B, N]
            atoms = (h[:, 1:] * counted.unsqueeze(-1).to(h.dtype)).sum(1)  # [B, d]
        if readout == "token_mean":
            count = counted.sum(1, keepdim=True).clamp(min=1).to(h.dtype)  # [B, 1]
            # W [token; mean] + b, again as a sum of two linear maps.
            hidden = hidden + self.readout(atoms / count)
            atoms = None
        return self.head_norm(F.gelu(hidden)), atoms

    def atom_contributions(self, h: Tensor, batch: GraphormerBatch) -> Tensor:
        """``[B, N, num_tasks]``: each atom's additive term of a ``token_sum`` readout, read from
        :meth:`encode`'s ``h`` (zeros at padding); the molecule's output is the graph token's
        head plus their sum over atoms."""
        if self.config.readout != "token_sum" or self.readout is None:
            raise ValueError(
                f"atom contributions exist for model.readout=token_sum only (this model has "
                f"{self.config.readout!r}{' and no molecule head' if self.head is None else ''})"
            )
        per_atom = self.readout(h[:, 1:])  # [B, N, T]
        return per_atom * self.readout_atoms(batch).unsqueeze(-1).to(per_atom.dtype)

    def _tags(self, batch: GraphormerBatch) -> Tensor:
        """``[B, N]`` the batch's atom tags, checked against the tag table."""
        if batch.tags is None:
            raise DataError(
                f"the model reads atom tags (model.num_tags={self.config.num_tags}) and these "
                "structures carry none: give them tags (ASE's atoms.set_tags), or train with "
                "model.num_tags=0"
            )
        if batch.tags.numel() and (
            batch.tags.min() < 0 or batch.tags.max() >= self.config.num_tags
        ):
            raise DataError(
                f"an atom's tag is {int(batch.tags.max())}, outside the model's "
                f"0..{self.config.num_tags - 1}: raise model.num_tags above the largest tag"
            )
        return batch.tags

    def readout_atoms(self, batch: GraphormerBatch) -> Tensor:
        """``[B, N]`` bool: the atoms a per-atom readout sums: real atoms (no padding, no
        periodic image) whose tag is at least ``readout_min_tag``."""
        counted = batch.atom_mask
        if self.config.readout_min_tag:
            if batch.tags is None:
                raise DataError(
                    f"model.readout_min_tag={self.config.readout_min_tag} sums the atoms by "
                    "their tags and these structures carry none: give them tags, or set "
                    "model.readout_min_tag=0"
                )
            counted = counted & (batch.tags >= self.config.readout_min_tag)
        return counted

    def forward_levels(
        self,
        batch: GraphormerBatch,
        return_attention: bool = False,
        perturb: Tensor | None = None,
    ) -> dict[str, Tensor] | tuple[dict[str, Tensor], list[Tensor]]:
        """Outputs of every level the model predicts, from one pass of the encoder:
        ``molecule`` ``[B, num_tasks]`` (what :meth:`forward` returns) and, with ``atom_tasks``,
        ``atom`` ``[B, N, atom_tasks]`` (values at padding are meaningless; mask them with
        ``batch.node_mask``), with ``bond_tasks``, ``bond`` ``[B, M, bond_tasks]`` for the
        batch's ``bond_atoms`` (mask with ``batch.bond_mask``) and, with ``atom_vector_tasks``,
        ``atom_vector`` ``[B, N, atom_vector_tasks, 3]`` (zeros at padding)."""
        if self.config.forces == "gradient":
            return self._levels_and_forces(batch, return_attention, perturb)
        return self._levels(batch, return_attention, perturb)

    def _levels_and_forces(
        self,
        batch: GraphormerBatch,
        return_attention: bool = False,
        perturb: Tensor | None = None,
    ) -> dict[str, Tensor] | tuple[dict[str, Tensor], list[Tensor]]:
        """:meth:`_levels` with ``atom_vector`` the negative gradient of the first molecule
        output with respect to the real atoms' positions, times :attr:`force_scale`.

        A periodic image's position is its atom's plus a fixed cell shift, so an atom's force
        sums the gradients at its images too. Training differentiates the forces again (a loss
        on them): plain operations replace the fused kernels there
        (:func:`~graphormer.models.dropout.twice_differentiable`). Under ``no_grad`` or
        ``inference_mode`` (evaluation, prediction) the gradient is still taken, on copies of
        the batch's tensors, and the outputs come back detached."""
        if batch.pos is None:
            raise ValueError(
                "the model predicts forces as its energy's gradient with respect to atom "
                "positions (model.forces=gradient), and the batch carries none"
            )
        train = self.training and torch.is_grad_enabled()
        plain = twice_differentiable() if train else contextlib.nullcontext()
        with torch.inference_mode(False), torch.enable_grad(), plain:
            tensors = [getattr(batch, f.name) for f in dataclasses.fields(batch)]
            if any(isinstance(t, Tensor) and torch.is_inference(t) for t in tensors):
                batch = batch._apply(torch.clone)  # inference tensors take no gradient
            pos = batch.pos
            b, n = pos.shape[:2]
            index = torch.arange(n, device=pos.device).expand(b, n)
            if batch.image_of is not None:
                index = torch.where(batch.image_of >= 0, batch.image_of, index)
            source = index.unsqueeze(-1).expand(-1, -1, 3)  # [B, N, 3]
            shift = (pos - pos.gather(1, source)).detach()  # zero at the real atoms
            leaf = pos.detach().requires_grad_(True)
            moved = dataclasses.replace(batch, pos=leaf.gather(1, source) + shift)
            found = self._levels(moved, return_attention, perturb)
            out, attentions = found if return_attention else (found, None)
            energy = out["molecule"][:, 0].float().sum()
            # A pass that reads positions reads every one (the distance encoding takes each
            # pair, an atom with itself included): zeros for a lone atom. A 2D training step of
            # a `both` model reads none, and its energy has no gradient: zeros.
            (grad,) = torch.autograd.grad(
                energy, leaf, create_graph=train, allow_unused=True, materialize_grads=True
            )
        mask = batch.atom_mask[..., None, None]
        vectors = -grad.unsqueeze(2) * self.force_scale.to(grad.dtype)  # [B, N, 1, 3]
        out["atom_vector"] = vectors * mask.to(vectors.dtype)
        if not train:
            out = {key: value.detach() for key, value in out.items()}
            if attentions is not None:
                attentions = [a.detach() for a in attentions]
        return (out, attentions) if return_attention else out

    def _levels(
        self,
        batch: GraphormerBatch,
        return_attention: bool = False,
        perturb: Tensor | None = None,
    ) -> dict[str, Tensor] | tuple[dict[str, Tensor], list[Tensor]]:
        """:meth:`forward_levels` without forces from the energy's gradient."""
        h, attentions, attn_bias, atom_vectors = self._encode(batch, return_attention, perturb)
        out = {"molecule": self.molecule_output(h, batch)}
        if self.atom_head is not None:
            out["atom"] = self.atom_head(h[:, 1:])  # [B, N, T_atom], graph token dropped
            out["atom"] = out["atom"] * batch.atom_mask.unsqueeze(-1).to(out["atom"].dtype)
        if self.vector_head is not None:
            if batch.pos is None:
                raise ValueError(
                    "the model predicts per-atom vectors (model.atom_vector_tasks) from atom "
                    "positions, and the batch carries none"
                )
            vectors = self.vector_head(h[:, 1:], batch.pos, attn_bias[:, :, 1:, 1:])
            if self.vector_out is not None and atom_vectors is not None:
                # [B, N, 3, d] -> [B, N, T, 3]: one map over the channels for every axis.
                vectors = vectors + self.vector_out(atom_vectors[:, 1:]).transpose(-1, -2)
            elif self.vector_out is not None:
                # A 2D step of a `both` model has no vectors: a zero gradient for the map.
                vectors = touch(vectors, self.vector_out)
            # Zeros at padding and at periodic images: outputs are the real atoms'.
            out["atom_vector"] = vectors * batch.atom_mask[..., None, None].to(vectors.dtype)
        if self.bond_head is not None:
            if batch.bond_atoms is None:
                raise ValueError(
                    "the model predicts bond targets but the batch lists no bonds (bond_atoms)"
                )
            # A batch of bond-less molecules has no edge rows to read (its bonds are padding).
            readable = batch.edge_attr.size(0) and batch.edge_attr.size(-1)
            attr = batch.edge_attr[batch.bond_edge] if readable else None  # [B, M, F_e]
            out["bond"] = self.bond_head(h[:, 1:], batch.bond_atoms, attr)  # [B, M, T_bond]
        return (out, attentions) if return_attention else out
