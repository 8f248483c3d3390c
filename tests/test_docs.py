"""The docs: the generated reference is current and complete, and every command they show
composes against its command's configuration (valid keys and values) without training."""

import inspect
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from graphormer.cli import reference
from graphormer.cli.train import settings_from
from graphormer.data.sources import SOURCES
from graphormer.errors import ConfigError

from helpers import REPO, compose_config, run_script

DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
COMMANDS = set(reference.COMMANDS)
_SHELL_BLOCK = re.compile(r"^```(?:bash|sh|shell|console)\n(.*?)^```", re.M | re.S)
_INLINE = re.compile(r"`((?:python )?scripts/\w+\.py[^`]*|graphormer-\w+ [^`]*)`")
_COMMAND = re.compile(r"(?:^|/)scripts/(\w+)\.py$|^graphormer-(\w+)$")
# What the docs write where the reader puts their own value: <the checkpoint it printed>.
_PLACEHOLDER = re.compile(r"<[^<>\n]*[a-z ][^<>\n]*>")
_SHELL_STOPS = {"|", "||", "&&", ";", ">", ">>", "2>&1", "&"}


def shown_commands(text: str) -> list[str]:
    """The command lines a page shows: each line of its shell blocks (continuations joined) and
    each inline code span that runs a command."""
    lines = []
    for block in _SHELL_BLOCK.findall(text):
        lines += block.replace("\\\n", " ").splitlines()
    lines += [" ".join(span.split()) for span in _INLINE.findall(text)]
    return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]


def command_and_overrides(line: str) -> tuple[str, list[str]] | None:
    """The command (``train``, ...) a line runs and its ``KEY=VALUE`` arguments, or None."""
    words = shlex.split(_PLACEHOLDER.sub("PLACEHOLDER", line), comments=True)
    for i, word in enumerate(words):
        match = _COMMAND.search(word)
        if match and (match[1] or match[2]) in COMMANDS:
            args = []
            for arg in words[i + 1 :]:
                if arg in _SHELL_STOPS:
                    break
                args.append(arg)
            return match[1] or match[2], args
    return None


def _docs_commands() -> list[tuple[str, str]]:
    found = []
    for page in DOCS:
        for line in shown_commands(page.read_text()):
            if command_and_overrides(line) is not None:
                found.append((str(page.relative_to(REPO)), line))
    return found


def test_shown_commands_are_found():
    text = (
        "```bash\npython scripts/train.py dataset=smiles_csv \\\n    dataset.path=a.csv  # note\n"
        "# a comment\n```\nRun `graphormer-eval ckpt=<the checkpoint> split=all` then.\n"
    )
    lines = shown_commands(text)
    assert lines == [
        "python scripts/train.py dataset=smiles_csv      dataset.path=a.csv  # note",
        "graphormer-eval ckpt=<the checkpoint> split=all",
    ]
    assert command_and_overrides(lines[0]) == (
        "train",
        ["dataset=smiles_csv", "dataset.path=a.csv"],
    )
    assert command_and_overrides(lines[1]) == ("eval", ["ckpt=PLACEHOLDER", "split=all"])
    quoted = 'python scripts/predict.py ckpt=x \'smiles=["C#N","CC(=O)O"]\' > out.txt'
    assert command_and_overrides(quoted) == ("predict", ["ckpt=x", 'smiles=["C#N","CC(=O)O"]'])
    # The docs show the commands of every page that teaches them.
    pages = {page for page, _ in _docs_commands()}
    assert {"README.md", "docs/getting-started.md", "docs/guide/atom-bond-targets.md"} <= pages


def _check(command: str, overrides: list[str], tmp_path: Path) -> None:
    """Composes ``overrides`` as the command would, then checks the values a run checks first."""
    flags = [o for o in overrides if o.startswith("-")]
    overrides = [o for o in overrides if not o.startswith("-")]
    if "--help" in flags:
        return
    if "-m" in flags:
        # A sweep: each comma-separated value is one run; the first stands for all.
        overrides = [
            re.sub(r"=([^\[\]{}]*?),.*$", r"=\1", o) if "[" not in o else o for o in overrides
        ]
    if any(o.startswith("hparams_search=") for o in overrides):
        pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    if command in ("train", "prepare"):
        overrides = [*overrides, f"output_dir={tmp_path}"]
    cfg = compose_config(command, overrides)
    if command in ("train", "prepare"):
        settings = settings_from(cfg)  # every value checked, as the run checks it first
        source = SOURCES[settings.dataset["source"]]
        accepted = set(inspect.signature(source).parameters) | {"source"}
        assert set(settings.dataset) <= accepted, sorted(set(settings.dataset) - accepted)


@pytest.mark.parametrize(("page", "line"), _docs_commands())
def test_docs_command_composes(page, line, tmp_path):
    command, overrides = command_and_overrides(line)
    try:
        _check(command, overrides, tmp_path)
    except (HydraException, OmegaConfBaseException, ConfigError) as error:
        pytest.fail(f"{page}: `{line}` does not compose: {error}")


def test_reference_is_complete():
    """Every key of every composed config, of every command, has its line in the reference."""
    assert reference.undocumented() == []


def test_configuration_reference_is_current():
    page = REPO / "docs" / "reference" / "configuration.md"
    assert page.read_text() == reference.configuration_page(), (
        "docs/reference/configuration.md is not current: run python -m graphormer.cli.reference"
    )


def test_commands_reference_is_current():
    page = REPO / "docs" / "reference" / "commands.md"
    assert page.read_text() == reference.commands_page(), (
        "docs/reference/commands.md is not current: run python -m graphormer.cli.reference"
    )


def test_an_undocumented_key_is_found(monkeypatch):
    """A field without a docstring line is reported: the completeness test can fail."""
    keys = reference.train_keys()
    keys["optim"] = [k for k in keys["optim"] if k.name != "optim.lr"]
    monkeypatch.setattr(reference, "train_keys", lambda: keys)
    assert any(m.endswith(": optim.lr") for m in reference.undocumented())


def _worked_examples(page: Path) -> list[tuple[str, list[str]]]:
    """Each Python block of a page with the command lines of the shell block after it."""
    blocks = re.findall(r"^```(python|bash)\n(.*?)^```", page.read_text(), re.M | re.S)
    return [
        (code, shown_commands(f"```bash\n{after}```"))
        for (kind, code), (next_kind, after) in zip(blocks, blocks[1:], strict=False)
        if kind == "python" and next_kind == "bash"
    ]


@pytest.mark.slow
@pytest.mark.parametrize("example", [0, 1], ids=["atoms", "bonds"])
def test_worked_example_runs_as_written(example, tmp_path):
    """The atom- and bond-target examples, run as the page writes them: its Python makes the CSV,
    then each command runs, the checkpoint it printed standing in for the placeholder."""
    code, lines = _worked_examples(REPO / "docs" / "guide" / "atom-bond-targets.md")[example]
    made = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr[-3000:]
    checkpoint = None
    for line in lines:
        command, args = command_and_overrides(line)
        if checkpoint is not None:
            args = [re.sub(r"=outputs/\S*PLACEHOLDER\S*", f"={checkpoint}", a) for a in args]
        output = run_script(f"{command}.py", args, cwd=tmp_path)
        found = re.search(r"best checkpoint: (\S+)", output)
        checkpoint = found[1] if found else checkpoint
        assert checkpoint is not None, output[-2000:]
        if command == "explain":
            assert list((tmp_path / "pictures" / "mol_0").glob("*s_*.png")), output[-2000:]
        if command == "predict":
            assert re.search(r"predicted (\d+) of \1 molecules", output), output[-2000:]
