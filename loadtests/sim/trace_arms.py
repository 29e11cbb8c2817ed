"""The trace benchmark's four arms (loadtests.bench.trace) on one simulated day: the same trace
and pipeline, the same arrivals, judged by the same code (loadtests.objective).

The day: the case's production-shaped trace (loadtests.traces) at the sweep's peak
(loadtests.sim.trace_sweep), requests arriving open-loop, Poisson within each second at that
second's rate, each `ROWS_PER_REQUEST` rows, every arm offered the very same arrivals. A
request's latency runs from its arrival to its answer; one dropped, or not answered within
`DRAIN_S` after the day, is a miss.

The arms, each from the day's start:

- **static_at_peak**: the sweep's fewest-instance split that meets the objective at the peak,
  held all day;
- **hpa_way**: every model at one instance, then each by itself to its utilization target
  (controllers.HpaWayController, loadtests.hpa_way) with the chart's autoscalers, no budget;
- **operator**: every model at one instance, then the operator's set tick
  (allocator_controller.AllocatorController: its set planner and budget ledger) on the chart's
  autoscalers with the budget and the objective in the root's `spec.targets.latency`; the arm
  follows whatever the planner makes of the objective;
- **limit**: computed from the sweep (loadtests.objective.limit_arm), not run.

The chart's autoscalers (loadtests.chart) are the ones the benchmark runs: a tick every 15 s
over 60 s of rates, down after 300 s of lower recommendations. At each tick the simulated
source takes a sample and a snapshot, the controller decides, and its changes are loaded one
after another, decreases first (the set tick's order, and the actuator's one load at a
time), each taking 0.2 to 1.4 s (runner.LOAD_SECONDS, as measured on a real Triton), the old
count serving until its load ends. The live counts are read every second (as the
benchmark's poller reads them) for the instance-seconds.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from loadtests import chart, objective, traces
from loadtests.sim.allocator_controller import AllocatorController
from loadtests.sim.controllers import Controller, HpaWayController, StaticController
from loadtests.sim.metrics import SimulatedSource
from loadtests.sim.pipeline import Pipeline
from loadtests.sim.queueing import Simulation
from loadtests.sim.runner import LOAD_SECONDS
from loadtests.sim.scenarios import BUDGET_NAME
from loadtests.sim.static import StaticSearch
from loadtests.sim.trace_cases import TraceCase
from loadtests.sim.trace_sweep import ROWS_PER_REQUEST, Sweep, sweep
from tritonscale.core.spec import AutoscalerSpec

ARMS = ("static_at_peak", "hpa_way", "operator")
DRAIN_S = 30.0  # the load generator's request deadline (queueing.CLIENT_TIMEOUT_S)
SELECTOR = {"matchLabels": {"app.kubernetes.io/component": "triton"}}


def arrivals(trace: traces.Trace, rng: np.random.Generator) -> list[float]:
    """Open-loop arrival times: Poisson within each second at that second's rate."""
    times: list[float] = []
    for second, rate in enumerate(trace.rates):
        count = int(rng.poisson(rate))
        times.extend(np.sort(second + rng.uniform(0.0, 1.0, count)).tolist())
    return times


def arm_specs(
    pipeline: Pipeline, budget: int | None, objective_ms: float | None
) -> dict[str, AutoscalerSpec]:
    """The chart's autoscaler for every model of `pipeline`; with `budget`, all sharing it;
    with `objective_ms`, p95 within it on the root."""
    autoscalers = chart.chart_autoscalers()
    specs = {}
    for model in pipeline.names:
        root = model in pipeline.entries
        spec = chart.chart_spec(autoscalers, model, pipeline.calls_of(model), root)
        spec["selector"] = SELECTOR
        if budget is not None:
            spec["budget"] = {"name": BUDGET_NAME, "instancesPerPod": budget}
        if root and objective_ms is not None:
            latency = {"quantile": objective.QUANTILE, "milliseconds": objective_ms}
            spec["targets"] = {**spec["targets"], "latency": latency}
        specs[model] = AutoscalerSpec.from_dict(spec)
    return specs


def replay(
    pipeline: Pipeline,
    start: Mapping[str, int],
    offered: Sequence[float],
    seconds: int,
    controller: Controller,
    specs: Mapping[str, AutoscalerSpec],
    seed: int,
) -> tuple[list[tuple[float, float | None]], list[dict[str, int]]]:
    """One arm's day: each request's (arrival, latency or None) and the counts each second."""
    root = pipeline.entries[0]
    sim = Simulation(pipeline, start, rows_per_request=ROWS_PER_REQUEST, seed=seed)
    answered = sim.record(root)
    sim.offer(root, list(offered))
    configure = getattr(controller, "configure", None)
    if configure is not None:
        configure(pipeline.configs())
    went_live = getattr(controller, "went_live", None)
    source = SimulatedSource(sim)
    interval = min(spec.interval_seconds for spec in specs.values())
    window = max(spec.metrics_window_seconds for spec in specs.values())
    load_rng = random.Random(seed)
    counts = []
    next_tick = 0.0
    for second in range(seconds):
        sim.run_until(float(second))
        if second >= next_tick:
            next_tick += interval
            held = sim.counts()
            source.sample()
            snapshot = source.snapshot(pipeline.names, window)
            desired = controller.decide(specs, held, snapshot, float(second))
            # One load after another, those that give instances back first (the set tick's
            # order), so that the counts never hold more than the tick granted.
            changes = sorted(
                (model for model, count in desired.items() if count != held[model]),
                key=lambda model: desired[model] > held[model],
            )
            live_at = float(second)
            for model in changes:
                live_at += load_rng.uniform(*LOAD_SECONDS)
                sim.set_count(model, desired[model], at=live_at)
                if went_live is not None:
                    went_live(model, live_at)
        counts.append(sim.counts())
    sim.run_until(seconds + DRAIN_S)
    return answered, counts


def judge(
    answered: Sequence[tuple[float, float | None]],
    offered: Sequence[float],
    counts: Sequence[Mapping[str, int]],
    seconds: int,
    objective_ms: float,
) -> dict[str, Any]:
    """An arm's numbers (loadtests.objective.ARM_KEYS and a few beside them)."""
    attained = objective.attainment(offered, answered, 0.0, seconds, objective_ms / 1000)
    totals = [sum(held.values()) for held in counts]
    spent = objective.instance_seconds(list(enumerate(totals)), 0.0, float(seconds))
    return {
        **objective.arm_metrics(attained, spent),
        "requests_due": attained.due,
        "requests_met": attained.met,
        "max_total_instances": max(totals),
        "mean_total_instances": round(spent / seconds, 2),
    }


def run_case(case: TraceCase, search: StaticSearch) -> dict[str, Any]:
    """The four arms on one case's day; one JSON-ready row."""
    found = sweep(case.pipeline, case.root, case.budget, case.peak_share, case.seed, search)
    trace = traces.production_trace(case.seconds, found.peak_rps, case.seed)
    offered = arrivals(trace, np.random.default_rng(case.seed))
    ones = dict.fromkeys(case.pipeline.names, 1)
    arms: dict[str, tuple[Mapping[str, int], Callable[[], Controller], dict]] = {
        "static_at_peak": (found.static["instances"], StaticController, arm_specs(case.pipeline, None, None)),
        "hpa_way": (ones, HpaWayController, arm_specs(case.pipeline, None, None)),
        "operator": (ones, AllocatorController, arm_specs(case.pipeline, case.budget, found.objective_ms)),
    }  # fmt: skip
    results: dict[str, Any] = {}
    for arm, (start, make, specs) in arms.items():
        answered, counts = replay(
            case.pipeline, start, offered, trace.seconds, make(), specs, case.seed
        )
        results[arm] = judge(answered, offered, counts, trace.seconds, found.objective_ms)
    limit = objective.limit_arm(trace, found.levels)
    results["limit"] = {key: limit[key] for key in objective.ARM_KEYS}
    return {
        "case": case.name,
        "family": case.family,
        "pipeline": case.pipeline.name,
        "seed": case.seed,
        "budget": case.budget,
        **({"shape": dict(case.shape)} if case.shape else {}),
        **_sweep_row(found),
        "arms": results,
    }


def _sweep_row(found: Sweep) -> dict[str, Any]:
    static = found.static
    return {
        "largest_split_rps": round(found.largest_split_rps, 1),
        "peak_rps": round(found.peak_rps, 1),
        "objective": {"quantile": objective.QUANTILE, "milliseconds": found.objective_ms},
        "probe_p95_ms": found.probe["p95_ms"],
        "static_at_peak": {"instances": dict(static["instances"]), "meets": static["meets"]},
        "levels": [
            {
                "rate": level["rate"],
                "total": level["chosen"]["total"],
                "meets": level["chosen"]["meets"],
            }
            for level in found.levels
        ],  # fmt: skip
    }
