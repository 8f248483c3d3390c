"""Atom positions for molecules given as SMILES: RDKit's ETKDGv3 conformers with a fixed seed,
optimised with MMFF94, computed once in a process pool and cached with the graphs
(``dataset.conformers=rdkit``, ``dataset.num_conformers``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import torch
from torch_geometric.data import Data

from graphormer.errors import ConfigError

__all__ = [
    "CONFORMER_METHODS",
    "CONFORMER_SEED",
    "RandomConformer",
    "check_conformer_settings",
    "embed_conformers",
    "embed_many",
    "mean_over_repeats",
    "unembedded_message",
]

# What ``dataset.conformers`` may name (None: no positions).
CONFORMER_METHODS = ("rdkit",)
# ETKDG's random seed: the same SMILES always gets the same conformers.
CONFORMER_SEED = 0x3D


def check_conformer_settings(conformers: str | None, num_conformers: int) -> None:
    """Raises :class:`ConfigError` naming ``dataset.conformers`` or ``dataset.num_conformers``
    (and what is allowed) when a source is asked for conformers it cannot make."""
    if conformers is not None and conformers not in CONFORMER_METHODS:
        raise ConfigError(
            f"dataset.conformers={conformers!r} is not allowed: "
            f"{' or '.join(CONFORMER_METHODS)} (positions from RDKit), or null for none"
        )
    if (
        isinstance(num_conformers, bool)
        or not isinstance(num_conformers, int)
        or num_conformers < 1
    ):
        raise ConfigError(
            f"dataset.num_conformers={num_conformers!r} is not allowed: an integer >= 1"
        )


def embed_conformers(
    smiles: str, num_conformers: int = 1, optimise: bool = True, seed: int = CONFORMER_SEED
) -> np.ndarray | None:
    """``[C, N, 3]`` float32 positions (Angstrom) of the heavy atoms of ``smiles`` in RDKit's
    atom order (the order of ``smiles2graph``'s nodes), or None when RDKit cannot parse it or
    embed ``num_conformers`` conformers.

    Hydrogens are added for the embedding and the force field, then dropped: the graphs hold
    heavy atoms only. A molecule MMFF94 has no parameters for keeps its ETKDG geometry.

    Args:
        smiles (str): the molecule.
        num_conformers (int, optional): conformers ``C``. (default: :obj:`1`)
        optimise (bool, optional): MMFF94-optimise each conformer. (default: :obj:`True`)
        seed (int, optional): ETKDG's random seed. (default: :data:`CONFORMER_SEED`)
    """
    from rdkit import Chem, RDLogger
    from rdkit.Chem import AllChem

    RDLogger.DisableLog("rdApp.*")
    mol = Chem.MolFromSmiles(smiles) if isinstance(smiles, str) else None
    if mol is None or mol.GetNumAtoms() == 0:
        return None
    heavy = mol.GetNumAtoms()
    mol = Chem.AddHs(mol)
    params = AllChem.ETKDGv3()
    params.randomSeed = seed
    params.numThreads = 1  # the pool runs one molecule per process
    ids = list(AllChem.EmbedMultipleConfs(mol, numConfs=num_conformers, params=params))
    if len(ids) < num_conformers:
        params.useRandomCoords = True  # RDKit's advice for molecules that fail from a matrix
        ids = list(AllChem.EmbedMultipleConfs(mol, numConfs=num_conformers, params=params))
    if len(ids) < num_conformers:
        return None
    if optimise and AllChem.MMFFHasAllMoleculeParams(mol):
        AllChem.MMFFOptimizeMoleculeConfs(mol, numThreads=1, maxIters=1000)
    positions = np.stack([mol.GetConformer(i).GetPositions()[:heavy] for i in ids])
    if not np.isfinite(positions).all():
        return None
    return positions.astype(np.float32)


def _embed(args: tuple[str, int, bool]) -> np.ndarray | None:
    return embed_conformers(*args)


def embed_many(
    smiles: Sequence[str],
    num_conformers: int = 1,
    optimise: bool = True,
    workers: int | None = None,
) -> list[np.ndarray | None]:
    """:func:`embed_conformers` of each SMILES, in a process pool of ``workers`` processes
    (default: the CPUs this process may use, at most 16; one for a few molecules)."""
    jobs = [(s, num_conformers, optimise) for s in smiles]
    if workers is None:
        workers = min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1, 16)
    if workers <= 1 or len(jobs) < 8:
        return [_embed(job) for job in jobs]
    chunk = max(1, len(jobs) // (workers * 8))
    with ProcessPoolExecutor(workers) as pool:
        return list(pool.map(_embed, jobs, chunksize=chunk))


def unembedded_message(path: str, rows: Sequence[int], smiles: Sequence[str]) -> str:
    """The one warning that names the molecules RDKit could not embed, left out of the data."""
    shown = ", ".join(f"row {r} ({s!r})" for r, s in zip(rows[:5], smiles[:5], strict=False))
    more = f" and {len(rows) - 5} more" if len(rows) > 5 else ""
    return (
        f"{len(rows)} molecule(s) of {path} could not be given conformers by RDKit and are left "
        f"out (never given zero positions): {shown}{more}"
    )


class RandomConformer:
    """A dataset transform: each read of a graph takes one of its ``conformers`` ``[N, C, 3]``
    at random as ``pos`` (a different conformer of the molecule each epoch)."""

    def __call__(self, data: Data) -> Data:
        conformers = data.get("conformers")
        if conformers is None:
            return data
        data = data.clone()
        pick = int(torch.randint(conformers.size(1), ()))
        data.pos = conformers[:, pick]
        return data

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def mean_over_repeats(
    keys: torch.Tensor,
    values: torch.Tensor,
    labels: torch.Tensor | None = None,
    link: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Rows ``[n, ...]`` sharing a key ``[n]`` as one: a graph read once per conformer
    (evaluation scores the mean over a molecule's conformers, as prediction does), or evaluated
    twice by distributed padding. Returns the sorted unique keys, the mean of each key's
    ``values`` and the first of its ``labels`` (the same for every repeat), on ``values``'
    device. Summed on the CPU, in the rows' order: the same numbers every run.

    ``link`` ``sigmoid`` or ``softmax``: ``values`` are logits of that link, and a key whose
    reads differ gets the logits of the mean of their probabilities (prediction averages
    probabilities; the mean of logits would be another number). Equal reads keep their own.
    """
    unique, inverse, counts = torch.unique(
        keys.cpu(), sorted=True, return_inverse=True, return_counts=True
    )
    sums = torch.zeros((len(unique), *values.shape[1:]), dtype=values.dtype)
    sums.index_add_(0, inverse, values.cpu())
    mean = sums / counts.view(-1, *([1] * (values.dim() - 1))).to(values.dtype)
    if link is not None and bool((counts > 1).any()):
        mean = _probability_mean(inverse, values.cpu(), mean, link)
    first = None
    if labels is not None:
        rows = torch.arange(len(keys))
        start = torch.full((len(unique),), len(keys)).scatter_reduce_(0, inverse, rows, "amin")
        first = labels[start.to(labels.device)]
    return unique.to(keys.device), mean.to(values.device), first


def _scatter(inverse: torch.Tensor, rows: torch.Tensor, size: int, reduce: str) -> torch.Tensor:
    """``rows`` ``[n, F]`` reduced (``amax``, ``amin``) per key ``inverse`` ``[n]``: ``[size, F]``."""
    out = rows.new_zeros((size, rows.size(1)))
    index = inverse.unsqueeze(1).expand_as(rows)
    return out.scatter_reduce_(0, index, rows, reduce, include_self=False)


def _log_mean_exp(inverse: torch.Tensor, rows: torch.Tensor, size: int) -> torch.Tensor:
    """``log(sum(exp(rows)))`` ``[size, F]`` per key (up to the constant ``log(count)``)."""
    top = _scatter(inverse, rows, size, "amax")
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    sums = rows.new_zeros((size, rows.size(1))).index_add_(0, inverse, (rows - top[inverse]).exp())
    return top + sums.log()


def _probability_mean(
    inverse: torch.Tensor, values: torch.Tensor, mean: torch.Tensor, link: str
) -> torch.Tensor:
    """``mean`` with each key whose reads differ replaced by the logits of the mean of the
    reads' probabilities, in float64 (log-sum-exp: no probability rounds to 0 or 1)."""
    if link not in ("sigmoid", "softmax"):
        raise ValueError(f"link must be sigmoid or softmax, got {link!r}")
    size = len(mean)
    rows = values.double().reshape(len(values), -1)
    differ = (_scatter(inverse, rows, size, "amax") != _scatter(inverse, rows, size, "amin")).any(1)
    if not bool(differ.any()):
        return mean
    if link == "sigmoid":
        # logit(mean p) = log(mean p) - log(mean (1 - p)); the counts cancel.
        logits = _log_mean_exp(inverse, torch.nn.functional.logsigmoid(rows), size)
        logits = logits - _log_mean_exp(inverse, torch.nn.functional.logsigmoid(-rows), size)
    else:
        # log(mean p) are logits of the mean distribution (softmax ignores the constant).
        shaped = torch.log_softmax(values.double(), dim=-1).reshape(len(values), -1)
        logits = _log_mean_exp(inverse, shaped, size)
    out = mean.clone().reshape(size, -1)
    out[differ] = logits[differ].to(out.dtype)
    return out.view_as(mean)
