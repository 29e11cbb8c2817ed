"""Many Triton pods in one asyncio process: the fleet's stand-in for tritonserver 2.51.

    python -m hack.fleet.triton --control-port 9000      # inside the fleet's network namespace

It listens on 0.0.0.0 at Triton's HTTP port (8000) and metrics port (8002) and answers as
the pod whose address the connection was made to: in the fleet's network namespace every
address of 127.0.0.0/8 is the loopback's, and KWOK gives the pods addresses from that range,
so a connection to a pod's IP lands here with that IP as its local address. Per pod and
model it keeps an instance count and Triton's counters:

- the calls the operator makes (tritonscale.triton.client): `GET v2/health/live`,
  `GET v2/health/ready`, `GET v2/models/{m}/ready`, `GET v2/models/{m}/config`,
  `POST v2/repository/index`, `POST v2/repository/models/{m}/load` with a config override
  (the repository calls want the key header when a key is set). A load answers once the new
  count runs, after LOAD_DELAY_S (as a Python model's reload took here); meanwhile the old
  instances serve and the model stays READY, as in Triton;
- `/metrics`: nv_inference_request_success, nv_inference_count, nv_inference_exec_count, the
  queue, compute and request durations and nv_inference_pending_request_count, labelled
  `model` and `version` as Triton labels them, through prometheus_client's exposition.

The counters follow a fluid queue per (pod, model): requests arrive at the pod's set's rate
for the model, each takes SERVICE_S of one instance, `count` instances serve at once. Below
capacity the wait is M/M/1's per instance (s * rho / (1 - rho)); above it a backlog grows and
every request waits for it. So busy instances, queue time and pending requests answer the
count as a real server's would, and the operator's decisions mean something.

The control API (127.0.0.1, `--control-port`) is the harness's: `PUT /fleet/pods`
({"pods": {ip: {"name": ..., "set": ...}}}), `PUT /fleet/rates` ({"rates": {set: {model:
requests per second}}}), `GET /fleet/state` (every pod's counts, when each last changed, and
the requests served, by kind).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric

from tritonscale import REPOSITORY_KEY_HEADER

HTTP_PORT = 8000
METRICS_PORT = 8002
SERVICE_S = 0.05  # one request's compute on one instance
LOAD_DELAY_S = (2.0, 5.0)  # a reload's time, drawn per load
MAX_BACKLOG_PER_INSTANCE = 200.0  # queued requests beyond this are dropped (not counted)
MODELS = tuple(f"model_{i}" for i in range(5))
TRITON_VERSION = "2.51.0"
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")


@dataclass
class ModelState:
    """One model on one pod: its count and Triton's counters for it."""

    count: int = 1
    changed_at: float = 0.0  # unix time of the last count change (0: never changed)
    loads: int = 0
    success: float = 0.0
    exec_count: float = 0.0
    queue_us: float = 0.0
    compute_us: float = 0.0
    backlog: float = 0.0
    pending: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def advance(self, rate: float, dt: float) -> None:
        """`dt` seconds of arrivals at `rate` requests per second."""
        capacity = self.count / SERVICE_S  # requests per second
        arrived = rate * dt
        if self.backlog + arrived <= capacity * dt:
            served = self.backlog + arrived
            rho = min(rate / capacity, 0.99) if capacity else 0.99
            wait_s = SERVICE_S * rho / (1 - rho) / self.count
            waited = self.backlog / capacity + arrived * wait_s if capacity else 0.0
            self.backlog = 0.0
            self.pending = rate * wait_s  # Little's law
        else:
            served = capacity * dt
            self.backlog = min(
                self.backlog + arrived - served, MAX_BACKLOG_PER_INSTANCE * self.count
            )
            waited = served * self.backlog / capacity
            self.pending = self.backlog
        self.success += served
        self.exec_count += served
        self.queue_us += waited * 1e6
        self.compute_us += served * SERVICE_S * 1e6


@dataclass
class Pod:
    name: str
    set: str
    models: dict[str, ModelState] = field(
        default_factory=lambda: {model: ModelState() for model in MODELS}
    )


def model_config(model: str, count: int) -> dict[str, Any]:
    """A config as Triton 2.51 returns it for a Python model (the fields the operator reads,
    and the shape of the rest)."""
    return {
        "name": model,
        "platform": "",
        "backend": "python",
        "runtime": "",
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": 0,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
        "batch_input": [],
        "batch_output": [],
        "optimization": {"priority": "PRIORITY_DEFAULT", "input_pinned_memory": {"enable": True}},
        "instance_group": [
            {
                "name": model,
                "kind": "KIND_CPU",
                "count": count,
                "gpus": [],
                "secondary_devices": [],
                "profile": [],
                "passive": False,
                "host_policy": "",
            }
        ],
        "default_model_filename": "model.py",
        "cc_model_filenames": {},
        "metric_tags": {},
        "parameters": {},
        "model_warmup": [],
    }


class MetricsText:
    """One pod's /metrics as Triton writes it: counters without the `_total` suffix."""

    def __init__(self, pod: Pod) -> None:
        self.pod = pod

    def collect(self) -> Iterator[Metric]:
        states = self.pod.models

        def family(name: str, kind: str, doc: str, values: Iterable[tuple[str, float]]) -> Metric:
            metric = Metric(name, doc, kind)
            for model, value in values:
                metric.add_sample(name, {"model": model, "version": "1"}, value)
            return metric

        def each(attribute: str, scale: float = 1.0) -> list[tuple[str, float]]:
            return [(m, math.floor(getattr(s, attribute) * scale)) for m, s in states.items()]

        yield family("nv_inference_request_success", "counter",
                     "Number of successful inference requests", each("success"))  # fmt: skip
        # Triton 2.51 exports a zero per reason from the start (PrometheusSource waits for
        # every rate it reads, this one included, before it calls a window complete).
        failures = Metric("nv_inference_request_failure", "Number of failed inference requests",
                          "counter")  # fmt: skip
        for model in states:
            for reason in FAILURE_REASONS:
                labels = {"model": model, "reason": reason, "version": "1"}
                failures.add_sample("nv_inference_request_failure", labels, 0.0)
        yield failures
        yield family("nv_inference_count", "counter",
                     "Number of inferences performed", each("success"))  # fmt: skip
        yield family("nv_inference_exec_count", "counter",
                     "Number of model executions performed", each("exec_count"))  # fmt: skip
        yield family("nv_inference_request_duration_us", "counter",
                     "Cumulative inference request duration in microseconds",
                     [(m, math.floor(s.queue_us + s.compute_us)) for m, s in states.items()])  # fmt: skip
        yield family("nv_inference_queue_duration_us", "counter",
                     "Cumulative inference queuing duration in microseconds", each("queue_us"))  # fmt: skip
        yield family("nv_inference_compute_input_duration_us", "counter",
                     "Cumulative compute input duration in microseconds",
                     [(m, 0.0) for m in states])  # fmt: skip
        yield family("nv_inference_compute_infer_duration_us", "counter",
                     "Cumulative compute inference duration in microseconds",
                     each("compute_us"))  # fmt: skip
        yield family("nv_inference_compute_output_duration_us", "counter",
                     "Cumulative inference compute output duration in microseconds",
                     [(m, 0.0) for m in states])  # fmt: skip
        yield family("nv_inference_pending_request_count", "gauge",
                     "Instantaneous number of pending requests awaiting execution per-model.",
                     [(m, round(s.pending)) for m, s in states.items()])  # fmt: skip


class Fleet:
    """Every pod's state, the load on each set, and the requests served."""

    def __init__(self, repository_key: str = "", seed: int = 0) -> None:
        self.repository_key = repository_key
        self.pods: dict[str, Pod] = {}  # by IP
        self.rates: dict[str, dict[str, float]] = {}  # set -> model -> requests per second
        # "http" (and "http:<call>": ready, config, load, index, infer, other), "metrics", "prometheus"
        self.requests: Counter[str] = Counter()
        self.random = random.Random(seed)
        self._last_advance = time.monotonic()

    def pod(self, ip: str) -> Pod:
        """The pod at `ip`; one not announced yet answers with the repository's counts."""
        if ip not in self.pods:
            self.pods[ip] = Pod(name=ip, set="")
        return self.pods[ip]

    def advance(self) -> None:
        now = time.monotonic()
        dt, self._last_advance = now - self._last_advance, now
        for pod in self.pods.values():
            rates = self.rates.get(pod.set, {})
            for model, state in pod.models.items():
                state.advance(rates.get(model, 0.0), dt)

    async def run(self, period_s: float = 0.5) -> None:
        while True:
            await asyncio.sleep(period_s)
            self.advance()

    # ---- Triton's HTTP API -------------------------------------------------------------
    def _ip(self, request: web.Request) -> str:
        return request.transport.get_extra_info("sockname")[0]

    def _model(self, request: web.Request) -> tuple[Pod, str, ModelState]:
        pod, model = self.pod(self._ip(request)), request.match_info["model"]
        if model not in pod.models:
            raise _error(400, f"Request for unknown model: '{model}' is not found")
        return pod, model, pod.models[model]

    def _check_key(self, request: web.Request) -> None:
        if self.repository_key and request.headers.get(REPOSITORY_KEY_HEADER) != (
            self.repository_key
        ):
            raise _error(
                403,
                "This API is restricted, expecting header 'tritonscale-repository-key'",
            )

    async def live(self, request: web.Request) -> web.Response:
        return web.Response()

    async def server_metadata(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"name": "triton", "version": TRITON_VERSION, "extensions": ["model_repository"]}
        )

    async def model_ready(self, request: web.Request) -> web.Response:
        self._model(request)
        return web.Response()

    async def config(self, request: web.Request) -> web.Response:
        _, model, state = self._model(request)
        return web.json_response(model_config(model, state.count))

    async def index(self, request: web.Request) -> web.Response:
        self._check_key(request)
        pod = self.pod(self._ip(request))
        return web.json_response(
            [{"name": model, "version": "1", "state": "READY"} for model in pod.models]
        )

    async def load(self, request: web.Request) -> web.Response:
        self._check_key(request)
        _, model, state = self._model(request)
        body = await request.json() if request.can_read_body else {}
        override = (body.get("parameters") or {}).get("config")
        count = state.count
        if override:
            groups = json.loads(override).get("instance_group") or [{}]
            count = sum(int(group.get("count", 1)) for group in groups)
        async with state.lock:  # Triton loads one model's versions one after the other
            await asyncio.sleep(self.random.uniform(*LOAD_DELAY_S))
            self.advance()  # the old count served until now
            if count != state.count:
                state.count, state.changed_at = count, time.time()
            state.loads += 1
        return web.Response()

    async def metrics(self, request: web.Request) -> web.Response:
        registry = CollectorRegistry()
        registry.register(MetricsText(self.pod(self._ip(request))))
        return web.Response(body=generate_latest(registry), content_type="text/plain")

    # ---- the harness's API -------------------------------------------------------------
    async def put_pods(self, request: web.Request) -> web.Response:
        for ip, pod in (await request.json())["pods"].items():
            known = self.pod(ip)
            known.name, known.set = pod["name"], pod["set"]
        return web.json_response({"pods": len(self.pods)})

    async def put_rates(self, request: web.Request) -> web.Response:
        self.advance()  # the old rates until now
        for name, rates in (await request.json())["rates"].items():
            self.rates[name] = {model: float(rate) for model, rate in rates.items()}
        return web.json_response({"sets": len(self.rates)})

    async def state(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "requests": dict(self.requests),
                "pods": {
                    pod.name: {
                        "ip": ip,
                        "set": pod.set,
                        "counts": {m: s.count for m, s in pod.models.items()},
                        "changed_at": {m: s.changed_at for m, s in pod.models.items()},
                        "loads": sum(s.loads for s in pod.models.values()),
                    }
                    for ip, pod in self.pods.items()
                },
            }
        )

    @web.middleware
    async def count_requests(self, request: web.Request, handler: Any) -> web.StreamResponse:
        port = request.transport.get_extra_info("sockname")[1]
        if port == METRICS_PORT:
            agent = request.headers.get("User-Agent", "")
            self.requests["prometheus" if agent.startswith("Prometheus") else "metrics"] += 1
        elif port == HTTP_PORT:
            self.requests["http"] += 1
            self.requests[f"http:{_call_kind(request.path)}"] += 1
        return await handler(request)


def _call_kind(path: str) -> str:
    """Which of Triton's calls a path is: ready, config, load, index, infer or other."""
    last = path.rstrip("/").rsplit("/", 1)[-1]
    return last if last in ("ready", "config", "load", "index", "infer") else "other"


def _error(status: int, message: str) -> web.HTTPException:
    """Triton's error answer: JSON {"error": ...} with the status."""
    kind = {400: web.HTTPBadRequest, 403: web.HTTPForbidden}[status]
    return kind(text=json.dumps({"error": message}), content_type="application/json")


def triton_app(fleet: Fleet) -> web.Application:
    app = web.Application(middlewares=[fleet.count_requests])
    app.add_routes(
        [
            web.get("/v2/health/live", fleet.live),
            web.get("/v2/health/ready", fleet.live),
            web.get("/v2", fleet.server_metadata),
            web.get("/v2/models/{model}/ready", fleet.model_ready),
            web.get("/v2/models/{model}/versions/{version}/ready", fleet.model_ready),
            web.get("/v2/models/{model}/config", fleet.config),
            web.get("/v2/models/{model}/versions/{version}/config", fleet.config),
            web.post("/v2/repository/index", fleet.index),
            web.post("/v2/repository/models/{model}/load", fleet.load),
            web.get("/metrics", fleet.metrics),
        ]
    )
    return app


def control_app(fleet: Fleet) -> web.Application:
    app = web.Application()
    app.add_routes(
        [
            web.put("/fleet/pods", fleet.put_pods),
            web.put("/fleet/rates", fleet.put_rates),
            web.get("/fleet/state", fleet.state),
        ]
    )
    return app


async def serve(control_port: int, repository_key: str, seed: int = 0) -> None:
    """Serve until cancelled."""
    fleet = Fleet(repository_key, seed)
    runners = []
    # One application answers both Triton ports; the port tells HTTP from metrics.
    triton = web.AppRunner(triton_app(fleet), access_log=None)
    control = web.AppRunner(control_app(fleet), access_log=None)
    for runner in (triton, control):
        await runner.setup()
        runners.append(runner)
    sites = [
        web.TCPSite(triton, "0.0.0.0", HTTP_PORT, backlog=1024),
        web.TCPSite(triton, "0.0.0.0", METRICS_PORT, backlog=1024),
        web.TCPSite(control, "127.0.0.1", control_port),
    ]
    for site in sites:
        await site.start()
    print(f"fleet: serving Triton on :{HTTP_PORT} and :{METRICS_PORT}", flush=True)
    try:
        await fleet.run()
    finally:
        for runner in runners:
            await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    import os

    from tritonscale import REPOSITORY_KEY_ENV

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--control-port", type=int, default=9000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    asyncio.run(serve(args.control_port, os.environ.get(REPOSITORY_KEY_ENV, ""), args.seed))


if __name__ == "__main__":
    main()
