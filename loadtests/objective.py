"""A day judged against a latency objective: what the trace benchmark (loadtests.bench.trace,
on the real server) and the simulator's trace arms (loadtests.sim.trace_arms, in virtual
time) both compute, so that their numbers mean the same.

- **The objective** is p95 (`QUANTILE`) within `OBJECTIVE_MARGIN` (2) x the p95 that the
  budget's best split shows under open arrivals at the trace's peak, rounded up to
  `OBJECTIVE_STEP_MS` (5 ms): what the largest configuration meets with a margin, and a small
  one does not (`objective_ms`).
- **Attainment** (`attainment`): requests bucketed by when they were due; a `WINDOW_S` (10 s)
  window meets the objective when its p95 does, a request failed, dropped or never answered
  counting as slower than any (`quantile_with_misses`); `requests_met_share` is the share
  answered within the objective.
- **Cost**: `instance_seconds`, the live total count integrated over the day; goodput is the
  requests within the objective per instance-second (`arm_metrics`).
- **The sweep** (`sweep_levels`): at `levels` rates from the peak down (the peak x k /
  levels), the fewest-instance split that meets the objective, trying for each total the
  splits that serve most first; a split that meets a level is taken to meet the lower ones.
  How a split is measured at a rate is the caller's (`Measure`): the real server's open load,
  or a simulation.
- **The limit** (`limit_arm`): each second on the fewest instances that meet the objective at
  the sweep's level for its rate (the lowest level at or above it), summed: what perfect
  foresight of the trace would pay. Its shares are the sweep's measurements at those levels.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from loadtests.traces import Trace

QUANTILE = 0.95
OBJECTIVE_MARGIN = 2.0
OBJECTIVE_STEP_MS = 5.0
WINDOW_S = 10
ARM_KEYS = (
    "windows_met_share",
    "requests_met_share",
    "instance_seconds",
    "goodput_per_instance_second",
)

# counts, rate -> {"meets": bool, "met_share": float | None, "p95_ms": float | None, ...}
Measure = Callable[[dict[str, int], float], dict[str, Any]]


def objective_ms(p95_ms: float) -> float:
    """The objective from the best split's p95 at the peak (see the module's docstring)."""
    return OBJECTIVE_STEP_MS * math.ceil(OBJECTIVE_MARGIN * p95_ms / OBJECTIVE_STEP_MS)


def quantile_with_misses(latencies: Sequence[float], total: int, q: float) -> float | None:
    """The q-quantile of `total` requests of which `latencies` (seconds) were answered in
    time to count and the rest never were (infinite); None when nothing was due."""
    if total <= 0:
        return None
    ordered = sorted(latencies)
    index = min(total - 1, math.ceil(q * total) - 1)
    return ordered[index] if index < len(ordered) else math.inf


@dataclass(frozen=True)
class Attainment:
    """How the requests due in a span fared against the objective."""

    due: int
    met: int  # answered successfully within the objective
    windows: int
    windows_met: int
    per_second: list[dict[str, Any]]  # t (s from the start), offered, p95_ms


def attainment(
    due: Sequence[float],
    answered: Sequence[tuple[float, float | None]],
    start: float,
    seconds: int,
    objective_s: float,
) -> Attainment:
    """Requests bucketed by when they were due: per second (for the plot) and per WINDOW_S
    window (whether its p95, misses counted, meets the objective)."""
    ok_by_second: list[list[float]] = [[] for _ in range(seconds)]
    due_by_second = [0] * seconds
    for when in due:
        index = int(when - start)
        if 0 <= index < seconds:
            due_by_second[index] += 1
    for when, latency in answered:
        index = int(when - start)
        if 0 <= index < seconds and latency is not None:
            ok_by_second[index].append(latency)
    met = sum(1 for second in ok_by_second for latency in second if latency <= objective_s)
    windows = windows_met = 0
    for first in range(0, seconds - WINDOW_S + 1, WINDOW_S):
        span = range(first, first + WINDOW_S)
        total = sum(due_by_second[i] for i in span)
        if total == 0:
            continue
        windows += 1
        latencies = [latency for i in span for latency in ok_by_second[i]]
        if quantile_with_misses(latencies, total, QUANTILE) <= objective_s:
            windows_met += 1
    per_second = []
    for index in range(seconds):
        p95 = quantile_with_misses(ok_by_second[index], due_by_second[index], QUANTILE)
        shown = None if p95 is None or math.isinf(p95) else round(1000 * p95, 1)
        per_second.append({"t": index, "offered": due_by_second[index], "p95_ms": shown})
    return Attainment(sum(due_by_second), met, windows, windows_met, per_second)


def instance_seconds(samples: Sequence[tuple[float, int]], start: float, end: float) -> float:
    """The integral of the total count over [start, end), each sample holding until the next."""
    total = 0.0
    for (at, count), (after, _) in itertools.pairwise([*samples, (end, 0)]):
        left, right = max(at, start), min(after, end)
        if right > left:
            total += count * (right - left)
    return total


def arm_metrics(attained: Attainment, spent: float) -> dict[str, float | None]:
    """An arm's four numbers (ARM_KEYS) from its attainment and its instance-seconds."""
    return {
        "windows_met_share": round(attained.windows_met / attained.windows, 4)
        if attained.windows
        else None,
        "requests_met_share": round(attained.met / attained.due, 4) if attained.due else None,
        "instance_seconds": round(spent, 1),
        "goodput_per_instance_second": round(attained.met / spent, 3) if spent else None,
    }


# ---- the sweep and the limit -------------------------------------------------------------


def fewest_meeting(
    ranked: Mapping[int, Sequence[dict[str, int]]],
    measure: Measure,
    rate: float,
    most: int,
    known: dict[str, Any] | None,
    per_total: int,
) -> dict[str, Any]:
    """The fewest-instance split that meets the objective at `rate`: the totals from the
    least up to `most`, the first `per_total` splits of each (`ranked`: total -> splits, those
    that serve most first); `known` (the higher level's answer, total `most`) stands when
    nothing smaller meets; when not even that is known, the best of those tried, as a miss."""
    tried = []
    for total in sorted(ranked):
        if total > most or (known is not None and total >= most):
            break
        for counts in ranked[total][:per_total]:
            row = {"instances": counts, "total": total, **measure(counts, rate)}
            tried.append(row)
            if row["meets"]:
                return {"rate": round(rate, 2), "chosen": row, "tried": tried}
    if known is not None:
        return {
            "rate": round(rate, 2),
            "chosen": {**known, "from_higher_level": True},
            "tried": tried,
        }
    best = max(tried, key=lambda row: row["met_share"] or 0.0)
    return {"rate": round(rate, 2), "chosen": best, "tried": tried}


def sweep_levels(
    ranked: Mapping[int, Sequence[dict[str, int]]],
    measure: Measure,
    peak: float,
    levels: int,
    per_total: int,
    announce: Callable[[float], None] | None = None,
) -> list[dict[str, Any]]:
    """Each level's fewest-instance split that meets the objective, from the peak down; one
    split more a total at the peak, where the static arm is chosen."""
    found_levels = []
    most, known = max(ranked), None
    for k in range(levels, 0, -1):
        rate = peak * k / levels
        if announce is not None:
            announce(rate)
        tries = per_total + (1 if k == levels else 0)
        found = fewest_meeting(ranked, measure, rate, most, known, tries)
        found_levels.append(found)
        if found["chosen"]["meets"]:
            most, known = found["chosen"]["total"], found["chosen"]
    return found_levels


def level_for(rate: float, levels: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The lowest level at or above `rate` (the highest when none is)."""
    above = [level for level in levels if level["rate"] >= rate - 1e-9]
    return (
        min(above, key=lambda level: level["rate"])
        if above
        else max(levels, key=lambda x: x["rate"])
    )


def limit_arm(trace: Trace, levels: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Perfect foresight: each second on the fewest instances that meet its level."""
    totals, met, windows_met, windows = [], 0.0, 0, 0
    for rate in trace.rates:
        chosen = level_for(rate, levels)["chosen"]
        totals.append(chosen["total"])
        met += rate * (chosen["met_share"] or 0.0)
    for first in range(0, trace.seconds - WINDOW_S + 1, WINDOW_S):
        windows += 1
        span = trace.rates[first : first + WINDOW_S]
        if all(level_for(rate, levels)["chosen"]["meets"] for rate in span):
            windows_met += 1
    spent = float(sum(totals))
    return {
        "windows_met_share": round(windows_met / windows, 4) if windows else None,
        "requests_met_share": round(met / trace.requests(), 4),
        "instance_seconds": round(spent, 1),
        "goodput_per_instance_second": round(met / spent, 3),
        "total_instances": totals,
    }
