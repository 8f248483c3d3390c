"""Train/valid/test splits of a user's molecules: scaffold (group), and seeded random."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import torch
from rdkit.Chem.Scaffolds import MurckoScaffold

from graphormer.errors import ConfigError

__all__ = ["group_split", "random_split", "scaffold_split", "stratified_split"]


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
