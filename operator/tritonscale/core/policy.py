"""The policy: one pure function from (spec, live count, metrics, history, clock) to a decision.

`decide` reads no clock and does no I/O; the driver passes `now` and the `PolicyState` it
kept from the last tick, applies `desired_instances` (unless `spec.dry_run`), and stores
`decision.state` for the next tick. `decide` is the state's one owner: what the driver knows
(a budget's grant, a load still in flight) comes in as arguments.

The decision comes from the first of these that applies:

1. paused: hold, report what was seen;
2. the live count outside [min, max]: go to the bound at once (as the HPA does);
3. no usable metrics (none, model missing, stale, incomplete window): hold;
4. the check of the last increase (tritonscale.core.gain) finds it bought nothing: back to
   the count before it at once (NoGain), past the windows and rate limits below;
5. sizing (tritonscale.core.sizing: each signal's count, the largest wins), then the stages
   in order, each a function from (count, reason) to (count, reason, clause), the way the
   HPA's `normalizeDesiredReplicasWithBehaviors` reads:
   - held where an increase bought nothing (NoGain), a full GPU (more pods are the answer),
     a saturated model this one calls (scale the child): these only stop additions;
   - min/max: the one clamp (the NoGain revert's count goes through it too);
   - HPA behavior (tritonscale.core.behavior): stabilization windows, then rate policies.

Whichever it is, a last stage gives a model that shares a budget with others (spec.budget)
what the budget grants it (tritonscale.core.budget): the grant is an input, so a driver that
allocates a budget decides once for the ask and again with the grant. The reason of a
decision is the last stage that changed the count; its message (the stages' clauses, in
order) and its conditions are rendered from the stages at the end.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import NamedTuple

from tritonscale.core import behavior, gain, sizing
from tritonscale.core.behavior import PolicyState
from tritonscale.core.budget import BUDGET_EXHAUSTED, Grant
from tritonscale.core.signals import MetricSnapshot, ModelSignals
from tritonscale.core.spec import AutoscalerSpec

__all__ = [
    "Condition",
    "Decision",
    "PolicyState",
    "decide",
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

STABILIZED_REASONS = frozenset({behavior.SCALE_UP_STABILIZED, behavior.SCALE_DOWN_STABILIZED})

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
    grant: Grant | None = None,
    load_in_flight: bool = False,
    scale_down_margin: float = sizing.SCALE_DOWN_MARGIN,
) -> Decision:
    """Decide the instance count of `spec.model` for one tick.

    `current_instances` is the live count on the pods (the highest if they disagree);
    `child_instances` the live counts of the models in `spec.calls`, where known; `now` is
    unix seconds on the same clock as `snapshot.taken_at`. `grant` is what the model's budget
    grants this tick's ask (spec.budget; None without one). `load_in_flight`: a load of the
    model was still in flight when the last tick ended (it outlived the actuator's deadline).
    `scale_down_margin` is how far below its target a scale-down takes a signal
    (tritonscale.core.sizing).

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
    current = current_instances
    state = state.observe(current, now, spec)
    signals, problem = _usable_signals(spec, snapshot, now)
    if spec.paused:
        why = "paused (observing only)"
        proposal = _Proposal((_Step(current, PAUSED, why),), Condition(False, PAUSED, why), state)
    elif not spec.min_instances <= current <= spec.max_instances:
        proposal = _Proposal((_to_bound(spec, current),), _active_condition(problem), state)
    elif problem is not None:
        reason, why = problem
        proposal = _Proposal((_Step(current, reason, why),), Condition(False, reason, why), state)
    else:
        assert signals is not None and snapshot is not None
        proposal = _scale(
            spec,
            current,
            signals,
            snapshot,
            child_instances,
            state,
            now,
            load_in_flight,
            scale_down_margin,
        )
    asked = proposal.steps[-1]
    granted = _within_grant(grant, current, asked.count, asked.reason)
    proposal = replace(proposal, steps=(*proposal.steps, granted))
    return _rendered(
        spec, current, proposal, observed_metrics(spec, current, signals, snapshot), now
    )


class _Step(NamedTuple):
    """What one stage made of the count."""

    count: int
    reason: str
    clause: str = ""  # why the stage changed the count; "" when it left it as it was


@dataclass(frozen=True)
class _Proposal:
    """A decision before it is put in words."""

    steps: tuple[_Step, ...]  # where the count came from, then each stage in order
    active: Condition  # ScalingActive
    state: PolicyState  # what to keep, before this tick is recorded in it
    recommended: int | None = None  # what the load alone asks for (sizing)


def _to_bound(spec: AutoscalerSpec, current: int) -> _Step:
    """A live count outside [min, max] goes to the bound at once, whatever the metrics say."""
    if current < spec.min_instances:
        return _Step(
            spec.min_instances,
            behavior.TOO_FEW_INSTANCES,
            f"{_instances(current)} is below minInstances {spec.min_instances}",
        )
    return _Step(
        spec.max_instances,
        behavior.TOO_MANY_INSTANCES,
        f"{_instances(current)} is above maxInstances {spec.max_instances}",
    )


def _scale(
    spec: AutoscalerSpec,
    current: int,
    signals: ModelSignals,
    snapshot: MetricSnapshot,
    child_instances: Mapping[str, int],
    state: PolicyState,
    now: float,
    load_in_flight: bool,
    scale_down_margin: float,
) -> _Proposal:
    """Size the model from its signals, judge its last increase, then run the stages."""
    all_needs = sizing.needs(signals, current, spec.targets, spec.tolerance, scale_down_margin)
    recommended, reason, winner = sizing.recommend(all_needs, current)
    active = Condition(True, VALID_METRIC_FOUND, f"sized from {winner.describe()}")

    check = _carried_check(state.gain_check, current, now, load_in_flight)
    if check is not None and not load_in_flight and gain.due(check, snapshot):
        verdict = gain.judge(check, gain.sample(signals, current))
        if not verdict.gained:
            return _reverted(spec, check, verdict, state, now, recommended, active)
        check = None
    hold = state.no_gain
    if hold is not None and gain.released(hold, signals, current, snapshot):
        hold = None

    because = _because(
        reason, winner, all_needs, spec.tolerance, scale_down_margin, recommended, current
    )
    sized = _Step(recommended, reason, because)
    held = _held_at_no_gain(hold, signals, current, sized.count, sized.reason)
    gpu = _gpu_full(spec, snapshot, current, held.count, held.reason)
    child = _child_saturated(spec, snapshot, child_instances, current, gpu.count, gpu.reason)
    bounded = _bounded(spec, child.count, child.reason)
    history = state.seeded(current, now, spec)
    stabilized = _stabilized(
        spec, history.recommendations, current, now, bounded.count, bounded.reason
    )
    limited = _rate_limited(
        spec, history.scale_events, current, now, stabilized.count, stabilized.reason
    )

    if limited.count > current and check is None:
        before = gain.sample(signals, current)
        check = gain.GainCheck(now, before) if before is not None else None
    kept = replace(history, gain_check=check, no_gain=hold).recommend(bounded.count, now, spec)
    steps = (sized, held, gpu, child, bounded, stabilized, limited)
    return _Proposal(steps, active, kept, recommended)


def _carried_check(
    check: gain.GainCheck | None, current: int, now: float, load_in_flight: bool
) -> gain.GainCheck | None:
    """The check of the last increase as this tick finds it."""
    if check is None:
        return None
    if load_in_flight:
        # The increase's load was still in flight at the last tick: keep the check until the
        # new count is live, then judge a window wholly after the tick that saw it.
        return check.landed(now) if current > check.before.instances else check
    if current <= check.before.instances:
        return None  # the increase never landed (a dry run, a failed load) or was undone
    return check


def _reverted(
    spec: AutoscalerSpec,
    check: gain.GainCheck,
    verdict: gain.Verdict,
    state: PolicyState,
    now: float,
    recommended: int,
    active: Condition,
) -> _Proposal:
    """Revert an increase that bought nothing, at once, and hold the count there.

    Past the behavior's windows and rate limits: it is a verdict, not a reading of the load.
    """
    # The count before the increase, within today's bounds (the spec may have changed since
    # the increase); the verdict, not the bound, stays the reason.
    back = _bounded(spec, check.before.instances, NO_GAIN).count
    reverted = _Step(
        back,
        NO_GAIN,
        f"the increase bought nothing ({verdict.message}): back to {_instances(back)}, "
        f"held there until the request rate moves by more than "
        f"{100 * gain.RELEASE_CHANGE:.0f} %",
    )
    hold = gain.NoGainHold(back, check.before.request_rate, now)
    kept = replace(state, gain_check=None, no_gain=hold).recommend(back, now, spec)
    return _Proposal((reverted,), active, kept, recommended)


# ---- the stages: each maps (count, reason) to (count, reason, clause) ----------------------


def _held_at_no_gain(
    hold: gain.NoGainHold | None, signals: ModelSignals, current: int, count: int, reason: str
) -> _Step:
    """No increase from a count where one bought nothing, until the hold ends (core.gain)."""
    if hold is None or count <= current:
        return _Step(count, reason)
    return _Step(
        current,
        NO_GAIN,
        f"held at {_instances(hold.instances)}: an increase from there bought nothing "
        f"(request rate {signals.request_rate:.1f} req/s, {hold.request_rate:.1f} before it)",
    )


def _gpu_full(
    spec: AutoscalerSpec, snapshot: MetricSnapshot, current: int, count: int, reason: str
) -> _Step:
    """A full GPU takes no more instances: more pods (the HPA) are the answer."""
    what = gpu_ceiling_reached(spec, snapshot)
    if count <= current or what is None:
        return _Step(count, reason)
    return _Step(
        current, GPU_SATURATED, f"{what}: more pods (the HPA), not more instances, are the answer"
    )


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


def _child_saturated(
    spec: AutoscalerSpec,
    snapshot: MetricSnapshot,
    child_instances: Mapping[str, int],
    current: int,
    count: int,
    reason: str,
) -> _Step:
    """A BLS parent's compute time includes its wait for the models it calls.

    When one of them is saturated, more parents only queue more work in front of it; the
    answer is to scale that child. The parent's targets and tolerance judge the children
    (the children's own autoscalers may use others). A child without metrics or a known
    count is not judged.
    """
    if count <= current:
        return _Step(count, reason)
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
        return _Step(count, reason)
    saturated.sort(key=lambda item: -item[0])
    names = " and ".join(child for _, child, _, _ in saturated)
    _, child, instances, need = saturated[0]
    verb = "is" if len(saturated) == 1 else "are"
    return _Step(
        current,
        CHILD_SATURATED,
        f"{names} {verb} saturated ({child}: {need.describe()} at {_instances(instances)}): "
        f"scale {names}, not {spec.model}",
    )


def _bounded(spec: AutoscalerSpec, count: int, reason: str) -> _Step:
    """minInstances and maxInstances: the one place a count is clamped to them."""
    if count > spec.max_instances:
        return _Step(
            spec.max_instances, behavior.TOO_MANY_INSTANCES, f"maxInstances is {spec.max_instances}"
        )
    if count < spec.min_instances:
        return _Step(
            spec.min_instances, behavior.TOO_FEW_INSTANCES, f"minInstances is {spec.min_instances}"
        )
    return _Step(count, reason)


def _stabilized(
    spec: AutoscalerSpec,
    history: tuple[behavior.Recommendation, ...],
    current: int,
    now: float,
    count: int,
    reason: str,
) -> _Step:
    """HPA's stabilization windows over the earlier ticks' recommendations (core.behavior)."""
    stabilized, window_reason = behavior.stabilize(spec, history, current, count, now)
    if window_reason is None:
        return _Step(count, reason)
    if window_reason == behavior.SCALE_DOWN_STABILIZED:
        window = spec.behavior.scale_down.stabilization_window_seconds
        clause = (
            f"the highest recommendation of the last {window} s was {stabilized} "
            "(scaleDown stabilization window)"
        )
    else:
        window = spec.behavior.scale_up.stabilization_window_seconds
        clause = (
            f"the lowest recommendation of the last {window} s was {stabilized} "
            "(scaleUp stabilization window)"
        )
    return _Step(stabilized, window_reason, clause)


def _rate_limited(
    spec: AutoscalerSpec,
    events: tuple[behavior.ScaleEvent, ...],
    current: int,
    now: float,
    count: int,
    reason: str,
) -> _Step:
    """HPA's rate policies over the recent scale events (core.behavior)."""
    allowed, limit_reason = behavior.limit_rate(spec, events, current, count, now)
    if limit_reason is None:
        return _Step(count, reason)
    rules = "scaleUp" if limit_reason == behavior.SCALE_UP_LIMIT else "scaleDown"
    return _Step(allowed, limit_reason, f"the {rules} policies allow {_instances(allowed)} now")


def granted(model: str, decision: Decision, grant: Grant | None) -> Decision:
    """A decision made for a whole pod set (tritonscale.core.planner) cut to what `model`'s
    budget grants, as `decide` cuts its own: only an increase is cut, never below the current
    count.

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


# ---- the decision in words -------------------------------------------------------------------


def _rendered(
    spec: AutoscalerSpec,
    current: int,
    proposal: _Proposal,
    observed: Mapping[str, float],
    now: float,
) -> Decision:
    """The decision: the last stage's count and reason, the stages' clauses in order as its
    message, and the conditions."""
    desired, reason = proposal.steps[-1].count, proposal.steps[-1].reason
    why = "; ".join(step.clause for step in proposal.steps if step.clause)
    message = f"{_outcome(spec.model, current, desired)}: {why}"
    if reason in LIMITING_REASONS:
        limited = Condition(True, reason, message)
    else:
        limited = Condition(False, DESIRED_WITHIN_RANGE, "the desired count is within range")
    return Decision(
        current_instances=current,
        desired_instances=desired,
        recommended_instances=proposal.recommended,
        direction=UP if desired > current else DOWN if desired < current else NONE,
        reason=reason,
        message=message,
        able_to_scale=_able_to_scale(proposal.steps),
        scaling_active=proposal.active,
        scaling_limited=limited,
        observed=dict(observed),
        state=proposal.state.ticked(current, desired, now),
    )


def _able_to_scale(steps: tuple[_Step, ...]) -> Condition:
    """AbleToScale as the HPA sets it: the stabilization window that held the count, if any."""
    for step in steps:
        if step.clause and step.reason in STABILIZED_REASONS:
            return Condition(True, step.reason, step.clause)
    return Condition(True, READY_FOR_NEW_SCALE, "no stabilization window holds the count")


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
