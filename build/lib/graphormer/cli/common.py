"""What every command shares: errors as one line, a composed config as plain values, the run
folder guard."""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Callable
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from graphormer.console import report
from graphormer.errors import ConfigError, UserFacingError
from graphormer.rundir import claim_run_dir

__all__ = ["RunDirGuard", "plain", "run_reporting_errors"]


def run_reporting_errors(entry: Callable[[Any], Any], cfg: Any) -> Any:
    """Runs a command's entry function. A :class:`UserFacingError` (or a missing mandatory config
    value) ends it with one ``error:`` line on stderr and exit status 1; a bug keeps its
    traceback. Warnings (skipped SMILES rows, say) also go to the run's log file."""
    logging.captureWarnings(True)
    # Warnings as one line ("UserWarning: skipped 3 rows ..."), not file, line and source.
    warnings.formatwarning = _one_line_warning
    try:
        return entry(cfg)
    except UserFacingError as error:
        _fail(str(error))
    except MissingMandatoryValue as error:
        key = getattr(error, "full_key", None) or "a required value"
        _fail(f"{key} is required: pass {key}=... on the command line (see --help)")


def plain(cfg: DictConfig) -> dict[str, Any]:
    """The composed config as plain values, every ``???`` refused first (OmegaConf's ``get``
    would read it as None and carry on)."""
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        verb = "are" if len(missing) > 1 else "is"
        raise ConfigError(
            f"{', '.join(missing)} {verb} required: pass "
            + " ".join(f"{key}=..." for key in missing)
            + " on the command line (see --help)"
        )
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    return f"{category.__name__}: {message}"


def _fail(message: str) -> None:
    report(f"error: {message}", stream=sys.stderr, level=logging.ERROR)
    sys.exit(1)


class RunDirGuard(Callback):
    """Hydra callback: claims the run folder before Hydra writes ``.hydra/`` into it."""

    def on_run_start(self, config: Any, **kwargs: Any) -> None:
        message = claim_run_dir(config.hydra.run.dir, resuming=bool(config.get("ckpt_path")))
        if message:
            print(f"error: {message}", file=sys.stderr)
            sys.exit(1)
