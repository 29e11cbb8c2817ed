"""The metrics sources against a real Triton under load and a real Prometheus scraping it."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient

from tests.tooling import missing, require_local_triton
from tests.waiting import eventually, wait_for
from tritonscale.core.signals import MetricsUnavailable
from tritonscale.local.loadgen import ClosedLoopLoad, make_inputs
from tritonscale.local.ports import free_port
from tritonscale.local.prometheus_server import LocalPrometheus, prometheus_binary
from tritonscale.local.triton_server import LocalTriton
from tritonscale.metrics import queries
from tritonscale.metrics.prometheus import DEFAULT_QUERIES, PrometheusSource, pod_matcher
from tritonscale.metrics.scrape import ScrapeSource, counter_increase
from tritonscale.triton.connections import Connections
from tritonscale.triton.endpoints import Endpoint
from tritonscale.triton.healing import HEALTHY, Healer, _request_counters

PIPELINE = ["pipeline_async", "branch_embed", "branch_classify", "branch_rank"]
WINDOW_S = 8


def _triton(models: list[str]) -> LocalTriton:
    require_local_triton()
    return LocalTriton(http_port=0, grpc_port=0, metrics_port=0, models=models)


@pytest.fixture(scope="module")
def pipeline() -> Iterator[LocalTriton]:
    with _triton(PIPELINE) as server:
        yield server


@pytest.fixture(scope="module")
def prometheus(pipeline: LocalTriton) -> Iterator[LocalPrometheus]:
    if prometheus_binary() is None:
        missing("prometheus not installed (Debian package 'prometheus')")
    target = pipeline.metrics_url.removeprefix("http://")
    with LocalPrometheus({"triton": [target]}, scrape_interval_s=0.5) as server:
        server.wait_for('nv_inference_request_success{model="pipeline_async"}', timeout_s=30)
        yield server


def _endpoint(server: LocalTriton) -> Endpoint:
    return Endpoint("local", server.http_url, server.metrics_url)


# ---- both sources on the same load ----------------------------------------------------


async def test_both_sources_measure_the_same_load(pipeline: LocalTriton, prometheus) -> None:
    endpoints = [_endpoint(pipeline)]
    scrape = ScrapeSource(min_scrape_interval_s=0.2)
    prom = PrometheusSource(prometheus.url)
    with ClosedLoopLoad(pipeline.grpc_url, "pipeline_async") as load:
        load.set_users(4)
        await eventually(
            lambda: load.stats(0, time.time()).requests >= 2 * load.users,
            "the load past its ramp (two answers per user)",
        )
        started = time.time()
        while time.time() - started < WINDOW_S + 1:
            await scrape.scrape([pipeline.metrics_url])
            # Time passing is the subject here: a sample every 0.5 s across the window.
            await asyncio.sleep(0.5)
        by_scrape = await scrape.snapshot(PIPELINE, endpoints, WINDOW_S)
        # Until Prometheus has taken a scrape after that moment (a bounded wait).
        prometheus.wait_for(
            f'timestamp(nv_inference_request_success{{model="pipeline_async"}}) > {by_scrape.taken_at}',
            timeout_s=10,
        )
        by_prometheus = await prom.snapshot(PIPELINE, endpoints, WINDOW_S)
        sent = load.stats(time.time() - WINDOW_S, time.time())
    assert by_scrape.complete and by_prometheus.complete
    assert by_scrape.window_s == pytest.approx(WINDOW_S, rel=0.15)
    a = by_scrape.models["pipeline_async"]
    b = by_prometheus.models["pipeline_async"]
    assert a.pods_reporting == b.pods_reporting == 1
    assert a.request_rate > 5, "the load must have reached the pipeline"
    # What the client saw, the server counted.
    assert a.request_rate == pytest.approx(sent.rate, rel=0.2)
    for field in ("request_rate", "execution_rate", "compute_seconds_per_second"):
        assert getattr(a, field) == pytest.approx(getattr(b, field), rel=0.2), field
    # Every branch gets one call per pipeline execution.
    for branch in PIPELINE[1:]:
        assert by_scrape.models[branch].request_rate == pytest.approx(a.execution_rate, rel=0.2)
        assert by_prometheus.models[branch].request_rate == pytest.approx(b.execution_rate, rel=0.2)
    assert a.failure_rate == b.failure_rate == 0
    assert by_scrape.gpu is None and by_prometheus.gpu is None  # a CPU-only Triton


# ---- PrometheusSource -------------------------------------------------------------------


async def test_a_window_longer_than_the_series_is_incomplete(
    pipeline: LocalTriton, prometheus
) -> None:
    snapshot = await PrometheusSource(prometheus.url).snapshot(
        PIPELINE, [_endpoint(pipeline)], 3000
    )
    assert not snapshot.complete
    assert snapshot.window_s < 3000
    assert "pipeline_async" in snapshot.models


async def test_a_model_absent_from_the_pods_is_absent_from_the_snapshot(
    pipeline: LocalTriton, prometheus
) -> None:
    snapshot = await PrometheusSource(prometheus.url).snapshot(
        ["add_sub"], [_endpoint(pipeline)], 5
    )
    assert snapshot.models == {}


async def test_other_pods_are_not_counted(pipeline: LocalTriton, prometheus) -> None:
    elsewhere = Endpoint("other", "127.0.0.1:1", f"http://127.0.0.1:{free_port()}/metrics")
    snapshot = await PrometheusSource(prometheus.url).snapshot(PIPELINE, [elsewhere], 5)
    assert snapshot.models == {}


async def test_prometheus_stopped_is_metrics_unavailable(pipeline: LocalTriton, prometheus) -> None:
    source = PrometheusSource(prometheus.url, timeout_s=2)
    prometheus.stop()
    try:
        with pytest.raises(
            MetricsUnavailable, match="Prometheus at http://127.0.0.1:.* is unreachable"
        ):
            await source.snapshot(PIPELINE, [_endpoint(pipeline)], 5)
    finally:
        prometheus.start()
    prometheus.wait_for("up", timeout_s=30)
    assert (await source.snapshot(PIPELINE, [_endpoint(pipeline)], 5)).models


async def test_prometheus_answers_the_healers_counters_with_one_read_per_model(
    pipeline: LocalTriton, prometheus
) -> None:
    # With Prometheus in place the healer's per-pod counters come from it, not from each
    # pod's /metrics: the checks of one model share one pair of queries.
    before = _successes(pipeline, "pipeline_async")
    with ClosedLoopLoad(pipeline.grpc_url, "pipeline_async") as load:
        load.set_users(1)
        await eventually(lambda: load.stats(0, time.time()).requests >= 10, "ten answers")
    answered = load.stats(0, time.time()).requests
    _wait_for_count(pipeline, "pipeline_async", before + answered)
    on_the_pod = _request_counters(
        requests.get(pipeline.metrics_url, timeout=5).text, "pipeline_async"
    )
    prometheus.wait_for(
        f'sum(nv_inference_request_success{{model="pipeline_async"}}) == {on_the_pod[1]}',
        timeout_s=10,
    )
    connections = Connections()  # the session the operator's sources share
    source = PrometheusSource(prometheus.url, connections=connections)
    sent: list[str] = []
    query = source.query

    async def counting(promql: str, session=None) -> list[dict]:
        sent.append(promql)
        return await query(promql, session)

    source.query = counting  # type: ignore[method-assign]
    pod = _endpoint(pipeline)
    unscraped = Endpoint("other", "127.0.0.1:1", f"http://127.0.0.1:{free_port()}/metrics")
    try:
        answers = await asyncio.gather(
            *(source.request_counters(pod, "pipeline_async") for _ in range(5)),
            source.request_counters(unscraped, "pipeline_async"),
        )
    finally:
        await connections.close()
    assert answers == [on_the_pod] * 5 + [None]
    assert len(sent) == 2, sent


@pytest.mark.unit
async def test_in_kubernetes_the_counters_are_asked_by_namespace_and_told_by_pod() -> None:
    asked: list[str] = []
    rows = {
        "nv_inference_request_failure": [{"metric": {"pod": "a"}, "value": [0, "2"]}],
        "nv_inference_request_success": [
            {"metric": {"pod": "a"}, "value": [0, "7"]},
            {"metric": {"pod": "b"}, "value": [0, "5"]},
        ],
    }

    async def query(promql: str, session=None) -> list[dict]:
        asked.append(promql)
        return rows[next(name for name in rows if name in promql)]

    source = PrometheusSource("http://prometheus:9090")
    source.query = query  # type: ignore[method-assign]
    pods = [Endpoint(name, f"{name}:8000", f"http://{name}:8002/metrics", "ml") for name in "abc"]
    answers = await asyncio.gather(*(source.request_counters(pod, "m") for pod in pods))
    assert answers == [(2.0, 7.0), (0.0, 5.0), None]
    assert sorted(asked) == [
        'sum by (pod) (nv_inference_request_failure{namespace="ml",model="m",reason="BACKEND"})',
        'sum by (pod) (nv_inference_request_success{namespace="ml",model="m"})',
    ]


async def test_the_healer_reads_the_pod_itself_while_prometheus_is_down(
    pipeline: LocalTriton, prometheus
) -> None:
    source = PrometheusSource(prometheus.url, timeout_s=2)
    source.COUNTERS_MAX_AGE_S = 0
    answers: list[object] = []

    async def reader(endpoint: Endpoint, model: str) -> tuple[float, float] | None:
        try:
            totals = await source.request_counters(endpoint, model)
        except MetricsUnavailable as error:
            answers.append(error)
            raise
        answers.append(totals)
        return totals

    healer = Healer(request_counters=reader)
    pod = _endpoint(pipeline)
    first = await healer.check(pod, "pipeline_async")
    assert first.reason == HEALTHY, first.message
    assert isinstance(answers[-1], tuple), answers
    prometheus.stop()
    try:
        second = await healer.check(pod, "pipeline_async")
    finally:
        prometheus.start()
    prometheus.wait_for("up", timeout_s=30)
    # Prometheus could not answer; the healer read the pod's /metrics and found it serving.
    assert isinstance(answers[-1], MetricsUnavailable), answers
    assert second.reason == HEALTHY, second.message


async def test_a_bad_query_is_one_line_naming_it(pipeline: LocalTriton, prometheus) -> None:
    source = PrometheusSource(prometheus.url, queries={"request_rate": "sum(rate(broken["})
    with pytest.raises(MetricsUnavailable, match=r"query failed: .*\(query: sum\(rate\(broken\[\)"):
        await source.snapshot(PIPELINE, [_endpoint(pipeline)], 5)


@pytest.mark.unit
def test_unknown_query_keys_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown query keys: request_rat"):
        PrometheusSource("http://127.0.0.1:9", queries={"request_rat": "x"})


@pytest.mark.unit
def test_the_default_queries_name_every_signal() -> None:
    assert "nv_inference_request_success" in DEFAULT_QUERIES["request_rate"]
    assert "DCGM_FI_DEV_GPU_UTIL" in DEFAULT_QUERIES["gpu_utilization_dcgm"]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("key", "signal"),
    [
        ("request_rate", queries.request_rate),
        ("failure_rate", queries.failure_rate),
        ("execution_rate", queries.execution_rate),
        ("compute_seconds_per_second", queries.compute_seconds_per_second),
        ("queue_seconds_per_second", queries.queue_seconds_per_second),
        ("pending_requests", queries.pending_requests),
        ("streams_in_flight", queries.streams_in_flight),
        ("inference_rate", queries.inference_rate),
        ("exported", queries.exported),
        ("first_sample", queries.first_sample),
        ("successes_total", queries.successes_total),
        ("backend_failures_total", queries.backend_failures_total),
    ],
)
def test_the_source_asks_the_signals_module(key: str, signal) -> None:
    # The operator's queries are the rules' and the dashboards' in the source's scope.
    assert DEFAULT_QUERIES[key] == signal(queries.SOURCE_SCOPE)
    assert "$selector" in DEFAULT_QUERIES[key]


@pytest.mark.parametrize(
    ("scope", "expected"),
    [
        pytest.param(
            queries.SOURCE_SCOPE,
            "sum by ($pod, model) (rate(nv_inference_request_success{$selector}[$window]))",
            id="the operator: a template over the pod set and window, per pod and model",
        ),
        pytest.param(
            queries.RULES_SCOPE,
            "sum by (namespace, model) (rate(nv_inference_request_success[1m]))",
            id="the recording rules: every series, 1m, per namespace and model",
        ),
        pytest.param(
            queries.Scope('model=~"$model"', "$__rate_interval", ()),
            'sum(rate(nv_inference_request_success{model=~"$model"}[$__rate_interval]))',
            id="a dashboard stat: one number over the selected models",
        ),
        pytest.param(
            queries.ADAPTER_SCOPE,
            "sum by (<<.GroupBy>>) (rate(nv_inference_request_success{<<.LabelMatchers>>}[2m]))",
            id="prometheus-adapter: its template's matchers and grouping",
        ),
    ],
)
def test_one_signal_is_written_for_each_scope(scope: queries.Scope, expected: str) -> None:
    assert queries.request_rate(scope) == expected


@pytest.mark.parametrize(
    ("endpoints", "expected"),
    [
        pytest.param(
            [
                Endpoint("triton-0", "10.0.0.1:8000", None, "ml"),
                Endpoint("triton-1", "x", None, "ml"),
            ],
            'namespace="ml",pod=~"triton\\\\-0|triton\\\\-1"',
            id="kubernetes pods are matched by namespace and name",
        ),
        pytest.param(
            [Endpoint("a", "a:8000", "http://10.0.0.1:8002/metrics")],
            'instance=~"10\\\\.0\\\\.0\\\\.1:8002"',
            id="local tritons are matched by their metrics instance",
        ),
    ],
)
def test_the_pod_set_becomes_a_label_matcher(endpoints: list[Endpoint], expected: str) -> None:
    assert pod_matcher(endpoints) == expected


@pytest.mark.unit
def test_a_pod_set_without_addresses_needs_a_configured_matcher() -> None:
    assert pod_matcher([Endpoint("a", "a:8000")], default='job="triton"') == 'job="triton"'
    with pytest.raises(MetricsUnavailable, match="which pods"):
        pod_matcher([Endpoint("a", "a:8000")])


# ---- ScrapeSource -----------------------------------------------------------------------


@pytest.mark.unit
def test_counter_increase_counts_a_reset_from_zero() -> None:
    assert counter_increase([5, 7, 10]) == 5
    # A restart: 10 -> 2 counts the 2 done since.
    assert counter_increase([5, 10, 2, 4]) == 5 + 2 + 2
    assert counter_increase([3]) == 0


async def test_a_fresh_scraper_is_incomplete_until_a_window_has_passed(
    pipeline: LocalTriton,
) -> None:
    now = [1000.0]
    source = ScrapeSource(min_scrape_interval_s=0.1, clock=lambda: now[0])
    endpoints = [_endpoint(pipeline)]
    first = await source.snapshot(PIPELINE, endpoints, 2)
    assert not first.complete and first.window_s == 0
    now[0] += 1.7  # under 0.9 of the window: still warming up
    assert not (await source.snapshot(PIPELINE, endpoints, 2)).complete
    now[0] += 0.3
    second = await source.snapshot(PIPELINE, endpoints, 2)
    assert second.complete
    assert second.window_s == 2.0
    assert second.models["pipeline_async"].pods_reporting == 1


async def test_an_unreachable_target_is_metrics_unavailable(pipeline: LocalTriton) -> None:
    gone = f"http://127.0.0.1:{free_port()}/metrics"
    source = ScrapeSource([pipeline.metrics_url, gone], timeout_s=1)
    with pytest.raises(MetricsUnavailable, match=f"cannot read Triton metrics at {gone}"):
        await source.snapshot(PIPELINE, (), 5)


def _send(server: LocalTriton, requests: int) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inputs = make_inputs("add_sub", 1, np.random.default_rng(0))
    for _ in range(requests):
        client.infer("add_sub", inputs)
    client.close()


def _successes(server: LocalTriton, model: str) -> int:
    text = requests.get(server.metrics_url, timeout=5).text
    return int(_request_counters(text, model)[1])


def _wait_for_count(server: LocalTriton, model: str, count: int) -> None:
    """Until Triton's /metrics shows `count` successes of `model`. Triton reports a request's
    statistics after its response has gone out, so a scrape right after the last answer
    may still miss it."""
    expected = f'nv_inference_request_success{{model="{model}",version="1"}} {count}\n'
    wait_for(
        lambda: expected in requests.get(server.metrics_url, timeout=5).text,
        f"Triton's metrics to show {expected.strip()}",
    )


async def test_a_restarted_triton_counts_on_from_zero() -> None:
    server = _triton(["add_sub"])
    now = [1000.0]
    source = ScrapeSource(min_scrape_interval_s=0, clock=lambda: now[0])
    endpoints = [_endpoint(server)]
    with server:
        _wait_for_count(server, "add_sub", 0)
        await source.scrape([server.metrics_url])  # add_sub at 0 requests
        _send(server, 20)
        _wait_for_count(server, "add_sub", 20)
        now[0] += 10
        await source.scrape([server.metrics_url])
    with server:  # the same ports, counters back at zero
        # Fewer than before: a counter that went down is a reset. (One that climbed past its
        # old value between two samples cannot be told from growth, as in Prometheus.)
        _send(server, 5)
        _wait_for_count(server, "add_sub", 5)
        now[0] += 10
        after = await source.snapshot(["add_sub"], endpoints, 600)
    assert after.window_s == 20
    assert after.models["add_sub"].request_rate == (20 + 5) / 20
    assert not after.complete  # 600 s of history do not exist yet


async def test_targets_gone_longer_than_any_window_are_forgotten(pipeline: LocalTriton) -> None:
    now = [1000.0]
    source = ScrapeSource(max_window_s=60, clock=lambda: now[0])
    old_pod, new_pod = pipeline.metrics_url, pipeline.metrics_url + "?pod=new"
    await source.scrape([old_pod])
    now[0] += 500  # the old pod was replaced long ago
    await source.scrape([new_pod])
    assert source.targets([Endpoint("new", "x", new_pod)]) == [new_pod]
    assert set(source._history) == {new_pod}


class _CountingMetrics:
    """A /metrics endpoint whose counter is the number of requests it has received; the first
    request gets its number at once and its answer `first_delay_s` later (a scrape whose
    response is taken, then held up), or never within the client's timeout."""

    def __init__(self, first_delay_s: float) -> None:
        self.requests = 0
        self.first_arrived = threading.Event()
        lock = threading.Lock()
        metrics = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server interface
                with lock:
                    metrics.requests += 1
                    number = metrics.requests
                metrics.first_arrived.set()
                if number == 1:
                    time.sleep(first_delay_s)  # the held-up answer this stand-in is for
                body = f'nv_inference_request_success{{model="m",version="1"}} {number}\n'
                self.send_response(200)
                self.end_headers()
                with contextlib.suppress(OSError):  # the client gave up on a held answer
                    self.wfile.write(body.encode())

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


async def _scrape_twice_at_once(
    source: ScrapeSource, metrics: _CountingMetrics
) -> list[BaseException]:
    """Two policies' scrapes of one target, the second asked while the first is in flight."""
    errors: list[BaseException] = []

    async def scrape() -> None:
        try:
            await source.scrape([metrics.url])
        except MetricsUnavailable as error:
            errors.append(error)

    first = asyncio.ensure_future(scrape())
    # The server's thread says when the first request arrived.
    await eventually(metrics.first_arrived.is_set, "the first scrape to reach the server")
    second = asyncio.ensure_future(scrape())
    await asyncio.wait_for(asyncio.gather(first, second), 30)
    return errors


@pytest.mark.unit
async def test_scrapes_of_one_target_are_kept_in_the_order_they_were_taken() -> None:
    # The policies' ticks interleave. Had the second scrape's answer (2) been kept
    # before the first's (1), the counter would seem to go down: a reset, its whole value
    # counted as new requests (seen on busy cores as a branch at 13 times its real rate).
    metrics = _CountingMetrics(first_delay_s=0.5)
    try:
        source = ScrapeSource(min_scrape_interval_s=0)
        assert await _scrape_twice_at_once(source, metrics) == []
    finally:
        metrics.close()
    values = [sample.values[("nv_inference_request_success", (("model", "m"), ("version", "1")))]
              for sample in source._history[metrics.url]]  # fmt: skip
    assert values == sorted(values) and len(values) == 2, values


@pytest.mark.unit
async def test_a_scrape_waiting_on_a_hung_one_shares_its_failure() -> None:
    metrics = _CountingMetrics(first_delay_s=3)
    try:
        source = ScrapeSource(min_scrape_interval_s=0, timeout_s=0.5)
        errors = await _scrape_twice_at_once(source, metrics)
    finally:
        metrics.close()
    assert len(errors) == 2 and all("cannot read Triton metrics" in str(e) for e in errors)
    # The second waited for the first's timeout instead of sending (and waiting) again.
    assert metrics.requests == 1


@pytest.mark.unit
async def test_the_healers_read_of_a_pod_serves_the_snapshot_of_the_same_tick() -> None:
    # Scraping, the healer's counters come from the source: one GET of /metrics per pod and
    # tick, not one for the healer and one for the snapshot.
    metrics = _CountingMetrics(first_delay_s=0)
    try:
        source = ScrapeSource()
        pod = Endpoint("pod-a", "127.0.0.1:9", metrics.url)
        assert await source.request_counters(pod, "m") == (0.0, 1.0)
        assert await source.request_counters(pod, "other") == (0.0, 0.0)
        snapshot = await source.snapshot(["m"], [pod], 5)
    finally:
        metrics.close()
    assert metrics.requests == 1
    assert snapshot.models["m"].pods_reporting == 1
