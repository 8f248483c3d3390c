"""A trained model as ONNX: python scripts/export.py ckpt=RUN output=model.onnx

The same as the installed command ``graphormer-export`` (graphormer/cli/export.py), which takes the
same KEY=VALUE overrides.
"""

from graphormer.cli.export import main

if __name__ == "__main__":
    main()
