"""How sure a model is, calibrated on the validation split (#19): split-conformal intervals for
regression, temperature or isotonic calibration of binary probabilities, and the expected
calibration error.

The fitted values live in ``calibration.json`` in the run folder (beside ``checkpoints/``; at the
top of an ensemble's folder), written at the end of training. It is JSON, read as data; it names
the weights it was fitted for (their digests), so that it is never applied to other weights.

Split-conformal regression (Vovk et al. 2005; Lei et al. 2018, *Distribution-free predictive
inference for regression*): the validation molecules' nonconformity scores ``|y - mean|`` (or
``|y - mean| / std`` with an ensemble's or MC dropout's spread, "normalised" scores) give, at level
``1 - alpha``, the ``ceil((n + 1)(1 - alpha))``-th smallest score ``q``; a new molecule's interval is
``mean ± q`` (or ``mean ± q * std``), covering its true value with probability at least
``1 - alpha`` when validation and new molecules are exchangeable.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from graphormer.errors import ConfigError, DataError
from graphormer.outputs import atomic_path

__all__ = [
    "CALIBRATIONS",
    "CALIBRATION_FILE",
    "Calibration",
    "conformal_radius",
    "expected_calibration_error",
    "fit_isotonic",
    "fit_temperature",
]

CALIBRATION_FILE = "calibration.json"
# The binary calibration methods (``calibration=`` of a training run).
CALIBRATIONS = ("none", "temperature", "isotonic")
_FORMAT = 1
_EPS = 1e-7
_ECE_BINS = 10


def conformal_radius(scores: np.ndarray, level: float) -> float:
    """The split-conformal quantile of sorted nonconformity ``scores`` at coverage ``level``:
    the ``ceil((n + 1) * level)``-th smallest. Too few scores for ``level`` is an error."""
    if not 0 < level < 1:
        raise ConfigError(f"interval={level} is not allowed: a coverage level in (0, 1), e.g. 0.9")
    n = len(scores)
    rank = math.ceil((n + 1) * level)
    if rank > n:
        needed = math.ceil(level / (1 - level))
        raise ConfigError(
            f"interval={level} needs at least {needed} labelled validation molecules to be "
            f"calibrated; this run had {n}: choose a lower interval= or a larger validation split"
        )
    return float(np.sort(scores)[rank - 1])


def expected_calibration_error(probs: np.ndarray, labels: np.ndarray) -> float:
    """ECE over 10 equal-width probability bins: the bins' share-weighted gap between the mean
    predicted probability and the fraction of positives (labels 0/1; NaN labels left out)."""
    keep = ~np.isnan(labels)
    p, y = probs[keep].astype(np.float64), labels[keep].astype(np.float64)
    if not len(p):
        return float("nan")
    bins = np.minimum((p * _ECE_BINS).astype(int), _ECE_BINS - 1)
    total = 0.0
    for b in range(_ECE_BINS):
        inside = bins == b
        if inside.any():
            total += inside.sum() / len(p) * abs(p[inside].mean() - y[inside].mean())
    return float(total)


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p.astype(np.float64), _EPS, 1 - _EPS)
    return np.log(p) - np.log1p(-p)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # exp of a large negative logit over a small temperature overflows: clip where the result
    # is 0 or 1 in float64 anyway.
    return 1.0 / (1.0 + np.exp(-np.clip(x, -700.0, 700.0)))


def fit_temperature(probs: np.ndarray, labels: np.ndarray) -> float:
    """The temperature ``T`` minimising the binary cross-entropy of ``sigmoid(logit(p) / T)``
    (Guo et al. 2017, *On Calibration of Modern Neural Networks*), searched on a log grid then
    refined; labels 0/1, NaN left out."""
    keep = ~np.isnan(labels)
    z, y = _logit(probs[keep]), labels[keep].astype(np.float64)
    if not len(z) or y.min() == y.max():
        return 1.0  # one class only: nothing to fit against

    def nll(log_t: float) -> float:
        q = np.clip(_sigmoid(z / math.exp(log_t)), _EPS, 1 - _EPS)
        return float(-(y * np.log(q) + (1 - y) * np.log(1 - q)).mean())

    grid = np.linspace(-4.0, 4.0, 161)
    best = min(grid, key=nll)
    fine = np.linspace(best - 0.05, best + 0.05, 101)
    return float(math.exp(min(fine, key=nll)))


def fit_isotonic(probs: np.ndarray, labels: np.ndarray) -> tuple[list[float], list[float]]:
    """A non-decreasing map of probabilities onto observed frequencies (isotonic regression,
    Zadrozny & Elkan 2002), as its knots ``(x, y)``; applied by linear interpolation."""
    from sklearn.isotonic import IsotonicRegression

    keep = ~np.isnan(labels)
    if not keep.any():
        return [0.0, 1.0], [0.0, 1.0]
    fitted = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip")
    fitted.fit(probs[keep].astype(np.float64), labels[keep].astype(np.float64))
    return [float(v) for v in fitted.X_thresholds_], [float(v) for v in fitted.y_thresholds_]


def _labelled_scores(y: np.ndarray, mean: np.ndarray, scale: np.ndarray | None) -> list[list]:
    """Per task, the sorted scores ``|y - mean| (/ scale)`` of the labelled molecules."""
    out = []
    for t in range(y.shape[1]):
        keep = ~np.isnan(y[:, t])
        score = np.abs(y[keep, t] - mean[keep, t])
        if scale is not None:
            score = score / np.maximum(scale[keep, t], 1e-12)
        out.append(sorted(float(v) for v in score))
    return out


@dataclass
class Calibration:
    """What was fitted on a run's validation split.

    Attributes:
        task_type: ``regression`` or ``binary classification``.
        members: the weights it was fitted for: ``{"checkpoint", "weights_sha256"}`` each.
        residual: regression: per task, sorted ``|y - mean|`` of the validation molecules.
        normalized: regression ensembles: per task, sorted ``|y - mean| / std``.
        mc_normalized: regression, a single model with dropout: per task, sorted
            ``|y - mean| / std`` over ``mc_passes`` MC-dropout passes.
        method: binary: ``none``, ``temperature`` or ``isotonic``.
        temperature: binary, ``temperature``: one per task.
        isotonic: binary, ``isotonic``: per task, the knots ``[x, y]``.
        ece_before, ece_after: binary: the validation split's ECE per task.
        kept_uncalibrated: binary: the tasks whose fitted map raised the validation ECE, whose
            probabilities are therefore left as the model gives them.
    """

    task_type: str
    members: list[dict[str, str]]
    residual: list[list[float]] | None = None
    normalized: list[list[float]] | None = None
    mc_normalized: list[list[float]] | None = None
    mc_passes: int | None = None
    method: str = "none"
    temperature: list[float] | None = None
    isotonic: list[list[list[float]]] | None = None
    ece_before: list[float] | None = None
    ece_after: list[float] | None = None
    kept_uncalibrated: list[int] | None = None
    split: str = "valid"
    extra: dict[str, Any] = field(default_factory=dict)

    # -- fitting ---------------------------------------------------------------------------

    @classmethod
    def fit(
        cls,
        task_type: str,
        members: list[dict[str, str]],
        y: np.ndarray,
        mean: np.ndarray,
        std: np.ndarray | None = None,
        method: str = "none",
        mc_std: np.ndarray | None = None,
        mc_passes: int | None = None,
    ) -> Calibration:
        """Fits on the validation split: ``y`` labels ``[n, T]`` (NaN missing), ``mean`` the
        prediction (probabilities for binary tasks), ``std`` the members' spread (ensembles),
        ``mc_std`` a single model's MC-dropout spread."""
        y, mean = np.asarray(y, dtype=np.float64), np.asarray(mean, dtype=np.float64)
        found = cls(task_type=task_type, members=members)
        if task_type == "regression":
            found.residual = _labelled_scores(y, mean, None)
            if std is not None:
                found.normalized = _labelled_scores(y, mean, std)
            if mc_std is not None:
                found.mc_normalized = _labelled_scores(y, mean, mc_std)
                found.mc_passes = mc_passes
            return found
        found.method = method
        found.ece_before = [
            expected_calibration_error(mean[:, t], y[:, t]) for t in range(y.shape[1])
        ]
        if method == "temperature":
            found.temperature = [fit_temperature(mean[:, t], y[:, t]) for t in range(y.shape[1])]
        elif method == "isotonic":
            found.isotonic = [list(fit_isotonic(mean[:, t], y[:, t])) for t in range(y.shape[1])]
        after = found.calibrate(mean)
        found.ece_after = [
            expected_calibration_error(after[:, t], y[:, t]) for t in range(y.shape[1])
        ]
        if method != "none":
            # A map that makes the validation split's probabilities less calibrated is not
            # applied: that task keeps the model's own probabilities (identity map).
            pairs = zip(found.ece_before, found.ece_after, strict=True)
            worse = [t for t, (before, after) in enumerate(pairs) if after > before]
            for t in worse:
                if found.temperature is not None:
                    found.temperature[t] = 1.0
                if found.isotonic is not None:
                    found.isotonic[t] = [[0.0, 1.0], [0.0, 1.0]]
                found.ece_after[t] = found.ece_before[t]
            found.kept_uncalibrated = worse
        return found

    # -- applying ---------------------------------------------------------------------------

    @property
    def calibrates_probabilities(self) -> bool:
        return self.task_type != "regression" and self.method != "none"

    def calibrate(self, probs: np.ndarray) -> np.ndarray:
        """Binary probabilities ``[n, T]`` through the fitted map (unchanged for ``none``)."""
        probs = np.asarray(probs, dtype=np.float64)
        if self.method == "temperature" and self.temperature is not None:
            return _sigmoid(_logit(probs) / np.asarray(self.temperature)[None, :])
        if self.method == "isotonic" and self.isotonic is not None:
            out = np.empty_like(probs)
            for t, (x, y) in enumerate(self.isotonic):
                out[:, t] = np.interp(probs[:, t], x, y)
            return out
        return probs

    def interval_kind(self, spread: str | None) -> str:
        """Which scores an interval uses: ``normalized`` (an ensemble's spread), ``mc`` (MC
        dropout's) or ``residual`` (no spread)."""
        if spread == "ensemble" and self.normalized is not None:
            return "normalized"
        if spread == "mc" and self.mc_normalized is not None:
            return "mc"
        return "residual"

    def intervals(
        self, mean: np.ndarray, std: np.ndarray | None, level: float, spread: str | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(lower, upper)`` ``[n, T]`` at coverage ``level``: ``mean ± q * std`` with the
        normalised scores of ``spread`` (``ensemble`` or ``mc``), else ``mean ± q``."""
        if self.task_type != "regression" or self.residual is None:
            raise ConfigError(
                "interval= is for regression models: binary tasks give calibrated probabilities"
            )
        kind = self.interval_kind(spread)
        scores = {"normalized": self.normalized, "mc": self.mc_normalized}.get(kind, self.residual)
        radius = np.array([conformal_radius(np.asarray(s), level) for s in scores])
        half = radius[None, :] * (std if kind != "residual" else np.ones_like(mean))
        return mean - half, mean + half

    # -- item levels (atoms, bonds) ----------------------------------------------------------

    def fit_level(
        self, name: str, y: np.ndarray, mean: np.ndarray, std: np.ndarray | None = None
    ) -> None:
        """Adds the regression scores of an item level ``name`` (``atom``, ``bond``): ``y`` and
        ``mean`` ``[n_items, T]`` over every item of the validation split, ``std`` an
        ensemble's spread; each labelled item is one exchangeable score."""
        fitted = Calibration.fit("regression", self.members, y, mean, std)
        scores = {"residual": fitted.residual, "normalized": fitted.normalized}
        self.extra.setdefault("levels", {})[name] = scores

    def level(self, name: str) -> Calibration | None:
        """The regression calibration of item level ``name`` (its intervals), None when the
        run fitted none (a binary level, or a run before item levels were calibrated)."""
        values = (self.extra.get("levels") or {}).get(name)
        if values is None:
            return None
        found = Calibration("regression", self.members, **values)
        found._check_values()
        return found

    # -- the file ---------------------------------------------------------------------------

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        values = {"format": _FORMAT, **{k: v for k, v in self.__dict__.items()}}
        with atomic_path(path) as partial:
            partial.write_text(json.dumps(values) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> Calibration:
        """Reads ``calibration.json`` as data; a damaged file is an error naming it."""
        path = Path(path)
        try:
            values = json.loads(path.read_text())
            if values.pop("format") != _FORMAT:
                raise ValueError("unknown format")
            found = cls(**values)
            if not isinstance(found.members, list) or not isinstance(found.task_type, str):
                raise ValueError("members or task_type")
            found._check_values()
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as error:
            raise DataError(
                f"{path} cannot be read as a calibration ({error}): it was damaged or edited; "
                "train the run again to recalibrate"
            ) from error
        return found

    def _check_values(self) -> None:
        """Values that no fit gives (a negative score turns an interval inside out, a
        negative temperature flips probabilities) are refused with the entry that holds them."""
        if self.task_type not in ("regression", "binary classification"):
            raise ValueError(f"task_type {self.task_type!r}")
        if self.method not in CALIBRATIONS:
            raise ValueError(f"method {self.method!r}")
        for key in ("residual", "normalized", "mc_normalized"):
            tasks = getattr(self, key)
            if tasks is None:
                continue
            if not isinstance(tasks, list) or not all(isinstance(t, list) for t in tasks):
                raise ValueError(f"{key} is not a list of score lists")
            for scores in tasks:
                values = np.asarray(scores, dtype=np.float64)
                if not np.isfinite(values).all() or (values < 0).any():
                    raise ValueError(f"{key} holds a score that is negative or not finite")
                if (np.diff(values) < 0).any():
                    raise ValueError(f"{key} holds scores out of order")
        per_task = ("residual", "normalized", "mc_normalized", "temperature", "isotonic")
        counts = {k: len(getattr(self, k)) for k in per_task if getattr(self, k) is not None}
        if len(set(counts.values())) > 1:
            raise ValueError(f"its entries are of different numbers of tasks {counts}")
        passes = self.mc_passes
        if passes is not None and (isinstance(passes, bool) or not isinstance(passes, int)):
            raise ValueError(f"mc_passes {passes!r}")
        if (passes is None) != (self.mc_normalized is None) or (passes is not None and passes < 2):
            raise ValueError(f"mc_passes {passes!r} with mc_normalized")
        levels = self.extra.get("levels") or {}
        if not isinstance(levels, dict):
            raise ValueError("extra.levels is not a table of item levels")
        for name in levels:
            self.level(name)  # each level's scores checked as a regression calibration's
        if self.temperature is not None:
            values = np.asarray(self.temperature, dtype=np.float64)
            if values.ndim != 1 or not np.isfinite(values).all() or (values <= 0).any():
                raise ValueError("temperature holds a value that is not a positive number")
        for knots in self.isotonic or []:
            x, y = (np.asarray(k, dtype=np.float64) for k in knots)
            if x.shape != y.shape or not len(x) or not np.isfinite([*x, *y]).all():
                raise ValueError("isotonic holds knots that are not pairs of numbers")
            if (np.diff(x) < 0).any() or (np.diff(y) < 0).any() or y.min() < 0 or y.max() > 1:
                raise ValueError("isotonic holds a map that is not non-decreasing in [0, 1]")

    def fits(self, digests: Sequence[str]) -> bool:
        """Whether it was fitted for exactly these weights (their SHA-256 digests, in order)."""
        return [m.get("weights_sha256") for m in self.members] == list(digests)
