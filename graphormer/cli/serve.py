"""``graphormer-serve`` (``python scripts/serve.py``): a trained model over HTTP.

graphormer-serve ckpt=RUN [host=127.0.0.1] [port=8000]

See :mod:`graphormer.serving.app` for the routes.
"""

from __future__ import annotations

from omegaconf import DictConfig

from graphormer.cli.common import console_command, plain
from graphormer.console import report
from graphormer.errors import ConfigError

__all__ = ["main", "run"]


def run(cfg: DictConfig) -> None:
    values = plain(cfg)
    try:
        from graphormer.serving.app import Limits, build_server, check_exposure
    except ImportError as error:
        raise ConfigError(
            f"graphormer-serve needs the serve extra ({error.name} is missing): "
            "pip install 'graphormer[serve]'"
        ) from error
    for key in ("max_rows", "max_smiles_length", "max_atoms", "max_batch_size"):
        if not isinstance(values[key], int) or values[key] < 1:
            raise ConfigError(f"{key}={values[key]!r} is not allowed: a number >= 1")
    port = values["port"]
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ConfigError(f"port={port!r} is not allowed: a TCP port, an integer from 1 to 65535")
    timeout = values["batch_timeout"]
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 <= timeout <= 10:
        raise ConfigError(
            f"batch_timeout={timeout!r} is not allowed: seconds a batch waits, from 0 to 10"
        )
    check_exposure(str(values["host"]), values["api_key"])
    server = build_server(
        values["ckpt"],
        limits=Limits(
            rows=values["max_rows"],
            smiles_length=values["max_smiles_length"],
            max_atoms=values["max_atoms"],
        ),
        api_key=values["api_key"],
        interval=values["interval"],
        max_batch_size=values["max_batch_size"],
        batch_timeout=float(values["batch_timeout"]),
    )
    report(f"serving {values['ckpt']} at http://{values['host']}:{values['port']}/")
    server.run(host=str(values["host"]), port=int(values["port"]), generate_client_file=False)


main = console_command("serve", run)


if __name__ == "__main__":
    main()
