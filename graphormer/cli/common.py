"""What every command shares: its command line checked before Hydra composes it
(:mod:`graphormer.cli.arguments`), errors as one line, a composed config as plain values, the
run folder guard."""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from graphormer.cli.arguments import command_line_error, quote_smiles, required_message
from graphormer.console import report
from graphormer.errors import ConfigError, UserFacingError
from graphormer.outputs import folder_problem
from graphormer.rundir import (
    ENSEMBLE_FILE,
    RUN_MARKER,
    claim_run_dir,
    discard_if_untrained,
    newest_checkpoint,
    run_dir_of,
)

__all__ = [
    "LogDirGuard",
    "RunDirGuard",
    "checkpoint_inputs",
    "plain",
    "run_command",
    "run_reporting_errors",
]


def _resume_dir(ckpt_path: Any, default: str) -> str:
    """``hydra.run.dir`` of train.yaml: a resume continues in its checkpoint's own run folder
    (``RUN/checkpoints/last.ckpt`` -> ``RUN``), so that no empty new folder is left behind."""
    folder = run_dir_of(ckpt_path) if ckpt_path else None
    return str(folder) if folder is not None else default


def _resume_subdir(ckpt_path: Any) -> str:
    """``hydra.output_subdir`` of train.yaml: a resume keeps the run's own ``.hydra/config.yaml``
    (the composed config it continues) and records its command line beside it."""
    if not ckpt_path:
        return ".hydra"
    return f".hydra/resume-{datetime.now():%Y-%m-%d_%H-%M-%S_%f}"


def _metric_direction(dataset: Any, monitor: Any = None) -> str:
    """``hydra.sweeper.direction`` of ``hparams_search=optuna``: ``maximize`` for a metric whose
    larger value is better (ROC-AUC, AP), else ``minimize`` (RMSE, MAE). The metric is the one
    each trial returns: ``monitor=`` where given (``val/atom_mae``), else the dataset's own, from
    its task, without reading its data."""
    from graphormer.data.sources import build_source
    from graphormer.data.tasks import TaskInfo

    if monitor is not None:
        name = str(monitor).removeprefix("val/")
        return "maximize" if TaskInfo.metric_higher_is_better(name) else "minimize"
    values = (
        OmegaConf.to_container(dataset, resolve=True)
        if isinstance(dataset, DictConfig)
        else dict(dataset)
    )
    return "maximize" if build_source(values).task_info().higher_is_better else "minimize"


OmegaConf.register_new_resolver("resume_dir", _resume_dir, replace=True)
OmegaConf.register_new_resolver("metric_direction", _metric_direction, replace=True)
OmegaConf.register_new_resolver("resume_subdir", _resume_subdir, use_cache=True, replace=True)


def run_reporting_errors(entry: Callable[[Any], Any], cfg: Any) -> Any:
    """Runs a command's entry function. A :class:`UserFacingError` (or a missing mandatory config
    value) ends it with one ``error:`` line on stderr and exit status 1; Ctrl-C with what was
    interrupted and status 130; a bug keeps its traceback. Warnings (skipped SMILES rows, say) also go to the run's log file."""
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
    except KeyboardInterrupt as stop:
        # Ctrl-C: what happened and how to continue (training's RunInterrupted says what was
        # saved; the command adds how to resume it), and the shell's status for SIGINT.
        for line in (str(stop) or "interrupted", getattr(stop, "advice", None)):
            if line:
                report(line, stream=sys.stderr, level=logging.WARNING)
        sys.exit(130)


def run_command(
    application: Callable[[], Any], config: str, smiles_keys: Sequence[str] = ()
) -> None:
    """A console command: the command line's SMILES values made readable by Hydra's grammar
    (:func:`quote_smiles`) and the command line checked as Hydra will compose it (a key or a
    config group option that does not exist, a Hydra plugin that is not installed: one
    ``error:`` line each, exit status 1), then Hydra's ``application`` (a ``hydra.main``)."""
    sys.argv[1:] = quote_smiles(sys.argv[1:], smiles_keys)
    message = command_line_error(config, sys.argv[1:])
    if message:
        _fail(message)
    application()


def console_command(
    config: str, run: Callable[[DictConfig], Any], smiles_keys: Sequence[str] = ()
) -> Callable[[], None]:
    """The ``main`` of a console command (``graphormer-<config>``): Hydra's application over
    ``configs/<config>.yaml`` calling ``run(cfg)`` (a user's error is one ``error:`` line,
    :func:`run_reporting_errors`), its command line checked first (:func:`run_command`)."""
    import hydra

    @hydra.main(config_path="../configs", config_name=config, version_base="1.3")
    def application(cfg: DictConfig) -> None:
        run_reporting_errors(run, cfg)

    def main() -> None:
        run_command(application, config, smiles_keys=smiles_keys)

    main.__doc__ = "The console command: Hydra's application, its command line checked first."
    return main


def plain(cfg: DictConfig) -> dict[str, Any]:
    """The composed config as plain values, every ``???`` refused first (OmegaConf's ``get``
    would read it as None and carry on)."""
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(required_message(missing))
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def checkpoint_inputs(ckpt: Any) -> dict[str, Any]:
    """What ``ckpt=`` reads, as inputs no output may overwrite, whatever ``overwrite=`` says: the
    checkpoint (or each of a list's, an ensemble's members; a folder with all it holds), its run
    folder's ``calibration.json``, ``ensemble.json`` and ``metrics.json``, and the data files
    its run read (``dataset.path``, ``dataset.split_file``)."""
    from graphormer.checkpoint import data_files
    from graphormer.portable.calibration import CALIBRATION_FILE
    from graphormer.training.members import MEMBERS_DIR

    listed = isinstance(ckpt, list | tuple)
    entries = {f"ckpt[{i}]": p for i, p in enumerate(ckpt)} if listed else {"ckpt": ckpt}
    inputs: dict[str, Any] = {}
    for key, value in entries.items():
        inputs[key] = str(value)
        path = Path(str(value)).expanduser()
        if path.is_dir():
            checkpoint = newest_checkpoint(path) or newest_checkpoint(path / MEMBERS_DIR / "0")
        else:
            checkpoint = path if path.is_file() else None
            folder = run_dir_of(path)
            for name in (CALIBRATION_FILE, ENSEMBLE_FILE, "metrics.json") if folder else ():
                inputs.setdefault(f"run's {name}", str(folder / name))
        if checkpoint is not None:
            for setting, file in data_files(checkpoint).items():
                inputs.setdefault(f"checkpoint's {setting}", file)
    return inputs


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    return f"{category.__name__}: {message}"


def _fail(message: str) -> None:
    report(f"error: {message}", stream=sys.stderr, level=logging.ERROR)
    sys.exit(1)


class RunDirGuard(Callback):
    """Hydra callback: claims the run folder before Hydra writes ``.hydra/`` into it."""

    def on_run_start(self, config: Any, **kwargs: Any) -> None:
        resume_from = config.get("ckpt_path") or None
        folders = [Path(config.hydra.run.dir).absolute()]
        # output_dir=DIR writes the run somewhere else than Hydra's folder: the same rule there.
        output_dir = OmegaConf.to_container(config, resolve=False).get("output_dir")
        if isinstance(output_dir, str) and "${" not in output_dir:
            if Path(output_dir).absolute() != folders[0]:
                folders.append(Path(output_dir).absolute())
        for number, folder in enumerate(folders):
            message = claim_run_dir(folder, resume_from=resume_from)
            if message:
                for claimed in folders[:number]:  # no new, empty folder left behind
                    discard_if_untrained(claimed)
                print(f"error: {message}", file=sys.stderr)
                sys.exit(1)


class LogDirGuard(Callback):
    """Hydra callback of the commands other than train (eval, predict, ...): their folder for
    ``.hydra/`` and the log is one that can be written, and never a training run's folder,
    whose own ``.hydra/config.yaml`` (what a resume continues) Hydra would replace."""

    def on_run_start(self, config: Any, **kwargs: Any) -> None:
        folder = Path(config.hydra.run.dir).absolute()
        problem = folder_problem(folder)
        if problem is None and (folder / RUN_MARKER).exists():
            problem = (
                "is a training run's folder: this command's .hydra/ would replace the run's own"
            )
        if problem is not None:
            print(
                f"error: hydra.run.dir={config.hydra.run.dir}: the folder {folder} {problem}; "
                "choose another with hydra.run.dir=DIR (or leave it out for a new one)",
                file=sys.stderr,
            )
            sys.exit(1)
