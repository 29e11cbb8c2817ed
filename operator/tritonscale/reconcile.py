"""One control tick, shared by the Kubernetes driver and the local driver (`tritonscale tune`).

    state = ReconcileState.from_status(obj_status)        # or ReconcileState() locally
    result = reconcile(spec, endpoints, source, actuator, state, now=time.time(),
                       metrics=metrics, namespace="ns", autoscaler="pipeline-async")
    patch.status.update(result.status())                  # kopf; tune prints result.line()
    state = result.state                                  # pass it to the next tick

A tick: read the live counts on the ready pods (the highest is `current`, so that a restarted
or lagging pod converges to what the others serve; disagreements are reported), read the children's counts (`spec.calls`), take a metrics snapshot, ask
`policy.decide`, then, unless paused, dry-running or backing off, bring every pod whose
count differs from the decision to it (`Actuator.apply`, one pod at a time). Errors are
results, not exceptions: `TickResult.errors` holds each with its HPA-style reason
(FailedGetMetrics, FailedRescale, NoReadyPods, InvalidSpec) and one line. Failed loads back
off exponentially per autoscaler (`Backoff`, in the state, on the caller's clock).

Nothing here imports kopf; the clock is the `now` argument (unix seconds).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from tritonscale import policy
from tritonscale.actuator import Actuator, PodResult
from tritonscale.behavior import PolicyState
from tritonscale.endpoints import Endpoint
from tritonscale.healing import CONDITION_TYPE as HEALTH_CONDITION
from tritonscale.healing import NONE as NO_HEALING_ACTION
from tritonscale.healing import Healer, HealingResult
from tritonscale.operator_metrics import OperatorMetrics
from tritonscale.signals import MetricSnapshot, MetricsUnavailable
from tritonscale.sources import MetricsSource
from tritonscale.spec import AutoscalerSpec, InvalidSpec

FAILED_GET_METRICS = "FailedGetMetrics"
FAILED_RESCALE = "FailedRescale"
NO_READY_PODS = "NoReadyPods"
INVALID_SPEC = "InvalidSpec"
DRY_RUN = "DryRun"
SUCCEEDED_RESCALE = "SucceededRescale"

BACKOFF_BASE_S = 10.0
BACKOFF_CAP_S = 300.0


@dataclass(frozen=True)
class TickError:
    reason: str  # FailedGetMetrics, FailedRescale, NoReadyPods, InvalidSpec
    message: str  # one line


@dataclass(frozen=True)
class Backoff:
    """Failed loads in a row, and when the next load may be tried (unix seconds)."""

    failures: int = 0
    retry_at: float | None = None

    def failed(self, now: float, base_s: float, cap_s: float) -> Backoff:
        failures = self.failures + 1
        return Backoff(failures, now + min(cap_s, base_s * 2 ** (failures - 1)))

    def holds(self, now: float) -> bool:
        return self.retry_at is not None and now < self.retry_at

    def to_dict(self) -> dict[str, Any]:
        return {"failures": self.failures, "retryAt": self.retry_at}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> Backoff:
        if not d:
            return cls()
        try:
            retry_at = d.get("retryAt")
            return cls(int(d.get("failures", 0)), None if retry_at is None else float(retry_at))
        except (TypeError, ValueError, AttributeError):
            return cls()


@dataclass(frozen=True)
class ReconcileState:
    """What one autoscaler carries from tick to tick (the kopf driver keeps it in status)."""

    policy: PolicyState = field(default_factory=PolicyState)
    backoff: Backoff = field(default_factory=Backoff)
    last_scale_time: float | None = None  # unix seconds of the last successful load
    conditions: tuple[Mapping[str, Any], ...] = ()  # the last conditions, for transition times

    @classmethod
    def from_status(cls, status: Mapping[str, Any] | None) -> ReconcileState:
        """Read back what `TickResult.status()` wrote; anything malformed starts afresh."""
        status = status or {}
        try:
            policy_state = PolicyState.from_dict(status.get("policyState"))
        except ValueError:
            policy_state = PolicyState()
        last = status.get("lastScaleTime")
        return cls(
            policy=policy_state,
            backoff=Backoff.from_dict(status.get("backoff")),
            last_scale_time=_parse_time(last) if isinstance(last, str) else None,
            conditions=tuple(c for c in status.get("conditions") or () if isinstance(c, Mapping)),
        )


@dataclass(frozen=True)
class TickResult:
    model: str
    at: float  # the tick's `now`
    decision: policy.Decision | None  # None when no decision could be made (errors say why)
    current_instances: int | None  # the highest live count; None without a ready pod
    live_counts: dict[str, int]  # pod -> live count
    child_instances: dict[str, int]  # child model -> lowest live count
    applied: list[PodResult]  # loads sent this tick (empty when none were needed or allowed)
    errors: list[TickError]
    # type, status ("True"/"False"), reason, message, lastTransitionTime
    conditions: list[dict[str, Any]]
    state: ReconcileState  # pass to the next tick
    snapshot: MetricSnapshot | None
    notes: list[str]  # warnings that are not errors (pods disagreeing on the count)
    dry_run: bool
    duration_s: float
    finished_at: float  # unix seconds (wall clock) when the tick ended
    # One healing check per pod (when the driver passed a Healer), the quiet ones included.
    healing: list[HealingResult] = field(default_factory=list)

    @property
    def healing_actions(self) -> list[HealingResult]:
        """The checks worth an event: a reload, a failed or held-back one, a sick model."""
        return [result for result in self.healing if result.event_type is not None]

    @property
    def desired_instances(self) -> int | None:
        return self.decision.desired_instances if self.decision else None

    @property
    def reason(self) -> str:
        """The tick's reason: its first error's, else DryRun for an unapplied change, else the decision's."""
        if self.errors:
            return self.errors[0].reason
        if self.decision is None:
            return NO_READY_PODS
        if self.dry_run and self.decision.changes:
            return DRY_RUN
        return self.decision.reason

    @property
    def message(self) -> str:
        parts = []
        if self.decision is not None:
            parts.append(self.decision.message)
        parts += [error.message for error in self.errors]
        parts += [result.message for result in self.healing_actions]
        parts += self.notes
        return "; ".join(parts)

    @property
    def applied_ok(self) -> bool:
        return bool(self.applied) and all(pod.ok for pod in self.applied)

    def line(self) -> str:
        """One line for a person: time, model, current -> desired, reason, message."""
        stamp = datetime.fromtimestamp(self.at, timezone.utc).strftime("%H:%M:%S")
        current = "?" if self.current_instances is None else str(self.current_instances)
        desired = "?" if self.desired_instances is None else str(self.desired_instances)
        return f"{stamp} {self.model} {current} -> {desired} {self.reason}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        """The decision-log record (JSON-ready)."""
        decision = self.decision
        model_signals = self.snapshot.model(self.model) if self.snapshot else None
        return {
            "time": _iso(self.at),
            "t": self.at,
            "model": self.model,
            "current": self.current_instances,
            "desired": self.desired_instances,
            "recommended": decision.recommended_instances if decision else None,
            "direction": decision.direction if decision else "none",
            "reason": self.reason,
            "decisionReason": decision.reason if decision else None,
            "message": self.message,
            "observed": dict(decision.observed) if decision else {},
            "requestRate": model_signals.request_rate if model_signals else None,
            "live": dict(self.live_counts),
            "children": dict(self.child_instances),
            "applied": [
                {
                    "pod": p.pod,
                    "before": p.before,
                    "after": p.after,
                    "ok": p.ok,
                    "reason": p.reason,
                    "seconds": round(p.seconds, 3),
                }
                for p in self.applied
            ],
            "errors": [{"reason": e.reason, "message": e.message} for e in self.errors],
            "healing": [result.to_dict() for result in self.healing_actions],
            "dryRun": self.dry_run,
            "durationSeconds": round(self.duration_s, 4),
        }

    def status(self) -> dict[str, Any]:
        """The CR's status fields this tick sets (the driver adds observedGeneration)."""
        decision = self.decision
        status: dict[str, Any] = {
            "currentInstances": self.current_instances,
            "desiredInstances": self.desired_instances,
            "pods": len(self.live_counts),
            "conditions": self.conditions,
            "policyState": self.state.policy.to_dict(),
            "backoff": self.state.backoff.to_dict(),
        }
        if self.state.last_scale_time is not None:
            status["lastScaleTime"] = _iso(self.state.last_scale_time)
        if decision is not None:
            status["lastDecision"] = {
                "direction": decision.direction,
                "reason": self.reason,
                "message": self.message,
            }
            status["observedMetrics"] = dict(decision.observed)
        return status


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
    every pod and reloaded where its stub died or hangs (tritonscale.healing); the results
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
                else _iso(self.now)
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
    try:
        snapshot = source.snapshot(
            [spec.model, *spec.calls], endpoints, spec.metrics_window_seconds
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
    # Pods that did not answer are left out (reported in notes); with instanceKind set every
    # pod is visited, since the kind may differ where the count does not.
    pending = [
        e for e in endpoints if e.name in live and (live[e.name] != desired or spec.instance_kind)
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
                message = (
                    f"the load of {spec.model} with {desired} instances failed on {failures[0].pod}: "
                    f"{failures[0].reason}"
                )
                errors.append(TickError(FAILED_RESCALE, message))
                able = policy.Condition(False, FAILED_RESCALE, message)
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


def _health(healing: Sequence[HealingResult]) -> policy.Condition | None:
    """ModelHealthy over the pods: the first pod that is not healthy speaks for all."""
    if not healing:
        return None
    sick = next((result for result in healing if not result.healthy), None)
    if sick is not None:
        return policy.Condition(False, sick.reason, sick.message)
    healed = next((r for r in healing if r.action != NO_HEALING_ACTION), healing[0])
    return policy.Condition(True, healed.reason, healed.message)


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(text: str) -> float | None:
    try:
        return (
            datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
        )
    except ValueError:
        return None
