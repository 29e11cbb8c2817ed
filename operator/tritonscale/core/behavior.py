"""Scale up fast, down slowly: HPA's `behavior` (stabilization windows, rate policies).

The functions follow Kubernetes' HorizontalController (`stabilizeRecommendationWithBehaviors`,
`convertDesiredReplicasWithBehaviorRate`, `calculateScale{Up,Down}LimitWithBehaviors`), with
the clock passed in and the history held in an immutable `PolicyState` that the driver
stores (in the CR's status) and hands back on the next tick.

One difference from the HPA: scale events are not reported by the driver after it applied
a change; they are inferred from the live counts the policy sees tick after tick. A dry run,
a failed load or a pod that restarted with the repository's default count are therefore
accounted for without the driver's help.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from tritonscale.core.spec import AutoscalerSpec, ScalingRules

SCALE_UP_LIMIT = "ScaleUpLimit"
SCALE_DOWN_LIMIT = "ScaleDownLimit"
SCALE_UP_STABILIZED = "ScaleUpStabilized"
SCALE_DOWN_STABILIZED = "ScaleDownStabilized"
TOO_FEW_INSTANCES = "TooFewInstances"
TOO_MANY_INSTANCES = "TooManyInstances"

# Ticks are due a whole interval apart, but each runs a little after it is due, by a varying
# amount (0 to 114 ms in one scale-down benchmark on a busy machine). A window or period that
# ends at a tick was then over at that tick or not, by chance, and a step waited one interval
# more: a 60 s period had run 59.886 s at the fourth 15 s tick after its step. So a window
# counts as over at a tick that comes less than this fraction of an interval before its end.
TICK_JITTER_FRACTION = 0.1


@dataclass(frozen=True)
class Recommendation:
    at: float  # unix seconds
    instances: int


@dataclass(frozen=True)
class ScaleEvent:
    at: float  # unix seconds
    change: int  # instances added (> 0) or removed (< 0)


@dataclass(frozen=True)
class PolicyState:
    """What the policy remembers between ticks; pruned to the longest window it needs."""

    recommendations: tuple[Recommendation, ...] = ()
    scale_events: tuple[ScaleEvent, ...] = ()
    last_instances: int | None = None  # the live count seen on the last tick
    last_desired: int | None = None  # the count decided on the last tick
    last_tick_at: float | None = None

    def observe(self, current_instances: int, now: float, spec: AutoscalerSpec) -> PolicyState:
        """Record the change in the live count since the last tick as a scale event.

        A change to the count this policy asked for is dated to the tick that asked for it
        (the driver applies right after deciding); any other change is dated now.
        """
        events = self.scale_events
        if self.last_instances is not None and current_instances != self.last_instances:
            ours = current_instances == self.last_desired and self.last_tick_at is not None
            at = self.last_tick_at if ours else now
            events = (*events, ScaleEvent(at, current_instances - self.last_instances))
        keep_s = max(
            spec.behavior.scale_up.longest_period_seconds,
            spec.behavior.scale_down.longest_period_seconds,
        )
        events = tuple(e for e in events if e.at > now - keep_s)
        return replace(self, scale_events=events)

    def recommend(self, instances: int, now: float, spec: AutoscalerSpec) -> PolicyState:
        """Add this tick's recommendation; keep one entry per count, the newest.

        Only the newest entry of a given count can matter for a min or max over a window
        that ends now, so the history never holds more than max - min + 1 entries.
        """
        keep_s = max(
            spec.behavior.scale_up.stabilization_window_seconds,
            spec.behavior.scale_down.stabilization_window_seconds,
        )
        kept = tuple(
            r for r in self.recommendations if r.instances != instances and r.at > now - keep_s
        )
        return replace(self, recommendations=(*kept, Recommendation(now, instances)))

    def seeded(self, current_instances: int, now: float, spec: AutoscalerSpec) -> PolicyState:
        """A fresh history starts with the current count, as the HPA's does.

        Without it a restarted operator, or one back from a long metrics outage, could scale
        down at once, without the scale-down window's caution.
        """
        window = spec.behavior.scale_down.stabilization_window_seconds
        if self.recommendations or window <= 0:
            return self
        return replace(self, recommendations=(Recommendation(now, current_instances),))

    def ticked(self, current_instances: int, desired_instances: int, now: float) -> PolicyState:
        return replace(
            self, last_instances=current_instances, last_desired=desired_instances, last_tick_at=now
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-friendly form for the CR's status (`status.policyState`)."""
        return {
            "recommendations": [
                {"at": r.at, "instances": r.instances} for r in self.recommendations
            ],
            "scaleEvents": [{"at": e.at, "change": e.change} for e in self.scale_events],
            "lastInstances": self.last_instances,
            "lastDesired": self.last_desired,
            "lastTickAt": self.last_tick_at,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> PolicyState:
        """Read `to_dict()`'s form back; None or {} is a fresh state.

        Raises ValueError on a malformed dict: a driver may then start afresh with
        `PolicyState()`, which is safe (a fresh history holds scale-downs back).
        """
        if not d:
            return cls()
        try:
            return cls(
                recommendations=tuple(
                    Recommendation(float(r["at"]), int(r["instances"]))
                    for r in d.get("recommendations", [])
                ),
                scale_events=tuple(
                    ScaleEvent(float(e["at"]), int(e["change"])) for e in d.get("scaleEvents", [])
                ),
                last_instances=_optional(d.get("lastInstances"), int),
                last_desired=_optional(d.get("lastDesired"), int),
                last_tick_at=_optional(d.get("lastTickAt"), float),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise ValueError(f"malformed policy state: {error!r}") from None


def _optional(value: Any, kind: Any) -> Any:
    return None if value is None else kind(value)


def tick_slack_s(spec: AutoscalerSpec) -> float:
    """How much before its end a window counts as over (TICK_JITTER_FRACTION of a tick)."""
    return TICK_JITTER_FRACTION * spec.interval_seconds


def stabilize(
    spec: AutoscalerSpec,
    history: tuple[Recommendation, ...],
    current_instances: int,
    recommended: int,
    now: float,
) -> tuple[int, str | None]:
    """HPA's stabilization: up to the lowest, down to the highest recommendation in its window.

    `history` holds the earlier ticks' recommendations (not this one's). Returns the
    stabilized count and ScaleUpStabilized / ScaleDownStabilized when it differs from
    `recommended`, else None.
    """
    slack_s = tick_slack_s(spec)
    up_cutoff = now - spec.behavior.scale_up.stabilization_window_seconds + slack_s
    down_cutoff = now - spec.behavior.scale_down.stabilization_window_seconds + slack_s
    lowest = highest = recommended
    for past in history:
        if past.at > up_cutoff:
            lowest = min(lowest, past.instances)
        if past.at > down_cutoff:
            highest = max(highest, past.instances)
    stabilized = min(max(current_instances, lowest), highest)
    if stabilized == recommended:
        return stabilized, None
    reason = SCALE_UP_STABILIZED if recommended >= current_instances else SCALE_DOWN_STABILIZED
    return stabilized, reason


def limit_rate(
    spec: AutoscalerSpec,
    events: tuple[ScaleEvent, ...],
    current_instances: int,
    desired: int,
    now: float,
) -> tuple[int, str | None]:
    """HPA's `convertDesiredReplicasWithBehaviorRate`, less its min/max clamp: the rate policies.

    The policy clamps the count to [min, max] once, before stabilizing it
    (tritonscale.core.policy), and stabilization only moves it towards the current count,
    within them too: a clamp here could never change it. Returns the allowed count and
    ScaleUpLimit / ScaleDownLimit when it differs from `desired`, else None.
    """
    slack_s = tick_slack_s(spec)
    if desired > current_instances:
        up_rules = spec.behavior.scale_up
        up_limit = scale_up_limit(up_rules, events, current_instances, now, slack_s)
        ceiling = max(up_limit, current_instances)
        if desired > ceiling:
            return ceiling, SCALE_UP_LIMIT
    elif desired < current_instances:
        down_rules = spec.behavior.scale_down
        down_limit = scale_down_limit(down_rules, events, current_instances, now, slack_s)
        floor = min(down_limit, current_instances)
        if desired < floor:
            return floor, SCALE_DOWN_LIMIT
    return desired, None


def scale_up_limit(
    rules: ScalingRules,
    events: tuple[ScaleEvent, ...],
    current_instances: int,
    now: float,
    slack_s: float = 0.0,
) -> int:
    """The most instances the scale-up policies allow now.

    Each policy counts from the size at the start of its period (the current count less what
    was added, plus what was removed, within it); Max takes the most generous policy, Min the
    strictest. Percent rounds up, so that a small count can still grow; integer arithmetic
    keeps 10 * 110% at 11 (HPA's floats make it 12).
    """
    if rules.select_policy == "Disabled":
        return current_instances
    proposals = []
    for policy in rules.policies:
        start = _period_start(events, current_instances, policy.period_seconds, now, slack_s)
        if policy.type == "Instances":
            proposals.append(start + policy.value)
        else:
            proposals.append(-(-start * (100 + policy.value) // 100))
    return max(proposals) if rules.select_policy == "Max" else min(proposals)


def scale_down_limit(
    rules: ScalingRules,
    events: tuple[ScaleEvent, ...],
    current_instances: int,
    now: float,
    slack_s: float = 0.0,
) -> int:
    """The fewest instances the scale-down policies allow now (Percent rounds down)."""
    if rules.select_policy == "Disabled":
        return current_instances
    proposals = []
    for policy in rules.policies:
        start = _period_start(events, current_instances, policy.period_seconds, now, slack_s)
        if policy.type == "Instances":
            proposals.append(start - policy.value)
        else:
            proposals.append(start * (100 - policy.value) // 100)
    # Max selects the biggest change, which for a scale-down is the lowest count.
    return min(proposals) if rules.select_policy == "Max" else max(proposals)


def _period_start(
    events: tuple[ScaleEvent, ...],
    current_instances: int,
    period_seconds: int,
    now: float,
    slack_s: float,
) -> int:
    cutoff = now - period_seconds + slack_s
    changed = sum(e.change for e in events if e.at > cutoff)
    return current_instances - changed
