"""A small closed-loop gRPC load generator, for the demo and the tests.

Each user is a thread with its own gRPC client that sends one request, waits for the
answer, and sends the next. `set_users(n)` steps the load; `stats(start, end)` gives the
throughput and latency of the requests that finished in a time span. Where Locust is wanted
(`locust -f loadtests/bls.py`), the demo uses it instead; this one needs no extra process.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np
import tritonclient.grpc as grpcclient


def make_inputs(model: str, rows: int, rng: np.random.Generator) -> list[grpcclient.InferInput]:
    """Inputs for the pipelines (FEATURES [rows, 64]) or the add_sub family (INPUT0/1 [4])."""
    if model.startswith("pipeline"):
        features = grpcclient.InferInput("FEATURES", [rows, 64], "FP32")
        features.set_data_from_numpy(rng.standard_normal((rows, 64), dtype=np.float32))
        return [features]
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = grpcclient.InferInput(name, [4], "FP32")
        tensor.set_data_from_numpy(rng.random(4, dtype=np.float32))
        inputs.append(tensor)
    return inputs


@dataclass(frozen=True)
class LoadStats:
    requests: int
    failures: int
    seconds: float
    p50_ms: float | None
    p95_ms: float | None

    @property
    def rate(self) -> float:
        """Successful requests per second."""
        return self.requests / self.seconds if self.seconds > 0 else 0.0


class ClosedLoopLoad:
    """`users` threads sending `model` requests to Triton's gRPC `url`, `think_s` apart."""

    def __init__(
        self, url: str, model: str = "pipeline_async", rows: int = 1, think_s: float = 0.0
    ) -> None:
        self.url = url
        self.model = model
        self.rows = rows
        # A pause after each answer: without one, even two users keep a model busy all the time.
        self.think_s = think_s
        self._users = 0
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        # (finished at, latency s, ok)
        self._done: list[tuple[float, float, bool]] = []
        self.last_error: str | None = None

    @property
    def users(self) -> int:
        return self._users

    def set_users(self, users: int) -> None:
        self._users = users
        while len(self._threads) < users:
            index = len(self._threads)
            thread = threading.Thread(
                target=self._user, args=(index,), name=f"load-{index}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def _user(self, index: int) -> None:
        client = grpcclient.InferenceServerClient(self.url)
        rng = np.random.default_rng(index)
        inputs = make_inputs(self.model, self.rows, rng)
        try:
            while not self._stopping.is_set():
                if index >= self._users:
                    time.sleep(0.05)
                    continue
                started = time.time()
                try:
                    client.infer(self.model, inputs, client_timeout=30)
                    ok = True
                except Exception as error:  # a failed request is counted, not fatal
                    ok = False
                    self.last_error = " ".join(str(error).split())[:200]
                    time.sleep(0.05)  # a server that is down must not be hammered
                finished = time.time()
                with self._lock:
                    self._done.append((finished, finished - started, ok))
                if self.think_s > 0:
                    self._stopping.wait(self.think_s)
        finally:
            client.close()

    def stats(self, start: float, end: float) -> LoadStats:
        with self._lock:
            rows = [row for row in self._done if start <= row[0] < end]
        latencies = sorted(latency for _, latency, ok in rows if ok)
        ok_count = len(latencies)

        def quantile(q: float) -> float | None:
            if not latencies:
                return None
            return 1000.0 * latencies[min(len(latencies) - 1, int(q * len(latencies)))]

        return LoadStats(ok_count, len(rows) - ok_count, end - start, quantile(0.5), quantile(0.95))

    def stop(self) -> None:
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout=35)
        self._threads = []

    def __enter__(self) -> ClosedLoopLoad:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
