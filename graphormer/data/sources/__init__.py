"""Dataset sources: what the ``dataset=`` config group describes, one file per dataset, each
behind the :class:`~graphormer.data.sources.base.Source` contract.

Sources are chosen by name from :data:`SOURCES`, a fixed table of this package's own classes,
never by a class path read from a config or a checkpoint: a checkpoint is data, and must never
choose code to run. Adding a dataset is one file here, its row in :data:`SOURCES`, and its YAML.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from graphormer.data.sources.ase import AseSource
from graphormer.data.sources.base import LoadedDataset, Source
from graphormer.data.sources.folders import DatasetCacheError, DatasetNotFoundError
from graphormer.data.sources.lrgb import LRGBSource
from graphormer.data.sources.oc20 import Oc20Source
from graphormer.data.sources.ogb import OGBSource
from graphormer.data.sources.ogbg_ppa import PPASource
from graphormer.data.sources.pcqm4mv2 import PCQM4Mv2Source
from graphormer.data.sources.pyg_file import PygFileSource
from graphormer.data.sources.smiles_csv import SmilesCsvSource
from graphormer.data.sources.tu import TUSource
from graphormer.data.sources.zinc import ZINCSource
from graphormer.errors import ConfigError

__all__ = [
    "SOURCES",
    "AseSource",
    "Oc20Source",
    "DatasetCacheError",
    "DatasetNotFoundError",
    "LRGBSource",
    "LoadedDataset",
    "OGBSource",
    "PCQM4Mv2Source",
    "PPASource",
    "PygFileSource",
    "SmilesCsvSource",
    "Source",
    "TUSource",
    "ZINCSource",
    "build_source",
    "with_source_defaults",
]

# The dataset sources a config or a checkpoint may name (``dataset.source``).
SOURCES: dict[str, type[Source]] = {
    "ogb": OGBSource,
    "smiles_csv": SmilesCsvSource,
    "pcqm4mv2": PCQM4Mv2Source,
    "zinc": ZINCSource,
    "pyg_file": PygFileSource,
    "tu": TUSource,
    "ogbg_ppa": PPASource,
    "lrgb": LRGBSource,
    "ase": AseSource,
    "oc20": Oc20Source,
}

# Class paths that checkpoints of graphormer 0.1 stored as ``_target_``: read as the names above.
_LEGACY_TARGETS = {
    "graphormer.data.OGBSource": "ogb",
    "graphormer.data.sources.OGBSource": "ogb",
    "graphormer.data.SmilesCsvSource": "smiles_csv",
    "graphormer.data.sources.SmilesCsvSource": "smiles_csv",
}

_PLAIN = (str, int, float, bool, type(None))


def build_source(settings: Mapping[str, Any]) -> Source:
    """The dataset source that ``settings`` (the ``dataset`` config) describes.

    ``settings["source"]`` names an entry of :data:`SOURCES`; the other keys are that class's
    arguments and must be plain values (strings, numbers, booleans, lists of them). Anything
    else (an unknown source, a Hydra ``_target_`` naming another callable, ``_args_``, an unknown
    argument, a nested object) raises :class:`~graphormer.errors.ConfigError`.
    """
    settings = dict(settings)
    target = settings.pop("_target_", None)
    kind = settings.pop("source", None)
    if target is not None:
        if target not in _LEGACY_TARGETS:
            raise ConfigError(
                f"dataset._target_={target!r} is not a dataset source of graphormer: datasets are "
                f"chosen by name with dataset.source (one of {sorted(SOURCES)})"
            )
        legacy = _LEGACY_TARGETS[target]
        if kind is not None and kind != legacy:
            raise ConfigError(f"dataset.source={kind!r} contradicts dataset._target_={target!r}")
        kind = legacy
    if kind not in SOURCES:
        raise ConfigError(
            f"dataset.source={kind!r} is not a dataset source; choose one of {sorted(SOURCES)}"
        )
    cls = SOURCES[kind]
    special = sorted(k for k in settings if str(k).startswith("_"))
    if special:
        raise ConfigError(f"dataset settings may not hold {special}: they are not arguments")
    accepted = set(inspect.signature(cls).parameters)
    unknown = sorted(set(settings) - accepted)
    if unknown:
        raise ConfigError(
            f"dataset.source={kind} does not take {unknown}; its settings are {sorted(accepted)}"
        )
    for key, value in settings.items():
        values = value if isinstance(value, list | tuple) else [value]
        if not all(isinstance(v, _PLAIN) for v in values):
            raise ConfigError(
                f"dataset.{key} must be a plain value or a list of plain values, got "
                f"{type(value).__name__}"
            )
    try:
        return cls(**settings)
    except ConfigError:
        raise
    except (TypeError, ValueError) as error:
        # A missing argument, or a value of the wrong type (a string for a number, ...).
        raise ConfigError(f"dataset settings for source={kind} are not usable: {error}") from error


def with_source_defaults(settings: Mapping[str, Any]) -> dict[str, Any]:
    """A stored ``dataset`` config with its source's argument defaults for the keys it lacks
    (tuples as lists, as a config stores them): a checkpoint written before a setting existed
    was built with that setting's default, the same as a later one that stores it. Settings
    naming no known source come back as they are."""
    settings = dict(settings)
    kind = settings.get("source") or _LEGACY_TARGETS.get(settings.get("_target_"))
    cls = SOURCES.get(kind)
    if cls is None:
        return settings
    defaults = {
        name: list(p.default) if isinstance(p.default, tuple) else p.default
        for name, p in inspect.signature(cls).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    return {**defaults, **settings}
