"""One scenario under one controller, in virtual time, judged phase by phase.

Every model starts at its minimum. Each tick (every `intervalSeconds` of the specs) the
simulated source takes a sample and a snapshot, the controller decides, and each change is
loaded: it takes effect 0.2 to 1.4 s later (as measured on a real Triton), the old count
serving meanwhile. Per phase:

- `served_rps`: what the entry models served (successful requests per second), measured in
  the simulation, against `best_static` (tritonscale's static search, static.py): its
  counts and what it serves of the phase's load;
- `held_ratio`: what the configuration held at the phase's end would serve of that load,
  over the best's; `at_098_of_best` when it is at least 0.98;
- `seconds_to_098`: from the phase's start until the controller first held a configuration
  that serves at least 0.98 of the best (seen at ticks; None when never; 0 when the
  configuration it came in with does, `started_at_098`);
- `seconds_to_best`: from the phase's start until the controller first held the best static
  configuration, or one that serves as much (seen at ticks; None when never; 0 when it came
  in with one): the real benchmarks' `first_held` (loadtests/bench/common.py);
- `instance_seconds`: the instances held over the phase, beside the best's;
- `reversals`: changes of a model's count against its previous change in the same phase, and
  `reversal_reasons`, where the controller says why it decides (`reasons`: model -> the
  reason of its last decision, as AllocatorController keeps them): how many each reason made;
- `budget_overruns`: ticks at which the counts asked for or held exceeded the budget.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from loadtests.sim.controllers import Controller
from loadtests.sim.metrics import SimulatedSource
from loadtests.sim.queueing import Simulation
from loadtests.sim.scenarios import Scenario
from loadtests.sim.static import StaticSearch, configurations

LOAD_SECONDS = (0.2, 1.4)  # a load of a new count on a real Triton, as measured
AT_BEST = 0.98
AS_BEST = 1 - 1e-9  # a share of the best's served rate at which a configuration equals it


@dataclass
class _PhaseTally:
    reversals: int = 0
    reversal_reasons: Counter[str] = field(default_factory=Counter)
    overruns: int = 0
    instance_seconds: float = 0.0
    seconds_to_098: float | None = None
    seconds_to_best: float | None = None


def run_scenario(
    scenario: Scenario, make_controller: Callable[[], Controller], search: StaticSearch
) -> dict:
    """Simulate `scenario` under a fresh controller; one result row (JSON-ready)."""
    specs = scenario.specs()
    models = scenario.pipeline.names
    interval = min(spec.interval_seconds for spec in specs.values())
    window = max(spec.metrics_window_seconds for spec in specs.values())
    budget = scenario.budget
    candidates = configurations(
        models,
        budget,
        {m: s.min_instances for m, s in specs.items()},
        {m: s.max_instances for m, s in specs.items()},
    )

    starts = np.cumsum([0.0] + [phase.duration_s for phase in scenario.phases])
    uneven = [p.name for p in scenario.phases if p.duration_s % interval]
    if uneven:
        raise ValueError(
            f"{scenario.name}: phase {uneven[0]!r} is not a whole number of {interval} s ticks"
        )
    sim = Simulation(
        scenario.pipeline,
        {m: specs[m].min_instances for m in models},
        rows_per_request=scenario.rows_per_request,
        seed=scenario.seed,
    )
    arrivals_rng = np.random.default_rng(scenario.seed)
    for entry in scenario.pipeline.entries:
        times = np.concatenate(
            [
                phase.arrivals(entry, float(start), arrivals_rng)
                for phase, start in zip(scenario.phases, starts, strict=False)
            ]
        )
        sim.offer(entry, times.tolist())
    for entry, clients in scenario.phases[0].clients.items():
        sim.closed_loop(entry, clients)

    # The bar of each phase: the best configuration within the budget under its load.
    offered = [
        {entry: phase.offered_per_second(entry) for entry in scenario.pipeline.entries}
        for phase in scenario.phases
    ]
    pipelines = [scenario.pipeline_in(i) for i in range(len(scenario.phases))]
    # A closed loop is judged by what it serves with its clients (it offers what it gets).
    clients = [phase.clients for phase in scenario.phases]
    bests = [
        search.best(pipelines[i], candidates, offered[i], clients[i])
        for i in range(len(scenario.phases))
    ]

    def share_of_best(index: int, counts: Mapping[str, int]) -> float:
        best = bests[index].served_rps
        if best <= 0:
            return 1.0
        return search.served(pipelines[index], counts, offered[index], clients[index]) / best

    controller = make_controller()
    # A controller that reads the models' live configs (as the operator's actuator does) is
    # given them: the shapes' batching, in Triton's form.
    configure = getattr(controller, "configure", None)
    if configure is not None:
        configure(scenario.pipeline.configs())
    source = SimulatedSource(sim)
    went_live = getattr(controller, "went_live", None)
    load_rng = random.Random(scenario.seed)
    tallies = [_PhaseTally() for _ in scenario.phases]
    served_at = [0.0] * (len(scenario.phases) + 1)  # at each phase's start, and at the end
    held_at_end: list[dict[str, int]] = [{} for _ in scenario.phases]
    last_direction: dict[str, int] = {}
    phase = 0
    end = float(starts[-1])
    for tick in range(round(end / interval)):
        t = tick * interval
        sim.run_until(t)
        if t >= starts[phase + 1] - 1e-9:
            held_at_end[phase] = sim.counts()
            phase += 1
            served_at[phase] = _served(sim, scenario)
            last_direction = {}
            for model in scenario.phases[phase].costs:
                sim.set_shape(pipelines[phase].models[model])
            for entry, count in clients[phase].items():
                sim.closed_loop(entry, count)
        tally = tallies[phase]
        held = sim.counts()
        if tally.seconds_to_best is None:
            share = share_of_best(phase, held)
            if tally.seconds_to_098 is None and share >= AT_BEST:
                tally.seconds_to_098 = t - float(starts[phase])
            if share >= AS_BEST:
                tally.seconds_to_best = t - float(starts[phase])
        source.sample()
        # A controller may leave out the models it keeps as they are.
        desired = {**held, **controller.decide(specs, held, source.snapshot(models, window), t)}
        if sum(desired.values()) > budget or sum(held.values()) > budget:
            tally.overruns += 1
        for model, count in desired.items():
            if count == held[model]:
                continue
            direction = 1 if count > held[model] else -1
            if last_direction.get(model, direction) != direction:
                tally.reversals += 1
                reasons = getattr(controller, "reasons", {})
                tally.reversal_reasons[reasons.get(model, "unknown")] += 1
            last_direction[model] = direction
            live_at = t + load_rng.uniform(*LOAD_SECONDS)
            sim.set_count(model, count, at=live_at)
            if went_live is not None:
                went_live(model, live_at)  # as the operator's set tick reports a load's end
        tally.instance_seconds += sum(held.values()) * interval
    sim.run_until(end)
    held_at_end[phase] = sim.counts()
    served_at[-1] = _served(sim, scenario)

    rows = []
    for i, phase_spec in enumerate(scenario.phases):
        start, stop = float(starts[i]), float(starts[i + 1])
        served = (served_at[i + 1] - served_at[i]) / (stop - start)
        best = bests[i]
        held_ratio = share_of_best(i, held_at_end[i])
        tally = tallies[i]
        offered_mean = sum(sum(rates) / len(rates) for rates in offered[i].values())
        if clients[i]:
            offered_mean = served  # a closed loop offers what it is served
        rows.append(
            {
                "phase": phase_spec.name,
                "start_s": start,
                "duration_s": stop - start,
                "steady": phase_spec.steady,
                "offered_rps": round(offered_mean, 2),
                "served_rps": round(served, 2),
                "best_static": {"counts": best.counts, "served_rps": round(best.served_rps, 2)},
                "served_ratio": round(served / best.served_rps, 4) if best.served_rps else None,
                "held_at_end": held_at_end[i],
                "held_ratio": round(held_ratio, 4),
                "at_098_of_best": held_ratio >= AT_BEST,
                "seconds_to_098": tally.seconds_to_098,
                "started_at_098": tally.seconds_to_098 == 0.0,
                "seconds_to_best": tally.seconds_to_best,
                "instance_seconds": round(tally.instance_seconds, 1),
                "best_instance_seconds": round(best.instances * (stop - start), 1),
                "reversals": tally.reversals,
                "reversal_reasons": dict(tally.reversal_reasons),
                "budget_overruns": tally.overruns,
            }
        )
    return {
        "scenario": scenario.name,
        "family": scenario.family,
        "seed": scenario.seed,
        "pipeline": scenario.pipeline.name,
        "budget": budget,
        **({"shape": dict(scenario.shape)} if scenario.shape else {}),
        "phases": rows,
    }


def _served(sim: Simulation, scenario: Scenario) -> float:
    """Successful requests of the entry models so far."""
    counters = sim.counters()
    return sum(counters[entry].success for entry in scenario.pipeline.entries)
