"""The operator's own Prometheus metrics (docs/instancegroupautoscaler.md), for both drivers.

    metrics = OperatorMetrics()            # its own registry: several may coexist in tests
    metrics.serve(9102)                    # or pass metrics.registry to your own server
    result = reconcile(..., metrics=metrics, namespace="ns", autoscaler="pipeline-async")
    metrics.forget("ns", "pipeline-async", "pipeline_async")  # the object was deleted

A set's tick (tritonscale.control.set_tick) records every tick itself; a driver only creates,
serves and forgets.

Few series per autoscaler, so that a fleet's operator renders its metrics cheaply (a
Prometheus scrape of 500 autoscalers reads a few thousand lines, not fifteen thousand): the
per-autoscaler gauges and counters of the contract, no `_created` series (prometheus_client's
creation timestamps, which nothing here reads), and the ticks' duration per namespace (the
dashboards read its quantiles over all autoscalers; a set's members share one tick anyway).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    start_http_server,
)

from tritonscale.metrics import queries

if TYPE_CHECKING:
    from tritonscale.control.ledger import BudgetStatus
    from tritonscale.control.tick import TickResult

# Counters and histograms would each add a `<name>_created` series per label set.
disable_created_metrics()

LABELS = ("namespace", "autoscaler", "model")
BUDGET_LABELS = ("namespace", "budget")
SET_LABELS = ("namespace", "set")
MIB = 2**20

# status.observedMetrics key -> the `signal` label.
SIGNALS = {
    "busyPerInstance": "busy_per_instance",
    "queueComputeRatio": "queue_compute_ratio",
    "pendingPerInstance": "pending_per_instance",
    "streamsInFlightPerInstance": "streams_in_flight_per_instance",
    "requestRate": "request_rate",
    "gpuUtilization": "gpu_utilization",
    "gpuMemoryFraction": "gpu_memory_fraction",
}


class OperatorMetrics:
    """The metrics of the contract, in a registry of their own (`.registry`)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.desired = Gauge(
            "tritonscale_desired_instances",
            "The last decision's instance count.",
            LABELS,
            registry=r,
        )
        self.current = Gauge(
            "tritonscale_current_instances",
            "The live instance count on the pods (the highest if they disagree).",
            LABELS,
            registry=r,
        )
        self.decisions = Counter(
            "tritonscale_decisions",
            "Ticks, by the decision taken (a tick that could not decide holds: direction none, "
            "the error's reason).",
            (*LABELS, "direction", "reason"),
            registry=r,
        )
        self.actuations = Counter(
            "tritonscale_actuations",
            "Model loads sent to a Triton pod.",
            (*LABELS, "result"),
            registry=r,
        )
        self.duration = Histogram(
            "tritonscale_reconcile_duration_seconds",
            "One control tick of an autoscaler, end to end, over the namespace's autoscalers.",
            ("namespace",),
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        self.errors = Counter(
            "tritonscale_reconcile_errors",
            "Ticks that failed, by reason.",
            (*LABELS, "reason"),
            registry=r,
        )
        self.observed = Gauge(
            "tritonscale_observed_signal",
            "What the policy saw on its last tick.",
            (*LABELS, "signal"),
            registry=r,
        )
        self.last_reconcile = Gauge(
            "tritonscale_last_reconcile_timestamp_seconds",
            "Unix time of the last finished tick.",
            LABELS,
            registry=r,
        )
        # Budgets (spec.budget): one series per (namespace, budget), from its members' ticks.
        self.budget_limit = Gauge(
            queries.BUDGET_LIMIT,
            "Instances per pod the budget allows its members together (instancesPerPod).",
            BUDGET_LABELS,
            registry=r,
        )
        self.budget_used = Gauge(
            queries.BUDGET_USED,
            "Instances per pod the budget's members hold or were granted.",
            BUDGET_LABELS,
            registry=r,
        )
        self.budget_wanted = Gauge(
            queries.BUDGET_WANTED,
            "Instances per pod the members' loads ask for, together.",
            BUDGET_LABELS,
            registry=r,
        )
        self.budget_exhausted = Gauge(
            queries.BUDGET_EXHAUSTED,
            "1 while the budget refuses a member instances (or a full GPU does), else 0.",
            BUDGET_LABELS,
            registry=r,
        )
        self.budget_demand = Gauge(
            queries.BUDGET_DEMAND_RATIO,
            "What the members' loads ask for over what a pod can hold; above 1, more pods "
            "are the answer (the chart's HPA scales on it).",
            BUDGET_LABELS,
            registry=r,
        )
        self.budget_memory_limit = Gauge(
            queries.BUDGET_GPU_MEMORY_LIMIT,
            "GPU memory per pod the budget allows its members (gpuMemoryPerPodMiB).",
            BUDGET_LABELS,
            registry=r,
        )
        self.budget_memory_used = Gauge(
            queries.BUDGET_GPU_MEMORY_USED,
            "GPU memory per pod the members' instances take (gpuMemoryPerInstanceMiB each).",
            BUDGET_LABELS,
            registry=r,
        )
        self.set_predicted = Gauge(
            queries.SET_PREDICTED_RPS,
            "Requests per second the set planner predicted its last counts serve, at the set's "
            "roots.",
            SET_LABELS,
            registry=r,
        )
        self.set_served = Gauge(
            queries.SET_SERVED_RPS,
            "Requests per second the set's roots served (successes), latest window.",
            SET_LABELS,
            registry=r,
        )
        # A root's latency objective (spec.targets.latency) beside what the planner predicts
        # and what was measured: status.latency, in seconds.
        self.latency_objective = Gauge(
            queries.LATENCY_OBJECTIVE_SECONDS,
            "The latency objective's bound on its quantile (spec.targets.latency).",
            LABELS,
            registry=r,
        )
        self.latency_predicted = Gauge(
            queries.LATENCY_PREDICTED_SECONDS,
            "The objective's quantile the set planner predicts at the counts it chose, at the "
            "offered rate with headroom; absent where it was not sized to it or the counts "
            "cannot serve that rate.",
            LABELS,
            registry=r,
        )
        self.latency_measured = Gauge(
            queries.LATENCY_MEASURED_MEAN_SECONDS,
            "The mean time a request spent queued and computing at the root over the metrics "
            "window (Triton's counters give means, not quantiles).",
            LABELS,
            registry=r,
        )
        self._lock = threading.Lock()
        self._signals_seen: dict[tuple[str, str, str], set[str]] = {}

    def record(self, result: TickResult, namespace: str, autoscaler: str) -> None:
        """Export one tick (reconcile calls this; drivers need not)."""
        labels = (namespace, autoscaler, result.model)
        with self._lock:
            decision = result.decision
            direction = decision.direction if decision is not None else "none"
            self.decisions.labels(*labels, direction, result.reason).inc()
            if decision is not None:
                self.desired.labels(*labels).set(decision.desired_instances)
                seen = self._signals_seen.setdefault(labels, set())
                for key, signal in SIGNALS.items():
                    if key in decision.observed:
                        self.observed.labels(*labels, signal).set(decision.observed[key])
                        seen.add(signal)
                    elif signal in seen:
                        # A signal that went away must not linger with its old value.
                        self.observed.remove(*labels, signal)
                        seen.discard(signal)
            if result.current_instances is not None:
                self.current.labels(*labels).set(result.current_instances)
            for pod in result.applied:
                self.actuations.labels(*labels, "success" if pod.ok else "failure").inc()
            for error in result.errors:
                self.errors.labels(*labels, error.reason).inc()
            self.duration.labels(namespace).observe(result.duration_s)
            self.last_reconcile.labels(*labels).set(result.finished_at)
            if result.budget is not None:
                self._record_budget(result.budget)
            self._record_latency(result, labels)

    def _record_latency(self, result: TickResult, labels: tuple[str, str, str]) -> None:
        """The latency gauges of a root with an objective; a value not known this tick (or
        an objective taken away) leaves no series behind with an old value."""
        latency = result.latency
        values = (
            (self.latency_objective, latency.objective.milliseconds if latency else None),
            (self.latency_predicted, latency.predicted_ms if latency else None),
            (self.latency_measured, latency.measured_mean_ms if latency else None),
        )
        for gauge, milliseconds in values:
            if milliseconds is not None:
                gauge.labels(*labels).set(milliseconds / 1000.0)
            else:
                try:
                    gauge.remove(*labels)
                except KeyError:
                    pass

    def _record_budget(self, budget: BudgetStatus) -> None:
        labels = (budget.namespace, budget.name)
        self.budget_limit.labels(*labels).set(budget.limits.instances)
        self.budget_used.labels(*labels).set(budget.used)
        self.budget_wanted.labels(*labels).set(budget.wanted)
        self.budget_exhausted.labels(*labels).set(1 if budget.exhausted else 0)
        self.budget_demand.labels(*labels).set(budget.demand_ratio)
        if budget.limits.gpu_memory_mib:
            self.budget_memory_limit.labels(*labels).set(budget.limits.gpu_memory_mib * MIB)
            self.budget_memory_used.labels(*labels).set(budget.gpu_memory_used_mib * MIB)

    def record_set(
        self, namespace: str, name: str, predicted_rps: float | None, served_rps: float | None
    ) -> None:
        """Export the set planner's last prediction beside what the set served (either is left
        as it was when None: a tick without a usable snapshot changes neither)."""
        with self._lock:
            if predicted_rps is not None:
                self.set_predicted.labels(namespace, name).set(predicted_rps)
            if served_rps is not None:
                self.set_served.labels(namespace, name).set(served_rps)

    def forget_budget(self, namespace: str, budget: str) -> None:
        """Drop a budget's series (its last member left it)."""
        with self._lock:
            for metric in self._budget_metrics():
                try:
                    metric.remove(namespace, budget)
                except KeyError:
                    pass

    def _budget_metrics(self) -> tuple[Gauge, ...]:
        return (
            self.budget_limit,
            self.budget_used,
            self.budget_wanted,
            self.budget_exhausted,
            self.budget_demand,
            self.budget_memory_limit,
            self.budget_memory_used,
        )

    def forget(self, namespace: str, autoscaler: str, model: str) -> None:
        """Drop every series of one autoscaler (its object was deleted or renamed)."""
        wanted = (namespace, autoscaler, model)
        with self._lock:
            for metric in (
                self.desired,
                self.current,
                self.decisions,
                self.actuations,
                self.errors,
                self.observed,
                self.last_reconcile,
                self.latency_objective,
                self.latency_predicted,
                self.latency_measured,
            ):
                # prometheus_client keeps label values in `_metrics`; there is no public lister.
                for values in list(metric._metrics):  # noqa: SLF001
                    if values[: len(wanted)] == wanted:
                        metric.remove(*values)
            self._signals_seen.pop(wanted, None)

    def serve(self, port: int, addr: str = "0.0.0.0") -> Any:
        """Serve /metrics on `port` from a daemon thread (prometheus_client's own server).

        Returns the server; `.shutdown()` stops it.
        """
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return server
