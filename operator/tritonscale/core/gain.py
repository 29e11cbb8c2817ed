"""Did an increase help? The policy's check of each scale-up, and the NoGain hold.

Adding instances helps only while instances are the limit. When one resource all instances
share is (a GPU, a lock, the CPU cores), more instances leave throughput and latency where
they were, and each new instance only waits, busy in Triton's eyes. The busy signal then
asks for ever more. So the policy checks each increase:

- when it decides one, it keeps a `Sample` of the model's signals at the count it had
  (the baseline), in a `GainCheck`;
- on the first tick whose metrics window lies wholly after that tick (plus `SETTLE_S` for
  the load to land), with the count still above the baseline's, it compares. With a bar of
  half the capacity the increase added (k more on n: k / 2n, at least `MIN_GAIN`), the
  increase helped when throughput (successful requests per second) rose by the bar, or the
  time a request spends in the model (queue + compute) fell by it (divided by 1 + bar), or
  the instances' busy time per request (batching undone) rose by less than the bar: the new
  instances did work. Instances that wait on a shared resource are busy without serving:
  their busy time per request grows with their count, and neither throughput nor latency
  moves;
- an increase that bought nothing is reverted once, to the baseline count, and the model is
  held there (`NoGainHold`) until its request rate, in a window wholly after the revert, moves
  by more than `RELEASE_CHANGE` from the baseline's (the throughput at that count), or its
  count leaves the held one.

Later increases made while a check is pending are judged with it, against the same baseline.
An increase whose load outlives the actuator's deadline keeps its check while the load is in
flight (the driver tells the policy so: `decide`'s `load_in_flight`); the tick that sees the
new count live restarts the check's clock, so the window it is judged by lies wholly after the
load.
Decoupled models sized by their streams are not checked: Triton's timings miss their streams.
Pure: the policy passes the clock and stores the state in PolicyState.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from tritonscale.core import sizing
from tritonscale.core.signals import MetricSnapshot, ModelSignals

NO_GAIN = "NoGain"

# The least change that counts, whatever the increase: above what a window's noise makes of a
# steady load (windows within +-11 % of their mean, as the scale-down margin tolerates, make
# ratios up to 1.25). An increase too small to move its signals by more is kept: a waiting
# instance cannot be told from noise there, and a false verdict would revert a useful one.
MIN_GAIN = 0.25
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

    @property
    def busy_per_request(self) -> float:
        """Seconds an instance is busy per request served (batching undone)."""
        return self.busy_instances / self.request_rate

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

    since: float  # unix seconds of the tick that decided the first increase, or saw it land
    before: Sample

    def landed(self, now: float) -> GainCheck:
        """The check of a load seen live at `now`: its window starts after `now`."""
        return replace(self, since=now)

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
    # What the added instances could bring, as a share of what was there: a real gain is a
    # good part of it. Half of it is the bar (at least MIN_GAIN, a window's noise), far below
    # what 1 -> 3 brings.
    bar = max(MIN_GAIN, (after.instances - before.instances) / before.instances / 2)
    # Rounded so that float noise (100 * 1.1 = 110.00000000000001) does not move an edge.
    throughput = round(after.request_rate, 9) >= round(before.request_rate * (1 + bar), 9)
    latency = round(after.seconds_per_request * (1 + bar), 9) <= round(
        before.seconds_per_request, 9
    )
    # Instances that wait on a shared resource stay busy without serving more: the busy time
    # per request grows with their count. Working ones keep it where it was.
    worked = round(after.busy_per_request, 9) < round(before.busy_per_request * (1 + bar), 9)
    message = (
        f"{before.instances} -> {after.instances} instances: throughput "
        f"{before.request_rate:.1f} -> {after.request_rate:.1f} req/s, time per request "
        f"{1000 * before.seconds_per_request:.1f} -> {1000 * after.seconds_per_request:.1f} ms, "
        f"busy time per request {1000 * before.busy_per_request:.1f} -> "
        f"{1000 * after.busy_per_request:.1f} ms"
    )
    return Verdict(throughput or latency or worked, message)


def released(
    hold: NoGainHold, signals: ModelSignals, current: int, snapshot: MetricSnapshot
) -> bool:
    """The hold ends when the count left it, or when the request rate of a window wholly after
    the revert moved beyond RELEASE_CHANGE (a window over the revert itself reads the reload)."""
    if current != hold.instances:
        return True
    if snapshot.taken_at - snapshot.window_s < hold.since + SETTLE_S:
        return False
    return abs(signals.request_rate - hold.request_rate) > RELEASE_CHANGE * max(
        hold.request_rate, 1e-9
    )
