"""Every third-party import is declared in pyproject.toml, in the extra of the code that imports it.

The base install is the operator's image: what `tritonscale operator` and `tritonscale tune`
import, nothing more. Each other part of the repository names the extras it may rely on
(`NEEDS`); an import whose distribution is in neither the base nor those extras fails here,
so a new undeclared import cannot slip in. Every import counts, also those inside functions.
"""

from __future__ import annotations

import ast
import sys
from functools import cache
from importlib import metadata
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tritonscale.cli import EXTRA_MODULES

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11+")

REPO_ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]

# The extras each part of the repository may use besides the base install; the longest
# matching path wins. Every Python file must fall under one of these.
NEEDS: dict[str, tuple[str, ...]] = {
    "operator/tritonscale": (),
    "operator/tritonscale/local/triton_server.py": ("server",),
    "operator/tritonscale/local/loadgen.py": ("load",),
    "operator/tritonscale/local/demo.py": ("server", "load", "reports"),
    "operator/tritonscale/reports": ("reports",),
    # Models run in the Python of the environment that starts tritonserver.
    "models": ("server",),
    "loadtests": ("load",),
    "loadtests/soak.py": ("server", "load", "reports"),
    "loadtests/bench": ("server", "load", "reports"),
    # The simulator runs the policy in virtual time and draws its summary: no server, no load.
    "loadtests/sim": ("reports",),
    "charts/tools": (),
    # Development tooling (the local cluster, the demo on it): run from a checkout's .venv.
    "hack": (),
    # `make lock`: pip-compile and packaging come with the test extra.
    "hack/lock.py": ("test",),
    # The dashboards' generator (grafana-foundation-sdk), run from a checkout's .venv.
    "dashboards": ("reports",),
    # The chart's links to models/ and loadtests/, and its pod scripts, which run in the
    # operator's image.
    "charts/tritonscale/files/models": ("server",),
    "charts/tritonscale/files/loadtests": ("load",),
    "charts/tritonscale/files/scripts": (),
    "tests": ("all", "test"),
}
# Imports that are no distribution of PyPI: the project's own packages, and the module
# Triton's Python backend gives the models at run time.
FIRST_PARTY = {"tritonscale", "tests", "loadtests", "hack", "triton_python_backend_utils"}


def requirement_names(requirements: list[str]) -> set[str]:
    """Distribution names of a requirement list; `tritonscale[a,b]` stands for those extras."""
    names = set()
    for text in requirements:
        requirement = Requirement(text)
        if canonicalize_name(requirement.name) == "tritonscale":
            for extra in requirement.extras:
                names |= requirement_names(PROJECT["optional-dependencies"][extra])
        else:
            names.add(canonicalize_name(requirement.name))
    return names


BASE = requirement_names(PROJECT["dependencies"])
EXTRAS = {
    extra: requirement_names(requirements)
    for extra, requirements in PROJECT["optional-dependencies"].items()
}


# Imports a file makes only when the machine has them, and works without (inside
# `try: ... except ImportError`): the GPU check keeps a GPU busy with whichever it finds.
OPTIONAL_IMPORTS = {"loadtests/gpu_check.py": {"torch", "cupy"}}


def needs_of(path: Path) -> tuple[str, ...] | None:
    relative = path.relative_to(REPO_ROOT).as_posix()
    matches = [key for key in NEEDS if relative == key or relative.startswith(key + "/")]
    return NEEDS[max(matches, key=len)] if matches else None


def top_level_imports(path: Path) -> set[str]:
    """The top-level module of every absolute import in `path`, wherever the statement sits."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def third_party(names: set[str]) -> set[str]:
    return {
        name
        for name in names
        if name not in sys.stdlib_module_names and name != "__future__" and name not in FIRST_PARTY
    }


@cache
def distributions_of(module: str) -> frozenset[str]:
    return frozenset(canonicalize_name(d) for d in packages_distributions().get(module, ()))


# Output and tool folders (.gitignore) hold no code of ours.
NOT_SOURCES = {"__pycache__", "build", "reports", "out"}
SOURCES = sorted(
    path
    for path in REPO_ROOT.rglob("*.py")
    if not any(
        part.startswith(".") or part in NOT_SOURCES or part.endswith(".egg-info")
        for part in path.relative_to(REPO_ROOT).parts
    )
)


@pytest.mark.parametrize("path", SOURCES, ids=lambda path: path.relative_to(REPO_ROOT).as_posix())
def test_every_import_is_declared_in_the_extra_of_its_code(path: Path) -> None:
    extras = needs_of(path)
    assert extras is not None, "add this file's folder to NEEDS with the extras it may use"
    declared = BASE.union(*(EXTRAS[extra] for extra in extras))
    undeclared = []
    optional = OPTIONAL_IMPORTS.get(path.relative_to(REPO_ROOT).as_posix(), set())
    for module in sorted(third_party(top_level_imports(path)) - optional):
        distributions = distributions_of(module)
        if not distributions:
            undeclared.append(f"{module} (not installed here: which distribution is it?)")
        elif not distributions & declared:
            undeclared.append(f"{module} (from {', '.join(sorted(distributions))})")
    where = " + ".join(["base", *extras])
    assert undeclared == [], f"imports not declared in pyproject.toml ({where}): {undeclared}"


def test_the_base_install_holds_only_what_the_base_code_imports() -> None:
    """No dead weight in the operator's image: each base requirement is imported somewhere."""
    imported = set()
    for path in SOURCES:
        if needs_of(path) == () and path.is_relative_to(REPO_ROOT / "operator"):
            imported |= third_party(top_level_imports(path))
    provided = set().union(*(distributions_of(module) for module in imported))
    assert BASE - provided == set()


@pytest.mark.parametrize("extra", sorted(EXTRA_MODULES))
def test_the_modules_a_command_checks_come_from_the_extra_it_names(extra: str) -> None:
    for module in EXTRA_MODULES[extra]:
        assert distributions_of(module) & EXTRAS[extra], f"{module} is not in [{extra}]"


def test_extras_name_no_unknown_extra() -> None:
    assert {"server", "load", "reports", "all", "test"} <= set(EXTRAS)
    assert EXTRAS["all"] == EXTRAS["server"] | EXTRAS["load"] | EXTRAS["reports"]
    assert not {"locust", "matplotlib", "nvidia-pytriton"} & BASE
    # numpy is in the base only because tritonclient brings it anyway (the healer imports it).
    if "numpy" in BASE:
        assert any(
            requirement.startswith("numpy") for requirement in metadata.requires("tritonclient")
        )
