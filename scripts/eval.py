"""Evaluate a checkpoint: python scripts/eval.py ckpt=PATH [split=valid|test|all] [dataset.root=DIR]"""

import hydra
from omegaconf import DictConfig

from graphormer.errors import run_reporting_errors
from graphormer.training import evaluate


@hydra.main(config_path="../configs", config_name="eval", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run_reporting_errors(evaluate, cfg)


if __name__ == "__main__":
    main()
