"""``evaluate(cfg)``: rebuild model and data from a checkpoint alone and score it with OGB."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from omegaconf import DictConfig

from graphormer.console import report
from graphormer.errors import ConfigError
from graphormer.training.checkpoint import CheckpointError, load_module
from graphormer.training.train import _absolute_paths, _quiet_third_parties, build_datamodule

__all__ = ["evaluate", "format_table"]

_SPLITS = {"valid": ["valid"], "test": ["test"], "all": ["valid", "test"]}


def format_table(results: dict[str, Any], splits: list[str], metric: str) -> str:
    rows = [f"{'split':<8}{metric:>10}"]
    rows += [f"{split:<8}{results[split][metric]:>10.4f}" for split in splits]
    return "\n".join(rows)


def evaluate(cfg: DictConfig) -> dict[str, Any]:
    """Evaluates ``cfg.ckpt`` on ``cfg.split`` (valid, test or all); writes and returns the JSON."""
    _quiet_third_parties()
    if cfg.split not in _SPLITS:
        raise ConfigError(f"split must be one of {list(_SPLITS)}, got {cfg.split!r}")
    module, checkpoint = load_module(cfg.ckpt)
    data = module.hparams["data"] or {}
    if not isinstance(data.get("dataset"), dict) or not isinstance(data.get("datamodule"), dict):
        raise CheckpointError(
            f"checkpoint {cfg.ckpt} records no dataset to evaluate on (a converted or hand-made "
            "checkpoint?): fine-tune it with train.py pretrained=... and evaluate that run"
        )
    dataset_cfg = dict(data["dataset"])
    # Where the data lives now, if it moved since training (the task must stay the same).
    moved = {key: str(cfg.dataset[key]) for key in ("root", "path") if cfg.dataset.get(key)}
    dataset_cfg.update(_absolute_paths(moved))
    datamodule_cfg = dict(data["datamodule"])
    if cfg.get("batch_size"):
        datamodule_cfg["eval_batch_size"] = cfg.batch_size
    if cfg.get("num_workers") is not None:
        datamodule_cfg["num_workers"] = cfg.num_workers
    try:
        datamodule = build_datamodule(dataset_cfg, datamodule_cfg)
    except ConfigError as error:
        # Settings read from a checkpoint: it names something graphormer does not build.
        raise CheckpointError(
            f"checkpoint {cfg.ckpt} has unusable data settings: {error}"
        ) from error
    if datamodule.task != module.task:
        raise CheckpointError(
            f"checkpoint {cfg.ckpt} was trained for {module.task} but its dataset settings now "
            f"describe {datamodule.task}"
        )

    # The training run's precision by default, so that the recorded numbers are reproduced.
    precision = cfg.get("precision") or checkpoint.get("graphormer", {}).get("precision") or "32"
    trainer = pl.Trainer(
        accelerator=cfg.accelerator,
        devices=1,
        precision=precision,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=sys.stdout.isatty(),
        use_distributed_sampler=False,
    )
    report(f"checkpoint: {Path(cfg.ckpt).resolve()}; precision: {trainer.precision}")
    metric = module.task.metric
    splits = _SPLITS[cfg.split]
    results: dict[str, Any] = {
        "checkpoint": str(Path(cfg.ckpt).resolve()),
        "dataset": module.task.name,
        "metric": metric,
        "precision": str(trainer.precision),
    }
    for split in splits:
        if split == "valid":
            scores = trainer.validate(module, datamodule=datamodule, verbose=False)[0]
            results[split] = {metric: float(scores[f"val/{metric}"])}
        else:
            scores = trainer.test(module, datamodule=datamodule, verbose=False)[0]
            results[split] = {metric: float(scores[f"test/{metric}"])}
        results[split]["num_graphs"] = datamodule.split_size(split)

    output = Path(cfg.output) if cfg.get("output") else Path(cfg.output_dir) / "eval_metrics.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2) + "\n")
    report(format_table(results, splits, metric))
    report(f"results: {output.resolve()}")
    return results
