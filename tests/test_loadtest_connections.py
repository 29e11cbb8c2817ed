"""Each Locust user of loadtests/bls.py has a gRPC connection of its own.

grpcio shares one connection among a process's channels to the same target, and a
Kubernetes Service balances connections: with the default options every user of a worker
would send on one connection, to one pod. A listener that only counts the connections it
accepts shows the difference (the calls themselves fail: it speaks no HTTP/2).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from tests.venvs import REPO_ROOT

CLIENTS = 3


# Run apart: importing a locustfile imports Locust, which monkey-patches the process
# (gevent) and would wedge pytest's own threads.
CONNECT = """
import os
import sys
sys.path.insert(0, "loadtests")
import tritonclient.grpc
from bls import grpc_channel_args

address, own = sys.argv[1], sys.argv[2] == "own"
clients = [tritonclient.grpc.InferenceServerClient(
    address, channel_args=grpc_channel_args() if own else None) for _ in range(int(sys.argv[3]))]
for client in clients:
    try:
        client.is_server_live(client_timeout=0.5)
    except Exception:  # the listener speaks no HTTP/2: every call fails, as intended
        pass
# Closing grpc channels under gevent at exit can hang (see bls.py's _OPEN_CLIENTS): the
# connections are counted by now.
os._exit(0)
"""


class Listener:
    """A TCP listener on loopback that accepts, counts and holds connections."""

    def __init__(self) -> None:
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.socket.settimeout(0.2)
        self.address = f"127.0.0.1:{self.socket.getsockname()[1]}"
        self.accepted: list[socket.socket] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._accept, name="count-connections", daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                connection, _ = self.socket.accept()
            except TimeoutError:
                continue
            self.accepted.append(connection)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        for connection in self.accepted:
            connection.close()
        self.socket.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    listening = Listener()
    yield listening
    listening.close()


def connections_of(listener: Listener, options: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", CONNECT, listener.address, options, str(CLIENTS)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return len(listener.accepted)


def test_each_user_opens_a_connection_of_its_own(listener: Listener) -> None:
    assert connections_of(listener, "own") == CLIENTS


def test_without_it_grpcio_shares_one_connection(listener: Listener) -> None:
    # The contrast that makes the option necessary (tritonclient's defaults).
    assert connections_of(listener, "default") == 1
