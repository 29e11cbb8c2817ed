"""The metric snapshot: what a metrics source measured, in the units the policy reasons in.

Both metrics sources (`PrometheusSource`, `ScrapeSource`) return a `MetricSnapshot`; the
policy reads nothing else. Rates are averaged over the snapshot's window and summed
over the pods of one pod set; counts of pods and instances come from the driver.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ModelSignals:
    """One model's load over the window, summed over the pods that serve it."""

    model: str
    request_rate: float  # successful requests per second
    failure_rate: float  # failed requests per second
    execution_rate: float  # model executions (batches) per second
    # Seconds of model time per second of wall time, from the duration counters:
    # compute = compute_input + compute_infer + compute_output; queue = queue.
    compute_seconds_per_second: float
    queue_seconds_per_second: float
    pending_requests: float  # nv_inference_pending_request_count, summed over pods
    pods_reporting: int  # pods that exported this model's counters in the window
    # From the model's config: `model_transaction_policy { decoupled: True }`.
    decoupled: bool = False
    # A decoupled model's requests whose final response is not sent yet, summed over pods,
    # from the gauge the model exports itself (tritonscale.metrics.queries.STREAMS_IN_FLIGHT);
    # None when it exports none. Triton's own counters cannot see these: a decoupled model
    # whose `async def execute` returns at once is counted done when its stream begins.
    streams_in_flight: float | None = None
    # Inferences (batch rows, nv_inference_count) per second; None where the source does not
    # read them. Over request_rate: the rows a request carries.
    inference_rate: float | None = None

    @property
    def queue_compute_ratio(self) -> float | None:
        """Queue time per unit of compute time; None when nothing ran."""
        if self.compute_seconds_per_second <= 0:
            return None
        return self.queue_seconds_per_second / self.compute_seconds_per_second

    @property
    def average_compute_ms(self) -> float | None:
        """Mean compute time of one request, in milliseconds."""
        if self.request_rate <= 0:
            return None
        return 1000.0 * self.compute_seconds_per_second / self.request_rate


@dataclass(frozen=True)
class GpuSignals:
    """The busiest GPU of the pod set: the ceiling is reached as soon as one GPU is full."""

    utilization: float  # 0..1
    memory_fraction: float | None  # used / total, 0..1; None when total is unknown


@dataclass(frozen=True)
class MetricSnapshot:
    """Everything a source measured for one pod set at one moment."""

    taken_at: float  # unix seconds at which the window ends
    window_s: float  # length of the rate window actually covered
    models: dict[str, ModelSignals] = field(default_factory=dict)
    gpu: GpuSignals | None = None  # None on CPU-only pods
    # False until the source has seen a full window (a restarted scraper, a young series);
    # the policy never scales down on an incomplete window.
    complete: bool = True

    def model(self, name: str) -> ModelSignals | None:
        return self.models.get(name)


class MetricsUnavailable(Exception):
    """The source could not produce a snapshot (Prometheus down, Triton unreachable...).

    The message is one line a person can act on; the driver records it and the policy holds.
    """
