"""``evaluate(checkpoint)``: rebuild model and data from a checkpoint alone and score it with
OGB's Evaluator (or the dataset's own metric)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from graphormer import checkpoint as checkpoints
from graphormer.checkpoint import CheckpointError
from graphormer.console import report
from graphormer.devices import DEFAULT_PRECISION
from graphormer.errors import ConfigError
from graphormer.outputs import atomic_path
from graphormer.training.module import GraphormerModule
from graphormer.training.run import (
    absolute_paths,
    build_datamodule,
    feature_mismatch,
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


def evaluate(
    checkpoint: str | Path,
    *,
    split: str = "test",
    output: str | Path | None = None,
    dataset_root: str | None = None,
    dataset_path: str | None = None,
    accelerator: str = "auto",
    precision: str | None = None,
    batch_size: int | None = None,
    max_tokens: int | None = None,
    num_workers: int | None = None,
) -> dict[str, Any]:
    """Evaluates a checkpoint on ``split``; writes and returns the JSON of its scores.

    Args:
        checkpoint (str | Path): a checkpoint written by training (its settings rebuild the
            model and the data).
        split (str, optional): ``valid``, ``test`` or ``all`` (the labelled evaluation splits);
            a split without labels gets the dataset's prediction file. (default: :obj:`"test"`)
        output (str | Path | None, optional): the JSON file. (default: :obj:`eval_metrics.json`
            in the current folder)
        dataset_root, dataset_path (str | None, optional): where the data lives now, if it
            moved since training (the task must stay the same).
        accelerator (str, optional): Lightning's accelerator. (default: :obj:`"auto"`)
        precision (str | None, optional): None is the training run's precision, so that the
            recorded numbers are reproduced.
        batch_size, max_tokens, num_workers (int | None, optional): None keeps the training
            run's evaluation batching.
    """
    quiet_third_parties()
    record = checkpoints.load(checkpoint)
    module = GraphormerModule.from_checkpoint(record)
    data = module.hparams["data"] or {}
    if not isinstance(data.get("dataset"), dict) or not isinstance(data.get("datamodule"), dict):
        raise CheckpointError(
            f"checkpoint {checkpoint} records no dataset to evaluate on (a converted or hand-made "
            "checkpoint?): fine-tune it with train.py pretrained=... and evaluate that run"
        )
    dataset_cfg = dict(data["dataset"])
    # Where the data lives now, if it moved since training (the task must stay the same).
    moved = {k: str(v) for k, v in (("root", dataset_root), ("path", dataset_path)) if v}
    dataset_cfg.update(absolute_paths(moved))
    datamodule_cfg = dict(data["datamodule"])
    if batch_size:
        datamodule_cfg["eval_batch_size"] = batch_size
    if max_tokens is not None:
        datamodule_cfg["max_tokens"] = max_tokens
    if num_workers is not None:
        datamodule_cfg["num_workers"] = num_workers
    try:
        datamodule = build_datamodule(dataset_cfg, datamodule_cfg)
    except ConfigError as error:
        # Settings read from a checkpoint: it names something graphormer does not build.
        raise CheckpointError(
            f"checkpoint {checkpoint} has unusable data settings: {error}"
        ) from error
    mismatch = feature_mismatch(module.config, datamodule.source)
    if mismatch:
        raise CheckpointError(
            f"the dataset of checkpoint {checkpoint} no longer fits its model: {mismatch}"
        )
    if datamodule.task != module.task:
        raise CheckpointError(
            f"checkpoint {checkpoint} was trained for {module.task} but its dataset settings now "
            f"describe {datamodule.task}"
        )

    # The training run's precision by default, so that the recorded numbers are reproduced.
    precision = precision or record.precision or DEFAULT_PRECISION
    trainer = pl.Trainer(
        accelerator=accelerator,
        devices=1,
        precision=precision,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=is_terminal(),
        use_distributed_sampler=False,
    )
    report(f"checkpoint: {Path(checkpoint).resolve()}; precision: {trainer.precision}")
    metric = module.task.metric
    datamodule.prepare_data()
    datamodule.setup("validate")
    splits = _chosen_splits(str(split), datamodule)
    results: dict[str, Any] = {
        "checkpoint": str(Path(checkpoint).resolve()),
        "dataset": module.task.name,
        "metric": metric,
        "precision": str(trainer.precision),
    }
    output = Path(output) if output else Path("eval_metrics.json")
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

    with atomic_path(output) as partial:
        partial.write_text(json.dumps(results, indent=2) + "\n")
    if scored:
        report(format_table(results, scored, metric))
    report(f"results: {output.resolve()}")
    return results
