"""``evaluate(cfg)``: rebuild model and data from a checkpoint alone and score it with OGB."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from omegaconf import DictConfig

from graphormer.console import report
from graphormer.errors import ConfigError
from graphormer.training.checkpoint import CheckpointError, load_module
from graphormer.training.train import (
    absolute_paths,
    build_datamodule,
    is_terminal,
    quiet_third_parties,
)

__all__ = ["evaluate", "format_table"]


def format_table(results: dict[str, Any], splits: list[str], metric: str) -> str:
    rows = [f"{'split':<8}{metric:>10}"]
    rows += [f"{split:<8}{results[split][metric]:>10.4f}" for split in splits]
    return "\n".join(rows)


def _chosen_splits(split: str, datamodule) -> list[str]:
    """The splits ``split=`` names: one split, or ``all`` the labelled evaluation splits."""
    available = list(datamodule.loaded.split)
    if split == "all":
        return [k for k in ("valid", "test") if datamodule.is_labelled(k)]
    if split == "train" or split not in available:
        choices = [k for k in available if k != "train"]
        raise ConfigError(
            f"split={split!r} is not an evaluation split of {datamodule.task.name}; choose one of "
            f"{[*choices, 'all']}"
        )
    return [split]


def predict_split(trainer: pl.Trainer, module, datamodule, split: str) -> torch.Tensor:
    """Predictions ``[n, T]`` for every graph of ``split``, in the split's order."""
    # A plain loop in the trainer's device and precision (Lightning's predict loop would try to
    # rebuild our fixed list of batches as a sampler class).
    device = trainer.strategy.root_device
    module = module.to(device).eval()
    indices, preds = [], []
    with torch.inference_mode(), trainer.precision_plugin.forward_context():
        for batch in datamodule.eval_dataloader(split):
            index, pred = module.predict_step(batch.to(device), 0)
            indices.append(index.cpu())
            preds.append(pred.float().cpu())
    index, pred = torch.cat(indices), torch.cat(preds)
    order = torch.argsort(index)
    index, pred = index[order], pred[order]
    expected = datamodule.loaded.split[split]
    if not torch.equal(index, expected.sort().values):
        raise RuntimeError(f"{split} predictions cover {len(index)} graphs, not the split's")
    # Back to the split's own order (the order OGB's files list the molecules in).
    position = torch.searchsorted(index, expected)
    return pred[position]


def evaluate(cfg: DictConfig) -> dict[str, Any]:
    """Evaluates ``cfg.ckpt`` on ``cfg.split`` (valid, test or all; PCQM4Mv2's unlabelled
    test-dev and test-challenge get a submission file); writes and returns the JSON."""
    quiet_third_parties()
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
    dataset_cfg.update(absolute_paths(moved))
    datamodule_cfg = dict(data["datamodule"])
    if cfg.get("batch_size"):
        datamodule_cfg["eval_batch_size"] = cfg.batch_size
    if cfg.get("max_tokens") is not None:
        datamodule_cfg["max_tokens"] = cfg.max_tokens
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
        enable_progress_bar=is_terminal(),
        use_distributed_sampler=False,
    )
    report(f"checkpoint: {Path(cfg.ckpt).resolve()}; precision: {trainer.precision}")
    metric = module.task.metric
    datamodule.prepare_data()
    datamodule.setup("validate")
    splits = _chosen_splits(str(cfg.split), datamodule)
    results: dict[str, Any] = {
        "checkpoint": str(Path(cfg.ckpt).resolve()),
        "dataset": module.task.name,
        "metric": metric,
        "precision": str(trainer.precision),
    }
    output = Path(cfg.output) if cfg.get("output") else Path(cfg.output_dir) / "eval_metrics.json"
    scored = []
    for split in splits:
        if not datamodule.is_labelled(split):
            if not datamodule.source.writes_predictions(split):
                raise ConfigError(f"split={split} has no labels, so no {metric} can be computed")
            pred = predict_split(trainer, module, datamodule, split)
            path = datamodule.source.write_predictions(split, pred, output.parent)
            results[split] = {"submission": str(path.resolve()), "num_graphs": len(pred)}
            continue
        if split == "valid":
            scores = trainer.validate(module, datamodule=datamodule, verbose=False)[0]
            results[split] = {metric: float(scores[f"val/{metric}"])}
        else:
            scores = trainer.test(module, datamodule=datamodule, verbose=False)[0]
            results[split] = {metric: float(scores[f"test/{metric}"])}
        results[split]["num_graphs"] = datamodule.split_size(split)
        scored.append(split)

    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(results, indent=2) + "\n")
    if scored:
        report(format_table(results, scored, metric))
    report(f"results: {output.resolve()}")
    return results
