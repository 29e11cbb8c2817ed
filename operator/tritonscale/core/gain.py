"""Did an increase help? The policy's check of each scale-up, and the NoGain hold.

Adding instances helps only while instances are the limit. When one resource all instances
share is (a GPU, a lock, the CPU cores), more instances leave throughput and latency where
they were, and each new instance only waits, busy in Triton's eyes. The busy signal then
asks for ever more. So the policy checks each increase:

- when it decides one, it keeps a `Sample` of the model's signals at the count it had
  (the baseline), in a `GainCheck`;
- on the first tick whose metrics window lies wholly after that tick (plus `SETTLE_S` for
  the load to land), with the count still above the baseline's, it compares:
  the increase helped when throughput (successful requests per second) rose by at least
  `MIN_GAIN`, or the time a request spends in the model (queue + compute) fell by at least
  `MIN_GAIN`, or the new instances took work over from the old ones (busy instances grew
  by less than half of what the added ones would add if they only waited);
- an increase that bought nothing is reverted once, to the baseline count, and the model is
  held there (`NoGainHold`) until its request rate moves by more than `RELEASE_CHANGE`
  from the rate at the verdict, or its count leaves the held one.

Later increases made while a check is pending are judged with it, against the same baseline.
Decoupled models sized by their streams are not checked: Triton's timings miss their streams.
Pure: the policy passes the clock and stores the state in PolicyState.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tritonscale.core import sizing
from tritonscale.core.signals import MetricSnapshot, ModelSignals

NO_GAIN = "NoGain"

MIN_GAIN = 0.1  # a rise of throughput, or fall of time per request, of 10 % is a gain
RELEASE_CHANGE = 0.25  # the hold ends when the request rate moves by more than 25 %
SETTLE_S = 2.0  # a load takes up to about 1.5 s to apply; the window starts after it


@dataclass(frozen=True)
class Sample:
    """What an increase is judged by, at one count."""

    instances: int
    pods: int
    request_rate: float  # successful requests per second, all pods
    seconds_per_request: float  # queue + compute time of one request
    busy_instances: float  # compute seconds per second, batching undone, all pods

    def to_dict(self) -> dict[str, Any]:
        return {
            "instances": self.instances,
            "pods": self.pods,
            "requestRate": self.request_rate,
            "secondsPerRequest": self.seconds_per_request,
            "busyInstances": self.busy_instances,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Sample:
        return cls(
            int(d["instances"]),
            int(d["pods"]),
            float(d["requestRate"]),
            float(d["secondsPerRequest"]),
            float(d["busyInstances"]),
        )


@dataclass(frozen=True)
class GainCheck:
    """An increase waiting for its verdict."""

    since: float  # unix seconds of the tick that decided the first increase
    before: Sample

    def to_dict(self) -> dict[str, Any]:
        return {"since": self.since, "before": self.before.to_dict()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GainCheck:
        return cls(float(d["since"]), Sample.from_dict(d["before"]))


@dataclass(frozen=True)
class NoGainHold:
    """The count an increase was reverted to, and the request rate that holds it there."""

    instances: int
    request_rate: float
    since: float

    def to_dict(self) -> dict[str, Any]:
        return {"instances": self.instances, "requestRate": self.request_rate, "since": self.since}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> NoGainHold:
        return cls(int(d["instances"]), float(d["requestRate"]), float(d["since"]))


@dataclass(frozen=True)
class Verdict:
    gained: bool
    message: str  # the numbers, before -> after


def sample(signals: ModelSignals, instances: int) -> Sample | None:
    """The model's sample at `instances`; None when it cannot be judged (idle, streaming)."""
    if sizing.sized_by_streams(signals) or signals.request_rate <= 0:
        return None
    seconds = signals.queue_seconds_per_second + signals.compute_seconds_per_second
    busy = sizing.busy_per_instance(signals, instances) * signals.pods_reporting * instances
    return Sample(
        instances=instances,
        pods=signals.pods_reporting,
        request_rate=signals.request_rate,
        seconds_per_request=seconds / signals.request_rate,
        busy_instances=busy,
    )


def due(check: GainCheck, snapshot: MetricSnapshot) -> bool:
    """True once the snapshot's window lies wholly after the increase (and its settling)."""
    return snapshot.taken_at - snapshot.window_s >= check.since + SETTLE_S


def judge(check: GainCheck, after: Sample | None) -> Verdict:
    """Compare the window after the increase with the baseline; no sample after is no gain
    to see, but also no evidence of waste, so it counts as a gain (the safe side)."""
    before = check.before
    if after is None or after.pods != before.pods:
        return Verdict(True, "the load or the pods changed: nothing to compare")
    added = after.instances - before.instances
    # Rounded so that float noise (100 * 1.1 = 110.00000000000001) does not move an edge.
    throughput = round(after.request_rate, 9) >= round(before.request_rate * (1 + MIN_GAIN), 9)
    latency = round(after.seconds_per_request, 9) <= round(
        before.seconds_per_request * (1 - MIN_GAIN), 9
    )
    # Waiting instances add their whole time to the busy total; working ones share the load.
    if_waiting = before.busy_instances * (1 + added / before.instances)
    took_over = after.busy_instances < (before.busy_instances + if_waiting) / 2
    message = (
        f"{before.instances} -> {after.instances} instances: throughput "
        f"{before.request_rate:.1f} -> {after.request_rate:.1f} req/s, time per request "
        f"{1000 * before.seconds_per_request:.1f} -> {1000 * after.seconds_per_request:.1f} ms, "
        f"busy instances {before.busy_instances:.2f} -> {after.busy_instances:.2f}"
    )
    return Verdict(throughput or latency or took_over, message)


def released(hold: NoGainHold, signals: ModelSignals, current: int) -> bool:
    """The hold ends when the count left it or the request rate moved beyond RELEASE_CHANGE."""
    if current != hold.instances:
        return True
    return abs(signals.request_rate - hold.request_rate) > RELEASE_CHANGE * max(
        hold.request_rate, 1e-9
    )
