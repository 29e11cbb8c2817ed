"""A latency objective in the simulator: the operator's set planner sizes pipeline_async to it.

    python -m loadtests.sim.latency_objective [--rate 120] [--milliseconds 60] [--seconds 240]

pipeline_async and its branches (models/, as the simulator's other families take them) on one
pod, the benchmarks' autoscalers (loadtests.sim.scenarios) with the root's
`spec.targets.latency` set, Poisson arrivals at a steady rate, in virtual time. Each tick the
operator's decision path (`AllocatorController`: the set planner and the budget's ledger)
decides from the simulated metrics, and each change is loaded as the runner loads it (live
0.2 to 1.4 s later). Every request's time at the root is recorded as it ends (arrival to
answer, queue and the batch it ran in: what Triton's duration counters add up).

Judged over 10 s windows once the counts hold (the settled part: from the last change of
counts on): the share of windows whose latency at the objective's quantile meets the bound,
and the counts held against those the planner chose (its predicted split).
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from loadtests.sim.allocator_controller import AllocatorController
from loadtests.sim.metrics import SimulatedSource
from loadtests.sim.pipeline import PIPELINE, Pipeline, real_pipeline
from loadtests.sim.queueing import Simulation
from loadtests.sim.runner import LOAD_SECONDS
from loadtests.sim.scenarios import INTERVAL_S, METRICS_WINDOW_S, ROWS_PER_REQUEST, autoscaler_specs
from tritonscale.core.spec import AutoscalerSpec, LatencyObjective

# The objective is judged over windows of this many seconds (issue 49's 10 s windows).
JUDGED_WINDOW_S = 10.0
BUDGET = 12


class TimedSimulation(Simulation):
    """The simulation, keeping each root request's (answered at, seconds it took)."""

    def __init__(self, pipeline: Pipeline, counts: Mapping[str, int], **kwargs: object) -> None:
        super().__init__(pipeline, counts, **kwargs)  # type: ignore[arg-type]
        self.answered: list[tuple[float, float]] = []

    def _finish_execution(self, execution: list) -> None:
        now = self.now
        self.answered.extend((now, now - arrived) for arrived in execution[2])
        super()._finish_execution(execution)


@dataclass(frozen=True)
class Outcome:
    counts: dict[str, int]  # held at the end
    chosen: dict[str, int]  # the planner's split at its last decision (before behavior)
    settled_at: float  # the last change of counts
    windows_met_share: float  # of the judged windows after it
    window_quantiles_ms: list[float]
    predicted_ms: float | None  # the planner's, at the counts it chose last
    met: bool | None  # whether it predicted them to meet the objective
    reason: str  # the root's last decision's

    def to_dict(self) -> dict[str, object]:
        return {
            "counts": self.counts,
            "chosen": self.chosen,
            "settled_at": self.settled_at,
            "windows_met_share": round(self.windows_met_share, 3),
            "window_quantiles_ms": [round(q, 1) for q in self.window_quantiles_ms],
            "predicted_ms": None if self.predicted_ms is None else round(self.predicted_ms, 1),
            "met": self.met,
            "reason": self.reason,
        }


def specs_with_objective(
    pipeline: Pipeline, objective: LatencyObjective, budget: int = BUDGET
) -> dict[str, AutoscalerSpec]:
    """The benchmarks' autoscalers, the root's carrying `objective`."""
    specs = dict(autoscaler_specs(pipeline, budget))
    for root in pipeline.entries:
        spec = specs[root]
        targets = spec.targets.model_copy(update={"latency": objective})
        specs[root] = spec.model_copy(update={"targets": targets})
    return specs


def run(
    rate_rps: float,
    objective: LatencyObjective,
    seconds: float = 240.0,
    seed: int = 0,
    pipeline: Pipeline | None = None,
) -> Outcome:
    """Poisson arrivals at `rate_rps` to pipeline_async for `seconds` under the set planner."""
    pipeline = pipeline or real_pipeline()
    specs = specs_with_objective(pipeline, objective)
    sim = TimedSimulation(
        pipeline,
        {m: specs[m].min_instances for m in pipeline.names},
        rows_per_request=ROWS_PER_REQUEST,
        seed=seed,
    )
    arrivals = np.random.default_rng(seed)
    count = arrivals.poisson(rate_rps * seconds)
    sim.offer(PIPELINE, np.sort(arrivals.uniform(0.0, seconds, count)).tolist())
    controller = AllocatorController()
    controller.configure(pipeline.configs())
    source = SimulatedSource(sim)
    loads = random.Random(seed)
    settled_at = 0.0
    for tick in range(round(seconds / INTERVAL_S)):
        t = tick * INTERVAL_S
        sim.run_until(t)
        source.sample()
        held = sim.counts()
        desired = controller.decide(
            specs, held, source.snapshot(pipeline.names, METRICS_WINDOW_S), t
        )
        for model, wanted in desired.items():
            if wanted != held[model]:
                live_at = t + loads.uniform(*LOAD_SECONDS)
                sim.set_count(model, wanted, at=live_at)
                controller.went_live(model, live_at)
                settled_at = live_at
    sim.run_until(seconds)
    quantiles = _window_quantiles(sim.answered, settled_at, seconds, objective.quantile)
    met = [q <= objective.milliseconds for q in quantiles]
    last = controller.planner.last
    latency = last.models[PIPELINE].latency if last is not None else None
    chosen = {
        model: decided.allocated_instances
        for model, decided in (last.models.items() if last is not None else ())
        if decided.allocated_instances is not None
    }
    return Outcome(
        counts=sim.counts(),
        chosen=chosen,
        settled_at=settled_at,
        windows_met_share=sum(met) / len(met) if met else 0.0,
        window_quantiles_ms=quantiles,
        predicted_ms=latency.predicted_ms if latency is not None else None,
        met=latency.met if latency is not None else None,
        reason=controller.reasons.get(PIPELINE, ""),
    )


def _window_quantiles(
    answered: list[tuple[float, float]], start: float, end: float, quantile: float
) -> list[float]:
    """Per whole judged window from `start` to `end`, the latency at `quantile` (ms)."""
    found = []
    t = start
    while t + JUDGED_WINDOW_S <= end:
        inside = [s for at, s in answered if t <= at < t + JUDGED_WINDOW_S]
        if inside:
            found.append(1000.0 * float(np.quantile(inside, quantile)))
        t += JUDGED_WINDOW_S
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=120.0, help="requests per second")
    parser.add_argument("--quantile", type=float, default=0.95)
    parser.add_argument("--milliseconds", type=float, default=60.0, help="the bound")
    parser.add_argument("--seconds", type=float, default=240.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    objective = LatencyObjective(quantile=args.quantile, milliseconds=args.milliseconds)
    outcome = run(args.rate, objective, args.seconds, args.seed)
    print(json.dumps(outcome.to_dict(), indent=2))


if __name__ == "__main__":
    main()
