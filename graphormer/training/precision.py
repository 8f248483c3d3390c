"""The trainer's precision, for training and evaluation alike: Lightning's, except that true
half precision leaves a batch's labels in float32."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.plugins.precision import HalfPrecision

from graphormer.batch import GraphormerBatch
from graphormer.devices import check_precision_package

__all__ = ["LabelKeepingHalfPrecision", "precision_arguments"]


class LabelKeepingHalfPrecision(HalfPrecision):
    """Lightning's ``bf16-true`` / ``16-true`` precision, except that a batch's labels (``y``,
    ``y_atom``, ``y_bond``) stay as collated: Lightning's own converts every floating tensor of
    the batch to the half dtype, so a label of 72.3079 became 72.5 before the loss and the
    metrics. Inputs (molecule features, continuous edge features) are converted as before."""

    NAMES = ("bf16-true", "16-true")
    _LABELS = ("y", "y_atom", "y_bond")

    def convert_input(self, data: Any) -> Any:
        if not isinstance(data, GraphormerBatch):
            return super().convert_input(data)
        labels = {name: getattr(data, name) for name in self._LABELS}
        converted = super().convert_input(data)
        for name, value in labels.items():
            setattr(converted, name, value)
        return converted


def precision_arguments(precision: str) -> dict[str, Any]:
    """``pl.Trainer`` keyword arguments for ``precision`` (a Lightning precision name):
    ``plugins=[LabelKeepingHalfPrecision]`` for ``bf16-true`` / ``16-true``, else
    ``precision=``."""
    check_precision_package(precision)
    if precision in LabelKeepingHalfPrecision.NAMES:
        return {"plugins": [LabelKeepingHalfPrecision(precision)]}
    return {"precision": precision}
