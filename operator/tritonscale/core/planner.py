"""The pod set's planner: every model's count decided together, once per set tick.

`decide_set` reads no clock and does no I/O; the driver (or the simulator) passes the set's
specs keyed by model, the live counts, the set's snapshot, the `SetState` it kept from the
last tick (`SetState.from_dict` of what it stored) and `now`. It returns each model's target
count with a reason and a message, the prediction, and the state to keep. Stages, in order:

1. a model that is paused, or whose live count is outside [min, max], is held (or goes to the
   bound at once); with no usable snapshot (none, stale, incomplete) every model holds, but
   a set with a latency objective decides on an incomplete one, no count going down
   (`_up_only`);
2. the pipeline model (tritonscale.core.pipeline_model) from the snapshot and the history; a
   model it cannot measure (a decoupled model whose timings miss its work) is sized on its own
   signals (tritonscale.core.sizing), as the streams it holds open ask;
3. the verifier (tritonscale.core.verifier) judges the last step up once a window lies
   wholly after it: a step that fell short goes back at once, past the stages below (a step
   taken while another waits is judged with it, against the same baseline; a step the latency
   search chose is left to that search, which predicts again every tick);
   the first window whose roots' arrivals moved within it by more than chance (a load step
   it straddles) is not decided on: every model holds for that tick (`LOAD_STEP_IN_WINDOW`);
4. the allocator (tritonscale.core.allocator) chooses every count together; where the pods'
   GPU has reached a model's ceiling (`spec.targets`), it searches again with no such model
   above today's count (GpuSaturated: more pods are the answer, not more instances);
5. HPA behavior per model (tritonscale.core.behavior): stabilization, then rate limits;
6. the room: an increase that the budget cannot hold until another model has given its
   instances back (as slowly as that model's behavior allows) waits for them.

The drivers call it through tritonscale.control.set_planner, at every set tick.
`as_policy_decision` gives one model's part of the result in the form the drivers report and
apply (tritonscale.core.policy.Decision).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tritonscale.core import behavior, policy, sizing, verifier
from tritonscale.core.allocator import (
    LATENCY_OBJECTIVE,
    UNMEASURED,
    Allocation,
    Prediction,
    Room,
    Target,
    allocate,
)
from tritonscale.core.behavior import PolicyState
from tritonscale.core.budget import BUDGET_EXHAUSTED
from tritonscale.core.latency import LatencyPrediction, search_of
from tritonscale.core.pipeline_model import (
    NOISE_FLOOR,
    NOISE_SIGMAS,
    Batching,
    PipelineHistory,
    PipelineModel,
    Window,
    measure,
    starts_after,
)
from tritonscale.core.policy import (
    METRICS_MISSING,
    METRICS_STALE,
    PAUSED,
    WARMING_UP,
    max_snapshot_age_s,
)
from tritonscale.core.signals import MetricSnapshot
from tritonscale.core.spec import AutoscalerSpec

__all__ = ["ModelDecision", "SetDecision", "SetState", "as_policy_decision", "decide_set"]


@dataclass(frozen=True)
class SetState:
    """What the planner keeps between ticks: the windows, each model's behavior history, and
    the verifier's pending check and corrections. `to_dict` is its form in a CR's status."""

    history: PipelineHistory = PipelineHistory()
    policies: Mapping[str, PolicyState] = field(default_factory=dict, hash=False)
    verifier: verifier.VerifierState = verifier.VerifierState()

    def to_dict(self) -> dict[str, Any]:
        return {
            "history": self.history.to_dict(),
            "policies": {model: state.to_dict() for model, state in self.policies.items()},
            "verifier": self.verifier.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> SetState:
        """Read `to_dict()`'s form back; None or {} is a fresh state.

        Raises ValueError on a malformed dict: a driver may then start afresh with
        `SetState()`, which is safe (a fresh behavior history holds scale-downs back).
        """
        if not d:
            return cls()
        try:
            return cls(
                PipelineHistory.from_dict(d.get("history")),
                {
                    str(model): PolicyState.from_dict(state)
                    for model, state in (d.get("policies") or {}).items()
                },
                verifier.VerifierState.from_dict(d.get("verifier")),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise ValueError(f"malformed set state: {error!r}") from None


@dataclass(frozen=True)
class ModelDecision:
    model: str
    current_instances: int
    desired_instances: int  # what to apply
    allocated_instances: int | None  # the allocator's count, before behavior; None: not sized
    reason: str  # the last stage that changed the count (CamelCase)
    message: str  # one sentence, with the numbers
    # What the model would take were there room (`Target.wanted`): the need a budget's demand
    # ratio counts, reported as the decision's recommendation. None: not sized.
    wanted_instances: int | None = None
    # A root with a latency objective: what the model predicts of the chosen counts (None:
    # no objective, or not sized to it this tick).
    latency: LatencyPrediction | None = None

    @property
    def changes(self) -> bool:
        return self.desired_instances != self.current_instances


@dataclass(frozen=True)
class SetDecision:
    models: Mapping[str, ModelDecision] = field(hash=False)
    prediction: Prediction | None  # None when nothing was allocated this tick
    message: str  # the set in one sentence
    state: SetState  # store it and pass it to the next call
    # What the set's roots served, successes per second, over the latest window; None
    # without a usable snapshot. Beside the last prediction: how far the model is off.
    served_rps: float | None = None

    @property
    def targets(self) -> dict[str, int]:
        return {model: d.desired_instances for model, d in self.models.items()}


# Every model holds for one tick: the window straddles a change of the roots' load.
LOAD_STEP_IN_WINDOW = "LoadStepInWindow"

# Reasons for which ScalingActive is False: the model was not sized this tick.
_INACTIVE = frozenset({PAUSED, METRICS_MISSING, METRICS_STALE, WARMING_UP, UNMEASURED})


def as_policy_decision(
    spec: AutoscalerSpec,
    decided: SetDecision,
    snapshot: MetricSnapshot | None,
) -> policy.Decision:
    """One model's part of a set's decision in the form the drivers report and apply
    (tritonscale.core.policy.Decision): its conditions, observed metrics and behavior state."""
    model = decided.models[spec.model]
    current, desired, reason = model.current_instances, model.desired_instances, model.reason
    if reason in _INACTIVE:
        active = policy.Condition(False, reason, model.message)
    else:
        active = policy.Condition(True, policy.VALID_METRIC_FOUND, f"the set: {decided.message}")
    if reason in policy.LIMITING_REASONS or reason == verifier.STEP_FELL_SHORT:
        limited = policy.Condition(True, reason, model.message)
    elif _held_by_budget(spec, model):
        assert spec.budget is not None
        limited = policy.Condition(
            True,
            BUDGET_EXHAUSTED,
            f"the budget {spec.budget.name} allows {_instances(model.allocated_instances or 0)}"
            f" in the split that serves the most; {model.wanted_instances} would hold "
            f"{spec.model} under its target",
        )
    else:
        limited = policy.Condition(
            False, policy.DESIRED_WITHIN_RANGE, "the desired count is within range"
        )
    if reason in policy.STABILIZED_REASONS:
        able = policy.Condition(True, reason, model.message)
    else:
        able = policy.Condition(
            True, policy.READY_FOR_NEW_SCALE, "no stabilization window holds the count"
        )
    signals = snapshot.model(spec.model) if snapshot is not None else None
    if signals is not None and sizing.unusable_field(signals) is not None:
        signals = None
    return policy.Decision(
        current_instances=current,
        desired_instances=desired,
        recommended_instances=model.wanted_instances,
        direction=policy.UP
        if desired > current
        else policy.DOWN
        if desired < current
        else policy.NONE,
        reason=reason,
        message=model.message,
        able_to_scale=able,
        scaling_active=active,
        scaling_limited=limited,
        observed=policy.observed_metrics(spec, current, signals, snapshot),
        state=decided.state.policies[spec.model],
        latency=model.latency,
    )


def _held_by_budget(spec: AutoscalerSpec, model: ModelDecision) -> bool:
    """A member of a budget that the split gives fewer instances than its target asks for."""
    return (
        spec.budget is not None
        and model.allocated_instances is not None
        and model.wanted_instances is not None
        and model.wanted_instances > model.allocated_instances
    )


@dataclass(frozen=True)
class _Step:
    count: int
    reason: str
    clause: str = ""


def decide_set(
    specs: Mapping[str, AutoscalerSpec],
    current: Mapping[str, int],
    snapshot: MetricSnapshot | None,
    state: SetState,
    now: float,
    batching: Mapping[str, Batching] | None = None,
    live_since: Mapping[str, float] | None = None,
    load_s: Mapping[str, float] | None = None,
) -> SetDecision:
    """Decide every model's count of one pod set (see the module's docstring for the stages).

    `specs` and `current` are keyed by model; `current` is each model's live count per pod
    (the highest where pods disagree). `batching`: each model's batching from its live config
    (`Batching.of_config`); a model left out is taken at today's batch. `live_since`: when a
    model's count went live, where the driver knows it (the end of its load; without it, the
    last window that ran the old count stands for it). `load_s`: per model, how long its last
    load took until its count was live, where the driver measured it (the time a change
    takes, which a latency objective's sizing covers). Raises ValueError
    when a model has no live count (with no ready pod, report NoReadyPods instead of asking
    the planner).
    """
    for model in specs:
        count = current.get(model)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"current[{model!r}] must be an int >= 1, got {count!r}")
    policies = {
        model: state.policies.get(model, PolicyState()).observe(current[model], now, spec)
        for model, spec in specs.items()
    }
    held = {model: _held(spec, current[model]) for model, spec in specs.items()}
    held = {model: step for model, step in held.items() if step is not None}
    history, checks = state.history, state.verifier
    allocation = None
    served = None
    left: dict[str, str] = {}  # roots with a latency objective left to today's sizing, and why
    problem = _unusable(specs, snapshot, now)
    if problem is not None or snapshot is None:
        reason, why = problem or (METRICS_MISSING, "no metrics snapshot")
        steps = {model: [held.get(model) or _Step(current[model], reason, why)] for model in specs}
    else:
        history = history.observed(snapshot, current, live_since)
        pipeline = measure(specs, current, history, batching)
        served = _served_rps(pipeline)
        verdict = verifier.judge(checks, pipeline, current, snapshot, now)
        checks = verdict.state
        stepped = _load_step_in_window(state.history, history, pipeline.roots)
        if verdict.reverts:
            steps = _reverting(specs, current, held, verdict, policies, now)
        elif stepped is not None:
            steps = {
                model: [held.get(model) or _Step(current[model], LOAD_STEP_IN_WINDOW, stepped)]
                for model in specs
            }
        else:
            full = _gpu_full(specs, snapshot)
            ceilings = checks.ceilings(now)

            settling = frozenset(
                model for model, stage in pipeline.stages.items() if not stage.measured_at_counts
            )
            search, left = search_of(specs, pipeline, history, batching, load_s)

            def allocated(ceilings: Mapping[str, int]) -> Allocation:
                return allocate(
                    pipeline,
                    specs,
                    current,
                    held={model: step.count for model, step in held.items()},
                    alone=_sized_alone(specs, current, pipeline, snapshot, ceilings),
                    ceilings=ceilings,
                    settling=settling,
                    lowered=_lowered(pipeline, history, current, policies),
                    switch_margin=_switch_margin(pipeline),
                    latency=search,
                )

            allocation = allocated(ceilings)
            refused = {
                model: why
                for model, why in full.items()
                if allocation.targets[model].count > current[model]
            }
            if refused:
                # A full GPU takes no more instances: the split is searched again with every
                # model on that GPU at most at today's count (more pods are the answer).
                capped = {m: min(current[m], ceilings.get(m, current[m])) for m in full}
                allocation = _refused(allocated({**ceilings, **capped}), refused)
            steps = _behaving(specs, current, held, allocation, policies, now, settling)
            if not snapshot.complete:
                steps = _up_only(steps, current, snapshot)
            desired = {model: model_steps[-1].count for model, model_steps in steps.items()}
            if allocation.objective == LATENCY_OBJECTIVE and search is not None:
                # A step the latency search chose is judged by the search itself: each tick
                # predicts again from windows at the counts that run. The verifier's measures
                # judge the capacity an instance adds; a parent whose child it keeps busier
                # holds longer per execution, which they read as a step that bought nothing,
                # and the parent would be held there for CORRECTION_TTL_S, the objective unmet.
                desired = {m: n for m, n in desired.items() if m not in search.models}
            checks = verifier.start(checks, pipeline, current, desired, now)
    decisions = {}
    for model in specs:
        count = steps[model][-1].count
        policies[model] = policies[model].ticked(current[model], count, now)
        allocated = wanted = None
        if allocation is not None and model not in held:
            allocated = allocation.targets[model].count
            wanted = allocation.targets[model].wanted_count
        decisions[model] = _rendered(model, current[model], steps[model], allocated, wanted)
        if model in left:
            decided = decisions[model]
            decisions[model] = replace(decided, message=f"{decided.message}; {left[model]}")
        if allocation is not None:
            for predicted in allocation.latency:
                if predicted.root == model:
                    decisions[model] = replace(decisions[model], latency=predicted)
    prediction = allocation.prediction if allocation is not None else None
    new_state = SetState(history, policies, checks)
    return SetDecision(decisions, prediction, _summary(prediction, decisions), new_state, served)


def _reverting(
    specs: Mapping[str, AutoscalerSpec],
    current: Mapping[str, int],
    held: Mapping[str, _Step],
    verdict: verifier.Verdict,
    policies: dict[str, PolicyState],
    now: float,
) -> dict[str, list[_Step]]:
    """A step that fell short goes back at once, past behavior; the others hold meanwhile.
    The reverted counts are recorded as recommendations in `policies`."""
    steps = {}
    for model, spec in specs.items():
        steps[model] = [held.get(model) or _reverted(spec, current[model], verdict, model)]
        if model in verdict.reverts and model not in held:
            policies[model] = policies[model].recommend(steps[model][-1].count, now, spec)
    return steps


def _behaving(
    specs: Mapping[str, AutoscalerSpec],
    current: Mapping[str, int],
    held: Mapping[str, _Step],
    allocation: Allocation,
    policies: dict[str, PolicyState],
    now: float,
    settling: frozenset[str] = frozenset(),
) -> dict[str, list[_Step]]:
    """The allocation through each model's HPA behavior, then the budget's room. The
    allocated counts are recorded as recommendations in `policies`, but for a model held at
    its count because it is `settling` (not yet measured at the count it was just moved to):
    that hold says nothing of the load, and recorded it would hold every step down of a
    scale-down for a whole stabilization window, where the HPA steps at its rate policy."""
    steps: dict[str, list[_Step]] = {}
    behaved: dict[str, _Behaved] = {}
    for model, spec in specs.items():
        if model in held:
            steps[model] = [held[model]]
            continue
        target = allocation.targets[model]
        seeded = policies[model].seeded(current[model], now, spec)
        behaved[model] = _Behaved(spec, seeded, current[model], target, now)
        steps[model] = behaved[model].steps()
        if model in settling and target.count == current[model]:
            policies[model] = seeded
        else:
            policies[model] = seeded.recommend(target.count, now, spec)
    _within_room(specs, current, steps, behaved, allocation)
    return steps


def _held(spec: AutoscalerSpec, count: int) -> _Step | None:
    """Paused: hold; outside [min, max]: the bound at once, whatever the metrics say."""
    if spec.paused:
        return _Step(count, PAUSED, "paused (observing only)")
    if count < spec.min_instances:
        return _Step(
            spec.min_instances,
            behavior.TOO_FEW_INSTANCES,
            f"{_instances(count)} is below minInstances {spec.min_instances}",
        )
    if count > spec.max_instances:
        return _Step(
            spec.max_instances,
            behavior.TOO_MANY_INSTANCES,
            f"{_instances(count)} is above maxInstances {spec.max_instances}",
        )
    return None


def _unusable(
    specs: Mapping[str, AutoscalerSpec], snapshot: MetricSnapshot | None, now: float
) -> tuple[str, str] | None:
    """Why the set's snapshot cannot be used this tick; None when it can."""
    if snapshot is None:
        return METRICS_MISSING, "no metrics snapshot"
    oldest = min((max_snapshot_age_s(spec) for spec in specs.values()), default=0.0)
    age = now - snapshot.taken_at
    if age > oldest:
        return METRICS_STALE, f"the metrics are {age:.0f} s old (more than {oldest:.0f} s)"
    if not snapshot.complete and all(s.targets.latency is None for s in specs.values()):
        return WARMING_UP, f"the metrics cover {snapshot.window_s:.0f} s of a window (warming up)"
    return None


def _up_only(
    steps: dict[str, list[_Step]], current: Mapping[str, int], snapshot: MetricSnapshot
) -> dict[str, list[_Step]]:
    """A set with a latency objective decides on a snapshot that covers less than a window
    (a young series: a set's start, a restarted source): its objective is missed for as long
    as its counts wait for a whole window, and the latency search's headroom for the rate's
    chance spread widens as the window shortens (`latency.sizing_rate`: a Poisson stream's
    spread over the window's length). A set without one holds until the window is whole: the
    allocator's split judged on part of a window turned under a steady load (the steady-load
    property of the simulator's tests). Either way no count goes down on part of a window:
    a load that reads low may have risen since it began (the sources' contract)."""
    why = (
        f"the metrics cover {snapshot.window_s:.0f} s of a window (warming up): no scale-down on it"
    )
    return {
        model: model_steps
        if model_steps[-1].count >= current[model]
        else [*model_steps, _Step(current[model], WARMING_UP, why)]
        for model, model_steps in steps.items()
    }


def _sized_alone(
    specs: Mapping[str, AutoscalerSpec],
    current: Mapping[str, int],
    pipeline: PipelineModel,
    snapshot: MetricSnapshot,
    ceilings: Mapping[str, int],
) -> dict[str, Target]:
    """The models the pipeline model cannot measure, sized on their own signals
    (tritonscale.core.sizing: each signal's count, the largest wins), within their bounds and
    ceilings. A decoupled model whose `execute` returns at once is one: Triton's timings miss
    its work, and the streams it holds open size it instead. A model with no usable signals
    is left to the allocator, which keeps its count."""
    alone = {}
    for model, why in pipeline.unmeasured.items():
        signals = snapshot.model(model)
        if signals is None or sizing.unusable_field(signals) is not None:
            continue
        spec, count = specs[model], current[model]
        needs = sizing.needs(signals, count, spec.targets, spec.tolerance)
        asked, reason, winner = sizing.recommend(needs, count)
        highest = max(spec.min_instances, min(spec.max_instances, ceilings.get(model, asked)))
        target = max(spec.min_instances, min(asked, highest))
        wanted = max(target, min(asked, spec.max_instances))
        alone[model] = Target(
            model,
            count,
            target,
            reason,
            f"{why}; sized on its own from {winner.describe()}",
            wanted,
        )
    return alone


def _gpu_full(specs: Mapping[str, AutoscalerSpec], snapshot: MetricSnapshot) -> dict[str, str]:
    """The models whose GPU ceiling (`spec.targets`) the pods' GPU has reached, and in words
    why: a full GPU takes no more instances (more pods, the HPA's, are the answer)."""
    full = {model: policy.gpu_ceiling_reached(spec, snapshot) for model, spec in specs.items()}
    return {model: why for model, why in full.items() if why is not None}


def _refused(allocation: Allocation, refused: Mapping[str, str]) -> Allocation:
    """The allocation searched again on a full GPU, each model refused an increase saying so."""
    targets = dict(allocation.targets)
    for model, why in refused.items():
        target = targets[model]
        if target.count <= target.current:
            targets[model] = replace(
                target,
                reason=policy.GPU_SATURATED,
                message=(
                    f"{why}: more pods (the HPA), not more instances, are the answer; "
                    f"{target.message}"
                ),
            )
    return replace(allocation, targets=targets)


def _served_rps(pipeline: PipelineModel) -> float:
    """Successes per second at the set's roots, latest window."""
    return sum(
        pipeline.stages[root].arrival_rps.value * pipeline.stages[root].served_fraction.value
        for root in pipeline.roots
    )


def _lowered(
    pipeline: PipelineModel,
    history: PipelineHistory,
    current: Mapping[str, int],
    policies: Mapping[str, PolicyState],
) -> frozenset[str]:
    """The models the planner just lowered whose new count is not yet measured (no window
    lies wholly after the change), unless their load rose beyond its noise since: the
    estimates they went down by do not take them back up (two roots that trade an instance
    while the old one's queue drains would otherwise trade it back at the next tick). A count
    that fell by itself (a pod restarted with the repository's count) is no such decision:
    the load takes it back up at once."""
    lowered = set()
    for model, stage in pipeline.stages.items():
        count = current[model]
        ours = policies.get(model)
        if ours is None or ours.last_desired != count:
            continue
        before = [w for w in history.windows if w.counts.get(model, count) != count]
        if not before or before[-1].counts[model] < count:
            continue
        changed_at = history.changed_at((model,), current)
        if any(
            w.counts.get(model) == count and starts_after(w, changed_at) for w in history.windows
        ):
            continue
        then = before[-1].readings.get(model)
        load = stage.arrival_rps
        if then is not None and load.value > then.arrival_rate * (1 + load.noise):
            continue
        lowered.add(model)
    return frozenset(lowered)


def _load_step_in_window(
    before: PipelineHistory, after: PipelineHistory, roots: Sequence[str]
) -> str | None:
    """Why this tick's window is not decided on (None: it is): a root's arrivals in it differ
    from those of the last tick's window by more than chance, while the last tick's agreed
    with the one before it. The load stepped inside the window: its rates mix two loads, and
    the counts they ask for are the next window's to undo (a branch raised for the mix is
    given back once its caller saturates). One tick only: a load that keeps moving (a ramp)
    is decided on at the next, as a step is, on a window nearer the new load."""
    if len(before.windows) < 2 or not after.windows:
        return None
    latest, last, earlier = after.windows[-1], before.windows[-1], before.windows[-2]
    if latest.taken_at <= last.taken_at:
        return None  # no new window this tick
    for root in roots:
        if _moved(latest, last, root) and _moved(last, earlier, root) is False:
            then = last.readings[root].arrival_rate
            now = latest.readings[root].arrival_rate
            return (
                f"holds: {root}'s arrivals moved from {then:.1f} to {now:.1f} req/s within the "
                f"window, which mixes the two loads; the next tick decides"
            )
    return None


def _moved(later: Window, earlier: Window, root: str) -> bool | None:
    """Whether the root's arrival rate differs between two windows by more than chance (None
    when one of them lacks it). Windows `shift` seconds apart differ by the requests of the
    `shift` seconds each has that the other lacks: under a steady load, counts of a Poisson
    stream, whose difference strays by sqrt(2 x rate x shift). More than `NOISE_SIGMAS` of
    that, and more than NOISE_FLOOR of the rate, is a load that moved."""
    new, old = later.readings.get(root), earlier.readings.get(root)
    shift = min(later.taken_at - earlier.taken_at, later.window_s)
    if new is None or old is None or shift <= 0:
        return None
    rate = max(new.arrival_rate, old.arrival_rate)
    gap = abs(new.arrival_rate - old.arrival_rate)
    chance = NOISE_SIGMAS * math.sqrt(2.0 * rate * shift) / later.window_s
    return gap > max(chance, NOISE_FLOOR * rate)


def _switch_margin(pipeline: PipelineModel) -> float:
    """How much more a split must serve before today's is left: one standard deviation of the
    noisiest estimate it rests on, at least NOISE_FLOOR (configurations 8 to 10 % apart must
    be told apart: the budget's greedy allocation could not)."""
    spreads = [
        stage.hold_per_request_s.noise / NOISE_SIGMAS
        for stage in pipeline.active.values()
        if stage.hold_per_request_s.windows > 1
    ]
    return max([NOISE_FLOOR, *spreads])


def _reverted(spec: AutoscalerSpec, current: int, verdict: verifier.Verdict, model: str) -> _Step:
    if model not in verdict.reverts:
        return _Step(current, verifier.STEP_FELL_SHORT, "holds while the last step is undone")
    count, why = verdict.reverts[model]
    back = max(spec.min_instances, min(count, spec.max_instances))
    return _Step(back, verifier.STEP_FELL_SHORT, f"{why}: back to {_instances(back)}")


@dataclass(frozen=True)
class _Behaved:
    """One model's allocated count through HPA behavior (tritonscale.core.behavior)."""

    spec: AutoscalerSpec
    history: PolicyState  # seeded, before this tick's recommendation
    current: int
    target: Target
    now: float

    def steps(self, stabilized: bool = True) -> list[_Step]:
        """The allocator's count, then stabilization (skipped with `stabilized` False), then
        the rate policies."""
        spec, current, now = self.spec, self.current, self.now
        count = self.target.count
        steps = [_Step(count, self.target.reason, self.target.message)]
        if stabilized:
            count, window_reason = behavior.stabilize(
                spec, self.history.recommendations, current, count, now
            )
            if window_reason is not None:
                steps.append(_Step(count, window_reason, f"the stabilization window holds {count}"))
        else:
            steps.append(
                _Step(
                    count,
                    self.target.reason,
                    "its scaleDown stabilization window yields: another model waits for the room",
                )
            )
        allowed, limit_reason = behavior.limit_rate(
            spec, self.history.scale_events, current, count, now
        )
        if limit_reason is not None:
            steps.append(
                _Step(allowed, limit_reason, f"the rate policies allow {_instances(allowed)} now")
            )
        return steps


def _within_room(
    specs: Mapping[str, AutoscalerSpec],
    current: Mapping[str, int],
    steps: dict[str, list[_Step]],
    behaved: Mapping[str, _Behaved],
    allocation: Allocation,
) -> None:
    """Cut the increases to the room the other models leave once their counts are applied,
    the bottleneck's increase first.

    A model that gives instances back holds them through its scaleDown stabilization window;
    when another model's increase waits for that room, the window yields (it guards against
    a dip in the model's own load, and this move is the set's), while the rate policies
    still pace the give-back.
    """
    room = Room.of(specs)
    counts = {model: model_steps[-1].count for model, model_steps in steps.items()}
    if room.fits(counts):
        return
    for model, model_behaved in behaved.items():
        if any(step.reason == behavior.SCALE_DOWN_STABILIZED for step in steps[model]):
            steps[model] = model_behaved.steps(stabilized=False)
            counts[model] = steps[model][-1].count
    rising = sorted(
        (model for model in counts if counts[model] > current[model]),
        key=lambda model: (model != allocation.prediction.bottleneck, model),
    )
    granted = {**counts, **{model: current[model] for model in rising}}
    for model in rising:
        while granted[model] < counts[model] and room.fits({**granted, model: granted[model] + 1}):
            granted[model] += 1
        if granted[model] < counts[model]:
            overflow = room.overflow({**granted, model: counts[model]}) or "no room"
            steps[model].append(
                _Step(
                    granted[model],
                    BUDGET_EXHAUSTED,
                    f"waits for room ({overflow}) until the others give instances back",
                )
            )


def _rendered(
    model: str, current: int, steps: list[_Step], allocated: int | None, wanted: int | None
) -> ModelDecision:
    desired, reason = steps[-1].count, steps[-1].reason
    outcome = (
        f"{model} stays at {_instances(current)}"
        if desired == current
        else f"{model} {current} -> {_instances(desired)}"
    )
    why = "; ".join(step.clause for step in steps if step.clause)
    return ModelDecision(model, current, desired, allocated, reason, f"{outcome}: {why}", wanted)


def _summary(prediction: Prediction | None, decisions: Mapping[str, ModelDecision]) -> str:
    changes = ", ".join(
        f"{d.model} {d.current_instances} -> {d.desired_instances}"
        for d in decisions.values()
        if d.changes
    )
    moved = changes or "no change"
    if prediction is None:
        return moved
    bottleneck = prediction.bottleneck or "none"
    latencies = "".join(
        f"; {d.latency.describe}" for d in decisions.values() if d.latency is not None
    )
    return (
        f"{moved}; predicted {prediction.expected_rps:.1f} req/s of {prediction.offered_rps:.1f} "
        f"offered (capacity {prediction.capacity_rps:.1f}, bottleneck {bottleneck}){latencies}"
    )


def _instances(count: int) -> str:
    return f"{count} instance" if count == 1 else f"{count} instances"
