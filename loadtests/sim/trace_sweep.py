"""The sweep of a trace in the simulator: the peak, the objective and each level's
fewest-instance split, found as the trace benchmark finds them on the real server
(loadtests.bench.trace), by simulating the splits instead of measuring them.

1. **Capacity.** Every split of the budget (each model at least one) under a closed loop that
   keeps every instance busy (static.StaticSearch.capacity); the trace's peak is `peak_share`
   of the best full split's (the benchmark takes 0.8; the traces here draw it, so that the
   peaks differ).
2. **The objective** (loadtests.objective.objective_ms): that best full split under open
   Poisson arrivals at the peak, its p95 doubled and rounded up to 5 ms.
3. **The levels** (loadtests.objective.sweep_levels): at `LEVELS` rates from the peak down,
   the fewest-instance split that meets the objective, trying the `SPLITS_PER_TOTAL` splits
   of each total with the most capacity (the benchmark tries one or two: a real measurement
   takes seconds, a simulated one milliseconds). A split whose capacity is below the rate
   misses without a simulation: its queue grows for as long as the rate lasts.

A measurement offers the rate for `SETTLE_S` and then `MEASURE_S` (the benchmark's 2 and 5 s
would judge a simulated split on a few hundred requests, where these judge it on thousands),
and counts the requests due in the second span: its p95 with the requests never answered
within `DRAIN_S` after it counted as misses, and the share within the objective. Every split
of a level sees the same arrivals (seeded by the case and the rate).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from loadtests import objective
from loadtests.sim.pipeline import Pipeline
from loadtests.sim.queueing import Simulation
from loadtests.sim.static import StaticSearch, configurations, poisson_times

LEVELS = 10  # the benchmark's 5, halved in width: the limit follows each second's rate closer
SPLITS_PER_TOTAL = 3
SETTLE_S = 5.0
MEASURE_S = 30.0
DRAIN_S = 10.0  # longer than any objective here (tens of milliseconds): a later answer misses
ROWS_PER_REQUEST = 8  # the trace benchmark's rows a request


@dataclass(frozen=True)
class Sweep:
    """What the arms of one trace are judged by."""

    root: str
    largest_split_rps: float  # the best full split's capacity
    peak_rps: float
    objective_ms: float
    probe: Mapping[str, Any]  # the best full split at the peak, as measured for the objective
    levels: list[dict[str, Any]]  # loadtests.objective.sweep_levels', from the peak down

    @property
    def static(self) -> Mapping[str, Any]:
        """The fewest-instance split that meets the objective at the peak (or the best miss)."""
        return self.levels[0]["chosen"]


def measure(
    pipeline: Pipeline,
    root: str,
    counts: Mapping[str, int],
    rate: float,
    objective_s: float,
    seed: int,
) -> dict[str, Any]:
    """`counts` under open Poisson arrivals at `rate` (loadtests.bench.trace's OpenLoad.measure,
    simulated): p95 with misses counted, the share within the objective, and whether it meets."""
    arrivals = poisson_times(random.Random(f"{seed}-{rate:.6g}"), rate, SETTLE_S + MEASURE_S)
    sim = Simulation(pipeline, counts, rows_per_request=ROWS_PER_REQUEST, seed=seed)
    answered = sim.record(root)
    sim.offer(root, arrivals)
    sim.run_until(SETTLE_S + MEASURE_S + DRAIN_S)
    due = sum(1 for t in arrivals if t >= SETTLE_S)
    ok = [latency for t, latency in answered if t >= SETTLE_S and latency is not None]
    p95 = objective.quantile_with_misses(ok, due, objective.QUANTILE)
    met = sum(1 for latency in ok if latency <= objective_s)
    return {
        "rate": round(rate, 2),
        "due": due,
        "p95_ms": None if p95 is None or math.isinf(p95) else round(1000 * p95, 2),
        "met_share": round(met / due, 4) if due else None,
        "meets": p95 is not None and p95 <= objective_s,
    }


def sweep(
    pipeline: Pipeline,
    root: str,
    budget: int,
    peak_share: float,
    seed: int,
    search: StaticSearch,
) -> Sweep:
    """The peak, the objective and the levels of a trace on `pipeline` (see the docstring)."""
    models = pipeline.names
    capacity = {
        tuple(counts.values()): search.capacity(pipeline, counts, root)
        for counts in configurations(models, budget)
    }
    full = [split for split in capacity if sum(split) == budget]
    best = max(full, key=lambda split: capacity[split])
    largest = capacity[best]
    peak = peak_share * largest
    probe = measure(pipeline, root, dict(zip(models, best, strict=True)), peak, math.inf, seed)
    if probe["p95_ms"] is None:
        raise ValueError(f"{pipeline.name}: its best split answered nothing at {peak:.0f} req/s")
    objective_ms = objective.objective_ms(probe["p95_ms"])
    ranked: dict[int, list[dict[str, int]]] = {}
    for split in sorted(capacity, key=lambda split: -capacity[split]):
        ranked.setdefault(sum(split), []).append(dict(zip(models, split, strict=True)))

    def measured(counts: dict[str, int], rate: float) -> dict[str, Any]:
        if capacity[tuple(counts.values())] < rate:
            due = round(rate * MEASURE_S)
            return {"rate": round(rate, 2), "due": due, "p95_ms": None, "met_share": None,
                    "meets": False, "below_capacity": True}  # fmt: skip
        return measure(pipeline, root, counts, rate, objective_ms / 1000, seed)

    levels = objective.sweep_levels(ranked, measured, peak, LEVELS, SPLITS_PER_TOTAL)
    return Sweep(root, largest, peak, objective_ms, probe, levels)
