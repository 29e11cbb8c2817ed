"""One autoscaler's control tick, in its parts: observe, read the metrics, decide, finish.

    seen = await observe(spec, endpoints, actuator, state, now=time.time(), healer=healer)
    plan = seen.planned(await read_snapshot(source, seen.pods, [seen.metrics]))
    result = await finish(plan, actuator)                 # or with a budget's grant
    state = result.state                                  # pass it to the next tick

A tick: read the live counts on the ready pods (the highest is `current`, so that a restarted
or lagging pod converges to what the others serve; disagreements are reported), read the
children's counts (`spec.calls`), take a metrics snapshot; the set planner decides
(tritonscale.control.set_planner: `Plan.chosen`); then, unless paused, dry-running or backing
off, bring every pod whose count differs from the decision to it (`Actuator.apply`: the first
pod alone, then the others in parallel). A tick is a coroutine: it waits on Triton and
Prometheus without holding a thread, and its reads of several pods go together. Errors are
results, not exceptions: `TickResult.errors` holds each with its HPA-style reason
(FailedGetMetrics, FailedRescale, ReloadTimeout, NoReadyPods, InvalidSpec) and one line. A
load that does not finish within the actuator's deadline ends the tick's wait with
ReloadTimeout; while it is in flight no other load goes to that pod, and each tick says so
(ReloadTimeout again; `load_in_flight` in the state and the status). Failed and timed-out
loads back off exponentially per autoscaler (`Backoff`, in the state, on the caller's clock).

A model whose spec names a budget (`spec.budget`) shares it with the other members: with a
`ledger` (tritonscale.control.ledger, one per driver) the tick claims its decision, cuts it to
what the budget grants (`policy.granted`: BudgetExhausted when it grants less), applies that
and settles what the pods then run.

Both drivers tick pod sets through these parts (tritonscale.control.set_tick: `tick_set`,
and `reconcile` for one autoscaler alone), which share one metrics read among a set's members.

Nothing here imports kopf; the clock is the `now` argument (unix seconds).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tritonscale.control.ledger import BudgetKey, Granted
from tritonscale.control.tick import (
    BACKOFF_BASE_S,
    BACKOFF_CAP_S,
    DRY_RUN,
    FAILED_GET_METRICS,
    FAILED_RESCALE,
    INVALID_SPEC,
    NO_READY_PODS,
    RELOAD_TIMEOUT,
    SUCCEEDED_RESCALE,
    Backoff,
    LatencyStatus,
    ReconcileState,
    TickError,
    TickResult,
    iso_time,
)
from tritonscale.core import policy, sizing
from tritonscale.core.allocator import Prediction
from tritonscale.core.budget import BUDGET_EXHAUSTED, Claim, Grant, Limits
from tritonscale.core.pipeline_model import Batching
from tritonscale.core.signals import MetricSnapshot, MetricsUnavailable
from tritonscale.core.spec import AutoscalerSpec, InvalidSpec
from tritonscale.metrics.source import MetricsSource
from tritonscale.triton.actuator import Actuator, PodResult, is_decoupled
from tritonscale.triton.endpoints import Endpoint
from tritonscale.triton.healing import CONDITION_TYPE as HEALTH_CONDITION
from tritonscale.triton.healing import NONE as NO_HEALING_ACTION
from tritonscale.triton.healing import POD_UNREACHABLE, Healer, HealingResult


def budget_key(namespace: str, spec: AutoscalerSpec) -> BudgetKey:
    """The ledger's key of the spec's budget: budgets are per namespace, as the objects are."""
    assert spec.budget is not None
    return (namespace, spec.budget.name)


def budget_limits(spec: AutoscalerSpec) -> Limits:
    """The pod's limits as this member's spec gives them."""
    assert spec.budget is not None
    return Limits(spec.budget.instances_per_pod, spec.budget.gpu_memory_per_pod_mib)


def model_of(spec: AutoscalerSpec | Mapping[str, Any]) -> str:
    """The model a spec names, even one that does not read ("?" where it names none)."""
    if isinstance(spec, AutoscalerSpec):
        return spec.model
    return str(spec.get("model") or "?") if isinstance(spec, Mapping) else "?"


@dataclass(frozen=True)
class _Tick:
    now: float
    state: ReconcileState
    started: float

    def conditions(
        self,
        able: policy.Condition,
        active: policy.Condition,
        limited: policy.Condition,
        health: policy.Condition | None = None,
    ) -> list[dict[str, Any]]:
        previous = {c.get("type"): c for c in self.state.conditions}
        result = []
        kinds = [("AbleToScale", able), ("ScalingActive", active), ("ScalingLimited", limited)]
        if health is not None:
            kinds.append((HEALTH_CONDITION, health))
        for kind, condition in kinds:
            status = "True" if condition.status else "False"
            before = previous.get(kind)
            since = (
                before.get("lastTransitionTime")
                if before is not None
                and before.get("status") == status
                and before.get("lastTransitionTime")
                else iso_time(self.now)
            )
            result.append(
                {
                    "type": kind,
                    "status": status,
                    "reason": condition.reason,
                    "message": condition.message,
                    "lastTransitionTime": since,
                }
            )
        return result

    def failed(
        self, model: str, reason: str, message: str, live: Mapping[str, int] | None = None
    ) -> TickResult:
        """A tick that ended before any decision (no pods, a bad spec)."""
        down = policy.Condition(False, reason, message)
        limited = policy.Condition(False, policy.DESIRED_WITHIN_RANGE, "no decision was made")
        conditions = self.conditions(down, down, limited)
        return TickResult(
            model=model,
            at=self.now,
            decision=None,
            current_instances=None,
            live_counts=dict(live or {}),
            child_instances={},
            applied=[],
            errors=[TickError(reason, message)],
            conditions=conditions,
            state=replace(self.state, conditions=tuple(conditions)),
            snapshot=None,
            notes=[],
            dry_run=False,
            duration_s=time.monotonic() - self.started,
            finished_at=time.time(),
        )


@dataclass(frozen=True)
class Plan:
    """A tick up to its decision: what `finish` needs to grant, apply and report it."""

    spec: AutoscalerSpec
    tick: _Tick
    endpoints: tuple[Endpoint, ...]
    live: dict[str, int]  # pod -> live count, the pods that answered
    current: int
    children: dict[str, int]
    snapshot: MetricSnapshot | None
    errors: tuple[TickError, ...]
    notes: tuple[str, ...]
    healing: tuple[HealingResult, ...]
    # The set planner's decision for this model (tritonscale.control.set_planner), made for
    # the whole set; None until the planner has decided.
    chosen: policy.Decision | None = None
    prediction: Prediction | None = None
    # The batching of the model and its children, from their live configs on the first pod
    # that answered (a model whose config could not be read is left out).
    batching: Mapping[str, Batching] = field(default_factory=dict, hash=False)

    def decide(self, grant: Grant | None = None) -> policy.Decision:
        """The set planner's decision, cut to what the budget grants."""
        if self.chosen is None:
            raise RuntimeError(f"{self.spec.model}: the set planner has not decided this plan")
        return policy.granted(self.spec.model, self.chosen, grant)

    @functools.cached_property
    def decision(self) -> policy.Decision:
        """The decision before any budget's grant: what this tick asks for."""
        return self.decide()

    def claim(self, member: str) -> Claim:
        """What this tick asks of its budget (tritonscale.core.budget)."""
        spec, decision = self.spec, self.decision
        signals = self.snapshot.model(spec.model) if self.snapshot is not None else None
        usable = signals is not None and sizing.unusable_field(signals) is None
        wanted = decision.recommended_instances
        if wanted is None:
            wanted = decision.desired_instances
        return Claim(
            member=member,
            model=spec.model,
            current=self.current,
            asked=decision.desired_instances,
            minimum=spec.min_instances,
            wanted=wanted,
            calls=spec.calls,
            queued=sizing.queued_requests(signals) if usable and signals is not None else 0.0,
            gpu_memory_mib=spec.budget.gpu_memory_per_instance_mib if spec.budget else 0,
            pod_full=decision.reason == policy.GPU_SATURATED,
            held_back=decision.scaling_limited.status
            and decision.scaling_limited.reason == BUDGET_EXHAUSTED,
        )


@dataclass(frozen=True)
class MetricsWanted:
    """What one member needs of the metrics source: its models over its window."""

    models: tuple[str, ...]  # the model and the models it calls
    window_s: float
    decoupled: frozenset[str]  # those of them whose live config is decoupled


async def read_snapshot(
    source: MetricsSource,
    pods: Sequence[Endpoint],
    wanted: Sequence[MetricsWanted],
    reuse_within_s: float = 0.0,
) -> MetricSnapshot | MetricsUnavailable:
    """One snapshot of every model `wanted` on `pods` (the longest window asked): a set's
    members share it. A pod read in the last `reuse_within_s` seconds (by this tick) is not
    read again. The source's failure is returned, not raised: each member reports it."""
    models = sorted({model for w in wanted for model in w.models})
    decoupled = {model for w in wanted for model in w.decoupled}
    window_s = max(w.window_s for w in wanted)
    try:
        return await source.snapshot(
            models, pods, window_s, decoupled=decoupled, reuse_within_s=reuse_within_s
        )
    except MetricsUnavailable as error:
        return error


@dataclass(frozen=True)
class Observation:
    """A tick up to the metrics: the pods' counts and health; what `planned` turns into a Plan
    once the snapshot is read."""

    spec: AutoscalerSpec
    tick: _Tick
    endpoints: tuple[Endpoint, ...]
    pods: tuple[Endpoint, ...]  # the pods that answered: the ones whose metrics are read
    live: dict[str, int]
    current: int
    children: dict[str, int]
    metrics: MetricsWanted
    notes: tuple[str, ...]
    healing: tuple[HealingResult, ...]
    batching: Mapping[str, Batching] = field(default_factory=dict, hash=False)

    def planned(self, snapshot: MetricSnapshot | MetricsUnavailable) -> Plan:
        errors: tuple[TickError, ...] = ()
        if isinstance(snapshot, MetricsUnavailable):
            errors, snapshot = (TickError(FAILED_GET_METRICS, str(snapshot)),), None
        return Plan(
            spec=self.spec,
            tick=self.tick,
            endpoints=self.endpoints,
            live=dict(self.live),
            current=self.current,
            children=dict(self.children),
            snapshot=snapshot,
            errors=errors,
            notes=self.notes,
            healing=self.healing,
            batching=self.batching,
        )


async def observe(
    spec: AutoscalerSpec | Mapping[str, Any],
    endpoints: Sequence[Endpoint],
    actuator: Actuator,
    state: ReconcileState,
    now: float,
    *,
    child_instances: Mapping[str, int] | None = None,
    healer: Healer | None = None,
) -> Observation | TickResult:
    """Heal, and read the live counts of the model and its children on the ready pods.

    Returns the finished (failed) TickResult when no decision can be made: an invalid spec,
    no ready pod, no pod that answers.
    """
    tick = _Tick(now=now, state=state, started=time.monotonic())
    if not isinstance(spec, AutoscalerSpec):
        try:
            spec = AutoscalerSpec.from_dict(spec)
        except InvalidSpec as error:
            return tick.failed(model_of(spec), INVALID_SPEC, str(error))
    if not endpoints:
        return tick.failed(spec.model, NO_READY_PODS, "no ready Triton pod matches the selector")
    # A pod that did not answer on an earlier tick is left out until it answers again
    # (tritonscale.triton.silent_pods): asking it would cost this tick one more timeout.
    silent = {e.name: why for e in endpoints if (why := actuator.silent_pods.reason(e))}
    asked = [e for e in endpoints if e.name not in silent]
    # Heal first: a model whose stub died serves nothing, and its metrics would mislead.
    healing = await _check_pods(healer, asked, spec.model, actuator) if healer else []
    # A pod the healer could not reach is not asked again in this tick: every further read
    # would wait out its timeout once more, and delay the decision for all pods.
    unreachable = {h.pod: h.message for h in healing if h.reason == POD_UNREACHABLE}
    reachable = [e for e in asked if e.name not in unreachable]
    configs, unreadable = await actuator.live_configs(reachable, spec.model)
    live = {pod: actuator.running(pod, spec.model, config) for pod, config in configs.items()}
    unreadable = {**unreachable, **unreadable}
    for endpoint in asked:
        if endpoint.name in unreadable:
            actuator.silent_pods.mark(endpoint, unreadable[endpoint.name])
    unreadable = {**silent, **unreadable}
    if not live:
        why = "; ".join(f"{pod}: {reason}" for pod, reason in unreadable.items())
        return tick.failed(spec.model, NO_READY_PODS, f"no ready pod serves {spec.model} ({why})")
    # The highest count is the one the policy last brought the pods to: a pod that restarted
    # with the repository's default (or missed a load) is brought back up to it. Taking the
    # lowest would read a restart as a scale-down already done, and shrink every other pod at
    # once, past the scale-down window and rate limits.
    current = max(live.values())
    notes = []
    if len(set(live.values())) > 1:
        counts = ", ".join(f"{pod}={count}" for pod, count in sorted(live.items()))
        notes.append(
            f"the pods disagree on {spec.model}'s count ({counts}); current is the highest"
        )
    for pod, reason in unreadable.items():
        notes.append(f"{pod} did not answer ({reason})")
    # The rest of the tick asks only the pods that answered: a hung pod would make every
    # read below wait out its timeout again, and delay this model's decision for all pods.
    answered = [e for e in endpoints if e.name in live]

    # Each model's live configs, read once: the counts, whether it is decoupled, how it
    # batches.
    configs_of = {spec.model: configs}
    for child in spec.calls:
        # Given the children's counts, only the first pod's configs are needed.
        asked_for = answered if child_instances is None else answered[:1]
        configs_of[child], _ = await actuator.live_configs(asked_for, child)
    if child_instances is None:
        child_instances = {
            child: min(
                actuator.running(pod, child, config) for pod, config in configs_of[child].items()
            )
            for child in spec.calls
            if configs_of[child]
        }

    return Observation(
        spec=spec,
        tick=tick,
        endpoints=tuple(endpoints),
        pods=tuple(answered),
        live=dict(live),
        current=current,
        children=dict(child_instances),
        metrics=MetricsWanted(
            models=(spec.model, *spec.calls),
            window_s=spec.metrics_window_seconds,
            decoupled=frozenset(_decoupled(configs_of, answered[0])),
        ),
        notes=tuple(notes),
        healing=tuple(healing),
        batching=_batching(configs_of, answered[0]),
    )


async def _check_pods(
    healer: Healer, endpoints: Sequence[Endpoint], model: str, actuator: Actuator
) -> list[HealingResult]:
    """The healer's check of `model` on every pod, the actuator's `parallel_pods` at a time
    (in the pods' order): one pod that does not answer costs one timeout, not a wait for the
    pods after it."""
    return await actuator.each(endpoints, lambda endpoint: healer.check(endpoint, model))


async def finish(
    planned: Plan,
    actuator: Actuator,
    granted: Granted | None = None,
    *,
    backoff_base_s: float = BACKOFF_BASE_S,
    backoff_cap_s: float = BACKOFF_CAP_S,
) -> TickResult:
    """The second half of a tick: the budget's grant, the loads, the conditions, the result."""
    spec, tick = planned.spec, planned.tick
    now, state = tick.now, tick.state
    errors, notes = list(planned.errors), list(planned.notes)
    live = dict(planned.live)
    decision = planned.decision
    if granted is not None:
        decision = planned.decide(granted.grant)
        if granted.budget.problem:
            notes.append(granted.budget.problem)
    active = decision.scaling_active
    if planned.snapshot is None:
        active = policy.Condition(False, FAILED_GET_METRICS, errors[0].message)

    desired = decision.desired_instances
    # A load that outlived its deadline on an earlier tick: nothing more goes to that pod
    # until Triton has answered it (a second load would only wait behind the first).
    in_flight = [load for e in planned.endpoints if (load := actuator.in_flight(e, spec.model))]
    in_flight_error = None
    if in_flight:
        in_flight_error = TickError(RELOAD_TIMEOUT, actuator.in_flight_reason(in_flight[0]))
    busy = {load.pod for load in in_flight}
    # Pods that did not answer are left out (reported in notes); with instanceKind set every
    # pod is visited, since the kind may differ where the count does not.
    pending = [
        e
        for e in planned.endpoints
        if e.name in live and e.name not in busy and (live[e.name] != desired or spec.instance_kind)
    ]
    applied: list[PodResult] = []
    backoff, load_error = state.backoff, None
    if pending and not spec.paused and not spec.dry_run:
        applied, backoff, load_error = await _apply(
            planned, actuator, pending, desired, backoff_base_s, backoff_cap_s
        )
    errors += [error for error in (in_flight_error, load_error) if error is not None]
    live = {**live, **{p.pod: p.after for p in applied if p.after is not None}}
    able = _able_to_scale(spec, decision, in_flight_error, load_error, applied)
    last_scale = now if applied and load_error is None else state.last_scale_time

    conditions = tick.conditions(able, active, decision.scaling_limited, _health(planned.healing))
    new_state = ReconcileState(
        policy=decision.state,
        backoff=backoff,
        last_scale_time=last_scale,
        conditions=tuple(conditions),
        load_in_flight=bool(in_flight) or any(p.pending for p in applied),
    )
    return TickResult(
        model=spec.model,
        at=now,
        decision=decision,
        current_instances=planned.current,
        live_counts=dict(live),
        child_instances=planned.children,
        applied=applied,
        errors=errors,
        conditions=conditions,
        state=new_state,
        snapshot=planned.snapshot,
        notes=notes,
        dry_run=spec.dry_run,
        duration_s=time.monotonic() - tick.started,
        finished_at=time.time(),
        healing=list(planned.healing),
        budget=granted.budget if granted is not None else None,
        prediction=planned.prediction,
        latency=_latency(spec, planned.snapshot, decision),
    )


def _latency(
    spec: AutoscalerSpec, snapshot: MetricSnapshot | None, decision: policy.Decision
) -> LatencyStatus | None:
    """status.latency where the spec sets an objective: the measured mean from the snapshot,
    the planner's prediction from the decision."""
    objective = spec.targets.latency
    if objective is None:
        return None
    measured = LatencyStatus.of(objective, snapshot.model(spec.model) if snapshot else None)
    predicted = decision.latency
    if predicted is None:
        return measured
    return replace(
        measured,
        predicted_ms=predicted.predicted_ms,
        rate_rps=predicted.rate_rps,
        met=predicted.met,
    )


async def _apply(
    planned: Plan,
    actuator: Actuator,
    pods: Sequence[Endpoint],
    desired: int,
    backoff_base_s: float,
    backoff_cap_s: float,
) -> tuple[list[PodResult], Backoff, TickError | None]:
    """Bring `pods` to `desired` unless the back-off holds: the pods' results, the back-off
    after them, and what stopped the loads (None when nothing did)."""
    spec, now, backoff = planned.spec, planned.tick.now, planned.tick.state.backoff
    if backoff.holds(now):
        wait = (backoff.retry_at or now) - now
        message = (
            f"backing off after {backoff.failures} failed load(s) of {spec.model}; "
            f"next try in {wait:.0f} s"
        )
        return [], backoff, TickError(FAILED_RESCALE, message)
    applied = await actuator.apply(pods, spec.model, desired, spec.instance_kind)
    failures = [p for p in applied if not p.ok]
    if not failures:
        return applied, Backoff(), None
    first = failures[0]
    if first.pending:
        load_error = TickError(RELOAD_TIMEOUT, first.reason)
    else:
        load_error = TickError(
            FAILED_RESCALE,
            f"the load of {spec.model} with {desired} instances failed on "
            f"{first.pod}: {first.reason}",
        )
    return applied, backoff.failed(now, backoff_base_s, backoff_cap_s), load_error


def _able_to_scale(
    spec: AutoscalerSpec,
    decision: policy.Decision,
    in_flight_error: TickError | None,
    load_error: TickError | None,
    applied: Sequence[PodResult],
) -> policy.Condition:
    """AbleToScale after the loads: what stopped this tick's loads, else what they did, else a
    dry run's change, else a load still in flight from an earlier tick, else the policy's."""
    if load_error is not None:
        return policy.Condition(False, load_error.reason, load_error.message)
    if applied:
        return policy.Condition(
            True,
            SUCCEEDED_RESCALE,
            f"set {spec.model} to {decision.desired_instances} instances on {len(applied)} pod(s)",
        )
    if spec.dry_run and not spec.paused and decision.changes:
        return policy.Condition(
            True, DRY_RUN, f"dryRun: {decision.desired_instances} instances decided, not applied"
        )
    if in_flight_error is not None:
        return policy.Condition(False, in_flight_error.reason, in_flight_error.message)
    return decision.able_to_scale


def _decoupled(configs_of: Mapping[str, Mapping[str, Any]], first: Endpoint) -> set[str]:
    """The models whose live config on the first pod that answered is decoupled; their
    signals differ. A config that could not be read counts as not decoupled: Triton's own
    counters then size the model, as they do for every other."""
    return {
        model
        for model, configs in configs_of.items()
        if first.name in configs and is_decoupled(configs[first.name])
    }


def _batching(configs_of: Mapping[str, Mapping[str, Any]], first: Endpoint) -> dict[str, Batching]:
    """How each model batches, from its live config on the first pod that answered (the set
    planner's pipeline model); a config that could not be read, or not told, is left out: the
    model is then taken at the batch it runs today."""
    found = {
        model: Batching.of_config(configs[first.name])
        for model, configs in configs_of.items()
        if first.name in configs
    }
    return {model: batching for model, batching in found.items() if batching is not None}


def _health(healing: Sequence[HealingResult]) -> policy.Condition | None:
    """ModelHealthy over the pods: the first pod that is not healthy speaks for all."""
    if not healing:
        return None
    sick = next((result for result in healing if not result.healthy), None)
    if sick is not None:
        return policy.Condition(False, sick.reason, sick.message)
    healed = next((r for r in healing if r.action != NO_HEALING_ACTION), healing[0])
    return policy.Condition(True, healed.reason, healed.message)
