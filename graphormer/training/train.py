"""``train(cfg)``: compose data, model and trainer from a Hydra config, fit, test, record."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import hydra
import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from omegaconf import DictConfig, OmegaConf

from graphormer.data.datamodule import GraphDataModule
from graphormer.training.checkpoint import load_checkpoint_file
from graphormer.training.module import GraphormerModule
from graphormer.training.pretrained import load_pretrained

__all__ = ["build_datamodule", "build_module", "train"]

log = logging.getLogger(__name__)


def _container(cfg: DictConfig) -> dict[str, Any]:
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def build_datamodule(dataset_cfg: dict[str, Any], datamodule_cfg: dict[str, Any], seed: int = 0):
    """The datamodule from plain dataset (with ``_target_``) and datamodule settings."""
    source = hydra.utils.instantiate(dataset_cfg)
    return GraphDataModule(source, **datamodule_cfg, seed=seed)


def build_module(cfg: DictConfig, datamodule: GraphDataModule) -> GraphormerModule:
    model_cfg = _container(cfg.model)
    hops = model_cfg.get("multi_hop_max_dist", 5)
    if (
        model_cfg.get("edge_encoding", "multi_hop") == "multi_hop"
        and hops > cfg.datamodule.max_hops
    ):
        raise ValueError(
            f"model.multi_hop_max_dist={hops} exceeds datamodule.max_hops="
            f"{cfg.datamodule.max_hops}: the cached edge paths would be too short; raise "
            "datamodule.max_hops"
        )
    data = {
        "dataset": _absolute_paths(_container(cfg.dataset)),
        "datamodule": _container(cfg.datamodule),
    }
    return GraphormerModule(
        model=model_cfg,
        task=datamodule.task.to_dict(),
        **_container(cfg.optim),
        loss=cfg.loss,
        normalize_targets=cfg.normalize_targets,
        data=data,
    )


def _absolute_paths(dataset_cfg: dict[str, Any]) -> dict[str, Any]:
    """The dataset settings with absolute paths, so that eval.py finds the data from any folder."""
    for key in ("root", "path"):
        value = dataset_cfg.get(key)
        if isinstance(value, str) and not value.startswith("rdkit:"):
            dataset_cfg[key] = os.path.abspath(os.path.expanduser(value))
    return dataset_cfg


def train(cfg: DictConfig) -> dict[str, Any]:
    """Trains a Graphormer as ``cfg`` says; returns what it writes to ``metrics.json``."""
    if cfg.get("ckpt_path"):
        load_checkpoint_file(cfg.ckpt_path)  # a missing or corrupt file fails now, clearly
    pl.seed_everything(cfg.seed, workers=True)
    torch.set_float32_matmul_precision("high")
    output_dir = Path(cfg.output_dir)
    datamodule = build_datamodule(_container(cfg.dataset), _container(cfg.datamodule), cfg.seed)
    task = datamodule.task
    module = build_module(cfg, datamodule)
    if cfg.get("pretrained"):
        load_pretrained(module, cfg.pretrained, strict=cfg.get("pretrained_strict", True))

    checkpoint = ModelCheckpoint(
        dirpath=output_dir / "checkpoints",
        filename="best-epoch{epoch:03d}",
        monitor=task.monitor,
        mode="max" if task.higher_is_better else "min",
        save_top_k=1,
        save_last=True,
        auto_insert_metric_name=False,
    )
    callbacks = [checkpoint]
    loggers = []
    if cfg.get("logger"):
        loggers.append(hydra.utils.instantiate(cfg.logger))
        callbacks.append(pl.callbacks.LearningRateMonitor(logging_interval="step"))
    trainer: pl.Trainer = hydra.utils.instantiate(
        cfg.trainer, callbacks=callbacks, logger=loggers or False, default_root_dir=output_dir
    )
    trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))

    best = checkpoint.best_model_path
    if not best:
        raise RuntimeError(
            "no checkpoint was selected: validation never ran (check trainer.max_epochs and "
            "trainer.check_val_every_n_epoch)"
        )
    test_metrics = trainer.test(module, datamodule=datamodule, ckpt_path=best, verbose=False)
    metric = task.metric
    results = {
        "dataset": task.name,
        "metric": metric,
        "valid": {metric: float(checkpoint.best_model_score)},
        "test": {metric: float(test_metrics[0][f"test/{metric}"])},
        "best_checkpoint": str(Path(best).resolve()),
        "last_checkpoint": str(Path(checkpoint.last_model_path).resolve()),
        "epochs": trainer.current_epoch,
        "precision": str(trainer.precision),
    }
    if trainer.is_global_zero:
        path = output_dir / "metrics.json"
        path.write_text(json.dumps(results, indent=2) + "\n")
        print(f"best checkpoint: {results['best_checkpoint']}")
        print(f"metrics: {path.resolve()}")
        print(
            f"valid {metric}: {results['valid'][metric]:.4f}  test {metric}: "
            f"{results['test'][metric]:.4f}"
        )
        print(f"evaluate with: python scripts/eval.py ckpt={results['best_checkpoint']}")
    return results
