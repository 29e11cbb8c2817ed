"""What every metrics source answers: `snapshot(...)`, `request_counters(...)`, its connections.

Two sources implement it: `PrometheusSource` (tritonscale.metrics.prometheus: PromQL over
Prometheus's HTTP API, the production path) and `ScrapeSource` (tritonscale.metrics.scrape:
each Triton's /metrics read directly, where no Prometheus runs). Both return per-model rates
over the last `window_s` seconds, summed over the pods of one pod set.

Missing data is handled like the HPA handles it, conservatively: a source that cannot read
*every* target raises `MetricsUnavailable` (one line naming the target) rather than return a
snapshot of fewer pods, whose lower load could pass for a reason to scale down; the
driver holds the count (FailedGetMetrics). A series younger than the window gives
`complete=False`, on which the policy never scales down.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol

from tritonscale.core.signals import MetricSnapshot
from tritonscale.triton.connections import Connections
from tritonscale.triton.endpoints import Endpoint

# The ModelSignals fields both sources compute from Triton's counters and gauges.
RATE_FIELDS = (
    "request_rate",
    "failure_rate",
    "execution_rate",
    "compute_seconds_per_second",
    "queue_seconds_per_second",
    "pending_requests",
)


class MetricsSource(Protocol):
    """Everything the drivers use of a metrics source."""

    # The HTTP connections kept open between ticks; None: a session per call. A driver gives
    # its own for the time it runs.
    connections: Connections | None

    async def snapshot(
        self,
        models: Sequence[str],
        endpoints: Sequence[Endpoint],
        window_s: float,
        decoupled: Collection[str] = (),
        reuse_within_s: float = 0.0,
    ) -> MetricSnapshot:
        """Signals of `models` over the last `window_s` s, summed over the `endpoints`' pods.

        `decoupled` names the models whose config is decoupled: their signals say so, and
        carry the streams in flight that such a model exports itself. A pod read in the last
        `reuse_within_s` seconds is not read again (a set tick's own earlier reads, the
        healer's, serve its snapshot); a source that reads no pod ignores it.
        Raises MetricsUnavailable (one line) when it cannot.
        """
        ...

    async def request_counters(self, endpoint: Endpoint, model: str) -> tuple[float, float] | None:
        """(BACKEND failures, successes) of `model` on one pod, their totals (the healer's
        reader: tritonscale.triton.healing). None when the source has no series for the pod;
        MetricsUnavailable, or TritonError when the pod itself cannot be read."""
        ...
