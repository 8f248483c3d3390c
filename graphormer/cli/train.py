"""``graphormer-train`` (``python scripts/train.py``): train a Graphormer.

graphormer-train [dataset=...] [model=...] [trainer=...] [experiment=...] [KEY=VALUE ...]
graphormer-train ckpt_path=RUN/checkpoints/last.ckpt [trainer.max_epochs=N]   # resume that run
"""

from __future__ import annotations

import copy
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

from graphormer.cli.arguments import leaves
from graphormer.cli.common import plain, run_command, run_reporting_errors
from graphormer.console import command, report
from graphormer.errors import ConfigError
from graphormer.rundir import ENSEMBLE_FILE, discard_if_untrained, is_first_process, run_dir_of

if TYPE_CHECKING:
    from graphormer.training.settings import RunSettings

__all__ = ["SAFE_ON_RESUME", "build_loggers", "main", "resume_values", "run", "settings_from"]

# What a resume may change without breaking its exactness: how long it goes on, how it reports,
# how many loader processes feed it, where the same dataset lives. Everything else (model, data,
# batching, seed, optimiser, loss, FLAG, precision, devices) is the run's own.
SAFE_ON_RESUME = (
    "ckpt_path",
    "resume_strict",
    "output_dir",
    "logger",
    "pretrained",
    "pretrained_strict",
    "pretrained_head",
    "require_pretrained",
    "trainer.max_epochs",
    "trainer.max_steps",
    "trainer.enable_progress_bar",
    "trainer.log_every_n_steps",
    "trainer.num_sanity_val_steps",
    "datamodule.num_workers",
    "datamodule.eval_batch_size",
    "dataset.root",
)
_ABSENT = object()


def settings_from(cfg: DictConfig) -> RunSettings:
    """The checked settings of a composed ``train`` config."""
    from graphormer.training.settings import RunSettings

    return RunSettings.from_dict(plain(cfg))


def build_loggers(cfg: DictConfig, folder: Path | None = None) -> list[Any]:
    """The logger the ``logger=`` group chose on the command line (none for ``logger=null``).
    Built from the command line's config only, never from a stored one. ``folder``: an ensemble
    member's or a fold's run folder, which its logs go to instead of ``output_dir``."""
    if not cfg.get("logger"):
        return []
    logger = cfg.logger
    _check_logger_package(str(logger.get("_target_", "")))
    if folder is not None and "save_dir" in logger:
        logger = OmegaConf.merge(logger, {"save_dir": str(folder)})
    if folder is not None and "run_name" in logger and Path(folder) != Path(cfg.output_dir):
        # An ensemble member's or a fold's own MLflow run, named after its folder.
        name = str(Path(folder).relative_to(cfg.output_dir))
        logger = OmegaConf.merge(logger, {"run_name": name})
    if str(logger.get("tracking_uri") or "").startswith("file:"):
        # MLflow 3 keeps its local file store only on request; ./mlruns is the documented
        # default here (a database backend: logger.tracking_uri=sqlite:///mlflow.db).
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    built = hydra.utils.instantiate(logger)
    if type(built).__name__ == "MLFlowLogger":
        # The composed config as the run's params (the module logs its own hyper-parameters
        # too; "config/" keeps their names apart).
        built.log_hyperparams({"config": plain(cfg)})
    return [built]


# The packages a logger needs, and the extra that installs them.
_LOGGER_PACKAGES = {
    "lightning.pytorch.loggers.MLFlowLogger": ("mlflow", "mlflow"),
    "lightning.pytorch.loggers.TensorBoardLogger": ("tensorboard", None),
}


def _check_logger_package(target: str) -> None:
    import importlib.util

    package, extra = _LOGGER_PACKAGES.get(target, (None, None))
    if package is None or importlib.util.find_spec(package) is not None:
        return
    install = f"pip install 'graphormer[{extra}]'" if extra else f"pip install {package}"
    raise ConfigError(
        f"logger={target.rpartition('.')[2]} needs the {package} package, which is not "
        f"installed: {install} (or choose logger=csv)"
    )


def _command_line() -> tuple[list[str], dict[str, Any]] | None:
    """The keys the command line set (``model``, ``trainer.max_epochs``; Hydra's own left out)
    and the config groups' choices, or None outside a Hydra application."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if not HydraConfig.initialized():
        return None
    hydra_cfg = HydraConfig.get()
    parsed = OverridesParser.create().parse_overrides(list(hydra_cfg.overrides.task))
    keys = [o.key_or_group.replace("/", ".") for o in parsed]
    choices = OmegaConf.to_container(hydra_cfg.runtime.choices)
    return [k for k in keys if k != "hydra" and not k.startswith("hydra.")], dict(choices)


def _under(key: str, prefix: str) -> bool:
    return not prefix or key == prefix or key.startswith(prefix + ".")


def _put(values: dict[str, Any], key: str, value: Any) -> None:
    *parents, last = key.split(".")
    for part in parents:
        values = values.setdefault(part, {})
    if value is _ABSENT:
        values.pop(last, None)
    else:
        values[last] = value


def _stored_run(ckpt_path: str, current: dict[str, Any]) -> tuple[dict, dict | None, str]:
    """The resumed run's composed config (plain values), its group choices (None if unknown) and
    where they were read. ``RUN/.hydra/config.yaml`` is read as data (YAML), never instantiated;
    without it, the checkpoint's own settings stand in for the groups it records."""
    from graphormer import checkpoint as checkpoints
    from graphormer.training.run import absolute_paths

    record = checkpoints.load(ckpt_path)  # a missing, corrupt or altered file fails here
    run = record.run
    if not run.has_data:
        raise ConfigError(
            f"ckpt_path={ckpt_path} holds converted weights, not a training run to resume: "
            f"fine-tune from it with pretrained={ckpt_path}"
        )
    run_dir = run_dir_of(ckpt_path)
    config_file = run_dir / ".hydra" / "config.yaml" if run_dir else None
    if config_file is not None and config_file.is_file():
        stored = OmegaConf.load(config_file)
        network = run.network
        with open_dict(stored):
            stored.output_dir = current["output_dir"]  # resolved by this run, not the old one
            # The network is the checkpoint's own: pretrained= may have taken it from another
            # checkpoint after Hydra wrote this file (datamodule.max_hops follows it).
            stored.model = OmegaConf.merge(stored.model, network)
        values = OmegaConf.to_container(stored, resolve=True)
        choices = None
        hydra_file = config_file.with_name("hydra.yaml")
        if hydra_file.is_file():
            found = OmegaConf.select(OmegaConf.load(hydra_file), "hydra.runtime.choices")
            choices = OmegaConf.to_container(found) if found is not None else None
        where = str(config_file)
    else:
        values = copy.deepcopy(current)
        values["model"] = run.network
        values["datamodule"] = dict(run.datamodule)
        for key in ("loss", "normalize_targets"):
            values[key] = run.training[key]
        for key in values.get("optim", {}):
            if key in run.training:
                values["optim"][key] = run.training[key]
        values["flag"] = {**values.get("flag", {}), **(run.trained("flag") or {"m": 0})}
        choices = None
        where = f"{ckpt_path} (no .hydra/config.yaml beside it: seed and trainer from this command)"
    # The checkpoint's dataset settings hold absolute paths: found from any working folder.
    values["dataset"] = absolute_paths(dict(run.dataset))
    return values, choices, where


def resume_values(cfg: DictConfig, given: list[str], choices: dict[str, Any]) -> dict[str, Any]:
    """The settings of a resume: the resumed run's own, with the command line's changes that
    keep it exact (:data:`SAFE_ON_RESUME`); any other change is refused, naming the key, unless
    ``resume_strict=false``. The result is also written to the run folder's
    ``.hydra/config.yaml``, the composed config a later resume continues from."""
    from graphormer.training.run import absolute_paths

    current = plain(cfg)
    current["dataset"] = absolute_paths(dict(current["dataset"]))
    stored, stored_choices, where = _stored_run(current["ckpt_path"], current)
    old, new = leaves(stored), leaves(current)
    changes: dict[str, tuple[Any, Any]] = {}  # key -> (the run's value, the command line's)
    refused: list[str] = []
    for key in given:
        top = key.split(".")[0]
        if top in ("ckpt_path", "resume_strict", "output_dir", "logger"):
            continue
        if key in choices and stored_choices is not None:  # a group: compare the choice
            if stored_choices.get(key) == choices.get(key):
                continue
            refused.append(
                f"{key}={choices.get(key)} (the run has {key}={stored_choices.get(key)})"
            )
        known = any(_under(leaf, key) for leaf in (*old, *new))
        prefix = key if known else ""  # experiment=NAME sets keys anywhere
        for leaf in sorted(set(old) | set(new)):
            if leaf.split(".")[0] in ("ckpt_path", "resume_strict", "output_dir", "logger"):
                continue
            # A group brings its defaults: only its unsafe settings count as a change (a
            # repeated dataset=NAME must not reset dataset.root to the default).
            if key in choices and _safe(leaf):
                continue
            before, after = old.get(leaf, _ABSENT), new.get(leaf, _ABSENT)
            if leaf == "model.num_layers" and after == "auto" and isinstance(before, int):
                continue  # the number auto chose when the run started: no change
            if _under(leaf, prefix) and before != after:
                changes[leaf] = (before, after)
    unsafe = [k for k in changes if not _safe(k)]
    refused += [f"{k}={_show(changes[k][1])} (the run has {_show(changes[k][0])})" for k in unsafe]
    if refused and current["resume_strict"]:
        raise ConfigError(
            f"{refused[0]} would change the run this resumes: a resume continues it exactly, "
            "so it keeps the run's "
            f"model, data, seed and optimiser (read from {where}); drop it, or pass "
            "resume_strict=false to change it anyway (the run then no longer continues exactly)"
        )
    merged = copy.deepcopy(stored)
    for key in ("ckpt_path", "resume_strict", "output_dir", "logger"):
        merged[key] = current.get(key)
    for key, (_, after) in changes.items():
        _put(merged, key, after)
    run_dir = Path(current["output_dir"])
    report(f"resuming {Path(current['ckpt_path']).resolve()} with its run's settings ({where})")
    if changes:
        shown = ", ".join(f"{k} {_show(a)} -> {_show(b)}" for k, (a, b) in changes.items())
        note = "" if not unsafe else " (resume_strict=false: no longer an exact continuation)"
        report(f"changed by this command: {shown}{note}")
    if is_first_process():  # the other ranks of a launch read it; one writes, whole
        config_file = run_dir / ".hydra" / "config.yaml"
        config_file.parent.mkdir(parents=True, exist_ok=True)
        _REPLACED[config_file] = config_file.read_bytes() if config_file.is_file() else None
        partial = config_file.with_name(f"config.yaml.{os.getpid()}.partial")
        OmegaConf.save(OmegaConf.create(merged), partial)
        os.replace(partial, config_file)
    return merged


# The run folder's config.yaml as it was before this resume rewrote it: put back if the resume
# fails (an interrupted one keeps the new one, which its printed command continues).
_REPLACED: dict[Path, bytes | None] = {}


def _restore_replaced_config() -> None:
    for path, before in _REPLACED.items():
        if before is None:
            path.unlink(missing_ok=True)
        else:
            path.write_bytes(before)
    _REPLACED.clear()


def _safe(key: str) -> bool:
    return any(_under(key, safe) for safe in SAFE_ON_RESUME)


def _show(value: Any) -> str:
    return "(absent)" if value is _ABSENT else repr(value)


def take_pretrained_architecture(cfg: DictConfig, given: list[str]) -> None:
    """``pretrained=FILE``: the network's architecture is the checkpoint's, as converted or
    trained, unless the command line chose a model (``model=NAME`` replaces it, ``model.KEY=``
    sets that key); ``load_pretrained`` then checks that the weights fit. Dropouts stay the
    config's (a recipe's); the number of tasks and the output layer come from the new dataset."""
    from graphormer import checkpoint as checkpoints
    from graphormer.training.pretrained import architecture

    if "model" in given:
        return
    path = str(cfg.pretrained)
    if not Path(path).is_file():
        return  # load_pretrained says so, in its words
    chosen = {k.split(".", 1)[1] for k in given if k.startswith("model.")}
    taken = {k: v for k, v in architecture(checkpoints.load(path).model).items() if k not in chosen}
    with open_dict(cfg):
        cfg.model = OmegaConf.merge(cfg.model, taken)
    keys = ("num_layers", "hidden_dim", "ffn_dim", "num_heads", "pre_layernorm")
    shown = " ".join(f"{k}={_value(cfg.model.get(k))}" for k in keys)
    kept = f"; from this command: model.{', model.'.join(sorted(chosen))}" if chosen else ""
    report(
        f"pretrained={path}: the network's architecture is the checkpoint's ({shown}, ...)"
        f"{kept}; give model=NAME to choose another"
    )


def _value(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def run(cfg: DictConfig) -> dict[str, Any]:
    """Trains as the composed config says; returns what ``metrics.json`` holds. Under the
    command line, a resume (``ckpt_path=``) continues with its run's own settings and
    ``pretrained=`` takes the checkpoint's architecture (see :func:`resume_values`)."""
    from graphormer.training.run import RunInterrupted
    from graphormer.training.settings import RunSettings

    command_line = _command_line()
    if command_line is None:  # called as a library function: the config says everything
        return _train(settings_from(cfg), cfg)
    _flush_subnormals_on_cpu(cfg)
    given, choices = command_line
    if cfg.get("ckpt_path") and Path(str(cfg.ckpt_path), ENSEMBLE_FILE).is_file():
        return _resume_ensemble(cfg, given)
    if cfg.get("ckpt_path"):
        settings = RunSettings.from_dict(resume_values(cfg, given, choices))
    else:
        if cfg.get("pretrained"):
            take_pretrained_architecture(cfg, given)
        settings = settings_from(cfg)
    try:
        return _train(settings, cfg)
    except RunInterrupted as stop:
        if settings.ensemble.size > 1 and not settings.cv.enabled:  # the whole ensemble
            stop.advice = (
                f"resume with: {command('train')} ckpt_path={Path(settings.output_dir).resolve()}"
            )
        elif stop.checkpoint is not None:  # the run's own settings come with it: nothing else
            stop.advice = f"resume with: {command('train')} ckpt_path={stop.checkpoint}"
        raise


def _resume_ensemble(cfg: DictConfig, given: list[str]) -> dict[str, Any]:
    """``ckpt_path=RUN`` of an ensemble: its own composed config (``RUN/.hydra/config.yaml``,
    read as data), finished members kept, interrupted ones resumed, the others trained, then the
    ensemble scored again. Only what keeps a resume exact may change on the command line."""
    from graphormer.training.ensemble import train_ensemble
    from graphormer.training.run import RunInterrupted
    from graphormer.training.settings import RunSettings

    folder = Path(str(cfg.ckpt_path)).expanduser().resolve()
    config = folder / ".hydra" / "config.yaml"
    if not config.is_file():
        raise ConfigError(
            f"ckpt_path={folder} is an ensemble without its composed config ({config}): resume "
            "its members one by one with ckpt_path=RUN/members/<i>/checkpoints/last.ckpt"
        )
    unsafe = [k for k in given if not _safe(k) and k != "ensemble.allow_missing"]
    if unsafe:
        raise ConfigError(
            f"{unsafe[0]} would change the ensemble this resumes: a resume keeps its model, data, "
            "seeds and optimiser; drop it"
        )
    stored = OmegaConf.load(config)
    current = plain(cfg)
    with open_dict(stored):
        stored.output_dir = str(folder)
        for key in given:  # the safe changes of this command line
            if key.split(".")[0] not in ("ckpt_path", "resume_strict", "output_dir", "logger"):
                OmegaConf.update(stored, key, OmegaConf.select(OmegaConf.create(current), key))
        stored.ckpt_path = None
    settings = RunSettings.from_dict(OmegaConf.to_container(stored, resolve=True))
    report(f"resuming the ensemble {folder} with its run's settings ({config})")
    try:
        return train_ensemble(settings, lambda member: build_loggers(cfg, member), resume=True)
    except RunInterrupted as stop:
        stop.advice = f"resume with: {command('train')} ckpt_path={folder}"
        raise


def _flush_subnormals_on_cpu(cfg: DictConfig) -> None:
    """On a CPU, every torch thread of the command's process reads and writes subnormal floats as
    zero (see :func:`graphormer.training.run.subnormals_flushed`): set here, before torch starts
    its threads, which inherit the mode. Training sets it for its own thread only, since a library
    caller's threads are theirs; this process ends with the command."""
    import torch

    from graphormer.devices import on_gpu

    if not on_gpu(cfg.get("trainer", {}).get("accelerator")):
        torch.set_flush_denormal(True)


def _train(settings: RunSettings, cfg: DictConfig) -> dict[str, Any]:
    """One run, an ensemble (``ensemble.size``) or a resampling (``cv.*``) of either."""
    from graphormer.training.experiment import fit

    return fit(settings, lambda folder: build_loggers(cfg, folder))


def _task(cfg: DictConfig) -> float:
    from hydra.core.hydra_config import HydraConfig

    started = time.time()
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    try:
        results = run_reporting_errors(run, cfg)
    except BaseException as error:
        # A failed or interrupted start leaves no run folder with nothing trained in it; a
        # resume that trained no epoch leaves its run as it found it (an interrupted one keeps
        # the settings its printed command continues with).
        if not discard_if_untrained(run_dir):
            saved = [p.stat().st_mtime for p in (run_dir / "checkpoints").glob("*.ckpt")]
            if not any(when >= started for when in saved):
                interrupted = isinstance(error, KeyboardInterrupt) or (
                    isinstance(error, SystemExit) and error.code == 130
                )
                if not interrupted:
                    _restore_replaced_config()
                if str(hydra_cfg.output_subdir).startswith(".hydra/resume-"):
                    shutil.rmtree(run_dir / hydra_cfg.output_subdir, ignore_errors=True)
        raise
    return objective(results)


def objective(results: dict[str, Any]) -> float:
    """What a hyperparameter search optimises (Hydra's Optuna sweeper reads the task function's
    return value): the run's best validation metric, the mean over folds with ``cv.*``."""
    valid = results["valid"]
    if "mean" in valid:
        return float(valid["mean"])
    return float(valid[results["metric"]])


_hydra_main = hydra.main(config_path="../configs", config_name="train", version_base="1.3")(_task)


def main() -> None:
    """The console command: Hydra's application, its command line checked first (a misspelt key
    or group option named with its close matches, where Hydra would advise appending it with
    ``+`` or list its search path)."""
    run_command(_hydra_main, "train")


if __name__ == "__main__":
    main()
