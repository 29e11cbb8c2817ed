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

The search finds what trying every configuration finds, without simulating them all: where
every execution time is fixed, a configuration's served rate has an upper bound worked out
from its counts (`Bounds`: no model serves more rows than its instances execute back to back,
a BLS model's calls answered no sooner than its children execute them alone), and one whose
bound cannot reach the best found so far (or, for the fewest instances among equals, the
best's rate) is not simulated.
"""

from __future__ import annotations

import functools
import itertools
import math
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
        rounded = _rounded(rates)
        key = (pipeline.key(), tuple(counts[m] for m in pipeline.names), rounded)
        if key not in self._served:
            sim = Simulation(pipeline, counts, rows_per_request=self.rows_per_request)
            for entry, times in _open_loop_arrivals(rounded).items():
                sim.offer(entry, times)
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
        upper = self._upper(pipeline, candidates, offered, clients)
        if upper is None:
            return self.exhaustive(pipeline, candidates, offered, clients)
        # The most served: simulated in the order of the bounds, until no bound is above it.
        top = -math.inf
        for index in sorted(range(len(candidates)), key=lambda i: -upper[i]):
            if upper[index] <= top:
                break
            top = max(top, self.served(pipeline, candidates[index], offered, clients))
        # The fewest instances among those that serve as much: the first that does, in that
        # order, of those whose bound reaches it.
        threshold = top * (1 - TIE)
        equal = sorted(
            (i for i in range(len(candidates)) if upper[i] >= threshold),
            key=lambda i: (sum(candidates[i].values()), tuple(candidates[i].values())),
        )
        for index in equal:
            rate = self.served(pipeline, candidates[index], offered, clients)
            if rate >= threshold:
                return Best(dict(candidates[index]), rate)
        raise AssertionError("the best configuration serves less than itself")  # unreachable

    def exhaustive(
        self,
        pipeline: Pipeline,
        candidates: Sequence[Mapping[str, int]],
        offered: Mapping[str, Sequence[float]],
        clients: Mapping[str, int] | None = None,
    ) -> Best:
        """`best` by simulating every candidate."""
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

    def _upper(
        self,
        pipeline: Pipeline,
        candidates: Sequence[Mapping[str, int]],
        offered: Mapping[str, Sequence[float]],
        clients: Mapping[str, int] | None,
    ) -> list[float] | None:
        """Per candidate, a rate `served` cannot exceed; None where none is known (an
        execution time drawn at random)."""
        if any(
            shape.service != "deterministic" or shape.batch_exponent > 1
            for shape in pipeline.models.values()
        ):
            return None  # `Bounds` holds for fixed times that grow at most linearly
        if clients:
            ((entry, _),) = clients.items()
            bounds = Bounds(pipeline, entry, self.rows_per_request, MEASURE_S)
            return [bounds.rps(counts) for counts in candidates]
        active = {entry: rates for entry, rates in offered.items() if any(rates)}
        if not active:
            return [0.0] * len(candidates)
        if len(active) == 1:
            ((entry, rates),) = active.items()
            bounds = Bounds(pipeline, entry, self.rows_per_request, MEASURE_S)
            upper = []
            for counts in candidates:
                most = bounds.rps(counts)
                upper.append(sum(min(rate, most) for rate in rates) / len(rates))
            return upper
        # Several entries at once: each serves at most what arrived in the simulated span (the
        # arrivals `served_together` draws) and at most what it could alone.
        arrived = self._arrivals(active)
        each = {
            entry: Bounds(pipeline, entry, self.rows_per_request, OPEN_LOOP_S - 1.0)
            for entry in active
        }
        return [
            sum(min(arrived[entry], each[entry].rps(counts)) for entry in active)
            for counts in candidates
        ]

    def _arrivals(self, active: Mapping[str, Sequence[float]]) -> dict[str, float]:
        """Per entry, the requests `served_together` offers it over its whole span, per second
        of what it measures."""
        rounded = _rounded({entry: sum(r) / len(r) for entry, r in active.items()})
        times = _open_loop_arrivals(rounded)
        return {entry: len(times[entry]) / (OPEN_LOOP_S - 1.0) for entry, _ in rounded}


def _rounded(rates: Mapping[str, float]) -> tuple[tuple[str, float], ...]:
    step = OPEN_LOOP_STEP_RPS
    return tuple(sorted((entry, step * round(rate / step)) for entry, rate in rates.items()))


@functools.lru_cache(maxsize=256)
def _open_loop_arrivals(rounded: tuple[tuple[str, float], ...]) -> dict[str, list[float]]:
    """The arrivals `served_together` offers at these (rounded) rates: the same every time."""
    rng = random.Random(zlib.crc32(repr(rounded).encode()))
    return {entry: poisson_times(rng, rate, OPEN_LOOP_S) for entry, rate in rounded}


class Bounds:
    """An upper bound of the requests per second `entry` can complete under any load, as a
    function of the counts, where every execution time is fixed (a rate measured over
    `window_s` seconds).

    Through a model the entry's requests reach by calls every request makes (conditional calls
    bound nothing), each request brings `rows` rows; an execution takes at most `most_rows`
    rows (its batch limit, or the largest call it can be sent) and holds its instance at least
    `held_s(most_rows)`: its own time plus, for a BLS model, its children's own times for the
    same rows (the slowest, or their sum when it calls one after another). Rows per second over
    held seconds grows with the rows (times grow at most linearly), so an instance serves at
    most `most_rows / held_s(most_rows)` rows a second, and in a window of `window_s` one
    execution more (the one under way at its start). Requests that finish in the window after
    their rows went through the model before it are inside the entry's executions under way
    at its start: at most its instances times its batch."""

    def __init__(self, pipeline: Pipeline, entry: str, rows_per_request: int, window_s: float):
        self.entry = entry
        models = pipeline.models
        shape = models[entry]
        self.per_batch = max(1, shape.max_batch_rows // rows_per_request) if shape.batcher else 1
        self.window_s = window_s
        # The models the entry reaches, callers before their callees (the calls are acyclic).
        order: list[str] = []

        def visit(model: str) -> None:
            if model not in order:
                for child in models[model].calls:
                    visit(child)
                order.append(model)

        visit(entry)
        order.reverse()
        # The largest execution each of them can be given (its callers' executions).
        most_rows = {entry: self.per_batch * rows_per_request}
        for model in order:
            for child in models[model].calls:
                limit = models[child].max_batch_rows if models[child].batcher else 0
                most_rows[child] = max(most_rows.get(child, 0), most_rows[model], limit)
        # Rows per request through the calls every request makes.
        rows = {entry: float(rows_per_request)}
        for model in order:
            shape = models[model]
            for child, times in shape.calls.items():
                if shape.call_share.get(child, 1.0) >= 1.0 and model in rows:
                    rows[child] = rows.get(child, 0.0) + rows[model] * times

        def held_s(model: str, batch_rows: int) -> float:
            shape = models[model]
            waits = [
                held_s(child, batch_rows)
                for child, times in shape.calls.items()
                if shape.call_share.get(child, 1.0) >= 1.0
                for _ in range(times)
            ]
            own = shape.execute_s(batch_rows)
            if not waits:
                return own
            return own + (sum(waits) if shape.sequential else max(waits))

        # Per model, requests a second one instance can see through in the window.
        self.per_instance = {
            model: (
                most_rows[model] / held_s(model, most_rows[model]) + most_rows[model] / window_s
            )
            / rows[model]
            for model in rows
        }

    def rps(self, counts: Mapping[str, int]) -> float:
        tightest = min(counts[model] * rate for model, rate in self.per_instance.items())
        return tightest + counts[self.entry] * self.per_batch / self.window_s


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
