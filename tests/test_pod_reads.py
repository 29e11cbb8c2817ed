"""What the operator reads of its pods, and how little: the driver's kept-open connections
(tritonscale.triton.connections), the metrics text read for the families asked for
(tritonscale.triton.metrics_text), and the configs and readiness a tick reads again only when
they may have changed (tritonscale.triton.actuator, tritonscale.triton.healing).

A small aiohttp server stands in for Triton's HTTP API: these tests are about connections,
not Triton (the operator's tests against a real tritonserver go over the same code).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from tests.waiting import eventually
from tritonscale.triton.actuator import Actuator
from tritonscale.triton.client import AsyncTritonClient, TritonUnreachable
from tritonscale.triton.connections import Connections
from tritonscale.triton.endpoints import Endpoint
from tritonscale.triton.healing import HEALTHY, MODEL_NOT_READY, PROBE_OFF, Healer
from tritonscale.triton.metrics_text import label_matcher, parse_metrics

pytestmark = pytest.mark.unit


class Server:
    """Answers a model's config at once and a `slow` model's readiness never; records the
    client's address and port of every request (one port per TCP connection)."""

    def __init__(self) -> None:
        self.peers: list[tuple[str, int]] = []
        self.endpoint: Endpoint | None = None
        self.runner: web.AppRunner | None = None
        self.stopping = asyncio.Event()
        self.hanging = asyncio.Event()  # a request is held by `hang`
        self.config_reads = 0
        self.groups: dict[str, list] = {}
        self.ready_reads = 0
        self.not_ready: set[str] = set()  # models that answer "not ready"
        self.metrics_body = TRITON_METRICS

    async def config(self, request: web.Request) -> web.Response:
        self.peers.append(request.transport.get_extra_info("peername"))
        self.config_reads += 1
        model = request.match_info["model"]
        return web.json_response({"name": model, "instance_group": self.groups.get(model, [])})

    async def hang(self, request: web.Request) -> web.Response:
        self.peers.append(request.transport.get_extra_info("peername"))
        self.hanging.set()
        await self.stopping.wait()  # no answer until the test ends
        return web.Response(status=200)

    async def metrics(self, request: web.Request) -> web.Response:
        self.peers.append(request.transport.get_extra_info("peername"))
        return web.Response(text=self.metrics_body)

    async def ready(self, request: web.Request) -> web.Response:
        self.ready_reads += 1
        return web.Response(status=400 if request.match_info["model"] in self.not_ready else 200)

    async def index(self, request: web.Request) -> web.Response:
        return web.json_response([])  # an unloaded model is not listed

    async def start(self) -> Endpoint:
        app = web.Application()
        app.router.add_get("/v2/models/{model}/config", self.config)
        app.router.add_get("/v2/models/slow/ready", self.hang)
        app.router.add_get("/v2/models/{model}/ready", self.ready)
        app.router.add_post("/v2/repository/index", self.index)
        app.router.add_get("/metrics", self.metrics)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]
        base = f"http://127.0.0.1:{port}"
        self.endpoint = Endpoint("pod-0", base, f"{base}/metrics")
        return self.endpoint

    @property
    def connections_seen(self) -> int:
        return len(set(self.peers))


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    serving = Server()
    await serving.start()
    yield serving
    assert serving.runner is not None
    serving.stopping.set()
    await serving.runner.cleanup()


async def test_calls_share_one_connection_per_pod(server: Server) -> None:
    assert server.endpoint is not None
    connections = Connections()
    try:
        for _ in range(10):
            async with AsyncTritonClient(server.endpoint, connections=connections) as triton:
                assert (await triton.model_config("m"))["name"] == "m"
                await triton.metrics_text()
        assert len(connections) == 1
    finally:
        await connections.close()
    # Two connections: the pod's client and the session for /metrics, each kept open.
    assert server.connections_seen == 2, server.peers


async def test_without_connections_each_client_opens_its_own(server: Server) -> None:
    assert server.endpoint is not None
    for _ in range(5):
        async with AsyncTritonClient(server.endpoint) as triton:
            await triton.model_config("m")
    assert server.connections_seen == 5, server.peers


async def test_a_call_past_its_timeout_breaks_no_other_call_on_the_pod(server: Server) -> None:
    assert server.endpoint is not None
    connections = Connections()
    try:
        slow = AsyncTritonClient(server.endpoint, timeout_s=0.3, connections=connections)
        fast = AsyncTritonClient(server.endpoint, timeout_s=5, connections=connections)

        async def config_later() -> dict:
            # Sent while the slow call waits for its answer.
            await eventually(server.hanging.is_set, "the slow call held by the server")
            return await fast.model_config("m")

        hung, answered = await asyncio.gather(
            slow.is_model_ready("slow"), config_later(), return_exceptions=True
        )
        assert isinstance(hung, TritonUnreachable) and hung.timed_out, hung
        assert answered == {"name": "m", "instance_group": []}
        # The pod's client stays usable after the timeout, for both.
        assert (await slow.model_config("m"))["name"] == "m"
        assert (await fast.model_config("n"))["name"] == "n"
        await slow.close()
        await fast.close()
        assert len(connections) == 1
    finally:
        await connections.close()


async def test_idle_clients_are_closed_and_busy_ones_kept() -> None:
    now = [0.0]
    connections = Connections(idle_s=100, clock=lambda: now[0])
    try:
        async with connections.triton("127.0.0.1:1") as idle:
            pass
        async with connections.triton("127.0.0.1:2") as busy:
            now[0] = 500.0
            async with connections.triton("127.0.0.1:3"):  # a later call sweeps
                pass
            assert len(connections) == 2  # :1 closed, :2 in a call, :3 fresh
            # Closing is a task on the loop. (`_stub`: tritonclient's aiohttp session of that
            # client.)
            await eventually(lambda: idle._stub.closed, "the idle client's session closed")
            assert not busy._stub.closed
        async with connections.triton("127.0.0.1:1") as again:
            assert again is not idle  # a pod asked again gets a new client
    finally:
        await connections.close()
    assert busy._stub.closed


async def test_while_a_load_is_in_flight_the_pods_calls_take_new_connections() -> None:
    connections = Connections()
    try:
        async with connections.triton("127.0.0.1:1") as kept:
            pass
        with connections.loading("127.0.0.1:1"):
            async with connections.triton("127.0.0.1:1") as during:
                assert during is not kept
            assert during._stub.closed  # closed after its call
            async with connections.triton("127.0.0.1:2") as other:
                assert not other._stub.closed  # another pod keeps its own
        async with connections.triton("127.0.0.1:1") as after:
            assert after is kept
        assert len(connections) == 2
    finally:
        await connections.close()


# A /metrics text as Triton 2.51 writes it (shortened): families the operator reads and
# others it does not.
TRITON_METRICS = """\
# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="add_sub",version="1"} 42
nv_inference_request_success{model="pipeline \\"quoted\\", name",version="1"} 7
# HELP nv_inference_request_failure Number of failed inference requests, all batch sizes
# TYPE nv_inference_request_failure counter
nv_inference_request_failure{model="add_sub",reason="BACKEND",version="1"} 3
nv_inference_request_failure{model="add_sub",reason="REJECTED",version="1"} 1
# HELP nv_cache_num_hits_per_model Number of cache hits per model
# TYPE nv_cache_num_hits_per_model counter
nv_cache_num_hits_per_model{model="add_sub",version="1"} 0
# HELP nv_inference_pending_request_count Instantaneous number of pending requests
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="add_sub",version="1"} 2
# HELP nv_cpu_utilization CPU utilization rate [0.0 - 1.0]
# TYPE nv_cpu_utilization gauge
nv_cpu_utilization 0.25

"""


def _everything(text: str) -> dict:
    """The whole text through prometheus_client's parser, counters named without _total."""
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = family.name if family.type == "counter" else sample.name
            values[(name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


@pytest.mark.parametrize(
    "names",
    [
        ["nv_inference_request_success", "nv_inference_request_failure"],
        ["nv_inference_pending_request_count", "nv_cpu_utilization"],
        ["nv_inference_request_success", "nv_no_such_family"],
    ],
)
def test_the_families_asked_for_read_as_the_whole_parse_reads_them(names: list[str]) -> None:
    expected = {key: value for key, value in _everything(TRITON_METRICS).items() if key[0] in names}
    assert expected
    assert parse_metrics(TRITON_METRICS, names) == expected


def test_a_label_with_quotes_and_commas_keeps_its_value() -> None:
    values = parse_metrics(TRITON_METRICS, ["nv_inference_request_success"])
    labels = (("model", 'pipeline "quoted", name'), ("version", "1"))
    assert values[("nv_inference_request_success", labels)] == 7


def test_a_kept_line_that_does_not_parse_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        parse_metrics(
            'nv_inference_request_success{model="a"} not-a-number\n',
            ["nv_inference_request_success"],
        )
    # A broken line of a family nobody reads costs nothing.
    assert parse_metrics("nv_other{ broken\n", ["nv_inference_request_success"]) == {}


def test_the_samples_of_one_model_are_picked_by_its_label() -> None:
    quoted = 'pipeline "quoted", name'
    values = parse_metrics(
        TRITON_METRICS, ["nv_inference_request_success"], label_matcher("model", quoted)
    )
    assert values == {("nv_inference_request_success", (("model", quoted), ("version", "1"))): 7.0}
    failures = parse_metrics(
        TRITON_METRICS, ["nv_inference_request_failure"], label_matcher("model", "add_sub")
    )
    assert sorted(dict(labels)["reason"] for _, labels in failures) == ["BACKEND", "REJECTED"]


async def test_a_tick_reads_a_pods_config_again_only_when_it_may_have_changed(
    server: Server,
) -> None:
    assert server.endpoint is not None
    now = [1000.0]
    actuator = Actuator(repository_key="", config_max_age_s=60, clock=lambda: now[0])
    pod = dataclasses.replace(server.endpoint, started_at="2026-12-02T04:00:00Z")
    server.groups["m"] = [{"kind": "KIND_CPU", "count": 2}]

    async def count() -> int:
        counts, failures = await actuator.live_counts([pod], "m")
        assert not failures
        return counts[pod.name]

    assert await count() == 2
    server.groups["m"] = [{"kind": "KIND_CPU", "count": 3}]  # behind the operator's back
    now[0] += 30
    assert await count() == 2 and server.config_reads == 1  # kept
    configs, _ = await actuator.live_configs([pod], "m")
    configs[pod.name]["instance_group"].clear()  # a caller's copy: the kept one is untouched
    assert await count() == 2 and server.config_reads == 1
    now[0] += 30
    assert await count() == 3 and server.config_reads == 2  # past its age: read again

    # The pod's containers restarted: Triton runs what its repository says.
    server.groups["m"] = [{"kind": "KIND_CPU", "count": 1}]
    restarted = dataclasses.replace(pod, started_at="2026-12-02T04:05:00Z")
    counts, _ = await actuator.live_counts([restarted], "m")
    assert counts[pod.name] == 1 and server.config_reads == 3

    # A load of the model to the pod (the actuator's or the healer's) was sent since.
    server.groups["m"] = [{"kind": "KIND_CPU", "count": 4}]
    now[0] += 1

    async def load() -> None:
        return None

    assert await actuator.loads.run(pod.name, "m", "4 instances", load) is None
    now[0] += 1
    counts, _ = await actuator.live_counts([restarted], "m")
    assert counts[pod.name] == 4 and server.config_reads == 4
    # Another model on the same pod is a read of its own.
    counts, _ = await actuator.live_counts([restarted], "n")
    assert server.config_reads == 5

    # Another operator changed the count while a peer held this one paused (kopf stops the
    # daemons, whose start forgets what was kept).
    server.groups["m"] = [{"kind": "KIND_CPU", "count": 2}]
    actuator.forget_configs()
    counts, _ = await actuator.live_counts([restarted], "m")
    assert counts[pod.name] == 2 and server.config_reads == 6


async def test_the_healer_asks_readiness_again_only_when_it_may_have_changed(
    server: Server,
) -> None:
    assert server.endpoint is not None
    now = [1000.0]
    healer = Healer(
        repository_key="", probe=PROBE_OFF, readiness_max_age_s=60, clock=lambda: now[0]
    )
    pod = dataclasses.replace(server.endpoint, started_at="2026-12-02T04:00:00Z")

    async def check() -> str:
        return (await healer.check(pod, "add_sub")).reason

    assert await check() == HEALTHY and server.ready_reads == 1  # the first look asks
    now[0] += 30
    served = TRITON_METRICS.replace('version="1"} 42', 'version="1"} 50')
    server.metrics_body = served  # requests served, none failed
    assert await check() == HEALTHY and server.ready_reads == 1
    now[0] += 30
    assert await check() == HEALTHY and server.ready_reads == 2  # past its age: asked again

    # BACKEND failures beside successes: asked at once (and serving, the probes being off).
    server.metrics_body = served.replace('version="1"} 50', 'version="1"} 55').replace(
        'reason="BACKEND",version="1"} 3', 'reason="BACKEND",version="1"} 5'
    )
    assert await check() == HEALTHY and server.ready_reads == 3

    # Unloaded behind the operator's back: Triton drops its series, so the counters go back.
    server.not_ready.add("add_sub")
    server.metrics_body = TRITON_METRICS.replace('model="add_sub"', 'model="other"')
    # (The reload the healer then sends fails here: this server has no load API.)
    assert (await healer.check(pod, "add_sub")).cause == MODEL_NOT_READY
    assert server.ready_reads == 4
    assert (await healer.check(pod, "add_sub")).cause == MODEL_NOT_READY
    assert server.ready_reads == 5  # asked until it is ready again
    server.not_ready.clear()
    now[0] += 1  # the heal's reload ended before the next read began
    assert await check() == HEALTHY and server.ready_reads == 6
    assert await check() == HEALTHY and server.ready_reads == 6

    # The pod's containers restarted.
    restarted = dataclasses.replace(pod, started_at="2026-12-02T04:05:00Z")
    assert (await healer.check(restarted, "add_sub")).reason == HEALTHY
    assert server.ready_reads == 7

    # A load of the model to the pod (the actuator's or a heal) was sent since.
    async def load() -> None:
        return None

    assert await healer.loads.run(pod.name, "add_sub", "2 instances", load) is None
    now[0] += 1
    assert (await healer.check(restarted, "add_sub")).reason == HEALTHY
    assert server.ready_reads == 8
    assert (await healer.check(restarted, "add_sub")).reason == HEALTHY
    assert server.ready_reads == 8

    # Where the pod's start is unknown (no Kubernetes), every check asks.
    for reads in range(9, 12):
        assert (await healer.check(server.endpoint, "add_sub")).reason == HEALTHY
        assert server.ready_reads == reads


async def test_a_pod_whose_start_is_unknown_is_read_every_time(server: Server) -> None:
    assert server.endpoint is not None and server.endpoint.started_at is None
    actuator = Actuator(repository_key="")
    for reads in range(1, 4):
        await actuator.live_counts([server.endpoint], "m")
        assert server.config_reads == reads
