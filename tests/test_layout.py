"""The shape of the package: imports run one way (no file imports, directly or through others, a
file that imports it back), Hydra lives in the command-line layer alone, and no function
shadows the module it is defined in."""

import ast
import importlib
import pkgutil
from pathlib import Path

import graphormer

PACKAGE = Path(graphormer.__file__).parent
# The one import upward: ``from graphormer import Predictor`` is resolved on first use.
LAZY_EXPORTS = {("graphormer", "graphormer.inference.predictor")}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports(path: Path, known: set[str]) -> set[str]:
    """The graphormer modules a file imports, anywhere in it (function-level imports count)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            # The deepest graphormer module the name refers to (``from graphormer import
            # checkpoint`` is the module graphormer.checkpoint).
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name.startswith("graphormer"):
                found.add(name)
    return found


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    edges = {}
    for name, path in found.items():
        targets = imports(path, known) - {name}
        edges[name] = {t for t in targets if (name, t) not in LAZY_EXPORTS}
    return edges


def test_the_imports_form_no_circle():
    edges = graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for target in sorted(edges.get(node, ())):
            if state.get(target) == 1:
                cycle = stack[stack.index(target) :] + [target]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)


def test_hydra_and_omegaconf_live_in_the_command_line_layer():
    allowed = ("graphormer.cli", "graphormer.testing")
    for name, path in modules().items():
        if name.startswith(allowed):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                names.append(getattr(node, "module", None) or "")
                assert not any(n.split(".")[0] in ("hydra", "omegaconf") for n in names), name


def test_layers_import_downward_only():
    below = {
        "graphormer.models": ("graphormer.data", "graphormer.training", "graphormer.inference"),
        "graphormer.data": ("graphormer.training", "graphormer.inference", "graphormer.interop"),
        "graphormer.interop": ("graphormer.training", "graphormer.inference", "graphormer.cli"),
        "graphormer.training": ("graphormer.inference", "graphormer.cli"),
        "graphormer.inference": ("graphormer.cli",),
    }
    edges = graph()
    for layer, forbidden in below.items():
        for name, targets in edges.items():
            if name == layer or name.startswith(layer + "."):
                bad = sorted(t for t in targets if t.startswith(forbidden))
                assert not bad, f"{name} imports {bad}"


def test_no_package_attribute_shadows_its_submodule():
    for info in pkgutil.walk_packages(graphormer.__path__, "graphormer."):
        if not info.ispkg:
            continue
        package = importlib.import_module(info.name)
        for sub in pkgutil.iter_modules(package.__path__):
            value = package.__dict__.get(sub.name)
            if value is not None:
                assert getattr(value, "__name__", None) == f"{info.name}.{sub.name}", (
                    f"{info.name}.{sub.name} is {value!r}, not the module"
                )


def test_no_test_module_imports_another():
    """Shared helpers live in tests/helpers.py and tests/conftest.py, not in test modules."""
    for path in Path(__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            assert not any(n.startswith("test_") for n in names), f"{path.name} imports {names}"
