"""Node and edge input features of any graph: which columns are categorical (embedding tables)
and which continuous (a learned projection), their sizes, and the checks every source applies
(issue #17). One owner for these rules, so that every source and prediction agree."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from graphormer.errors import DataError

__all__ = [
    "CONTINUOUS_KEYS",
    "check_finite",
    "split_columns",
    "vocabulary_sizes",
]

# Where a graph keeps its float features, beside the categorical ``x`` / ``edge_attr``.
CONTINUOUS_KEYS = {"node": "x_continuous", "edge": "edge_attr_continuous"}


def check_finite(
    values: Tensor,
    graph_of_row: Tensor,
    what: str,
    where: str,
    columns: Sequence[int] | None = None,
) -> None:
    """Raises :class:`DataError` naming the first graph and column holding a NaN or infinite
    value: a silent NaN would only show up later as a NaN loss.

    Args:
        values (Tensor): ``[R, F]`` float features of all graphs (rows of nodes or edges).
        graph_of_row (Tensor): ``[R]`` the graph (its position in the input) of each row.
        what (str): ``"node"`` or ``"edge"``.
        where (str): the input, for the message (a file, a dataset name).
        columns (Sequence[int] | None, optional): the input's column of each column of
            ``values`` (default: their positions).
    """
    bad = ~torch.isfinite(values)
    if bad.any():
        row, position = (int(v) for v in bad.nonzero()[0])
        column = columns[position] if columns is not None else position
        count = int(bad.any(-1).sum())
        raise DataError(
            f"{where}: graph {int(graph_of_row[row])} has a {values[row, position].item()} in "
            f"{what} feature column {column} ({count} {what} row(s) in all hold NaN or infinite "
            "values); give finite numbers (fill or drop missing values before training)"
        )


def split_columns(
    values: Tensor,
    categorical: Sequence[int],
    graph_of_row: Tensor,
    what: str,
    where: str,
    key: str,
) -> tuple[Tensor, Tensor | None]:
    """Splits a graph's feature matrix into its categorical columns (``[R, k]`` long ids, for
    the embedding tables) and the rest (``[R, F - k]`` float, or None when no column is left).

    Args:
        values (Tensor): ``[R]`` or ``[R, F]`` features of all graphs.
        categorical (Sequence[int]): the categorical columns (non-negative integers each).
        graph_of_row (Tensor): ``[R]`` the graph of each row, for messages.
        what (str): ``"node"`` or ``"edge"``.
        where (str): the input, for messages.
        key (str): the setting that lists ``categorical``, for messages.

    Raises:
        DataError: a listed column outside ``values``, a categorical value that is not a
            non-negative integer, or a NaN or infinite continuous value.
    """
    if values.dim() == 1:
        values = values.unsqueeze(-1)
    width = values.size(-1)
    columns = [int(c) for c in categorical]
    outside = [c for c in columns if not 0 <= c < width]
    if outside:
        raise DataError(
            f"{key}={list(categorical)} names column(s) {outside} but the {what} features of "
            f"{where} have {width} column(s) (0..{width - 1})"
        )
    if len(set(columns)) != len(columns):
        raise DataError(f"{key}={list(categorical)} lists a column twice")
    rest = [c for c in range(width) if c not in columns]
    chosen = values[:, columns]
    if chosen.is_floating_point():
        check_finite(chosen.double(), graph_of_row, what, where, columns)
        not_integer = chosen != chosen.round()
    else:
        not_integer = torch.zeros_like(chosen, dtype=torch.bool)
    negative = chosen < 0
    bad = not_integer | negative
    if bad.any():
        row, position = (int(v) for v in bad.nonzero()[0])
        raise DataError(
            f"{where}: graph {int(graph_of_row[row])} has {chosen[row, position].item()} in "
            f"categorical {what} column {columns[position]} ({key}); categorical columns hold "
            "class ids 0, 1, 2, ...: list only such columns in "
            f"{key}, the others are read as continuous"
        )
    continuous = None
    if rest:
        continuous = values[:, rest].float()
        check_finite(continuous, graph_of_row, what, where, rest)
    return chosen.long(), continuous


def vocabulary_sizes(categorical: Tensor) -> list[int]:
    """Table rows each categorical column needs: its largest id + 1 (at least 1)."""
    if categorical.numel() == 0:
        return [1] * categorical.size(-1)
    return [int(v) + 1 for v in categorical.max(0).values.tolist()]
