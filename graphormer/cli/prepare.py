"""``graphormer-prepare`` (``python scripts/prepare.py``): download (if needed) and preprocess a
dataset once, e.g. before a multi-node launch.

graphormer-prepare dataset=ogbg-molpcba [dataset.root=DIR] [datamodule.max_hops=5]
"""

from __future__ import annotations

from omegaconf import DictConfig

from graphormer.cli.common import console_command, plain
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


main = console_command("prepare", run)


if __name__ == "__main__":
    main()
