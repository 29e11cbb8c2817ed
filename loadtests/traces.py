"""A production-shaped arrival trace, seeded: requests per second, second by second.

    trace = production_trace(seconds=600, peak_rps=300.0, seed=1)
    trace.rates[t]          # the mean arrival rate of second t (arrivals within it: Poisson)

Used by the trace benchmark (loadtests.bench.trace) against the real server and by the
pipeline simulator's trace arms (loadtests.sim.trace_arms), so that both replay the same day.

The shape. No public trace ships as a package here, so the trace is generated to the shape
that published production traces of inference services share, with magnitudes that are this
module's parameters, not fitted values:

- **A diurnal cycle dominates the rate** (Azure Functions, Shahrad et al., "Serverless in the
  Wild", USENIX ATC 2020: invocations follow a daily and weekly cycle; the Azure LLM inference
  traces of 2023 and 2024, Patel et al., "Splitwise", ISCA 2024 and Stojkovic et al.,
  "DynamoLLM", HPCA 2025, show the same daily cycle in requests per second). Here one day is
  compressed into the trace: it starts at the night's trough, peaks halfway, and falls back,
  a raised cosine with `DIURNAL_SWING` (5) between trough and peak.
- **Short bursts ride on it** (BurstGPT, Wang et al. 2024, on Azure OpenAI service traces:
  arrivals come in bursts well above the local rate; Serverless in the Wild: bursty
  invocations within the minute). Here `BURSTS_PER_MINUTE` bursts a minute, one at a random
  time in each slot of the trace, each `BURST_SECONDS` (10 to 30 s) long at `BURST_FACTOR` (2 to 3) times the rate
  under it. A burst never lifts the rate above the day's peak: the peak, and a static
  configuration sized for it, stay the diurnal one.
- **A slow ramp**: the traffic grows over the trace by `RAMP` (a service whose users grow
  from one day to the next), so the evening is busier than the morning.

Within a second, arrivals are Poisson at the second's rate (the load generator's, not this
module's). Everything is a pure function of the arguments: the same seed gives the same trace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

DIURNAL_SWING = 5.0  # the peak's rate over the trough's
BURSTS_PER_MINUTE = 0.6
BURST_SECONDS = (10, 30)
BURST_FACTOR = (2.0, 3.0)
RAMP = 0.25  # the last second's diurnal rate is this much above the first's, at the same phase


@dataclass(frozen=True)
class Burst:
    start_s: int
    seconds: int
    factor: float


@dataclass(frozen=True)
class Trace:
    """Requests per second for each second of the trace, and how it was made."""

    rates: tuple[float, ...]
    bursts: tuple[Burst, ...]
    peak_rps: float
    seed: int

    @property
    def seconds(self) -> int:
        return len(self.rates)

    @property
    def trough_rps(self) -> float:
        return min(self.rates)

    def requests(self) -> float:
        """The requests the trace offers, on average."""
        return float(sum(self.rates))

    def to_dict(self) -> dict[str, object]:
        return {
            "seconds": self.seconds,
            "seed": self.seed,
            "peak_rps": round(self.peak_rps, 2),
            "trough_rps": round(self.trough_rps, 2),
            "mean_rps": round(self.requests() / self.seconds, 2),
            "diurnal_swing": DIURNAL_SWING,
            "ramp": RAMP,
            "bursts": [
                {"start_s": b.start_s, "seconds": b.seconds, "factor": round(b.factor, 2)}
                for b in self.bursts
            ],
            "rates": [round(rate, 2) for rate in self.rates],
        }


def diurnal(seconds: int) -> list[float]:
    """The day without bursts, its peak 1: a raised cosine from the trough (1 / DIURNAL_SWING)
    up to 1 at the middle and back, times a linear ramp; scaled so that its highest second is 1."""
    trough = 1.0 / DIURNAL_SWING
    day = []
    for t in range(seconds):
        phase = t / max(seconds - 1, 1)
        cycle = trough + (1.0 - trough) * (1.0 - math.cos(2.0 * math.pi * phase)) / 2.0
        day.append(cycle * (1.0 + RAMP * phase))
    top = max(day)
    return [rate / top for rate in day]


def bursts(seconds: int, rng: np.random.Generator) -> list[Burst]:
    """One burst in each slot of 60 / BURSTS_PER_MINUTE seconds, at a random time within it,
    of a random length and factor; a burst that would run past the end is cut there.

    Slots rather than Poisson times: with six bursts in ten minutes, Poisson times put one
    burst in some seeds' whole day and six into others', and a benchmark's trace should be
    representative whatever its seed."""
    slot_s = 60.0 / BURSTS_PER_MINUTE
    found: list[Burst] = []
    for index in range(max(1, round(seconds / slot_s))):
        length = int(rng.integers(BURST_SECONDS[0], BURST_SECONDS[1] + 1))
        factor = float(rng.uniform(*BURST_FACTOR))
        begin = index * slot_s
        start = int(begin + rng.uniform(0.0, max(slot_s - length, 1.0)))
        earliest = found[-1].start_s + found[-1].seconds if found else 0
        start = max(start, earliest)
        if start < seconds:
            found.append(Burst(start, min(length, seconds - start), factor))
    return found


def production_trace(seconds: int, peak_rps: float, seed: int = 1) -> Trace:
    """A day of `seconds` whose busiest second asks for `peak_rps` (see the module's docstring)."""
    if seconds < 1 or peak_rps <= 0:
        raise ValueError(f"a trace needs seconds >= 1 and peak_rps > 0, got {seconds}, {peak_rps}")
    rng = np.random.default_rng(seed)
    day = diurnal(seconds)
    rates = list(day)
    found = bursts(seconds, rng)
    for burst in found:
        for t in range(burst.start_s, burst.start_s + burst.seconds):
            # Never above the day's peak (1 here): the peak stays the diurnal one.
            rates[t] = max(rates[t], min(1.0, day[t] * burst.factor))
    return Trace(tuple(rate * peak_rps for rate in rates), tuple(found), peak_rps, seed)
