"""The molecule columns of a prediction table, decided once for the Predictor's table and the
ONNX predictor's (which runs without torch): one per task, or per class of a multi-class task
with the predicted class beside them; ``<name>_std`` and ``<name>_lower`` / ``_upper``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["molecule_columns", "value_names"]


def value_names(task_names: Sequence[str], num_classes: int | None = None) -> list[str]:
    """The value columns: the task names, or ``<task>_prob_<k>`` for a multi-class task of
    ``num_classes`` classes."""
    if num_classes:
        return [f"{task_names[0]}_prob_{k}" for k in range(num_classes)]
    return list(task_names)


def molecule_columns(
    task_names: Sequence[str],
    values: np.ndarray,
    std: np.ndarray | None = None,
    lower: np.ndarray | None = None,
    upper: np.ndarray | None = None,
    num_classes: int | None = None,
) -> dict[str, Any]:
    """The columns of predictions ``values`` ``[n, T]`` (``[n, C]``): one per task named after
    it; for a multi-class task ``<task>_prob_<k>`` and ``<task>``, the predicted class (empty
    where there is no prediction); then each value's ``_std`` (a spread) and ``_lower`` /
    ``_upper`` (intervals) when given."""
    import pandas as pd

    names = value_names(task_names, num_classes)
    columns: dict[str, Any] = {name: values[:, j] for j, name in enumerate(names)}
    if num_classes:
        predicted = pd.array([pd.NA] * len(values), dtype="Int64")
        valid = ~np.isnan(values).any(-1)
        predicted[valid] = values[valid].argmax(-1)
        columns[task_names[0]] = predicted
    for j, name in enumerate(names):
        if std is not None:
            columns[f"{name}_std"] = std[:, j]
        if lower is not None and upper is not None:
            columns[f"{name}_lower"] = lower[:, j]
            columns[f"{name}_upper"] = upper[:, j]
    return columns
