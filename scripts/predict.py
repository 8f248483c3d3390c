"""Predict molecules with a checkpoint:

python scripts/predict.py ckpt=PATH input=mols.csv [smiles_column=smiles] [output=preds.csv]
python scripts/predict.py ckpt=PATH smiles=[CCO,c1ccccc1O] [embeddings=FILE.npy|.parquet]
"""

import hydra
from omegaconf import DictConfig

from graphormer.errors import run_reporting_errors
from graphormer.inference import predict


@hydra.main(config_path="../configs", config_name="predict", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run_reporting_errors(predict, cfg)


if __name__ == "__main__":
    main()
