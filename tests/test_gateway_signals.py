"""The operator tunes pipeline_gateway by the streams it reports, on the real Triton.

pipeline_gateway's `async def execute` returns before its requests are answered, so
Triton's own counters see it as idle at any load (docs/instancegroupautoscaler.md,
"Signals"). The model exports the requests it holds as `tritonscale_model_streams_in_flight`;
these tests put streamed load on it and follow that gauge from /metrics through ScrapeSource
to the control ticks that raise its instance count. A server of this module's own: a tick
reloads the gateway.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import tritonclient.grpc as grpcclient

from tests.model_clients import make_inputs
from tests.test_pipeline import BRANCHES, OUTPUTS, assert_well_formed, config_override, features
from tests.tooling import require_local_triton
from tritonscale.control.set_tick import reconcile
from tritonscale.control.tick import ReconcileState
from tritonscale.core import sizing
from tritonscale.core.spec import Targets
from tritonscale.local.triton_server import LocalTriton
from tritonscale.metrics import queries
from tritonscale.metrics.scrape import ScrapeSource, parse_metrics
from tritonscale.triton.actuator import Actuator
from tritonscale.triton.client import TritonClient
from tritonscale.triton.endpoints import Endpoint

GATEWAY = "pipeline_gateway"
IN_FLIGHT = 24  # requests the load keeps open on the stream
WINDOW_S = 3
MAX_INSTANCES = 4
# Streams one gateway instance should hold: the load's 24 (of which /metrics shows most)
# ask for about 3 instances, under the maximum, so the reason is the streams' own.
STREAMS_PER_INSTANCE = 8.0
SNAPSHOTS = 10  # readings of the gauge (snapshots, ticks) a test takes at most


@pytest.fixture(scope="module")
def triton() -> Iterator[LocalTriton]:
    require_local_triton()
    with LocalTriton(
        http_port=0, grpc_port=0, metrics_port=0, models=[GATEWAY, *BRANCHES]
    ) as server:
        # Branch calls get 10 s instead of 1: on a starved machine a branch's queue can
        # outlast a second, and these tests are about the gauge, not about timeouts.
        with config_override(server, GATEWAY, {"branch_timeout_us": "10000000"}):
            yield server


class ClosedLoopStream:
    """`in_flight` requests always open on one gRPC stream to the gateway: each answer
    sends the next request. Every answer is checked; stopping waits (bounded) for the last."""

    def __init__(self, server: LocalTriton, in_flight: int) -> None:
        self.in_flight = in_flight
        self.sent = self.answered = 0
        self.errors: list[str] = []
        self._answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._client = grpcclient.InferenceServerClient(server.grpc_url)
        self._requested = [grpcclient.InferRequestedOutput(name) for name in OUTPUTS]

    def _send(self) -> None:
        rows = features(1 + self.sent % 3, seed=self.sent)
        self._client.async_stream_infer(
            GATEWAY, make_inputs("grpc", {"FEATURES": rows}), outputs=self._requested
        )
        self.sent += 1

    def _run(self) -> None:
        for _ in range(self.in_flight):
            self._send()
        while not self._stop.is_set():
            try:
                result, error = self._answers.get(timeout=0.5)
            except queue.Empty:
                continue
            self._check(result, error)
            self._send()

    def _check(self, result: Any, error: Any) -> None:
        self.answered += 1
        if error is not None:
            self.errors.append(error.message())
            return
        outputs = {name: result.as_numpy(name) for name in OUTPUTS}
        assert_well_formed(outputs, outputs["SCORE"].shape[0])

    def __enter__(self) -> ClosedLoopStream:
        self._client.start_stream(callback=lambda result, error: self._answers.put((result, error)))
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        assert not self._thread.is_alive(), "the load's sending thread did not stop in 10 s"
        deadline = time.monotonic() + 30
        while self.answered < self.sent and time.monotonic() < deadline:
            try:
                self._check(*self._answers.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                break
        left = self.sent - self.answered
        self._client.stop_stream(cancel_requests=left > 0)
        self._client.close()
        assert left == 0, f"{GATEWAY}: {left} of {self.sent} streamed requests unanswered in 30 s"
        assert not self.errors, self.errors[:3]


def endpoint(server: LocalTriton) -> Endpoint:
    return Endpoint("local", server.http_url, server.metrics_url)


def streams_gauge(server: LocalTriton) -> float:
    """The gateway's gauge as /metrics shows it now (summed over its series)."""
    with TritonClient(endpoint(server)) as client:
        text = client.metrics_text()
    # One series, whatever the instance count: the instances add to the same gauge.
    lines = [line for line in text.splitlines() if line.startswith(queries.STREAMS_IN_FLIGHT)]
    assert len(lines) == 1, lines or f"{queries.STREAMS_IN_FLIGHT} is not in /metrics"
    [(labels, value)] = [
        (dict(labels), value)
        for (name, labels), value in parse_metrics(text).items()
        if name == queries.STREAMS_IN_FLIGHT
    ]
    assert labels == {"model": GATEWAY, "version": "1"}, labels
    return value


async def sample_for(source: ScrapeSource, server: LocalTriton, seconds: float) -> None:
    """Samples for `seconds`: the rates need two, a complete window needs the span."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await source.scrape([server.metrics_url])
        await asyncio.sleep(0.25)


def gauge_back_at_rest(server: LocalTriton, timeout_s: float = 10.0) -> None:
    """The gauge at 0 once the load is over. An instance publishes its count after the turn
    of its event loop that sent the last final response, so a read at the moment the client
    has every answer can still see the last few (seen: 2.0 right after a scale-up); a count
    that stays up is a leak and fails."""
    deadline = time.monotonic() + timeout_s
    value = streams_gauge(server)
    while value != 0 and time.monotonic() < deadline:
        time.sleep(0.1)
        value = streams_gauge(server)
    assert value == 0, (
        f"the gateway's streams gauge stayed at {value} for {timeout_s:.0f} s at rest"
    )


def highest_gauge_under_load(server: LocalTriton, reads: int = 20) -> float:
    """The highest of `reads` readings of the gauge, a quarter second apart."""
    highest = 0.0
    for _ in range(reads):
        highest = max(highest, streams_gauge(server))
        time.sleep(0.25)
    return highest


def test_the_gauge_counts_the_requests_the_gateway_holds(triton: LocalTriton) -> None:
    assert streams_gauge(triton) == 0  # exported from the start, at rest
    with ClosedLoopStream(triton, IN_FLIGHT) as load:
        highest = highest_gauge_under_load(triton)
    assert 0 < highest <= IN_FLIGHT, highest
    assert load.answered == load.sent > IN_FLIGHT
    # Every request counted out again: answered ones, and none left over.
    gauge_back_at_rest(triton)


def test_a_bad_request_is_counted_out_too(triton: LocalTriton) -> None:
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        bad = features(1, seed=7)
        bad[0, 0] = float("nan")
        client.async_stream_infer(GATEWAY, make_inputs("grpc", {"FEATURES": bad}))
        try:
            _, error = answers.get(timeout=30)
        except queue.Empty:
            raise AssertionError(f"{GATEWAY} did not answer a bad request in 30 s") from None
        assert error is not None and "must be finite" in error.message()
    finally:
        client.stop_stream()
        client.close()
    gauge_back_at_rest(triton)


async def test_scrape_source_reads_the_gateways_streams(triton: LocalTriton) -> None:
    # The gauge is read at one instant, and a closed loop answered in batches swings it
    # between its requests in flight and few (all of them on their way back to the client):
    # several snapshots, one must see them.
    source = ScrapeSource(min_scrape_interval_s=0.2)
    streams: list[float | None] = []
    with ClosedLoopStream(triton, IN_FLIGHT):
        await sample_for(source, triton, WINDOW_S + 1)
        for _ in range(SNAPSHOTS):
            snapshot = await source.snapshot([GATEWAY], [endpoint(triton)], WINDOW_S, {GATEWAY})
            streams.append(snapshot.models[GATEWAY].streams_in_flight)
            await asyncio.sleep(0.25)
    signals = snapshot.models[GATEWAY]
    assert snapshot.complete and signals.decoupled and signals.request_rate > 0
    assert sizing.sized_by_streams(signals)
    assert all(value is not None and 0 <= value <= IN_FLIGHT for value in streams), streams
    assert max(streams) > 0, streams
    # What Triton's own timings say meanwhile: all but idle.
    assert sizing.busy_per_instance(signals, 1) < Targets().utilization, signals


async def test_a_tick_raises_the_gateways_count_for_its_streams(triton: LocalTriton) -> None:
    actuator = Actuator(triton.repository_key)
    assert await actuator.live_count(endpoint(triton), GATEWAY) == 1
    source = ScrapeSource(min_scrape_interval_s=0.2)
    spec = {
        "selector": {"matchLabels": {"app": "triton"}},
        "model": GATEWAY,
        "maxInstances": MAX_INSTANCES,
        "targets": {"pendingPerInstance": STREAMS_PER_INSTANCE},
        "metricsWindowSeconds": WINDOW_S,
        "intervalSeconds": 1,
    }
    # Ticks one after another, as the operator runs them, until one applies a count (the
    # gauge is one instant, see above); every tick before it changed nothing.
    state, seen = ReconcileState(), []
    with ClosedLoopStream(triton, IN_FLIGHT):
        await sample_for(source, triton, WINDOW_S + 1)
        for _ in range(SNAPSHOTS):
            result = await reconcile(spec, [endpoint(triton)], source, actuator, state, time.time())
            assert not result.errors, result.errors
            state = result.state
            seen.append(result.decision.message if result.decision else "no decision")
            if result.applied:
                break
            await sample_for(source, triton, 1)
    assert result.applied, f"no tick of {SNAPSHOTS} raised the count: {seen}"
    decision = result.decision
    assert decision is not None and result.snapshot is not None
    assert result.snapshot.models[GATEWAY].decoupled
    assert decision.reason == sizing.HIGH_STREAMS_IN_FLIGHT, decision.message
    assert decision.observed["streamsInFlightPerInstance"] > STREAMS_PER_INSTANCE
    assert 1 < decision.desired_instances <= MAX_INSTANCES
    assert [(r.before, r.after, r.ok) for r in result.applied] == [
        (1, decision.desired_instances, True)
    ], result.applied
    assert await actuator.live_count(endpoint(triton), GATEWAY) == decision.desired_instances
    # The new instances count into the same gauge: at rest, then under load. Each instance
    # publishes its changes once per turn of its event loop, so for a moment a request one
    # instance has answered and its successor, admitted by another, can both be counted.
    gauge_back_at_rest(triton)
    with ClosedLoopStream(triton, IN_FLIGHT):
        assert 0 < highest_gauge_under_load(triton) <= 2 * IN_FLIGHT
    gauge_back_at_rest(triton)
