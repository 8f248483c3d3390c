"""Download (if needed) and preprocess a dataset once, e.g. before a multi-node launch:

python scripts/prepare.py dataset=ogbg-molpcba [dataset.root=DIR] [datamodule.max_hops=5]
"""

import hydra
from omegaconf import DictConfig, OmegaConf

from graphormer.errors import run_reporting_errors
from graphormer.training import build_datamodule


def prepare(cfg: DictConfig) -> None:
    datamodule = build_datamodule(
        OmegaConf.to_container(cfg.dataset, resolve=True),
        OmegaConf.to_container(cfg.datamodule, resolve=True),
    )
    datamodule.prepare_data()
    datamodule.setup("fit")
    task = datamodule.task
    print(
        f"{datamodule.describe()}; task {task.task_type}, {task.num_tasks} task(s), metric "
        f"{task.metric}; cached under {cfg.dataset.root}"
    )


@hydra.main(config_path="../configs", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run_reporting_errors(prepare, cfg)


if __name__ == "__main__":
    main()
