"""`tritonscale serve` listens on loopback only, and stops cleanly: every model unloaded, well
before Triton's exit timeout, no shared memory left in /dev/shm, and its ports free again at
once for the next server (`make demo` right after it).

One real `tritonscale serve` runs for the module; the tests read what it said and left.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import netstat
from tests.test_local_triton import write_model
from tests.tooling import require_local_triton
from tritonscale.local.ports import free_ports, port_is_taken
from tritonscale.local.triton_server import SHARED_MEMORY

MODELS = ("echo", "echo_two")
READY_TIMEOUT_S = 240
STOP_TIMEOUT_S = 60


@dataclass
class ServeRun:
    ports: dict[str, int]  # HTTP, gRPC, metrics
    output: str  # everything serve printed
    returncode: int
    log: str  # Triton's own log
    listening: dict[str, list[netstat.IPAddress]]  # while serving, by port name
    regions_serving: list[str]  # its shared-memory regions while serving
    regions_after: list[str]  # and after the stop
    time_wait_on_http_port: bool  # a connection the server closed waits in TIME_WAIT
    taken_after: dict[str, bool]  # what the port check says right after the stop


def _read_until(process: subprocess.Popen[str], marker: str, timeout_s: float) -> str:
    """serve's output up to the line holding marker; fails naming what it waited for."""
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, name="serve-output", daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            pytest.fail(f"tritonscale serve did not print {marker!r} in {timeout_s} s: {seen}")
        if line is None:
            pytest.fail(f"tritonscale serve exited before printing {marker!r}: {seen}")
        seen.append(line)
        if marker in line:
            return "".join(seen)


def _regions(prefix: str) -> list[str]:
    return sorted(path.name for path in SHARED_MEMORY.glob(f"{prefix}*"))


@pytest.fixture(scope="module")
def serve_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeRun]:
    require_local_triton()
    repository = tmp_path_factory.mktemp("repository")
    for name in MODELS:
        write_model(repository, name)
    ports = dict(zip(("http", "grpc", "metrics"), free_ports(3), strict=True))
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tritonscale.cli",
            "serve",
            f"--model-repository={repository}",
            *(f"--{name}-port={port}" for name, port in ports.items()),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output = _read_until(process, "model-repository API key", READY_TIMEOUT_S)
        log_path = Path(re.search(r"^  log +(\S+)$", output, re.MULTILINE).group(1))
        # Triton reports its Python backend's settings, the regions' name prefix among them.
        prefix = re.search(r'"shm-region-prefix-name":"([^"]+)"', log_path.read_text()).group(1)
        listening = {name: netstat.sockets(port, netstat.LISTEN) for name, port in ports.items()}
        regions_serving = _regions(prefix)
        # A client's request with `Connection: close`; the client closes its end only after
        # the server's (end of stream), so the server closed first and its side of the
        # connection waits in TIME_WAIT on the server's own port, whatever the timing.
        with socket.create_connection(("127.0.0.1", ports["http"]), timeout=10) as client:
            client.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = b""
            while chunk := client.recv(4096):
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 200"), answer
        os.kill(process.pid, signal.SIGTERM)
        rest, _ = process.communicate(timeout=STOP_TIMEOUT_S)
    finally:
        if process.poll() is None:  # only when something above failed: never leave it running
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
    yield ServeRun(
        ports=ports,
        output=output + rest,
        returncode=process.returncode,
        log=log_path.read_text(errors="replace"),
        listening=listening,
        regions_serving=regions_serving,
        regions_after=_regions(prefix),
        time_wait_on_http_port=bool(netstat.sockets(ports["http"], netstat.TIME_WAIT)),
        taken_after={name: port_is_taken(port) for name, port in ports.items()},
    )


def test_serve_says_where_it_listens_and_where_its_log_is(serve_run: ServeRun) -> None:
    http = serve_run.ports["http"]
    assert f"  HTTP    http://127.0.0.1:{http}\n" in serve_run.output
    assert f"  gRPC    127.0.0.1:{serve_run.ports['grpc']}\n" in serve_run.output
    assert f"  metrics http://127.0.0.1:{serve_run.ports['metrics']}/metrics\n" in serve_run.output
    assert serve_run.returncode == 0, serve_run.output


def test_every_port_listens_on_loopback_only(serve_run: ServeRun) -> None:
    for name, addresses in serve_run.listening.items():
        assert addresses, f"nothing listens on the {name} port {serve_run.ports[name]}"
        assert all(netstat.is_loopback(address) for address in addresses), (name, addresses)


def test_a_stop_unloads_every_model(serve_run: ServeRun) -> None:
    unloaded = re.findall(r"successfully unloaded '(\w+)' version 1", serve_run.log)
    assert sorted(unloaded) == sorted(MODELS), serve_run.log[-3000:]


def test_a_stop_waits_for_no_connection_and_no_exit_timeout(serve_run: ServeRun) -> None:
    assert "HTTP service connections" not in serve_run.log, serve_run.log[-3000:]
    assert "Exit timeout expired" not in serve_run.log, serve_run.log[-3000:]


def test_a_stop_leaves_no_shared_memory_region(serve_run: ServeRun) -> None:
    assert len(serve_run.regions_serving) >= len(MODELS)  # one per instance while serving
    assert serve_run.regions_after == []


def test_the_ports_are_free_at_once_for_the_next_server(serve_run: ServeRun) -> None:
    # The server closed the connections it was asked to: they wait in TIME_WAIT on its port,
    # which must not make the next server's port check refuse.
    assert serve_run.time_wait_on_http_port
    assert serve_run.taken_after == {"http": False, "grpc": False, "metrics": False}
