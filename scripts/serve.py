"""A trained model over HTTP: python scripts/serve.py ckpt=RUN [host=127.0.0.1] [port=8000]

The same as the installed command ``graphormer-serve`` (graphormer/cli/serve.py), which takes the
same KEY=VALUE overrides.
"""

from graphormer.cli.serve import main

if __name__ == "__main__":
    main()
