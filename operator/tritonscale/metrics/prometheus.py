"""PrometheusSource: the signals from PromQL over Prometheus's HTTP API (the production path).

The pod set is a label matcher: `namespace="ns",pod=~"a|b"` when the endpoints carry a
namespace (Kubernetes), else `instance=~"host:8002|..."` from their metrics URLs, else the
`matcher` given to the constructor (e.g. `job="triton"`). The queries are written from
tritonscale.metrics.queries (`DEFAULT_QUERIES`, overridable per key): `string.Template`s over
`$selector` (pod set and models), `$pods` (pod set only), `$window` and `$step`.

It also answers the healer's question, a pod's request counters (`request_counters`), so that
with Prometheus in place the operator does not read every pod's /metrics on every tick.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from string import Template

import aiohttp

from tritonscale.core.signals import GpuSignals, MetricSnapshot, MetricsUnavailable, ModelSignals
from tritonscale.metrics import queries
from tritonscale.metrics.prometheus_api import PrometheusApiError, prometheus_get_async
from tritonscale.metrics.source import RATE_FIELDS
from tritonscale.triton.connections import Connections
from tritonscale.triton.endpoints import Endpoint

_SCOPE, _PODS = queries.SOURCE_SCOPE, queries.SOURCE_POD_SCOPE

# Keys are ModelSignals fields (plus the pod count, the first sample time and the GPU).
# Per-model queries must return one series per model, labelled `model`.
DEFAULT_QUERIES: dict[str, str] = {
    "request_rate": queries.request_rate(_SCOPE),
    "failure_rate": queries.failure_rate(_SCOPE),
    "execution_rate": queries.execution_rate(_SCOPE),
    "compute_seconds_per_second": queries.compute_seconds_per_second(_SCOPE),
    "queue_seconds_per_second": queries.queue_seconds_per_second(_SCOPE),
    "pending_requests": queries.pending_requests(_SCOPE),
    "streams_in_flight": queries.streams_in_flight(_SCOPE),
    "pods_reporting": queries.pods_reporting(_SCOPE),
    # The earliest sample of the window, per model: the window is complete when it is
    # about `window` old.
    "first_sample": (
        f"min by (model) (min_over_time(timestamp({_SCOPE.series(queries.REQUEST_SUCCESS)})"
        "[$window:$step]))"
    ),
    # The busiest GPU; Triton's own metrics first, DCGM exporter's names as a fallback.
    "gpu_utilization": queries.gpu_utilization(_PODS),
    "gpu_memory_fraction": queries.gpu_memory_fraction(_PODS),
    "gpu_utilization_dcgm": queries.gpu_utilization_dcgm(_PODS),
    "gpu_memory_fraction_dcgm": queries.gpu_memory_fraction_dcgm(_PODS),
}


# A pod's (BACKEND failures, successes), by its `pod` (or `instance`) label.
_Counters = dict[str, tuple[float, float]]


def _literal(value: str) -> str:
    """A PromQL string literal's content."""
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _regex_alternatives(values: Iterable[str]) -> str:
    # re.escape escapes more than RE2 needs, but RE2 accepts every escape it emits for
    # names, IPs and ports; backslashes are doubled for the PromQL string literal.
    return "|".join(re.escape(v).replace("\\", "\\\\") for v in sorted(set(values)))


def pod_matcher(endpoints: Sequence[Endpoint], default: str | None = None) -> str:
    """The PromQL label matcher for a pod set (without braces)."""
    namespaces = {e.namespace for e in endpoints}
    if endpoints and None not in namespaces and len(namespaces) == 1:
        namespace = next(iter(namespaces))
        return f'namespace="{namespace}",pod=~"{_regex_alternatives(e.name for e in endpoints)}"'
    instances = [e.metrics_instance for e in endpoints]
    if endpoints and all(instances):
        return f'instance=~"{_regex_alternatives(i for i in instances if i)}"'
    if default is not None:
        return default
    raise MetricsUnavailable(
        "cannot tell Prometheus which pods to read: the endpoints carry neither a namespace "
        "nor a metrics URL, and no matcher was configured"
    )


class PrometheusSource:
    """Signals from Prometheus's HTTP API (`/api/v1/query`)."""

    # A read of the request counters serves every check of its namespace and model for this
    # long: the checks of one tick come together, and Prometheus's copy is a scrape old anyway.
    COUNTERS_MAX_AGE_S = 2.0

    def __init__(
        self,
        url: str,
        *,
        queries: Mapping[str, str] | None = None,
        matcher: str | None = None,
        timeout_s: float = 5.0,
        connections: Connections | None = None,
    ) -> None:
        unknown = set(queries or {}) - set(DEFAULT_QUERIES)
        if unknown:
            raise ValueError(
                f"unknown query keys: {', '.join(sorted(unknown))} (known: {', '.join(DEFAULT_QUERIES)})"
            )
        self.url = url.rstrip("/")
        self.queries = {**DEFAULT_QUERIES, **(queries or {})}
        self.matcher = matcher
        self.timeout_s = timeout_s
        # The driver's kept-open HTTP session (a session per snapshot without it).
        self.connections = connections
        # (namespace, model) -> (when asked, the read): {pod: (BACKEND failures, successes)}.
        self._counters: dict[tuple[str | None, str], tuple[float, asyncio.Task[_Counters]]] = {}

    async def query(self, promql: str, session: aiohttp.ClientSession | None = None) -> list[dict]:
        """One instant query; MetricsUnavailable with one line on any failure."""
        if session is None and self.connections is not None:
            session = self.connections.session()
        if session is None:
            async with aiohttp.ClientSession() as own:
                return await self.query(promql, own)
        try:
            data = await prometheus_get_async(
                session, self.url, "query", {"query": promql}, timeout_s=self.timeout_s
            )
        except PrometheusApiError as error:
            if "failed:" in str(error):
                raise MetricsUnavailable(f"{error} (query: {promql})") from None
            raise MetricsUnavailable(str(error)) from None
        return data["result"]

    async def request_counters(self, endpoint: Endpoint, model: str) -> tuple[float, float] | None:
        """(BACKEND failures, successes) of `model` on one pod: their totals as Prometheus last
        scraped them (the healer's reader, `RequestCounters`). None when Prometheus has no
        series for the pod (not scraped yet, or not at all); MetricsUnavailable when it cannot
        answer. One pair of queries serves every pod of the namespace and model (pods by the
        `pod` label; by `instance` where the endpoints carry no namespace)."""
        if endpoint.namespace is not None:
            key, label, name = (endpoint.namespace, model), "pod", endpoint.name
            where = f'namespace="{_literal(endpoint.namespace)}"'
        else:
            instance = endpoint.metrics_instance
            if instance is None:
                return None
            key, label, name, where = (None, model), "instance", instance, self.matcher or ""
        selector = ",".join(part for part in (where, f'model="{_literal(model)}"') if part)
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        kept = self._counters.get(key)
        if (
            kept is None
            or now - kept[0] > self.COUNTERS_MAX_AGE_S
            or kept[1].get_loop() is not loop
        ):
            kept = (now, loop.create_task(self._read_counters(selector, label)))
            self._counters[key] = kept
        # Shielded: a check that is cancelled leaves the read to the others waiting on it.
        return (await asyncio.shield(kept[1])).get(name)

    async def _read_counters(self, selector: str, label: str) -> _Counters:
        scope = queries.Scope(selector, by=(label,))
        failures, successes = await asyncio.gather(
            self.query(queries.backend_failures_total(scope)),
            self.query(queries.successes_total(scope)),
        )
        counters: _Counters = {}
        for row in successes:
            counters[row["metric"].get(label, "")] = (0.0, float(row["value"][1]))
        for row in failures:
            pod = row["metric"].get(label, "")
            counters[pod] = (float(row["value"][1]), counters.get(pod, (0.0, 0.0))[1])
        return counters

    async def snapshot(
        self,
        models: Sequence[str],
        endpoints: Sequence[Endpoint],
        window_s: float,
        decoupled: Collection[str] = (),
    ) -> MetricSnapshot:
        if self.connections is not None:
            session = self.connections.session()
            return await self._snapshot(session, models, endpoints, window_s, decoupled)
        async with aiohttp.ClientSession() as session:
            return await self._snapshot(session, models, endpoints, window_s, decoupled)

    async def _snapshot(
        self,
        session: aiohttp.ClientSession,
        models: Sequence[str],
        endpoints: Sequence[Endpoint],
        window_s: float,
        decoupled: Collection[str],
    ) -> MetricSnapshot:
        pods = pod_matcher(endpoints, self.matcher)
        selector = f'{pods},model=~"{_regex_alternatives(models)}"'
        window = max(1, round(window_s))
        # The resolution of the first-sample subquery: at most 300 points per series.
        step = max(1, window // 300)
        fill = {"selector": selector, "pods": pods, "window": f"{window}s", "step": f"{step}s"}

        async def run(key: str) -> list[dict]:
            return await self.query(Template(self.queries[key]).substitute(fill), session)

        values: dict[str, dict[str, float]] = {}
        taken_at = time.time()
        keys = (*RATE_FIELDS, "pods_reporting", "first_sample")
        if decoupled:
            keys += ("streams_in_flight",)
        # The queries go together: the snapshot waits for the slowest, not for their sum.
        answers = await asyncio.gather(*(run(key) for key in keys), return_exceptions=True)
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer
        for key, rows in zip(keys, answers, strict=True):
            assert not isinstance(rows, BaseException)
            values[key] = {}
            for row in rows:
                model = row["metric"].get("model")
                if model is not None:
                    values[key][model] = float(row["value"][1])
                    taken_at = float(row["value"][0])

        complete = True
        covered = float(window)
        signals = {}
        for model, pods_reporting in values["pods_reporting"].items():
            fields = {}
            for name in RATE_FIELDS:
                if model in values[name]:
                    fields[name] = values[name][model]
                else:
                    # No rate yet (fewer than two samples in the window): a young series.
                    fields[name] = 0.0
                    complete = False
            first = values["first_sample"].get(model)
            model_covered = taken_at - first if first is not None else 0.0
            covered = min(covered, model_covered)
            if model_covered < window - max(2 * step, 0.1 * window):
                complete = False
            is_decoupled = model in decoupled
            signals[model] = ModelSignals(
                model=model,
                pods_reporting=int(pods_reporting),
                decoupled=is_decoupled,
                streams_in_flight=(
                    values["streams_in_flight"].get(model) if is_decoupled else None
                ),
                **fields,
            )

        return MetricSnapshot(
            taken_at=taken_at,
            window_s=max(0.0, covered),
            models=signals,
            gpu=await self._gpu(run),
            complete=complete and bool(signals),
        )

    async def _gpu(self, run: Callable[[str], Awaitable[list[dict]]]) -> GpuSignals | None:
        async def scalar(key: str) -> float | None:
            rows = await run(key)
            if not rows:
                return None
            value = float(rows[0]["value"][1])
            return value if math.isfinite(value) else None

        utilization = await scalar("gpu_utilization")
        memory = await scalar("gpu_memory_fraction")
        if utilization is None:
            utilization = await scalar("gpu_utilization_dcgm")
            if memory is None:
                memory = await scalar("gpu_memory_fraction_dcgm")
        if utilization is None:
            return None
        return GpuSignals(utilization=utilization, memory_fraction=memory)
