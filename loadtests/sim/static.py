"""The best static configuration: every count within the budget, each one simulated.

The bar a controller is held to in a phase is the configuration that serves that phase's
offered load best, found the way Model Analyzer's brute-force search and the benchmarks'
sweep find it: by trying every configuration (each model between its minimum and maximum,
all together within the budget), fewest instances among equals.

A configuration's served rate under one entry model's load is `min(offered, capacity)` second
by second, where its capacity is simulated: a closed loop with enough requests in flight to
keep every parent instance busy with full batches (an open queue in steady state serves what
it is offered below its capacity, and its capacity above). With several entry models loaded
at once (two parents sharing a child) there is no one capacity; the configuration is
simulated under the phase's mean offered rates instead. Results are cached by pipeline, counts
and load, so scenarios that share a pipeline share the search.
"""

from __future__ import annotations

import itertools
import random
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from loadtests.sim.pipeline import Pipeline
from loadtests.sim.queueing import Simulation

WARM_UP_S = 0.5
MEASURE_S = 2.0
OPEN_LOOP_S = 8.0  # several entry models at once: simulated this long, the first second left out
OPEN_LOOP_STEP_RPS = 10  # ...at rates rounded to this, so that near loads share a result
TIE = 1e-9  # served rates closer than this (relative) are equal


def configurations(
    models: Sequence[str],
    budget: int,
    minimum: Mapping[str, int] | None = None,
    maximum: Mapping[str, int] | None = None,
) -> list[dict[str, int]]:
    """Every count of `models` within their bounds whose total is at most `budget`."""
    low = [max(1, (minimum or {}).get(m, 1)) for m in models]
    high = [min(budget, (maximum or {}).get(m, budget)) for m in models]
    ranges = [range(lo, hi + 1) for lo, hi in zip(low, high, strict=True)]
    return [
        dict(zip(models, counts, strict=True))
        for counts in itertools.product(*ranges)
        if sum(counts) <= budget
    ]


class StaticSearch:
    """Served rates of configurations, simulated once and remembered."""

    def __init__(self, rows_per_request: int = 8) -> None:
        self.rows_per_request = rows_per_request
        self._capacity: dict[tuple, float] = {}
        self._served: dict[tuple, float] = {}
        self.simulated = 0  # configurations simulated (not found in the cache)

    def capacity(
        self,
        pipeline: Pipeline,
        counts: Mapping[str, int],
        entry: str,
        clients: int | None = None,
    ) -> float:
        """Requests per second `entry` serves with every instance kept busy, or under a closed
        loop of `clients`."""
        key = (pipeline.key(), tuple(counts[m] for m in pipeline.names), entry, clients)
        if key not in self._capacity:
            if clients is None:
                shape = pipeline.models[entry]
                per_batch = max(1, shape.max_batch_rows // self.rows_per_request)
                clients = max(32, 2 * counts[entry] * per_batch)
            sim = Simulation(pipeline, counts, rows_per_request=self.rows_per_request)
            sim.closed_loop(entry, clients)
            sim.run_until(WARM_UP_S)
            before = sim.counters()[entry].success
            sim.run_until(WARM_UP_S + MEASURE_S)
            self._capacity[key] = (sim.counters()[entry].success - before) / MEASURE_S
            self.simulated += 1
        return self._capacity[key]

    def served_together(
        self, pipeline: Pipeline, counts: Mapping[str, int], rates: Mapping[str, float]
    ) -> float:
        """Requests per second served in all under open-loop Poisson load at `rates`."""
        step = OPEN_LOOP_STEP_RPS
        rounded = tuple(sorted((entry, step * round(rate / step)) for entry, rate in rates.items()))
        key = (pipeline.key(), tuple(counts[m] for m in pipeline.names), rounded)
        if key not in self._served:
            sim = Simulation(pipeline, counts, rows_per_request=self.rows_per_request)
            rng = random.Random(zlib.crc32(repr(rounded).encode()))
            for entry, rate in rounded:
                sim.offer(entry, poisson_times(rng, rate, OPEN_LOOP_S))
            sim.run_until(1.0)
            before = sum(sim.counters()[entry].success for entry, _ in rounded)
            sim.run_until(OPEN_LOOP_S)
            served = sum(sim.counters()[entry].success for entry, _ in rounded) - before
            self._served[key] = served / (OPEN_LOOP_S - 1.0)
            self.simulated += 1
        return self._served[key]

    def served(
        self,
        pipeline: Pipeline,
        counts: Mapping[str, int],
        offered: Mapping[str, Sequence[float]],
        clients: Mapping[str, int] | None = None,
    ) -> float:
        """Mean requests per second a configuration serves of `offered` (entry -> the offered
        rate, second by second), or under the closed loops `clients` (entry -> requests in
        flight; one entry)."""
        if clients:
            ((entry, count),) = clients.items()
            return self.capacity(pipeline, counts, entry, count)
        active = {entry: rates for entry, rates in offered.items() if any(rates)}
        if not active:
            return 0.0
        if len(active) == 1:
            ((entry, rates),) = active.items()
            capacity = self.capacity(pipeline, counts, entry)
            return sum(min(rate, capacity) for rate in rates) / len(rates)
        means = {entry: sum(rates) / len(rates) for entry, rates in active.items()}
        return self.served_together(pipeline, counts, means)

    def best(
        self,
        pipeline: Pipeline,
        candidates: Sequence[Mapping[str, int]],
        offered: Mapping[str, Sequence[float]],
        clients: Mapping[str, int] | None = None,
    ) -> Best:
        """The configuration that serves `offered` (or the closed loops `clients`) best; fewest
        instances among equals."""
        scored = [
            (self.served(pipeline, counts, offered, clients), counts) for counts in candidates
        ]
        top = max(rate for rate, _ in scored)
        equal = [
            (sum(counts.values()), tuple(counts.values()), rate, counts)
            for rate, counts in scored
            if rate >= top * (1 - TIE)
        ]
        _, _, rate, counts = min(equal, key=lambda item: (item[0], item[1]))
        return Best(dict(counts), rate)


@dataclass(frozen=True)
class Best:
    counts: dict[str, int]
    served_rps: float

    @property
    def instances(self) -> int:
        return sum(self.counts.values())


def poisson_times(rng: random.Random, rate: float, until_s: float, start_s: float = 0.0) -> list:
    """Arrival times of a Poisson process of `rate` per second from `start_s` to `until_s`."""
    times: list[float] = []
    if rate <= 0:
        return times
    t = start_s + rng.expovariate(rate)
    while t < until_s:
        times.append(t)
        t += rng.expovariate(rate)
    return times
