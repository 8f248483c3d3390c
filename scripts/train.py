"""Train a Graphormer: python scripts/train.py dataset=ogbg-molhiv [model=...] [trainer=...]"""

import hydra
from omegaconf import DictConfig

from graphormer.training import train


@hydra.main(config_path="../configs", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    train(cfg)


if __name__ == "__main__":
    main()
