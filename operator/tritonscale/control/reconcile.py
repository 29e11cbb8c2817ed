"""One control tick, shared by the Kubernetes driver and the local driver (`tritonscale tune`).

    state = ReconcileState.from_status(obj_status)        # or ReconcileState() locally
    result = reconcile(spec, endpoints, source, actuator, state, now=time.time(),
                       metrics=metrics, namespace="ns", autoscaler="pipeline-async")
    patch.status.update(result.status())                  # kopf; tune prints result.line()
    state = result.state                                  # pass it to the next tick

A tick: read the live counts on the ready pods (the highest is `current`, so that a restarted
or lagging pod converges to what the others serve; disagreements are reported), read the children's counts (`spec.calls`), take a metrics snapshot, ask
`policy.decide`, then, unless paused, dry-running or backing off, bring every pod whose
count differs from the decision to it (`Actuator.apply`: the first pod alone, then the others
in parallel). Errors are results, not exceptions: `TickResult.errors` holds each with its
HPA-style reason (FailedGetMetrics, FailedRescale, ReloadTimeout, NoReadyPods, InvalidSpec)
and one line. A load that does not finish within the actuator's deadline ends the tick's
wait with ReloadTimeout; while it is in flight no other load goes to that pod, and each tick
says so (ReloadTimeout again). Failed and timed-out loads back off exponentially per
autoscaler (`Backoff`, in the state, on the caller's clock).

Nothing here imports kopf; the clock is the `now` argument (unix seconds).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tritonscale.control.operator_metrics import OperatorMetrics
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
    ReconcileState,
    TickError,
    TickResult,
    iso_time,
)
from tritonscale.core import policy
from tritonscale.core.signals import MetricSnapshot, MetricsUnavailable
from tritonscale.core.spec import AutoscalerSpec, InvalidSpec
from tritonscale.metrics.source import MetricsSource
from tritonscale.triton.actuator import ActuationError, Actuator, PodResult, is_decoupled
from tritonscale.triton.endpoints import Endpoint
from tritonscale.triton.healing import CONDITION_TYPE as HEALTH_CONDITION
from tritonscale.triton.healing import NONE as NO_HEALING_ACTION
from tritonscale.triton.healing import Healer, HealingResult


def reconcile(
    spec: AutoscalerSpec | Mapping[str, Any],
    endpoints: Sequence[Endpoint],
    source: MetricsSource,
    actuator: Actuator,
    state: ReconcileState,
    now: float,
    *,
    child_instances: Mapping[str, int] | None = None,
    metrics: OperatorMetrics | None = None,
    namespace: str = "local",
    autoscaler: str | None = None,
    backoff_base_s: float = BACKOFF_BASE_S,
    backoff_cap_s: float = BACKOFF_CAP_S,
    healer: Healer | None = None,
) -> TickResult:
    """Run one control tick for one autoscaler; never raises for Triton's or Prometheus's troubles.

    `spec` may be the raw CR spec (a mapping): an invalid one gives an InvalidSpec result.
    `endpoints` are the ready pods. `child_instances=None` reads the children's live counts
    from the pods. `metrics` (optional) records the tick under (namespace, autoscaler, model);
    `autoscaler` defaults to the model's name. With a `healer`, the model is first checked on
    every pod and reloaded where its stub died or hangs (tritonscale.triton.healing); the results
    and a ModelHealthy condition are part of the tick.
    """
    started = time.monotonic()
    tick = _Tick(now=now, state=state, started=started)
    if not isinstance(spec, AutoscalerSpec):
        try:
            spec = AutoscalerSpec.from_dict(spec)
        except InvalidSpec as error:
            model = spec.get("model") if isinstance(spec, Mapping) else None
            result = tick.failed(str(model or "?"), INVALID_SPEC, str(error))
            return _recorded(result, metrics, namespace, autoscaler)
    result = _run(
        spec,
        endpoints,
        source,
        actuator,
        tick,
        child_instances,
        backoff_base_s,
        backoff_cap_s,
        healer,
    )
    return _recorded(result, metrics, namespace, autoscaler)


def _recorded(
    result: TickResult, metrics: OperatorMetrics | None, namespace: str, autoscaler: str | None
) -> TickResult:
    if metrics is not None:
        metrics.record(result, namespace, autoscaler or result.model)
    return result


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


def _run(
    spec: AutoscalerSpec,
    endpoints: Sequence[Endpoint],
    source: MetricsSource,
    actuator: Actuator,
    tick: _Tick,
    child_instances: Mapping[str, int] | None,
    backoff_base_s: float,
    backoff_cap_s: float,
    healer: Healer | None,
) -> TickResult:
    now, state = tick.now, tick.state
    if not endpoints:
        return tick.failed(spec.model, NO_READY_PODS, "no ready Triton pod matches the selector")
    # Heal first: a model whose stub died serves nothing, and its metrics would mislead.
    healing = [healer.check(endpoint, spec.model) for endpoint in endpoints] if healer else []
    live, unreadable = actuator.live_counts(endpoints, spec.model)
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

    if child_instances is None:
        child_instances = {}
        for child in spec.calls:
            counts, _ = actuator.live_counts(endpoints, child)
            if counts:
                child_instances[child] = min(counts.values())
    children = dict(child_instances)

    errors: list[TickError] = []
    snapshot: MetricSnapshot | None = None
    models = [spec.model, *spec.calls]
    answering = next(e for e in endpoints if e.name in live)
    try:
        snapshot = source.snapshot(
            models,
            endpoints,
            spec.metrics_window_seconds,
            decoupled=_decoupled(actuator, answering, models),
        )
    except MetricsUnavailable as error:
        errors.append(TickError(FAILED_GET_METRICS, str(error)))

    decision = policy.decide(spec, current, snapshot, state.policy, now, children)
    able, active = decision.able_to_scale, decision.scaling_active
    if snapshot is None:
        active = policy.Condition(False, FAILED_GET_METRICS, errors[0].message)

    applied: list[PodResult] = []
    backoff, last_scale = state.backoff, state.last_scale_time
    desired = decision.desired_instances
    # A load that outlived its deadline on an earlier tick: nothing more goes to that pod
    # until Triton has answered it (a second load would only wait behind the first).
    in_flight = [load for e in endpoints if (load := actuator.in_flight(e, spec.model))]
    if in_flight:
        message = actuator.in_flight_reason(in_flight[0])
        errors.append(TickError(RELOAD_TIMEOUT, message))
        able = policy.Condition(False, RELOAD_TIMEOUT, message)
    busy = {load.pod for load in in_flight}
    # Pods that did not answer are left out (reported in notes); with instanceKind set every
    # pod is visited, since the kind may differ where the count does not.
    pending = [
        e
        for e in endpoints
        if e.name in live and e.name not in busy and (live[e.name] != desired or spec.instance_kind)
    ]
    if spec.paused:
        pass
    elif spec.dry_run:
        if decision.changes:
            able = policy.Condition(
                True, DRY_RUN, f"dryRun: {desired} instances decided, not applied"
            )
    elif pending:
        if backoff.holds(now):
            wait = (backoff.retry_at or now) - now
            message = (
                f"backing off after {backoff.failures} failed load(s) of {spec.model}; "
                f"next try in {wait:.0f} s"
            )
            errors.append(TickError(FAILED_RESCALE, message))
            able = policy.Condition(False, FAILED_RESCALE, message)
        else:
            applied = actuator.apply(pending, spec.model, desired, spec.instance_kind)
            failures = [p for p in applied if not p.ok]
            if failures:
                backoff = backoff.failed(now, backoff_base_s, backoff_cap_s)
                first = failures[0]
                if first.pending:
                    reason, message = RELOAD_TIMEOUT, first.reason
                else:
                    reason = FAILED_RESCALE
                    message = (
                        f"the load of {spec.model} with {desired} instances failed on "
                        f"{first.pod}: {first.reason}"
                    )
                errors.append(TickError(reason, message))
                able = policy.Condition(False, reason, message)
            else:
                backoff = Backoff()
                if applied:
                    last_scale = now
                    live = {**live, **{p.pod: p.after for p in applied if p.after is not None}}
                    able = policy.Condition(
                        True,
                        SUCCEEDED_RESCALE,
                        f"set {spec.model} to {desired} instances on {len(applied)} pod(s)",
                    )

    conditions = tick.conditions(able, active, decision.scaling_limited, _health(healing))
    new_state = ReconcileState(
        policy=decision.state,
        backoff=backoff,
        last_scale_time=last_scale,
        conditions=tuple(conditions),
    )
    return TickResult(
        model=spec.model,
        at=now,
        decision=decision,
        current_instances=current,
        live_counts=dict(live),
        child_instances=children,
        applied=applied,
        errors=errors,
        conditions=conditions,
        state=new_state,
        snapshot=snapshot,
        notes=notes,
        dry_run=spec.dry_run,
        duration_s=time.monotonic() - tick.started,
        finished_at=time.time(),
        healing=healing,
    )


def _decoupled(actuator: Actuator, endpoint: Endpoint, models: Sequence[str]) -> set[str]:
    """The models whose live config on `endpoint` is decoupled; their signals differ.

    A config that cannot be read counts as not decoupled: Triton's own counters then size
    the model, as they do for every other.
    """
    found = set()
    for model in models:
        try:
            if is_decoupled(actuator.live_config(endpoint, model)):
                found.add(model)
        except ActuationError:
            continue
    return found


def _health(healing: Sequence[HealingResult]) -> policy.Condition | None:
    """ModelHealthy over the pods: the first pod that is not healthy speaks for all."""
    if not healing:
        return None
    sick = next((result for result in healing if not result.healthy), None)
    if sick is not None:
        return policy.Condition(False, sick.reason, sick.message)
    healed = next((r for r in healing if r.action != NO_HEALING_ACTION), healing[0])
    return policy.Condition(True, healed.reason, healed.message)
