"""``train(settings)``: build data, model and trainer from typed settings, fit, test, record."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.loggers import Logger

from graphormer import checkpoint as checkpoints
from graphormer.console import command, report
from graphormer.data.datamodule import GraphDataModule
from graphormer.data.sources import Source, build_source
from graphormer.devices import (
    flushes_subnormals,
    on_gpu,
    resolve_pad_to_multiple,
    resolve_precision,
)
from graphormer.errors import ConfigError
from graphormer.models.graphormer import resolve_depth
from graphormer.models.molecule_features import MOLECULE_FEATURE_RULE
from graphormer.rundir import is_first_process, newest_checkpoint
from graphormer.training.callbacks import EpochSummary, RunCheckpoint, WeightAverage
from graphormer.training.module import GraphormerModule, NonFiniteError
from graphormer.training.precision import precision_arguments
from graphormer.training.pretrained import HeadProbe, load_pretrained
from graphormer.training.settings import DataModuleSettings, RunSettings
from graphormer.uncertainty.heads import DISTRIBUTION_WIDTHS

__all__ = [
    "RunInterrupted",
    "absolute_paths",
    "build_datamodule",
    "build_module",
    "feature_mismatch",
    "quiet_third_parties",
    "train",
]

log = logging.getLogger(__name__)


def build_datamodule(
    dataset: dict[str, Any],
    datamodule: DataModuleSettings | dict[str, Any],
    seed: int = 0,
    gpu: bool | None = None,
    source: Source | None = None,
) -> GraphDataModule:
    """The datamodule from plain dataset settings and the datamodule settings (checked by
    :class:`DataModuleSettings`, whether from the command line or read from a checkpoint). The
    dataset source is chosen by name from graphormer's own table
    (:func:`~graphormer.data.build_source`): settings read from a checkpoint are data, and never
    name code to run. ``pad_to_multiple: null`` is resolved for ``gpu`` (default: whether a GPU
    is visible). ``source``: the source of ``dataset`` when the caller built it already (a fit
    builds it once)."""
    source = source if source is not None else build_source(dataset)
    if not isinstance(datamodule, DataModuleSettings):
        datamodule = DataModuleSettings.from_dict(datamodule)
    values = datamodule.to_dict()
    gpu = torch.cuda.is_available() if gpu is None else gpu
    values["pad_to_multiple"] = resolve_pad_to_multiple(values["pad_to_multiple"], gpu)
    return GraphDataModule(source, **values, seed=seed)


def build_module(settings: RunSettings, datamodule: GraphDataModule) -> GraphormerModule:
    """The LightningModule of a run: the network sized for the data, the task, the optimiser."""
    model = dict(settings.model)
    _dataset_feature_dims(model, datamodule)
    _resolve_depth(model, datamodule, settings.pretrained if not settings.ckpt_path else None)
    data = {
        # What the data resolved (molecule_features=auto's choice) over what was asked: the
        # checkpoint rebuilds these inputs.
        "dataset": {
            **absolute_paths(dict(settings.dataset)),
            **datamodule.source.resolved_settings(),
        },
        # As resolved for this run (pad_to_multiple: null becomes 8 or 1), so that eval.py and
        # a resume batch exactly as training did, whatever the device they run on.
        "datamodule": {
            **settings.datamodule.to_dict(),
            "pad_to_multiple": datamodule.pad_to_multiple,
        },
    }
    features = datamodule.source.molecule_features()
    if features is not None:
        # What the model's molecule features are and how they are transformed (issue #22): the
        # statistics themselves are the model's buffers.
        data["molecule_features"] = {"names": features.names(), "rule": MOLECULE_FEATURE_RULE}
        chosen_by = getattr(datamodule.source, "auto_choice", None)
        if chosen_by is not None:
            data["molecule_features"]["auto"] = chosen_by
    kernel = _resolve_kernel(settings, datamodule)
    try:
        module = GraphormerModule(
            model=model,
            task=datamodule.task.to_dict(),
            **settings.optim.to_dict(),
            loss=settings.loss,
            normalize_targets=settings.normalize_targets,
            data=data,
            flag=settings.flag.to_dict() if settings.flag.enabled else None,
            nonfinite=settings.nonfinite,
            **({"loss_weights": settings.loss_weights} if settings.loss_weights else {}),
            # Only when set: the hyperparameters of runs without them stay as they were.
            **(
                {"loss_weights_end": settings.loss_weights_end} if settings.loss_weights_end else {}
            ),
            **({"item_loss": settings.item_loss} if settings.item_loss != "auto" else {}),
            **({"fingerprint_kernel": kernel} if kernel else {}),
        )
        module.config.check_hops(settings.datamodule.max_hops)
        return module
    except (ValueError, TypeError) as error:
        # The model's and the module's own checks name the key ("model.hidden_dim ...").
        raise ConfigError(str(error)) from error


def _resolve_kernel(settings: RunSettings, datamodule: GraphDataModule) -> dict | None:
    """``fingerprint_kernel``: the module's kernel settings (the Morgan counts' columns among the
    molecule features, the training molecules it keeps, the network's share), or None. ``auto``
    mixes a kernel into regression on an analogue series given Morgan counts by
    ``dataset.molecule_features=auto``; ``true`` asks for it (one error line where it cannot
    be)."""
    chosen = settings.fingerprint_kernel
    if chosen.use is False or chosen.weight == 1.0:
        return None
    task = datamodule.task
    regression = task.num_tasks > 0 and not (task.is_classification or task.is_multiclass)
    spread = settings.loss in DISTRIBUTION_WIDTHS  # a head that predicts its own spread
    features = datamodule.source.molecule_features()
    names = features.names() if features is not None else []
    columns = [i for i, name in enumerate(names) if name.startswith("morgan_counts:")]
    if chosen.use == "auto":
        choice = getattr(datamodule.source, "auto_choice", None) or {}
        if choice.get("molecule_features") != "morgan_counts" or not regression or spread:
            return None
    elif not regression:
        raise ConfigError(
            f"fingerprint_kernel.use=true mixes regression predictions, and {task.name} has no "
            "regression target at molecule level: set fingerprint_kernel.use=false"
        )
    elif spread:
        raise ConfigError(
            f"fingerprint_kernel.use=true mixes point predictions, and loss={settings.loss} "
            "predicts a spread too: use another loss, or fingerprint_kernel.use=false"
        )
    elif not columns:
        raise ConfigError(
            "fingerprint_kernel.use=true reads Morgan counts: add "
            "dataset.molecule_features=morgan_counts (or rdkit2d+morgan_counts)"
        )
    if columns != list(range(columns[0], columns[-1] + 1)):
        raise ValueError("the Morgan counts must be one block of the molecule features")
    datamodule.setup("fit")  # the training molecules the kernel keeps (the trainer's is a no-op)
    return {
        "columns": [columns[0], columns[-1] + 1],
        "references": len(datamodule.train_index),
        "weight": chosen.weight,
    }


def _resolve_depth(
    model_cfg: dict[str, Any], datamodule: GraphDataModule, pretrained: str | None = None
) -> None:
    """``model.num_layers=auto``: a fine-tuning's checkpoint's depth (``pretrained``: its
    weights must fit), else 6 layers when ``dataset.molecule_features=auto`` found an analogue
    series and gave Morgan counts, 12 otherwise (logged); the checkpoint keeps the number."""
    if model_cfg.get("num_layers") != "auto":
        return
    if pretrained and Path(pretrained).is_file():  # a missing file: load_pretrained says so
        depth = checkpoints.load(pretrained).model.get("num_layers")
        if isinstance(depth, int):
            model_cfg["num_layers"] = depth
            log.info("model.num_layers=auto: %d layers, as pretrained=%s", depth, pretrained)
            return
    choice = getattr(datamodule.source, "auto_choice", None) or {}
    analogues = choice.get("molecule_features") == "morgan_counts"
    model_cfg["num_layers"] = resolve_depth("auto", analogues)
    log.info(
        "model.num_layers=auto: %d layers (%s)",
        model_cfg["num_layers"],
        "an analogue series, Morgan counts beside the graph"
        if analogues
        else "not an analogue series given Morgan counts by dataset.molecule_features=auto",
    )


def _dataset_feature_dims(model_cfg: dict[str, Any], datamodule: GraphDataModule) -> None:
    """Sizes the model's embedding tables by the dataset's own vocabularies (ZINC's atom and bond
    types), where the config leaves them null; the filled values are saved with the checkpoint's
    model settings, so eval.py and fine-tuning rebuild the same tables. Sources featurised like
    OGB (``feature_dims()`` is None) keep the model's default, OGB's featurisation."""
    missing = positions_mismatch(model_cfg.get("channels", "2d"), datamodule.source)
    if missing:
        raise ConfigError(f"model.channels={model_cfg.get('channels')}: {missing}")
    features = datamodule.source.molecule_features()
    widths = (*datamodule.source.continuous_dims(), len(features.names()) if features else 0)
    keys = ("node_continuous_dim", "edge_continuous_dim", "molecule_features_dim")
    for key, width in zip(keys, widths, strict=True):
        given = model_cfg.get(key)
        if given is None and width:
            model_cfg[key] = int(width)
        elif given is not None and int(given) != int(width):
            raise ConfigError(
                f"model.{key}={given} does not fit {datamodule.task.name}: its graphs carry "
                f"{width} column(s) of such features; leave model.{key} unset to follow the data"
            )
    dims = datamodule.source.feature_dims()
    if dims is None:
        return
    for key, needed, kind in zip(
        ("atom_feature_dims", "bond_feature_dims"), dims, ("node", "edge"), strict=True
    ):
        given = model_cfg.get(key)
        if given is None:
            model_cfg[key] = [int(d) for d in needed]
        elif len(given) != len(needed) or any(
            int(g) < n for g, n in zip(given, needed, strict=True)
        ):
            raise ConfigError(
                f"model.{key}={list(given)} cannot hold the {kind} features of "
                f"{datamodule.task.name}: {len(needed)} column(s) with vocabularies "
                f"{list(needed)}; set model.{key}=null to follow the dataset (or give "
                f"{len(needed)} size(s) at least that large)"
            )


def positions_mismatch(channels: str, source: Any) -> str | None:
    """Why a model of ``channels`` cannot read ``source``'s graphs (a 3D-only model and graphs
    without atom positions), or None when it can."""
    if channels != "3d" or source.has_positions():
        return None
    return (
        f"the model reads atom positions and the graphs of {source.name} carry none: give them "
        "conformers (dataset.conformers=rdkit for a SMILES CSV or an OGB molecule set) or read a "
        "structure file (dataset=ase), or use model.channels=both (positions when there are, "
        "bonds always)"
    )


def feature_mismatch(config: Any, source: Any) -> str | None:
    """Why the data of ``source`` cannot be read by a model of ``config`` (a
    :class:`~graphormer.models.GraphormerConfig`, e.g. a checkpoint's), or None when it can: the
    same continuous widths, the same categorical columns, vocabularies no larger than the
    model's tables. Evaluation and fine-tuning ask here, so that a mismatch is one clear error
    rather than an index error deep in the model."""
    missing = positions_mismatch(config.channels, source)
    if missing:
        return missing
    widths = source.continuous_dims()
    model_widths = (config.node_continuous_dim, config.edge_continuous_dim)
    for kind, width, model_width in zip(("node", "edge"), widths, model_widths, strict=True):
        if int(width) != int(model_width):
            return (
                f"its graphs carry {width} continuous {kind} feature column(s) but the model "
                f"reads {model_width}"
            )
    features = source.molecule_features()
    width = len(features.names()) if features is not None else 0
    if width != config.molecule_features_dim:
        return (
            f"its molecules carry {width} molecule feature(s) (dataset.molecule_features, "
            f"dataset.feature_columns) but the model reads {config.molecule_features_dim}"
        )
    dims = source.feature_dims()
    if dims is None:
        return None
    model_dims = (config.atom_feature_dims, config.bond_feature_dims)
    for kind, needed, given in zip(("node", "edge"), dims, model_dims, strict=True):
        if len(needed) != len(given) or any(n > g for n, g in zip(needed, given, strict=True)):
            return (
                f"its categorical {kind} features need tables {list(needed)} but the model "
                f"has {list(given)}"
            )
    return None


def absolute_paths(dataset_cfg: dict[str, Any]) -> dict[str, Any]:
    """The dataset settings with absolute paths, so that eval.py finds the data from any folder."""
    for key in ("root", "path", "split_file"):
        value = dataset_cfg.get(key)
        if isinstance(value, str) and not value.startswith("rdkit:"):
            dataset_cfg[key] = os.path.abspath(os.path.expanduser(value))
    return dataset_cfg


def is_terminal() -> bool:
    """Whether stdout is a terminal a progress bar can be drawn in (some report 0 columns:
    tqdm then draws nothing, so those get the plain per-epoch lines)."""
    return sys.stdout.isatty() and shutil.get_terminal_size(fallback=(0, 0)).columns > 0


def _check_writable(folder: Path) -> None:
    """Fails now, not after hours of training, if checkpoints cannot be written."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        raise ConfigError(
            f"cannot write checkpoints to {folder} ({error.strerror or error}); choose a "
            "writable run folder with hydra.run.dir=DIR (or output_dir=DIR)"
        ) from error


def quiet_third_parties() -> None:
    """No adverts or known-harmless notices on every run (warnings that matter still show)."""
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).setLevel(logging.WARNING)
    for pattern in (
        r".*isinstance\(treespec, LeafSpec\)",  # Lightning on torch >= 2.10
        r".*number of training batches .* is smaller than the logging interval",
        r".*does not have many workers which may be a bottleneck",
        r".*litlogger|.*litmodels",
        # Our epoch-level metrics are computed from predictions gathered on every rank, so
        # each rank logs the same value: Lightning's advice to sync them does not apply.
        r".*when logging on epoch level in distributed setting",
        r".*torch.distributed.nn.functional.all_gather is deprecated",  # Lightning, torch >= 2.10
        # GraphormerModule moves batches itself (non-blocking on GPUs, issue #21), as intended.
        r".*overridden `transfer_batch_to_device` in `LightningModule` but have passed in a",
    ):
        warnings.filterwarnings("ignore", message=pattern)


class RunInterrupted(KeyboardInterrupt):
    """Training was interrupted (Ctrl-C): what was saved, and how to continue.

    Attributes:
        epochs: the epochs finished and saved (0: nothing to resume from).
        max_epochs: the epochs the run was set to train.
        checkpoint: the checkpoint to resume from (None if none was saved).
        metrics: ``metrics.json`` as written for the epochs so far (None if none).
    """

    def __init__(
        self, epochs: int, max_epochs: int, checkpoint: Path | None, metrics: Path | None
    ) -> None:
        super().__init__(epochs, checkpoint)
        self.epochs, self.max_epochs = epochs, max_epochs
        self.checkpoint, self.metrics = checkpoint, metrics

    def __str__(self) -> str:
        if self.checkpoint is None:
            return "interrupted (Ctrl-C) before the first epoch was saved: nothing to resume"
        total = f" of {self.max_epochs}" if self.max_epochs and self.max_epochs > 0 else ""
        text = f"interrupted (Ctrl-C) after epoch {self.epochs}{total}; saved: {self.checkpoint}"
        return text + (f"; results so far: {self.metrics}" if self.metrics else "")


def train(
    settings: RunSettings,
    callbacks: list[pl.Callback] | None = None,
    loggers: list[Logger] | None = None,
    source: Source | None = None,
) -> dict[str, Any]:
    """Trains a Graphormer as ``settings`` say; returns what it writes to ``metrics.json``.

    Args:
        settings (RunSettings): the run (``RunSettings.from_dict`` checks plain values).
        callbacks (list[Callback] | None, optional): extra Lightning callbacks, for code that
            embeds training. (default: :obj:`None`)
        loggers (list[Logger] | None, optional): Lightning loggers (the command line builds
            them from ``logger=``); with any, the learning rate is logged too.
            (default: :obj:`None`)
        source (Source | None, optional): the source of ``settings.dataset``, when the caller
            built it already; None builds it. (default: :obj:`None`)
    """
    quiet_third_parties()
    if settings.ckpt_path:
        checkpoints.load(settings.ckpt_path)  # a missing, corrupt or altered file fails now
    trainer_settings = settings.trainer
    pl.seed_everything(settings.seed, workers=True, verbose=False)
    torch.set_float32_matmul_precision("high")
    output_dir = Path(settings.output_dir)
    _check_writable(output_dir / "checkpoints")
    gpu = on_gpu(trainer_settings.accelerator)
    datamodule = build_datamodule(
        settings.dataset, settings.datamodule, settings.seed, gpu, source=source
    )
    task = datamodule.task
    if datamodule.source.resolves_on_load():
        datamodule.prepare_data()  # its auto settings come from the data: before the model is sized
    module = build_module(settings, datamodule)
    if settings.pretrained and not settings.ckpt_path:  # a resume's weights are its checkpoint's
        loaded = load_pretrained(module, settings.pretrained, strict=settings.pretrained_strict)
        module.pretrained_parameters = frozenset(loaded.copied)
        module.anchor_pretrained()
        if is_first_process():
            report(loaded.summary())
            scale = settings.optim.pretrained_lr_scale
            if scale is not None and scale != 1:
                report(
                    f"optim.pretrained_lr_scale={scale}: the copied tensors train at lr "
                    f"{settings.optim.lr * scale:g}, the ones new to the task at {settings.optim.lr:g}"
                )
            decay = settings.optim.pretrained_decay
            if decay is not None:
                report(
                    f"optim.pretrained_decay={decay:g}: the copied tensors decay toward their "
                    f"pre-trained values, the ones new to the task toward zero "
                    f"(optim.weight_decay={settings.optim.weight_decay:g})"
                )

    monitor = monitor_key(settings.monitor, task)
    checkpoint = RunCheckpoint(
        dirpath=output_dir / "checkpoints",
        filename="best-epoch{epoch:03d}",
        monitor=monitor,
        mode="max" if task.metric_higher_is_better(monitor.removeprefix("val/")) else "min",
        save_top_k=1,
        save_last=True,
        auto_insert_metric_name=False,
    )
    callbacks = [checkpoint, *(callbacks or [])]
    if settings.pretrained and not settings.ckpt_path and settings.pretrained_head == "probe":
        callbacks.append(HeadProbe())  # before the average starts from the weights
        module.probed_head = True
        if settings.optim.warmup_steps is None and is_first_process():
            report(
                "pretrained_head=probe: the learning rate warms up over the first epoch at "
                "least, so that the first full-size updates do not undo the fitted layer "
                "(optim.warmup_steps=N chooses another warm-up)"
            )
    if module.hparams.get("ema_decay") is not None:
        callbacks.append(WeightAverage(module.hparams.ema_decay))
    kwargs = trainer_settings.lightning_kwargs()
    progress_bar = kwargs.pop("enable_progress_bar")
    if progress_bar is None:  # a bar in a terminal, plain lines in a log file or a pipe
        progress_bar = is_terminal()
    if not progress_bar:
        callbacks.append(EpochSummary())
    if loggers:
        callbacks.append(pl.callbacks.LearningRateMonitor(logging_interval="step"))
    if module.flag.enabled:
        # FLAG optimises manually (several backward passes per update), and Lightning refuses
        # its own clipping then: the module clips with the same value instead.
        module.gradient_clip_val = kwargs["gradient_clip_val"]
        module.gradient_clip_algorithm = kwargs["gradient_clip_algorithm"] or "norm"
        kwargs["gradient_clip_val"] = None
        kwargs["gradient_clip_algorithm"] = None
    kwargs.update(precision_arguments(resolve_precision(kwargs.pop("precision"), gpu)))
    try:
        trainer = pl.Trainer(
            **kwargs,
            callbacks=callbacks,
            logger=list(loggers or []) or False,
            default_root_dir=output_dir,
            enable_progress_bar=progress_bar,
            enable_model_summary=False,
        )
    except (MisconfigurationException, ValueError, TypeError) as error:
        # Lightning's own refusal of a combination (no GPU for accelerator=gpu, ...).
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ConfigError(f"the trainer settings are not usable: {first}") from error
    if trainer.is_global_zero:
        report(
            f"model: {sum(p.numel() for p in module.parameters()):,} parameters; "
            f"precision: {trainer.precision}; devices: {trainer.world_size}"
        )
    with warnings.catch_warnings():
        if settings.ckpt_path:
            # Expected when resuming: the run's own checkpoints are there, and a moved or copied
            # run folder has a new path (RunCheckpoint carries the best score across).
            for pattern in (r"Checkpoint directory .* exists and is not empty", r"The dirpath has"):
                warnings.filterwarnings("ignore", message=pattern)
        try:
            with subnormals_flushed(not gpu):
                trainer.fit(
                    module, datamodule=datamodule, ckpt_path=settings.ckpt_path, weights_only=True
                )
        except SystemExit:
            # Lightning turns Ctrl-C into sys.exit(1) after its graceful shutdown.
            if not trainer.interrupted:
                raise
            raise _interrupted(trainer, checkpoint, task, output_dir) from None

    best = checkpoint.best_model_path
    if not best or not Path(best).is_file():
        raise ConfigError(
            "no checkpoint was selected because validation never ran: trainer.max_epochs="
            f"{trainer.max_epochs}, trainer.max_steps={trainer.max_steps}, "
            f"trainer.check_val_every_n_epoch={trainer.check_val_every_n_epoch}, "
            f"trainer.val_check_interval={trainer.val_check_interval}; let validation run at "
            "least once (with max_steps, set trainer.val_check_interval=N steps)"
        )
    metric = monitor.removeprefix("val/")
    test = None  # PCQM4Mv2's test splits have no labels: the leaderboard scores them
    if datamodule.is_labelled("test"):
        scores = trainer.test(
            module, datamodule=datamodule, ckpt_path=best, verbose=False, weights_only=True
        )
        # Every level's metrics (issue #18); a molecule-only task has one.
        test = {name: float(scores[0][f"test/{name}"]) for name in task.level_metrics}
    results = {**_results(trainer, checkpoint, task, output_dir), "test": test}
    if len(task.level_metrics) > 1:
        # The best checkpoint's score of every level on the validation split, not the
        # monitored one alone.
        scores = trainer.validate(
            module, datamodule=datamodule, ckpt_path=best, verbose=False, weights_only=True
        )
        results["valid"].update(
            {name: float(scores[0][f"val/{name}"]) for name in task.level_metrics}
        )
    _refuse_nonfinite_scores(results)
    if trainer.is_global_zero:
        path = output_dir / "metrics.json"
        path.write_text(json.dumps(results, indent=2) + "\n")
        report(f"best checkpoint: {results['best_checkpoint']}")
        report(f"metrics: {path.resolve()}")
        test_text = f"{test[metric]:.4f}" if test else "none (no labelled test split)"
        report(f"valid {metric}: {results['valid'][metric]:.4f}  test {metric}: {test_text}")
        report(f"evaluate with: {command('eval')} ckpt={results['best_checkpoint']}")
    return results


@contextmanager
def subnormals_flushed(enabled: bool) -> Iterator[None]:
    """Subnormal floats (below 1.2e-38 in float32) read and written as zero on this thread while
    training on a CPU (x86's FTZ and DAZ modes, ``torch.set_flush_denormal``), then the default
    again. Subnormal operands take a slow path in the CPU's arithmetic: the 3D encoding's
    Gaussian kernels hold some (pairs far from a kernel's mean), and a training step of a 3D
    model took about a fifth less time with them flushed. A subnormal added to any normal
    float32 value is below half its last bit, so results stay the same unless a whole sum is
    subnormal (150 steps of the conformer benchmark's model: every weight bit for bit). Torch's
    other threads keep their own mode: the command line sets it for the whole process before
    they start (:func:`graphormer.cli.train.run`); a thread already flushing is left so."""
    if not enabled or flushes_subnormals() or not torch.set_flush_denormal(True):
        yield  # set_flush_denormal gives False on a CPU without the modes
        return
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def _refuse_nonfinite_scores(results: dict[str, Any]) -> None:
    """A score of inf or NaN is a failed run, not a result to report with exit status 0."""
    for split in ("valid", "test"):
        bad = {k: v for k, v in (results[split] or {}).items() if not math.isfinite(v)}
        if bad:
            shown = ", ".join(f"{split} {k} {v}" for k, v in bad.items())
            raise NonFiniteError(
                f"training ended without a usable model: {shown} (the predictions or the "
                f"targets overflow); lower optim.lr, rescale extreme targets, or keep "
                f"trainer.gradient_clip_val set. The checkpoints are in {results['best_checkpoint']}"
            )


def _results(trainer: pl.Trainer, checkpoint: RunCheckpoint, task, output_dir: Path) -> dict:
    """What ``metrics.json`` holds (``test`` is filled by the caller)."""
    best = checkpoint.best_model_path
    metric = str(checkpoint.monitor).removeprefix("val/")
    last = output_dir / "checkpoints" / "last.ckpt"
    results = {
        "dataset": task.name,
        "metric": metric,
        "valid": {metric: float(checkpoint.best_model_score)},
        "test": None,
        "best_checkpoint": str(Path(best).resolve()),
        "last_checkpoint": str(last.resolve()),
        "epochs": trainer.current_epoch,
        "precision": str(trainer.precision),
    }
    return results


def monitor_key(given: str | None, task) -> str:
    """The logged key selecting the best checkpoint: ``monitor=`` (``val/NAME`` or ``NAME``), or
    the task's default (the first level present); one of the task's validation metrics."""
    if given is None:
        return task.monitor
    name = str(given).removeprefix("val/")
    if name not in task.level_metrics:
        choices = ", ".join(f"val/{m}" for m in task.level_metrics)
        raise ConfigError(
            f"monitor={given} is not a validation metric of {task.name}: choose one of {choices}"
        )
    return f"val/{name}"


def _interrupted(
    trainer: pl.Trainer, checkpoint: RunCheckpoint, task, output_dir: Path
) -> RunInterrupted:
    """After Ctrl-C: ``metrics.json`` for the epochs saved so far (``"interrupted": true``, no
    test scores) and what to tell the user."""
    saved = newest_checkpoint(output_dir)
    if saved is None:
        return RunInterrupted(0, trainer.max_epochs, None, None)
    epochs = checkpoints.saved_epoch(saved) + 1
    metrics = None
    best = checkpoint.best_model_path
    if trainer.is_global_zero and best and Path(best).is_file():
        results = {**_results(trainer, checkpoint, task, output_dir), "epochs": epochs}
        results["interrupted"] = True
        results["last_checkpoint"] = str(saved.resolve())
        metrics = output_dir / "metrics.json"
        metrics.write_text(json.dumps(results, indent=2) + "\n")
        metrics = metrics.resolve()
    return RunInterrupted(epochs, trainer.max_epochs, saved.resolve(), metrics)
