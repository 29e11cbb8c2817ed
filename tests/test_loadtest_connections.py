"""The gRPC connections of loadtests/bls.py's Locust users: one each, inference that waits
for a ready connection, and no request sent twice.

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
from pathlib import Path

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


# ---- what the gRPC user does when a server is not there, or dies with a request -------------

# A server that takes one inference request and dies with it, as an OOM-killed Triton does:
# it notes the request, then the process ends without an answer.
DYING_SERVER = """
import os
import sys
from concurrent import futures
import grpc

def infer(request, context):
    with open(sys.argv[1], "a") as log:
        log.write("request\\n")
    os._exit(1)

server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
    "inference.GRPCInferenceService", {"ModelInfer": grpc.unary_unary_rpc_method_handler(infer)})])
port = server.add_insecure_port("127.0.0.1:0")
server.start()
print(port, flush=True)
server.wait_for_termination()
"""

# One inference and one liveness call with the Locust user's channel options (or, with
# "retry", those plus a retry policy for UNAVAILABLE); prints each call's status code.
CALL = """
import json
import os
import sys
sys.path.insert(0, "loadtests")
from bls import INFERENCE_SERVICE_CONFIG, grpc_channel_args
import numpy as np
import tritonclient.grpc
from tritonclient.utils import InferenceServerException

address, variant = sys.argv[1], sys.argv[2]
options = grpc_channel_args()
if variant == "retry":
    config = json.loads(json.dumps(INFERENCE_SERVICE_CONFIG))
    config["methodConfig"][0]["retryPolicy"] = {
        "maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "0.5s",
        "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}
    options = [(k, json.dumps(config) if k == "grpc.service_config" else v) for k, v in options]
client = tritonclient.grpc.InferenceServerClient(address, channel_args=options)
data = tritonclient.grpc.InferInput("INPUT0", [4], "FP32")
data.set_data_from_numpy(np.zeros(4, dtype=np.float32))
calls = {"infer": lambda: client.infer("add_sub", [data], client_timeout=3),
         "live": lambda: client.is_server_live(client_timeout=3)}
for name in sys.argv[3:]:
    try:
        calls[name]()
        print(name, "OK")
    except InferenceServerException as error:
        print(name, error.status())
os._exit(0)
"""


def call(address: str, variant: str, *names: str) -> dict[str, str]:
    done = subprocess.run(
        [sys.executable, "-c", CALL, address, variant, *names],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(line.split(" ", 1) for line in done.stdout.splitlines())


def test_inference_waits_for_a_server_while_health_checks_fail_fast() -> None:
    # Nothing listens at a port closed again: without wait-for-ready, inference would fail
    # at once with UNAVAILABLE; with it, it waits for a connection until its deadline.
    closed = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{closed.getsockname()[1]}"
    closed.close()
    assert call(address, "ours", "infer", "live") == {
        "infer": "StatusCode.DEADLINE_EXCEEDED",
        "live": "StatusCode.UNAVAILABLE",
    }


@pytest.mark.parametrize(
    ("variant", "status"),
    [("ours", "StatusCode.UNAVAILABLE"), ("retry", "StatusCode.DEADLINE_EXCEEDED")],
    ids=["the user's options fail it", "a retry policy for UNAVAILABLE would send it again"],
)
def test_a_request_a_server_died_with_is_not_sent_again(
    tmp_path: Path, variant: str, status: str
) -> None:
    log = tmp_path / "requests"
    with subprocess.Popen(
        [sys.executable, "-c", DYING_SERVER, str(log)], stdout=subprocess.PIPE, text=True
    ) as server:
        try:
            assert server.stdout is not None
            port = server.stdout.readline().strip()
            # A retry finds no server (it died) and waits for one until the deadline.
            assert call(f"127.0.0.1:{port}", variant, "infer") == {"infer": status}
        finally:
            server.kill()
    assert log.read_text().splitlines() == ["request"]
