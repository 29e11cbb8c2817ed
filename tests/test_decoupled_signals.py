"""Decoupled models' signals on the real Triton, under streamed load.

Two decoupled models on a server of this module's own: `square_int32` (the repository's;
its execute holds each stream until the final response) and `stream_async`
(tests/decoupled_models: an `async def execute` that returns before its streams end, and
exports its open streams as a gauge). What Triton 2.51 counts for each is written down in
docs/instancegroupautoscaler.md, "Signals"; these tests hold the operator to it.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.tooling import missing, require_local_triton
from tritonscale.control.set_tick import reconcile
from tritonscale.control.tick import ReconcileState
from tritonscale.core import sizing
from tritonscale.core.spec import Targets
from tritonscale.local.prometheus_server import LocalPrometheus, prometheus_binary
from tritonscale.local.triton_server import LocalTriton
from tritonscale.metrics.prometheus import PrometheusSource
from tritonscale.metrics.queries import STREAMS_IN_FLIGHT
from tritonscale.metrics.scrape import ScrapeSource
from tritonscale.triton.actuator import Actuator
from tritonscale.triton.endpoints import Endpoint

REPO = Path(__file__).resolve().parents[1]
ASYNC_MODEL = "stream_async"
SYNC_MODEL = "square_int32"
STREAM_S = 0.4  # how long each stream_async request streams
RATE = 20.0  # stream_async requests per second: Little's law puts 8 streams in flight
WINDOW_S = 3


@pytest.fixture(scope="module")
def triton(tmp_path_factory) -> Iterator[LocalTriton]:
    require_local_triton()
    repository = tmp_path_factory.mktemp("decoupled-models")
    shutil.copytree(REPO / "tests" / "decoupled_models" / ASYNC_MODEL, repository / ASYNC_MODEL)
    shutil.copytree(REPO / "models" / SYNC_MODEL, repository / SYNC_MODEL)
    with LocalTriton(repository, http_port=0, grpc_port=0, metrics_port=0) as server:
        yield server


class StreamedLoad:
    """`rate` requests per second on one gRPC stream, until stopped; counts final responses."""

    def __init__(self, server: LocalTriton, model: str, value: int, rate: float) -> None:
        self.server, self.model, self.value, self.rate = server, model, value, rate
        self.sent = self.finals = 0
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._send, daemon=True)
        self._client = grpcclient.InferenceServerClient(server.grpc_url)

    def _on_response(self, result, error) -> None:
        with self._lock:
            if error is not None:
                self.errors.append(str(error))
            elif result.get_response().parameters["triton_final_response"].bool_param:
                self.finals += 1

    def _send(self) -> None:
        name = "MS" if self.model == ASYNC_MODEL else "IN"
        started = time.monotonic()
        while not self._stop.is_set():
            item = grpcclient.InferInput(name, [1], "INT32")
            item.set_data_from_numpy(np.array([self.value], dtype=np.int32))
            self._client.async_stream_infer(
                self.model, [item], request_id=str(self.sent), enable_empty_final_response=True
            )
            self.sent += 1
            self._stop.wait(max(0.0, started + self.sent / self.rate - time.monotonic()))

    def __enter__(self) -> StreamedLoad:
        self._client.start_stream(callback=self._on_response)
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        deadline = time.monotonic() + 30
        while self.finals < self.sent and time.monotonic() < deadline and not self.errors:
            time.sleep(0.05)
        with self._lock:
            errors, finals = list(self.errors), self.finals
        # Cancel what is left (a plain stop_stream would wait for every answer).
        self._client.stop_stream(cancel_requests=True)
        self._client.close()
        assert not errors, errors[:3]
        assert finals == self.sent, f"{self.model}: {finals} of {self.sent} streams ended in 30 s"


def _endpoint(server: LocalTriton) -> Endpoint:
    return Endpoint("local", server.http_url, server.metrics_url)


async def _sample_for(source: ScrapeSource, server: LocalTriton, seconds: float) -> None:
    """Samples of the load for `seconds` (the rates need two, a full window needs the span)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await source.scrape([server.metrics_url])
        await asyncio.sleep(0.25)  # time passing is the subject: a sample every 0.25 s


async def test_an_async_decoupled_model_is_sized_by_the_streams_it_reports(
    triton: LocalTriton,
) -> None:
    source = ScrapeSource(min_scrape_interval_s=0.2)
    with StreamedLoad(triton, ASYNC_MODEL, int(STREAM_S * 1000), RATE):
        await _sample_for(source, triton, WINDOW_S + 1)
        snapshot = await source.snapshot(
            [ASYNC_MODEL], [_endpoint(triton)], WINDOW_S, {ASYNC_MODEL}
        )
    signals = snapshot.models[ASYNC_MODEL]
    assert snapshot.complete and signals.decoupled
    assert signals.request_rate == pytest.approx(RATE, rel=0.3)
    # Little's law: streams in flight = arrival rate x stream time (8 here). The gauge is one
    # instant; the bounds leave room for a loaded machine.
    expected = signals.request_rate * STREAM_S
    assert signals.streams_in_flight is not None
    assert 0.4 * expected <= signals.streams_in_flight <= 2.5 * expected, signals
    # What Triton's own timings say meanwhile: the request was done once execute started, so
    # one instance looks all but idle and nothing waits.
    assert sizing.busy_per_instance(signals, 1) < 0.1, signals
    assert signals.pending_requests <= 1
    # The policy sizes it by the streams: 8 per instance against a target of 2 asks for 4.
    needs = sizing.needs(signals, 1, Targets(), tolerance=0.1)
    count, reason, winner = sizing.recommend(needs, 1)
    assert reason == sizing.HIGH_STREAMS_IN_FLIGHT and winner.signal.startswith("streams")
    assert count == pytest.approx(expected / Targets().pending_per_instance, abs=2.5)


async def test_a_decoupled_model_whose_execute_holds_its_streams_keeps_tritons_signals(
    triton: LocalTriton,
) -> None:
    # square_int32 answers IN responses inside execute: Triton times the stream as compute,
    # and the requests behind it wait in the queue, pending.
    source = ScrapeSource(min_scrape_interval_s=0.2)
    with StreamedLoad(triton, SYNC_MODEL, 200, rate=40):
        await _sample_for(source, triton, WINDOW_S + 1)
        snapshot = await source.snapshot([SYNC_MODEL], [_endpoint(triton)], WINDOW_S, {SYNC_MODEL})
    signals = snapshot.models[SYNC_MODEL]
    assert signals.decoupled and signals.streams_in_flight is None  # it exports no gauge
    assert not sizing.sized_by_streams(signals)
    assert signals.request_rate > 0 and signals.compute_seconds_per_second > 0
    needs = {need.signal: need for need in sizing.needs(signals, 1, Targets(), tolerance=0.1)}
    assert needs["busy per instance"].instances is not None  # it has its say
    assert "streams in flight per instance" not in needs


async def test_prometheus_reads_the_same_streams_with_the_generated_query(
    triton: LocalTriton,
) -> None:
    if prometheus_binary() is None:
        missing("prometheus not installed (Debian package 'prometheus')")
    target = triton.metrics_url.removeprefix("http://")
    with LocalPrometheus({"triton": [target]}, scrape_interval_s=0.5) as prometheus:
        prometheus.wait_for(f'nv_inference_request_success{{model="{ASYNC_MODEL}"}}', 30)
        source = PrometheusSource(prometheus.url)
        with StreamedLoad(triton, ASYNC_MODEL, int(STREAM_S * 1000), RATE):
            # Prometheus scrapes on its own clock: until a scrape past the window's end.
            covered = time.time() + WINDOW_S + 1
            prometheus.wait_for(
                f'timestamp({STREAMS_IN_FLIGHT}{{model="{ASYNC_MODEL}"}}) > {covered}',
                timeout_s=WINDOW_S + 30,
            )
            snapshot = await source.snapshot(
                [ASYNC_MODEL, SYNC_MODEL], [_endpoint(triton)], WINDOW_S, {ASYNC_MODEL}
            )
    streaming, holding = snapshot.models[ASYNC_MODEL], snapshot.models[SYNC_MODEL]
    assert streaming.decoupled and streaming.streams_in_flight is not None
    assert 0.4 * RATE * STREAM_S <= streaming.streams_in_flight <= 2.5 * RATE * STREAM_S
    # Not named decoupled by the caller: no streams read for it.
    assert not holding.decoupled and holding.streams_in_flight is None


async def test_the_tick_learns_decoupledness_from_the_live_config(triton: LocalTriton) -> None:
    source = ScrapeSource(min_scrape_interval_s=0.2)
    spec = {
        "selector": {"matchLabels": {"app": "triton"}},
        "model": ASYNC_MODEL,
        "maxInstances": 8,
        "metricsWindowSeconds": WINDOW_S,
        "intervalSeconds": 1,
        "dryRun": True,
    }
    with StreamedLoad(triton, ASYNC_MODEL, int(STREAM_S * 1000), RATE):
        await _sample_for(source, triton, WINDOW_S + 1)
        result = await reconcile(
            spec,
            [_endpoint(triton)],
            source,
            Actuator(triton.repository_key),
            ReconcileState(),
            time.time(),
        )
    assert not result.errors, result.errors
    assert result.snapshot is not None and result.snapshot.models[ASYNC_MODEL].decoupled
    decision = result.decision
    assert decision is not None
    assert decision.observed["streamsInFlightPerInstance"] > 1
    assert decision.reason == sizing.HIGH_STREAMS_IN_FLIGHT, decision.message
    assert decision.desired_instances > 1
    assert "streams in flight per instance" in decision.message
