"""Predict molecules with a checkpoint: python scripts/predict.py ckpt=PATH input=mols.csv

The same as the installed command ``graphormer-predict`` (graphormer/cli/predict.py), which takes the
same KEY=VALUE overrides.
"""

from graphormer.cli.predict import main

if __name__ == "__main__":
    main()
