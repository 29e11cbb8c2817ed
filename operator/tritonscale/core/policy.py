"""The policy: one pure function from (spec, live count, metrics, history, clock) to a decision.

`decide` reads no clock and does no I/O; the driver passes `now` and the `PolicyState` it
kept from the last tick, applies `desired_instances` (unless `spec.dry_run`), and stores
`decision.state` for the next tick. The stages run in a fixed order, each a small helper:

1. paused: hold, report what was seen;
2. the live count outside [min, max]: go to the bound at once (as the HPA does);
3. no usable metrics (none, model missing, stale, incomplete window): hold;
4. sizing (tritonscale.core.sizing): each signal's count, the largest wins;
5. the check of the last increase (tritonscale.core.gain): one that bought nothing is reverted
   to the count before it (NoGain), and further increases are held there;
6. guards that only stop additions: a full GPU (more pods are the answer), then a saturated
   model this one calls (scale the child, not the parent);
7. min/max, then HPA behavior (tritonscale.core.behavior): stabilization windows, rate policies.

A model that shares a budget with others (spec.budget) then gets what the budget grants it
(tritonscale.core.budget; `within_budget` applies the grant). The reason of a decision names
the last stage that changed the count.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from tritonscale.core import behavior, gain, sizing
from tritonscale.core.behavior import PolicyState
from tritonscale.core.budget import BUDGET_EXHAUSTED
from tritonscale.core.signals import MetricSnapshot, ModelSignals
from tritonscale.core.spec import AutoscalerSpec

__all__ = [
    "Condition",
    "Decision",
    "PolicyState",
    "decide",
    "max_snapshot_age_s",
    "within_budget",
]

UP, DOWN, NONE = "up", "down", "none"

PAUSED = "Paused"
METRICS_MISSING = "MetricsMissing"
METRICS_STALE = "MetricsStale"
WARMING_UP = "WarmingUp"
GPU_SATURATED = "GpuSaturated"
CHILD_SATURATED = "ChildSaturated"
NO_GAIN = gain.NO_GAIN
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
        CHILD_SATURATED,
        NO_GAIN,
        BUDGET_EXHAUSTED,
    }
)

# A source stamps a snapshot with the end of its window, which may trail the tick by up to a
# scrape interval; beyond two control intervals plus this grace the numbers are stale.
SNAPSHOT_AGE_GRACE_S = 15.0

_NO_CHILDREN: Mapping[str, int] = MappingProxyType({})


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
    # What the load alone asks for (sizing), before guards, bounds and behavior; None when
    # no usable metrics were seen.
    recommended_instances: int | None
    direction: str  # "up", "down" or "none"
    reason: str  # CamelCase, from docs/instancegroupautoscaler.md
    message: str  # one sentence, with the numbers
    able_to_scale: Condition  # the driver replaces it after applying (SucceededRescale...)
    scaling_active: Condition
    scaling_limited: Condition
    observed: dict[str, float] = field(hash=False)  # status.observedMetrics (camelCase keys)
    state: PolicyState  # store it and pass it to the next call
    why: str = ""  # the message without its outcome ("model 2 -> 3 instances: ")

    @property
    def changes(self) -> bool:
        return self.desired_instances != self.current_instances


def max_snapshot_age_s(spec: AutoscalerSpec) -> float:
    """Older than this, a snapshot is stale and the policy holds."""
    return 2 * spec.interval_seconds + SNAPSHOT_AGE_GRACE_S


def decide(
    spec: AutoscalerSpec,
    current_instances: int,
    snapshot: MetricSnapshot | None,
    state: PolicyState,
    now: float,
    child_instances: Mapping[str, int] = _NO_CHILDREN,
    *,
    scale_down_margin: float = sizing.SCALE_DOWN_MARGIN,
) -> Decision:
    """Decide the instance count of `spec.model` for one tick.

    `current_instances` is the live count on the pods (the highest if they disagree);
    `child_instances` the live counts of the models in `spec.calls`, where known; `now` is
    unix seconds on the same clock as `snapshot.taken_at`. `scale_down_margin` is how far
    below its target a scale-down takes a signal (tritonscale.core.sizing).

    Raises ValueError when `current_instances` < 1: with no ready pod there is no live
    count, and the driver reports NoReadyPods itself instead of asking the policy.
    """
    if isinstance(current_instances, bool) or not isinstance(current_instances, int):
        raise ValueError(f"current_instances must be an int, got {current_instances!r}")
    if current_instances < 1:
        raise ValueError(
            f"current_instances must be >= 1, got {current_instances}: with no ready pod "
            "there is no live count to scale (report NoReadyPods instead)"
        )
    tick = _Tick(
        spec, current_instances, state.observe(current_instances, now, spec), now, scale_down_margin
    )
    signals, problem = _usable_signals(spec, snapshot, now)
    observed = _observed(spec, current_instances, signals, snapshot)

    if spec.paused:
        return tick.hold(PAUSED, "paused (observing only)", observed, active=False)
    if current_instances < spec.min_instances:
        return tick.to_bound(
            spec.min_instances,
            behavior.TOO_FEW_INSTANCES,
            f"{_instances(current_instances)} is below minInstances {spec.min_instances}",
            observed,
            problem,
        )
    if current_instances > spec.max_instances:
        return tick.to_bound(
            spec.max_instances,
            behavior.TOO_MANY_INSTANCES,
            f"{_instances(current_instances)} is above maxInstances {spec.max_instances}",
            observed,
            problem,
        )
    if problem is not None:
        reason, message = problem
        return tick.hold(reason, message, observed, active=False)
    assert signals is not None and snapshot is not None
    return tick.scale(signals, snapshot, child_instances, observed)


@dataclass(frozen=True)
class _Tick:
    """The inputs of one call, and the ways a decision is made from them."""

    spec: AutoscalerSpec
    current: int
    state: PolicyState
    now: float
    scale_down_margin: float

    def decision(
        self,
        desired: int,
        recommended: int | None,
        reason: str,
        why: str,
        observed: Mapping[str, float],
        active: Condition,
        state: PolicyState | None = None,
        able: Condition | None = None,
    ) -> Decision:
        direction = UP if desired > self.current else DOWN if desired < self.current else NONE
        message = f"{_outcome(self.spec.model, self.current, desired)}: {why}"
        limited = Condition(reason in LIMITING_REASONS, reason, message)
        if not limited.status:
            limited = Condition(False, DESIRED_WITHIN_RANGE, "the desired count is within range")
        if able is None:
            able = Condition(True, READY_FOR_NEW_SCALE, "no stabilization window holds the count")
        return Decision(
            current_instances=self.current,
            desired_instances=desired,
            recommended_instances=recommended,
            direction=direction,
            reason=reason,
            message=message,
            able_to_scale=able,
            scaling_active=active,
            scaling_limited=limited,
            observed=dict(observed),
            state=(state or self.state).ticked(self.current, desired, self.now),
            why=why,
        )

    def hold(self, reason: str, why: str, observed: Mapping[str, float], active: bool) -> Decision:
        status = Condition(active, reason, why)
        return self.decision(self.current, None, reason, why, observed, status)

    def to_bound(
        self,
        bound: int,
        reason: str,
        why: str,
        observed: Mapping[str, float],
        problem: tuple[str, str] | None,
    ) -> Decision:
        active = _active_condition(problem)
        return self.decision(bound, None, reason, why, observed, active)

    def scale(
        self,
        signals: ModelSignals,
        snapshot: MetricSnapshot,
        child_instances: Mapping[str, int],
        observed: Mapping[str, float],
    ) -> Decision:
        spec, current = self.spec, self.current
        margin = self.scale_down_margin
        all_needs = sizing.needs(signals, current, spec.targets, spec.tolerance, margin)
        recommended, reason, winner = sizing.recommend(all_needs, current)
        clauses = [
            _because(reason, winner, all_needs, spec.tolerance, margin, recommended, current)
        ]
        active = Condition(True, VALID_METRIC_FOUND, f"sized from {winner.describe()}")

        check, hold = self.state.gain_check, self.state.no_gain
        if check is not None and check.loading:
            # The increase's load was still in flight at the last tick: keep the check until
            # the new count is live, then judge a window wholly after the tick that saw it.
            if current > check.before.instances:
                check = check.landed(self.now)
        elif check is not None and current <= check.before.instances:
            check = None  # the increase never landed (a dry run, a failed load) or was undone
        if check is not None and not check.loading and gain.due(check, snapshot):
            verdict = gain.judge(check, gain.sample(signals, current))
            if not verdict.gained:
                return self.no_gain(check, verdict, signals, recommended, observed, active)
            check = None
        if hold is not None and gain.released(hold, signals, current, snapshot):
            hold = None

        wanted = recommended
        if wanted > current and hold is not None:
            reason, wanted = NO_GAIN, current
            clauses.append(_held_phrase(hold, signals))
        elif wanted > current:
            guard = _gpu_guard(spec, snapshot) or _child_guard(spec, snapshot, child_instances)
            if guard is not None:
                reason, why = guard
                wanted = current
                clauses.append(why)

        bounded = min(max(wanted, spec.min_instances), spec.max_instances)
        if bounded != wanted:
            reason = behavior.TOO_MANY_INSTANCES if bounded < wanted else behavior.TOO_FEW_INSTANCES
            clauses.append(_limit_phrase(spec, reason, wanted, bounded))

        state = self.state.seeded(current, self.now, spec)
        stabilized, stabilized_reason = behavior.stabilize(
            spec, state.recommendations, current, bounded, self.now
        )
        able = Condition(True, READY_FOR_NEW_SCALE, "no stabilization window holds the count")
        if stabilized_reason is not None:
            reason = stabilized_reason
            clauses.append(_window_phrase(spec, stabilized_reason, bounded, stabilized))
            able = Condition(True, stabilized_reason, clauses[-1])

        desired, limit_reason = behavior.limit_rate(
            spec, state.scale_events, current, stabilized, self.now
        )
        if limit_reason is not None:
            reason = limit_reason
            clauses.append(_limit_phrase(spec, limit_reason, stabilized, desired))

        if desired > current and check is None:
            before = gain.sample(signals, current)
            check = gain.GainCheck(self.now, before) if before is not None else None
        state = replace(state, gain_check=check, no_gain=hold)
        return self.decision(
            desired,
            recommended,
            reason,
            "; ".join(clauses),
            observed,
            active,
            state=state.recommend(bounded, self.now, spec),
            able=able,
        )

    def no_gain(
        self,
        check: gain.GainCheck,
        verdict: gain.Verdict,
        signals: ModelSignals,
        recommended: int,
        observed: Mapping[str, float],
        active: Condition,
    ) -> Decision:
        """Revert an increase that bought nothing, at once, and hold the count there."""
        spec = self.spec
        back = min(max(check.before.instances, spec.min_instances), spec.max_instances)
        hold = gain.NoGainHold(back, check.before.request_rate, self.now)
        why = (
            f"the increase bought nothing ({verdict.message}): back to {_instances(back)}, "
            f"held there until the request rate moves by more than "
            f"{100 * gain.RELEASE_CHANGE:.0f} %"
        )
        state = replace(self.state, gain_check=None, no_gain=hold)
        return self.decision(
            back,
            recommended,
            NO_GAIN,
            why,
            observed,
            active,
            state=state.recommend(back, self.now, spec),
        )


def within_budget(
    spec: AutoscalerSpec, decision: Decision, granted: int, why: str, now: float
) -> Decision:
    """The decision as the model's budget grants it (tritonscale.core.budget).

    A budget only ever cuts an increase, to `granted` (at least the current count); `why` says
    by how much room. The reason becomes BudgetExhausted, a limiting reason.
    """
    if granted >= decision.desired_instances:
        return decision
    current = decision.current_instances
    granted = max(granted, current)
    clause = f"{decision.why}; {why}" if decision.why else why
    message = f"{_outcome(spec.model, current, granted)}: {clause}"
    return replace(
        decision,
        desired_instances=granted,
        direction=UP if granted > current else NONE,
        reason=BUDGET_EXHAUSTED,
        message=message,
        why=clause,
        scaling_limited=Condition(True, BUDGET_EXHAUSTED, message),
        state=decision.state.ticked(current, granted, now),
    )


def _held_phrase(hold: gain.NoGainHold, signals: ModelSignals) -> str:
    return (
        f"held at {_instances(hold.instances)}: an increase from there bought nothing "
        f"(request rate {signals.request_rate:.1f} req/s, {hold.request_rate:.1f} before it)"
    )


def _instances(count: int) -> str:
    return f"{count} instance" if count == 1 else f"{count} instances"


def _outcome(model: str, current: int, desired: int) -> str:
    if desired == current:
        return f"{model} stays at {_instances(current)}"
    return f"{model} {current} -> {_instances(desired)}"


def _active_condition(problem: tuple[str, str] | None) -> Condition:
    if problem is None:
        return Condition(True, VALID_METRIC_FOUND, "the metrics are usable")
    reason, message = problem
    return Condition(False, reason, message)


def _usable_signals(
    spec: AutoscalerSpec, snapshot: MetricSnapshot | None, now: float
) -> tuple[ModelSignals | None, tuple[str, str] | None]:
    """The model's signals, or (None, (reason, message)) when they cannot be trusted."""
    if snapshot is None:
        return None, (METRICS_MISSING, "no metrics snapshot")
    signals = snapshot.model(spec.model)
    if signals is None:
        return None, (METRICS_MISSING, f"the metrics hold nothing for {spec.model}")
    unusable = sizing.unusable_field(signals)
    if unusable is not None:
        return None, (METRICS_MISSING, f"{spec.model}'s {unusable}")
    age = now - snapshot.taken_at
    if age > max_snapshot_age_s(spec):
        return signals, (
            METRICS_STALE,
            f"the metrics are {age:.0f} s old (more than {max_snapshot_age_s(spec):.0f} s)",
        )
    if not snapshot.complete:
        return signals, (
            WARMING_UP,
            f"the metrics cover {snapshot.window_s:.0f} s of a {spec.metrics_window_seconds} s "
            "window (warming up)",
        )
    return signals, None


def _observed(
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


def _gpu_guard(spec: AutoscalerSpec, snapshot: MetricSnapshot) -> tuple[str, str] | None:
    """A full GPU takes no more instances: more pods (the HPA) are the answer."""
    gpu = snapshot.gpu
    if gpu is None:
        return None
    targets = spec.targets
    if _finite(gpu.utilization) and gpu.utilization >= targets.gpu_utilization_ceiling:
        what = (
            f"GPU utilization {gpu.utilization:.2f} is at or above its ceiling "
            f"{targets.gpu_utilization_ceiling:.2f}"
        )
    elif _finite(gpu.memory_fraction) and gpu.memory_fraction >= targets.gpu_memory_ceiling:
        what = (
            f"GPU memory {gpu.memory_fraction:.2f} is at or above its ceiling "
            f"{targets.gpu_memory_ceiling:.2f}"
        )
    else:
        return None
    return GPU_SATURATED, f"{what}: more pods (the HPA), not more instances, are the answer"


def _child_guard(
    spec: AutoscalerSpec, snapshot: MetricSnapshot, child_instances: Mapping[str, int]
) -> tuple[str, str] | None:
    """A BLS parent's compute time includes its wait for the models it calls.

    When one of them is saturated, more parents only queue more work in front of it; the
    answer is to scale that child. The parent's targets and tolerance judge the children
    (the children's own autoscalers may use others). A child without metrics or a known
    count is not judged.
    """
    saturated = []
    for child in spec.calls:
        signals = snapshot.model(child)
        instances = child_instances.get(child)
        if signals is None or not instances or instances < 1:
            continue
        if sizing.unusable_field(signals) is not None:
            continue
        need = sizing.saturation(signals, instances, spec.targets, spec.tolerance)
        if need is not None:
            saturated.append((need.ratio, child, instances, need))
    if not saturated:
        return None
    saturated.sort(key=lambda item: -item[0])
    names = " and ".join(child for _, child, _, _ in saturated)
    _, child, instances, need = saturated[0]
    verb = "is" if len(saturated) == 1 else "are"
    return (
        CHILD_SATURATED,
        f"{names} {verb} saturated ({child}: {need.describe()} at {_instances(instances)}): "
        f"scale {names}, not {spec.model}",
    )


def _because(
    reason: str,
    winner: sizing.Need,
    all_needs: list[sizing.Need],
    tolerance: float,
    scale_down_margin: float,
    recommended: int,
    current: int,
) -> str:
    if reason == sizing.WITHIN_TOLERANCE:
        described = ", ".join(need.describe() for need in all_needs)
        if any(need.instances == current and need.ratio < 1 - tolerance for need in all_needs):
            return (
                f"the signals ask for no other count ({described}): with fewer instances the "
                f"load would not be clearly below its target (scale-down margin "
                f"{scale_down_margin:.2f})"
            )
        return f"the signals ask for no other count ({described}; tolerance {tolerance:.2f})"
    side = "above" if winner.ratio > 1 else "below"
    return (
        f"{winner.signal} {winner.value:.2f} is {side} the target {winner.target:.2f} "
        f"and asks for {_instances(recommended)}"
    )


def _window_phrase(spec: AutoscalerSpec, reason: str, wanted: int, allowed: int) -> str:
    if reason == behavior.SCALE_DOWN_STABILIZED:
        window = spec.behavior.scale_down.stabilization_window_seconds
        return (
            f"the highest recommendation of the last {window} s was {allowed} "
            "(scaleDown stabilization window)"
        )
    window = spec.behavior.scale_up.stabilization_window_seconds
    return (
        f"the lowest recommendation of the last {window} s was {allowed} "
        "(scaleUp stabilization window)"
    )


def _limit_phrase(spec: AutoscalerSpec, reason: str, wanted: int, allowed: int) -> str:
    if reason == behavior.SCALE_UP_LIMIT:
        return f"the scaleUp policies allow {_instances(allowed)} now"
    if reason == behavior.SCALE_DOWN_LIMIT:
        return f"the scaleDown policies allow {_instances(allowed)} now"
    if reason == behavior.TOO_MANY_INSTANCES:
        return f"maxInstances is {spec.max_instances}"
    return f"minInstances is {spec.min_instances}"
