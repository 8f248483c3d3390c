"""The one rule for the files a command writes (issue #20): never over an input, never two
outputs on one path, never over an existing file unless ``overwrite=true``, only to regular files
(or new paths) in folders that can be written; and every file written whole or not at all (under
a temporary name, then renamed into place), so that a full disk or an interrupted run leaves no
truncated file where a good one stood."""

from __future__ import annotations

import os
import stat
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from graphormer.errors import ConfigError, DataError

__all__ = ["atomic_path", "check_outputs", "folder_problem", "not_a_file"]

PathLike = str | os.PathLike


def _resolved(path: PathLike) -> Path:
    return Path(path).expanduser().resolve()


def not_a_file(path: PathLike) -> str | None:
    """What ``path`` is when it exists as something other than a regular file or a folder (a
    device, a pipe, a socket): renaming a file onto it would replace it, and nothing would be
    written where the user meant."""
    try:
        mode = os.stat(Path(path).expanduser()).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a pipe"
    return "a socket" if stat.S_ISSOCK(mode) else "not a regular file"


def folder_problem(folder: PathLike) -> str | None:
    """Why files cannot be created in ``folder`` (made first where it does not exist yet), or
    None: the folder, or the nearest part of its path that exists, is a file or cannot be
    written (read-only, or no permission). Asked of the file system (``access``), which knows
    read-only mounts and immutable folders; nothing is written."""
    path = Path(folder).expanduser().absolute()
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        where = "" if existing == path else f" ({existing} is a file)"
        return f"is not a folder{where}"
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "" if existing == path else f" (in {existing})"
        return f"cannot be written{where}: it is read-only, or not writable by you"
    return None


def check_outputs(
    outputs: Mapping[str, PathLike | None],
    inputs: Mapping[str, PathLike | None],
    overwrite: bool,
    folders: Collection[str] = (),
) -> None:
    """Refuses, before anything is computed, outputs that would destroy a file or could not be
    written.

    Args:
        outputs: the command's output keys and paths (None: not written). A folder output
            (explain's ``output=DIR``) counts as existing when it holds anything.
        inputs: the command's input keys and paths (None: not given); a folder input protects
            everything inside it.
        overwrite: whether an existing output may be replaced.
        folders: the keys of ``outputs`` that are folders (every other output is a file).

    Raises:
        ConfigError: an output is an input (always refused), two outputs are one path, an
            output is a device or a pipe (always refused), a folder where a file is written (or
            the reverse), in a folder that cannot be written, or exists and ``overwrite`` is
            false.
    """
    given_inputs = {key: _resolved(p) for key, p in inputs.items() if p is not None}
    given_outputs = {key: _resolved(p) for key, p in outputs.items() if p is not None}
    seen: dict[Path, str] = {}
    for key, path in given_outputs.items():
        shown = outputs[key]
        for source, source_path in given_inputs.items():
            if path == source_path or (source_path.is_dir() and source_path in path.parents):
                # A key (ckpt=, input=) as typed; a file found through one (the run's
                # calibration.json) by what it is.
                where = inputs[source]
                named = f"{source} ({where})" if " " in source else f"{source}={where}"
                raise ConfigError(
                    f"{key}={shown} is the {named} it reads: writing it would destroy that "
                    f"input, whatever overwrite= says; give {key}= another path"
                )
        if path in seen:
            raise ConfigError(
                f"{seen[path]}= and {key}= are both {shown}: one would overwrite the "
                f"other; give {key}= another path"
            )
        seen[path] = key
        kind = not_a_file(path)
        if kind is not None:
            raise ConfigError(
                f"{key}={shown} is {kind}, not a file: writing would replace it; give {key}= the "
                "path of a regular file (a new one, or one to replace with overwrite=true)"
            )
        is_folder = key in folders
        if path.is_dir() and not is_folder:
            raise ConfigError(
                f"{key}={shown} is a folder; give {key}= the path of a file (one inside it, say)"
            )
        if path.is_file() and is_folder:
            raise ConfigError(f"{key}={shown} is a file; give {key}= a folder")
        problem = folder_problem(path if is_folder else path.parent)
        if problem is not None:
            where = shown if is_folder else f"the folder of {key}={shown}"
            raise ConfigError(f"{where} {problem}; give {key}= a path in a writable folder")
        if overwrite:
            continue
        if path.is_file() or (path.is_dir() and any(path.iterdir())):
            raise ConfigError(
                f"{key}={shown} already exists: give {key}= a new path, or add "
                "overwrite=true to replace it"
            )


@contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; renamed onto ``path`` when the block ends
    without an error, removed otherwise. The temporary name keeps the suffix (``np.save`` and
    pandas choose formats by it). Only a regular file (or nothing) is ever replaced: a device,
    a pipe or a folder at ``path`` is an error before anything is written."""
    path = Path(path)
    kind = "a folder" if path.is_dir() else not_a_file(path)
    if kind is not None:
        raise DataError(f"cannot write {path}: it is {kind}, not a file; give the path of a file")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.stem}.{os.getpid()}.partial{path.suffix}")
    try:
        yield partial
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
