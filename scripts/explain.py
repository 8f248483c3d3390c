"""Attention pictures of molecules: python scripts/explain.py ckpt=PATH smiles=SMILES output=DIR

The same as the installed command ``graphormer-explain`` (graphormer/cli/explain.py), which takes the
same KEY=VALUE overrides.
"""

from graphormer.cli.explain import main

if __name__ == "__main__":
    main()
