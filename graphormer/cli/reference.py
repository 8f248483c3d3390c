"""The docs' generated reference: every configuration key of every command, and every command's
``--help``.

    python -m graphormer.cli.reference            # writes docs/reference/{configuration,commands}.md
    python -m graphormer.cli.reference --check    # exit 1 when those pages are not current

The keys are read from the schema that validates them, never from a list kept by hand:
``graphormer-train`` from :class:`~graphormer.training.settings.RunSettings` and its groups,
:class:`~graphormer.models.GraphormerConfig` (``model.*``) and each dataset source's arguments
(``dataset.*``, :data:`~graphormer.data.sources.SOURCES`); a key's meaning is its line in the
docstring of the class that checks it. The other commands validate their own short configs in
code, so their keys and meanings come from their packaged YAML (the comment beside each key).
:func:`undocumented` lists the keys of any composed config that have no line here: a test keeps
it empty, so a key cannot exist without its reference line.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import inspect
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from graphormer.cli import CONFIGS

__all__ = [
    "COMMANDS",
    "Key",
    "commands_page",
    "configuration_page",
    "main",
    "train_keys",
    "undocumented",
]

# Each command: its packaged config and its script (the console command is graphormer-<name>).
COMMANDS = ("train", "eval", "predict", "explain", "convert", "prepare", "export", "serve")
# The commands whose keys are checked in their code, not by a schema: each key's meaning is its
# YAML comment, and each one's line on the page below.
PLAIN_COMMANDS = {
    "eval": "`graphormer-eval` (`python scripts/eval.py`) scores a checkpoint on a split.",
    "predict": "`graphormer-predict` (`python scripts/predict.py`) predicts molecules or graphs.",
    "explain": "`graphormer-explain` (`python scripts/explain.py`) draws attention pictures.",
    "convert": "`graphormer-convert` (`python scripts/convert.py`) converts published weights.",
    "export": "`graphormer-export` (`python scripts/export.py`) writes a trained model as ONNX.",
    "serve": "`graphormer-serve` (`python scripts/serve.py`) serves a model over HTTP.",
}
# train.yaml's groups, in the order its defaults list gives them.
GROUPS = ("dataset", "model", "trainer", "optim", "logger", "experiment", "hparams_search")
# Keys that belong to Hydra itself (its run folder, its sweeper), not to a command.
_HYDRA = ("hydra",)

REPO = Path(__file__).resolve().parents[2]
PAGES = REPO / "docs" / "reference"


@dataclasses.dataclass(frozen=True)
class Key:
    """One configuration key: its dotted name, default, type and meaning."""

    name: str
    default: Any
    type: str
    meaning: str


# -- meanings from docstrings ----------------------------------------------------------------

_ENTRY = re.compile(r"^(?P<names>[\w*]+(?:, [\w*]+)*)(?: \((?P<type>[^)]*)\))?: ?(?P<text>.*)$")


def _plain_text(text: str) -> str:
    """A docstring's reStructuredText as one Markdown line, without issue numbers."""
    text = re.sub(r":(?:class|func|data|meth|attr|obj|mod):`~[\w.]*?(\w+)`", r"`\1`", text)
    text = re.sub(r":(?:class|func|data|meth|attr|obj|mod):`([^`]+)`", r"`\1`", text)
    text = text.replace("``", "`")
    text = re.sub(r"\s*\((?:issue )?#\d+\)", "", text)
    text = re.sub(r"[,;] issue #\d+", "", text)
    text = re.sub(r"\s*\(default: (?:[^()]|\([^()]*\))*\)\.?", "", text)
    text = re.sub(r"\s+", " ", text).strip()
    # Outside code spans, <name> would be read as an HTML tag and vanish.
    parts = text.split("`")
    parts[::2] = [part.replace("<", "&lt;").replace(">", "&gt;") for part in parts[::2]]
    return "`".join(parts).replace("|", "\\|")


def docstring_entries(obj: Any, types: dict[str, str] | None = None) -> dict[str, str]:
    """The ``Args:`` / ``Attributes:`` entries of a Google-style docstring: name -> text (an entry
    naming several, ``a, b: ...``, gives each the same text). An entry's own type,
    ``name (int or auto): ...``, goes into ``types`` when given."""
    doc = inspect.cleandoc(obj.__doc__ or "")
    entries: dict[str, str] = {}
    section = False
    names: list[str] = []
    for line in doc.splitlines():
        if line.strip() in ("Args:", "Attributes:", "Arguments:"):
            section, names = True, []
            continue
        if not section:
            continue
        if line and not line.startswith(" "):
            section, names = False, []  # the next section or paragraph
            continue
        body = line[4:] if line.startswith("    ") else line.strip()
        match = _ENTRY.match(body) if not body.startswith(" ") else None
        if match:
            names = match["names"].split(", ")
            for name in names:
                entries[name] = match["text"]
                if types is not None and match["type"]:
                    types[name] = match["type"]
        elif names and body.strip():
            for name in names:
                entries[name] = f"{entries[name]} {body.strip()}"
    return {name: _plain_text(text) for name, text in entries.items()}


# -- meanings from YAML comments -------------------------------------------------------------


def yaml_comments(path: Path) -> dict[str, str]:
    """Each key of a YAML config file -> the comment beside it (continued on the following
    comment-only lines indented as far), dotted for nested keys."""
    comments: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    last: str | None = None
    column = -1
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("- "):
            continue
        indent = len(line) - len(line.lstrip())
        if stripped.startswith("#"):
            if last is not None and indent == column:
                comments[last] = f"{comments[last]} {stripped.lstrip('#').strip()}".strip()
            continue
        match = re.match(r"^([\w.\-/@]+):(.*)$", stripped)
        if not match:
            last = None
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key = ".".join([*(name for _, name in stack), match[1]])
        stack.append((indent, match[1]))
        value, _, comment = match[2].partition(" #")
        last, column = key, line.index(" #") + 1 if comment else -1
        comments[key] = comment.strip()
    return {key: _plain_text(text) for key, text in comments.items()}


# -- the schema of graphormer-train ----------------------------------------------------------


def _compose(name: str, overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    return copy.deepcopy(_composed(name, tuple(overrides)))


@functools.cache
def _composed(name: str, overrides: tuple[str, ...]) -> dict[str, Any]:
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose(name, overrides=list(overrides))
    values = OmegaConf.to_container(cfg, resolve=False)
    return {k: v for k, v in values.items() if k not in _HYDRA}


def options(group: str) -> list[str]:
    """The options of a config group of train.yaml (``dataset`` -> ``ogbg-molhiv``, ...)."""
    return sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))


def _flatten(values: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value and name not in _OPEN_VALUES:
            yield from _flatten(value, f"{name}.")
        else:
            yield name, value


# Keys whose value is a mapping of the user's choosing, documented as one key.
_OPEN_VALUES = ("loss_weights", "loss_weights_end")


def _annotation(value: Any) -> str:
    text = value if isinstance(value, str) else getattr(value, "__name__", str(value))
    return text.replace("typing.", "").replace("|", "\\|")


def _default(value: Any) -> Any:
    if value is dataclasses.MISSING or value is inspect.Parameter.empty:
        return "required"
    return value


def _dataclass_keys(cls: type, prefix: str, defaults: Mapping[str, Any]) -> list[Key]:
    types: dict[str, str] = {}
    meanings = docstring_entries(cls, types)
    keys = []
    for f in dataclasses.fields(cls):
        if f.name == "extra":
            continue
        default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        name = f"{prefix}{f.name}"
        keys.append(
            Key(
                name,
                defaults.get(name, _default(default)),
                _annotation(types.get(f.name, f.type)),
                meanings.get(f.name, ""),
            )
        )
    return keys


def source_keys(kind: str) -> list[Key]:
    """``dataset.*`` of one dataset source: its constructor's arguments and ``source``."""
    from graphormer.data.sources import SOURCES

    cls = SOURCES[kind]
    meanings = docstring_entries(cls)
    keys = [Key("dataset.source", kind, "str", "the dataset source that reads these settings")]
    for name, parameter in inspect.signature(cls).parameters.items():
        keys.append(
            Key(
                f"dataset.{name}",
                _default(parameter.default),
                _annotation(parameter.annotation),
                meanings.get(name, ""),
            )
        )
    return keys


def logger_keys(option: str) -> list[Key]:
    """``logger.*`` of one logger option: the arguments of the Lightning logger it builds."""
    values = _compose("train", [f"logger={option}"])["logger"]
    target = values.get("_target_", "")
    comments = yaml_comments(CONFIGS / "logger" / f"{option}.yaml")
    keys = []
    for name, value in values.items():
        meaning = comments.get(name) or (
            "the Lightning logger this option builds"
            if name == "_target_"
            else f"an argument of `{target.rsplit('.', 1)[-1]}` (Lightning)"
        )
        keys.append(Key(f"logger.{name}", value, _type_of(value), meaning))
    return keys


def train_keys() -> dict[str, list[Key]]:
    """Every key ``graphormer-train`` takes, by group: ``config`` (the top level), ``datamodule``,
    ``optim``, ``flag``, ``ensemble``, ``cv``, ``trainer``, ``model``, ``dataset:<source>`` and
    ``logger:<option>``. Defaults are the command's own (train.yaml's default composition)
    where it sets the key, else the schema's."""
    from graphormer.data.sources import SOURCES
    from graphormer.models import GraphormerConfig
    from graphormer.training.settings import (
        CrossValidationSettings,
        DataModuleSettings,
        EnsembleSettings,
        FingerprintKernelSettings,
        FlagSettings,
        OptimSettings,
        RunSettings,
        TrainerSettings,
    )

    defaults = dict(_flatten(_compose("train")))
    groups = {
        "datamodule": DataModuleSettings,
        "optim": OptimSettings,
        "flag": FlagSettings,
        "ensemble": EnsembleSettings,
        "cv": CrossValidationSettings,
        "fingerprint_kernel": FingerprintKernelSettings,
        "trainer": TrainerSettings,
    }
    top = [
        key
        for key in _dataclass_keys(RunSettings, "", defaults)
        if key.name not in (*groups, "dataset", "model")
    ]
    top.append(
        Key("logger", "csv", "group", "where metrics are logged: an option of the logger group")
    )
    keys = {"config": top}
    for group, cls in groups.items():
        keys[group] = _dataclass_keys(cls, f"{group}.", defaults)
    keys["model"] = _dataclass_keys(GraphormerConfig, "model.", defaults)
    for kind in SOURCES:
        keys[f"dataset:{kind}"] = source_keys(kind)
    for option in options("logger"):
        keys[f"logger:{option}"] = logger_keys(option)
    return keys


@functools.cache
def _trainer_arguments() -> set[str]:
    import lightning.pytorch as pl

    return set(inspect.signature(pl.Trainer).parameters)


def _documented_train(keys: dict[str, list[Key]], name: str, values: Mapping[str, Any]) -> bool:
    """Whether the key ``name`` of a composed train config (its ``dataset`` and ``logger``
    given) has a line with a meaning in the reference."""
    if name.startswith("dataset."):
        group = keys.get(f"dataset:{values.get('dataset', {}).get('source')}", [])
    elif name.startswith("logger."):
        target = (values.get("logger") or {}).get("_target_")
        group = [
            key
            for option in options("logger")
            for key in keys[f"logger:{option}"]
            if _composed("train", (f"logger={option}",))["logger"].get("_target_") == target
        ]
    elif name.startswith("trainer."):
        group = keys["trainer"]
        if name not in {key.name for key in group}:
            # Any other Lightning Trainer argument passes through, checked by Lightning.
            return name.split(".", 1)[1] in _trainer_arguments()
    else:
        group = [key for group in keys.values() for key in group]
    return any(key.name == name and key.meaning for key in group)


def undocumented() -> list[str]:
    """Keys of any composed config of any command (train with every option of every group, and
    each other command's config) that have no line, or no meaning, in the reference."""
    keys = train_keys()
    missing: set[str] = set()
    compositions = [[]] + [
        [f"{group}={option}"]
        for group in GROUPS
        for option in options(group)
        if group != "hparams_search"
    ]
    for overrides in compositions:
        values = _compose("train", overrides)
        for name, _ in _flatten(values):
            if not _documented_train(keys, name, values):
                missing.add(f"train {' '.join(overrides)}: {name}")
    for command in PLAIN_COMMANDS:
        comments = yaml_comments(CONFIGS / f"{command}.yaml")
        for name, _ in _flatten(_compose(command)):
            if not comments.get(name):
                missing.add(f"{command}: {name}")
    return sorted(missing)


# -- the pages -------------------------------------------------------------------------------


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_scalar(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_scalar(v)}" for k, v in value.items()) + "}"
    return str(value)


def _value(value: Any) -> str:
    if isinstance(value, str) and value in ("required", "???"):
        return "required"
    if isinstance(value, str) and value == _PER_OPTION:
        return value
    return f"`{_scalar(value)}`".replace("|", "\\|")


# A dataset key whose default differs between the options of one source.
_PER_OPTION = "set by each option"


def _type_of(value: Any) -> str:
    """The type of a key that only a YAML file declares, from its default."""
    if value is None or value == "???":
        return ""
    return type(value).__name__


def _table(keys: list[Key]) -> list[str]:
    lines = ["| key | default | type | meaning |", "|---|---|---|---|"]
    for key in keys:
        kind = f"`{key.type}`" if key.type else ""
        lines.append(f"| `{key.name}` | {_value(key.default)} | {kind} | {key.meaning} |")
    return [*lines, ""]


def _first_comment(path: Path) -> str:
    """The first sentence of a config file's opening comment."""
    words = []
    for line in path.read_text().splitlines():
        text = line.strip()
        if text.startswith("# @package"):
            continue
        if not text.startswith("#") or text.startswith("#  "):
            break  # the comment ends, or an example command begins
        words.append(text.lstrip("#").strip())
    paragraph = " ".join(words)
    sentence = re.split(r"(?<=[.:])\s+(?=[A-Z(])", paragraph, maxsplit=1)[0]
    return _plain_text(sentence.rstrip(":"))


def _option_default(key: Key, names: list[str]) -> Key:
    """A dataset key with the default its options give it: theirs where they agree."""
    field = key.name.split(".", 1)[1]
    values = [_compose("train", [f"dataset={n}"])["dataset"].get(field, key.default) for n in names]
    if all(v == values[0] for v in values):
        return dataclasses.replace(key, default=values[0])
    return dataclasses.replace(key, default=_PER_OPTION)


def _dataset_options() -> dict[str, list[str]]:
    by_source: dict[str, list[str]] = {}
    for option in options("dataset"):
        source = _compose("train", [f"dataset={option}"])["dataset"]["source"]
        by_source.setdefault(source, []).append(option)
    return by_source


def configuration_page() -> str:
    """docs/reference/configuration.md."""
    keys = train_keys()
    out = [
        "# Configuration",
        "",
        "<!-- Generated by `python -m graphormer.cli.reference` from the schema that validates",
        "     the keys; do not edit by hand. A test fails when this page is not current. -->",
        "",
        "Every key every command takes, with its default, its type and what it means. Give any",
        "of them on the command line as `KEY=VALUE` (nested keys with dots: `optim.lr=1e-4`);",
        "a group (`dataset=`, `model=`, ...) picks one of its options, whose keys you may then",
        "override. A misspelt key, or a value of the wrong type or range, stops the command with",
        "one `error:` line naming the key and what is allowed.",
        "",
        "This page is generated by `python -m graphormer.cli.reference` from the classes that",
        "check the values: `RunSettings` and its groups (`graphormer/training/settings.py`),",
        "`GraphormerConfig` (`graphormer/models/graphormer.py`) and each dataset source",
        "(`graphormer/data/sources/`).",
        "",
        "## graphormer-train",
        "",
        "`graphormer-train` (`python scripts/train.py`) composes `graphormer/configs/train.yaml`:",
        "one option of each group, then the keys below. `graphormer-prepare` takes the same.",
        "",
        "### Groups",
        "",
        "| group | options (default first) |",
        "|---|---|",
    ]
    train_defaults = {"dataset": "ogbg-molhiv", "model": "graphormer_slim", "trainer": "cpu"}
    train_defaults |= {"optim": "adamw", "logger": "csv"}
    for group in GROUPS:
        names = options(group)
        first = train_defaults.get(group)
        ordered = ([first] if first else []) + [n for n in names if n != first]
        shown = ", ".join(f"`{n}`" for n in ordered)
        default = "" if first else " (none by default)"
        out.append(f"| `{group}=` | {shown}{default} |")
    out += ["", "Each option's own file says what it is:", ""]
    out += ["| option | |", "|---|---|"]
    for group in GROUPS:
        for option in options(group):
            out.append(
                f"| `{group}={option}` | {_first_comment(CONFIGS / group / f'{option}.yaml')} |"
            )
    out += ["", "### Top-level keys", ""]
    out += _table(keys["config"])
    titles = {
        "datamodule": "Batching and preprocessing: `datamodule.*`",
        "optim": "The optimiser: `optim.*`",
        "flag": "FLAG: `flag.*`",
        "ensemble": "Ensembles: `ensemble.*`",
        "cv": "Cross-validation: `cv.*`",
        "fingerprint_kernel": "The fingerprint kernel: `fingerprint_kernel.*`",
        "trainer": "The trainer: `trainer.*`",
        "model": "The model: `model.*`",
    }
    notes = {
        "trainer": [
            "Any other argument of Lightning's `Trainer` may be given too "
            "(`trainer.limit_train_batches=0.1`); Lightning checks it. The arguments the run "
            "sets itself (callbacks, logger, plugins, its root folder) are refused.",
            "",
        ],
        "model": [
            "Defaults are the default preset's (`model=graphormer_slim`); each `model=` option "
            "sets its own. The feature sizes and task counts (`atom_feature_dims`, `num_tasks`, "
            "...) come from the data when left null, and are saved with the checkpoint.",
            "",
        ],
    }
    for group, title in titles.items():
        out += [f"### {title}", "", *notes.get(group, []), *_table(keys[group])]
    out += [
        "### The dataset: `dataset.*`",
        "",
        "`dataset.source` names the class that reads the dataset; each `dataset=` option sets",
        "it and the keys below are that source's. Defaults are the source's own; an option may",
        "set others (see its file under `graphormer/configs/dataset/`).",
        "",
    ]
    by_source = _dataset_options()
    for kind, names in by_source.items():
        shown = ", ".join(f"`dataset={n}`" for n in names)
        rows = [_option_default(key, names) for key in keys[f"dataset:{kind}"]]
        out += [f"#### `source: {kind}`", "", f"Options: {shown}.", "", *_table(rows)]
    out += ["### Logging: `logger.*`", ""]
    for option in options("logger"):
        out += [f"#### `logger={option}`", "", *_table(keys[f"logger:{option}"])]
    for command, text in PLAIN_COMMANDS.items():
        comments = yaml_comments(CONFIGS / f"{command}.yaml")
        rows = [
            Key(name, value, _type_of(value), comments.get(name, ""))
            for name, value in _flatten(_compose(command))
        ]
        out += [f"## graphormer-{command}", "", text, "", *_table(rows)]
    return "\n".join(out).rstrip() + "\n"


def command_helps() -> dict[str, str]:
    """What ``python scripts/<command>.py --help`` prints, for each command (run at once)."""
    running = {
        command: subprocess.Popen(
            [sys.executable, str(REPO / "scripts" / f"{command}.py"), "--help"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for command in COMMANDS
    }
    helps = {}
    for command, process in running.items():
        out, err = process.communicate()
        if process.returncode != 0:
            raise RuntimeError(f"scripts/{command}.py --help failed: {err.strip()}")
        helps[command] = out.rstrip()
    return helps


def commands_page(helps: Mapping[str, str] | None = None) -> str:
    """docs/reference/commands.md: each command's ``--help``, captured from the command."""
    out = [
        "# Commands",
        "",
        "<!-- Generated by `python -m graphormer.cli.reference`; do not edit by hand. -->",
        "",
        "Each command is installed as `graphormer-<name>` and runs the same as",
        "`python scripts/<name>.py`; both take `KEY=VALUE` overrides (see",
        "[Configuration](configuration.md)). This page is each command's `--help`, as the",
        "command prints it (`python -m graphormer.cli.reference` captures it).",
        "",
    ]
    helps = command_helps() if helps is None else helps
    for command in COMMANDS:
        text = helps[command]
        out += [f"## graphormer-{command}", "", "```text", text, "```", ""]
    return "\n".join(out).rstrip() + "\n"


def pages() -> dict[Path, str]:
    return {
        PAGES / "configuration.md": configuration_page(),
        PAGES / "commands.md": commands_page(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the pages are stale")
    args = parser.parse_args(argv)
    stale = []
    for path, text in pages().items():
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(REPO)}")
    for path in stale:
        print(
            f"error: {path.relative_to(REPO)} is not current: run python -m graphormer.cli.reference"
        )
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
