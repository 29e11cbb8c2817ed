"""A model's decision in the form the drivers report and apply, and the checks it is made of.

The set planner (tritonscale.core.planner) decides every model of a pod set together, once a
set tick; `Decision` is one model's part of it (`planner.as_policy_decision`): the count to
apply, the reason (the last stage that changed the count, CamelCase, from
docs/instancegroupautoscaler.md), one sentence with the numbers, and the HPA-style
conditions the status carries. Here too are what the planner and the drivers share about a
decision: when a snapshot is too old to act on (`max_snapshot_age_s`), when the pods' GPU
takes no more instances (`gpu_ceiling_reached`), what a budget's grant leaves of an increase
(`granted`), and the metrics a status shows (`observed_metrics`).

Pure: no clock (the time is an argument), no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from tritonscale.core import behavior, sizing
from tritonscale.core.behavior import PolicyState
from tritonscale.core.budget import BUDGET_EXHAUSTED, Grant
from tritonscale.core.latency import LatencyPrediction
from tritonscale.core.signals import MetricSnapshot, ModelSignals
from tritonscale.core.spec import AutoscalerSpec

__all__ = [
    "Condition",
    "Decision",
    "PolicyState",
    "gpu_ceiling_reached",
    "granted",
    "max_snapshot_age_s",
    "observed_metrics",
]

UP, DOWN, NONE = "up", "down", "none"

PAUSED = "Paused"
METRICS_MISSING = "MetricsMissing"
METRICS_STALE = "MetricsStale"
WARMING_UP = "WarmingUp"
GPU_SATURATED = "GpuSaturated"
VALID_METRIC_FOUND = "ValidMetricFound"
DESIRED_WITHIN_RANGE = "DesiredWithinRange"
READY_FOR_NEW_SCALE = "ReadyForNewScale"

# Reasons for which the ScalingLimited condition is True.
LIMITING_REASONS = frozenset(
    {
        behavior.TOO_FEW_INSTANCES,
        behavior.TOO_MANY_INSTANCES,
        behavior.SCALE_UP_LIMIT,
        behavior.SCALE_DOWN_LIMIT,
        GPU_SATURATED,
        BUDGET_EXHAUSTED,
    }
)

STABILIZED_REASONS = frozenset({behavior.SCALE_UP_STABILIZED, behavior.SCALE_DOWN_STABILIZED})

# A source stamps a snapshot with the end of its window, which may trail the tick by up to a
# scrape interval; beyond two control intervals plus this grace the numbers are stale.
SNAPSHOT_AGE_GRACE_S = 15.0


@dataclass(frozen=True)
class Condition:
    """An HPA-style condition; the driver adds `type` and `lastTransitionTime`."""

    status: bool
    reason: str
    message: str


@dataclass(frozen=True)
class Decision:
    current_instances: int
    desired_instances: int  # what to apply: always within [min, max] unless paused
    # What the model would take were there room in its budget, before behavior (the
    # planner's `wanted_instances`); None when it was not sized.
    recommended_instances: int | None
    direction: str  # "up", "down" or "none"
    reason: str  # CamelCase, from docs/instancegroupautoscaler.md
    message: str  # one sentence, with the numbers
    able_to_scale: Condition  # the driver replaces it after applying (SucceededRescale...)
    scaling_active: Condition
    scaling_limited: Condition
    observed: dict[str, float] = field(hash=False)  # status.observedMetrics (camelCase keys)
    state: PolicyState  # store it and pass it to the next call
    # A root with a latency objective: what the planner predicts of the counts it chose
    # (status.latency.predicted); None without one.
    latency: LatencyPrediction | None = None

    @property
    def changes(self) -> bool:
        return self.desired_instances != self.current_instances


def max_snapshot_age_s(spec: AutoscalerSpec) -> float:
    """Older than this, a snapshot is stale and every model holds."""
    return 2 * spec.interval_seconds + SNAPSHOT_AGE_GRACE_S


def gpu_ceiling_reached(spec: AutoscalerSpec, snapshot: MetricSnapshot) -> str | None:
    """Which of the spec's GPU ceilings the snapshot's GPU has reached, in words; None when
    neither (or no GPU is reported)."""
    gpu, targets = snapshot.gpu, spec.targets
    if gpu is None:
        return None
    if _finite(gpu.utilization) and gpu.utilization >= targets.gpu_utilization_ceiling:
        return (
            f"GPU utilization {gpu.utilization:.2f} is at or above its ceiling "
            f"{targets.gpu_utilization_ceiling:.2f}"
        )
    if _finite(gpu.memory_fraction) and gpu.memory_fraction >= targets.gpu_memory_ceiling:
        return (
            f"GPU memory {gpu.memory_fraction:.2f} is at or above its ceiling "
            f"{targets.gpu_memory_ceiling:.2f}"
        )
    return None


class _Step(NamedTuple):
    count: int
    reason: str
    clause: str = ""  # why the count changed; "" when it did not


def granted(model: str, decision: Decision, grant: Grant | None) -> Decision:
    """A decision made for a whole pod set (tritonscale.core.planner) cut to what `model`'s
    budget grants: only an increase is cut, never below the current count.

    The planner fits its counts to the budget already; a grant cuts only when a member of the
    budget outside this tick holds more than the planner saw. The decision's state keeps the
    count the planner chose: the behavior history then counts a step that did not happen in
    full, which slows the next step up (the safe side)."""
    current, asked = decision.current_instances, decision.desired_instances
    step = _within_grant(grant, current, asked, decision.reason)
    if step.count == asked:
        return decision
    message = (
        f"{_outcome(model, current, step.count)}: {step.clause} "
        f"(the set's planner asked for {_instances(asked)})"
    )
    return replace(
        decision,
        desired_instances=step.count,
        direction=UP if step.count > current else NONE,
        reason=BUDGET_EXHAUSTED,
        message=message,
        scaling_limited=Condition(True, BUDGET_EXHAUSTED, message),
    )


def _within_grant(grant: Grant | None, current: int, count: int, reason: str) -> _Step:
    """A budget only ever cuts an increase, to what it grants (at least the current count)."""
    if grant is None or grant.granted >= count:
        return _Step(count, reason)
    return _Step(max(grant.granted, current), BUDGET_EXHAUSTED, grant.message)


def observed_metrics(
    spec: AutoscalerSpec,
    current: int,
    signals: ModelSignals | None,
    snapshot: MetricSnapshot | None,
) -> dict[str, float]:
    """status.observedMetrics: what the decision saw, rounded for people."""
    observed: dict[str, float] = {}
    if signals is not None:
        observed["requestRate"] = signals.request_rate
        observed["busyPerInstance"] = sizing.busy_per_instance(signals, current)
        if signals.queue_compute_ratio is not None:
            observed["queueComputeRatio"] = signals.queue_compute_ratio
        observed["pendingPerInstance"] = sizing.pending_per_instance(signals, current)
        if sizing.sized_by_streams(signals):
            observed["streamsInFlightPerInstance"] = sizing.streams_per_instance(signals, current)
    gpu = snapshot.gpu if snapshot is not None else None
    if gpu is not None and _finite(gpu.utilization):
        observed["gpuUtilization"] = gpu.utilization
    if gpu is not None and _finite(gpu.memory_fraction):
        observed["gpuMemoryFraction"] = gpu.memory_fraction
    return {key: round(float(value), 4) for key, value in observed.items()}


def _finite(value: float | None) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _instances(count: int) -> str:
    return f"{count} instance" if count == 1 else f"{count} instances"


def _outcome(model: str, current: int, desired: int) -> str:
    if desired == current:
        return f"{model} stays at {_instances(current)}"
    return f"{model} {current} -> {_instances(desired)}"
