"""The scenarios: a few families of load and pipeline shapes, many seeded instances of each.

A scenario is a pipeline, a budget, the autoscalers' specs, and phases: spans of time with
an offered rate per entry model (constant, a ramp, a wave, a spike) and, where a model's cost
changes, its new execution time. Each phase is judged on its own against its best static
configuration. A phase is `steady` when its offered rates are constant: no count should go
up and then down (or down and then up) within it.

Families (`FAMILIES`, with how many scenarios each makes):

- step: low, high, low again;
- shifted_mix: the load moves from one parent to another that shares its branches, halfway:
  to pipeline_sync (the benchmark's mix), or to a parent that calls branch_rank six times
  per execution and branch_embed never (the bottleneck moves from branch_embed to
  branch_rank);
- ramp: a rise to a high load, then the high load held;
- diurnal: a day compressed into four minutes, one phase a quarter;
- spike: a steady load, two to three times it for 10 to 20 s, the steady load again;
- cost_change: branch_classify's execution time rises two- to three-fold halfway (the
  bottleneck moves from branch_embed to branch_classify);
- tight_budget: a budget of 5 or 6 instances under a load that needs 8 or more;
- shapes: other pipelines: branch_rank as the bottleneck, a fourth branch, a child shared
  by two parents loaded at once.
- closed_loop: a closed loop of 8 to 64 clients (each answer sends the next request at once,
  as Locust's users and the benchmarks' loads do): what is offered is then never seen in a
  rate, only in the queue it keeps standing. Three in five start with it, every model at its
  minimum and the controller fresh, as operator_vs_static does; the others after a low
  open-loop load.

On generated pipelines (loadtests.sim.generated: depths 1, 2 and 3 in turn; two roots that
share a child one seed in four, one in twelve where both are loaded at once), loads in
fractions of the pipeline's fluid capacity:

- generated_steady: one constant load, 0.3 to 1.3 of it (two roots: split between them);
- generated_step: low (0.1 to 0.3), high (0.6 to 1.3), low again;
- generated_shift: two roots: the load moves from one to the other; one root: a child's
  execution time rises two- to three-fold, the load held;
- generated_ramp, generated_diurnal, generated_spike: as ramp, diurnal (a day of 120 s) and
  spike above;
- generated_closed: 4 to 32 clients, from the start or after a low open-loop load.

The autoscalers' specs are the benchmarks' (loadtests/bench/operator_vs_static.py): a tick
every 2 s over 6 s of rates, up by 2 instances a tick, down by one after 15 s of lower
recommendations; every model at least 1, at most what the budget leaves the others.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from itertools import zip_longest
from types import MappingProxyType

import numpy as np

from loadtests.sim.generated import TYPICAL_ROWS, GeneratedPipeline, generate_pipeline
from loadtests.sim.pipeline import (
    BRANCHES,
    PIPELINE,
    PIPELINE_SYNC,
    Pipeline,
    branch,
    parent,
    real_pipeline,
)
from tritonscale.core.spec import AutoscalerSpec

BUDGET_NAME = "pipeline"
ROWS_PER_REQUEST = 8
INTERVAL_S = 2
METRICS_WINDOW_S = 6
SCALE_DOWN_WINDOW_S = 15


# ---- offered load over a phase -------------------------------------------------------


@dataclass(frozen=True)
class Constant:
    rps: float

    def rate(self, t: np.ndarray, duration_s: float) -> np.ndarray:
        return np.full_like(t, self.rps, dtype=float)


@dataclass(frozen=True)
class Ramp:
    from_rps: float
    to_rps: float

    def rate(self, t: np.ndarray, duration_s: float) -> np.ndarray:
        return self.from_rps + (self.to_rps - self.from_rps) * t / duration_s


@dataclass(frozen=True)
class Wave:
    """A sinusoid between `low` and `high`; `offset_s` into a period of `period_s`."""

    low: float
    high: float
    period_s: float
    offset_s: float

    def rate(self, t: np.ndarray, duration_s: float) -> np.ndarray:
        angle = 2 * math.pi * (t + self.offset_s) / self.period_s
        return self.low + (self.high - self.low) * (1 - np.cos(angle)) / 2


@dataclass(frozen=True)
class Spike:
    base: float
    peak: float
    at_s: float
    length_s: float

    def rate(self, t: np.ndarray, duration_s: float) -> np.ndarray:
        inside = (t >= self.at_s) & (t < self.at_s + self.length_s)
        return np.where(inside, self.peak, self.base)


Load = Constant | Ramp | Wave | Spike


@dataclass(frozen=True)
class Clients:
    """A closed loop: `count` requests in flight from the phase's start to the scenario's end
    (each answer sends the next at once)."""

    count: int


@dataclass(frozen=True)
class Phase:
    name: str
    duration_s: float
    loads: Mapping[str, Load | Clients]  # entry model -> its load (entries left out get none)
    steady: bool = True
    costs: Mapping[str, float] = field(default_factory=dict)  # model -> new execute_ms

    @property
    def clients(self) -> dict[str, int]:
        """Entry model -> the closed loop that starts with this phase."""
        return {
            entry: load.count for entry, load in self.loads.items() if isinstance(load, Clients)
        }

    def offered_per_second(self, entry: str) -> list[float]:
        """The offered rate at the middle of each second of the phase (none for a closed loop:
        it offers what it is served)."""
        load = self.loads.get(entry)
        seconds = max(1, round(self.duration_s))
        if load is None or isinstance(load, Clients):
            return [0.0] * seconds
        middles = np.arange(seconds, dtype=float) + 0.5
        return [float(rate) for rate in load.rate(middles, self.duration_s)]

    def arrivals(self, entry: str, start_s: float, rng: np.random.Generator) -> np.ndarray:
        """Poisson arrivals at the phase's rate (thinned from its highest rate); none for a
        closed loop (the runner starts its clients)."""
        load = self.loads.get(entry)
        if load is None or isinstance(load, Clients):
            return np.empty(0)
        grid = np.linspace(0.0, self.duration_s, 200)
        highest = float(np.max(load.rate(grid, self.duration_s)))
        if highest <= 0:
            return np.empty(0)
        count = rng.poisson(highest * self.duration_s)
        t = np.sort(rng.uniform(0.0, self.duration_s, count))
        kept = rng.uniform(0.0, highest, count) < load.rate(t, self.duration_s)
        return start_s + t[kept]


@dataclass(frozen=True)
class Scenario:
    name: str
    family: str
    seed: int
    pipeline: Pipeline
    budget: int
    phases: tuple[Phase, ...]
    rows_per_request: int = ROWS_PER_REQUEST
    # What a generated pipeline is made of (loadtests.sim.generated.tags); empty for ours.
    shape: Mapping[str, object] = field(default_factory=dict, compare=False)

    @property
    def duration_s(self) -> float:
        return sum(phase.duration_s for phase in self.phases)

    def pipeline_in(self, index: int) -> Pipeline:
        """The pipeline as phase `index` runs it (costs changed by it and the phases before)."""
        pipeline = self.pipeline
        for phase in self.phases[: index + 1]:
            for model, execute_ms in phase.costs.items():
                pipeline = pipeline.with_cost(model, execute_ms)
        return pipeline

    def specs(self) -> dict[str, AutoscalerSpec]:
        return dict(autoscaler_specs(self.pipeline, self.budget))


_SPECS: dict[tuple, dict[str, AutoscalerSpec]] = {}


def autoscaler_specs(pipeline: Pipeline, budget: int) -> dict[str, AutoscalerSpec]:
    """The benchmarks' autoscalers for every model of `pipeline`, sharing one budget
    (checked once per pipeline and budget: a spec's rules take milliseconds to evaluate)."""
    key = (pipeline.key(), budget)
    if key not in _SPECS:
        _SPECS[key] = _autoscaler_specs(pipeline, budget)
    return _SPECS[key]


def _autoscaler_specs(pipeline: Pipeline, budget: int) -> dict[str, AutoscalerSpec]:
    most = budget - (len(pipeline.models) - 1)
    specs = {}
    for model in pipeline.names:
        spec = {
            "selector": {"matchLabels": {"app.kubernetes.io/component": "triton"}},
            "model": model,
            "minInstances": 1,
            "maxInstances": max(1, most),
            "metricsWindowSeconds": METRICS_WINDOW_S,
            "intervalSeconds": INTERVAL_S,
            "behavior": {
                "scaleUp": {
                    "stabilizationWindowSeconds": 0,
                    "policies": [{"type": "Instances", "value": 2, "periodSeconds": INTERVAL_S}],
                },
                "scaleDown": {
                    "stabilizationWindowSeconds": SCALE_DOWN_WINDOW_S,
                    "policies": [{"type": "Instances", "value": 1, "periodSeconds": INTERVAL_S}],
                },
            },
            "budget": {"name": BUDGET_NAME, "instancesPerPod": budget},
        }
        calls = pipeline.calls_of(model)
        if calls:
            spec["calls"] = list(calls)
        specs[model] = AutoscalerSpec.from_dict(spec)
    return specs


# ---- the families ----------------------------------------------------------------------

RANK_HEAVY = "pipeline_rank"  # a parent that ranks six candidate sets per request


def _with_rank_heavy(base: Pipeline) -> Pipeline:
    # Six rank calls an execution (three batches of two at branch_rank, 17 ms) and no embed:
    # branch_rank, not branch_embed, is then the slowest branch.
    calls = {"branch_classify": 1, "branch_rank": 6}
    models = {
        PIPELINE: base.models[PIPELINE],
        RANK_HEAVY: parent(RANK_HEAVY, calls),
        **{name: base.models[name] for name in BRANCHES},
    }
    return Pipeline("pipeline+rank-heavy", models, (PIPELINE, RANK_HEAVY))


def rank_bottleneck(base: Pipeline) -> Pipeline:
    return Pipeline(
        "pipeline/rank-25ms",
        {**base.models, "branch_rank": branch("branch_rank", 25.0)},
        base.entries,
    )


def fourth_branch(base: Pipeline) -> Pipeline:
    branches = (*BRANCHES, "branch_filter")
    return Pipeline(
        "pipeline+filter",
        {
            PIPELINE: parent(PIPELINE, dict.fromkeys(branches, 1)),
            **{name: base.models[name] for name in BRANCHES},
            "branch_filter": branch("branch_filter", 12.0),
        },
        (PIPELINE,),
    )


SEARCH = "pipeline_search"  # a second parent: embed and rank, sharing branch_embed


def _shared_child(base: Pipeline) -> Pipeline:
    return Pipeline(
        "two-parents",
        {
            PIPELINE: parent(PIPELINE, {"branch_embed": 1, "branch_classify": 1}),
            SEARCH: parent(SEARCH, {"branch_embed": 1, "branch_rank": 1}),
            **{name: base.models[name] for name in BRANCHES},
        },
        (PIPELINE, SEARCH),
    )


def _step(rng: random.Random, seed: int, base: Pipeline) -> Scenario:
    low, high = rng.uniform(50, 150), rng.uniform(280, 560)
    return Scenario(
        f"step-{seed}",
        "step",
        seed,
        base,
        7,
        (
            Phase("low", 50, {PIPELINE: Constant(low)}),
            Phase("high", 70, {PIPELINE: Constant(high)}),
            Phase("low again", 60, {PIPELINE: Constant(low)}),
        ),
    )


def _shifted_mix(rng: random.Random, seed: int, base: Pipeline) -> Scenario:
    if seed % 2 == 0:
        pipeline, second, budget = real_pipeline(with_sync=True), PIPELINE_SYNC, 7
        first_rps, second_rps = rng.uniform(250, 400), rng.uniform(150, 280)
    else:
        pipeline, second, budget = _with_rank_heavy(base), RANK_HEAVY, 7
        first_rps, second_rps = rng.uniform(250, 400), rng.uniform(150, 300)
    return Scenario(
        f"shifted_mix-{seed}",
        "shifted_mix",
        seed,
        pipeline,
        budget,
        (
            Phase(f"{PIPELINE} only", 70, {PIPELINE: Constant(first_rps)}),
            Phase(f"{second} only", 70, {second: Constant(second_rps)}),
        ),
    )


def _ramp(rng: random.Random, seed: int, base: Pipeline) -> Scenario:
    top = rng.uniform(320, 560)
    return Scenario(
        f"ramp-{seed}",
        "ramp",
        seed,
        base,
        7,
        (
            Phase("ramp", rng.choice((60, 90)), {PIPELINE: Ramp(40, top)}, steady=False),
            Phase("held", 60, {PIPELINE: Constant(top)}),
        ),
    )


def _diurnal(rng: random.Random, seed: int, base: Pipeline) -> Scenario:
    low, high = rng.uniform(40, 100), rng.uniform(350, 560)
    return Scenario(
        f"diurnal-{seed}",
        "diurnal",
        seed,
        base,
        7,
        tuple(
            Phase(
                name,
                60,
                {PIPELINE: Wave(low, high, 240.0, 60.0 * quarter)},
                steady=False,
            )
            for quarter, name in enumerate(("night", "morning", "day", "evening"))
        ),
    )


def _spike(rng: random.Random, seed: int, base: Pipeline) -> Scenario:
    steady = rng.uniform(120, 220)
    peak = min(steady * rng.uniform(2.0, 3.0), 600.0)
    length = rng.uniform(10, 20)
    return Scenario(
        f"spike-{seed}",
        "spike",
        seed,
        base,
        7,
        (
            Phase("before", 50, {PIPELINE: Constant(steady)}),
            Phase("spike", 40, {PIPELINE: Spike(steady, peak, 5.0, length)}, steady=False),
            Phase("after", 60, {PIPELINE: Constant(steady)}),
        ),
    )


def _cost_change(rng: random.Random, seed: int, base: Pipeline) -> Scenario:
    rps = rng.uniform(250, 420)
    classify_ms = base.models["branch_classify"].execute_ms * rng.uniform(2.0, 3.0)
    return Scenario(
        f"cost_change-{seed}",
        "cost_change",
        seed,
        base,
        7,
        (
            Phase("before", 70, {PIPELINE: Constant(rps)}),
            Phase(
                "branch_classify slower",
                80,
                {PIPELINE: Constant(rps)},
                costs={"branch_classify": round(classify_ms, 1)},
            ),
        ),
    )


def _tight_budget(rng: random.Random, seed: int, base: Pipeline) -> Scenario:
    budget = rng.choice((5, 6))
    return Scenario(
        f"tight_budget-{seed}",
        "tight_budget",
        seed,
        base,
        budget,
        (
            Phase("low", 40, {PIPELINE: Constant(rng.uniform(60, 120))}),
            Phase("beyond the budget", 90, {PIPELINE: Constant(rng.uniform(450, 600))}),
        ),
    )


def _shapes(rng: random.Random, seed: int, base: Pipeline) -> Scenario:
    kind = seed % 3
    if kind == 0:
        pipeline, budget = rank_bottleneck(base), 7
        loads: dict[str, Load] = {PIPELINE: Constant(rng.uniform(250, 420))}
    elif kind == 1:
        pipeline, budget = fourth_branch(base), 8
        loads = {PIPELINE: Constant(rng.uniform(250, 450))}
    else:
        pipeline, budget = _shared_child(base), 8
        # Rates on a 20 req/s grid: the static search simulates each configuration under
        # both parents' loads at once, and the scenarios then share those simulations.
        loads = {
            PIPELINE: Constant(rng.randrange(120, 260, 20)),
            SEARCH: Constant(rng.randrange(120, 260, 20)),
        }
    low: dict[str, Load] = {
        entry: Constant(load.rps / 4) for entry, load in loads.items() if isinstance(load, Constant)
    }
    return Scenario(
        f"shapes-{pipeline.name}-{seed}",
        "shapes",
        seed,
        pipeline,
        budget,
        (Phase("low", 40, low), Phase("high", 80, loads)),
    )


def _closed_loop(rng: random.Random, seed: int, base: Pipeline) -> Scenario:
    clients = (8, 16, 32, 64)[seed % 4]
    low = rng.uniform(40, 120)
    loop = Phase(f"{clients} clients", 80, {PIPELINE: Clients(clients)})
    if (seed // 4) % 2 == 0:
        # As operator_vs_static runs it: the clients from the start, every model at its
        # minimum and the controller fresh (its first window still filling).
        return Scenario(f"closed_loop-{clients}-{seed}", "closed_loop", seed, base, 7, (loop,))
    return Scenario(
        f"closed_loop-{clients}-after-low-{seed}",
        "closed_loop",
        seed,
        base,
        7,
        (Phase("low", 30, {PIPELINE: Constant(low)}), loop),
    )


# ---- generated pipelines (loadtests.sim.generated) ---------------------------------------

GENERATED = "generated_"  # the prefix of the families on generated pipelines
# Two roots loaded at once are judged by a simulation of each configuration under both loads
# (static.py): the families that do so draw two roots for one seed in twelve, not four.
BOTH_ROOTS_EVERY = 12


def _drawn(
    family: str, seed: int, shared_every: int = 4
) -> tuple[random.Random, GeneratedPipeline]:
    """The family's own generator for `seed` and its pipeline: depths 1, 2 and 3 in turn; a
    child shared by two roots in one in `shared_every`."""
    rng = random.Random(f"{family}-{seed}")
    shared = seed % shared_every == 0
    drawn = generate_pipeline(rng, f"{family}-{seed}", shared=shared, depth=seed % 3 + 1)
    return rng, drawn


def _generated(
    family: str, seed: int, drawn: GeneratedPipeline, phases: tuple[Phase, ...]
) -> Scenario:
    return Scenario(
        f"{family}-{seed}",
        family,
        seed,
        drawn.pipeline,
        drawn.budget,
        phases,
        shape=MappingProxyType(dict(drawn.tags)),
    )


def _loads(drawn: GeneratedPipeline, share: float, rng: random.Random) -> dict[str, Load]:
    """Every root at about `share` of its capacity; two roots split it between them."""
    capacity = drawn.capacity_rps
    split = rng.uniform(0.3, 0.7) if len(capacity) > 1 else 1.0
    shares = dict(zip(capacity, (split, 1 - split), strict=False))
    return {root: Constant(round(share * shares[root] * rps, 1)) for root, rps in capacity.items()}


def _generated_steady(rng: random.Random, seed: int, base: Pipeline) -> Scenario:
    family = f"{GENERATED}steady"
    rng, drawn = _drawn(family, seed, BOTH_ROOTS_EVERY)
    load = _loads(drawn, rng.uniform(0.3, 1.3), rng)
    return _generated(family, seed, drawn, (Phase("steady", 50, load),))


def _generated_step(rng: random.Random, seed: int, base: Pipeline) -> Scenario:
    family = f"{GENERATED}step"
    rng, drawn = _drawn(family, seed, BOTH_ROOTS_EVERY)
    low = _loads(drawn, rng.uniform(0.1, 0.3), rng)
    high = _loads(drawn, rng.uniform(0.6, 1.3), rng)
    return _generated(
        family,
        seed,
        drawn,
        (Phase("low", 30, low), Phase("high", 40, high), Phase("low again", 30, low)),
    )


def _generated_shift(rng: random.Random, seed: int, base: Pipeline) -> Scenario:
    """Two roots: the load moves from one to the other. One root: a child's cost rises two- to
    three-fold (its part per row), the load held."""
    family = f"{GENERATED}shift"
    rng, drawn = _drawn(family, seed)
    capacity = drawn.capacity_rps
    if len(capacity) > 1:
        first, second = capacity
        return _generated(
            family,
            seed,
            drawn,
            (
                Phase(
                    f"{first} only", 50, {first: Constant(rng.uniform(0.4, 1.2) * capacity[first])}
                ),
                Phase(
                    f"{second} only",
                    50,
                    {second: Constant(rng.uniform(0.4, 1.2) * capacity[second])},
                ),
            ),
        )
    pipeline = drawn.pipeline
    child = rng.choice([m for m in pipeline.names if m not in pipeline.entries])
    shape = pipeline.models[child]
    total_ms = shape.overhead_ms + shape.execute_ms * TYPICAL_ROWS
    slower = (rng.uniform(2.0, 3.0) * total_ms - shape.overhead_ms) / TYPICAL_ROWS
    load = _loads(drawn, rng.uniform(0.3, 0.8), rng)
    return _generated(
        family,
        seed,
        drawn,
        (
            Phase("before", 40, load),
            Phase(f"{child} slower", 40, load, costs={child: round(slower, 4)}),
        ),
    )


def _generated_ramp(rng: random.Random, seed: int, base: Pipeline) -> Scenario:
    family = f"{GENERATED}ramp"
    rng, drawn = _drawn(family, seed)
    root, capacity = next(iter(drawn.capacity_rps.items()))
    top = rng.uniform(0.7, 1.3) * capacity
    return _generated(
        family,
        seed,
        drawn,
        (
            Phase("ramp", 40, {root: Ramp(0.1 * capacity, top)}, steady=False),
            Phase("held", 40, {root: Constant(top)}),
        ),
    )


def _generated_diurnal(rng: random.Random, seed: int, base: Pipeline) -> Scenario:
    """A day compressed into 120 s, one phase a quarter."""
    family = f"{GENERATED}diurnal"
    rng, drawn = _drawn(family, seed)
    root, capacity = next(iter(drawn.capacity_rps.items()))
    wave = Wave(rng.uniform(0.1, 0.2) * capacity, rng.uniform(0.7, 1.1) * capacity, 120.0, 0.0)
    return _generated(
        family,
        seed,
        drawn,
        tuple(
            Phase(name, 30, {root: replace(wave, offset_s=30.0 * quarter)}, steady=False)
            for quarter, name in enumerate(("night", "morning", "day", "evening"))
        ),
    )


def _generated_spike(rng: random.Random, seed: int, base: Pipeline) -> Scenario:
    family = f"{GENERATED}spike"
    rng, drawn = _drawn(family, seed)
    root, capacity = next(iter(drawn.capacity_rps.items()))
    steady = rng.uniform(0.25, 0.5) * capacity
    peak = min(steady * rng.uniform(2.0, 3.0), 1.3 * capacity)
    spike = Spike(steady, peak, 5.0, rng.uniform(8, 16))
    return _generated(
        family,
        seed,
        drawn,
        (
            Phase("before", 30, {root: Constant(steady)}),
            Phase("spike", 30, {root: spike}, steady=False),
            Phase("after", 30, {root: Constant(steady)}),
        ),
    )


def _generated_closed(rng: random.Random, seed: int, base: Pipeline) -> Scenario:
    """A closed loop at the first root: from the start, or after a low open-loop load."""
    family = f"{GENERATED}closed"
    rng, drawn = _drawn(family, seed)
    root, capacity = next(iter(drawn.capacity_rps.items()))
    clients = rng.choice((4, 8, 16, 32))
    loop = Phase(f"{clients} clients", 50, {root: Clients(clients)})
    if rng.random() < 0.5:
        return _generated(family, seed, drawn, (loop,))
    low = Phase("low", 30, {root: Constant(rng.uniform(0.1, 0.3) * capacity)})
    return _generated(family, seed, drawn, (low, loop))


Family = Callable[[random.Random, int, Pipeline], Scenario]
FAMILIES: Mapping[str, tuple[Family, int]] = MappingProxyType(
    {
        "step": (_step, 40),
        "shifted_mix": (_shifted_mix, 30),
        "ramp": (_ramp, 25),
        "diurnal": (_diurnal, 20),
        "spike": (_spike, 25),
        "cost_change": (_cost_change, 25),
        "tight_budget": (_tight_budget, 20),
        "shapes": (_shapes, 30),
        "closed_loop": (_closed_loop, 20),
        f"{GENERATED}steady": (_generated_steady, 58),
        f"{GENERATED}step": (_generated_step, 58),
        f"{GENERATED}shift": (_generated_shift, 58),
        f"{GENERATED}ramp": (_generated_ramp, 58),
        f"{GENERATED}diurnal": (_generated_diurnal, 58),
        f"{GENERATED}spike": (_generated_spike, 58),
        f"{GENERATED}closed": (_generated_closed, 58),
    }
)


def generate(families: tuple[str, ...] = (), limit: int | None = None) -> list[Scenario]:
    """Every family's scenarios, interleaved (so that the first N cover every family)."""
    unknown = [name for name in families if name not in FAMILIES]
    if unknown:
        known = ", ".join(FAMILIES)
        raise ValueError(f"unknown family {unknown[0]!r} (known: {known})")
    chosen = families or tuple(FAMILIES)
    base = real_pipeline()
    lists = []
    for name in chosen:
        make, count = FAMILIES[name]
        lists.append([make(random.Random(seed), seed, base) for seed in range(count)])
    interleaved = [s for row in zip_longest(*lists) for s in row if s is not None]
    return interleaved[:limit] if limit is not None else interleaved
