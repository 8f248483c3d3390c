"""``graphormer-prepare`` (``python scripts/prepare.py``): download (if needed) and preprocess a
dataset once, e.g. before a multi-node launch.

graphormer-prepare dataset=ogbg-molpcba [dataset.root=DIR] [datamodule.max_hops=5]
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from graphormer.cli.common import plain, run_command, run_reporting_errors
from graphormer.console import report

__all__ = ["main", "run"]


def run(cfg: DictConfig) -> None:
    from graphormer.training.run import build_datamodule

    values = plain(cfg)
    datamodule = build_datamodule(values["dataset"], values["datamodule"])
    datamodule.prepare_data()
    datamodule.setup("fit")
    task = datamodule.task
    report(
        f"{datamodule.describe()}; task {task.task_type}, {task.num_tasks} task(s), metric "
        f"{task.metric}; cached under {values['dataset'].get('root')}"
    )


@hydra.main(config_path="../configs", config_name="prepare", version_base="1.3")
def _application(cfg: DictConfig) -> None:
    run_reporting_errors(run, cfg)


def main() -> None:
    """The console command: Hydra's application, its command line checked first."""
    run_command(_application, "prepare")


if __name__ == "__main__":
    main()
