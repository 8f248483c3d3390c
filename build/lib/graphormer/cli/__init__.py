"""The command-line applications (Hydra): ``graphormer-train``, ``graphormer-eval``,
``graphormer-predict``, ``graphormer-explain``, ``graphormer-convert`` and ``graphormer-prepare``
(``python scripts/<name>.py`` runs the same). Each turns its composed config into the typed
arguments of the library (:mod:`graphormer.training`, :mod:`graphormer.inference`,
:mod:`graphormer.interop`); the configs ship inside the package (:data:`CONFIGS`)."""

from pathlib import Path

__all__ = ["CONFIGS"]

# The packaged Hydra configs (configs/train.yaml, configs/dataset/*.yaml, ...).
CONFIGS = Path(__file__).resolve().parent.parent / "configs"
