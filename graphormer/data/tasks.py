"""What a dataset asks the model to predict, and how OGB scores it."""

from __future__ import annotations

import os
import warnings
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from typing import Any

import pandas as pd
import torch
from ogb.graphproppred import Evaluator

from graphormer.errors import ConfigError, DataError

__all__ = [
    "ATOM",
    "ATOM_METRICS",
    "ATOM_VECTOR",
    "BOND",
    "BOND_METRICS",
    "ITEM_LEVELS",
    "Level",
    "TASK_TYPES",
    "USER_METRICS",
    "USER_TASK_TYPES",
    "MAEEvaluator",
    "MacroF1Evaluator",
    "TaskEvaluator",
    "TaskInfo",
    "check_class_labels",
    "check_scorable",
    "ogb_master_table",
    "score",
    "score_atoms",
    "score_bonds",
    "score_level",
    "score_reported",
    "user_task",
    "warn_absent_classes",
    "with_accuracy",
]

# Metrics whose larger value is better; OGB's rmse (and anything else) is minimised.
_MAXIMISED = {"rocauc", "ap", "acc", "F1", "f1"}
# OGB's wording (``master.csv``'s "task type").
TASK_TYPES = ("binary classification", "multiclass classification", "regression")
# A user's ``dataset.task_type`` (smiles_csv, pyg_file) and the metrics each allows (first: default).
USER_TASK_TYPES = {
    "binary": "binary classification",
    "multiclass": "multiclass classification",
    "regression": "regression",
}
USER_METRICS = {
    "binary": ("rocauc", "ap"),
    "multiclass": ("acc", "f1"),
    "regression": ("rmse", "mae"),
}
# Metrics a task may report beside its own (``TaskInfo.reported``), per task type.
REPORTED_METRICS = {"binary classification": ("acc",), "regression": ("ewt",)}
# OC20's energy within threshold (EwT): the share of predictions within this of the label, in
# the target's units (eV).
EWT_THRESHOLD = 0.02
# Atom-level metrics per ``dataset.atom_task_type`` (issue #18), over every labelled atom.
ATOM_METRICS = {"regression": ("mae", "rmse"), "binary": ("rocauc",)}
# Bond-level metrics per ``dataset.bond_task_type``, over every labelled bond: the atoms' rule.
BOND_METRICS = ATOM_METRICS
# Per-atom vector metrics (forces): over every component of every labelled atom.
VECTOR_METRICS = {"regression": ("mae", "rmse")}


@dataclass(frozen=True)
class Level:
    """A level of items a model predicts targets of beside (or instead of) the molecule's:
    its atoms or its bonds. The one place that says how a level is named, labelled, masked,
    standardised, trained and scored; code handling atoms and bonds iterates
    :data:`ITEM_LEVELS` rather than repeating a block per level.

    Attributes:
        name: ``atom`` or ``bond``: the model's output key, the ``loss_weights`` key, the
            prefix of its metrics (``atom_mae``), of its :class:`TaskInfo` fields
            (``atom_tasks``, ``atom_task_type``) and of its default target names (``atom_0``).
        label: the batch field of its labels (``[B, N, T]``, NaN = unlabelled or padding).
        mask: the batch field marking its real items (``[B, N]``), never padding.
        metrics: its metrics per task type (first: the one that selects checkpoints).
        noun: what one item is called in messages and tables.
        components: values per target and item: 1, or 3 for a 3-vector (forces), whose
            labels are ``[B, N, T, 3]`` and which is scaled, never shifted (see
            :meth:`statistics`).
    """

    name: str
    label: str
    mask: str
    metrics: dict[str, tuple[str, ...]] = field(hash=False, compare=False)
    noun: str = ""
    components: int = 1

    @property
    def mean(self) -> str:
        """The module buffer holding its targets' training mean (standardisation)."""
        return f"{self.name}_mean"

    @property
    def std(self) -> str:
        """The module buffer holding its targets' training standard deviation."""
        return f"{self.name}_std"

    def buffer_shape(self, task: TaskInfo) -> tuple[int, ...]:
        """Shape of its standardisation buffers: ``[T]``, or ``[T, 1]`` for vectors (one scale
        per target, shared by its components, so that it broadcasts over ``[..., T, 3]``)."""
        return (self.tasks(task),) if self.components == 1 else (self.tasks(task), 1)

    def item_shape(self, task: TaskInfo) -> tuple[int, ...]:
        """Shape of one item's values: ``[T]``, or ``[T, 3]`` for vectors."""
        return (self.tasks(task),) if self.components == 1 else (self.tasks(task), 3)

    def statistics(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Its standardisation (mean, std) from the training items' labels ``rows`` (``[n, T]``,
        vectors ``[n, T, 3]``; NaN = unlabelled). Scalars: mean and standard deviation. Vectors:
        no shift and the root mean square of their norms as the scale, since a shift would
        break rotation equivariance (a rotated molecule's forces rotate; a constant would not)."""
        if self.components == 1:
            mean = torch.nanmean(rows, dim=0)
            std = torch.nanmean((rows - mean) ** 2, dim=0).sqrt()
            return torch.nan_to_num(mean, nan=0.0), torch.nan_to_num(std, nan=1.0).clamp(min=1e-6)
        rms = torch.nanmean((rows**2).sum(-1), dim=0).sqrt()  # [T]
        rms = torch.where(rms > 1e-6, rms, torch.ones_like(rms))  # NaN (unlabelled) or all zero
        return torch.zeros_like(rms)[:, None], rms[:, None]

    def component_rows(self, values: torch.Tensor) -> torch.Tensor:
        """Items' values ``[n, T]`` as rows of scalars per target: a vector's ``[n, T, 3]``
        becomes ``[3 n, T]``, so that its metrics are per component."""
        if self.components == 1:
            return values
        return values.transpose(1, 2).reshape(-1, values.size(1))

    def tasks(self, task: TaskInfo) -> int:
        """Targets per item of ``task`` at this level (0: none)."""
        return getattr(task, f"{self.name}_tasks")

    def task_type(self, task: TaskInfo) -> str | None:
        """``regression`` or ``binary`` (user wording); None without targets."""
        return getattr(task, f"{self.name}_task_type")

    def link(self, task: TaskInfo) -> str | None:
        """``sigmoid`` for binary targets (the outputs are logits), None for regression."""
        return "sigmoid" if self.task_type(task) == "binary" else None

    def loss(self, task: TaskInfo) -> str:
        """Its training loss: BCE for binary targets, MSE on standardised values otherwise."""
        return "bce" if self.task_type(task) == "binary" else "mse"

    def metric_names(self, task: TaskInfo) -> tuple[str, ...]:
        """Logged names of its metrics (``atom_mae``, ``bond_rocauc``, ...); empty without
        targets at this level."""
        if not self.tasks(task):
            return ()
        return tuple(f"{self.name}_{m}" for m in self.metrics[self.task_type(task)])

    def as_task(self, task: TaskInfo) -> TaskInfo:
        """``task``'s targets at this level as a task of their own, each item one example
        (what an ensemble's spread and intervals of atoms or bonds are reported as)."""
        task_type = self.task_type(task)
        metric = self.metrics[task_type][0]
        return TaskInfo(
            f"{task.name} ({self.noun}s)", USER_TASK_TYPES[task_type], self.tasks(task), metric
        )

    def check_task_type(self, task_type: str | None, error: type[Exception], key: str) -> None:
        """Raises ``error`` naming ``key`` when ``task_type`` is not one of this level's."""
        if task_type not in self.metrics:
            raise error(f"{key} must be one of {' | '.join(self.metrics)}, got {task_type!r}")


ATOM = Level("atom", "y_atom", "atom_mask", ATOM_METRICS, "atom")
BOND = Level("bond", "y_bond", "bond_mask", BOND_METRICS, "bond")
# Per-atom 3-vectors (forces, position changes) of Graphormer-3D's vector head.
ATOM_VECTOR = Level(
    "atom_vector", "y_atom_vector", "atom_mask", VECTOR_METRICS, "atom vector", components=3
)
# The item levels, in the order their outputs, metrics and columns come (after molecules).
ITEM_LEVELS = (ATOM, BOND, ATOM_VECTOR)


@dataclass(frozen=True)
class TaskInfo:
    """A graph-level prediction task.

    Attributes:
        name: dataset name (OGB's, e.g. ``ogbg-molhiv``, or a user's label).
        task_type: OGB's wording: ``"binary classification"``, ``"multiclass classification"``
            (one class id in ``0..num_classes-1`` per graph) or ``"regression"``.
        num_tasks: number of targets per graph (1 for multi-class).
        metric: OGB's evaluation metric name (``rocauc``, ``ap``, ``rmse``, ``acc``), ``mae``,
            or ``f1`` (macro-averaged F1 of a multi-class task).
        num_classes: classes of a multi-class task (None otherwise).
        atom_tasks: targets per atom (issue #18; 0: none). ``num_tasks`` may then be 0, a task
            of atoms alone.
        atom_task_type: ``"regression"`` or ``"binary"`` (user wording), with ``atom_tasks``.
        bond_tasks: targets per bond (issue #18; 0: none), as ``atom_tasks``.
        bond_task_type: ``"regression"`` or ``"binary"``, with ``bond_tasks``.
        reported: metrics scored and logged beside ``metric`` (never replacing it): ``acc`` of
            a binary task (threshold 0.5), which TU datasets are compared by (issue #17).
        atom_auxiliary: the atom targets are auxiliary (issue #22): trained beside the molecule
            targets and logged (``val/atom_mae``), never a result: checkpoints are selected by
            the molecule metric, and predictions, ensembles and calibration are of molecules.
        atom_vector_tasks: 3-vectors per atom (forces; 0: none), as ``atom_tasks``.
        atom_vector_task_type: ``"regression"``, with ``atom_vector_tasks``.
    """

    name: str
    task_type: str
    num_tasks: int
    metric: str
    num_classes: int | None = None
    atom_tasks: int = 0
    atom_task_type: str | None = None
    bond_tasks: int = 0
    bond_task_type: str | None = None
    reported: tuple[str, ...] = ()
    atom_auxiliary: bool = False
    atom_vector_tasks: int = 0
    atom_vector_task_type: str | None = None

    def __post_init__(self) -> None:
        # A checkpoint stores a list; the task stays hashable and immutable.
        object.__setattr__(self, "reported", tuple(self.reported))
        unknown = [m for m in self.reported if m not in REPORTED_METRICS.get(self.task_type, ())]
        if unknown or self.metric in self.reported:
            raise ValueError(
                f"reported metrics {list(self.reported)} of {self.name} ({self.task_type}, "
                f"metric {self.metric}): allowed {list(REPORTED_METRICS.get(self.task_type, ()))}"
                ", the metric itself excluded"
            )
        if self.task_type not in TASK_TYPES:
            raise ValueError(
                f"unsupported task type {self.task_type!r} of {self.name}: graphormer trains "
                f"{', '.join(repr(t) for t in TASK_TYPES)} graph-property tasks"
            )
        if self.task_type == "multiclass classification":
            classes = self.num_classes
            if isinstance(classes, bool) or not isinstance(classes, int) or classes < 2:
                raise ValueError(
                    f"a multi-class task needs num_classes >= 2; {self.name} has {classes!r}"
                )
            if self.num_tasks != 1:
                raise ValueError(
                    f"a multi-class task has one label per graph; {self.name} has "
                    f"{self.num_tasks} tasks"
                )
        elif self.num_classes is not None:
            raise ValueError(
                f"num_classes is for multi-class tasks; {self.name} is {self.task_type}"
            )
        for level in ITEM_LEVELS:
            key = f"{level.name}_task_type"
            if level.tasks(self):
                level.check_task_type(level.task_type(self), ValueError, key)
            elif level.task_type(self) is not None:
                raise ValueError(f"{key} is for {level.noun} targets; {self.name} has none")
        if self.num_tasks == 0 and not self.item_levels:
            raise ValueError(f"{self.name} has no target: name molecule, atom or bond targets")
        if self.atom_auxiliary and not (self.atom_tasks and self.num_tasks):
            raise ValueError(
                f"auxiliary atom targets serve molecule targets; {self.name} has "
                f"{self.num_tasks} molecule and {self.atom_tasks} atom target(s)"
            )

    def with_auxiliary_atoms(self, atom_tasks: int) -> TaskInfo:
        """This task with ``atom_tasks`` auxiliary regression targets per atom (issue #22),
        trained beside its molecule targets; :meth:`without_auxiliary` undoes it."""
        return replace(
            self, atom_tasks=atom_tasks, atom_task_type="regression", atom_auxiliary=True
        )

    def without_auxiliary(self) -> TaskInfo:
        """The task its results are of: auxiliary atom targets (trained, never predicted)
        left out."""
        if not self.atom_auxiliary:
            return self
        return replace(self, atom_tasks=0, atom_task_type=None, atom_auxiliary=False)

    @property
    def is_classification(self) -> bool:
        """Binary classification (one sigmoid output per task)."""
        return self.task_type == "binary classification"

    @property
    def is_multiclass(self) -> bool:
        """Multi-class classification (one softmax over ``num_classes`` outputs)."""
        return self.task_type == "multiclass classification"

    @property
    def link(self) -> str | None:
        """What turns its molecule outputs (logits) into probabilities: ``sigmoid``,
        ``softmax``; None for regression (the outputs are values)."""
        return "sigmoid" if self.is_classification else "softmax" if self.is_multiclass else None

    @property
    def num_outputs(self) -> int:
        """Outputs of the network: one logit per class, or one value per task."""
        return self.num_classes if self.is_multiclass else self.num_tasks

    @property
    def atom_metrics(self) -> tuple[str, ...]:
        """Logged names of the atom-level metrics (the first selects checkpoints when there is
        no molecule target): ``atom_mae``, ``atom_rmse`` or ``atom_rocauc``; empty without
        atom targets."""
        return ATOM.metric_names(self)

    @property
    def bond_metrics(self) -> tuple[str, ...]:
        """Logged names of the bond-level metrics: ``bond_mae``, ``bond_rmse`` or
        ``bond_rocauc``; empty without bond targets."""
        return BOND.metric_names(self)

    @property
    def item_levels(self) -> tuple[Level, ...]:
        """The item levels (atoms, bonds) this task has targets at."""
        return tuple(level for level in ITEM_LEVELS if level.tasks(self))

    @property
    def level_metrics(self) -> tuple[str, ...]:
        """Every metric logged per evaluation split, molecule level first, then atoms, then
        bonds (``val/<name>``)."""
        molecule = (self.metric, *self.reported) if self.num_tasks else ()
        return molecule + tuple(m for level in ITEM_LEVELS for m in level.metric_names(self))

    def same_task(self, other: TaskInfo) -> bool:
        """Whether ``other`` is the same task, metrics reported beside the main one aside: a
        checkpoint saved before a task reported accuracy (issue #17) still evaluates, and
        ensembles with members saved after it."""
        return replace(self, reported=()) == replace(other, reported=())

    @property
    def higher_is_better(self) -> bool:
        return self.metric_higher_is_better(self.monitor.removeprefix("val/"))

    @staticmethod
    def metric_higher_is_better(name: str) -> bool:
        """Whether a logged metric name (``rocauc``, ``atom_mae``, ...) is maximised."""
        for level in sorted(ITEM_LEVELS, key=lambda level: -len(level.name)):
            name = name.removeprefix(f"{level.name}_")
        return name in _MAXIMISED

    @property
    def monitor(self) -> str:
        """The logged key that selects the best checkpoint by default: ``val/<metric>`` of the
        first level present (molecules, then atoms, then bonds)."""
        return f"val/{self.level_metrics[0]}"

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        if values["num_classes"] is None:  # as checkpoints before multi-class tasks stored it
            del values["num_classes"]
        for level in ITEM_LEVELS:  # as checkpoints before atom (bond) targets stored it
            if not values[f"{level.name}_tasks"]:
                del values[f"{level.name}_tasks"], values[f"{level.name}_task_type"]
        if values["reported"]:
            values["reported"] = list(values["reported"])
        else:  # as checkpoints before reported metrics stored it
            del values["reported"]
        if not values["atom_auxiliary"]:  # as checkpoints before auxiliary atom targets
            del values["atom_auxiliary"]
        return values

    def evaluator(self) -> Evaluator:
        """OGB's own ``Evaluator`` for OGB datasets, the same code set up for this task otherwise."""
        if self.metric == "mae":
            return MAEEvaluator(self)
        if self.metric == "f1":
            return MacroF1Evaluator(self)
        if self.name in ogb_master_table():
            evaluator = Evaluator(self.name)
            if (evaluator.num_tasks, evaluator.eval_metric) == (self.num_tasks, self.metric):
                return evaluator
        return TaskEvaluator(self)


# Metrics that need both classes among a task's labels (OGB skips a task that lacks one).
_NEED_BOTH_CLASSES = {"rocauc", "ap"}


def check_scorable(task: TaskInfo, y_true: torch.Tensor, split: str) -> tuple[str, int]:
    """Whether ``task.metric`` can score the labels ``y_true`` ``[n, T]`` of ``split``: a
    ranking metric (ROC-AUC, AP) needs both classes of a task. Raises :class:`DataError` when no
    task has both (the data module asks before training, so that this is not found after the
    first epoch); returns the tasks that are left out (empty: none) and how many are left in."""
    if not (task.is_classification and task.metric in _NEED_BOTH_CLASSES):
        return "", task.num_tasks
    true = y_true.float().cpu().view(len(y_true), -1)
    positives = (true == 1).sum(0)
    negatives = (true == 0).sum(0)
    one_class = [t for t in range(true.shape[1]) if not (positives[t] and negatives[t])]
    if not one_class:
        return "", true.shape[1]

    def described(t: int) -> str:
        which = "positive" if not positives[t] else "negative"
        return f"task {t} (no {which} label)"

    names = ", ".join(described(t) for t in one_class[:5])
    names += f" and {len(one_class) - 5} more" if len(one_class) > 5 else ""
    if len(one_class) == true.shape[1]:
        raise DataError(
            f"{task.metric} of {task.name} cannot be computed on the {split} split: "
            f"its labels hold one class only for {names}. Give the {split} split "
            "molecules of both classes (another dataset.split or dataset.split_seed, or "
            "a larger share in dataset.split_ratios)"
        )
    return names, true.shape[1] - len(one_class)


def score(
    task: TaskInfo, evaluator: Any, y_true: torch.Tensor, y_pred: torch.Tensor, split: str
) -> float:
    """``task.metric`` of ``y_pred`` against ``y_true`` ``[n, T]`` by ``evaluator`` (OGB's), in
    float32 whatever the precision of the predictions (OGB's numpy code has no bfloat16).

    A ranking metric (ROC-AUC, AP) cannot score a task whose labels in ``split`` are of one class
    only: such tasks are left out with a warning naming them, and when no task is left a
    :class:`DataError` names the split and the tasks.
    """
    y_true, y_pred = y_true.float().cpu(), y_pred.float().cpu()
    if task.is_multiclass and y_pred.size(-1) == task.num_classes:
        # Logits [n, C] -> the predicted class id [n, 1], what OGB's `acc` compares.
        y_pred = y_pred.argmax(-1, keepdim=True).float()
    one_class, scored = check_scorable(task, y_true, split)
    if one_class:
        warnings.warn(
            f"{task.metric} on the {split} split of {task.name} leaves out {one_class}: "
            f"the score is the mean over the other {scored} task(s)",
            stacklevel=2,
        )
    return float(evaluator.eval({"y_true": y_true, "y_pred": y_pred})[task.metric])


def score_level(
    task: TaskInfo, level: Level, y_true: torch.Tensor, y_pred: torch.Tensor, split: str
) -> dict[str, float]:
    """``level``'s metrics (:meth:`Level.metric_names`) of predictions ``[n_items, T]`` against
    labels (NaN = unlabelled), every item of the split counted once, by the same evaluators as
    molecule targets (OGB's); a vector's ``[n_items, T, 3]`` per component."""
    return _score_level(
        task,
        level.name,
        level.tasks(task),
        level.task_type(task),
        level.metric_names(task),
        level.component_rows(y_true),
        level.component_rows(y_pred),
        split,
    )


def score_atoms(
    task: TaskInfo, y_true: torch.Tensor, y_pred: torch.Tensor, split: str
) -> dict[str, float]:
    """The atom-level metrics (:attr:`TaskInfo.atom_metrics`) of ``y_pred`` (:func:`score_level`)."""
    return score_level(task, ATOM, y_true, y_pred, split)


def score_bonds(
    task: TaskInfo, y_true: torch.Tensor, y_pred: torch.Tensor, split: str
) -> dict[str, float]:
    """The bond-level metrics (:attr:`TaskInfo.bond_metrics`) of ``y_pred`` (:func:`score_level`)."""
    return score_level(task, BOND, y_true, y_pred, split)


def _score_level(
    task: TaskInfo,
    level: str,
    tasks: int,
    task_type: str,
    names: tuple[str, ...],
    y_true: torch.Tensor,
    y_pred: torch.Tensor,
    split: str,
) -> dict[str, float]:
    found = {}
    for name in names:
        metric = name.removeprefix(f"{level}_")
        items = TaskInfo(f"{task.name} ({level}s)", USER_TASK_TYPES[task_type], tasks, metric)
        found[name] = score(items, items.evaluator(), y_true, y_pred, split)
    return found


def score_reported(task: TaskInfo, y_true: torch.Tensor, y_pred: torch.Tensor) -> dict[str, float]:
    """The :attr:`TaskInfo.reported` metrics of outputs ``y_pred`` (logits for classification)
    against labels ``y_true`` ``[n, T]`` (NaN = unlabelled), over all tasks; NaN when nothing is
    labelled. ``acc``: the share of labelled entries whose logit is on the label's side of 0
    (probability 0.5). ``ewt``: OC20's energy within threshold, the share of labelled entries
    predicted within :data:`EWT_THRESHOLD` of the label."""
    if not task.reported:
        return {}
    y_true = y_true.float().cpu()
    y_pred = y_pred.float().cpu().view(y_true.shape)
    labelled = ~torch.isnan(y_true)
    out = {}
    for name in task.reported:
        if name == "acc":
            right = (y_pred[labelled] > 0).float() == y_true[labelled]
        else:
            right = (y_pred[labelled] - y_true[labelled]).abs() < EWT_THRESHOLD
        out[name] = float(right.double().mean()) if labelled.any() else float("nan")
    return out


def with_accuracy(task: TaskInfo) -> TaskInfo:
    """``task``, reporting accuracy beside its metric when it is a binary one (TU datasets and
    a user's graphs, whose results are compared by accuracy; issue #17)."""
    if task.is_classification and task.metric != "acc":
        return replace(task, reported=("acc",))
    return task


class TaskEvaluator(Evaluator):
    """OGB's graph-property ``Evaluator``, set up from a :class:`TaskInfo` rather than OGB's table,
    so that a user's own data is scored by exactly the same code as OGB's datasets."""

    def __init__(self, task: TaskInfo) -> None:
        self.name = task.name
        self.num_tasks = task.num_tasks
        self.eval_metric = task.metric


class MAEEvaluator:
    """Mean absolute error, computed by OGB-LSC's own ``PCQM4Mv2Evaluator`` (PCQM4Mv2's metric;
    ZINC's too). Missing labels (NaN) are skipped; several tasks are averaged."""

    def __init__(self, task: TaskInfo) -> None:
        from ogb.lsc import PCQM4Mv2Evaluator

        self.name = task.name
        self.num_tasks = task.num_tasks
        self.eval_metric = "mae"
        self._lsc = PCQM4Mv2Evaluator()

    def eval(self, input_dict: dict[str, Any]) -> dict[str, float]:
        y_true = torch.as_tensor(input_dict["y_true"]).float().view(-1, self.num_tasks)
        y_pred = torch.as_tensor(input_dict["y_pred"]).float().view(-1, self.num_tasks)
        scores = []
        for t in range(self.num_tasks):
            labelled = ~torch.isnan(y_true[:, t])
            if labelled.any():
                pair = {"y_pred": y_pred[labelled, t], "y_true": y_true[labelled, t]}
                scores.append(self._lsc.eval(pair)["mae"])
        if not scores:
            raise RuntimeError("no labelled target to compute MAE over")
        return {"mae": sum(scores) / len(scores)}


class MacroF1Evaluator:
    """Macro-averaged F1 of a multi-class task (``dataset.metric=f1``): the mean over the classes
    present in the labels or the predictions of ``2 TP / (2 TP + FP + FN)``. Takes class ids
    ``[n, 1]`` as OGB's ``acc`` does; unlabelled graphs (NaN) are skipped."""

    def __init__(self, task: TaskInfo) -> None:
        self.name = task.name
        self.num_tasks = 1
        self.eval_metric = "f1"
        self.num_classes = task.num_classes

    def eval(self, input_dict: dict[str, Any]) -> dict[str, float]:
        y_true = torch.as_tensor(input_dict["y_true"]).float().view(-1)
        y_pred = torch.as_tensor(input_dict["y_pred"]).float().view(-1)
        labelled = ~torch.isnan(y_true)
        true, pred = y_true[labelled].long(), y_pred[labelled].long()
        if not len(true):
            raise RuntimeError("no labelled graph to compute F1 over")
        classes = torch.unique(torch.cat([true, pred]))
        scores = []
        for c in classes.tolist():
            tp = int(((pred == c) & (true == c)).sum())
            wrong = int(((pred == c) != (true == c)).sum())  # false positives + false negatives
            scores.append(2 * tp / (2 * tp + wrong))
        return {"f1": sum(scores) / len(scores)}


def user_task(
    name: str,
    task_type: str,
    metric: str | None,
    num_tasks: int,
    num_classes: int | None = None,
    metrics: dict[str, tuple[str, ...]] = USER_METRICS,
    atom_tasks: int = 0,
    atom_task_type: str = "regression",
    bond_tasks: int = 0,
    bond_task_type: str = "regression",
    atom_auxiliary: bool = False,
    atom_vector_tasks: int = 0,
) -> TaskInfo:
    """The task a user's ``dataset.task_type`` and ``dataset.metric`` describe (one rule for
    every source of a user's own data).

    Raises:
        ConfigError: an unknown task type, or a metric that does not fit it.
    """
    if task_type not in metrics:
        raise ConfigError(
            f"dataset.task_type must be one of {' | '.join(metrics)}, got {task_type!r}"
        )
    metric = metric or metrics[task_type][0]
    if metric not in metrics[task_type]:
        raise ConfigError(
            f"dataset.metric={metric!r} does not fit dataset.task_type={task_type!r}; choose one "
            f"of {list(metrics[task_type])}"
        )
    classes = num_classes if task_type == "multiclass" else None
    given = {ATOM: (atom_tasks, atom_task_type), BOND: (bond_tasks, bond_task_type)}
    for level, (count, kind) in given.items():
        if count:
            level.check_task_type(kind, ConfigError, f"dataset.{level.name}_task_type")
    atom_type = atom_task_type if atom_tasks else None
    bond_type = bond_task_type if bond_tasks else None
    return TaskInfo(
        name,
        USER_TASK_TYPES[task_type],
        num_tasks,
        metric,
        classes,
        atom_tasks,
        atom_type,
        bond_tasks,
        bond_type,
        atom_auxiliary=atom_auxiliary,
        atom_vector_tasks=atom_vector_tasks,
        atom_vector_task_type="regression" if atom_vector_tasks else None,
    )


def check_class_labels(
    y: torch.Tensor,
    num_classes: int | None,
    where: str,
    rows: torch.Tensor | None = None,
    noun: str = "graph(s)",
) -> int:
    """The number of classes of multi-class labels ``y`` (one per graph, NaN = unlabelled):
    ``num_classes`` if given, else the largest label + 1.

    Raises:
        DataError: a label that is not an integer, or outside ``0..num_classes-1``, naming
            the graphs (their positions, or ``rows``: what the input calls them, as ``noun``).
    """
    y = y.reshape(len(y), -1).double()
    if y.size(-1) != 1:
        raise DataError(
            f"{where}: a multi-class task has one label per graph, but graphs hold {y.size(-1)}"
        )
    y = y[:, 0]
    labelled = ~torch.isnan(y)
    values = y[labelled]
    if not len(values):
        raise DataError(f"{where}: no graph has a label")
    bad = (values != values.round()) | (values < 0) | torch.isinf(values)
    if num_classes is not None:
        bad |= values >= num_classes
    if bad.any():
        graphs = labelled.nonzero().view(-1)[bad]
        if rows is not None:
            graphs = rows.view(-1)[graphs]
        shown = sorted({float(v) for v in values[bad].tolist()})[:5]
        allowed = f"0..{num_classes - 1}" if num_classes is not None else "0, 1, 2, ..."
        raise DataError(
            f"{where}: {noun} {graphs[:5].tolist()}{' and more' if len(graphs) > 5 else ''} "
            f"have labels {shown}; a multi-class label is a class id in {allowed} "
            "(dataset.num_classes sets how many classes there are)"
        )
    classes = int(values.max()) + 1 if num_classes is None else int(num_classes)
    if classes < 2:
        raise DataError(f"{where}: every label is 0; a multi-class task needs two classes or more")
    return classes


def warn_absent_classes(y_train: torch.Tensor, num_classes: int, name: str) -> None:
    """Warns, naming them, of classes no training graph has: the model cannot learn them."""
    present = set(y_train[~torch.isnan(y_train)].long().view(-1).tolist())
    absent = [c for c in range(num_classes) if c not in present]
    if absent:
        shown = ", ".join(map(str, absent[:10])) + (" ..." if len(absent) > 10 else "")
        warnings.warn(
            f"{name}: class(es) {shown} of {num_classes} have no training graph, so the model "
            "cannot learn to predict them",
            stacklevel=2,
        )


@lru_cache(maxsize=1)
def ogb_master_table() -> pd.DataFrame:
    """OGB's own dataset metadata table (``ogb/graphproppred/master.csv``)."""
    import ogb.graphproppred

    path = os.path.join(os.path.dirname(ogb.graphproppred.__file__), "master.csv")
    return pd.read_csv(path, index_col=0, keep_default_na=False)
