"""PrometheusSource: the signals from PromQL over Prometheus's HTTP API (the production path).

The pod set is a label matcher: `namespace="ns",pod=~"a|b"` when the endpoints carry a
namespace (Kubernetes), else `instance=~"host:8002|..."` from their metrics URLs, else the
`matcher` given to the constructor (e.g. `job="triton"`). The signals are written from
tritonscale.metrics.queries (`DEFAULT_QUERIES`, overridable per key): `string.Template`s over
`$selector` (pod set and models), `$pods` (pod set only), `$pod` (the label naming a pod:
`pod`, or `instance` where the pods carry no namespace), `$window` and `$step`, each one series
per pod and model (or per pod, for the GPU).

A snapshot asks Prometheus twice, however many models and pods the set has: once for every
model signal (`MODEL_KEYS`), once for the GPU (`GPU_KEYS`); each key's answer is told apart by
a `signal` label (`label_replace`), and the keys are joined with `or`. The per-pod answers are
summed here, and they keep each pod's request totals, from which the healer's question, a
pod's request counters (`request_counters`), is answered without a query of its own while
the last snapshot is fresh: with Prometheus in place the operator reads no pod's /metrics.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from string import Template
from typing import Any

import aiohttp

from tritonscale.core.signals import GpuSignals, MetricSnapshot, MetricsUnavailable, ModelSignals
from tritonscale.metrics import queries
from tritonscale.metrics.prometheus_api import PrometheusApiError, prometheus_get_async
from tritonscale.metrics.source import RATE_FIELDS
from tritonscale.triton.connections import Connections
from tritonscale.triton.endpoints import Endpoint

_SCOPE, _PODS = queries.SOURCE_SCOPE, queries.SOURCE_POD_SCOPE

# Keys are ModelSignals fields, and what the snapshot needs besides. Model keys must return
# one series per pod and model, labelled `$pod` and `model`; GPU keys one series per pod.
DEFAULT_QUERIES: dict[str, str] = {
    "request_rate": queries.request_rate(_SCOPE),
    "failure_rate": queries.failure_rate(_SCOPE),
    "execution_rate": queries.execution_rate(_SCOPE),
    "compute_seconds_per_second": queries.compute_seconds_per_second(_SCOPE),
    "queue_seconds_per_second": queries.queue_seconds_per_second(_SCOPE),
    "pending_requests": queries.pending_requests(_SCOPE),
    "streams_in_flight": queries.streams_in_flight(_SCOPE),
    # Rows (Triton's inferences) per second: over request_rate, the rows a request carries.
    "inference_rate": queries.inference_rate(_SCOPE),
    # 1 for each pod that exports the model: the pods reporting it.
    "exported": queries.exported(_SCOPE),
    # The earliest sample of the window: the window is complete when it is about `window` old.
    "first_sample": queries.first_sample(_SCOPE),
    # The request totals (not rates), for the healer's checks between the snapshots.
    "successes_total": queries.successes_total(_SCOPE),
    "backend_failures_total": queries.backend_failures_total(_SCOPE),
    # The GPU; Triton's own metrics first, the DCGM exporter's names where a pod has none.
    "gpu_utilization": queries.gpu_utilization(_PODS),
    "gpu_memory_fraction": queries.gpu_memory_fraction(_PODS),
    "gpu_utilization_dcgm": queries.gpu_utilization_dcgm(_PODS),
    "gpu_memory_fraction_dcgm": queries.gpu_memory_fraction_dcgm(_PODS),
}
MODEL_KEYS = (
    *RATE_FIELDS,
    "streams_in_flight",
    "inference_rate",
    "exported",
    "first_sample",
    "successes_total",
    "backend_failures_total",
)
# Each GPU signal: Triton's own, or the DCGM exporter's where a pod has no series of Triton's.
GPU_KEYS = {
    "gpu_utilization": "gpu_utilization_dcgm",
    "gpu_memory_fraction": "gpu_memory_fraction_dcgm",
}
SIGNAL_LABEL = "signal"


def tagged(signals: Mapping[str, str]) -> str:
    """One PromQL query answering every signal, each answer labelled `signal="<key>"`."""
    return "\nor\n".join(
        f'label_replace(\n{promql}\n, "{SIGNAL_LABEL}", "{key}", "", "")'
        for key, promql in signals.items()
    )


class QueryFailed(MetricsUnavailable):
    """Prometheus refused a query (it does not parse, or cannot be evaluated)."""


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
    # The totals a snapshot brought serve the checks until the next snapshot, for this long
    # at most (a tick's checks come before its snapshot: they read the last tick's).
    SNAPSHOT_COUNTERS_MAX_AGE_S = 60.0

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
        # (namespace, model) -> pod -> (when, its counters) as the last snapshot of its set
        # found them (the sets of a namespace share the key, each with its own pods).
        self._snapshot_counters: dict[
            tuple[str | None, str], dict[str, tuple[float, tuple[float, float]]]
        ] = {}
        self._pruned_at: dict[str | None, float] = {}  # namespace -> monotonic seconds

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
                raise QueryFailed(f"{error} (query: {' '.join(promql.split())})") from None
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
        now = time.monotonic()
        seen = self._snapshot_counters.get(key, {}).get(name)
        if seen is not None and now - seen[0] <= self.SNAPSHOT_COUNTERS_MAX_AGE_S:
            return seen[1]
        selector = ",".join(part for part in (where, f'model="{_literal(model)}"') if part)
        loop = asyncio.get_running_loop()
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
        reuse_within_s: float = 0.0,  # Prometheus reads the pods on its own schedule
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
        pod_label = "pod" if pods.startswith("namespace=") else "instance"
        selector = f'{pods},model=~"{_regex_alternatives(models)}"'
        window = max(1, round(window_s))
        # The resolution of the first-sample subquery: at most 300 points per series.
        step = max(1, window // 300)
        fill = {
            "selector": selector,
            "pods": pods,
            "pod": pod_label,
            "window": f"{window}s",
            "step": f"{step}s",
        }

        def promql(key: str) -> str:
            return Template(self.queries[key]).substitute(fill)

        model_signals = {key: promql(key) for key in MODEL_KEYS}
        gpu_signals = {
            key: f"{promql(key)}\nor\n{promql(fallback)}" for key, fallback in GPU_KEYS.items()
        }
        # The two queries go together: the snapshot waits for the slower, not for their sum.
        try:
            model_rows, gpu_rows = await asyncio.gather(
                self.query(tagged(model_signals), session),
                self.query(tagged(gpu_signals), session),
            )
        except QueryFailed:
            await self._name_failed_query({**model_signals, **gpu_signals}, session)
            raise

        # signal -> model -> pod -> value
        values: dict[str, dict[str, dict[str, float]]] = {key: {} for key in MODEL_KEYS}
        taken_at = time.time()
        for row in model_rows:
            labels = row["metric"]
            key, model = labels.get(SIGNAL_LABEL), labels.get("model")
            if key in values and model is not None:
                values[key].setdefault(model, {})[labels.get(pod_label, "")] = float(
                    row["value"][1]
                )
                taken_at = float(row["value"][0])
        self._keep_counters(endpoints, values)

        complete = True
        covered = float(window)
        signals = {}
        for model, exporting in values["exported"].items():
            fields = {}
            for name in RATE_FIELDS:
                if model in values[name]:
                    fields[name] = sum(values[name][model].values())
                else:
                    # No rate yet (fewer than two samples in the window): a young series.
                    fields[name] = 0.0
                    complete = False
            first = min(values["first_sample"].get(model, {}).values(), default=None)
            model_covered = taken_at - first if first is not None else 0.0
            covered = min(covered, model_covered)
            if model_covered < window - max(2 * step, 0.1 * window):
                complete = False
            is_decoupled = model in decoupled
            streams = values["streams_in_flight"].get(model)
            rows = values["inference_rate"].get(model)
            signals[model] = ModelSignals(
                model=model,
                pods_reporting=len(exporting),
                decoupled=is_decoupled,
                streams_in_flight=sum(streams.values()) if is_decoupled and streams else None,
                inference_rate=sum(rows.values()) if rows else None,
                **fields,
            )

        return MetricSnapshot(
            taken_at=taken_at,
            window_s=max(0.0, covered),
            models=signals,
            gpu=_gpu(gpu_rows),
            complete=complete and bool(signals),
        )

    async def _name_failed_query(
        self, signals: Mapping[str, str], session: aiohttp.ClientSession
    ) -> None:
        """Ask each signal alone, to raise the failure of the one that Prometheus refuses
        (a query of the user's, overriding a default) rather than that of the whole."""
        for key, promql in signals.items():
            try:
                await self.query(promql, session)
            except QueryFailed as error:
                raise QueryFailed(f"the {key} query: {error}") from None

    def _keep_counters(
        self, endpoints: Sequence[Endpoint], values: Mapping[str, Mapping[str, Mapping[str, float]]]
    ) -> None:
        """Each model's per-pod request totals, for the healer's checks until the next one."""
        namespaces = {e.namespace for e in endpoints}
        if len(namespaces) != 1:
            return
        namespace = next(iter(namespaces))
        now = time.monotonic()
        for model, successes in values["successes_total"].items():
            failures = values["backend_failures_total"].get(model, {})
            kept = self._snapshot_counters.setdefault((namespace, model), {})
            for pod, total in successes.items():
                kept[pod] = (now, (failures.get(pod, 0.0), total))
        # Pods gone for longer than the counters serve are forgotten (replaced pods): a look
        # over the namespace's pods once per SNAPSHOT_COUNTERS_MAX_AGE_S, not at every
        # snapshot (a thousand pods share the key).
        if now - self._pruned_at.get(namespace, 0.0) > self.SNAPSHOT_COUNTERS_MAX_AGE_S:
            self._pruned_at[namespace] = now
            for key, kept in self._snapshot_counters.items():
                if key[0] == namespace:
                    for pod in [
                        p
                        for p, (at, _) in kept.items()
                        if now - at > 2 * self.SNAPSHOT_COUNTERS_MAX_AGE_S
                    ]:
                        del kept[pod]


def _gpu(rows: Sequence[Mapping[str, Any]]) -> GpuSignals | None:
    """The busiest GPU of the pods that report one (None: none does, CPU pods)."""
    found: dict[str, list[float]] = {}
    for row in rows:
        value = float(row["value"][1])
        if math.isfinite(value):
            found.setdefault(row["metric"].get(SIGNAL_LABEL, ""), []).append(value)
    utilization = found.get("gpu_utilization")
    if not utilization:
        return None
    memory = found.get("gpu_memory_fraction")
    return GpuSignals(utilization=max(utilization), memory_fraction=max(memory) if memory else None)
