"""The one rule for the files a command writes (issue #20): never over an input, never two
outputs on one path, never over an existing file unless ``overwrite=true``; and every file
written whole or not at all (under a temporary name, then renamed into place), so that a full
disk or an interrupted run leaves no truncated file where a good one stood."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from graphormer.errors import ConfigError

__all__ = ["atomic_path", "check_outputs"]

PathLike = str | os.PathLike


def _resolved(path: PathLike) -> Path:
    return Path(path).expanduser().resolve()


def check_outputs(
    outputs: Mapping[str, PathLike | None],
    inputs: Mapping[str, PathLike | None],
    overwrite: bool,
) -> None:
    """Refuses, before anything is computed, outputs that would destroy a file.

    Args:
        outputs: the command's output keys and paths (None: not written). A folder output
            (explain's ``output=DIR``) counts as existing when it holds anything.
        inputs: the command's input keys and paths (None: not given).
        overwrite: whether an existing output may be replaced.

    Raises:
        ConfigError: an output is an input (always refused), two outputs are one path, or an
            output exists and ``overwrite`` is false.
    """
    given_inputs = {key: _resolved(p) for key, p in inputs.items() if p is not None}
    given_outputs = {key: _resolved(p) for key, p in outputs.items() if p is not None}
    seen: dict[Path, str] = {}
    for key, path in given_outputs.items():
        for source, source_path in given_inputs.items():
            if path == source_path or (source_path.is_dir() and source_path in path.parents):
                raise ConfigError(
                    f"{key}={outputs[key]} is the {source}={inputs[source]} it reads: writing "
                    f"it would destroy that input; give {key}= another path"
                )
        if path in seen:
            raise ConfigError(
                f"{seen[path]}= and {key}= are both {outputs[key]}: one would overwrite the "
                f"other; give {key}= another path"
            )
        seen[path] = key
        if overwrite:
            continue
        exists = path.is_file() or (path.is_dir() and any(path.iterdir()))
        if exists:
            raise ConfigError(
                f"{key}={outputs[key]} already exists: give {key}= a new path, or add "
                "overwrite=true to replace it"
            )


@contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; renamed onto ``path`` when the block ends
    without an error, removed otherwise. The temporary name keeps the suffix (``np.save`` and
    pandas choose formats by it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.stem}.{os.getpid()}.partial{path.suffix}")
    try:
        yield partial
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
