"""Download (if needed) and preprocess a dataset once: python scripts/prepare.py dataset=NAME

The same as the installed command ``graphormer-prepare`` (graphormer/cli/prepare.py), which takes the
same KEY=VALUE overrides.
"""

from graphormer.cli.prepare import main

if __name__ == "__main__":
    main()
