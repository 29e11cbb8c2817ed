"""The performance model (tritonscale.core.lqn) against the simulator: `python -m loadtests.sim.model_check`.

For each pipeline, the simulator runs a closed loop at the starting split (every model at one
instance) and the operator's metric windows are taken from it (`SimulatedSource`, then
`PipelineHistory`, as the operator keeps them); the model is built from those windows alone
(`lqn.from_history`) and predicts every split of the budget (each model at least one
instance). Each split is then simulated under the same closed loop. The simulator's queues
are its own model of Triton (loadtests/sim/queueing.py): batches taken from a FIFO queue, a
BLS parent that holds its instance until its calls answer; the model's assumptions are not
in it.

Prints one markdown table per pipeline and the share of splits within 10 %; for one, the
mean latency under open (Poisson) arrivals at half and four fifths of each split's predicted
capacity too. `--json PATH` writes every row.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from loadtests.sim.metrics import SimulatedSource
from loadtests.sim.pipeline import Pipeline, fan_out, real_pipeline
from loadtests.sim.queueing import Simulation
from loadtests.sim.static import poisson_times
from tritonscale.core import lqn
from tritonscale.core.pipeline_model import PipelineHistory

WARM_UP_S = 1.0
WINDOW_S = 2.0
WINDOWS = 3  # at the starting split, for the model's inputs
MEASURE_S = 6.0  # each split, after the warm-up
WITHIN = 0.10  # the goal for throughput


@dataclass(frozen=True)
class Case:
    name: str
    pipeline: Pipeline
    budget: int
    clients: int = 32
    rows_per_request: int = 8
    execution_scv: float = lqn.EXECUTION_SCV  # what the model is told of the executions
    open_arrivals: bool = False  # also under Poisson arrivals (mean latency)


def cases() -> list[Case]:
    real = real_pipeline()
    varied = replace(
        real,
        name="pipeline_async, exponential executions",
        models={name: replace(s, service="exponential") for name, s in real.models.items()},
    )
    return [
        Case("pipeline_async as configured", real, 7, open_arrivals=True),
        Case("pipeline_async, 12 in flight", real, 7, clients=12),
        Case("pipeline_async, branch_rank 25 ms", real.with_cost("branch_rank", 25.0), 7),
        Case("pipeline_async, branch_embed 40 ms", real.with_cost("branch_embed", 40.0), 7),
        # Executions that vary (exponential) where the model takes them as fixed: its
        # assumption (EXECUTION_SCV) wrong on purpose.
        Case("pipeline_async, exponential executions", varied, 7),
        Case("pipeline_async, exponential executions, told so", varied, 7, execution_scv=1.0),
        Case("fan-out 3 x 20 ms, async", fan_out(20.0, 3), 10, clients=32, rows_per_request=1),
        Case(
            "fan-out 3 x 20 ms, sync",
            fan_out(20.0, 3, sequential=True),
            10,
            clients=32,
            rows_per_request=1,
        ),
    ]


def splits(models: Sequence[str], budget: int) -> list[dict[str, int]]:
    """Every count of the models, each at least 1, that uses the whole budget."""
    most = budget - (len(models) - 1)
    return [
        dict(zip(models, counts, strict=True))
        for counts in itertools.product(range(1, most + 1), repeat=len(models))
        if sum(counts) == budget
    ]


def measured_network(case: Case) -> lqn.Network:
    """The model from windows of the starting split only."""
    pipeline = case.pipeline
    counts = dict.fromkeys(pipeline.names, 1)
    sim = Simulation(pipeline, counts, rows_per_request=case.rows_per_request)
    (root,) = pipeline.entries
    sim.closed_loop(root, case.clients)
    source = SimulatedSource(sim)
    sim.run_until(WARM_UP_S)
    source.sample()
    history = PipelineHistory()
    for index in range(1, WINDOWS + 1):
        sim.run_until(WARM_UP_S + index * WINDOW_S)
        source.sample()
        history = history.observed(source.snapshot(pipeline.names, WINDOW_S), counts)
    calls = {name: pipeline.calls_of(name) for name in pipeline.names}
    sequential = {name for name, shape in pipeline.models.items() if shape.sequential}
    return lqn.from_history(
        history, calls, root, pipeline.configs(), sequential, case.execution_scv
    )


def simulated(case: Case, counts: Mapping[str, int]) -> tuple[float, float]:
    """The root's requests per second and mean seconds in the server (queue and compute)."""
    sim = Simulation(case.pipeline, counts, rows_per_request=case.rows_per_request)
    (root,) = case.pipeline.entries
    sim.closed_loop(root, case.clients)
    sim.run_until(WARM_UP_S)
    before = sim.counters()[root]
    sim.run_until(WARM_UP_S + MEASURE_S)
    after = sim.counters()[root]
    served = after.success - before.success
    seconds = after.compute_s - before.compute_s + after.queue_s - before.queue_s
    return served / MEASURE_S, seconds / served


def check(case: Case, limit: int | None = None) -> dict[str, Any]:
    network = measured_network(case)
    rows = []
    for counts in splits(case.pipeline.names, case.budget)[:limit]:
        predicted = lqn.closed_loop(network.with_counts(counts), case.clients)
        rps, latency_s = simulated(case, counts)
        rows.append(
            {
                "counts": counts,
                "predicted_rps": round(predicted.throughput_rps, 1),
                "simulated_rps": round(rps, 1),
                "error": round(predicted.throughput_rps / rps - 1, 4),
                "predicted_mean_ms": round(1000 * predicted.mean_latency_s, 1),
                "simulated_mean_ms": round(1000 * latency_s, 1),
            }
        )
    within = sum(abs(row["error"]) <= WITHIN for row in rows) / len(rows)
    return {
        "case": case.name,
        "clients": case.clients,
        "rows_per_request": case.rows_per_request,
        "splits": rows,
        "within_10pct_share": round(within, 3),
        "mean_abs_error": round(sum(abs(r["error"]) for r in rows) / len(rows), 4),
        "max_abs_error": round(max(abs(r["error"]) for r in rows), 4),
    }


# Open arrivals: Poisson at these shares of the split's predicted capacity, simulated this
# long (the first second left out).
OPEN_LOADS = (0.5, 0.8)
OPEN_S = 20.0


def check_open(case: Case, limit: int | None = None) -> dict[str, Any]:
    """Mean latency under open (Poisson) arrivals, predicted against simulated, on the model
    from the same closed-loop windows of the starting split."""
    network = measured_network(case)
    (root,) = case.pipeline.entries
    rows = []
    for counts in splits(case.pipeline.names, case.budget)[:limit]:
        split = network.with_counts(counts)
        most = lqn.capacity(split).throughput_rps
        for share in OPEN_LOADS:
            rate = share * most
            predicted = lqn.open_loop(split, rate)
            sim = Simulation(case.pipeline, counts, rows_per_request=case.rows_per_request)
            rng = random.Random(zlib.crc32(repr((counts, share)).encode()))
            sim.offer(root, poisson_times(rng, rate, OPEN_S))
            sim.run_until(1.0)
            before = sim.counters()[root]
            sim.run_until(OPEN_S)
            after = sim.counters()[root]
            served = after.success - before.success
            seconds = after.compute_s - before.compute_s + after.queue_s - before.queue_s
            simulated_ms = 1000 * seconds / served
            rows.append(
                {
                    "counts": counts,
                    "offered_rps": round(rate, 1),
                    "predicted_mean_ms": round(1000 * predicted.mean_latency_s, 2),
                    "simulated_mean_ms": round(simulated_ms, 2),
                    "error": round(1000 * predicted.mean_latency_s / simulated_ms - 1, 4),
                }
            )
    return {
        "case": f"{case.name}, open arrivals at {OPEN_LOADS} of capacity",
        "splits": rows,
        "mean_abs_error": round(sum(abs(r["error"]) for r in rows) / len(rows), 4),
        "max_abs_error": round(max(abs(r["error"]) for r in rows), 4),
    }


def open_table(result: Mapping[str, Any]) -> str:
    lines = [
        f"### {result['case']}",
        "",
        "| split | offered req/s | predicted mean ms | simulated mean ms | error |",
        "|---|---|---|---|---|",
    ]
    for row in result["splits"]:
        split = "/".join(str(c) for c in row["counts"].values())
        lines.append(
            f"| {split} | {row['offered_rps']} | {row['predicted_mean_ms']} | "
            f"{row['simulated_mean_ms']} | {100 * row['error']:+.1f} % |"
        )
    lines.append(
        f"\nmean latency: mean |error| {100 * result['mean_abs_error']:.1f} %, max "
        f"{100 * result['max_abs_error']:.1f} %\n"
    )
    return "\n".join(lines)


def table(result: Mapping[str, Any]) -> str:
    lines = [
        f"### {result['case']} ({result['clients']} in flight)",
        "",
        "| split | predicted req/s | simulated req/s | error | predicted mean ms | simulated |",
        "|---|---|---|---|---|---|",
    ]
    for row in result["splits"]:
        split = "/".join(str(c) for c in row["counts"].values())
        lines.append(
            f"| {split} | {row['predicted_rps']} | {row['simulated_rps']} | "
            f"{100 * row['error']:+.1f} % | {row['predicted_mean_ms']} | "
            f"{row['simulated_mean_ms']} |"
        )
    lines.append(
        f"\nwithin 10 %: {100 * result['within_10pct_share']:.0f} % of splits; mean |error| "
        f"{100 * result['mean_abs_error']:.1f} %, max {100 * result['max_abs_error']:.1f} %\n"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.sim.model_check")
    parser.add_argument("--json", type=Path, help="write every row here")
    parser.add_argument("--case", action="append", help="only the cases whose name has this")
    args = parser.parse_args(argv)
    results = []
    for case in cases():
        if args.case and not any(part in case.name for part in args.case):
            continue
        results.append(check(case))
        print(table(results[-1]), flush=True)
        if case.open_arrivals:
            results.append(check_open(case))
            print(open_table(results[-1]), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
