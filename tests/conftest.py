"""Shared fixtures: one real tritonserver on models/, and one wheel, for the whole session;
private tritonservers for a module of its own; the fast lane.

Tests marked `unit` are the fast lane (`make check`, `pytest -m unit`): pure and quick, they
start no process (no tritonserver, Prometheus, promtool, helm or kubectl). The hook below holds
them to that, so the lane stays fast and a test that needs a real server is moved out of it
with a clear message rather than slowing it down.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.tooling import require_local_triton
from tests.venvs import REPO_ROOT, Environment, build_wheel
from tritonscale.local.triton_server import LocalTriton


@pytest.fixture(scope="session")
def triton() -> Iterator[LocalTriton]:
    """A real tritonserver on the project's models/, every model loaded, free ports."""
    require_local_triton()
    with LocalTriton(http_port=0, grpc_port=0, metrics_port=0) as server:
        yield server


@pytest.fixture(scope="module")
def make_module_triton(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[list[str]], LocalTriton]]:
    """A factory of tritonservers private to the test module: `make_module_triton(models)`
    starts one on those models of models/ (free ports, a short exit timeout, its log in a
    temporary folder), stopped after the module's last test. For tests that may leave a
    server broken (a dead stub hangs the requests streaming from it): neither the session's
    `triton` nor another module's server is touched.

        @pytest.fixture(scope="module")
        def server(make_module_triton) -> LocalTriton:
            return make_module_triton(["square_int32", "bls_decoupled_sync"])
    """
    with ExitStack() as servers:

        def start(models: list[str]) -> LocalTriton:
            require_local_triton()
            folder = tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2])
            return servers.enter_context(
                LocalTriton(
                    http_port=0,
                    grpc_port=0,
                    metrics_port=0,
                    models=models,
                    exit_timeout_s=3,
                    log_path=folder / "tritonserver.log",
                )
            )

        yield start


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    """Refuse to start a process in a `unit` test: its fixtures, its body and its teardown."""
    if item.get_closest_marker("unit") is None:
        return (yield)
    popen = subprocess.Popen
    test_thread = threading.current_thread()

    def refuse(args: object, *rest: object, **kwargs: object) -> subprocess.Popen:
        # Threads of the session's own (the cluster tests' background Kubernetes build)
        # start processes while unit tests run: only the test's thread is refused.
        if threading.current_thread() is not test_thread:
            return popen(args, *rest, **kwargs)
        program = args[0] if isinstance(args, (list, tuple)) else args
        raise AssertionError(
            f"{item.nodeid} is marked unit but starts a process ({program}): "
            "unit tests start none; drop its unit mark"
        )

    subprocess.Popen = refuse  # type: ignore[assignment, misc]
    try:
        return (yield)
    finally:
        subprocess.Popen = popen  # type: ignore[misc]


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package's wheel, built once per session from the checkout."""
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="session")
def base_install(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Environment:
    """A fresh environment with the wheel's base install (no extras), installed as the
    operator's image installs it: the lock with hashes, then the wheel alone."""
    lock = REPO_ROOT / "operator" / "requirements.txt"
    path = tmp_path_factory.mktemp("base") / "venv"
    environment = Environment.create(path, "--require-hashes", "--requirement", str(lock))
    environment.install("--no-deps", str(wheel))
    return environment
