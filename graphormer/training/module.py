"""The LightningModule: Graphormer, masked losses, the paper's optimiser, OGB's Evaluator."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_only, rank_zero_warn
from torch import Tensor

from graphormer import checkpoint as checkpoints
from graphormer.batch import GraphormerBatch
from graphormer.console import report
from graphormer.data.conformers import mean_over_repeats
from graphormer.data.datamodule import GraphDataModule
from graphormer.data.tasks import (
    ATOM_VECTOR,
    ITEM_LEVELS,
    Level,
    TaskInfo,
    score,
    score_level,
    score_reported,
)
from graphormer.errors import DataError, UserFacingError
from graphormer.models.graphormer import Graphormer, GraphormerConfig
from graphormer.training.kernel import FingerprintKernel
from graphormer.training.rng import (
    capture_rng_states_of_all_ranks,
    restore_rng_state_of_rank,
)
from graphormer.training.schedule import warmup_linear_decay
from graphormer.training.settings import (
    ITEM_LOSSES,
    NONFINITE,
    FlagSettings,
    auto_loss,
    resolve_loss,
)
from graphormer.uncertainty.heads import (
    DISTRIBUTION_WIDTHS,
    EVIDENTIAL_LAMBDA,
    distribution_nll,
    distribution_parameters,
    distribution_variance,
)

__all__ = [
    "EVIDENTIAL_LAMBDA",
    "LEVELS",
    "GraphormerModule",
    "NonFiniteError",
    "auto_loss",
    "distribution_parameters",
    "distribution_variance",
    "masked_loss",
]

# The checkpoint entries of a fine-tuning run (written and read by graphormer.checkpoint alone;
# named here for the callers that imported them from this module).
PRETRAINED_KEY = checkpoints.PRETRAINED_KEY
ANCHOR_KEY = checkpoints.ANCHOR_KEY
PROBED_KEY = checkpoints.PROBED_KEY
# The parameter-group key of the rate that pulls copied tensors to their pre-trained values.
_ANCHOR_DECAY = "pretrained_decay"

# The levels a model predicts (issue #18): ``loss_weights`` keys.
LEVELS = ("molecule", *(level.name for level in ITEM_LEVELS))
# The model settings that set tensors' shapes (named when a checkpoint's settings do not fit).
_SIZE_SETTINGS = (
    "hidden_dim",
    "ffn_dim",
    "num_heads",
    "max_degree",
    "max_distance",
    "multi_hop_max_dist",
    "atom_feature_dims",
    "bond_feature_dims",
    "feature_stride",
    "edge_encoding",
    "node_continuous_dim",
    "edge_continuous_dim",
    "molecule_features_dim",
    "channels",
    "num_kernels",
    "num_tags",
)


def _short(items: list[str], limit: int = 6) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


class NonFiniteError(UserFacingError, FloatingPointError):
    """Training diverged: a loss or a gradient is NaN or infinite (issue #20)."""


def masked_loss(pred: Tensor, target: Tensor, loss: str) -> Tensor:
    """Mean loss over the labelled entries only (NaN targets are missing labels).

    A batch with no labelled entry gives a zero that still depends on ``pred`` (so DDP sees a
    gradient for every parameter).
    """
    # Unlabelled entries are replaced and weigh nothing, rather than selected out: boolean
    # indexing and a Python test of the mask would each wait for the GPU (a host
    # synchronisation in every training step, issue #21). Replacing ``pred`` there too keeps a
    # NaN prediction for a missing label out of the loss and its gradient, as selecting did.
    if loss == "ce":
        # Multi-class: pred [B, C] logits, target [B, 1] class ids (NaN = unlabelled).
        labelled = ~torch.isnan(target[:, 0])
        pred = torch.where(labelled.unsqueeze(1), pred, torch.zeros_like(pred))
        classes = torch.where(labelled, target[:, 0], torch.zeros_like(target[:, 0])).long()
        each = F.cross_entropy(pred, classes, reduction="none")
        count = labelled.sum().clamp(min=1).to(each.dtype)
        return torch.where(labelled, each, torch.zeros_like(each)).sum() / count
    labelled = ~torch.isnan(target)
    target = torch.where(labelled, target, torch.zeros_like(target))
    if loss in DISTRIBUTION_WIDTHS:
        # pred [B, T * k]: each task's k parameters; a NaN output of an unlabelled entry is
        # replaced like a plain prediction.
        width = DISTRIBUTION_WIDTHS[loss]
        spread_mask = labelled.repeat_interleave(width, dim=-1)
        pred = torch.where(spread_mask, pred, torch.ones_like(pred))
        each = distribution_nll(pred, target, loss)
        count = labelled.sum().clamp(min=1).to(each.dtype)
        return torch.where(labelled, each, torch.zeros_like(each)).sum() / count
    pred = torch.where(labelled, pred, torch.zeros_like(pred))
    if loss == "bce":
        each = F.binary_cross_entropy_with_logits(pred, target, reduction="none")
    elif loss == "l1":
        each = F.l1_loss(pred, target, reduction="none")
    else:
        each = F.mse_loss(pred, target, reduction="none")
    count = labelled.sum().clamp(min=1).to(each.dtype)
    return torch.where(labelled, each, torch.zeros_like(each)).sum() / count


def build_adamw(
    parameters,
    lr: float,
    betas: tuple[float, float],
    eps: float,
    weight_decay: float,
    fused: bool | None = None,
    precision: str | None = None,
) -> torch.optim.AdamW:
    """AdamW, fused into one kernel per step unless ``fused`` is False.

    ``fused=None`` (auto) fuses whenever every parameter lives on a CPU or CUDA device, except
    under mixed precision (``precision`` ``*-mixed``): Lightning's mixed-precision plugin refuses
    to clip the gradients of an optimiser that unscales them itself. Same update, one kernel
    instead of a loop over ~200 parameter tensors: a small model's step is ~7% faster on CPU.
    """
    parameters = list(parameters)
    # Tensors, or parameter groups (dicts with "params").
    tensors = [
        p for item in parameters for p in (item["params"] if isinstance(item, dict) else [item])
    ]
    if fused is None:
        mixed = precision is not None and "mixed" in precision
        fused = not mixed and all(
            p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in tensors
        )
    return torch.optim.AdamW(
        parameters,
        lr=lr,
        betas=betas,
        eps=eps,
        weight_decay=weight_decay,
        fused=bool(fused) or None,
    )


class GraphormerModule(pl.LightningModule):
    """Trains and evaluates :class:`~graphormer.models.Graphormer` on a graph-property task.

    Takes plain values only (saved by ``save_hyperparameters``), so
    ``GraphormerModule.load_from_checkpoint(path)`` rebuilds it without Hydra.

    Args:
        model (dict): :class:`GraphormerConfig` fields (``num_tasks`` comes from ``task``).
        task (dict): :class:`TaskInfo` fields.
        lr (float, optional): peak learning rate. (default: :obj:`2e-4`)
        end_lr (float, optional): learning rate at the end of training. (default: :obj:`1e-9`)
        weight_decay (float, optional): AdamW weight decay. (default: :obj:`0.01`)
        betas (tuple[float, float], optional): AdamW betas. (default: :obj:`(0.9, 0.999)`)
        eps (float, optional): AdamW epsilon. (default: :obj:`1e-8`)
        warmup_steps (int | None, optional): warm-up length; None uses ``warmup_ratio`` of all
            steps. (default: :obj:`None`)
        warmup_ratio (float, optional): warm-up fraction when ``warmup_steps`` is None.
            (default: :obj:`0.06`)
        total_steps (int | None, optional): the optimiser update at which the learning rate
            reaches ``end_lr`` (the paper's recipes count updates); None uses every update the
            trainer will make. (default: :obj:`None`)
        loss (str, optional): ``auto`` follows the metric (BCE for classification, L1 for
            MAE-scored and MSE for RMSE-scored regression), or ``bce``, ``l1``, ``mse``.
            (default: :obj:`"auto"`)
        normalize_targets (bool, optional): for regression, train on targets standardised with
            the training split's mean and standard deviation (kept as buffers in the checkpoint);
            predictions and metrics are always in the original units. (default: :obj:`True`)
        data (dict | None, optional): the dataset and datamodule settings, stored so that
            ``scripts/eval.py`` can rebuild the data from the checkpoint alone.
        flag (dict | None, optional): FLAG adversarial augmentation (Kong et al., 2020), as
            :class:`~graphormer.training.settings.FlagSettings` fields ``m``, ``step_size``, ``mag``; off when ``m`` is 0.
            (default: :obj:`None`)
        fused (bool | None, optional): a fused AdamW step; None fuses where it is safe (see
            :func:`build_adamw`). (default: :obj:`None`)
        nonfinite (str, optional): what a NaN or infinite loss or gradient does: ``stop`` ends
            the run with :class:`NonFiniteError` (the checkpoints already written stay), ``skip``
            skips that update with a warning; an epoch that skips most of its updates has
            diverged, and ends the run with :class:`NonFiniteError` too. (default: :obj:`"stop"`)
        loss_weights (dict | None, optional): weight of each level's loss in the total
            (``molecule``, ``atom``, ``bond``); a level not named weighs 1. Atom and bond
            targets (issue #18) are trained with MSE on standardised values (regression) or BCE
            (binary), averaged over every labelled atom (bond) of the batch.
            (default: :obj:`None`)
        ema_decay (float | None, optional): validate and checkpoint an exponential moving
            average of the weights with this decay per update (the trainer's
            :class:`~graphormer.training.callbacks.WeightAverage`, which ``train()`` adds);
            None: the weights themselves. (default: :obj:`None`)
        pretrained_lr_scale (float | None, optional): when fine-tuning, the tensors copied
            from ``pretrained=`` (:attr:`pretrained_parameters`, which ``train()`` sets) train at
            ``lr`` times this, while the ones new to the task (output layer, readout map,
            molecule-feature input) train at ``lr``; None (or 1): one learning rate for all.
            (default: :obj:`None`)
        pretrained_decay (float | None, optional): when fine-tuning, the tensors copied from
            ``pretrained=`` decay toward their pre-trained values rather than toward zero: L2-SP
            (Li et al., ICML 2018), decoupled from the gradient as AdamW decouples its weight
            decay. After each update ``w -= lr_t * pretrained_decay * (w - w_pretrained)``, with
            ``lr_t`` the copied tensors' learning rate at that step (times
            ``pretrained_lr_scale`` where set); the tensors new to the task keep
            ``weight_decay`` toward zero. The pre-trained values (:attr:`pretrained_anchor`,
            which ``train()`` sets) are kept in every checkpoint, so that a resume pulls toward
            the same point. None: every tensor decays toward zero. (default: :obj:`None`)
        fingerprint_kernel (dict | None, optional): mix the molecule predictions with a
            Tanimoto kernel ridge regression on the Morgan counts among the molecule features
            (:class:`~graphormer.training.kernel.FingerprintKernel`, fitted on the training
            molecules when training starts): ``columns`` ``[start, stop)`` of those counts in
            ``molecule_features``, ``references`` (the training molecules it keeps) and
            ``weight`` (the network's share). Regression only. None: the network alone.
            (default: :obj:`None`)
    """

    def __init__(
        self,
        model: dict[str, Any],
        task: dict[str, Any],
        lr: float = 2e-4,
        end_lr: float = 1e-9,
        weight_decay: float = 0.01,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        warmup_steps: int | None = None,
        warmup_ratio: float = 0.06,
        total_steps: int | None = None,
        loss: str = "auto",
        normalize_targets: bool = True,
        data: dict[str, Any] | None = None,
        flag: dict[str, Any] | None = None,
        fused: bool | None = None,
        nonfinite: str = "stop",
        loss_weights: dict[str, float] | None = None,
        ema_decay: float | None = None,
        pretrained_lr_scale: float | None = None,
        pretrained_decay: float | None = None,
        item_loss: str = "auto",
        loss_weights_end: dict[str, float] | None = None,
        fingerprint_kernel: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        # The parameter names copied from pretrained= (train() sets them; a resume reads them
        # from its checkpoint): the group that pretrained_lr_scale slows down.
        self.pretrained_parameters: frozenset[str] = frozenset()
        # Their pre-trained values, where pretrained_decay pulls them (anchor_pretrained()).
        self.pretrained_anchor: dict[str, Tensor] = {}
        # pretrained_head=probe fitted the output layer (train() sets it; a resume reads it from
        # its checkpoint): the learning rate then warms up over the first epoch at least.
        self.probed_head = False
        if nonfinite not in NONFINITE:  # a checkpoint's own (a run's settings checked it)
            raise ValueError(f"nonfinite must be 'stop' or 'skip', got {nonfinite!r}")
        self.nonfinite = nonfinite
        self._skipped_steps = 0
        # The training data's digest (GraphDataModule.data_digest), kept in checkpoints.
        self._data_digest: str | None = None
        # This epoch's skipped and taken updates: skipping is for a rare bad batch, and an
        # epoch that skips most of its updates is a diverged run, not a trained one.
        self._epoch_skipped = self._epoch_updates = 0
        self.flag = FlagSettings(**(flag or {}))
        # FLAG takes several backward passes per optimiser step: manual optimisation, with the
        # clipping the trainer would have done (``gradient_clip_val``, set by train()).
        self.automatic_optimization = not self.flag.enabled
        self.gradient_clip_val: float | None = None
        self.gradient_clip_algorithm = "norm"
        self.task = TaskInfo(**task)
        loss = resolve_loss(loss, self.task)
        self.loss_name = loss
        self.loss_weights = _loss_weights(loss_weights)
        # Each level's weight at the last update; the weights move linearly from loss_weights
        # there (Graphormer-3D's position-change weight falls from 15 to 1 over its run).
        self.loss_weights_end = _loss_weights(
            loss_weights_end, self.loss_weights, "loss_weights_end"
        )
        if item_loss not in ITEM_LOSSES:
            raise ValueError(
                f"item_loss must be one of {', '.join(ITEM_LOSSES)}, got {item_loss!r}"
            )
        self.item_loss = item_loss
        # A distribution head predicts k parameters per task (mean first).
        self.head_width = DISTRIBUTION_WIDTHS.get(loss, 1)
        levels = {"num_tasks": self.task.num_outputs * self.head_width}
        for level in self.task.item_levels:
            levels[f"{level.name}_tasks"] = level.tasks(self.task)
        self.config = GraphormerConfig.from_dict({**model, **levels})
        self.model = Graphormer(self.config)
        self.evaluator = self.task.evaluator()
        num_tasks = self.task.num_tasks
        self.register_buffer("target_mean", torch.zeros(num_tasks))
        self.register_buffer("target_std", torch.ones(num_tasks))
        for level in self.task.item_levels:
            # Only for a level with targets: existing checkpoints keep exactly their tensors.
            self.register_buffer(level.mean, torch.zeros(level.buffer_shape(self.task)))
            self.register_buffer(level.std, torch.ones(level.buffer_shape(self.task)))
        # A Tanimoto kernel ridge regression on the Morgan counts among the molecule features,
        # mixed with the network's molecule predictions (fitted in setup; None: the network's).
        self.kernel: FingerprintKernel | None = None
        self._kernel_columns: tuple[int, int] | None = None
        if fingerprint_kernel is not None:
            start, stop = (int(c) for c in fingerprint_kernel["columns"])
            if self.task.is_classification or self.task.is_multiclass or self.head_width > 1:
                raise ValueError(
                    "fingerprint_kernel mixes regression predictions: not for classification "
                    "or a head that predicts its own spread (loss=mve, evidential)"
                )
            self._kernel_columns = (start, stop)
            self.kernel = FingerprintKernel(
                int(fingerprint_kernel["references"]),
                stop - start,
                num_tasks,
                float(fingerprint_kernel["weight"]),
            )
        if self.config.forces == "gradient":
            self._check_gradient_forces()
        self._eval_outputs: list[tuple[Tensor, Tensor, Tensor]] = []
        # Per item level and evaluated batch: the graph index and position of each real atom
        # (bond: its position in the graph's bond list), predictions, labels.
        self._item_outputs: dict[str, list[tuple[Tensor, Tensor, Tensor, Tensor]]] = {}

    @classmethod
    def from_checkpoint(
        cls, checkpoint: str | Path | checkpoints.CheckpointRecord
    ) -> GraphormerModule:
        """The module a checkpoint (a path, or a record read with
        :func:`graphormer.checkpoint.load`) describes, with its weights, on the CPU, in eval mode.

        Raises:
            CheckpointError: the file cannot be read, or its weights do not fit its own settings.
        """
        record = checkpoint
        if not isinstance(record, checkpoints.CheckpointRecord):
            record = checkpoints.load(record)
        try:
            # Settings read from a file are checked against its tensors before anything real is
            # built: num_layers=1e9 or max_degree=2e7 would otherwise grow without end (#20).
            cls._check_settings_fit_tensors(record)
            module = cls(**record.hyper_parameters)
            module.load_state_dict(record.state_dict)
        except (RuntimeError, ValueError, TypeError) as error:
            raise checkpoints.CheckpointError(
                f"checkpoint {record.path} does not match the model its own settings describe "
                f"({str(error).splitlines()[0]}); it was edited or written by an incompatible "
                "version"
            ) from error
        return module.eval()

    @classmethod
    def _check_settings_fit_tensors(cls, record: checkpoints.CheckpointRecord) -> None:
        """Raises ValueError naming the setting when the checkpoint's settings describe tensors
        other than the ones it holds. The layers are counted first (building them is a loop);
        every other shape is compared on the meta device, where nothing is allocated."""
        num_layers = record.run.model.get("num_layers")
        names = (key.split(".") for key in record.state_dict if key.startswith("model.layers."))
        held = len({parts[2] for parts in names if len(parts) > 2})
        if num_layers != held:
            raise ValueError(f"model.num_layers={num_layers!r} but it holds {held} layers")
        with torch.device("meta"):
            shell = cls(**record.hyper_parameters)
        for name, tensor in shell.state_dict().items():
            stored = record.state_dict.get(name)
            if stored is not None and tuple(stored.shape) != tuple(tensor.shape):
                differing = ", ".join(
                    f"{k}={v!r}" for k, v in record.run.model.items() if k in _SIZE_SETTINGS
                )
                raise ValueError(
                    f"{name} is {tuple(stored.shape)} but the settings ({differing}) make it "
                    f"{tuple(tensor.shape)}"
                )

    @property
    def run_record(self) -> checkpoints.RunRecord:
        """The settings this module was built with (what its checkpoints store), typed."""
        return checkpoints.RunRecord.of(self.hparams)

    def _check_gradient_forces(self) -> None:
        """``model.forces=gradient`` differentiates the first molecule target, in its units:
        a plain regression output of the network alone."""
        why = None
        if self.task.is_classification or self.task.is_multiclass:
            why = "the molecule targets are classes, not an energy"
        elif self.head_width > 1:
            why = f"loss={self.loss_name} predicts a spread beside each value"
        elif self.kernel is not None:
            why = (
                "the fingerprint kernel (fingerprint_kernel.use) adds a share of the energy "
                "that does not depend on positions"
            )
        elif self.flag.enabled:
            why = "FLAG (flag.m > 0) perturbs steps that are not differentiated twice"
        if why is not None:
            raise ValueError(
                f"model.forces=gradient takes the energy's gradient, and {why}: train "
                "forces with model.forces=head instead"
            )

    def _scale_gradient_forces(self) -> None:
        """Forces as the energy's gradient (``model.forces=gradient``) come out in the vector
        targets' standardised units: the energy's standard deviation over the vectors'."""
        if self.config.forces != "gradient":
            return
        vector_std = getattr(self, ATOM_VECTOR.std).reshape(-1)[0]
        self.model.force_scale.copy_((self.target_std[0] / vector_std).view(1))

    def setup(self, stage: str) -> None:
        # Runs on every rank after the data is set up, and before a resumed run restores its
        # checkpoint (whose buffers then win).
        if stage != "fit":
            return
        self._fit_to_training_data()
        self._scale_gradient_forces()

    def _fit_to_training_data(self) -> None:
        """The training split's statistics: inputs, molecule features, the kernel, targets."""
        datamodule = self.trainer.datamodule
        if isinstance(datamodule, GraphDataModule):
            self._data_digest = datamodule.data_digest()
        self._standardise_inputs()
        self._fit_molecule_features()
        self._fit_kernel()
        for level in self.task.item_levels:
            if level.loss(self.task) == "mse":
                self._standardise_level_targets(level)
        classification = self.task.is_classification or self.task.is_multiclass
        if classification or not self.hparams.normalize_targets or not self.task.num_tasks:
            return
        datamodule = self.trainer.datamodule
        if not isinstance(datamodule, GraphDataModule):
            raise ValueError(
                "normalize_targets=True needs the training targets: fit with a GraphDataModule, "
                "or set normalize_targets=False"
            )
        targets = datamodule.train_targets().float()  # [N, T]
        mean = torch.nanmean(targets, dim=0)
        std = torch.nanmean((targets - mean) ** 2, dim=0).sqrt()
        self.target_mean.copy_(torch.nan_to_num(mean, nan=0.0))
        std = torch.nan_to_num(std, nan=1.0)
        # A target constant on the training split (a descriptor of descriptor pre-training,
        # issue #22) is centred but not scaled: dividing by its ~0 spread would turn any other
        # value in validation into a loss of 1e12.
        self.target_std.copy_(torch.where(std > 1e-6, std, torch.ones_like(std)))

    def _fit_kernel(self) -> None:
        """The fingerprint kernel, fitted on the training molecules' Morgan counts and targets,
        its ridge chosen on the validation molecules (a resume then restores the same values
        from its checkpoint)."""
        if self.kernel is None:
            return
        datamodule = self.trainer.datamodule
        if not isinstance(datamodule, GraphDataModule):
            raise ValueError(
                "fingerprint_kernel needs the training molecules: fit with a GraphDataModule"
            )
        start, stop = self._kernel_columns
        counts = datamodule.train_rows("molecule_features")[:, start:stop]
        valid = datamodule.split_rows("molecule_features", "valid")
        valid = valid[:, start:stop] if valid is not None else counts[:0]
        valid_targets = datamodule.split_targets("valid")
        fits = self.kernel.fit(counts, datamodule.train_targets().float(), valid, valid_targets)
        chosen = ", ".join(
            f"ridge {fit['ridge']:g}"
            + (
                ""
                if math.isnan(fit["valid_rmse"])
                else f" (validation RMSE {fit['valid_rmse']:.4f})"
            )
            for fit in fits
        )
        rank_zero_only(report)(
            f"fingerprint kernel: Tanimoto kernel ridge regression on the Morgan counts of "
            f"{len(counts)} training molecules, {chosen}; predictions are "
            f"{self.kernel.weight:g} x the network's + {1 - self.kernel.weight:g} x the kernel's"
        )

    def _standardise_level_targets(self, level: Level) -> None:
        """Atom (bond, atom vector) regression targets are standardised with the training
        atoms' (bonds') statistics, as molecule targets are (``normalize_targets``), by the
        level's own rule (:meth:`Level.statistics`: vectors are scaled, never shifted)."""
        if not self.hparams.normalize_targets:
            return
        key = level.label
        mean_buffer, std_buffer = getattr(self, level.mean), getattr(self, level.std)
        datamodule = self.trainer.datamodule
        rows = datamodule.train_rows(key) if isinstance(datamodule, GraphDataModule) else None
        if rows is None:
            raise ValueError(f"normalize_targets=True needs the training graphs' targets ({key})")
        mean, std = level.statistics(rows)
        mean_buffer.copy_(mean)
        std_buffer.copy_(std)

    def _standardise_inputs(self) -> None:
        """Continuous node and edge inputs are standardised with the training split's mean and
        standard deviation, kept as buffers of the projections (so in the checkpoint: eval and
        prediction standardise as training did)."""
        projections = {
            "x_continuous": self.model.node_encoder.continuous,
            "edge_attr_continuous": self.model.attn_bias.edge_continuous,
        }
        datamodule = self.trainer.datamodule
        for key, projection in projections.items():
            if projection is None:
                continue
            # In chunks: ogbg-ppa's training edges would be GBs of rows at once.
            found = None
            if isinstance(datamodule, GraphDataModule):
                found = datamodule.train_statistics(key)
            if found is None or found[0].numel() != projection.mean.numel():
                width = None if found is None else found[0].numel()
                raise ValueError(
                    f"the model reads {projection.mean.numel()} continuous {key} column(s) but "
                    f"the training graphs carry {width}"
                )
            projection.set_statistics(found[0].float(), found[1].float())

    def _fit_molecule_features(self) -> None:
        """Molecule features (issue #22) get the training split's statistics
        (:data:`~graphormer.models.molecule_features.MOLECULE_FEATURE_RULE`), kept as buffers
        in the checkpoint; the columns the rule drops are reported once."""
        block = self.model.molecule_input
        if block is None:
            return
        datamodule = self.trainer.datamodule
        key = "molecule_features"
        rows = datamodule.train_rows(key) if isinstance(datamodule, GraphDataModule) else None
        if rows is None or rows.size(-1) != block.mean.numel():
            width = None if rows is None else rows.size(-1)
            raise ValueError(
                f"the model reads {block.mean.numel()} molecule feature(s) per graph but the "
                f"training graphs carry {width}"
            )
        dropped = block.fit(rows)
        names = self.run_record.molecule_feature_names()
        message = (
            f"molecule features: {rows.size(-1)} per molecule, statistics of {len(rows)} "
            f"training molecules; {int(rows.isnan().sum())} missing or non-finite value(s) "
            "filled with the training median"
        )
        for reason, columns in dropped.items():
            if columns:
                shown = [names[c] if c < len(names) else str(c) for c in columns]
                message += f"; dropped ({reason.replace('_', ' ')}): {_short(shown)}"
        rank_zero_only(report)(message)

    def to_units(self, raw: Tensor) -> Tensor:
        """The model's raw molecule outputs in the targets' units (the stored standardisation
        undone; logits stay logits); of a distribution head, its mean."""
        if self.head_width > 1 and raw.size(-1) == self.task.num_outputs * self.head_width:
            raw = distribution_parameters(raw, self.loss_name)[0]
        # float32 whatever the trainer's precision (bf16-true keeps these buffers in bf16).
        return raw.float() * self.target_std.float() + self.target_mean.float()

    def molecule_units(self, raw: Tensor, batch: GraphormerBatch) -> Tensor:
        """The molecule predictions in the targets' units: :meth:`to_units` of the network's
        raw outputs, mixed with the fingerprint kernel's where the model has one."""
        out = self.to_units(raw)
        if self.kernel is None:
            return out
        return self.kernel(out, self.kernel_counts(batch))

    def kernel_counts(self, batch: GraphormerBatch) -> Tensor:
        """The Morgan counts the fingerprint kernel reads, ``[B, bits]``."""
        if batch.molecule_features is None:
            raise ValueError("the fingerprint kernel reads Morgan counts; the batch has none")
        start, stop = self._kernel_columns
        return batch.molecule_features[:, start:stop]

    @property
    def network_share(self) -> float:
        """The network's share of the molecule predictions (1 without a fingerprint kernel):
        what scales its per-atom contributions."""
        return 1.0 if self.kernel is None else self.kernel.weight

    @property
    def predicts_std(self) -> bool:
        """Whether the model predicts its own spread (``loss=mve`` or ``evidential``)."""
        return self.head_width > 1

    def forward_distribution(self, batch: GraphormerBatch) -> tuple[Tensor, Tensor]:
        """A distribution head's mean and standard deviation ``[B, T]``, both in the targets'
        units (``loss=mve`` or ``evidential``)."""
        raw = self.model(batch)
        parameters = distribution_parameters(raw, self.loss_name)
        variance = distribution_variance(parameters, self.loss_name)
        std = variance.sqrt() * self.target_std.float()
        return self.to_units(parameters[0]), std

    def forward(self, batch: GraphormerBatch, return_attention: bool = False):
        """Predictions in the targets' units (logits for classification)."""
        if return_attention:
            out, attention = self.model(batch, return_attention=True)
            return self.molecule_units(out, batch), attention
        return self.molecule_units(self.model(batch), batch)

    def forward_levels(self, batch: GraphormerBatch, return_attention: bool = False):
        """Predictions of every level in the targets' units (logits for classification):
        ``molecule`` ``[B, T]`` and, for a model of atom targets, ``atom`` ``[B, N, T_atom]``
        (meaningless at padding: read ``batch.node_mask``), for a model of bond targets
        ``bond`` ``[B, M, T_bond]`` (read ``batch.bond_mask``); with ``return_attention`` also
        the attention maps."""
        attention = None
        if return_attention:
            raw, attention = self.model.forward_levels(batch, return_attention=True)
        else:
            raw = self._raw_outputs(batch)
        out = {"molecule": self.molecule_units(raw["molecule"], batch)}
        for level in ITEM_LEVELS:
            if level.name in raw:
                out[level.name] = self.level_units(level, raw[level.name])
        return (out, attention) if return_attention else out

    def standardised_targets(self, target: Tensor) -> Tensor:
        """Molecule targets as the loss compares them (identity unless normalize_targets)."""
        return (target - self.target_mean) / self.target_std

    def _loss(self, raw: Tensor, target: Tensor) -> Tensor:
        loss = self.loss_name
        if self.head_width > 1 and raw.size(-1) == self.task.num_outputs:
            # Means alone (an evaluation epoch keeps the predictions in units): their squared
            # error is the logged loss.
            loss = "mse"
        return masked_loss(raw, self.standardised_targets(target), loss)

    def level_units(self, level: Level, raw: Tensor) -> Tensor:
        """``level``'s raw outputs in its targets' units (logits for binary targets)."""
        mean, std = getattr(self, level.mean), getattr(self, level.std)
        return raw.float() * std.float() + mean.float()

    def level_standardised(self, level: Level, values: Tensor) -> Tensor:
        """``level``'s values (targets or predictions in units) as its loss compares them."""
        return (values - getattr(self, level.mean)) / getattr(self, level.std)

    def _raw_outputs(self, batch: GraphormerBatch, perturb: Tensor | None = None) -> dict:
        """Raw outputs per level: ``molecule`` ``[B, T]``, and ``atom`` ``[B, N, T_atom]`` for
        a model of atom targets, ``bond`` ``[B, M, T_bond]`` for one of bond targets. A
        molecule-only model runs its plain forward, as before."""
        if not self.task.item_levels:
            return {"molecule": self.model(batch, perturb=perturb)}
        return self.model.forward_levels(batch, perturb=perturb)

    def _level_losses(self, raw: dict, batch: GraphormerBatch) -> dict[str, Tensor]:
        """Each level's masked loss (missing labels and padding atoms weigh nothing)."""
        losses = {}
        if self.task.num_tasks:
            losses["molecule"] = self._loss(raw["molecule"].float(), batch.y)
        for level in self.task.item_levels:
            labels = getattr(batch, level.label)
            if labels is None:
                raise ValueError(
                    f"the model predicts {level.noun} targets but the batch carries none "
                    f"({level.label})"
                )
            target = self.level_standardised(level, labels)  # NaN at padding stays
            pred = raw[level.name].float().flatten(0, 1)  # [B*N, T_atom] / [B*M, T_bond]
            losses[level.name] = masked_loss(pred, target.flatten(0, 1), self._item_loss(level))
        return losses

    def _item_loss(self, level: Level) -> str:
        """``level``'s training loss: its own (:meth:`Level.loss`), or with ``item_loss=l1`` /
        ``mse`` that one for regression targets (Graphormer-3D's L1 of position changes)."""
        own = level.loss(self.task)
        return own if self.item_loss == "auto" or own == "bce" else self.item_loss

    def level_weights(self) -> dict[str, float]:
        """Each level's loss weight at this update: ``loss_weights``, moving linearly to
        ``loss_weights_end`` at the last update (``total_steps``, or the trainer's count)."""
        if self.loss_weights_end == self.loss_weights:
            return self.loss_weights
        total = self.hparams.get("total_steps")
        if not total and self._trainer is not None:
            total = self.trainer.estimated_stepping_batches
        done = min(self.global_step / max(int(total or 1), 1), 1.0)
        return {
            level: start + (self.loss_weights_end[level] - start) * done
            for level, start in self.loss_weights.items()
        }

    def _total_loss(self, raw: dict, batch: GraphormerBatch) -> Tensor:
        losses = self._level_losses(raw, batch)
        if len(losses) == 1 and "molecule" in losses:
            return losses["molecule"]  # exactly the molecule-only loss of before
        weights = self.level_weights()
        return sum(weights[level] * loss for level, loss in losses.items())

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int):
        # Lightning copies plain tensors to a GPU without blocking but calls ``to(device)`` of
        # other types as is: for our batch, one host synchronisation per tensor in every step
        # (issue #21). The DataLoader pins batches on GPU machines, so these copies overlap.
        if isinstance(batch, GraphormerBatch) and torch.device(device).type == "cuda":
            return batch.to(device, non_blocking=True)
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def training_step(self, batch: GraphormerBatch, batch_idx: int) -> Tensor:
        if self.flag.enabled:
            loss = self._flag_step(batch)
        else:
            loss = self._total_loss(self._raw_outputs(batch), batch)
        # One process: act on the loss itself. Several: a NaN loss on one rank makes every
        # rank's all-reduced gradients NaN, which all ranks see alike in on_before_optimizer_step
        # (acting on one rank alone would leave the others waiting for it).
        single = self._trainer is None or self.trainer.world_size == 1
        if single and not torch.isfinite(loss.detach()).all():
            self._nonfinite("the loss")
            # FLAG has stepped already (its update skipped its NaN gradients); automatic
            # optimisation skips the update when training_step returns None.
            return None if self.automatic_optimization else loss.detach()
        self.log("train/loss", loss, prog_bar=True, batch_size=batch.num_graphs)
        return loss

    def _nonfinite(self, what: str) -> None:
        """Stops the run (``nonfinite=stop``) or counts a skipped update (``skip``)."""
        step = self.global_step
        precision = str(self.trainer.precision) if self._trainer is not None else ""
        causes = "the learning rate is too high (lower optim.lr), or targets hold extreme values"
        if precision.startswith("16"):
            causes += f", or float16 overflows (trainer.precision={precision}: try bf16-mixed)"
        if self.nonfinite == "stop":
            raise NonFiniteError(
                f"training diverged: {what} is NaN or infinite at step {step} (epoch "
                f"{self.current_epoch}); likely {causes}. The checkpoints written so far are "
                "kept; nonfinite=skip skips such updates instead"
            )
        self._skipped_steps += 1
        self._epoch_skipped += 1
        if self._skipped_steps in (1, 10, 100, 1000):
            rank_zero_warn(
                f"{what} is NaN or infinite at step {step}: update skipped "
                f"({self._skipped_steps} so far; nonfinite=skip); likely {causes}"
            )

    def on_train_epoch_start(self) -> None:
        self._epoch_skipped = self._epoch_updates = 0

    def on_train_epoch_end(self) -> None:
        skipped, taken = self._epoch_skipped, self._epoch_updates
        if skipped and skipped >= taken:
            raise NonFiniteError(
                f"training diverged: {skipped} of the {skipped + taken} updates of epoch "
                f"{self.current_epoch} had a NaN or infinite loss or gradient and were skipped "
                "(nonfinite=skip skips a rare bad batch, not most of them); lower optim.lr, check "
                "the targets for extreme values, or keep trainer.gradient_clip_val set"
            )

    def _gradients_finite(self) -> bool:
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if not grads:
            return True
        norms = torch._foreach_norm(grads)
        return bool(torch.isfinite(torch.stack(norms)).all())

    def on_before_optimizer_step(self, optimizer) -> None:
        # Float16 mixed precision: the gradient scaler skips steps with inf/NaN gradients itself
        # (and lowers its scale); any other precision has no such guard.
        scaled = self._trainer is not None and str(self.trainer.precision) == "16-mixed"
        if not scaled and not self._gradients_finite():
            self._nonfinite("a gradient")
            # skip: parameters without a gradient are left alone by the optimiser's step.
            for p in self.parameters():
                p.grad = None
            return
        # A skipped loss still reaches here (Lightning steps with no gradients): not an update.
        if any(p.grad is not None for p in self.parameters()):
            self._epoch_updates += 1
        # Manual optimisation (FLAG) gets no clipping from the trainer. Lightning calls this
        # hook after unscaling fp16 gradients, so the threshold applies to the true gradients.
        if self.flag.enabled and self.gradient_clip_val:
            self.clip_gradients(
                optimizer,
                gradient_clip_val=self.gradient_clip_val,
                gradient_clip_algorithm=self.gradient_clip_algorithm,
            )

    def initial_perturbation(self, shape: tuple[int, int, int]) -> Tensor:
        """FLAG's random start ``[B, N, d]``: uniform in ``[-step_size, step_size]``, or, with
        ``mag`` > 0, inside each node's ball of radius ``mag``."""
        if self.flag.mag > 0:
            start = torch.empty(shape, device=self.device).uniform_(-1, 1)
            return start * self.flag.mag / math.sqrt(shape[-1])
        step = self.flag.step_size
        return torch.empty(shape, device=self.device).uniform_(-step, step)

    def _flag_step(self, batch: GraphormerBatch) -> Tensor:
        """One optimiser step of FLAG: ``m`` ascent steps on a perturbation of the node input
        embeddings, the parameters' gradients of the ``m`` losses accumulated (each scaled by
        ``1/m``), as Microsoft's ``graph_prediction_with_flag`` task does."""
        optimizer = self.optimizers()
        scheduler = self.lr_schedulers()
        m, step, mag = self.flag.m, self.flag.step_size, self.flag.mag
        b, n = batch.x.shape[:2]
        perturb = self.initial_perturbation((b, n, self.config.hidden_dim)).requires_grad_()
        optimizer.zero_grad()
        total = 0.0
        for ascent in range(m):
            loss = self._total_loss(self._raw_outputs(batch, perturb), batch) / m
            self.manual_backward(loss)
            total = total + loss.detach()
            if ascent == m - 1:
                break
            # Gradient ascent on the perturbation (its sign), projected back into the ball.
            grad = perturb.grad.detach()
            data = perturb.detach() + step * torch.sign(grad)
            if mag > 0:
                norm = data.norm(dim=-1, keepdim=True)
                data = torch.where(norm > mag, data * (mag / norm), data)
            perturb = data.requires_grad_()
        optimizer.step()  # clipping happens in on_before_optimizer_step, after any unscaling
        scheduler.step()
        return total

    # -- evaluation: every graph of the split exactly once, across all ranks ----------------

    def _eval_step(self, batch: GraphormerBatch, stage: str) -> None:
        # Only predictions are kept here; the loss and the metric are computed once per epoch
        # over every graph of the split, gathered from all ranks (no per-step collective, so a
        # rank with fewer batches never leaves the others waiting).
        raw = self._raw_outputs(batch)
        pred = self.molecule_units(raw["molecule"].float(), batch)
        self._eval_outputs.append((batch.index, pred.detach(), batch.y))
        for level in self.task.item_levels:
            mask = getattr(batch, level.mask)  # [B, N]: real items only, never padding
            positions = torch.arange(mask.size(1), device=mask.device).expand_as(mask)
            graphs = batch.index.view(-1, 1).expand_as(mask)
            values = self.level_units(level, raw[level.name].float())[mask].detach()  # [n, T]
            labels = getattr(batch, level.label)[mask]
            outputs = self._item_outputs.setdefault(level.name, [])
            outputs.append((graphs[mask], positions[mask], values, labels))

    def validation_step(self, batch: GraphormerBatch, batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def test_step(self, batch: GraphormerBatch, batch_idx: int) -> None:
        self._eval_step(batch, "test")

    def predict_step(self, batch: GraphormerBatch, batch_idx: int) -> tuple[Tensor, Tensor]:
        """Dataset indices and predictions in the targets' units (logits for classification)."""
        return batch.index, self.molecule_units(self.model(batch).float(), batch)

    def on_validation_epoch_start(self) -> None:
        self._eval_outputs, self._item_outputs = [], {}

    def on_test_epoch_start(self) -> None:
        self._eval_outputs, self._item_outputs = [], {}

    def on_validation_epoch_end(self) -> None:
        self._log_metric("val", "valid")

    def on_test_epoch_end(self) -> None:
        self._log_metric("test", "test")

    def _log_metric(self, stage: str, split: str) -> None:
        index, pred, target = self._gather_outputs()
        items = {
            level: self._gather_items(
                self._item_outputs.get(level.name, []),
                level.item_shape(self.task),
                level.link(self.task),
            )
            for level in self.task.item_levels
        }
        self._eval_outputs, self._item_outputs = [], {}
        if self.trainer.sanity_checking:
            return
        expected = _split_size(self.trainer, split)
        limit = getattr(self.trainer, f"limit_{stage}_batches", 1.0)
        limited = limit is not None and not (isinstance(limit, float) and limit >= 1.0)
        if expected is not None and len(index) != expected:
            if not limited:
                raise RuntimeError(
                    f"{split} evaluation saw {len(index)} distinct graphs, expected {expected}"
                )
            if not getattr(self, f"_warned_{stage}", False):
                setattr(self, f"_warned_{stage}", True)
                rank_zero_warn(
                    f"{self.task.monitor.replace('val/', stage + '/')} is computed on "
                    f"{len(index)} of the {expected} "
                    f"{split} graphs (trainer.limit_{stage}_batches={limit}): not comparable "
                    "with a score on the whole split"
                )
        if not items:
            value = score(self.task, self.evaluator, target, pred, split)
            raw = (pred - self.target_mean) / self.target_std
            loss = float(self._loss(raw, target.float()))
            # Every rank holds the same gathered values: no further sync needed.
            self.log(f"{stage}/loss", loss, sync_dist=False)
            self.log(f"{stage}/{self.task.metric}", value, prog_bar=True, sync_dist=False)
            for name, value in score_reported(self.task, target, pred).items():
                self.log(f"{stage}/{name}", value, sync_dist=False)
            return
        values, losses = {}, {}
        if self.task.num_tasks:
            values[self.task.metric] = score(self.task, self.evaluator, target, pred, split)
            values.update(score_reported(self.task, target, pred))
            raw = (pred - self.target_mean) / self.target_std
            losses["molecule"] = self._loss(raw, target.float())
        for level, (item_pred, item_target) in items.items():
            values.update(score_level(self.task, level, item_target, item_pred, split))
            raw = self.level_standardised(level, item_pred)
            item_target = self.level_standardised(level, item_target)
            losses[level.name] = masked_loss(raw, item_target, self._item_loss(level))
        weights = self.level_weights()
        loss = sum(weights[level] * value for level, value in losses.items())
        self.log(f"{stage}/loss", float(loss), sync_dist=False)
        for name, value in values.items():
            self.log(f"{stage}/{name}", value, prog_bar=True, sync_dist=False)

    def _gather_outputs(self) -> tuple[Tensor, Tensor, Tensor]:
        num_tasks, outputs = self.task.num_tasks, self.task.num_outputs
        if self._eval_outputs:
            index = torch.cat([o[0] for o in self._eval_outputs]).to(self.device)
            pred = torch.cat([o[1] for o in self._eval_outputs])
            target = torch.cat([o[2] for o in self._eval_outputs])
        else:
            index = torch.zeros(0, dtype=torch.long, device=self.device)
            pred = torch.zeros(0, outputs, device=self.device)
            target = torch.zeros(0, num_tasks, device=self.device)
        if self.trainer.world_size > 1:
            index, pred, target = _all_gather_rows(self, index, pred, target)
        # Ordered by dataset index, each graph once: the mean of its reads (one per conformer;
        # a repeat from distributed padding is the same prediction again).
        # Classification reads average as probabilities, as prediction's do.
        return mean_over_repeats(index, pred, target, link=self.task.link)

    def _gather_items(
        self, outputs: list, shape: tuple[int, ...], link: str | None = None
    ) -> tuple[Tensor, Tensor] | None:
        """Every evaluated atom (bond) once, ordered by graph then RDKit's atom (bond) order:
        predictions and labels ``[n_items, *shape]``; None for a level the model lacks.
        ``link``: :func:`mean_over_repeats`' (binary levels' outputs are logits)."""
        if not shape[0]:
            return None
        if outputs:
            graphs, positions, pred, target = (torch.cat([o[k] for o in outputs]) for k in range(4))
        else:
            graphs = positions = torch.zeros(0, dtype=torch.long, device=self.device)
            pred = target = torch.zeros(0, *shape, device=self.device)
        if self.trainer.world_size > 1:
            graphs, positions, pred, target = _all_gather_rows(
                self, graphs, positions, pred, target
            )
        # Unique (graph, item) keys, each the mean of its graph's reads (as the graphs').
        key = graphs * (int(positions.max()) + 1 if len(positions) else 1) + positions
        _, pred, target = mean_over_repeats(key, pred, target, link=link)
        return pred, target

    # -- optimisation ---------------------------------------------------------------------------

    def configure_optimizers(self):
        hp = self.hparams
        optimizer = build_adamw(
            self.parameter_groups(),
            lr=hp.lr,
            betas=tuple(hp.betas),
            eps=hp.eps,
            weight_decay=hp.weight_decay,
            fused=hp.get("fused"),
            precision=str(self.trainer.precision) if self._trainer is not None else None,
        )
        total = hp.get("total_steps") or self.trainer.estimated_stepping_batches
        total = max(int(total), 1)
        warmup = hp.warmup_steps if hp.warmup_steps is not None else int(hp.warmup_ratio * total)
        if self.probed_head and hp.warmup_steps is None and self._trainer is not None:
            # A head fitted to the pre-trained features (loss 0.33 on a small set) met the full
            # learning rate at the second step: Adam's first updates move every body tensor by
            # about lr at once, the features the head was fitted to change, and the loss rose to
            # 7.9 within the first epoch (175 on a larger set). Warming up over that epoch
            # keeps the fitted start.
            trainer = self.trainer
            per_epoch = math.ceil(trainer.num_training_batches / trainer.accumulate_grad_batches)
            warmup = max(warmup, min(per_epoch, total))
        warmup = max(int(warmup), 1)

        def factor(step: int) -> float:
            return warmup_linear_decay(step, warmup, total, hp.lr, hp.end_lr) / hp.lr

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        if any(group.get(_ANCHOR_DECAY) for group in optimizer.param_groups):
            names = {id(p): name for name, p in self.named_parameters()}
            optimizer.register_step_post_hook(
                lambda optimizer, args, kwargs: self._decay_toward_pretrained(optimizer, names)
            )
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 1},
        }

    def parameter_groups(self) -> list[dict[str, Any]]:
        """The optimiser's parameter groups: one, or with a pre-trained initialisation and
        ``pretrained_lr_scale`` or ``pretrained_decay``, the tensors new to the task at ``lr``
        and the copied ones at ``lr * pretrained_lr_scale`` (the schedule scales both alike),
        decaying toward their pre-trained values rather than toward zero."""
        scale = self.hparams.get("pretrained_lr_scale")
        decay = self.hparams.get("pretrained_decay")
        scaled = scale is not None and scale != 1
        named = list(self.named_parameters())  # every one, as self.parameters() gave before
        copied = [p for name, p in named if name in self.pretrained_parameters]
        if not copied or (not scaled and decay is None):
            return [{"params": [p for _, p in named]}]
        new = [p for name, p in named if name not in self.pretrained_parameters]
        group: dict[str, Any] = {"params": copied}
        if scaled:
            group["lr"] = self.hparams.lr * scale
        if decay is not None:
            missing = sorted(self.pretrained_parameters - self.pretrained_anchor.keys())
            if missing:
                raise RuntimeError(
                    f"pretrained_decay={decay} needs the pre-trained values of the copied "
                    f"tensors (anchor_pretrained() before training); missing: {missing[:3]}"
                )
            group["weight_decay"] = 0.0
            group[_ANCHOR_DECAY] = float(decay)
        return [{"params": new}, group] if new else [group]

    def anchor_pretrained(self) -> None:
        """Keeps the copied tensors' current values (:attr:`pretrained_parameters`, just loaded
        from ``pretrained=``) as the point ``pretrained_decay`` pulls them toward; nothing
        without ``pretrained_decay``."""
        if self.hparams.get("pretrained_decay") is None:
            return
        params = dict(self.named_parameters())
        self.pretrained_anchor = {
            name: params[name].detach().clone() for name in sorted(self.pretrained_parameters)
        }

    @torch.no_grad()
    def _decay_toward_pretrained(self, optimizer, names: dict[int, str]) -> None:
        """After each optimiser step: ``w -= lr * rate * (w - w_pretrained)`` for the tensors
        of a group with a rate that this step updated (a skipped update, whose gradients were
        dropped, moves none of them); ``names`` maps each parameter's id to its name."""
        for group in optimizer.param_groups:
            rate = group.get(_ANCHOR_DECAY)
            if not rate:
                continue
            params, anchors = [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                anchor = self.pretrained_anchor[names[id(p)]]
                if anchor.device != p.device or anchor.dtype != p.dtype:
                    anchor = anchor.to(device=p.device, dtype=p.dtype)
                    self.pretrained_anchor[names[id(p)]] = anchor
                params.append(p)
                anchors.append(anchor)
            if params:
                drift = torch._foreach_sub(params, anchors)
                torch._foreach_add_(params, drift, alpha=-group["lr"] * rate)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        size = self.trainer.world_size if self._trainer is not None else 1
        checkpoints.write_training_state(
            checkpoint,
            pretrained_parameters=self.pretrained_parameters,
            pretrained_anchor=self.pretrained_anchor,
            probed_head=self.probed_head,
            precision=str(self.trainer.precision) if self._trainer is not None else None,
            data_digest=self._data_digest,
            # So that a resumed run continues exactly where the interrupted one stopped, every
            # rank's streams under DDP.
            rng_states=capture_rng_states_of_all_ranks(size),
        )
        # Last: Lightning calls this hook after the callbacks' states are in, so the digest
        # covers everything a resume reads (issue #20).
        checkpoints.seal(checkpoint)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Lightning restores the module before it builds the optimiser, so a resumed
        # fine-tuning run groups its parameters as the interrupted one did.
        state = checkpoints.read_training_state(checkpoint)
        self.pretrained_parameters = state.pretrained_parameters
        self.pretrained_anchor = state.pretrained_anchor
        self.probed_head = state.probed_head
        fitting = self._trainer is not None and self.trainer.state.fn == "fit"
        if fitting:
            self._check_same_data(state.data_digest)
        streams = state.rng_states
        # Only when fit resumes; evaluating a checkpoint leaves the streams alone.
        if streams is not None and fitting:
            size = self.trainer.world_size
            if not restore_rng_state_of_rank(streams, self.global_rank, size) and size > 1:
                rank_zero_warn(
                    "the checkpoint holds no random streams of a run on "
                    f"{size} processes (it ran on another number, or before they were kept): "
                    "every rank continues with rank 0's dropout stream, so the resumed run "
                    "is not the exact continuation of the interrupted one"
                )

    def _check_same_data(self, stored: str | None) -> None:
        """A resume continues training on the data it started with (``stored``: the digest of
        its checkpoint): a training file changed at the same path since is refused."""
        if stored and self._data_digest and stored != self._data_digest:
            settings = self.run_record
            where = next(
                (v for k in ("path", "root", "name") if (v := settings.dataset_setting(k))),
                "the data",
            )
            raise DataError(
                f"the training data ({where}) is not the data the checkpoint being resumed was "
                "trained on: its graphs, labels or splits changed since. Resume with the data "
                "it trained on, or start a new run from these weights with pretrained=CKPT "
                "instead of ckpt_path"
            )


def _loss_weights(
    given: dict[str, float] | None, start: dict[str, float] | None = None, key="loss_weights"
) -> dict[str, float]:
    """Each level's loss weight (``start``'s, or 1, where not given), checked."""
    weights = dict(start) if start is not None else dict.fromkeys(LEVELS, 1.0)
    for level, weight in dict(given or {}).items():
        if level not in weights:
            raise ValueError(f"{key}.{level} is not a level: give weights of {', '.join(LEVELS)}")
        if isinstance(weight, bool) or not isinstance(weight, int | float) or weight < 0:
            raise ValueError(f"{key}.{level}={weight!r} is not allowed: a number >= 0")
        weights[level] = float(weight)
    return weights


def _split_size(trainer: pl.Trainer, split: str) -> int | None:
    datamodule = getattr(trainer, "datamodule", None)
    if datamodule is None or getattr(datamodule, "loaded", None) is None:
        return None
    return datamodule.split_size(split)


def _all_gather_rows(module: pl.LightningModule, *tensors: Tensor) -> list[Tensor]:
    """Concatenates each rank's rows (counts may differ between ranks) on every rank."""
    count = torch.tensor([tensors[0].size(0)], device=module.device)
    counts = module.all_gather(count).view(-1)  # [W]
    longest = int(counts.max())
    gathered = []
    for t in tensors:
        padded = t.new_zeros((longest, *t.shape[1:]))
        padded[: t.size(0)] = t
        rows = module.all_gather(padded)  # [W, longest, ...]
        gathered.append(torch.cat([rows[r, : int(counts[r])] for r in range(len(counts))]))
    return gathered
