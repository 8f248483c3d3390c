"""Molecule-level features computed from SMILES alone (``dataset.molecule_features``): RDKit's 2D
descriptors and Morgan count fingerprints, raw (float32, NaN where undefined), computed in
parallel. Their one owner, without torch, so that training (through
:mod:`graphormer.data.descriptors`, which re-exports them), the torch Predictor and the ONNX
predictor compute the same values; the rule that makes them model inputs is the model's.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import TypeVar

import numpy as np

from graphormer.errors import ConfigError

__all__ = [
    "MOLECULE_FEATURE_SETS",
    "MORGAN_BITS",
    "MORGAN_RADIUS",
    "feature_set_names",
    "feature_set_values",
    "feature_sets",
    "morgan_count_values",
    "rdkit2d_names",
    "rdkit2d_values",
]

T = TypeVar("T")

# The named feature sets ``dataset.molecule_features`` accepts, alone or joined with ``+``
# (``rdkit2d+morgan_counts``): RDKit's 2D descriptors; Morgan (ECFP4) count fingerprints.
MOLECULE_FEATURE_SETS = ("rdkit2d", "morgan_counts")
# The Morgan count fingerprint: radius 2 (ECFP4) folded into 2,048 bins, as chemprop's
# ``morgan_count`` features and the fingerprints of MoleculeACE's classical baselines.
MORGAN_RADIUS = 2
MORGAN_BITS = 2048
# Molecules per worker task: large enough that process start-up and pickling are small beside it.
_CHUNK = 256
# Below this many molecules one process is faster than starting a pool.
_PARALLEL_FROM = 512


def rdkit2d_names() -> list[str]:
    """The names of RDKit's 2D descriptors (``rdkit.Chem.Descriptors._descList``), in order."""
    from rdkit.Chem import Descriptors

    return [name for name, _ in Descriptors._descList]


def _rdkit2d_chunk(smiles: Sequence[str]) -> np.ndarray:
    """``[n, D]`` float64 descriptors of ``smiles`` (NaN: unparsable SMILES or a descriptor that
    fails)."""
    from rdkit import Chem, RDLogger
    from rdkit.Chem import Descriptors

    RDLogger.DisableLog("rdApp.*")
    functions = [fn for _, fn in Descriptors._descList]
    out = np.full((len(smiles), len(functions)), np.nan)
    for i, text in enumerate(smiles):
        mol = Chem.MolFromSmiles(text) if isinstance(text, str) else None
        if mol is None:
            continue
        for j, fn in enumerate(functions):
            try:
                out[i, j] = float(fn(mol))
            except Exception:  # noqa: BLE001  (a descriptor undefined for this molecule: NaN)
                pass
    return out


def _morgan_chunk(smiles: Sequence[str]) -> np.ndarray:
    """``[n, MORGAN_BITS]`` float64 Morgan counts of ``smiles`` (NaN rows: unparsable)."""
    from rdkit import Chem, RDLogger
    from rdkit.Chem import rdFingerprintGenerator

    RDLogger.DisableLog("rdApp.*")
    generator = rdFingerprintGenerator.GetMorganGenerator(radius=MORGAN_RADIUS, fpSize=MORGAN_BITS)
    out = np.full((len(smiles), MORGAN_BITS), np.nan)
    for i, text in enumerate(smiles):
        mol = Chem.MolFromSmiles(text) if isinstance(text, str) else None
        if mol is not None:
            out[i] = generator.GetCountFingerprintAsNumPy(mol)
    return out


def _in_chunks(
    chunk_fn: Callable[[list[str]], T], smiles: list[str], workers: int | None
) -> list[T]:
    """``chunk_fn`` of each run of ``_CHUNK`` SMILES, in order, over ``workers`` processes (None:
    every CPU this process may use; one process below ``_PARALLEL_FROM`` molecules)."""
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    chunks = [smiles[i : i + _CHUNK] for i in range(0, len(smiles), _CHUNK)]
    if workers <= 1 or len(smiles) < _PARALLEL_FROM:
        return [chunk_fn(c) for c in chunks]
    with ProcessPoolExecutor(max_workers=min(workers, len(chunks))) as pool:
        return list(pool.map(chunk_fn, chunks))


def _not_float32_to_nan(values: np.ndarray) -> np.ndarray:
    """float32 ``values``, NaN where they are not finite or beyond float32's range."""
    values[~np.isfinite(values) | (np.abs(values) > np.finfo(np.float32).max)] = np.nan
    return values.astype(np.float32)


def rdkit2d_values(smiles: Sequence[str], workers: int | None = None) -> np.ndarray:
    """``[n, D]`` float32 RDKit 2D descriptors of ``smiles``, computed over the CPUs (``workers``
    processes; None: every CPU this process may use). Values that are not finite or do not fit
    float32 (Ipc reaches 1e40 on large molecules) are NaN."""
    parts = _in_chunks(_rdkit2d_chunk, list(smiles), workers)
    values = np.concatenate(parts) if parts else np.zeros((0, len(rdkit2d_names())))
    return _not_float32_to_nan(values)


def morgan_count_values(smiles: Sequence[str], workers: int | None = None) -> np.ndarray:
    """``[n, MORGAN_BITS]`` float32 Morgan count fingerprints (radius :data:`MORGAN_RADIUS`) of
    ``smiles``, computed over ``workers`` processes as :func:`rdkit2d_values`; a row of NaN for a
    SMILES RDKit cannot parse."""
    parts = _in_chunks(_morgan_chunk, list(smiles), workers)
    return np.concatenate(parts).astype(np.float32) if parts else np.zeros((0, MORGAN_BITS))


def feature_sets(value: str | None) -> list[str]:
    """The feature sets a ``dataset.molecule_features`` value names, in order
    (``"rdkit2d+morgan_counts"`` -> both; None -> none).

    Raises:
        ConfigError: an unknown or repeated set, naming the known ones.
    """
    if value is None:
        return []
    sets = [part.strip() for part in str(value).split("+")]
    unknown = [s for s in sets if s not in MOLECULE_FEATURE_SETS]
    if unknown or len(set(sets)) != len(sets):
        raise ConfigError(
            f"dataset.molecule_features={value!r} is not known: use "
            f"{' or '.join(MOLECULE_FEATURE_SETS)}, several joined with + "
            "(rdkit2d+morgan_counts), or null for none"
        )
    return sets


def feature_set_names(value: str | None) -> list[str]:
    """One name per feature of the sets ``value`` names, set by set (``rdkit2d:MolLogP``, ...,
    ``morgan_counts:0``, ...): what a model records, so that another RDKit listing other
    descriptors is refused rather than misread."""
    names = []
    for name in feature_sets(value):
        if name == "rdkit2d":
            names += [f"rdkit2d:{n}" for n in rdkit2d_names()]
        else:
            names += [f"morgan_counts:{i}" for i in range(MORGAN_BITS)]
    return names


def feature_set_values(
    value: str | None, smiles: Sequence[str], workers: int | None = None
) -> np.ndarray:
    """``[n, D]`` float32 raw features of the sets ``value`` names (columns as
    :func:`feature_set_names`; NaN = missing), over ``workers`` processes as
    :func:`rdkit2d_values`."""
    parts = [
        (rdkit2d_values if name == "rdkit2d" else morgan_count_values)(smiles, workers)
        for name in feature_sets(value)
    ]
    return np.concatenate(parts, axis=1) if parts else np.zeros((len(smiles), 0), np.float32)
