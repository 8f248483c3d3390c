"""Train a Graphormer: python scripts/train.py dataset=ogbg-molhiv [model=...] [trainer=...]

The same as the installed command ``graphormer-train`` (graphormer/cli/train.py), which takes the
same KEY=VALUE overrides.
"""

from graphormer.cli.train import main

if __name__ == "__main__":
    main()
