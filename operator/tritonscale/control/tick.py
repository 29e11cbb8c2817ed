"""What a control tick produces and carries to the next one: results, errors, back-off, state.

A tick (tritonscale.control.set_tick) makes a `TickResult`; the drivers write its `status()` to the custom
resource (kopf) or print its `line()` (tune); `OperatorMetrics.record` exports it. The state
(`ReconcileState`) is what one autoscaler carries from tick to tick.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from tritonscale.control.ledger import BudgetStatus
from tritonscale.core import policy
from tritonscale.core.allocator import Prediction
from tritonscale.core.behavior import PolicyState
from tritonscale.core.signals import MetricSnapshot, ModelSignals
from tritonscale.core.spec import LatencyObjective
from tritonscale.triton.actuator import PodResult
from tritonscale.triton.healing import HealingResult

FAILED_GET_METRICS = "FailedGetMetrics"
FAILED_RESCALE = "FailedRescale"
# A load did not finish within its deadline (or one sent earlier is still in flight).
RELOAD_TIMEOUT = "ReloadTimeout"
NO_READY_PODS = "NoReadyPods"
INVALID_SPEC = "InvalidSpec"
DRY_RUN = "DryRun"
SUCCEEDED_RESCALE = "SucceededRescale"

BACKOFF_BASE_S = 10.0
BACKOFF_CAP_S = 300.0


@dataclass(frozen=True)
class TickError:
    reason: str  # FailedGetMetrics, FailedRescale, ReloadTimeout, NoReadyPods, InvalidSpec
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
    # A load of the model was still in flight when the last tick ended (past the actuator's
    # deadline): the policy keeps the increase's gain check until the new count is live.
    load_in_flight: bool = False

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
            last_scale_time=parse_iso_time(last) if isinstance(last, str) else None,
            conditions=tuple(c for c in status.get("conditions") or () if isinstance(c, Mapping)),
            load_in_flight=status.get("loadInFlight") is True,
        )


@dataclass(frozen=True)
class LatencyStatus:
    """status.latency: a root's latency objective (spec.targets.latency) beside what was
    measured and what the planner predicts at the counts it chose (tritonscale.core.latency)."""

    objective: LatencyObjective
    # Triton's duration counters give means, not quantiles: the mean time a request of this
    # model spent queued and computing over the metrics window (for a BLS root, its calls
    # included, since a parent computes while its children run); None without requests.
    measured_mean_ms: float | None
    # The objective's quantile as the planner predicts it at the counts it chose
    # (tritonscale.core.latency); None where it was not sized to it this tick, or where the
    # split cannot serve the rate (then `met` is False).
    predicted_ms: float | None = None
    rate_rps: float | None = None  # the rate it predicts at: the offered one with headroom
    met: bool | None = None  # whether the prediction meets the objective; None: not sized

    @classmethod
    def of(cls, objective: LatencyObjective, signals: ModelSignals | None) -> LatencyStatus:
        return cls(objective, mean_latency_ms(signals))

    @property
    def unmet(self) -> bool:
        """The planner found no split within the budget that meets the objective."""
        return self.met is False

    def to_dict(self) -> dict[str, Any]:
        measured = {}
        if self.measured_mean_ms is not None:
            measured["meanMilliseconds"] = round(self.measured_mean_ms, 1)
        status: dict[str, Any] = {
            "quantile": self.objective.quantile,
            "objectiveMilliseconds": self.objective.milliseconds,
            "measured": measured,
        }
        predicted: dict[str, Any] = {}
        if self.predicted_ms is not None:
            predicted["quantileMilliseconds"] = round(self.predicted_ms, 1)
        if self.rate_rps is not None:
            predicted["atRps"] = round(self.rate_rps, 1)
        if self.met is not None:
            predicted["met"] = self.met
        if predicted:
            status["predicted"] = predicted
        return status


def mean_latency_ms(signals: ModelSignals | None) -> float | None:
    """Milliseconds a request spent queued and computing, on average over the window."""
    if signals is None:
        return None
    requests = signals.request_rate + signals.failure_rate
    if requests <= 0:
        return None
    return (
        1000.0 * (signals.queue_seconds_per_second + signals.compute_seconds_per_second) / requests
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
    # The budget the model shares (spec.budget) as this tick's grant left it.
    budget: BudgetStatus | None = None
    # What the set's planner predicted its counts serve (tritonscale.core.planner); None when
    # the model was decided on its own, or nothing was allocated this tick.
    prediction: Prediction | None = None
    # The latency objective against the measurement; None where spec.targets.latency is unset.
    latency: LatencyStatus | None = None

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
    def holding(self) -> int:
        """The instances the pods run after this tick (the highest count), for the budget."""
        counts = [count for count in self.live_counts.values() if count is not None]
        return max(counts, default=self.current_instances or 0)

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
            "time": iso_time(self.at),
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
            "budget": self.budget.to_dict() if self.budget is not None else None,
            "prediction": _prediction(self.prediction),
            **({"latency": self.latency.to_dict()} if self.latency is not None else {}),
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
            "loadInFlight": self.state.load_in_flight,
        }
        if self.state.last_scale_time is not None:
            status["lastScaleTime"] = iso_time(self.state.last_scale_time)
        if decision is not None:
            status["lastDecision"] = {
                "direction": decision.direction,
                "reason": self.reason,
                "message": self.message,
            }
            status["observedMetrics"] = dict(decision.observed)
        if self.budget is not None:
            status["budget"] = self.budget.to_dict()
        if self.prediction is not None:
            status["prediction"] = _prediction(self.prediction)
        if self.latency is not None:
            status["latency"] = self.latency.to_dict()
        return status


def _prediction(prediction: Prediction | None) -> dict[str, Any] | None:
    """The set planner's prediction for people: requests per second to one decimal."""
    if prediction is None:
        return None
    return {
        "expectedRps": round(prediction.expected_rps, 1),
        "offeredRps": round(prediction.offered_rps, 1),
        "capacityRps": round(prediction.capacity_rps, 1),
        "bottleneck": prediction.bottleneck,
        "stageCapacityRps": {
            model: round(rps, 1) for model, rps in sorted(prediction.stage_capacity_rps.items())
        },
    }


def iso_time(t: float) -> str:
    """Unix seconds as Kubernetes writes times (RFC 3339, UTC, whole seconds)."""
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso_time(text: str) -> float | None:
    try:
        return (
            datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
        )
    except ValueError:
        return None
