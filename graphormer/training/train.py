"""``train(cfg)``: compose data, model and trainer from a Hydra config, fit, test, record."""

from __future__ import annotations

import inspect
import json
import logging
import os
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import hydra
import lightning.pytorch as pl
import torch
from omegaconf import DictConfig, OmegaConf

from graphormer.console import report
from graphormer.data.datamodule import GraphDataModule
from graphormer.data.sources import build_source
from graphormer.errors import ConfigError
from graphormer.training.callbacks import EpochSummary, RunCheckpoint
from graphormer.training.checkpoint import load_checkpoint_file
from graphormer.training.module import GraphormerModule
from graphormer.training.pretrained import load_pretrained
from graphormer.training.rundir import is_first_process

__all__ = [
    "absolute_paths",
    "build_datamodule",
    "build_module",
    "quiet_third_parties",
    "resolve_precision",
    "train",
]

log = logging.getLogger(__name__)


def _container(cfg: DictConfig) -> dict[str, Any]:
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def build_datamodule(
    dataset_cfg: dict[str, Any], datamodule_cfg: dict[str, Any], seed: int = 0
) -> GraphDataModule:
    """The datamodule from plain dataset and datamodule settings. The dataset source is chosen
    by name from graphormer's own table (:func:`~graphormer.data.build_source`): settings read
    from a checkpoint are data, and never name code to run."""
    source = build_source(dataset_cfg)
    datamodule_cfg = resolve_padding(datamodule_cfg, on_gpu=torch.cuda.is_available())
    accepted = set(inspect.signature(GraphDataModule).parameters) - {"source", "seed"}
    unknown = sorted(set(datamodule_cfg) - accepted)
    if unknown:
        raise ConfigError(
            f"datamodule settings {unknown} do not exist; the settings are {sorted(accepted)}"
        )
    return GraphDataModule(source, **datamodule_cfg, seed=seed)


def build_module(cfg: DictConfig, datamodule: GraphDataModule) -> GraphormerModule:
    model_cfg = _container(cfg.model)
    hops = model_cfg.get("multi_hop_max_dist", 5)
    if (
        model_cfg.get("edge_encoding", "multi_hop") == "multi_hop"
        and hops > cfg.datamodule.max_hops
    ):
        raise ConfigError(
            f"model.multi_hop_max_dist={hops} exceeds datamodule.max_hops="
            f"{cfg.datamodule.max_hops}: the cached edge paths would be too short; raise "
            "datamodule.max_hops"
        )
    _dataset_feature_dims(model_cfg, datamodule)
    data = {
        "dataset": absolute_paths(_container(cfg.dataset)),
        # As resolved for this run (pad_to_multiple: null becomes 8 or 1), so that eval.py and
        # a resume batch exactly as training did, whatever the device they run on.
        "datamodule": {**_container(cfg.datamodule), "pad_to_multiple": datamodule.pad_to_multiple},
    }
    try:
        return GraphormerModule(
            model=model_cfg,
            task=datamodule.task.to_dict(),
            **_container(cfg.optim),
            loss=cfg.loss,
            normalize_targets=cfg.normalize_targets,
            data=data,
            flag=_container(cfg.flag) if cfg.get("flag") else None,
        )
    except (ValueError, TypeError) as error:
        # The model's and the module's own checks name the key ("model.hidden_dim ...").
        raise ConfigError(str(error)) from error


def _dataset_feature_dims(model_cfg: dict[str, Any], datamodule: GraphDataModule) -> None:
    """Sizes the model's embedding tables by the dataset's own vocabularies (ZINC's atom and bond
    types), where the config leaves them null; the filled values are saved with the checkpoint's
    model settings, so eval.py and fine-tuning rebuild the same tables. Sources featurised like
    OGB (``feature_dims()`` is None) keep the model's default, OGB's featurisation."""
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


def absolute_paths(dataset_cfg: dict[str, Any]) -> dict[str, Any]:
    """The dataset settings with absolute paths, so that eval.py finds the data from any folder."""
    for key in ("root", "path"):
        value = dataset_cfg.get(key)
        if isinstance(value, str) and not value.startswith("rdkit:"):
            dataset_cfg[key] = os.path.abspath(os.path.expanduser(value))
    return dataset_cfg


def resolve_padding(datamodule_cfg: dict[str, Any], on_gpu: bool) -> dict[str, Any]:
    """The datamodule settings with ``pad_to_multiple: null`` resolved for the device: 8 on GPUs
    (tensor cores and the fused attention kernels want aligned lengths), 1 on the CPU, where
    padding is pure extra work (slim trains 4-8% faster unpadded)."""
    if datamodule_cfg.get("pad_to_multiple") is not None:
        return datamodule_cfg
    return {**datamodule_cfg, "pad_to_multiple": 8 if on_gpu else 1}


def uses_gpu(trainer_cfg: dict[str, Any]) -> bool:
    """Whether the trainer settings put training on a GPU."""
    accelerator = str(trainer_cfg.get("accelerator", "auto"))
    return accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())


def resolve_precision(trainer_cfg: dict[str, Any]) -> str:
    """The trainer's precision; ``auto`` is bf16-mixed on GPUs (16-mixed on those without
    bfloat16) and 32-true on the CPU."""
    precision = str(trainer_cfg.get("precision") or "32-true")
    if precision != "auto":
        return precision
    if not uses_gpu(trainer_cfg):
        return "32-true"
    return "bf16-mixed" if _native_bf16() else "16-mixed"


def _native_bf16() -> bool:
    """Whether the GPU computes bfloat16 natively (Ampere and later): torch's check also counts
    emulation, which is slow, on older GPUs."""
    if not torch.cuda.is_available():
        return True  # the accelerator is chosen elsewhere; bf16 is the GPU default
    try:
        return torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:  # older torch: no emulation to exclude
        return torch.cuda.is_bf16_supported()


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
    ):
        warnings.filterwarnings("ignore", message=pattern)


def train(cfg: DictConfig, callbacks: list[pl.Callback] | None = None) -> dict[str, Any]:
    """Trains a Graphormer as ``cfg`` says; returns what it writes to ``metrics.json``.

    Args:
        cfg (DictConfig): the composed ``configs/train.yaml``.
        callbacks (list[Callback] | None, optional): extra Lightning callbacks, for code that
            embeds training (the scripts pass none). (default: :obj:`None`)
    """
    quiet_third_parties()
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        # OmegaConf's get() would read a missing value (???) as None and carry on.
        raise ConfigError(
            f"{', '.join(missing)} must be given (this configuration has no default for "
            f"{'them' if len(missing) > 1 else 'it'}): pass "
            + " ".join(f"{key}=..." for key in missing)
        )
    if cfg.get("require_pretrained") and not cfg.get("pretrained"):
        raise ConfigError(
            "this configuration fine-tunes a pre-trained model: pass pretrained=FILE.ckpt (a "
            "pre-training run's checkpoint, or published weights converted with "
            "scripts/convert.py; see README 'Reproducing the paper')"
        )
    if cfg.get("ckpt_path"):
        load_checkpoint_file(cfg.ckpt_path)  # a missing, corrupt or altered file fails now
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    torch.set_float32_matmul_precision("high")
    output_dir = Path(cfg.output_dir)
    _check_writable(output_dir / "checkpoints")
    datamodule_cfg = resolve_padding(_container(cfg.datamodule), uses_gpu(_container(cfg.trainer)))
    datamodule = build_datamodule(_container(cfg.dataset), datamodule_cfg, cfg.seed)
    task = datamodule.task
    module = build_module(cfg, datamodule)
    if cfg.get("pretrained"):
        loaded = load_pretrained(module, cfg.pretrained, strict=cfg.get("pretrained_strict", True))
        if is_first_process():
            report(loaded.summary())

    checkpoint = RunCheckpoint(
        dirpath=output_dir / "checkpoints",
        filename="best-epoch{epoch:03d}",
        monitor=task.monitor,
        mode="max" if task.higher_is_better else "min",
        save_top_k=1,
        save_last=True,
        auto_insert_metric_name=False,
    )
    callbacks = [checkpoint, *(callbacks or [])]
    trainer_cfg = _container(cfg.trainer)
    precision = resolve_precision(trainer_cfg)
    progress_bar = trainer_cfg.get("enable_progress_bar")
    if progress_bar is None:  # a bar in a terminal, plain lines in a log file or a pipe
        progress_bar = is_terminal()
    if not progress_bar:
        callbacks.append(EpochSummary())
    loggers = []
    if cfg.get("logger"):
        loggers.append(hydra.utils.instantiate(cfg.logger))
        callbacks.append(pl.callbacks.LearningRateMonitor(logging_interval="step"))
    overrides = {}
    if module.flag.enabled and (trainer_cfg.get("accumulate_grad_batches") or 1) > 1:
        raise ConfigError(
            "flag.m > 0 (FLAG) takes its own gradient steps and cannot accumulate gradients over "
            "batches: set trainer.accumulate_grad_batches=1, or use a larger datamodule.batch_size"
        )
    if module.flag.enabled:
        # FLAG optimises manually (several backward passes per update), and Lightning refuses
        # its own clipping then: the module clips with the same value instead.
        module.gradient_clip_val = trainer_cfg.get("gradient_clip_val")
        module.gradient_clip_algorithm = trainer_cfg.get("gradient_clip_algorithm") or "norm"
        overrides["gradient_clip_val"] = None
        overrides["gradient_clip_algorithm"] = None
    trainer: pl.Trainer = hydra.utils.instantiate(
        cfg.trainer,
        **overrides,
        callbacks=callbacks,
        logger=loggers or False,
        default_root_dir=output_dir,
        precision=precision,
        enable_progress_bar=progress_bar,
        enable_model_summary=False,
    )
    if trainer.is_global_zero:
        report(
            f"model: {sum(p.numel() for p in module.parameters()):,} parameters; "
            f"precision: {trainer.precision}; devices: {trainer.world_size}"
        )
    trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"), weights_only=True)

    best = checkpoint.best_model_path
    if not best or not Path(best).is_file():
        raise ConfigError(
            "no checkpoint was selected because validation never ran: trainer.max_epochs="
            f"{trainer.max_epochs}, trainer.max_steps={trainer.max_steps}, "
            f"trainer.check_val_every_n_epoch={trainer.check_val_every_n_epoch}, "
            f"trainer.val_check_interval={trainer.val_check_interval}; let validation run at "
            "least once (with max_steps, set trainer.val_check_interval=N steps)"
        )
    metric = task.metric
    test = None  # PCQM4Mv2's test splits have no labels: the leaderboard scores them
    if datamodule.is_labelled("test"):
        scores = trainer.test(
            module, datamodule=datamodule, ckpt_path=best, verbose=False, weights_only=True
        )
        test = {metric: float(scores[0][f"test/{metric}"])}
    last = output_dir / "checkpoints" / "last.ckpt"
    results = {
        "dataset": task.name,
        "metric": metric,
        "valid": {metric: float(checkpoint.best_model_score)},
        "test": test,
        "best_checkpoint": str(Path(best).resolve()),
        "last_checkpoint": str(last.resolve()),
        "epochs": trainer.current_epoch,
        "precision": str(trainer.precision),
    }
    if trainer.is_global_zero:
        path = output_dir / "metrics.json"
        path.write_text(json.dumps(results, indent=2) + "\n")
        report(f"best checkpoint: {results['best_checkpoint']}")
        report(f"metrics: {path.resolve()}")
        test_text = f"{test[metric]:.4f}" if test else "none (no labelled test split)"
        report(f"valid {metric}: {results['valid'][metric]:.4f}  test {metric}: {test_text}")
        report(f"evaluate with: python scripts/eval.py ckpt={results['best_checkpoint']}")
    return results
