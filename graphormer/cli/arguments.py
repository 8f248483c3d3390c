"""A command's ``KEY=VALUE`` arguments before Hydra composes them: SMILES values made readable by
Hydra's grammar, and what Hydra would report as raw text or a traceback (a misspelt key or group
option, a Hydra plugin that is not installed, a value its grammar cannot read) as one message
that names the argument and the fix."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

from omegaconf import OmegaConf

__all__ = ["command_line_error", "leaves", "quote_smiles", "required_message"]

# Hydra plugins that an option of ours selects (Hydra reports a missing one as a config it cannot
# find, e.g. hydra/sweeper/optuna), each with what it is and the extra that installs it.
_HYDRA_PLUGINS = {"hydra/sweeper/optuna": ("Optuna sweeper", "optuna")}


def quote_smiles(arguments: Sequence[str], keys: Sequence[str]) -> list[str]:
    """``arguments`` with each ``KEY=VALUE`` of ``keys`` (``smiles``) quoted for Hydra, whose
    grammar refuses ``( ) = #`` and reads ``[NH4+]`` inside a list as a list: ``[S1,S2]`` (the
    outer brackets enclose the whole value) is a list of SMILES, anything else one SMILES. Items
    already quoted (``["CC(=O)O","[Na+].[Cl-]"]``) and values Hydra reads as they are (``CCO``)
    are kept."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    quoted = []
    for argument in arguments:
        key, equals, value = argument.partition("=")
        if equals and key in keys and not _is_quoted(value):
            if _is_list(value):
                items = _split_items(value[1:-1])
                value = "[" + ",".join(i if _is_quoted(i) else _quote(i) for i in items) + "]"
            else:
                try:
                    parser.parse_override(argument)
                except Exception:  # Hydra's grammar error: read it as one SMILES
                    value = _quote(value)
            argument = f"{key}={value}"
        quoted.append(argument)
    return quoted


def _is_quoted(text: str) -> bool:
    return len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'"


def _scan(text: str):
    """Each character of ``text`` with the bracket depth before it, outside quoted items
    (inside them: None)."""
    depth, quote = 0, None
    for char in text:
        if quote:
            yield char, None
            quote = None if char == quote else quote
            continue
        if char in "\"'":
            quote = char
        yield char, depth
        depth += {"[": 1, "]": -1}.get(char, 0)


def _is_list(value: str) -> bool:
    """Whether ``value`` is ``[...]`` with the first bracket closed by the last character
    (``[Na+].[Cl-]`` is one SMILES, ``[[NH4+],CCO]`` a list)."""
    if not value.startswith("[") or not value.endswith("]"):
        return False
    closed = [i for i, (c, d) in enumerate(_scan(value)) if c == "]" and d == 1]
    return bool(closed) and closed[0] == len(value) - 1


def _split_items(text: str) -> list[str]:
    items, start = [], 0
    for i, (char, depth) in enumerate(_scan(text)):
        if char == "," and depth == 0:
            items.append(text[start:i].strip())
            start = i + 1
    last = text[start:].strip()
    return [*items, last] if items or last else []


def _quote(text: str) -> str:
    quote = "'" if '"' in text else '"'
    # Hydra reads a backslash before the closing quote as escaping it: double those.
    stripped = text.rstrip("\\")
    return quote + stripped + "\\" * 2 * (len(text) - len(stripped)) + quote


def command_line_error(config: str, arguments: Sequence[str]) -> str | None:
    """What is wrong with the ``KEY=VALUE`` arguments of the command whose config is ``config``
    (``train``, ``eval``, ...), found by composing them once as Hydra will (each value of a
    ``-m`` sweep once); None when they compose, or when Hydra reports the problem itself."""
    from hydra import initialize_config_dir

    from graphormer.cli import CONFIGS

    flags = [a for a in arguments if a.startswith("-")]
    if any(flag not in ("-m", "--multirun") for flag in flags):
        return None  # --help, --cfg, --info ...: Hydra's own business
    overrides = [a for a in arguments if not a.startswith("-")]
    variants = _sweep_variants(overrides) if flags else [overrides]
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        for variant in variants:
            message = _composition_error(config, variant)
            if message:
                return message
    return None


def required_message(missing: Sequence[str]) -> str:
    """What to say of config values left ``???`` (``ckpt``, ``dataset.name``)."""
    verb = "are" if len(missing) > 1 else "is"
    passed = " ".join(f"{key}=..." for key in missing)
    return f"{', '.join(missing)} {verb} required: pass {passed} on the command line (see --help)"


def _sweep_variants(overrides: list[str]) -> list[list[str]]:
    """The command lines a ``-m`` sweep composes, enough to try every value once: each sweep at
    its first value, then each further value of one sweep with the others at their first."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    values = []
    for override in overrides:
        try:
            parsed = parser.parse_override(override)
            if not parsed.is_sweep_override():
                values.append([override])
                continue
            key = parsed.get_key_element()
            try:
                values.append([f"{key}={v}" for v in parsed.sweep_string_iterator()])
            except Exception:  # an interval (Optuna's): its start stands for it
                values.append([f"{key}={parsed.value().start}"])
        except Exception:  # not Hydra's grammar: Hydra says so
            values.append([override])
    first = [choices[0] for choices in values]
    variants = [first]
    for i, choices in enumerate(values):
        variants += [first[:i] + [choice] + first[i + 1 :] for choice in choices[1:]]
    return variants


def _composition_error(config: str, overrides: list[str]) -> str | None:
    from hydra import compose
    from hydra.errors import (
        ConfigCompositionException,
        MissingConfigException,
        OverrideParseException,
    )
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    try:
        # A ??? left unset: Hydra resolves its run folder (outputs/${dataset.name}/...) before
        # the command starts, and would stop there with a traceback (dataset=tu alone).
        values = leaves(OmegaConf.to_container(compose(config, overrides=overrides)))
        missing = sorted(key for key, value in values.items() if value == "???")
        return required_message(missing) if missing else None
    except OverrideParseException as error:
        return _unreadable_argument(overrides, error)
    except MissingConfigException as error:
        return _missing_option(config, error, overrides)
    except ConfigCompositionException as error:
        cause = error.__cause__
        key = getattr(cause, "full_key", None)
        if isinstance(cause, ConfigKeyError | ConfigAttributeError) and key:
            return _unknown_key(config, key, overrides)
        return None  # Hydra reports it, as it does


def _unreadable_argument(overrides: list[str], error: Exception) -> str:
    """An argument that Hydra's grammar cannot read (``dataset.path=mols(1).csv``), and how to
    quote it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    culprit = overrides[0] if overrides else ""
    for override in overrides:
        try:
            parser.parse_override(override)
        except Exception:
            culprit = override
            break
    key, _, value = culprit.partition("=")
    reason = str(error).strip().splitlines()[0] if str(error).strip() else "a grammar error"
    return (
        f"{culprit} cannot be read as KEY=VALUE ({reason}): a value holding ( ) [ ] {{ }} = , "
        f"or spaces needs quotes inside the shell's, e.g. '{key}=\"{value}\"'"
    )


def _missing_option(config: str, error: Any, overrides: list[str]) -> str | None:
    """A config group option that does not exist (``dataset=ogbg-molhiw``), named with the
    closest options; or one that names a Hydra plugin that is not installed."""
    from hydra import compose
    from hydra.errors import MissingConfigException

    missing = str(error.missing_cfg_file or "")
    group, _, option = missing.rpartition("/")
    if not group:
        return None
    if missing in _HYDRA_PLUGINS:
        plugin, extra = _HYDRA_PLUGINS[missing]
        given = chosen = f"{group}={option}"
        for override in overrides:  # the argument whose option selects the plugin
            others = [o for o in overrides if o != override]
            try:
                compose(config, overrides=others)
            except MissingConfigException:
                continue
            except Exception:
                pass
            chosen = override
            break
        return (
            f"{chosen} needs Hydra's {plugin} ({given}), which is not installed: "
            f"pip install 'graphormer[{extra}]'"
        )
    options = sorted(error.options or [])
    close = difflib.get_close_matches(option, options, n=2, cutoff=0.8)
    hint = f"did you mean {' or '.join(f'{group}={c}' for c in close)}? " if close else ""
    return (
        f"{group}={option} is not an option of {group}: {hint}the options are {', '.join(options)}"
    )


def _unknown_key(config: str, key: str, overrides: list[str]) -> str | None:
    """A key that does not exist, named with the keys close to it."""
    from hydra import compose
    from hydra.errors import ConfigCompositionException

    others = [a for a in overrides if not a.lstrip("+~").startswith(key + "=")]
    try:
        known = leaves(OmegaConf.to_container(compose(config, overrides=others)))
    except ConfigCompositionException:
        return None
    parent, _, name = key.rpartition(".")
    below = [k.removeprefix(parent + ".") if parent else k for k in known if _under(k, parent)]
    siblings = sorted({k.split(".")[0] for k in below})
    close = [f"{parent}.{c}" if parent else c for c in difflib.get_close_matches(name, siblings)]
    close = close or difflib.get_close_matches(key, sorted(known), n=3, cutoff=0.8)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    listing = f"the keys of {parent} are {', '.join(siblings)} " if parent else ""
    return (
        f"{key} is not a key of this config: {hint}{listing}"
        f"(a new key is added on purpose with +{key}=VALUE)"
    )


def _under(key: str, prefix: str) -> bool:
    return not prefix or key.startswith(prefix + ".")


def leaves(values: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config's values by dotted key (``trainer.max_epochs``)."""
    if not isinstance(values, dict) or not values:
        return {prefix: values}
    found: dict[str, Any] = {}
    for key, value in values.items():
        found.update(leaves(value, f"{prefix}.{key}" if prefix else str(key)))
    return found
