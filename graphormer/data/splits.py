"""Train/valid/test splits of a user's molecules: scaffold (group), and seeded random."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence

import torch
from rdkit.Chem.Scaffolds import MurckoScaffold

from graphormer.errors import ConfigError

__all__ = [
    "SPLIT_NAMES",
    "column_split",
    "file_split",
    "file_split_setting",
    "group_split",
    "random_split",
    "scaffold_split",
    "stratified_split",
]


def _check_ratios(ratios: Sequence[float]) -> tuple[float, float, float]:
    if len(ratios) != 3 or min(ratios) < 0 or abs(sum(ratios) - 1.0) > 1e-6:
        raise ConfigError(
            f"dataset.split_ratios must be three non-negative fractions summing to 1, got "
            f"{list(ratios)}"
        )
    return float(ratios[0]), float(ratios[1]), float(ratios[2])


def scaffold_split(
    smiles: Sequence[str], ratios: Sequence[float] = (0.8, 0.1, 0.1)
) -> dict[str, torch.Tensor]:
    """Bemis-Murcko scaffold split, as OGB made its molecule splits: whole scaffold groups, the
    largest first, fill train, then valid, then test; deterministic."""
    scaffolds = [
        MurckoScaffold.MurckoScaffoldSmiles(smiles=s, includeChirality=True) for s in smiles
    ]
    return group_split(scaffolds, ratios)


def group_split(
    groups_of: Sequence[str], ratios: Sequence[float] = (0.8, 0.1, 0.1)
) -> dict[str, torch.Tensor]:
    """Splits items by group key (a scaffold): whole groups, the largest first, fill train, then
    valid, then test; deterministic."""
    train_ratio, valid_ratio, _ = _check_ratios(ratios)
    groups: dict[str, list[int]] = defaultdict(list)
    for i, key in enumerate(groups_of):
        groups[key].append(i)
    ordered = sorted(groups.values(), key=lambda g: (-len(g), g[0]))
    n = len(groups_of)
    train_cut, valid_cut = train_ratio * n, (train_ratio + valid_ratio) * n
    split: dict[str, list[int]] = {"train": [], "valid": [], "test": []}
    for group in ordered:
        if len(split["train"]) + len(group) <= train_cut:
            split["train"] += group
        elif len(split["train"]) + len(split["valid"]) + len(group) <= valid_cut:
            split["valid"] += group
        else:
            split["test"] += group
    return {k: torch.tensor(sorted(v), dtype=torch.long) for k, v in split.items()}


def random_split(
    num_graphs: int, ratios: Sequence[float] = (0.8, 0.1, 0.1), seed: int = 0
) -> dict[str, torch.Tensor]:
    """A seeded random split."""
    train_ratio, valid_ratio, _ = _check_ratios(ratios)
    order = torch.randperm(num_graphs, generator=torch.Generator().manual_seed(seed))
    a, b = int(train_ratio * num_graphs), int((train_ratio + valid_ratio) * num_graphs)
    return {
        "train": order[:a].sort().values,
        "valid": order[a:b].sort().values,
        "test": order[b:].sort().values,
    }


def stratified_split(
    labels: Sequence[int] | torch.Tensor, ratios: Sequence[float] = (0.8, 0.1, 0.1), seed: int = 0
) -> dict[str, torch.Tensor]:
    """A seeded random split within each class, so that every split holds the classes in about
    the same shares (TU datasets have no official split)."""
    train_ratio, valid_ratio, _ = _check_ratios(ratios)
    labels = torch.as_tensor(labels).long().view(-1)
    generator = torch.Generator().manual_seed(seed)
    split: dict[str, list[torch.Tensor]] = {"train": [], "valid": [], "test": []}
    for c in torch.unique(labels).tolist():
        members = (labels == c).nonzero().view(-1)
        members = members[torch.randperm(len(members), generator=generator)]
        a = int(train_ratio * len(members))
        b = int((train_ratio + valid_ratio) * len(members))
        split["train"].append(members[:a])
        split["valid"].append(members[a:b])
        split["test"].append(members[b:])
    return {k: torch.cat(v).sort().values for k, v in split.items()}


SPLIT_NAMES = ("train", "valid", "test")
_SHOWN = 5


def _shown(rows: Sequence[int]) -> str:
    more = f" and {len(rows) - _SHOWN} more" if len(rows) > _SHOWN else ""
    return ", ".join(str(int(r)) for r in rows[:_SHOWN]) + more


def _rows_to_graphs(
    rows_of: dict[str, list[int]], graph_rows: Sequence[int], what: str, items: str = "molecules"
) -> dict[str, torch.Tensor]:
    """Graph indices of each split from the input rows it lists. Rows without a graph (SMILES
    rdkit could not parse, already reported) are left out with a warning; rows that no split
    lists are reported too, and an empty split is an error naming ``what`` (the setting)."""
    import warnings

    graph_of = {int(r): g for g, r in enumerate(graph_rows)}
    split: dict[str, torch.Tensor] = {}
    unusable = []
    for name in SPLIT_NAMES:
        rows = rows_of.get(name, [])
        unusable += [r for r in rows if r not in graph_of]
        split[name] = torch.tensor(
            sorted(graph_of[r] for r in rows if r in graph_of), dtype=torch.long
        )
    empty = [name for name in SPLIT_NAMES if len(split[name]) == 0]
    if empty:
        raise ConfigError(
            f"{what} leaves the {' and '.join(empty)} split(s) empty: training needs {items} "
            "in train, valid and test; list some in each"
        )
    if unusable:
        warnings.warn(
            f"{what}: {len(unusable)} listed row(s) have no molecule (rows {_shown(sorted(unusable))}; "
            "their SMILES could not be parsed, see the warning above) and are left out",
            stacklevel=3,
        )
    listed = {r for rows in rows_of.values() for r in rows}
    unlisted = sorted(set(graph_of) - listed)
    if unlisted:
        warnings.warn(
            f"{what}: {len(unlisted)} {items} are in no split "
            f"({'rows' if items == 'molecules' else items} {_shown(unlisted)}) and are not used",
            stacklevel=3,
        )
    return split


def column_split(
    labels: Sequence[object], graph_rows: Sequence[int], column: str
) -> dict[str, torch.Tensor]:
    """The split a column of the input names, row by row: ``train``, ``valid`` or ``test``
    (surrounding blanks ignored). Any other value (an empty cell too) is an error naming the
    rows.

    Args:
        labels (Sequence): the column's value of every input row.
        graph_rows (Sequence[int]): the input row of each graph, in graph order.
        column (str): the column's name, for messages.
    """
    rows_of: dict[str, list[int]] = {name: [] for name in SPLIT_NAMES}
    bad: dict[str, list[int]] = defaultdict(list)
    for row, value in enumerate(labels):
        text = "" if value is None or value != value else str(value).strip()  # NaN: empty cell
        if text in rows_of:
            rows_of[text].append(row)
        else:
            bad[text].append(row)
    if bad:
        value, rows = next(iter(bad.items()))
        others = f" (and {len(bad) - 1} other value(s))" if len(bad) > 1 else ""
        raise ConfigError(
            f"dataset.split_column={column!r} holds {value!r} at rows {_shown(rows)} (0-based, "
            f"header excluded){others}: each row's split must be train, valid or test"
        )
    return _rows_to_graphs(rows_of, graph_rows, f"dataset.split_column={column!r}")


def file_split_setting(split: str, split_file: str | None, default: str) -> str:
    """``dataset.split`` once ``dataset.split_file`` is considered: a file given alone (the
    split left at its ``default``) implies ``file``; a file and another split is an error."""
    if split_file is not None and split in (default, "file"):
        return "file"
    if split_file is not None:
        raise ConfigError(
            f"dataset.split_file={split_file} and dataset.split={split} both choose the split: "
            "give one (split_file alone implies dataset.split=file)"
        )
    if split == "file":
        raise ConfigError("dataset.split=file needs dataset.split_file=FILE.json")
    return split


def file_split(
    path: str, num_rows: int, graph_rows: Sequence[int], unit: str = "row"
) -> dict[str, torch.Tensor]:
    """The split a JSON file lists: ``{"train": [rows], "valid": [rows], "test": [rows]}``,
    rows 0-based in the input file (header excluded). A row out of range, a row in two splits,
    a missing or empty split, another key, or anything but integers is an error naming the file.

    Args:
        path (str): the JSON file (``dataset.split_file``).
        num_rows (int): rows of the input file.
        graph_rows (Sequence[int]): the input row of each graph, in graph order.
        unit (str, optional): ``row`` (of a CSV) or ``graph`` (0-based graph numbers of a
            graph dataset), for messages. (default: :obj:`"row"`)
    """
    import json
    import os.path as osp

    from graphormer.errors import DataError

    what = f"dataset.split_file={path}"
    # What the file lists: CSV rows, or the graphs of a graph dataset.
    rows_text = "0-based input rows" if unit == "row" else "0-based graph numbers"
    range_text = "0-based, header excluded" if unit == "row" else "0-based"
    noun = "rows" if unit == "row" else "graphs"
    if not osp.isfile(path):
        raise DataError(f"{what} does not exist; give a JSON file of row indices per split")
    try:
        with open(path, encoding="utf-8") as f:
            listed = json.load(f)
    except (ValueError, UnicodeDecodeError) as error:
        raise DataError(
            f'{what} is not JSON ({error}): write {{"train": [0, 1, ...], "valid": [...], '
            f'"test": [...]}} ({rows_text})'
        ) from error
    if not isinstance(listed, dict) or set(listed) != set(SPLIT_NAMES):
        keys = sorted(listed) if isinstance(listed, dict) else type(listed).__name__
        raise DataError(
            f"{what} holds {keys}: it must be a JSON object with exactly the keys train, valid "
            f"and test, each a list of {rows_text}"
        )
    rows_of: dict[str, list[int]] = {}
    seen: dict[int, str] = {}
    for name in SPLIT_NAMES:
        rows = listed[name]
        if not isinstance(rows, list) or not all(
            isinstance(r, int) and not isinstance(r, bool) for r in rows
        ):
            raise DataError(f"{what}: {name!r} must be a list of integers ({rows_text})")
        outside = [r for r in rows if not 0 <= r < num_rows]
        if outside:
            raise DataError(
                f"{what}: {name!r} lists {noun} {_shown(outside)}, outside the input's {num_rows} "
                f"{noun} ({range_text}: 0 to {num_rows - 1})"
            )
        counts = Counter(rows)
        twice = sorted({r for r in rows if r in seen or counts[r] > 1})
        if twice:
            other = seen.get(twice[0], name)
            raise DataError(
                f"{what}: rows {_shown(twice)} are listed more than once (row {twice[0]} in "
                f"{other!r} and {name!r}); each row belongs to one split"
            )
        seen.update((r, name) for r in rows)
        rows_of[name] = list(rows)
    return _rows_to_graphs(rows_of, graph_rows, what, "molecules" if unit == "row" else "graphs")
