"""Attention pictures of molecules: python scripts/explain.py ckpt=PATH smiles=SMILES output=DIR

Writes DIR/mol_<i>/: rollout.png and layers.png (atoms shaded by the graph token's attention),
heads_layer<l>.png (per-head heatmaps), attention.npy and rollout.npy (the raw maps).
"""

import hydra
from omegaconf import DictConfig

from graphormer.errors import run_reporting_errors
from graphormer.inference import explain


@hydra.main(config_path="../configs", config_name="explain", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run_reporting_errors(explain, cfg)


if __name__ == "__main__":
    main()
