"""``graphormer-train`` (``python scripts/train.py``): train a Graphormer.

graphormer-train [dataset=...] [model=...] [trainer=...] [experiment=...] [KEY=VALUE ...]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import hydra
from omegaconf import DictConfig

from graphormer.cli.common import plain, run_reporting_errors

if TYPE_CHECKING:
    from graphormer.training.settings import RunSettings

__all__ = ["build_loggers", "main", "run", "settings_from"]


def settings_from(cfg: DictConfig) -> RunSettings:
    """The checked settings of a composed ``train`` config."""
    from graphormer.training.settings import RunSettings

    return RunSettings.from_dict(plain(cfg))


def build_loggers(cfg: DictConfig) -> list[Any]:
    """The logger the ``logger=`` group chose on the command line (none for ``logger=null``).
    Built from the command line's config only, never from a stored one."""
    if not cfg.get("logger"):
        return []
    return [hydra.utils.instantiate(cfg.logger)]


def run(cfg: DictConfig) -> dict[str, Any]:
    """Trains as the composed config says; returns what ``metrics.json`` holds."""
    from graphormer.training.run import train

    return train(settings_from(cfg), loggers=build_loggers(cfg))


@hydra.main(config_path="../configs", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run_reporting_errors(run, cfg)


if __name__ == "__main__":
    main()
