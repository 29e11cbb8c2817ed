"""The metrics source of the simulator: what `ScrapeSource` would read from the simulated pod.

The operator's scrape source samples each Triton's counters when a tick asks for a snapshot
and takes each rate over the samples from the one nearest to a window ago up to now
(tritonscale.metrics.scrape); the PromQL of tritonscale.metrics.queries computes the same
quantities. Here the samples come from `Simulation.counters()` at each tick:

- request_rate, failure_rate, execution_rate, inference_rate: increases of the request,
  failure, execution and inference (rows) counters over the window's seconds;
- compute_seconds_per_second, queue_seconds_per_second: increases of the duration counters
  (seconds here, microseconds in Triton, divided by 1e6 there);
- pending_requests: the queue now (a gauge);
- one pod reports every model; no GPU signals (the pipeline runs on CPU instances here).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from loadtests.sim.queueing import Counters, Simulation
from tritonscale.core.signals import MetricSnapshot, ModelSignals

# ScrapeSource calls a window complete when it covers this share of the one asked for.
COMPLETE_SHARE = 0.9


@dataclass(frozen=True)
class _Sample:
    at: float
    counters: dict[str, Counters]


class SimulatedSource:
    """Keeps the samples of one simulation and answers snapshots over a window."""

    def __init__(self, simulation: Simulation) -> None:
        self.simulation = simulation
        self._samples: list[_Sample] = []

    def sample(self) -> None:
        """Read the counters now (a scrape)."""
        sim = self.simulation
        self._samples.append(_Sample(sim.now, sim.counters()))

    def snapshot(self, models: Iterable[str], window_s: float) -> MetricSnapshot:
        """The signals of `models` over the last `window_s`, ending at the latest sample."""
        if not self._samples:
            raise ValueError("no sample yet: call sample() first")
        latest = self._samples[-1]
        start_at = latest.at - window_s
        first = min(self._samples, key=lambda s: abs(s.at - start_at))
        elapsed = latest.at - first.at
        signals = {}
        for model in models:
            now, then = latest.counters[model], first.counters[model]
            rate = (lambda a, b: (a - b) / elapsed) if elapsed > 0 else (lambda a, b: 0.0)
            signals[model] = ModelSignals(
                model=model,
                request_rate=rate(now.success, then.success),
                failure_rate=rate(now.failure, then.failure),
                execution_rate=rate(now.executions, then.executions),
                compute_seconds_per_second=rate(now.compute_s, then.compute_s),
                queue_seconds_per_second=rate(now.queue_s, then.queue_s),
                inference_rate=rate(now.inferences, then.inferences),
                pending_requests=float(self.simulation.pending(model)),
                pods_reporting=1,
            )
        # Samples older than any window asked for are no longer needed.
        keep_from = start_at - window_s
        while len(self._samples) > 2 and self._samples[1].at < keep_from:
            self._samples.pop(0)
        return MetricSnapshot(
            taken_at=latest.at,
            window_s=elapsed,
            models=signals,
            complete=elapsed >= COMPLETE_SHARE * window_s,
        )
