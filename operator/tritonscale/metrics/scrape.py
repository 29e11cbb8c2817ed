"""ScrapeSource: the signals computed from each Triton's /metrics, read directly.

Used where no Prometheus runs. It parses the text with prometheus_client's parser, keeps a
short history of samples per target, and computes the rates itself, counting a counter that
went down (a restarted Triton) from zero, as Prometheus's `rate()` does. Samples are taken
when a snapshot is asked for (once per control tick; at most once per
`min_scrape_interval_s`, so several autoscalers share one scrape), when the healer asks for a
pod's request counters (`request_counters`: the tick's snapshot then shares that read), or by
calling `scrape()` more often. The metric names come from tritonscale.metrics.queries, as the PromQL does.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import aiohttp

from tritonscale.core.signals import GpuSignals, MetricSnapshot, MetricsUnavailable, ModelSignals
from tritonscale.metrics import queries
from tritonscale.metrics.source import RATE_FIELDS
from tritonscale.triton import metrics_text
from tritonscale.triton.client import TritonError, TritonUnreachable, fetch_metrics_text
from tritonscale.triton.connections import Connections
from tritonscale.triton.endpoints import Endpoint
from tritonscale.triton.metrics_text import Series

COUNTERS = {
    queries.REQUEST_SUCCESS: "request_rate",
    queries.REQUEST_FAILURE: "failure_rate",
    queries.EXECUTION_COUNT: "execution_rate",
    **dict.fromkeys(queries.COMPUTE_DURATIONS, "compute_seconds_per_second"),
    queries.QUEUE_DURATION: "queue_seconds_per_second",
    # Rows, not requests: over request_rate, the rows a request carries (ModelSignals).
    queries.INFERENCE_COUNT: "inference_rate",
}
_MICROSECONDS = {"compute_seconds_per_second", "queue_seconds_per_second"}
GPU_GAUGES = (queries.GPU_UTILIZATION, queries.GPU_MEMORY_USED, queries.GPU_MEMORY_TOTAL)
# How often the targets are walked for those gone (their history older than any window).
FORGET_EVERY_S = 30.0
_KEPT = {*COUNTERS, queries.PENDING_REQUESTS, queries.STREAMS_IN_FLIGHT, *GPU_GAUGES}


@dataclass(frozen=True)
class Sample:
    at: float  # unix seconds
    values: dict[Series, float]


def parse_metrics(text: str) -> dict[Series, float]:
    """The series of Triton's /metrics text the sources use."""
    return metrics_text.parse_metrics(text, _KEPT)


def counter_increase(samples: Sequence[float]) -> float:
    """The increase of a counter over consecutive samples; a drop is a reset to zero."""
    increase = 0.0
    for before, after in zip(samples, samples[1:], strict=False):
        increase += after - before if after >= before else after
    return increase


class ScrapeSource:
    """Signals computed from each Triton's /metrics, read directly.

    `metrics_urls` are used when the endpoints of a snapshot carry no metrics URL.
    `max_window_s` bounds the history kept per target; once snapshots have been asked for, the
    longest window they asked for does (plus a minute): a fleet's thousand targets then keep a
    few samples each, not ten minutes of them (memory, and the garbage collector's walks over
    it, grow with every sample kept). `clock` is injectable.
    """

    def __init__(
        self,
        metrics_urls: Sequence[str] = (),
        *,
        max_window_s: float = 600.0,
        min_scrape_interval_s: float = 0.5,
        timeout_s: float = 5.0,
        connections: Connections | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.metrics_urls = list(metrics_urls)
        # The driver's kept-open HTTP session (a session per scrape without it).
        self.connections = connections
        self.max_window_s = max_window_s
        self._longest_asked_s: float | None = None  # the longest window a snapshot asked for
        self.min_scrape_interval_s = min_scrape_interval_s
        self.timeout_s = timeout_s
        self._clock = clock
        self._history: dict[str, deque[Sample]] = {}
        # One scrape of a target at a time: the policies' ticks interleave, and two responses
        # appended out of order would show a counter going down, read as a reset (its whole
        # value counted as new requests).
        self._target_locks: dict[str, asyncio.Lock] = {}
        self._failures: dict[str, tuple[float, str]] = {}  # url -> (when, the one line)
        self._forgotten_at = -math.inf  # when gone targets were last looked for
        # Every series key seen, kept once: each parse makes new tuples and strings for the
        # same few dozen series (Triton's text names no pod), and the samples held for a
        # fleet's thousand pods are then mostly copies of them (32 KiB a sample, 4 KiB shared).
        self._series: dict[Series, Series] = {}

    @property
    def kept_s(self) -> float:
        """How far back the history goes (besides a minute of slack)."""
        if self._longest_asked_s is None:
            return self.max_window_s
        return min(self.max_window_s, self._longest_asked_s)

    def targets(self, endpoints: Sequence[Endpoint] = ()) -> list[str]:
        urls = [e.metrics_url for e in endpoints if e.metrics_url]
        return urls or list(self.metrics_urls)

    async def scrape(
        self, targets: Sequence[str] | None = None, *, reuse_within_s: float = 0.0
    ) -> None:
        """Take one sample of each target, skipped where the last is younger than
        `min_scrape_interval_s` or `reuse_within_s`; the targets are read together."""
        targets = self.targets() if targets is None else targets
        if not targets:
            raise MetricsUnavailable("no Triton metrics URL to scrape")
        asked = self._clock()
        fresh_s = max(self.min_scrape_interval_s, reuse_within_s)
        if self.connections is not None:
            session = self.connections.session()
            failures = await self._scrape_all(session, targets, asked, fresh_s)
        else:
            async with aiohttp.ClientSession() as session:
                failures = await self._scrape_all(session, targets, asked, fresh_s)
        self._forget_gone(asked)
        for failure in failures:
            if isinstance(failure, BaseException):
                raise failure

    async def _scrape_all(
        self,
        session: aiohttp.ClientSession,
        targets: Sequence[str],
        asked: float,
        fresh_s: float,
    ) -> list[BaseException | None]:
        return await asyncio.gather(
            *(self._scrape_locked(session, url, asked, fresh_s) for url in targets),
            return_exceptions=True,
        )

    async def _scrape_locked(
        self, session: aiohttp.ClientSession, url: str, asked: float, fresh_s: float
    ) -> None:
        async with self._target_locks.setdefault(url, asyncio.Lock()):
            await self._scrape_one(session, url, asked, fresh_s)

    async def _scrape_one(
        self, session: aiohttp.ClientSession, url: str, asked: float, fresh_s: float
    ) -> None:
        """One sample of `url`, unless one younger than `fresh_s` exists; a failure of a
        scrape that was in flight when this one was asked for is this one's failure too (no
        second wait)."""
        now = self._clock()
        history = self._history.get(url)
        if history and now - history[-1].at < fresh_s:
            return
        failed = self._failures.get(url)
        if failed is not None and failed[0] > asked:
            raise MetricsUnavailable(failed[1])
        try:
            parsed = parse_metrics(await fetch_metrics_text(session, url, url, self.timeout_s))
        except TritonError as error:
            problem = f"cannot read Triton metrics at {url} ({_why(error)})"
            self._failed(url, problem)
            raise MetricsUnavailable(problem) from None
        except ValueError as error:
            problem = f"unreadable Triton metrics at {url}: {error}"
            self._failed(url, problem)
            raise MetricsUnavailable(problem) from None
        self._failures.pop(url, None)
        # Looked up again after the read: while it was in flight another target's scrape may
        # have forgotten this one (its last sample too old), and a history is never empty.
        history = self._history.setdefault(url, deque())
        values = {self._series.setdefault(series, series): v for series, v in parsed.items()}
        history.append(Sample(self._clock(), values))
        while history and history[0].at < history[-1].at - self.kept_s - 60:
            history.popleft()

    def _forget_gone(self, now: float) -> None:
        """Forget targets gone for longer than any window (pods replaced in Kubernetes): a walk
        over every target, so at most once every FORGET_EVERY_S (a fleet has thousands)."""
        if now - self._forgotten_at < FORGET_EVERY_S:
            return
        self._forgotten_at = now
        for gone in [
            target
            for target, samples in self._history.items()
            if samples and samples[-1].at < now - self.kept_s - 60
        ]:
            del self._history[gone]
            self._series.clear()  # a gone pod's own series (a GPU's uuid) go with it

    async def request_counters(self, endpoint: Endpoint, model: str) -> tuple[float, float]:
        """(BACKEND failures, successes) of `model` on one pod: their totals in its latest
        sample, taken now unless a fresh one exists (the healer's reader, `RequestCounters`:
        the tick's snapshot then uses the same read)."""
        url = endpoint.metrics_url
        if not url:
            raise TritonError(endpoint.name, "no metrics URL is known for this pod")
        try:
            await self.scrape([url])
        except MetricsUnavailable as error:
            raise TritonUnreachable(endpoint.name, str(error)) from None
        return metrics_text.request_counters(self._history[url][-1].values, model)

    def _failed(self, url: str, problem: str) -> None:
        self._failures[url] = (self._clock(), problem)

    async def snapshot(
        self,
        models: Sequence[str],
        endpoints: Sequence[Endpoint] = (),
        window_s: float = 60.0,
        decoupled: Collection[str] = (),
        reuse_within_s: float = 0.0,
    ) -> MetricSnapshot:
        targets = self.targets(endpoints)
        self._longest_asked_s = max(self._longest_asked_s or 0.0, window_s)
        await self.scrape(targets, reuse_within_s=reuse_within_s)
        wanted = set(models)
        totals: dict[str, dict[str, float]] = {}
        streams: dict[str, float] = {}
        pods: dict[str, int] = {}
        gpu_utilization: list[float] = []
        gpu_memory: list[float] = []
        covered = math.inf
        taken_at = 0.0
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
                if model not in wanted:
                    continue
                if name in COUNTERS:
                    fields = per_model.setdefault(model, dict.fromkeys(RATE_FIELDS, 0.0))
                    field = COUNTERS[name]
                    history = [s.values[series] for s in samples if series in s.values]
                    rate = counter_increase(history) / elapsed if elapsed > 0 else 0.0
                    per_second = rate / 1e6 if field in _MICROSECONDS else rate
                    fields[field] = fields.get(field, 0.0) + per_second
                elif name == queries.PENDING_REQUESTS:
                    fields = per_model.setdefault(model, dict.fromkeys(RATE_FIELDS, 0.0))
                    fields["pending_requests"] += value
                elif name == queries.STREAMS_IN_FLIGHT:
                    streams[model] = streams.get(model, 0.0) + value
            for model, fields in per_model.items():
                pods[model] = pods.get(model, 0) + 1
                total = totals.setdefault(model, dict.fromkeys(RATE_FIELDS, 0.0))
                for key, value in fields.items():
                    total[key] = total.get(key, 0.0) + value
            utilization, memory = _gpu_from(latest.values)
            gpu_utilization += utilization
            gpu_memory += memory
        signals = {
            model: ModelSignals(
                model=model,
                pods_reporting=pods[model],
                decoupled=model in decoupled,
                streams_in_flight=streams.get(model) if model in decoupled else None,
                **fields,
            )
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
    utilization = [v for (name, _), v in values.items() if name == queries.GPU_UTILIZATION]
    used = {labels: v for (name, labels), v in values.items() if name == queries.GPU_MEMORY_USED}
    total = {labels: v for (name, labels), v in values.items() if name == queries.GPU_MEMORY_TOTAL}
    memory = [used[labels] / total[labels] for labels in used if total.get(labels)]
    return utilization, memory


def _why(error: TritonError) -> str:
    """The short cause of a failed read: HTTP status, a timeout, or the connection's error."""
    if error.status:
        return f"HTTP {error.status}"
    return (
        "no answer in time"
        if getattr(error, "timed_out", False)
        else error.reason.rsplit(": ", 1)[-1]
    )
