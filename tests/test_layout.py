"""The package's layout is its architecture: the layers import only downwards, and nothing cycles.

    core (the pure policy)  <-  triton, metrics (adapters)  <-  control (the tick)
        <-  drivers (kopf, tune)  <-  local, reports  <-  cli

Every import counts, also those inside functions and under `if TYPE_CHECKING:`. The
development tooling beside it (hack/) holds to the same: no cycle, and no module reaching
into another's private names.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[1] / "operator" / "tritonscale"

# What each subpackage may import from the others (itself always).
ALLOWED = {
    "core": set(),
    "triton": {"core"},
    "metrics": {"core", "triton"},
    "control": {"core", "triton", "metrics"},
    "drivers": {"core", "triton", "metrics", "control"},
    "local": {"core", "triton", "metrics", "control", "drivers", "reports"},
    "reports": {"metrics"},
    "cli": {"core", "triton", "metrics", "control", "drivers", "local", "reports"},
}
# Modules of the policy core import no third-party library either: it is pure.
CORE_MAY_IMPORT = {
    "__future__",
    "bisect",
    # The spec is defined once as pydantic models; pydantic does no I/O.
    "pydantic",
    "pydantic_core",
    # The spec's CEL rules, evaluated as the API server evaluates them; no I/O either.
    "celpy",
    "collections",
    "copy",
    "dataclasses",
    "enum",
    "functools",
    "itertools",
    "math",
    "re",
    "statistics",
    "types",
    "typing",
}


def module_name(path: Path, root: Path = PACKAGE.parent) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module name `path` imports, absolute, wherever the import statement sits."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            # `from tritonscale.x import y` may import the module tritonscale.x.y
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}
GRAPH = {
    name: {imported for imported in imports_of(path) if imported in MODULES and imported != name}
    for name, path in MODULES.items()
}


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_only_go_down_the_layers(module: str) -> None:
    own = layer(module)
    if own is None:
        return  # tritonscale/__init__.py: constants only
    wrong = sorted(
        imported
        for imported in GRAPH[module]
        if layer(imported) not in (None, own) and layer(imported) not in ALLOWED[own]
    )
    assert wrong == [], f"{module} ({own}) imports {wrong}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if layer(m) == "core"))
def test_the_policy_core_is_pure(module: str) -> None:
    outside = sorted(
        name
        for name in imports_of(MODULES[module])
        if not name.startswith("tritonscale") and name.split(".")[0] not in CORE_MAY_IMPORT
    )
    assert outside == [], f"{module} imports {outside}: the policy core does no I/O"


def cycles_in(graph: Mapping[str, set[str]]) -> list[str]:
    """Every import cycle of `graph` (module -> the modules it imports), as "a -> b -> a"."""
    cycles = []

    def visit(module: str, path: list[str]) -> None:
        for imported in sorted(graph[module]):
            if imported in path:
                cycles.append(" -> ".join([*path[path.index(imported) :], imported]))
            elif imported not in done:
                visit(imported, [*path, imported])
        done.add(module)

    done: set[str] = set()
    for module in sorted(graph):
        if module not in done:
            visit(module, [module])
    return cycles


def test_no_import_cycles() -> None:
    assert cycles_in(GRAPH) == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_the_package_imports_no_development_tooling(module: str) -> None:
    """hack/ (the local cluster, the demo on it) is development tooling beside the package:
    an installed tritonscale has no `hack` to import."""
    tooling = sorted(n for n in imports_of(MODULES[module]) if n.split(".")[0] == "hack")
    assert tooling == [], f"{module} imports {tooling}"


def test_every_subpackage_is_known() -> None:
    subpackages = {path.name for path in PACKAGE.iterdir() if (path / "__init__.py").is_file()}
    assert subpackages == set(ALLOWED) - {"cli"}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_the_package_reads_no_file_outside_itself(module: str) -> None:
    """Installed, the package sits in site-packages: a path climbing out of it from `__file__`
    would point into site-packages (or, from a checkout, into the checkout). Files beside a
    module (package data) are fine; everything else comes from the user or the current
    directory."""
    lines = MODULES[module].read_text().splitlines()
    climbing = [
        number
        for number, line in enumerate(lines, start=1)
        if "__file__" in line and re.search(r"\.parents\b|\.parent\.parent\b|\.\.", line)
    ]
    assert climbing == [], f"{module} builds a path outside the package on lines {climbing}"


# ---- hack/: the development tooling beside the package

HACK = PACKAGE.parents[1] / "hack"
HACK_MODULES = {module_name(path, HACK.parent): path for path in sorted(HACK.rglob("*.py"))}
HACK_GRAPH = {
    name: {
        imported for imported in imports_of(path) if imported in HACK_MODULES and imported != name
    }
    for name, path in HACK_MODULES.items()
}


def test_hack_has_no_import_cycles() -> None:
    """Each tooling module imports only what lies below it: the cluster brings up the node,
    the node never the cluster; what both need lies beneath them."""
    assert cycles_in(HACK_GRAPH) == []


def private_names_taken(path: Path, modules: Mapping[str, Path]) -> list[str]:
    """`module._name` and `from module import _name` in `path`, for the modules of `modules`
    (dunder names aside: `__file__` and the like are for everyone)."""
    tree = ast.parse(path.read_text())
    bound: dict[str, str] = {}  # a name in `path` -> the module it stands for
    taken = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in modules and alias.asname:
                    bound[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                if f"{node.module}.{alias.name}" in modules:
                    bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                elif node.module in modules and is_private(alias.name):
                    taken.append(f"from {node.module} import {alias.name}")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in bound
            and is_private(node.attr)
        ):
            taken.append(f"{bound[node.value.id]}.{node.attr} (line {node.lineno})")
    return taken


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@pytest.mark.parametrize("module", sorted(HACK_MODULES))
def test_hack_modules_use_each_others_public_names_only(module: str) -> None:
    """What two tooling modules share is public in the module below them; a private name
    taken across is a helper that has not found its place yet."""
    taken = private_names_taken(HACK_MODULES[module], HACK_MODULES)
    assert taken == [], f"{module} takes private names of other modules: {taken}"
