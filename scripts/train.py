"""Train a Graphormer: python scripts/train.py dataset=ogbg-molhiv [model=...] [trainer=...]"""

import hydra
from omegaconf import DictConfig

from graphormer.errors import run_reporting_errors
from graphormer.training import train


@hydra.main(config_path="../configs", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run_reporting_errors(train, cfg)


if __name__ == "__main__":
    main()
