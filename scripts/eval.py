"""Evaluate a checkpoint: python scripts/eval.py ckpt=PATH [split=valid|test|all] [dataset.root=DIR]

The same as the installed command ``graphormer-eval`` (graphormer/cli/eval.py), which takes the
same KEY=VALUE overrides.
"""

from graphormer.cli.eval import main

if __name__ == "__main__":
    main()
