"""How many instances the load asks for: the replica calculator of the policy.

Each signal gives its own count with the HPA's arithmetic, `ceil(current * ratio)`, where
`ratio` is the observed value over its target, and keeps the current count when
`|1 - ratio| <= tolerance`. The largest count wins and names the reason.

The signals, per instance of one pod (rates are summed over the pods, so each divides by
`pods_reporting * instances`):

- busy per instance: compute seconds per second, corrected for batching (below). The one
  signal that is proportional to the load on both sides of the target, so the one that
  sizes a scale-down;
- queue/compute ratio: translated as `(1 + ratio) / (1 + target)`, the time a request spends
  in the model (queue + compute) over the time it would spend at the target. It only ever
  asks for more: a short queue says there is room, not how much, so below its band it has
  no say (were it to vote `ceil(current / (1 + target))`, it would decide how fast an idle
  model shrinks). A model with a dynamic-batching delay queues on purpose: give it a target
  above delay / compute time. It has no say either while the instances are mostly idle (busy
  per instance below `QUEUE_SIGNAL_MIN_BUSY` of the utilization target): a queue in front of
  idle instances is batching delay or a burst, not a lack of instances (measured on the demo:
  branch_embed at busy 0.09 queued 0.7 x its compute time, the queue signal added an
  instance, low utilization took it back 30 s later, again and again). For the same reason
  it never asks for a count at which the instances would be that idle, nor for one where
  they would be within the scale-down margin of it (busy per instance below
  `QUEUE_SIGNAL_MIN_BUSY * target / (1 - SCALE_DOWN_MARGIN)`): at such a count the next window
  that reads a little low would silence it, and the busy signal would take the instances
  back. Conversely, while it is silent but above its band, a scale-down stops at the most
  instances at which it would speak again (it would ask to come back);
- pending requests per instance.

Hysteresis. Up, a signal sizes to its target, as the HPA does. Down, it sizes to a count at
which its projected value (the same load over fewer instances) is at most
`target * (1 - SCALE_DOWN_MARGIN)`, not at the target: a scale-down to exactly the target is
undone by the next window that reads a little high (the HPA leaves that to its 300 s
stabilization window; short windows need the margin). A signal that only asks for more (the
queue ratio) blocks a scale-down while it is not clearly below its target either. The
arithmetic: a load whose windows vary by less than +-m/(2-m) (+-11 % for m = 0.2) around its
mean never reverses the count; with the tolerance alone (m = 0) any variation beyond the
tolerance can.

Decoupled models (docs/instancegroupautoscaler.md, "Signals", has the measurements). One whose
`execute` holds each stream until its final response (square_int32) is timed by Triton like
any model: its compute time is the stream's life, and the signals above hold. One whose
`async def execute` returns at once is not: Triton counts its request done, and its compute
time over, when the stream begins, so busy per instance reads near zero whatever the load.
Such a model exports the streams it holds open (`ModelSignals.streams_in_flight`), and for
it one signal sizes both ways: streams in flight (plus requests still queued) per instance,
against the pending-per-instance target; busy per instance and the queue ratio are shown
but have no say.

Batching: Triton adds a batch's whole compute time to each request in it, so with batches of
four the compute counters run four times faster than the instance is busy. Multiplying by
executions per request (1 / the mean batch) gives the instance's busy fraction back. Where
the source reports no executions, no correction is made.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tritonscale.core.signals import ModelSignals
from tritonscale.core.spec import Targets

# The queue signal speaks only when busy per instance is at least this share of its target.
QUEUE_SIGNAL_MIN_BUSY = 0.5
# A scale-down goes to a count whose projected signal is at most target * (1 - this).
SCALE_DOWN_MARGIN = 0.2

HIGH_UTILIZATION = "HighUtilization"
HIGH_QUEUE_TIME = "HighQueueTime"
HIGH_PENDING = "HighPending"
HIGH_STREAMS_IN_FLIGHT = "HighStreamsInFlight"
LOW_UTILIZATION = "LowUtilization"
WITHIN_TOLERANCE = "WithinTolerance"

_SIGNAL_FIELDS = (
    "request_rate",
    "failure_rate",
    "execution_rate",
    "compute_seconds_per_second",
    "queue_seconds_per_second",
    "pending_requests",
)


@dataclass(frozen=True)
class Need:
    """What one signal asks for."""

    signal: str  # how a person reads it: "busy per instance"
    reason: str  # the reason when this signal wins a scale-up
    value: float  # the observed value, in the target's units
    target: float
    ratio: float  # > 1: more instances wanted
    instances: int | None  # the count this signal alone asks for; None: no say

    def describe(self) -> str:
        return f"{self.signal} {self.value:.2f} (target {self.target:.2f})"


def unusable_field(signals: ModelSignals) -> str | None:
    """The first counter that is not a finite, non-negative number, or None when all are."""
    for name in _SIGNAL_FIELDS:
        value = getattr(signals, name)
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            return f"{name} is {value!r}"
    streams = signals.streams_in_flight
    if streams is not None and (
        not isinstance(streams, (int, float)) or not math.isfinite(streams) or streams < 0
    ):
        return f"streams_in_flight is {streams!r}"
    if signals.pods_reporting < 1:
        return f"pods_reporting is {signals.pods_reporting}"
    return None


def sized_by_streams(signals: ModelSignals) -> bool:
    """True for a decoupled model that reports its own streams: Triton's timings miss them."""
    return signals.decoupled and signals.streams_in_flight is not None


def busy_per_instance(signals: ModelSignals, instances: int) -> float:
    """Fraction of the time one instance spends executing (0..1 for a non-decoupled model)."""
    compute = signals.compute_seconds_per_second
    if signals.execution_rate > 0 and signals.request_rate > 0:
        compute *= min(1.0, signals.execution_rate / signals.request_rate)
    return compute / (signals.pods_reporting * instances)


def pending_per_instance(signals: ModelSignals, instances: int) -> float:
    return signals.pending_requests / (signals.pods_reporting * instances)


def streams_per_instance(signals: ModelSignals, instances: int) -> float:
    """Requests a decoupled model holds (streaming, or queued for it) per instance."""
    streams = signals.streams_in_flight or 0.0
    return (streams + signals.pending_requests) / (signals.pods_reporting * instances)


def queued_requests(signals: ModelSignals) -> float:
    """Requests waiting for an instance, summed over the pods: the window's mean (queue seconds
    per second, by Little's law) or the pending gauge now, whichever is larger. A model sized
    by its streams counts the streams it holds, since they occupy its instances."""
    if sized_by_streams(signals):
        return (signals.streams_in_flight or 0.0) + signals.pending_requests
    return max(signals.queue_seconds_per_second, signals.pending_requests)


def needs(
    signals: ModelSignals,
    instances: int,
    targets: Targets,
    tolerance: float,
    scale_down_margin: float = SCALE_DOWN_MARGIN,
) -> list[Need]:
    """One need per signal that has a value (the queue ratio has none when nothing ran).

    `scale_down_margin`: see SCALE_DOWN_MARGIN; 0 is the HPA's rule (down to the target itself).
    """
    if instances < 1:
        raise ValueError(f"instances must be >= 1 to size a model, got {instances}")
    by_streams = sized_by_streams(signals)
    busy = busy_per_instance(signals, instances)
    result = [
        _need(
            "busy per instance",
            HIGH_UTILIZATION,
            busy,
            targets.utilization,
            busy / targets.utilization,
            instances,
            tolerance,
            scale_down_margin,
            has_say=not by_streams,
        ),
    ]
    queue_ratio = signals.queue_compute_ratio
    if queue_ratio is not None:
        target = targets.queue_compute_ratio
        speaks_from = QUEUE_SIGNAL_MIN_BUSY * targets.utilization
        # The most instances at which busy per instance would still give the queue a say...
        busiest = math.floor(round(busy * instances / speaks_from, 9))
        # ...and the most it asks for: where it keeps its say with the scale-down margin to
        # spare, so that a window that reads busy a little low does not silence it there (the
        # busy signal would then take the instances back: up from one signal, down from the
        # other, again and again).
        keeps_say = math.floor(round(busy * instances * (1 - scale_down_margin) / speaks_from, 9))
        has_say = busy >= speaks_from
        need = _need(
            "queue/compute ratio",
            HIGH_QUEUE_TIME,
            queue_ratio,
            target,
            (1 + queue_ratio) / (1 + target),
            instances,
            tolerance,
            scale_down_margin,
            only_up=True,
            has_say=not by_streams and has_say,
            ceiling=keeps_say,
        )
        if not by_streams and not has_say and need.ratio > 1 + tolerance and busiest >= 1:
            # Silent here, it would speak, and ask for more, at `busiest` instances or fewer:
            # a scale-down stops there, or it would come straight back.
            need = replace(need, instances=busiest)
        result.append(need)
    if by_streams:
        streams = streams_per_instance(signals, instances)
        result.append(
            _need(
                "streams in flight per instance",
                HIGH_STREAMS_IN_FLIGHT,
                streams,
                targets.pending_per_instance,
                streams / targets.pending_per_instance,
                instances,
                tolerance,
                scale_down_margin,
            )
        )
        return result
    pending = pending_per_instance(signals, instances)
    result.append(
        _need(
            "pending per instance",
            HIGH_PENDING,
            pending,
            targets.pending_per_instance,
            pending / targets.pending_per_instance,
            instances,
            tolerance,
            scale_down_margin,
        )
    )
    return result


def _need(
    signal: str,
    reason: str,
    value: float,
    target: float,
    ratio: float,
    instances: int,
    tolerance: float,
    scale_down_margin: float,
    only_up: bool = False,
    has_say: bool = True,
    ceiling: int | None = None,
) -> Need:
    count: int | None
    below = 1.0 - scale_down_margin
    if not has_say:
        count = None
    elif round(abs(1.0 - ratio), 9) <= tolerance:  # 2.31 / 3 / 0.7 is 1.1000000000000003
        count = instances
    elif only_up and ratio < 1:
        # Not clearly below its target, it holds the count; clearly below, it has no say.
        count = instances if ratio > below else None
    elif ratio < 1:
        # The fewest instances at which the same load reads at most target * (1 - margin);
        # never more than now (a signal below its target does not ask for more).
        count = min(instances, math.ceil(round(instances * ratio / below, 9)))
    else:
        # The ratio is rounded first so that float noise (3 * 1.1 = 3.3000000000000003) does
        # not add an instance the exact arithmetic would not.
        count = math.ceil(round(instances * ratio, 9))
        if ceiling is not None:
            count = max(instances, min(count, ceiling))
    return Need(signal, reason, value, target, ratio, count)


def recommend(all_needs: list[Need], current_instances: int) -> tuple[int, str, Need]:
    """The largest need wins (ties go to the earlier signal); returns (count, reason, winner)."""
    voting = [need for need in all_needs if need.instances is not None]
    winner = max(voting, key=lambda need: need.instances or 0)  # max keeps the first of equals
    assert winner.instances is not None
    if winner.instances > current_instances:
        return winner.instances, winner.reason, winner
    if winner.instances < current_instances:
        return winner.instances, LOW_UTILIZATION, winner
    return current_instances, WITHIN_TOLERANCE, winner


def saturation(
    signals: ModelSignals, instances: int, targets: Targets, tolerance: float
) -> Need | None:
    """The need that shows a (called) model saturated: busy, queueing or (a decoupled model
    that reports its streams) streaming beyond its tolerance."""
    worst = None
    for need in needs(signals, instances, targets, tolerance):
        if need.reason == HIGH_PENDING or need.ratio <= 1 + tolerance:
            continue
        if sized_by_streams(signals) and need.reason != HIGH_STREAMS_IN_FLIGHT:
            continue  # Triton's timings of such a model measure the hand-off, not the load
        if worst is None or need.ratio > worst.ratio:
            worst = need
    return worst
