"""Metrics sources: Triton's counters turned into a `MetricSnapshot` for one pod set.

Both sources answer `snapshot(models, endpoints, window_s)` (the `MetricsSource` protocol)
with per-model rates over the last `window_s` seconds, summed over the pods:

- `PrometheusSource(url)`: PromQL over Prometheus's HTTP API (the production path). The pod
  set is a label matcher: `namespace="ns",pod=~"a|b"` when the endpoints carry a
  namespace (Kubernetes), else `instance=~"host:8002|..."` from their metrics URLs, else
  the `matcher` given to the constructor (e.g. `job="triton"`). The queries are a dict
  (`DEFAULT_QUERIES`, overridable per key) of `string.Template`s over `$selector` (pod set
  and models), `$pods` (pod set only), `$window` and `$step`.
- `ScrapeSource(metrics_urls)`: reads each Triton's /metrics itself (prometheus_client's
  text parser), keeps a short history of samples per target, and computes the rates,
  counting a counter that went down (a restarted Triton) from zero, as Prometheus's
  `rate()` does. Samples are taken when a snapshot is asked for (once per control tick;
  at most once per `min_scrape_interval_s`, so several autoscalers share one scrape) or by
  calling `scrape()` more often.

Missing data is handled like the HPA handles it, conservatively: a source that cannot read
*every* target raises `MetricsUnavailable` (one line naming the target) rather than return a
snapshot of fewer pods, whose lower load could pass for a reason to scale down; the
driver holds the count (FailedGetMetrics). A series younger than the window gives
`complete=False`, on which the policy never scales down.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from string import Template
from typing import Protocol

import requests
from prometheus_client.parser import text_string_to_metric_families

from tritonscale.core.signals import GpuSignals, MetricSnapshot, MetricsUnavailable, ModelSignals
from tritonscale.metrics.prometheus_api import PrometheusApiError, prometheus_get
from tritonscale.triton.endpoints import Endpoint


class MetricsSource(Protocol):
    def snapshot(
        self, models: Sequence[str], endpoints: Sequence[Endpoint], window_s: float
    ) -> MetricSnapshot:
        """Signals of `models` over the last `window_s` s, summed over the `endpoints`' pods.

        Raises MetricsUnavailable (one line) when it cannot.
        """
        ...


# ---------------------------------------------------------------------------------------
# Prometheus

# Keys are ModelSignals fields (plus the pod count, the first sample time and the GPU).
# Per-model queries must return one series per model, labelled `model`.
DEFAULT_QUERIES: dict[str, str] = {
    "request_rate": "sum by (model) (rate(nv_inference_request_success{$selector}[$window]))",
    "failure_rate": "sum by (model) (rate(nv_inference_request_failure{$selector}[$window]))",
    "execution_rate": "sum by (model) (rate(nv_inference_exec_count{$selector}[$window]))",
    "compute_seconds_per_second": (
        "sum by (model) ("
        "rate(nv_inference_compute_input_duration_us{$selector}[$window])"
        " + rate(nv_inference_compute_infer_duration_us{$selector}[$window])"
        " + rate(nv_inference_compute_output_duration_us{$selector}[$window])"
        ") / 1e6"
    ),
    "queue_seconds_per_second": (
        "sum by (model) (rate(nv_inference_queue_duration_us{$selector}[$window])) / 1e6"
    ),
    "pending_requests": "sum by (model) (nv_inference_pending_request_count{$selector})",
    # Pods (instances) that export the model now.
    "pods_reporting": (
        "count by (model) (group by (model, instance, pod) (nv_inference_request_success{$selector}))"
    ),
    # The earliest sample of the window, per model: the window is complete when it is
    # about `window` old.
    "first_sample": (
        "min by (model) (min_over_time(timestamp(nv_inference_request_success{$selector})"
        "[$window:$step]))"
    ),
    # The busiest GPU; Triton's own metrics first, DCGM exporter's names as a fallback.
    "gpu_utilization": "max(nv_gpu_utilization{$pods})",
    "gpu_memory_fraction": "max(nv_gpu_memory_used_bytes{$pods} / nv_gpu_memory_total_bytes{$pods})",
    "gpu_utilization_dcgm": "max(DCGM_FI_DEV_GPU_UTIL{$pods}) / 100",
    "gpu_memory_fraction_dcgm": (
        "max(DCGM_FI_DEV_FB_USED{$pods} / (DCGM_FI_DEV_FB_USED{$pods} + DCGM_FI_DEV_FB_FREE{$pods}))"
    ),
}

_MODEL_FIELDS = (
    "request_rate",
    "failure_rate",
    "execution_rate",
    "compute_seconds_per_second",
    "queue_seconds_per_second",
    "pending_requests",
)


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

    def __init__(
        self,
        url: str,
        *,
        queries: Mapping[str, str] | None = None,
        matcher: str | None = None,
        timeout_s: float = 5.0,
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
        self._session = requests.Session()

    def query(self, promql: str) -> list[dict]:
        """One instant query; MetricsUnavailable with one line on any failure."""
        try:
            data = prometheus_get(
                self.url,
                "query",
                {"query": promql},
                timeout_s=self.timeout_s,
                session=self._session,
            )
        except PrometheusApiError as error:
            if "failed:" in str(error):
                raise MetricsUnavailable(f"{error} (query: {promql})") from None
            raise MetricsUnavailable(str(error)) from None
        return data["result"]

    def snapshot(
        self, models: Sequence[str], endpoints: Sequence[Endpoint], window_s: float
    ) -> MetricSnapshot:
        pods = pod_matcher(endpoints, self.matcher)
        selector = f'{pods},model=~"{_regex_alternatives(models)}"'
        window = max(1, round(window_s))
        # The resolution of the first-sample subquery: at most 300 points per series.
        step = max(1, window // 300)
        fill = {"selector": selector, "pods": pods, "window": f"{window}s", "step": f"{step}s"}

        def run(key: str) -> list[dict]:
            return self.query(Template(self.queries[key]).substitute(fill))

        values: dict[str, dict[str, float]] = {}
        taken_at = time.time()
        for key in (*_MODEL_FIELDS, "pods_reporting", "first_sample"):
            values[key] = {}
            for row in run(key):
                model = row["metric"].get("model")
                if model is not None:
                    values[key][model] = float(row["value"][1])
                    taken_at = float(row["value"][0])

        complete = True
        covered = float(window)
        signals = {}
        for model, pods_reporting in values["pods_reporting"].items():
            fields = {}
            for name in _MODEL_FIELDS:
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
            signals[model] = ModelSignals(model=model, pods_reporting=int(pods_reporting), **fields)

        return MetricSnapshot(
            taken_at=taken_at,
            window_s=max(0.0, covered),
            models=signals,
            gpu=self._gpu(run),
            complete=complete and bool(signals),
        )

    def _gpu(self, run: Callable[[str], list[dict]]) -> GpuSignals | None:
        def scalar(key: str) -> float | None:
            rows = run(key)
            if not rows:
                return None
            value = float(rows[0]["value"][1])
            return value if math.isfinite(value) else None

        utilization = scalar("gpu_utilization")
        memory = scalar("gpu_memory_fraction")
        if utilization is None:
            utilization = scalar("gpu_utilization_dcgm")
            if memory is None:
                memory = scalar("gpu_memory_fraction_dcgm")
        if utilization is None:
            return None
        return GpuSignals(utilization=utilization, memory_fraction=memory)


# ---------------------------------------------------------------------------------------
# Direct scrape

COUNTERS = {
    "nv_inference_request_success": "request_rate",
    "nv_inference_request_failure": "failure_rate",
    "nv_inference_exec_count": "execution_rate",
    "nv_inference_compute_input_duration_us": "compute_seconds_per_second",
    "nv_inference_compute_infer_duration_us": "compute_seconds_per_second",
    "nv_inference_compute_output_duration_us": "compute_seconds_per_second",
    "nv_inference_queue_duration_us": "queue_seconds_per_second",
}
_MICROSECONDS = {
    "compute_seconds_per_second",
    "queue_seconds_per_second",
}
PENDING = "nv_inference_pending_request_count"
GPU_GAUGES = ("nv_gpu_utilization", "nv_gpu_memory_used_bytes", "nv_gpu_memory_total_bytes")
_KEPT = {*COUNTERS, PENDING, *GPU_GAUGES}

# A series: (metric name, its labels as a sorted tuple).
Series = tuple[str, tuple[tuple[str, str], ...]]


@dataclass(frozen=True)
class Sample:
    at: float  # unix seconds
    values: dict[Series, float]


def parse_metrics(text: str) -> dict[Series, float]:
    """The series of Triton's /metrics text the sources use."""
    values: dict[Series, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            # The parser names a counter's samples `<family>_total`; Triton's have no suffix.
            if family.type == "counter" and name == f"{family.name}_total":
                name = family.name
            if name in _KEPT:
                values[(name, tuple(sorted(sample.labels.items())))] = float(sample.value)
    return values


def counter_increase(samples: Sequence[float]) -> float:
    """The increase of a counter over consecutive samples; a drop is a reset to zero."""
    increase = 0.0
    for before, after in zip(samples, samples[1:], strict=False):
        increase += after - before if after >= before else after
    return increase


class ScrapeSource:
    """Signals computed from each Triton's /metrics, read directly.

    `metrics_urls` are used when the endpoints of a snapshot carry no metrics URL.
    `max_window_s` bounds the history kept per target. `clock` is injectable.
    """

    def __init__(
        self,
        metrics_urls: Sequence[str] = (),
        *,
        max_window_s: float = 600.0,
        min_scrape_interval_s: float = 0.5,
        timeout_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.metrics_urls = list(metrics_urls)
        self.max_window_s = max_window_s
        self.min_scrape_interval_s = min_scrape_interval_s
        self.timeout_s = timeout_s
        self._clock = clock
        self._history: dict[str, deque[Sample]] = {}
        self._lock = threading.Lock()
        self._session = requests.Session()

    def targets(self, endpoints: Sequence[Endpoint] = ()) -> list[str]:
        urls = [e.metrics_url for e in endpoints if e.metrics_url]
        return urls or list(self.metrics_urls)

    def scrape(self, targets: Sequence[str] | None = None) -> None:
        """Take one sample of each target (skipped when the last is fresher than the minimum)."""
        targets = self.targets() if targets is None else targets
        if not targets:
            raise MetricsUnavailable("no Triton metrics URL to scrape")
        for url in targets:
            now = self._clock()
            with self._lock:
                history = self._history.setdefault(url, deque())
                if history and now - history[-1].at < self.min_scrape_interval_s:
                    continue
            try:
                response = self._session.get(url, timeout=self.timeout_s)
                response.raise_for_status()
                values = parse_metrics(response.text)
            except requests.RequestException as error:
                raise MetricsUnavailable(
                    f"cannot read Triton metrics at {url} ({type(error).__name__})"
                ) from None
            except ValueError as error:
                raise MetricsUnavailable(f"unreadable Triton metrics at {url}: {error}") from None
            with self._lock:
                history.append(Sample(self._clock(), values))
                while history and history[0].at < history[-1].at - self.max_window_s - 60:
                    history.popleft()
                # Forget targets gone for longer than any window (pods replaced in Kubernetes).
                for gone in [
                    url
                    for url, samples in self._history.items()
                    if samples and samples[-1].at < now - self.max_window_s - 60
                ]:
                    del self._history[gone]

    def snapshot(
        self, models: Sequence[str], endpoints: Sequence[Endpoint] = (), window_s: float = 60.0
    ) -> MetricSnapshot:
        targets = self.targets(endpoints)
        self.scrape(targets)
        wanted = set(models)
        totals: dict[str, dict[str, float]] = {}
        pods: dict[str, int] = {}
        gpu_utilization: list[float] = []
        gpu_memory: list[float] = []
        covered = math.inf
        taken_at = 0.0
        with self._lock:
            windows = [self._window(list(self._history[url]), window_s) for url in targets]
        for samples in windows:
            latest = samples[-1]
            taken_at = max(taken_at, latest.at)
            elapsed = latest.at - samples[0].at
            covered = min(covered, elapsed)
            per_model: dict[str, dict[str, float]] = {}
            for series, value in latest.values.items():
                name, labels = series
                model = dict(labels).get("model")
                if name in COUNTERS and model in wanted:
                    fields = per_model.setdefault(model, dict.fromkeys(_MODEL_FIELDS, 0.0))
                    field = COUNTERS[name]
                    history = [s.values[series] for s in samples if series in s.values]
                    rate = counter_increase(history) / elapsed if elapsed > 0 else 0.0
                    fields[field] += rate / 1e6 if field in _MICROSECONDS else rate
                elif name == PENDING and model in wanted:
                    fields = per_model.setdefault(model, dict.fromkeys(_MODEL_FIELDS, 0.0))
                    fields["pending_requests"] += value
            for model, fields in per_model.items():
                pods[model] = pods.get(model, 0) + 1
                total = totals.setdefault(model, dict.fromkeys(_MODEL_FIELDS, 0.0))
                for key, value in fields.items():
                    total[key] += value
            utilization, memory = _gpu_from(latest.values)
            gpu_utilization += utilization
            gpu_memory += memory
        signals = {
            model: ModelSignals(model=model, pods_reporting=pods[model], **fields)
            for model, fields in totals.items()
        }
        gpu = None
        if gpu_utilization:
            gpu = GpuSignals(max(gpu_utilization), max(gpu_memory) if gpu_memory else None)
        covered = 0.0 if covered is math.inf else covered
        return MetricSnapshot(
            taken_at=taken_at,
            window_s=covered,
            models=signals,
            gpu=gpu,
            # Allow a tenth of the window of jitter: samples come at tick times.
            complete=covered >= 0.9 * window_s,
        )

    @staticmethod
    def _window(samples: list[Sample], window_s: float) -> list[Sample]:
        """The samples from the one nearest to `window_s` ago up to the latest."""
        start_at = samples[-1].at - window_s
        first = min(range(len(samples)), key=lambda i: abs(samples[i].at - start_at))
        return samples[first:]


def _gpu_from(values: Mapping[Series, float]) -> tuple[list[float], list[float]]:
    utilization = [v for (name, _), v in values.items() if name == "nv_gpu_utilization"]
    used = {labels: v for (name, labels), v in values.items() if name == "nv_gpu_memory_used_bytes"}
    total = {
        labels: v for (name, labels), v in values.items() if name == "nv_gpu_memory_total_bytes"
    }
    memory = [used[labels] / total[labels] for labels in used if total.get(labels)]
    return utilization, memory
