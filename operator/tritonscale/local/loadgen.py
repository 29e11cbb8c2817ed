"""Load generators over gRPC, for the demo, the benchmarks and the tests.

- `OpenLoopLoad`: requests start on a schedule, `rate` per second with random (Poisson)
  arrivals (or paced, exactly 1/rate apart: `arrivals="paced"`), whether or not the earlier
  ones have been answered, as independent users of a service arrive. Above the server's capacity the backlog, and the latency with it, grow
  without bound. This is the load that shows what an autoscaler is worth: a closed loop
  (a fixed number of users, each waiting for its answer) slows down with the server and
  hides how far it falls behind. Over gRPC by default; `protocol="http"` sends over HTTP
  as tritonclient.http does (JSON with the binary tensor extension), to compare with
  generators that speak HTTP.
- `measure`: a closed loop with a fixed number of requests in flight for a few seconds, the
  throughput a configuration can give (the benchmarks' measurement, and the demo's
  capacity check); over unary gRPC, or on the path a model's users take (`path`: unary
  HTTP, or a gRPC stream per user).
- `measure_stream`: the same number in flight over one shared gRPC stream, the only way to a decoupled
  model.
- `ClosedLoopLoad`: users as threads, each sending, waiting for the answer, and pausing.

Latencies of the open loop count from the moment a request was due, not from when it was
sent: a generator that falls behind must not hide the wait (coordinated omission).
"""

from __future__ import annotations

import asyncio
import bisect
import csv
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpc_aio
import tritonclient.http as httpclient
import tritonclient.http.aio as http_aio
from tritonclient.utils import np_to_triton_dtype

Inputs = dict[str, np.ndarray]
PROTOCOLS = ("grpc", "http")
ARRIVALS = ("poisson", "paced")
# Connections of the HTTP mode at most. Above a server's capacity every request waiting for
# an answer would otherwise open one more: at 2,000 add_sub requests/s on 2 cores the client
# then spent its CPU on thousands of connections and served 197/s with 847 timeouts, against
# 695/s and none with 256. A request beyond them waits in the client for a connection; its
# latency still counts from when it was due.
HTTP_CONNECTIONS = 256

# An open loop's history, one row per second.
HISTORY_COLUMNS = (
    "t",
    "offered_rps",
    "served_rps",
    "failed_rps",
    "dropped_rps",
    "p95_ms",
    "in_flight",
)


def input_arrays(model: str, rows: int, rng: np.random.Generator) -> Inputs:
    """Inputs for the pipelines (FEATURES [rows, 64]) or the add_sub family (INPUT0/1 [4])."""
    if model.startswith("pipeline"):
        return {"FEATURES": rng.standard_normal((rows, 64), dtype=np.float32)}
    return {"INPUT0": rng.random(4, dtype=np.float32), "INPUT1": rng.random(4, dtype=np.float32)}


def _infer_inputs(arrays: Inputs, client_module: Any = grpcclient) -> list[Any]:
    """Arrays as tritonclient inputs of `client_module` (tritonclient.grpc or .http; the
    same classes serve their aio clients)."""
    inputs = []
    for name, array in arrays.items():
        tensor = client_module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def make_inputs(model: str, rows: int, rng: np.random.Generator) -> list[grpcclient.InferInput]:
    """`input_arrays` as tritonclient inputs."""
    return _infer_inputs(input_arrays(model, rows, rng))


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())[:200] or type(error).__name__


def _count_in(times: list[float], start: float, end: float) -> int:
    """How many of the sorted `times` fall in [start, end)."""
    return bisect.bisect_left(times, end) - bisect.bisect_left(times, start)


def _quantile_ms(sorted_seconds: list[float], q: float) -> float | None:
    if not sorted_seconds:
        return None
    return 1000.0 * sorted_seconds[min(len(sorted_seconds) - 1, int(q * len(sorted_seconds)))]


# ---- the open loop ------------------------------------------------------------------------


@dataclass(frozen=True)
class OpenLoopStats:
    """What happened in one span of time."""

    seconds: float
    offered: int  # requests due in the span
    served: int  # requests answered successfully in the span
    failed: int  # requests that ended in an error in the span (a timeout included)
    dropped: int  # requests due in the span but never sent: `max_in_flight` was reached
    p50_ms: float | None  # of the requests served in the span, from when each was due
    p95_ms: float | None
    p99_ms: float | None
    in_flight: int  # sent and not yet answered at the span's end

    @property
    def offered_rps(self) -> float:
        return self.offered / self.seconds if self.seconds > 0 else 0.0

    @property
    def served_rps(self) -> float:
        return self.served / self.seconds if self.seconds > 0 else 0.0


Load = TypeVar("Load", bound="_LoadThread")


class _LoadThread:
    """A load generator that runs its own event loop in a thread (`_main`): `start()` returns
    once it runs, `stop()` ends it; or use it as a context manager."""

    kind = "load"  # what the generator is called in its errors

    def __init__(self) -> None:
        self._stopping = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: str | None = None  # why the generator itself stopped
        self.last_error: str | None = None  # the last failed request's reason

    def start(self: Load, timeout_s: float = 30.0) -> Load:
        self._thread = threading.Thread(target=self._run, name=self.kind, daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            self.stop()
            raise RuntimeError(f"the {self.kind} generator did not start in {timeout_s:.0f} s")
        if self.error:
            raise RuntimeError(f"the {self.kind} generator failed: {self.error}")
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop sending and give up on the requests still out (they are not counted)."""
        self._stopping.set()
        self._stop_asked()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
            self._thread = None

    def _stop_asked(self) -> None:
        """Wake whatever in `_main` waits for something other than the stop."""

    def __enter__(self: Load) -> Load:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except Exception as error:  # reported by start() or the caller's checks
            self.error = _one_line(error)
            self._ready.set()

    async def _main(self) -> None:
        raise NotImplementedError


class OpenLoopLoad(_LoadThread):
    """Requests to `model` on Triton's gRPC `url` (its HTTP one with `protocol="http"`) at
    `set_rate(r)` per second.

    Runs its own event loop in a thread: `start()`, `set_rate()`, `stats(start, end)`,
    `stop()`; or use it as a context manager. At most `max_in_flight` requests are out at
    once; a request due beyond that is not sent and counts as dropped (the client's memory
    is bounded, and the summary says so). Each request gives up after `timeout_s`.
    """

    kind = "open-loop load"

    def __init__(
        self,
        url: str,
        model: str = "pipeline_async",
        rows: int = 1,
        *,
        max_in_flight: int = 8000,
        timeout_s: float = 30.0,
        seed: int = 0,
        protocol: str = "grpc",
        arrivals: str = "poisson",
    ) -> None:
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
        if arrivals not in ARRIVALS:
            raise ValueError(f"arrivals must be one of {', '.join(ARRIVALS)}, got {arrivals!r}")
        super().__init__()
        self.url = url
        self.protocol = protocol
        self.arrivals = arrivals
        self.model = model
        self.rows = rows
        self.max_in_flight = max_in_flight
        self.timeout_s = timeout_s
        self._rng = np.random.default_rng(seed)
        self._rate = 0.0
        self._lock = threading.Lock()
        self._due: list[float] = []  # when each request was due, in order
        self._dropped: list[float] = []
        # Each answer (a success or an error), in the order they came: when, when it was due, ok.
        self._answered_at: list[float] = []
        self._answered: list[tuple[float, bool]] = []
        self._in_flight = 0

    @property
    def rate(self) -> float:
        return self._rate

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def last_answer_at(self) -> float | None:
        """When the last answer (a success or an error) came, unix s; None before any."""
        with self._lock:
            return self._answered_at[-1] if self._answered_at else None

    def set_rate(self, rate: float) -> None:
        if rate < 0:
            raise ValueError(f"rate must be >= 0, got {rate}")
        self._rate = float(rate)

    def drain(self, timeout_s: float) -> bool:
        """Send nothing more and wait until every request sent has ended; False at the timeout."""
        self.set_rate(0)
        deadline = time.monotonic() + timeout_s
        while self._in_flight > 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        return self._in_flight == 0

    def _client(self) -> Any:
        if self.protocol == "http":
            # The pool's total timeout is the request's deadline.
            return http_aio.InferenceServerClient(
                self.url,
                conn_limit=min(self.max_in_flight, HTTP_CONNECTIONS),
                conn_timeout=self.timeout_s,
            )
        return grpc_aio.InferenceServerClient(self.url)

    async def _main(self) -> None:
        client = self._client()
        module = httpclient if self.protocol == "http" else grpcclient
        # A few distinct payloads, built once: the generator's own CPU stays small.
        payloads = [
            _infer_inputs(input_arrays(self.model, self.rows, self._rng), module) for _ in range(8)
        ]
        tasks: set[asyncio.Task[None]] = set()
        self._ready.set()
        next_due: float | None = None  # None while the rate is 0
        try:
            while not self._stopping.is_set():
                now = time.time()
                rate = self._rate
                if rate <= 0:
                    next_due = None
                    await asyncio.sleep(0.01)
                    continue
                if next_due is None:
                    next_due = now + self._gap(rate)
                while next_due <= now:
                    self._send_due(client, payloads, next_due, tasks)
                    next_due += self._gap(rate)
                await asyncio.sleep(min(0.005, max(0.0, next_due - time.time())))
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await client.close()

    def _gap(self, rate: float) -> float:
        """Seconds from one request to the next: random (Poisson arrivals) or exactly 1/rate
        (paced, as vegeta and wrk2 send)."""
        if self.arrivals == "paced":
            return 1.0 / rate
        return float(self._rng.exponential(1.0 / rate))

    def _send_due(
        self,
        client: Any,
        payloads: list[list[Any]],
        due: float,
        tasks: set[asyncio.Task[None]],
    ) -> None:
        with self._lock:
            self._due.append(due)
            if self._in_flight >= self.max_in_flight:
                self._dropped.append(due)
                return
            self._in_flight += 1
        inputs = payloads[len(self._due) % len(payloads)]
        task = asyncio.get_running_loop().create_task(self._request(client, inputs, due))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _request(self, client: Any, inputs: list[Any], due: float) -> None:
        ok = False
        try:
            if self.protocol == "http":
                await client.infer(self.model, inputs)  # the pool's timeout bounds it
            else:
                await client.infer(self.model, inputs, client_timeout=self.timeout_s)
            ok = True
        except asyncio.CancelledError:
            with self._lock:
                self._in_flight -= 1
            raise
        except Exception as error:  # counted: a failed request is a result
            self.last_error = _one_line(error)
        with self._lock:
            self._in_flight -= 1
            self._answered_at.append(time.time())
            self._answered.append((due, ok))

    def stats(self, start: float, end: float) -> OpenLoopStats:
        """The requests due, answered and dropped in [start, end) (unix seconds)."""
        with self._lock:
            due = _count_in(self._due, start, end)
            dropped = _count_in(self._dropped, start, end)
            first = bisect.bisect_left(self._answered_at, start)
            last = bisect.bisect_left(self._answered_at, end)
            ended = list(
                zip(self._answered_at[first:last], self._answered[first:last], strict=True)
            )
            # Sent before the end and not answered by then.
            in_flight = (
                bisect.bisect_left(self._due, end) - bisect.bisect_left(self._dropped, end) - last
            )
        latencies = sorted(answered - due for answered, (due, ok) in ended if ok)
        return OpenLoopStats(
            seconds=end - start,
            offered=due,
            served=len(latencies),
            failed=len(ended) - len(latencies),
            dropped=dropped,
            p50_ms=_quantile_ms(latencies, 0.50),
            p95_ms=_quantile_ms(latencies, 0.95),
            p99_ms=_quantile_ms(latencies, 0.99),
            in_flight=max(0, in_flight),
        )

    def due_and_latencies(
        self, start: float, end: float
    ) -> tuple[list[float], list[tuple[float, float | None]]]:
        """The requests due in [start, end), by when they were due: every due time (dropped
        ones included), and (due, latency in s) of each answered one, None for an error.

        A request due in the span and not in the second list was dropped or is still waiting:
        for a latency objective it is a miss. One pass, for a whole run's windows at once."""
        with self._lock:
            first, last = bisect.bisect_left(self._due, start), bisect.bisect_left(self._due, end)
            due = self._due[first:last]
            answered = [
                (when_due, (at - when_due) if ok else None)
                for at, (when_due, ok) in zip(self._answered_at, self._answered, strict=True)
                if start <= when_due < end
            ]
        return due, answered

    def history(self, start: float, end: float, step_s: float = 1.0) -> list[dict[str, Any]]:
        """`stats` for each step from start to end, as rows of HISTORY_COLUMNS (t: the
        step's end, unix s)."""
        rows = []
        t = start
        while t + step_s <= end + 1e-9:
            s = self.stats(t, t + step_s)
            rows.append(
                {
                    "t": round(t + step_s, 3),
                    "offered_rps": round(s.offered_rps, 2),
                    "served_rps": round(s.served_rps, 2),
                    "failed_rps": round(s.failed / step_s, 2),
                    "dropped_rps": round(s.dropped / step_s, 2),
                    "p95_ms": None if s.p95_ms is None else round(s.p95_ms, 1),
                    "in_flight": s.in_flight,
                }
            )
            t += step_s
        return rows

    def write_history(self, path: Path, start: float, end: float) -> None:
        """`history` as CSV (the input `tritonscale report --load-csv` reads)."""
        rows = self.history(start, end)
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=HISTORY_COLUMNS)
            writer.writeheader()
            writer.writerows(rows)


# ---- a closed loop with a fixed number in flight: the capacity of a configuration --------

# How long a streamed run waits for its last answers after the measurement ends.
STREAM_GRACE_S = 30.0


@dataclass(frozen=True)
class Measurement:
    """One closed-loop run: `concurrency` requests in flight for `seconds`."""

    model: str
    concurrency: int
    seconds: float
    requests: int
    failures: int
    throughput_rps: float
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    first_error: str | None

    def to_dict(self) -> dict[str, Any]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def _measurement(
    model: str,
    concurrency: int,
    seconds: float,
    latencies: list[float],
    failures: int,
    first_error: str | None,
) -> Measurement:
    """A closed loop's result from the latencies (s) of the requests answered in its window."""
    latencies = sorted(latencies)
    return Measurement(
        model=model,
        concurrency=concurrency,
        seconds=seconds,
        requests=len(latencies),
        failures=failures,
        throughput_rps=len(latencies) / seconds,
        p50_ms=_quantile_ms(latencies, 0.50),
        p95_ms=_quantile_ms(latencies, 0.95),
        p99_ms=_quantile_ms(latencies, 0.99),
        first_error=first_error,
    )


# How a client reaches a model in `measure`: unary gRPC, unary HTTP (tritonclient.http, JSON
# with the binary tensor extension), or a gRPC stream of its own per user, one request at a
# time (a decoupled model, as loadtests/bls.py's users call pipeline_gateway).
CLIENT_PATHS = ("grpc", "http", "stream")
# A closed loop's request deadline, on every path.
REQUEST_TIMEOUT_S = 30.0


class _UserStream:
    """One user's gRPC stream: a request, then its single (final) response, then the next."""

    def __init__(self, client: Any, model: str) -> None:
        self.model = model
        self.outbox: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.responses = client.stream_infer(self._requests())
        self.sent = 0

    async def _requests(self) -> Any:
        while (request := await self.outbox.get()) is not None:
            yield request

    async def infer(self, inputs: list[Any]) -> None:
        self.sent += 1
        self.outbox.put_nowait(
            {"model_name": self.model, "inputs": inputs, "request_id": str(self.sent)}
        )
        _, error = await anext(self.responses)
        if error is not None:
            raise error

    def close(self) -> None:
        self.outbox.put_nowait(None)
        self.responses.cancel()


async def _closed_loop(
    url: str,
    model: str,
    make: Callable[[np.random.Generator], Inputs],
    concurrency: int,
    warmup_s: float,
    seconds: float,
    path: str = "grpc",
) -> Measurement:
    """`concurrency` users, each sending a request and waiting for its answer, on `path`.
    The users share one client (one gRPC channel; HTTP: a pool of `concurrency` connections)."""
    if path == "http":
        client: Any = http_aio.InferenceServerClient(url, conn_limit=concurrency)
        module: Any = httpclient
    else:
        client = grpc_aio.InferenceServerClient(url)
        module = grpcclient
    latencies: list[float] = []
    failures = 0
    first_error: str | None = None
    started = time.perf_counter()
    measure_from = started + warmup_s
    measure_to = measure_from + seconds

    async def user(index: int) -> None:
        nonlocal failures, first_error
        rng = np.random.default_rng(index)
        stream = _UserStream(client, model) if path == "stream" else None
        try:
            while time.perf_counter() < measure_to:
                inputs = _infer_inputs(make(rng), module)
                sent = time.perf_counter()
                try:
                    async with asyncio.timeout(REQUEST_TIMEOUT_S):
                        if stream is not None:
                            await stream.infer(inputs)
                        else:
                            await client.infer(model, inputs)
                    ok = True
                except Exception as error:  # counted: a failure is a result, not a crash
                    ok = False
                    first_error = first_error or _one_line(error)
                    if stream is not None:  # its answer may still come: start afresh
                        stream.close()
                        stream = _UserStream(client, model)
                    await asyncio.sleep(0.01)
                done = time.perf_counter()
                if measure_from <= done < measure_to:
                    if ok:
                        latencies.append(done - sent)
                    else:
                        failures += 1
        finally:
            if stream is not None:
                stream.close()

    try:
        await asyncio.gather(*(user(i) for i in range(concurrency)))
    finally:
        await client.close()
    return _measurement(model, concurrency, seconds, latencies, failures, first_error)


async def _closed_loop_stream(
    url: str,
    model: str,
    make: Callable[[np.random.Generator], Inputs],
    concurrency: int,
    warmup_s: float,
    seconds: float,
) -> Measurement:
    """`concurrency` requests always in flight on one gRPC stream; each request's (single,
    final) response sends the next. Decoupled models can only be reached this way."""
    client = grpc_aio.InferenceServerClient(url)
    rng = np.random.default_rng(concurrency)
    latencies: list[float] = []
    failures = 0
    first_error: str | None = None
    started = time.perf_counter()
    measure_from = started + warmup_s
    measure_to = measure_from + seconds
    to_send: asyncio.Queue[int | None] = asyncio.Queue()
    sent_at: dict[str, float] = {}
    next_id = 0

    def new_request() -> None:
        nonlocal next_id
        to_send.put_nowait(next_id)
        next_id += 1

    async def requests() -> Any:
        while (request_id := await to_send.get()) is not None:
            inputs = _infer_inputs(make(rng))
            sent_at[str(request_id)] = time.perf_counter()
            yield {"model_name": model, "inputs": inputs, "request_id": str(request_id)}

    for _ in range(concurrency):
        new_request()
    responses = client.stream_infer(requests())
    try:
        async with asyncio.timeout(warmup_s + seconds + STREAM_GRACE_S):
            async for result, error in responses:
                done = time.perf_counter()
                if error is None:
                    request_id = result.get_response().id
                else:
                    first_error = first_error or _one_line(error)
                    # Triton names the request of an error response too; if not, any will do.
                    request_id = next(iter(sent_at))
                sent = sent_at.pop(request_id, None)
                if sent is not None and measure_from <= done < measure_to:
                    if error is None:
                        latencies.append(done - sent)
                    else:
                        failures += 1
                if done < measure_to:
                    new_request()
                elif not sent_at:
                    break
    except TimeoutError:
        first_error = first_error or f"{len(sent_at)} request(s) unanswered at the end"
    finally:
        to_send.put_nowait(None)
        responses.cancel()
        await client.close()
    return _measurement(model, concurrency, seconds, latencies, failures, first_error)


def measure(
    url: str,
    model: str,
    make: Callable[[np.random.Generator], Inputs] | None = None,
    *,
    concurrency: int,
    seconds: float,
    warmup_s: float = 1.0,
    rows: int = 1,
    path: str = "grpc",
) -> Measurement:
    """Requests/s and latency of `model` with `concurrency` requests always in flight.

    `make` builds each request's arrays (default: `input_arrays(model, rows, rng)`). `path`
    is how the users reach the model, one of CLIENT_PATHS (`url`: the server's gRPC address
    for "grpc" and "stream", its HTTP one for "http").
    """
    if path not in CLIENT_PATHS:
        raise ValueError(f"path must be one of {', '.join(CLIENT_PATHS)}, got {path!r}")
    make = make or (lambda rng: input_arrays(model, rows, rng))
    return asyncio.run(_closed_loop(url, model, make, concurrency, warmup_s, seconds, path))


def measure_stream(
    url: str,
    model: str,
    make: Callable[[np.random.Generator], Inputs],
    *,
    concurrency: int,
    seconds: float,
    warmup_s: float = 1.0,
) -> Measurement:
    """As `measure`, over one gRPC stream (the only way to a decoupled model)."""
    return asyncio.run(_closed_loop_stream(url, model, make, concurrency, warmup_s, seconds))


# ---- a closed loop that never pauses: windows are spans of its completions ----------------


class SteadyClosedLoop(_LoadThread):
    """`concurrency` requests always in flight to `model` on Triton's gRPC `url`, from
    `start()` to `stop()`, whatever is measured meanwhile.

    `measure` runs a closed loop for one window and waits out its last requests, so the
    server's queues empty between two windows; real clients never pause like that. Here one
    load runs across every window: a window is the span [start, end) of its completions
    (`stats`), and the queue a window ends with is the next one's start. `set_concurrency`
    and `set_model` change the load while it runs (a lower load, a shifted mix): the users
    above the new count finish their request and wait; a user sends to the model in force
    when its request starts. Times are `time.monotonic()`. Own event loop in a thread,
    like OpenLoopLoad; one gRPC channel for every user.
    """

    kind = "closed-loop load"

    def __init__(
        self,
        url: str,
        model: str,
        make: Callable[[np.random.Generator], Inputs] | None = None,
        *,
        concurrency: int,
        rows: int = 1,
        timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        if concurrency < 0:
            raise ValueError(f"concurrency must be >= 0, got {concurrency}")
        super().__init__()
        self.url = url
        self.timeout_s = timeout_s
        self._make = make or (lambda rng: input_arrays(self._model, rows, rng))
        self._model = model
        self._concurrency = concurrency
        self._lock = threading.Lock()
        # Each ended request, in the order they ended: when (monotonic s), latency s, ok.
        self._ended_at: list[float] = []
        self._ended: list[tuple[float, bool, str]] = []
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def concurrency(self) -> int:
        return self._concurrency

    @property
    def model(self) -> str:
        return self._model

    def set_concurrency(self, concurrency: int) -> None:
        if concurrency < 0:
            raise ValueError(f"concurrency must be >= 0, got {concurrency}")
        self._concurrency = concurrency
        self._wake_users()

    def set_model(self, model: str) -> None:
        """Send the requests that start from now on to `model` (same inputs)."""
        self._model = model

    def _stop_asked(self) -> None:
        self._wake_users()

    def _wake_users(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:  # the loop closed meanwhile: nobody left to wake
                pass

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        client = grpc_aio.InferenceServerClient(self.url)
        users: list[asyncio.Task[None]] = []
        self._ready.set()
        try:
            while not self._stopping.is_set():
                while len(users) < self._concurrency:
                    users.append(asyncio.create_task(self._user(client, len(users))))
                self._wake.clear()
                await self._wake.wait()
        finally:
            for user in users:
                user.cancel()
            await asyncio.gather(*users, return_exceptions=True)
            await client.close()

    async def _user(self, client: Any, index: int) -> None:
        rng = np.random.default_rng(index)
        assert self._wake is not None
        while not self._stopping.is_set():
            if index >= self._concurrency:
                await asyncio.sleep(0.05)  # parked until the load rises again
                continue
            model = self._model
            inputs = _infer_inputs(self._make(rng))
            sent = time.monotonic()
            try:
                await client.infer(model, inputs, client_timeout=self.timeout_s)
                ok = True
            except Exception as error:  # counted: a failure is a result, not a crash
                ok = False
                self.last_error = _one_line(error)
            done = time.monotonic()
            with self._lock:
                self._ended_at.append(done)
                self._ended.append((done - sent, ok, model))
            if not ok:
                await asyncio.sleep(0.01)  # a server that refuses must not be hammered

    def stats(self, start: float, end: float) -> Measurement:
        """The requests that ended in [start, end) (monotonic s): a window of the running load."""
        with self._lock:
            first = bisect.bisect_left(self._ended_at, start)
            last = bisect.bisect_left(self._ended_at, end)
            ended = self._ended[first:last]
        latencies = [latency for latency, ok, _ in ended if ok]
        failures = len(ended) - len(latencies)
        models = {model for _, _, model in ended} or {self._model}
        return _measurement(
            "+".join(sorted(models)),
            self._concurrency,
            end - start,
            latencies,
            failures,
            self.last_error if failures else None,
        )

    def window(
        self,
        seconds: float,
        start: float | None = None,
        stop_early: Callable[[], None] | None = None,
    ) -> Measurement:
        """The completions of the `seconds` from `start` (default: now), once they have passed
        (`stop_early` is called every tenth of a second meanwhile: it may raise); the load runs
        on. Windows that each start where the last ended leave no request uncounted."""
        start = time.monotonic() if start is None else start
        end = start + seconds
        while (now := time.monotonic()) < end:
            if stop_early is not None:
                stop_early()
            if self.error:
                raise RuntimeError(f"the {self.kind} generator failed: {self.error}")
            time.sleep(min(0.1, end - now))
        return self.stats(start, end)


# ---- closed-loop users as threads ---------------------------------------------------------


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
                    self.last_error = _one_line(error)
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
        return LoadStats(
            len(latencies),
            len(rows) - len(latencies),
            end - start,
            _quantile_ms(latencies, 0.50),
            _quantile_ms(latencies, 0.95),
        )

    def stop(self) -> None:
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout=35)
        self._threads = []

    def __enter__(self) -> ClosedLoopLoad:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
