"""Typed settings of a training run: what :func:`graphormer.training.train` takes.

Every value is checked here, once, before anything is built or written: for the command line
(``graphormer-train``, whose Hydra config becomes a :class:`RunSettings` through
:meth:`RunSettings.from_dict`) and for settings read back from a checkpoint alike. A bad value is
one :class:`~graphormer.errors.ConfigError` naming the key, the value and what is allowed.
The dataset settings are checked by their source (:func:`graphormer.data.build_source`), the
model's by :class:`~graphormer.models.GraphormerConfig`.
"""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from graphormer.data.structure import max_useful_hops
from graphormer.devices import PRECISIONS
from graphormer.errors import ConfigError
from graphormer.models.graphormer import AUTO_DEPTH, GraphormerConfig, resolve_depth
from graphormer.portable.calibration import CALIBRATIONS

__all__ = [
    "CALIBRATIONS",
    "CrossValidationSettings",
    "DataModuleSettings",
    "EnsembleSettings",
    "FingerprintKernelSettings",
    "FlagSettings",
    "OptimSettings",
    "RunSettings",
    "TrainerSettings",
    "check_keys",
]

_MAX_SEED = 2**32 - 1  # numpy's and Lightning's seed range


# -- checks that name the key ----------------------------------------------------------------


def _bad(key: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"{key}={value!r} is not allowed: {allowed}")


def _integer(key: str, value: Any, least: int, *, optional: bool = False, most=None) -> Any:
    if value is None and optional:
        return None
    null = " or null" if optional else ""
    upper = f" and <= {most}" if most is not None else ""
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(key, value, f"an integer >= {least}{upper}{null}")
    if value < least or (most is not None and value > most):
        raise _bad(key, value, f"an integer >= {least}{upper}{null}")
    return value


def _number(
    key: str,
    value: Any,
    *,
    least: float | None = None,
    above: float | None = None,
    most: float | None = None,
    below: float | None = None,
    optional: bool = False,
) -> Any:
    if value is None and optional:
        return None
    limits = [
        f">= {least}" if least is not None else "",
        f"> {above}" if above is not None else "",
        f"<= {most}" if most is not None else "",
        f"< {below}" if below is not None else "",
    ]
    allowed = "a finite number " + " and ".join(x for x in limits if x)
    allowed = allowed.strip() + (" or null" if optional else "")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _bad(key, value, allowed)
    if (
        (least is not None and value < least)
        or (above is not None and value <= above)
        or (most is not None and value > most)
        or (below is not None and value >= below)
    ):
        raise _bad(key, value, allowed)
    return float(value)


def _boolean(key: str, value: Any, *, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if not isinstance(value, bool):
        raise _bad(key, value, "true or false" + (" or null" if optional else ""))
    return value


def _choice(key: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise _bad(key, value, f"one of {', '.join(choices)}")
    return value


def check_keys(group: str, given: Mapping[str, Any], known: set[str] | list[str]) -> None:
    """Refuses keys of ``group`` that do not exist, naming the closest ones that do."""
    unknown = sorted(set(given) - set(known))
    if not unknown:
        return
    key = unknown[0]
    close = difflib.get_close_matches(key, sorted(known), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(f'{group}.{c}' for c in close)}? " if close else ""
    more = f" (and {', '.join(unknown[1:])})" if len(unknown) > 1 else ""
    raise ConfigError(
        f"{group}.{key}{more} does not exist: {hint}the keys of {group} are "
        f"{', '.join(sorted(known))}"
    )


def _from(cls, group: str, values: Mapping[str, Any] | None):
    values = dict(values or {})
    check_keys(group, values, [f.name for f in fields(cls)])
    return cls(**values)


# -- the groups ------------------------------------------------------------------------------


@dataclass(frozen=True)
class OptimSettings:
    """AdamW with linear warm-up to ``lr`` and linear decay to ``end_lr`` (``optim.*``).

    Attributes:
        lr: the peak learning rate, reached at the end of the warm-up.
        end_lr: the learning rate the linear decay ends at.
        weight_decay: AdamW's decoupled weight decay.
        betas: AdamW's moment coefficients.
        eps: AdamW's epsilon.
        warmup_steps: optimiser updates of linear warm-up; None: ``warmup_ratio`` of all the
            run's updates.
        warmup_ratio: the warm-up's share of all updates when ``warmup_steps`` is None.
        total_steps: the update at which the learning rate reaches ``end_lr``; None: the last
            update of the run (the paper's recipes count updates).
        fused: one fused AdamW kernel per step; None: wherever Lightning can still clip
            gradients (not under ``*-mixed`` precision).
        ema_decay: validation, the choice of the best checkpoint, every checkpoint's weights and
            so evaluation, prediction and fine-tuning use an exponential moving average of the
            weights with this decay (the plain mean until its horizon of 1 / (1 - decay)
            updates); None: the weights themselves, as the paper's recipes.
        pretrained_lr_scale: with ``pretrained=``, the tensors copied from the checkpoint train
            at ``lr`` times this and the ones new to the task at ``lr``; None: one learning rate.
        pretrained_decay: with ``pretrained=``, after each update the copied tensors move
            ``lr x rate`` of the way back to their pre-trained values (L2-SP, decoupled), the new
            ones decay toward zero at ``weight_decay``; None: all decay toward zero.
    """

    lr: float = 2e-4
    end_lr: float = 1e-9
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    warmup_steps: int | None = None
    warmup_ratio: float = 0.06
    total_steps: int | None = None
    fused: bool | None = None
    ema_decay: float | None = None
    pretrained_lr_scale: float | None = None
    pretrained_decay: float | None = None

    def __post_init__(self) -> None:
        _number("optim.lr", self.lr, above=0)
        _number("optim.end_lr", self.end_lr, least=0)
        if self.end_lr > self.lr:
            raise _bad(
                "optim.end_lr", self.end_lr, f"a learning rate <= the peak optim.lr={self.lr}"
            )
        _number("optim.weight_decay", self.weight_decay, least=0)
        betas = self.betas
        if (
            not isinstance(betas, list | tuple)
            or len(betas) != 2
            or not all(
                isinstance(b, int | float) and not isinstance(b, bool) and 0 <= b < 1 for b in betas
            )
        ):
            raise _bad("optim.betas", betas, "two numbers in [0, 1), e.g. [0.9, 0.999]")
        object.__setattr__(self, "betas", (float(betas[0]), float(betas[1])))
        _number("optim.eps", self.eps, above=0)
        _integer("optim.warmup_steps", self.warmup_steps, 0, optional=True)
        _number("optim.warmup_ratio", self.warmup_ratio, least=0, most=1)
        _integer("optim.total_steps", self.total_steps, 1, optional=True)
        _boolean("optim.fused", self.fused, optional=True)
        _number("optim.ema_decay", self.ema_decay, above=0, below=1, optional=True)
        _number("optim.pretrained_lr_scale", self.pretrained_lr_scale, above=0, optional=True)
        _number("optim.pretrained_decay", self.pretrained_decay, least=0, optional=True)
        if self.pretrained_decay is not None:
            # Each update moves the copied tensors lr x rate of the way back to their
            # pre-trained values: beyond the whole way it overshoots them.
            peak = self.lr * (self.pretrained_lr_scale or 1)
            if peak * self.pretrained_decay > 1:
                raise _bad(
                    "optim.pretrained_decay",
                    self.pretrained_decay,
                    f"at most 1 / lr = {1 / peak:g} (each update moves the copied tensors lr x "
                    f"rate of the way back to their pre-trained values; lr {peak:g} x "
                    f"{self.pretrained_decay:g} is more than the whole way)",
                )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "betas": list(self.betas)}


@dataclass(frozen=True)
class FlagSettings:
    """FLAG adversarial augmentation (Kong et al., 2020): ``flag.*``; off when ``m`` is 0.

    Attributes:
        m: ascent steps on a perturbation of the node input embeddings per update (0: off);
            training only.
        step_size: each ascent step, and the range of the perturbation's random start.
        mag: above 0, a bound on each node's perturbation norm; 0: unbounded.
    """

    m: int = 0
    step_size: float = 1e-3
    mag: float = 0.0

    def __post_init__(self) -> None:
        _integer("flag.m", self.m, 0)
        _number("flag.step_size", self.step_size, above=0)
        _number("flag.mag", self.mag, least=0)

    @property
    def enabled(self) -> bool:
        return self.m > 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DataModuleSettings:
    """Batching and preprocessing (``datamodule.*``): the arguments of
    :class:`~graphormer.data.GraphDataModule` besides the source and seed.

    Attributes:
        batch_size: graphs per training batch, per device.
        eval_batch_size: graphs per evaluation batch; None: ``batch_size``.
        num_workers: DataLoader worker processes (results do not depend on it).
        max_nodes: training skips graphs with more nodes, counted in one warning; evaluation
            keeps every graph.
        max_hops: edges kept per shortest path in the structural cache; the configs follow
            ``model.multi_hop_max_dist``.
        pad_to_multiple: nodes plus the graph token are padded to a multiple of this; None: 8
            on GPUs, 1 on the CPU.
        on_the_fly: compute structural features per batch instead of caching them (very large
            datasets).
        group_by_size: batch graphs of similar size together (far less padding).
        max_tokens: at most this many tokens per batch, counted as graphs x padded nodes
            (graph token included), for training and evaluation: a bound on a batch's memory;
            None: no budget.
    """

    batch_size: int = 64
    eval_batch_size: int | None = None
    num_workers: int = 0
    max_nodes: int = 128
    max_hops: int = 5
    pad_to_multiple: int | None = None  # None: 8 on GPUs, 1 on the CPU (resolve_padding)
    on_the_fly: bool = False
    group_by_size: bool = True
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        _integer("datamodule.batch_size", self.batch_size, 1)
        _integer("datamodule.eval_batch_size", self.eval_batch_size, 1, optional=True)
        _integer("datamodule.num_workers", self.num_workers, 0)
        _integer("datamodule.max_nodes", self.max_nodes, 1)
        _integer("datamodule.max_hops", self.max_hops, 1)
        _integer("datamodule.pad_to_multiple", self.pad_to_multiple, 1, optional=True)
        _boolean("datamodule.on_the_fly", self.on_the_fly)
        _boolean("datamodule.group_by_size", self.group_by_size)
        _integer("datamodule.max_tokens", self.max_tokens, 1, optional=True)
        useful = max_useful_hops(self.max_nodes)
        if self.max_hops > useful:
            raise _bad(
                "datamodule.max_hops",
                self.max_hops,
                f"at most {useful}: a training graph of at most datamodule.max_nodes="
                f"{self.max_nodes} nodes has shortest paths of at most {useful} edges, and every "
                "node pair would store all the hops asked for (it follows "
                "model.multi_hop_max_dist unless set; Graphormer uses 5, 20 on ZINC); lower it, "
                "or raise datamodule.max_nodes",
            )

    @classmethod
    def from_dict(cls, values: Mapping[str, Any] | None) -> DataModuleSettings:
        return _from(cls, "datamodule", values)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# Lightning's precision names: the ones graphormer runs a model in (graphormer.devices owns
# them), Lightning's auto choice, and its Transformer Engine plugin.
_PRECISIONS = ("auto", *PRECISIONS, "transformer-engine")


def _trainer_arguments() -> set[str]:
    import lightning.pytorch as pl

    return set(inspect.signature(pl.Trainer).parameters)


# Arguments the run sets itself: a config may not pass them to the Trainer.
_RUN_OWNED = {"callbacks", "logger", "default_root_dir", "enable_model_summary", "plugins"}


@dataclass(frozen=True)
class TrainerSettings:
    """Lightning ``Trainer`` arguments (``trainer.*``). The common ones are checked here; any
    other Trainer argument passes through in ``extra`` (Lightning checks it).

    Attributes:
        accelerator: ``cpu``, ``gpu`` (``cuda``), ``mps``, ``tpu`` or ``auto``.
        devices: how many devices (an integer), ``-1`` or ``auto`` for all, or a list of
            device indices.
        num_nodes: machines of a multi-node run (one process per device on each).
        strategy: Lightning's strategy: ``auto``, ``ddp`` (distributed data parallel), ...
        precision: ``32-true``, ``bf16-mixed``, ``16-mixed``, ... or ``auto``: bf16-mixed on
            GPUs that have it, 16-mixed on the others, 32-true on the CPU.
        max_epochs: epochs to train; -1: no limit (then ``max_steps`` must be set).
        max_steps: optimiser updates to train; -1: ``max_epochs`` decides.
        gradient_clip_val: gradients are clipped to this norm (the paper's 5.0); None: no clipping.
        gradient_clip_algorithm: ``norm`` or ``value``; None: Lightning's (``norm``).
        enable_progress_bar: None: a progress bar in a terminal and one plain line per epoch
            otherwise; true or false to choose.
        log_every_n_steps: training steps between logged values.
        check_val_every_n_epoch: epochs between validations.
        val_check_interval: also validate every N training batches (an integer) or at a
            fraction of an epoch; None: at the end of each epoch.
        num_sanity_val_steps: validation batches run before training, as a check.
        accumulate_grad_batches: batches whose gradients make one optimiser update.
        use_distributed_sampler: false: the data module shards training and evaluation itself
            (exact evaluation under DDP); leave it false.
        deterministic: Lightning's deterministic algorithms switch: true, false or ``warn``.
    """

    accelerator: str = "cpu"
    devices: Any = 1
    num_nodes: int = 1
    strategy: str = "auto"
    precision: Any = "32-true"
    max_epochs: int = 100
    max_steps: int = -1
    gradient_clip_val: float | None = 5.0
    gradient_clip_algorithm: str | None = None
    enable_progress_bar: bool | None = None
    log_every_n_steps: int = 20
    check_val_every_n_epoch: int | None = 1
    val_check_interval: Any = None
    num_sanity_val_steps: int = 2
    accumulate_grad_batches: int = 1
    use_distributed_sampler: bool = False
    deterministic: Any = False
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _choice(
            "trainer.accelerator",
            self.accelerator,
            ("auto", "cpu", "gpu", "cuda", "mps", "tpu"),
        )
        devices = self.devices
        if not (
            devices in ("auto", -1)
            or (isinstance(devices, int) and not isinstance(devices, bool) and devices >= 1)
            or (
                isinstance(devices, list | tuple)
                and devices
                and all(isinstance(d, int) and not isinstance(d, bool) for d in devices)
            )
        ):
            raise _bad(
                "trainer.devices",
                devices,
                "an integer >= 1 (how many), -1 or auto (all), or a list of device indices",
            )
        _integer("trainer.num_nodes", self.num_nodes, 1)
        strategies = ("auto", "ddp", "ddp_spawn", "ddp_find_unused_parameters_true", "fsdp")
        strategies += ("deepspeed", "single_device", "ddp_notebook")
        if not isinstance(self.strategy, str) or not (
            self.strategy in strategies or self.strategy.startswith(("ddp", "deepspeed", "fsdp"))
        ):
            raise _bad("trainer.strategy", self.strategy, f"one of {', '.join(strategies)}")
        object.__setattr__(self, "precision", str(self.precision))
        _choice("trainer.precision", self.precision, _PRECISIONS)
        _integer("trainer.max_epochs", self.max_epochs, -1)
        _integer("trainer.max_steps", self.max_steps, -1)
        if self.max_epochs == -1 and self.max_steps == -1:
            raise _bad(
                "trainer.max_epochs",
                -1,
                "-1 (no limit) only with a trainer.max_steps limit; set one of them",
            )
        _number("trainer.gradient_clip_val", self.gradient_clip_val, least=0, optional=True)
        if self.gradient_clip_algorithm is not None:
            _choice(
                "trainer.gradient_clip_algorithm", self.gradient_clip_algorithm, ("norm", "value")
            )
        _boolean("trainer.enable_progress_bar", self.enable_progress_bar, optional=True)
        _integer("trainer.log_every_n_steps", self.log_every_n_steps, 1)
        _integer("trainer.check_val_every_n_epoch", self.check_val_every_n_epoch, 1, optional=True)
        interval = self.val_check_interval
        if interval is not None and not (
            (isinstance(interval, int) and not isinstance(interval, bool) and interval >= 1)
            or (isinstance(interval, float) and 0 < interval <= 1)
        ):
            raise _bad(
                "trainer.val_check_interval",
                interval,
                "null, an integer >= 1 (every N training batches) or a fraction in (0, 1] of "
                "an epoch",
            )
        _integer("trainer.num_sanity_val_steps", self.num_sanity_val_steps, -1)
        _integer("trainer.accumulate_grad_batches", self.accumulate_grad_batches, 1)
        _boolean("trainer.use_distributed_sampler", self.use_distributed_sampler)
        if self.deterministic not in (True, False, "warn", None):
            raise _bad("trainer.deterministic", self.deterministic, "true, false or warn")
        for key in ("limit_train_batches", "limit_val_batches", "limit_test_batches"):
            if key in self.extra:
                _fraction_or_count(f"trainer.{key}", self.extra[key])
        self._check_validation_runs()

    def _check_validation_runs(self) -> None:
        """The best checkpoint is chosen by validation: settings under which it never runs are
        refused now, not after the training they would waste."""
        if self.extra.get("limit_val_batches", 1) in (0, 0.0):
            raise _bad(
                "trainer.limit_val_batches",
                self.extra["limit_val_batches"],
                "more than 0: validation selects the best checkpoint",
            )
        every = self.check_val_every_n_epoch
        if every is not None and self.max_steps == -1 and 0 <= self.max_epochs < every:
            raise _bad(
                "trainer.check_val_every_n_epoch",
                every,
                f"at most trainer.max_epochs={self.max_epochs}, or validation never runs and "
                "no checkpoint can be selected; lower it or train more epochs",
            )

    @classmethod
    def from_dict(cls, values: Mapping[str, Any] | None) -> TrainerSettings:
        values = dict(values or {})
        target = values.pop("_target_", None)
        if target not in (None, "lightning.pytorch.Trainer", "pytorch_lightning.Trainer"):
            raise _bad("trainer._target_", target, "lightning.pytorch.Trainer (or leave it out)")
        own = {f.name for f in fields(cls)} - {"extra"}
        extra = {k: v for k, v in values.items() if k not in own}
        check_keys("trainer", extra, (_trainer_arguments() | own) - _RUN_OWNED)
        mine = {k: v for k, v in values.items() if k in own}
        return cls(**mine, extra=extra)

    def lightning_kwargs(self) -> dict[str, Any]:
        """The arguments for ``lightning.pytorch.Trainer``."""
        kwargs = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        return {**kwargs, **self.extra}

    def to_dict(self) -> dict[str, Any]:
        return self.lightning_kwargs()


def _fraction_or_count(key: str, value: Any) -> None:
    if isinstance(value, bool) or not (
        (isinstance(value, int) and value >= 0)
        or (isinstance(value, float) and math.isfinite(value) and 0 <= value <= 1)
    ):
        raise _bad(key, value, "an integer >= 0 (batches) or a fraction in [0, 1]")


# The training losses (``loss=``): ``auto`` follows the task's metric; ``mve`` and
# ``evidential`` heads predict a distribution per regression target.
LOSSES = ("auto", "bce", "ce", "l1", "mse", "mve", "evidential")
_LOSSES = LOSSES
# Training losses of regression item targets (``item_loss``): auto is each level's own (MSE).
ITEM_LOSSES = ("auto", "l1", "mse")
# What a NaN or infinite loss or gradient does (``nonfinite=``).
NONFINITE = ("stop", "skip")


def auto_loss(task: Any) -> str:
    """The loss that optimises what the task is scored by: BCE for binary classification,
    cross-entropy for multi-class, L1 for MAE, MSE for RMSE (and L1 for any other regression
    metric)."""
    if task.is_multiclass:
        return "ce"
    if task.is_classification:
        return "bce"
    return "mse" if task.metric == "rmse" else "l1"


def resolve_loss(loss: str, task: Any) -> str:
    """``loss=`` for ``task`` (a :class:`~graphormer.data.tasks.TaskInfo`): ``auto`` resolved,
    and a loss that does not fit the task refused. The one check of ``loss`` against the task:
    a training run's settings and a checkpoint's module both ask it.

    Raises:
        ConfigError: naming ``loss`` and the fix.
    """
    if loss == "auto":
        loss = auto_loss(task)
    if loss not in LOSSES:
        raise ConfigError(f"loss must be one of {', '.join(LOSSES)}; got {loss!r}")
    if loss == "bce" and not task.is_classification:
        raise ConfigError(
            f"loss=bce needs a binary classification task; {task.name} is {task.task_type}"
        )
    regression = not (task.is_classification or task.is_multiclass)
    if loss in ("mve", "evidential") and not (regression and task.num_tasks):
        raise ConfigError(
            f"loss={loss} predicts a distribution of regression targets; {task.name} is "
            f"{task.task_type}{'' if task.num_tasks else ' of no molecule target'}"
        )
    if (loss == "ce") != task.is_multiclass:
        raise ConfigError(
            f"loss={loss} does not fit {task.name} ({task.task_type}): loss=ce is "
            "the loss of multi-class tasks, and theirs alone"
        )
    return loss


# How binary probabilities are calibrated on the validation split at the end of training.
# How a fine-tuning's new molecule output layer starts (graphormer.training.pretrained).
PRETRAINED_HEADS = ("random", "probe")


@dataclass(frozen=True)
class EnsembleSettings:
    """Several members that differ only in seed, in one run folder (``ensemble.*``, #19).

    Attributes:
        size: members (1: an ordinary run).
        parallel: train the members at once, one device each.
        allow_missing: score an ensemble some of whose members failed or are missing.
    """

    size: int = 1
    parallel: bool = False
    allow_missing: bool = False

    def __post_init__(self) -> None:
        _integer("ensemble.size", self.size, 1)
        _boolean("ensemble.parallel", self.parallel)
        _boolean("ensemble.allow_missing", self.allow_missing)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class FingerprintKernelSettings:
    """A Tanimoto kernel ridge regression on Morgan counts mixed with the network's regression
    predictions (``fingerprint_kernel.*``; :class:`~graphormer.training.kernel.FingerprintKernel`).

    Attributes:
        use: ``auto`` (on for regression when ``dataset.molecule_features=auto`` found an
            analogue series and gave Morgan counts), ``true`` (needs Morgan counts among the
            molecule features) or ``false``.
        weight: the network's share of the mix; the kernel's is ``1 - weight``.
    """

    use: bool | str = "auto"
    weight: float = 0.5

    def __post_init__(self) -> None:
        if not (isinstance(self.use, bool) or self.use == "auto"):
            raise _bad("fingerprint_kernel.use", self.use, "auto, true or false")
        weight = self.weight
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 <= weight <= 1:
            raise _bad(
                "fingerprint_kernel.weight", weight, "a number in [0, 1] (the network's share)"
            )
        object.__setattr__(self, "weight", float(self.weight))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class CrossValidationSettings:
    """K-fold cross-validation or N seeded random splits (``cv.*``, #19); both null: off.

    Attributes:
        folds: K-fold cross-validation (K >= 3): fold k is the test split, fold k+1 the
            validation split; folds keep scaffolds whole and spread a binary task's positives.
        replicates: N runs on seeded random splits (``dataset.split_seed``, +1, ...).
    """

    folds: int | None = None
    replicates: int | None = None

    def __post_init__(self) -> None:
        if self.folds is not None and not isinstance(self.folds, bool) and self.folds == 2:
            raise ConfigError(
                "cv.folds=2 is not allowed: each fold is the test split once and the next fold "
                "the validation split, so 2 folds leave no training data; give cv.folds >= 3"
            )
        _integer("cv.folds", self.folds, 3, optional=True)
        _integer("cv.replicates", self.replicates, 1, optional=True)
        if self.folds is not None and self.replicates is not None:
            raise ConfigError(
                f"cv.folds={self.folds} and cv.replicates={self.replicates} are two ways of "
                "resampling: give one"
            )

    @property
    def enabled(self) -> bool:
        return self.folds is not None or self.replicates is not None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RunSettings:
    """Everything a training run needs, checked.

    Attributes:
        dataset: the dataset source's settings (``source`` names it; checked by the source).
        model: :class:`~graphormer.models.GraphormerConfig` fields (checked when it is built).
        output_dir: the run folder (checkpoints, ``metrics.json``).
        datamodule, trainer, optim, flag: the groups above.
        loss: ``auto`` (follows the metric), ``bce``, ``ce`` (multi-class), ``l1``, ``mse``, or
            a head that predicts its own spread: ``mve`` (mean-variance estimation, Gaussian
            NLL) or ``evidential`` (deep evidential regression), for regression tasks.
        normalize_targets: regression trains on standardised targets.
        seed: the seed of every random stream of the run.
        ckpt_path: resume from this checkpoint of an interrupted run.
        pretrained: initialise the network from this checkpoint (fine-tuning).
        pretrained_strict: a checkpoint that does not fit exactly is an error (else a warning).
        pretrained_head: the new molecule output layer of a fine-tuning starts ``random``
            (Microsoft's fine-tuning) or ``probe``: fitted on the frozen pre-trained network.
        require_pretrained: ``pretrained`` must be given (fine-tuning recipes).
        nonfinite: a NaN or infinite loss or gradient ``stop``s the run, or ``skip``s the update.
        ensemble: members differing in seed (:class:`EnsembleSettings`).
        calibration: binary probabilities calibrated on the validation split: ``none``,
            ``temperature`` or ``isotonic``.
        cv: cross-validation or replicate splits (:class:`CrossValidationSettings`).
        resume_strict: a resume (``ckpt_path``) refuses command-line changes that would break
            its exactness; the command line applies them (``graphormer.cli.train``).
        monitor: the validation metric that selects the best checkpoint (``val/atom_mae``,
            ``atom_mae``, ``bond_rocauc``, ...); None: the first level present (molecules, then
            atoms, then bonds).
        loss_weights: weight of each level's loss (``molecule``, ``atom``, ``bond``,
            ``atom_vector``); None: all 1.
        loss_weights_end: each level's weight at the last update, reached linearly from
            ``loss_weights``; None (or a level not named): constant weights.
        item_loss: the loss of regression atom, bond and atom-vector targets: ``auto`` (MSE
            of standardised values), ``l1`` or ``mse``.
        fingerprint_kernel: a Tanimoto kernel model on Morgan counts mixed with the network's
            regression predictions (:class:`FingerprintKernelSettings`).
    """

    dataset: dict[str, Any]
    model: dict[str, Any]
    output_dir: Path
    datamodule: DataModuleSettings = field(default_factory=DataModuleSettings)
    trainer: TrainerSettings = field(default_factory=TrainerSettings)
    optim: OptimSettings = field(default_factory=OptimSettings)
    flag: FlagSettings = field(default_factory=FlagSettings)
    loss: str = "auto"
    normalize_targets: bool = True
    seed: int = 42
    ckpt_path: str | None = None
    pretrained: str | None = None
    pretrained_strict: bool = True
    pretrained_head: str = "random"
    require_pretrained: bool = False
    nonfinite: str = "stop"
    resume_strict: bool = True
    ensemble: EnsembleSettings = field(default_factory=EnsembleSettings)
    calibration: str = "none"
    cv: CrossValidationSettings = field(default_factory=CrossValidationSettings)
    monitor: str | None = None
    loss_weights: dict[str, float] | None = None
    loss_weights_end: dict[str, float] | None = None
    item_loss: str = "auto"
    fingerprint_kernel: FingerprintKernelSettings = field(default_factory=FingerprintKernelSettings)

    def __post_init__(self) -> None:
        for key in ("dataset", "model"):
            if not isinstance(getattr(self, key), Mapping):
                raise _bad(
                    key, getattr(self, key), "a group of settings (dataset=NAME, model=NAME)"
                )
        object.__setattr__(self, "output_dir", Path(self.output_dir))
        _choice("loss", self.loss, _LOSSES)
        _boolean("normalize_targets", self.normalize_targets)
        _integer("seed", self.seed, 0, most=_MAX_SEED)
        for key in ("ckpt_path", "pretrained"):
            value = getattr(self, key)
            if value is not None and not isinstance(value, str | Path):
                raise _bad(key, value, "a file path or null")
        _boolean("pretrained_strict", self.pretrained_strict)
        _choice("pretrained_head", self.pretrained_head, PRETRAINED_HEADS)
        _boolean("require_pretrained", self.require_pretrained)
        try:  # the model's own checks, now rather than after the data has been read
            depth = resolve_depth(self.model.get("num_layers", AUTO_DEPTH), analogues=False)
            if isinstance(depth, str):
                raise _bad(
                    "model.num_layers",
                    depth,
                    "an integer >= 1, or auto (12; 6 for an analogue series)",
                )
            early = {**self.model, "num_layers": depth, "num_tasks": 1}
            if self.model.get("forces") == "gradient":
                # The vector targets are the data's (dataset.atom_vector_targets), read later.
                early["atom_vector_tasks"] = 1
            GraphormerConfig.from_dict(early)
        except (TypeError, ValueError) as error:
            raise ConfigError(str(error)) from error
        _choice("nonfinite", self.nonfinite, NONFINITE)
        _boolean("resume_strict", self.resume_strict)
        _choice("calibration", self.calibration, CALIBRATIONS)
        if self.monitor is not None and not isinstance(self.monitor, str):
            raise _bad("monitor", self.monitor, "a validation metric name (val/atom_mae) or null")
        if self.loss_weights is not None:
            if not isinstance(self.loss_weights, Mapping):
                raise _bad(
                    "loss_weights", self.loss_weights, "{molecule: W, atom: W, bond: W} or null"
                )
            object.__setattr__(self, "loss_weights", dict(self.loss_weights))
        if self.loss_weights_end is not None:
            if not isinstance(self.loss_weights_end, Mapping):
                raise _bad("loss_weights_end", self.loss_weights_end, "{atom_vector: W} or null")
            object.__setattr__(self, "loss_weights_end", dict(self.loss_weights_end))
        _choice("item_loss", self.item_loss, ITEM_LOSSES)
        if self.flag.enabled and self.trainer.accumulate_grad_batches > 1:
            raise ConfigError(
                "flag.m > 0 (FLAG) takes its own gradient steps and cannot accumulate gradients "
                "over batches: set trainer.accumulate_grad_batches=1, or use a larger "
                "datamodule.batch_size"
            )
        layerdrop = self.model.get("layerdrop") or 0
        distributed = self.trainer.devices != 1 or self.trainer.strategy.startswith(
            ("ddp", "fsdp", "deepspeed")
        )
        if layerdrop and distributed and self.trainer.strategy != "ddp_find_unused_parameters_true":
            raise ConfigError(
                f"model.layerdrop={layerdrop} leaves layers out of a batch, and each device "
                "leaves out its own, which distributed training's gradient exchange refuses: "
                "add trainer.strategy=ddp_find_unused_parameters_true, or train on one device "
                "(trainer.devices=1)"
            )
        if not self.pretrained and not self.ckpt_path:
            self._refuse_fine_tuning_settings()

    def _refuse_fine_tuning_settings(self) -> None:
        """A run that starts from nothing (no ``pretrained=``, no resume) refuses the settings
        that only a fine-tuning reads, each with one error line."""
        if self.require_pretrained:
            raise ConfigError(
                "this configuration fine-tunes a pre-trained model: pass pretrained=FILE.ckpt (a "
                "pre-training run's checkpoint, or published weights converted with "
                "scripts/convert.py; see docs/guide/paper.md)"
            )
        if self.pretrained_head != "random":
            raise ConfigError(
                f"pretrained_head={self.pretrained_head} fits the new output layer of a "
                "fine-tuning: give pretrained=FILE.ckpt too, or leave pretrained_head=random"
            )
        decay = self.optim.pretrained_decay
        if decay is not None:
            raise ConfigError(
                f"optim.pretrained_decay={decay} pulls the tensors copied by a fine-tuning toward "
                "their pre-trained values: give pretrained=FILE.ckpt too, or leave "
                "optim.pretrained_decay=null"
            )
        scale = self.optim.pretrained_lr_scale
        if scale is not None:
            raise ConfigError(
                f"optim.pretrained_lr_scale={scale} sets the learning rate of the tensors a "
                "fine-tuning copies: give pretrained=FILE.ckpt too, or leave "
                "optim.pretrained_lr_scale=null"
            )

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> RunSettings:
        """Settings from plain values (a resolved Hydra config: ``dataset``, ``model``,
        ``datamodule``, ``trainer``, ``optim``, ``flag`` and the top-level keys)."""
        values = dict(values)
        values.pop("logger", None)  # loggers are objects: the caller builds them
        check_keys("config", values, [f.name for f in fields(cls)])
        for key in ("dataset", "model", "output_dir"):
            if values.get(key) is None:
                raise ConfigError(f"{key} must be given")
        groups = {
            "datamodule": DataModuleSettings.from_dict(values.pop("datamodule", None)),
            "trainer": TrainerSettings.from_dict(values.pop("trainer", None)),
            "optim": _from(OptimSettings, "optim", values.pop("optim", None)),
            "flag": _from(FlagSettings, "flag", values.pop("flag", None)),
            "ensemble": _from(EnsembleSettings, "ensemble", values.pop("ensemble", None)),
            "cv": _from(CrossValidationSettings, "cv", values.pop("cv", None)),
            "fingerprint_kernel": _from(
                FingerprintKernelSettings,
                "fingerprint_kernel",
                values.pop("fingerprint_kernel", None),
            ),
        }
        return cls(**values, **groups)
