"""Evaluate a checkpoint: python scripts/eval.py ckpt=PATH [split=valid|test|all]"""

import logging
import sys

import hydra
from omegaconf import DictConfig

from graphormer.errors import UserFacingError
from graphormer.training import evaluate


@hydra.main(config_path="../configs", config_name="eval", version_base="1.3")
def main(cfg: DictConfig) -> None:
    # Warnings (skipped SMILES rows, say) also go to the run's log file.
    logging.captureWarnings(True)
    try:
        evaluate(cfg)
    except UserFacingError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
