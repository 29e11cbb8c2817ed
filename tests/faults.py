"""What the fault, fuzz and healing tests share: a server's own stubs, and load that checks answers.

Stubs are found by the server's process group (LocalTriton starts tritonserver in its own
session), never by name alone: other people's servers run on this machine too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import socketserver
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import tritonclient.http as httpclient

from tritonscale.local.triton_server import LocalTriton

PIPELINE_MODELS = ["pipeline_async", "branch_embed", "branch_classify", "branch_rank"]


def stub_pids(server: LocalTriton, model: str) -> list[int]:
    """PIDs of `model`'s Python backend stubs that belong to this server."""
    assert server.process is not None, "the server is not running"
    group = os.getpgid(server.process.pid)
    listed = subprocess.run(
        ["pgrep", "-f", f"triton_python_backend_stub .*/{model}/1/model.py"],
        capture_output=True,
        text=True,
    ).stdout.split()
    mine = []
    for pid in map(int, listed):
        try:
            if os.getpgid(pid) == group:
                mine.append(pid)
        except ProcessLookupError:
            continue
    return sorted(mine)


def kill_stub(server: LocalTriton, model: str, every: bool = False) -> int:
    """kill -9 one stub of `model` on this server (or every one); the (first) PID."""
    pids = stub_pids(server, model)
    assert pids, f"no stub of {model} found for this server"
    for pid in pids if every else pids[:1]:
        os.kill(pid, signal.SIGKILL)
    return pids[0]


def add_sub_inputs(a: np.ndarray, b: np.ndarray) -> list[httpclient.InferInput]:
    inputs = [httpclient.InferInput(name, [4], "FP32") for name in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def add_sub_once(client: httpclient.InferenceServerClient, rng: np.random.Generator) -> None:
    """One add_sub request with random inputs; raises AssertionError on a wrong answer."""
    a = rng.standard_normal(4).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    result = client.infer("add_sub", add_sub_inputs(a, b))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def pipeline_once(client: httpclient.InferenceServerClient, rng: np.random.Generator) -> None:
    """One pipeline_async request; checks the shapes and the invariants of its outputs."""
    rows = int(rng.integers(1, 4))
    features = rng.standard_normal((rows, 64)).astype(np.float32)
    infer_input = httpclient.InferInput("FEATURES", [rows, 64], "FP32")
    infer_input.set_data_from_numpy(features)
    result = client.infer("pipeline_async", [infer_input])
    embedding = result.as_numpy("EMBEDDING")
    probs = result.as_numpy("LABEL_PROBS")
    score = result.as_numpy("SCORE")
    assert embedding.shape == (rows, 16) and probs.shape == (rows, 8) and score.shape == (rows, 1)
    np.testing.assert_allclose(np.linalg.norm(embedding, axis=1), 1.0, rtol=1e-4)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-4)
    assert np.all((score > 0) & (score < 1))


@dataclass
class LoadReport:
    """What the senders saw: every request is a success, a failure or a wrong answer."""

    successes: int = 0
    wrong_answers: list[str] = field(default_factory=list)
    failures: Counter[str] = field(default_factory=Counter)  # first line of each error
    # (monotonic time the request was sent, ok) per request, in completion order
    timeline: list[tuple[float, bool]] = field(default_factory=list)

    @property
    def failed(self) -> int:
        return sum(self.failures.values())

    def last_failure_at(self) -> float | None:
        failed = [at for at, ok in self.timeline if not ok]
        return failed[-1] if failed else None

    def first_failure_at(self) -> float | None:
        failed = [at for at, ok in self.timeline if not ok]
        return failed[0] if failed else None

    def successes_after(self, moment: float) -> int:
        return sum(1 for at, ok in self.timeline if ok and at > moment)


class Load:
    """Threads that send requests in a loop and sort each answer (a context manager).

    `send(client, rng)` makes one request and raises AssertionError for a wrong answer; any
    other exception is a failed request.
    """

    def __init__(
        self,
        server: LocalTriton,
        send: Callable[[httpclient.InferenceServerClient, np.random.Generator], None],
        threads: int = 4,
        pause_s: float = 0.01,
    ) -> None:
        self.server = server
        self.send = send
        self.threads = threads
        self.pause_s = pause_s
        self.report = LoadReport()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._workers: list[threading.Thread] = []

    def _run(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        client = httpclient.InferenceServerClient(self.server.http_url, network_timeout=30)
        try:
            while not self._stop.is_set():
                sent = time.monotonic()
                try:
                    self.send(client, rng)
                except AssertionError as wrong:
                    outcome = ("wrong", str(wrong).strip().splitlines()[0])
                except Exception as error:  # every kind of failure counts
                    text = str(error).strip().splitlines()
                    outcome = ("failed", text[0][:200] if text else type(error).__name__)
                else:
                    outcome = ("ok", "")
                with self._lock:
                    if outcome[0] == "ok":
                        self.report.successes += 1
                    elif outcome[0] == "wrong":
                        self.report.wrong_answers.append(outcome[1])
                    else:
                        self.report.failures[outcome[1]] += 1
                    self.report.timeline.append((sent, outcome[0] == "ok"))
                if outcome[0] != "ok":
                    time.sleep(0.05)  # a failing server is not hammered
                time.sleep(self.pause_s)
        finally:
            client.close()

    def __enter__(self) -> Load:
        for index in range(self.threads):
            worker = threading.Thread(target=self._run, args=(index,), daemon=True)
            worker.start()
            self._workers.append(worker)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for worker in self._workers:
            worker.join(timeout=60)

    def wait_for_successes(self, count: int, after: float, timeout_s: float = 60.0) -> float:
        """Wait until `count` requests sent after `after` succeeded; when the first was sent."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                ok = [at for at, good in self.report.timeline if good and at > after]
            if len(ok) >= count:
                return ok[0]
            time.sleep(0.05)
        raise AssertionError(f"fewer than {count} successful requests {timeout_s:.0f} s after")


def _pipe(source: socket.socket, target: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            target.sendall(data)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        target.shutdown(socket.SHUT_WR)


class _HeldWhileFrozen(socketserver.BaseRequestHandler):
    """One relayed connection, once the relay is thawed (and not closed)."""

    def handle(self) -> None:
        relay: FreezableRelay = self.server  # type: ignore[assignment]
        relay.thawed.wait()
        if relay.closed:
            return
        try:
            upstream = socket.create_connection(relay.upstream, timeout=10)
        except OSError:
            return
        upstream.settimeout(None)
        self.request.settimeout(None)
        pump = threading.Thread(target=_pipe, args=(upstream, self.request), daemon=True)
        pump.start()
        _pipe(self.request, upstream)
        pump.join(timeout=5)
        upstream.close()


class FreezableRelay(socketserver.ThreadingTCPServer):
    """A TCP relay in front of a server that can be made to hang like a stopped pod.

    While frozen it accepts connections and answers nothing, as a tritonserver stopped with
    SIGSTOP does (the kernel still accepts); thawed, it relays them to the server. Use it as
    a context manager; `url` is the relay's http:// address.
    """

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, target_url: str) -> None:
        host, port = target_url.removeprefix("http://").rsplit(":", 1)
        super().__init__(("127.0.0.1", 0), _HeldWhileFrozen)
        self.upstream = (host, int(port))
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.thawed = threading.Event()
        self.thawed.set()
        self.closed = False
        self._thread = threading.Thread(
            target=self.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True,
            name="freezable-relay",
        )  # fmt: skip

    def freeze(self) -> None:
        self.thawed.clear()

    def thaw(self) -> None:
        self.thawed.set()

    def __enter__(self) -> FreezableRelay:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.closed = True
        self.thawed.set()  # held connections end without being relayed
        self.shutdown()
        self.server_close()
        self._thread.join(timeout=5)
