"""Convert published Graphormer weights: python scripts/convert.py source=PATH output=FILE.ckpt

The same as the installed command ``graphormer-convert`` (graphormer/cli/convert.py), which takes
the same KEY=VALUE overrides.
"""

from graphormer.cli.convert import main

if __name__ == "__main__":
    main()
