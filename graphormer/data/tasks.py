"""What a dataset asks the model to predict, and how OGB scores it."""

from __future__ import annotations

import os
import warnings
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

import pandas as pd
import torch
from ogb.graphproppred import Evaluator

from graphormer.errors import DataError

__all__ = ["MAEEvaluator", "TaskEvaluator", "TaskInfo", "ogb_master_table", "score"]

# Metrics whose larger value is better; OGB's rmse (and anything else) is minimised.
_MAXIMISED = {"rocauc", "ap", "acc", "F1"}


@dataclass(frozen=True)
class TaskInfo:
    """A graph-level prediction task.

    Attributes:
        name: dataset name (OGB's, e.g. ``ogbg-molhiv``, or a user's label).
        task_type: OGB's wording: ``"binary classification"`` or ``"regression"``.
        num_tasks: number of targets per graph.
        metric: OGB's evaluation metric name (``rocauc``, ``ap``, ``rmse``).
    """

    name: str
    task_type: str
    num_tasks: int
    metric: str

    def __post_init__(self) -> None:
        if self.task_type not in ("binary classification", "regression"):
            raise ValueError(
                f"unsupported task type {self.task_type!r} of {self.name}: graphormer trains "
                "'binary classification' and 'regression' graph-property tasks"
            )

    @property
    def is_classification(self) -> bool:
        return self.task_type == "binary classification"

    @property
    def higher_is_better(self) -> bool:
        return self.metric in _MAXIMISED

    @property
    def monitor(self) -> str:
        """The logged key that selects the best checkpoint: ``val/<metric>``."""
        return f"val/{self.metric}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def evaluator(self) -> Evaluator:
        """OGB's own ``Evaluator`` for OGB datasets, the same code set up for this task otherwise."""
        if self.metric == "mae":
            return MAEEvaluator(self)
        if self.name in ogb_master_table():
            evaluator = Evaluator(self.name)
            if (evaluator.num_tasks, evaluator.eval_metric) == (self.num_tasks, self.metric):
                return evaluator
        return TaskEvaluator(self)


# Metrics that need both classes among a task's labels (OGB skips a task that lacks one).
_NEED_BOTH_CLASSES = {"rocauc", "ap"}


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
    if task.is_classification and task.metric in _NEED_BOTH_CLASSES:
        true = y_true.view(len(y_true), -1)
        positives = (true == 1).sum(0)
        negatives = (true == 0).sum(0)
        one_class = [t for t in range(true.shape[1]) if not (positives[t] and negatives[t])]
        if one_class:

            def described(t: int) -> str:
                which = "positive" if not positives[t] else "negative"
                return f"task {t} (no {which} label)"

            names = ", ".join(described(t) for t in one_class[:5])
            more = f" and {len(one_class) - 5} more" if len(one_class) > 5 else ""
            if len(one_class) == true.shape[1]:
                raise DataError(
                    f"{task.metric} of {task.name} cannot be computed on the {split} split: "
                    f"its labels hold one class only for {names}{more}. Give the {split} split "
                    "molecules of both classes (another dataset.split or dataset.split_seed, or "
                    "a larger share in dataset.split_ratios)"
                )
            warnings.warn(
                f"{task.metric} on the {split} split of {task.name} leaves out {names}{more}: "
                f"the score is the mean over the other {true.shape[1] - len(one_class)} task(s)",
                stacklevel=2,
            )
    return float(evaluator.eval({"y_true": y_true, "y_pred": y_pred})[task.metric])


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


@lru_cache(maxsize=1)
def ogb_master_table() -> pd.DataFrame:
    """OGB's own dataset metadata table (``ogb/graphproppred/master.csv``)."""
    import ogb.graphproppred

    path = os.path.join(os.path.dirname(ogb.graphproppred.__file__), "master.csv")
    return pd.read_csv(path, index_col=0, keep_default_na=False)
