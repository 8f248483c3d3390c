"""``evaluate(checkpoint)``: rebuild model and data from a checkpoint alone and score it with
OGB's Evaluator (or the dataset's own metric)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch

from graphormer import checkpoint as checkpoints
from graphormer.checkpoint import CheckpointError
from graphormer.console import report
from graphormer.data.conformers import mean_over_repeats
from graphormer.data.tasks import ITEM_LEVELS, score, score_level, score_reported
from graphormer.devices import DEFAULT_PRECISION
from graphormer.errors import ConfigError
from graphormer.outputs import atomic_path
from graphormer.portable.calibration import CALIBRATION_FILE, Calibration
from graphormer.runner import ModelRunner, has_dropout, level_probabilities, probabilities
from graphormer.training.members import (
    Members,
    check_members,
    resolve_members,
    uncertainty_report,
)
from graphormer.training.module import GraphormerModule
from graphormer.training.precision import precision_arguments
from graphormer.training.run import (
    absolute_paths,
    build_datamodule,
    feature_mismatch,
    is_terminal,
    quiet_third_parties,
)
from graphormer.training.tasknames import level_task_names, read_task_names
from graphormer.uncertainty.calibration import calibration_of
from graphormer.uncertainty.intervals import interval_levels

__all__ = [
    "DataOverrides",
    "calibration_lines",
    "calibration_of",
    "evaluate",
    "format_table",
    "format_uncertainty",
    "has_dropout",
    "member_item_outputs",
    "member_outputs",
    "predict_split",
    "predict_split_items",
    "score_members",
]

# MC-dropout passes over the validation split when a single model with dropout is calibrated.
MC_CALIBRATION_PASSES = 10


def format_table(results: dict[str, Any], splits: list[str], metric: str | Sequence[str]) -> str:
    """A table of ``metric`` (one name, or every level's names) per split."""
    names = [metric] if isinstance(metric, str) else list(metric)
    widths = [max(10, len(name) + 2) for name in names]  # bond_rocauc is wider than 10
    rows = [f"{'split':<8}" + "".join(f"{n:>{w}}" for n, w in zip(names, widths, strict=True))]
    rows += [
        f"{split:<8}"
        + "".join(f"{results[split][n]:>{w}.4f}" for n, w in zip(names, widths, strict=True))
        for split in splits
    ]
    return "\n".join(rows)


def _chosen_splits(split: str, datamodule) -> list[str]:
    """The splits ``split=`` names: one split, or ``all`` the labelled evaluation splits."""
    available = list(datamodule.loaded.split)
    if split == "all":
        return [k for k in datamodule.loaded.evaluated if datamodule.is_labelled(k)]
    if split == "train" or split not in available:
        choices = [k for k in available if k != "train"]
        raise ConfigError(
            f"split={split!r} is not an evaluation split of {datamodule.task.name}; choose one of "
            f"{[*choices, 'all']}"
        )
    return [split]


def predict_split(
    trainer: pl.Trainer, module, datamodule, split: str, dropout: bool = False
) -> torch.Tensor:
    """Predictions ``[n, T]`` for every graph of ``split``, in the split's order; ``dropout``
    keeps the network's dropout on (one MC-dropout pass)."""
    # A plain loop in the trainer's device and precision (Lightning's predict loop would try to
    # rebuild our fixed list of batches as a sampler class).
    device = trainer.strategy.root_device
    module = module.to(device).eval()
    if dropout:
        module.model.train()
    indices, preds = [], []
    with torch.inference_mode(), trainer.precision_plugin.forward_context():
        for batch in datamodule.eval_dataloader(split):
            index, pred = module.predict_step(batch.to(device), 0)
            indices.append(index.cpu())
            preds.append(pred.float().cpu())
    # Ordered by dataset index, each graph once: the mean over its conformers (if several; of
    # probabilities for classification, as prediction's).
    index, pred, _ = mean_over_repeats(torch.cat(indices), torch.cat(preds), link=module.task.link)
    expected = datamodule.loaded.split[split]
    if not torch.equal(index, expected.sort().values):
        raise RuntimeError(f"{split} predictions cover {len(index)} graphs, not the split's")
    # Back to the split's own order (the order OGB's files list the molecules in).
    position = torch.searchsorted(index, expected)
    module.eval()
    return pred[position]


def member_outputs(
    modules: Sequence[Any],
    datamodule: Any,
    split: str,
    trainer: Any,
    mc_passes: int = 0,
    seed: int = 0,
) -> np.ndarray:
    """``[M, n, T]`` predictions of every member (probabilities for binary tasks) for ``split``,
    in its order; with ``mc_passes`` K, each member contributes K passes with dropout on."""
    runner = ModelRunner(modules, mc_passes, seed, device=trainer.strategy.root_device)

    def run(module: Any) -> np.ndarray:
        pred = predict_split(trainer, module, datamodule, split, dropout=mc_passes > 0)
        return probabilities(module.task, pred).numpy()

    return np.stack(list(runner.passes(run)))


def predict_split_items(
    trainer: pl.Trainer,
    module,
    datamodule,
    split: str,
    dropout: bool = False,
    scored: Any | None = None,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per item level of the module's task (``atom``, ``bond``): the predictions ``[n, T]``
    (probabilities for binary levels) and labels ``[n, T]`` (NaN: unlabelled) of every real
    item of ``split``, ordered by graph then by the item's position (RDKit's order), so that
    members' outputs line up; ``dropout`` as :func:`predict_split`; ``scored``: the task whose
    levels are read (default: the module's without auxiliary atom targets)."""
    device = trainer.strategy.root_device
    module = module.to(device).eval()
    if dropout:
        module.model.train()
    parts: dict[str, list] = {}
    levels = (scored if scored is not None else module.task.without_auxiliary()).item_levels
    with torch.inference_mode(), trainer.precision_plugin.forward_context():
        for batch in datamodule.eval_dataloader(split):
            batch = batch.to(device)
            outputs = module.forward_levels(batch)
            for level in levels:
                mask = getattr(batch, level.mask)  # [B, N]: real items only
                positions = torch.arange(mask.size(1), device=mask.device).expand_as(mask)
                graphs = batch.index.view(-1, 1).expand_as(mask)
                values = level_probabilities(module.task, level, outputs[level.name])[mask]
                labels = getattr(batch, level.label)[mask].float()
                found = (graphs[mask], positions[mask], values, labels)
                parts.setdefault(level.name, []).append([t.cpu() for t in found])
    module.eval()
    items = {}
    for name, found in parts.items():
        graphs, positions, values, labels = (torch.cat(t) for t in zip(*found, strict=True))
        # Ordered by graph, then item; each the mean over its graph's conformers (if several).
        key = graphs * (int(positions.max()) + 1 if len(positions) else 1) + positions
        _, values, labels = mean_over_repeats(key, values, labels)
        items[name] = (values.numpy(), labels.numpy())
    return items


def member_item_outputs(
    modules: Sequence[Any], datamodule: Any, split: str, trainer: Any, scored: Any | None = None
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per item level: every member's predictions ``[M, n, T]`` of ``split``'s items and their
    labels ``[n, T]`` (:func:`predict_split_items`); none for a task without item levels."""
    if not (scored if scored is not None else modules[0].task.without_auxiliary()).item_levels:
        return {}
    runner = ModelRunner(modules, device=trainer.strategy.root_device)

    def run(module: Any) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        return predict_split_items(trainer, module, datamodule, split, scored=scored)

    found = list(runner.passes(run))
    return {name: (np.stack([f[name][0] for f in found]), found[0][name][1]) for name in found[0]}


@dataclass(frozen=True)
class DataOverrides:
    """Where a checkpoint's data lives now and how to batch it for scoring; ``None`` keeps what
    the training run recorded.

    Attributes:
        root, path (str | None): the dataset's ``root`` / ``path``, if the data moved since
            training (the task must stay the same).
        batch_size, max_tokens, num_workers (int | None): the evaluation batching.
    """

    root: str | None = None
    path: str | None = None
    batch_size: int | None = None
    max_tokens: int | None = None
    num_workers: int | None = None

    def datamodule(self, checkpoint, module):
        """The data ``checkpoint`` (whose model is ``module``) was trained on, where it lives
        now, batched for evaluation."""
        stored = module.run_record
        if not stored.has_data:
            raise CheckpointError(
                f"checkpoint {checkpoint} records no dataset to evaluate on (a converted or "
                "hand-made checkpoint?): fine-tune it with train.py pretrained=... and evaluate "
                "that run"
            )
        dataset_cfg = dict(stored.dataset)
        moved = {k: str(v) for k, v in (("root", self.root), ("path", self.path)) if v}
        dataset_cfg.update(absolute_paths(moved))
        datamodule_cfg = dict(stored.datamodule)
        if self.batch_size:
            datamodule_cfg["eval_batch_size"] = self.batch_size
        if self.max_tokens is not None:
            datamodule_cfg["max_tokens"] = self.max_tokens
        if self.num_workers is not None:
            datamodule_cfg["num_workers"] = self.num_workers
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
        if not datamodule.task.same_task(module.task):
            raise CheckpointError(
                f"checkpoint {checkpoint} was trained for {module.task} but its dataset "
                f"settings now describe {datamodule.task}"
            )
        return datamodule


def _eval_trainer(accelerator: str, precision: str) -> pl.Trainer:
    return pl.Trainer(
        accelerator=accelerator,
        devices=1,
        **precision_arguments(precision),
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=is_terminal(),
        use_distributed_sampler=False,
    )


def _calibration_report(calibration: Calibration, names: list[str]) -> dict[str, Any]:
    """What a binary calibration did on the validation split: each task's ECE before and after,
    and the tasks it left uncalibrated because the fitted map made their ECE worse (said by
    :func:`calibration_lines`)."""
    before = dict(zip(names, calibration.ece_before, strict=True))
    after = dict(zip(names, calibration.ece_after, strict=True))
    kept = [names[t] for t in calibration.kept_uncalibrated or []]
    return {"ece_before": before, "ece_after": after, "kept_uncalibrated": kept}


def calibration_lines(entry: dict[str, Any] | None) -> list[str]:
    """The lines that say what calibration did (for the console and the run's log), from the
    ``calibration`` entry of :func:`score_members`' results; none for a regression run."""
    if not entry or entry.get("ece_before") is None:
        return []
    method, before, after = entry["method"], entry["ece_before"], entry["ece_after"]
    changes = ", ".join(f"{n} {before[n]:.4f} -> {after[n]:.4f}" for n in before)
    lines = [f"calibration={method}: validation ECE {changes}"]
    if entry.get("kept_uncalibrated"):
        lines.append(
            f"calibration={method} made the validation ECE of "
            f"{', '.join(entry['kept_uncalibrated'])} worse: those probabilities are kept "
            "uncalibrated"
        )
    return lines


def score_members(
    paths: list[Path],
    *,
    splits: list[str],
    accelerator: str = "auto",
    precision: str | None = None,
    data: DataOverrides = DataOverrides(),
    fit_calibration: str | None = None,
    calibration_dir: Path | None = None,
) -> dict[str, Any]:
    """Scores the mean prediction of the checkpoints ``paths`` (one, or an ensemble's members)
    on each labelled split of ``splits``, with how sure it was (:func:`uncertainty_report`);
    ``data`` says where the data lives now and how to batch it.

    With ``fit_calibration`` (``none``, ``temperature``, ``isotonic``: the binary method), the
    calibration is first fitted on the validation split and written to
    ``calibration_dir/calibration.json``; otherwise the one found there is used.
    """
    quiet_third_parties()
    records = [checkpoints.load(p) for p in paths]  # digests verified, member by member
    modules = [GraphormerModule.from_checkpoint(r) for r in records]
    check_members(records, modules)
    module = modules[0]
    results = module.task.without_auxiliary()  # auxiliary atom targets are never scored
    datamodule = data.datamodule(paths[0], module)
    precision = precision or records[0].precision or DEFAULT_PRECISION
    trainer = _eval_trainer(accelerator, precision)
    datamodule.prepare_data()
    datamodule.setup("validate")
    task = module.task
    names = read_task_names(module)
    metric = task.monitor.removeprefix("val/")  # an atom model's is its first atom metric
    found: dict[str, Any] = {"dataset": task.name, "metric": metric, "uncertainty": {}}
    ensemble = len(modules) > 1
    # Intervals per atom (bond) from the validation residuals of that level (regression).
    item_levels = interval_levels(results)
    molecules = task.num_tasks > 0 and not task.is_multiclass
    calibration = None
    if not task.num_tasks and fit_calibration not in (None, "none"):
        # Binary calibration is of molecule probabilities (issue #19).
        raise ConfigError(
            f"calibration={fit_calibration} calibrates molecule targets, and this model "
            "predicts atom or bond targets alone: set calibration=none"
        )
    if task.is_multiclass:
        pass  # class probabilities are not calibrated (issue #19 calibrates binary and regression)
    elif fit_calibration is not None and (molecules or item_levels):
        members = [
            {"checkpoint": str(Path(p).resolve()), "weights_sha256": r.meta.get("weights_sha256")}
            for p, r in zip(paths, records, strict=True)
        ]
        if molecules:
            outputs = member_outputs(modules, datamodule, "valid", trainer)
            y = datamodule.split_targets("valid").float().numpy()
            mc_std = None
            if not ensemble and not task.is_classification and has_dropout(module.config):
                mc = member_outputs(modules, datamodule, "valid", trainer, MC_CALIBRATION_PASSES)
                mc_std = mc.std(0)
            calibration = Calibration.fit(
                "binary classification" if task.is_classification else "regression",
                members,
                y,
                outputs.mean(0),
                outputs.std(0) if ensemble else None,
                method=fit_calibration,
                mc_std=mc_std,
                mc_passes=MC_CALIBRATION_PASSES if mc_std is not None else None,
            )
        else:  # atom (bond) targets alone: the file holds their levels' scores only
            calibration = Calibration("regression", members, residual=[])
        if item_levels:
            items = member_item_outputs(modules, datamodule, "valid", trainer)
            for level in item_levels:
                outputs, y = items[level.name]
                std = outputs.std(0) if ensemble else None
                calibration.fit_level(level.name, y, outputs.mean(0), std)
        file = calibration.save(Path(calibration_dir) / CALIBRATION_FILE)
        found["calibration"] = {"file": str(file.resolve()), "method": calibration.method}
        if calibration.ece_before is not None:
            found["calibration"].update(_calibration_report(calibration, names))
    elif fit_calibration is not None:
        found["calibration"] = None  # binary atom (bond) targets alone: nothing to calibrate
    else:
        calibration = calibration_of(calibration_dir, records)
    for split in splits:
        if not datamodule.is_labelled(split):
            continue
        found[split], found["uncertainty"][split] = score_split(
            modules, datamodule, split, trainer, calibration
        )
    return found


def score_split(
    modules: Sequence[Any],
    datamodule: Any,
    split: str,
    trainer: pl.Trainer,
    calibration: Calibration | None,
    scored: Any | None = None,
) -> tuple[dict[str, float], dict[str, Any]]:
    """The mean prediction of ``modules`` (one, or an ensemble's members) on labelled
    ``split``: every level's metrics (and ``num_graphs``), and how sure it was per level
    (:func:`uncertainty_report`; the members' spread for an ensemble). ``scored``: the task
    whose levels are scored (default: the module's without auxiliary atom targets)."""
    module, ensemble = modules[0], len(modules) > 1
    task = module.task
    levels = scored if scored is not None else task.without_auxiliary()
    spread = "ensemble" if ensemble else None
    metrics: dict[str, float] = {}
    report: dict[str, Any] = {}
    if task.num_tasks:
        outputs = member_outputs(modules, datamodule, split, trainer)
        y = datamodule.split_targets(split).float().numpy()
        mean = outputs.mean(0)
        std = outputs.std(0) if ensemble else None
        y_true, y_pred = torch.from_numpy(y), torch.from_numpy(mean)
        metrics[task.metric] = score(task, task.evaluator(), y_true, y_pred, split)
        # Reported metrics (accuracy) read logits: a probability's 0.5 is a logit's 0.
        logits = y_pred - 0.5 if task.is_classification else y_pred
        metrics.update(score_reported(task, y_true, logits))
        names = read_task_names(module)
        report = uncertainty_report(task, names, y, mean, std, calibration, spread)
    items = member_item_outputs(modules, datamodule, split, trainer, levels)
    for level in levels.item_levels:
        outputs, y = items[level.name]
        mean = outputs.mean(0)
        std = outputs.std(0) if ensemble else None
        y_true, y_pred = torch.from_numpy(y), torch.from_numpy(mean)
        metrics.update(score_level(levels, level, y_true, y_pred, split))
        # A vector's spread is reported per component, as its metrics are.
        y, mean, std = (None if a is None else _component_rows(level, a) for a in (y, mean, std))
        report[level.name] = uncertainty_report(
            level.as_task(levels),
            level_task_names(module, level),
            y,
            mean,
            std,
            calibration.level(level.name) if calibration is not None else None,
            spread,
        )
    metrics["num_graphs"] = datamodule.split_size(split)
    return metrics, report


def _component_rows(level: Any, values: np.ndarray) -> np.ndarray:
    """Items' ``[n, T]`` values (a vector's ``[n, T, 3]`` as ``[3 n, T]``, :meth:`Level.component_rows`)."""
    return level.component_rows(torch.from_numpy(values)).numpy()


def evaluate(
    checkpoint: str | Path | list,
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
    allow_missing: bool = False,
) -> dict[str, Any]:
    """Evaluates a checkpoint (or an ensemble) on ``split``; writes and returns the JSON of its
    scores.

    Args:
        checkpoint (str | Path | list): a checkpoint written by training (its settings rebuild
            the model and the data), a run folder (its best checkpoint), an ensemble's folder or
            a list of checkpoints (the members' mean prediction).
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
        allow_missing (bool, optional): score an ensemble with a missing member.
            (default: :obj:`False`)
    """
    quiet_third_parties()
    members = resolve_members(checkpoint, allow_missing)
    data = DataOverrides(dataset_root, dataset_path, batch_size, max_tokens, num_workers)
    if len(members.paths) > 1:
        return _evaluate_members(members, split, output, accelerator, precision, data)
    checkpoint = members.paths[0]
    record = checkpoints.load(checkpoint)
    module = GraphormerModule.from_checkpoint(record)
    datamodule = data.datamodule(checkpoint, module)

    # The training run's precision by default, so that the recorded numbers are reproduced.
    precision = precision or record.precision or DEFAULT_PRECISION
    trainer = _eval_trainer(accelerator, precision)
    report(f"checkpoint: {Path(checkpoint).resolve()}; precision: {trainer.precision}")
    metric = module.task.monitor.removeprefix("val/")
    levels = module.task.level_metrics  # every level's metrics (issue #18)
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
    calibration = calibration_of(members.folder, [record])
    scored = []
    for split in splits:
        if not datamodule.is_labelled(split):
            if not datamodule.source.writes_predictions(split):
                raise ConfigError(f"split={split} has no labels, so no {metric} can be computed")
            pred = predict_split(trainer, module, datamodule, split)
            path = datamodule.source.write_predictions(split, pred, output.parent)
            results[split] = {"submission": str(path.resolve()), "num_graphs": len(pred)}
            continue
        # The module's whole task: a model trained with auxiliary atom targets reports them.
        metrics, found = score_split(
            [module], datamodule, split, trainer, calibration, scored=module.task
        )
        # As training logged them (Lightning logs float32), so that eval reproduces its numbers.
        results[split] = {k: v if k == "num_graphs" else _logged(v) for k, v in metrics.items()}
        if any(found.values()) and (calibration is not None or module.task.is_classification):
            results.setdefault("uncertainty", {})[split] = found
        scored.append(split)

    with atomic_path(output) as partial:
        partial.write_text(json.dumps(results, indent=2) + "\n")
    if scored:
        report(format_table(results, scored, levels))
        report(format_uncertainty(results.get("uncertainty") or {}))
    report(f"results: {output.resolve()}")
    return results


def _logged(value: float) -> float:
    return float(np.float32(value))


def _evaluate_members(
    members: Members,
    split: str,
    output: str | Path | None,
    accelerator: str,
    precision: str | None,
    data: DataOverrides,
) -> dict[str, Any]:
    """:func:`evaluate` for several checkpoints: the mean prediction's scores."""
    report(
        f"ensemble of {len(members.paths)} member(s): "
        + ", ".join(str(Path(p).resolve()) for p in members.paths)
    )
    if split == "all":
        splits = ["valid", "test"]
    elif split in ("valid", "test"):
        splits = [split]
    else:
        raise ConfigError(f"split={split!r}: an ensemble is scored on valid, test or all")
    found = score_members(
        members.paths,
        splits=splits,
        accelerator=accelerator,
        precision=precision,
        data=data,
        calibration_dir=members.folder,
    )
    scored = [s for s in splits if s in found]
    results = {
        "checkpoints": [str(Path(p).resolve()) for p in members.paths],
        "ensemble_size": len(members.paths),
        "missing_members": members.missing,
        **found,
    }
    output = Path(output) if output else Path("eval_metrics.json")
    with atomic_path(output) as partial:
        partial.write_text(json.dumps(results, indent=2) + "\n")
    if scored:
        metrics = [m for m in _level_metric_names(results) if m in results[scored[0]]]
        report(format_table(results, scored, metrics))
        report(format_uncertainty(results.get("uncertainty") or {}))
    report(f"results: {output.resolve()}")
    return results


def _level_metric_names(results: dict[str, Any]) -> list[str]:
    """The metrics a scored split holds, the selecting one first."""
    split = next(s for s in ("valid", "test") if s in results)
    names = [k for k in results[split] if k != "num_graphs"]
    return [results["metric"], *(n for n in names if n != results["metric"])]


def format_uncertainty(uncertainty: dict[str, Any]) -> str:
    """The uncertainty report as lines: interval coverage and width, spread-error
    correlation, ECE before and after calibration (molecules, then each item level's)."""
    lines = []
    for split, found in uncertainty.items():
        lines += _uncertainty_lines(split, found)
        for level in ITEM_LEVELS:
            lines += _uncertainty_lines(f"{split} {level.noun}s", found.get(level.name) or {})
    return "\n".join(lines)


def _uncertainty_lines(split: str, found: dict[str, Any]) -> list[str]:
    lines = []
    for level, tasks in (found.get("intervals") or {}).items():
        for name, v in tasks.items():
            lines.append(
                f"{split} {name}: {float(level):.0%} intervals cover {v['coverage']:.1%}, "
                f"mean width {v['mean_width']:.4g}"
            )
    for name, rho in (found.get("std_error_spearman") or {}).items():
        lines.append(f"{split} {name}: Spearman(std, |error|) {rho:.3f}")
    for name, before in (found.get("ece_before") or {}).items():
        after = (found.get("ece_after") or {}).get(name)
        text = f", after {found['calibration']} {after:.4f}" if after is not None else ""
        lines.append(f"{split} {name}: ECE {before:.4f}{text}")
    return lines
