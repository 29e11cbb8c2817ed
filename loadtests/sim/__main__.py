"""`python -m loadtests.sim`: every scenario under one controller, summary JSON and PNG.

python -m loadtests.sim                          # all scenarios, the operator's set planner
python -m loadtests.sim --controller static      # another controller, by name
python -m loadtests.sim --family step --scenarios 10
python -m loadtests.sim --jobs 1                 # in this process alone

The scenarios are shared among `--jobs` processes (forked: each its own static search), the
rows gathered in the scenarios' order: the result is the same for any number of jobs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from loadtests.sim import controllers, scenarios, summary
from loadtests.sim import jobs as sim_jobs
from loadtests.sim.runner import run_scenario
from loadtests.sim.static import StaticSearch

RESULTS_DIR = Path(__file__).resolve().parents[2] / "reports" / "sim"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.sim", description=__doc__)
    parser.add_argument(
        "--controller",
        default="allocator",
        choices=sorted(controllers.CONTROLLERS),
        help="the controller to judge (default: allocator, the operator's set planner; "
        "static: the counts it came in with)",
    )
    parser.add_argument("--scenarios", type=int, default=None, help="run only the first N")
    parser.add_argument(
        "--family",
        action="append",
        default=[],
        choices=list(scenarios.FAMILIES),
        help="run only this family (repeatable)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "summary.json")
    sim_jobs.add_jobs_argument(parser, "scenarios")
    args = parser.parse_args(argv)
    if args.scenarios is not None and args.scenarios < 1:
        parser.error(f"--scenarios must be at least 1, got {args.scenarios}")

    started = time.monotonic()
    chosen = scenarios.generate(tuple(args.family), args.scenarios)
    rows = []
    print(
        f"sim: {len(chosen)} scenarios under controller {args.controller}, {args.jobs} job(s)",
        flush=True,
    )
    for number, row in enumerate(_rows(chosen, args.controller, args.jobs), start=1):
        rows.append(row)
        if number % 50 == 0 or number == len(chosen):
            phases = [p for row in rows for p in row["phases"]]
            at_best = sum(p["at_098_of_best"] for p in phases) / len(phases)
            print(
                f"  [{number}/{len(chosen)}] {time.monotonic() - started:5.1f} s, "
                f"{at_best:.0%} of phases at 0.98 of best so far",
                flush=True,
            )
    result = summary.summarize(rows, args.controller, time.monotonic() - started)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    summary.plot(result, args.out.with_suffix(".png"))
    print(
        f"sim: {result['phases']} phases of {result['scenarios']} scenarios: "
        f"{result['share_of_phases_at_098_of_best']:.1%} at 0.98 of the best static, "
        f"{result['budget_overruns']} budget overruns, {result['steady_reversals']} steady "
        f"reversals, {result['seconds']:.0f} s; generated pipelines: "
        f"{result['generated_scenarios']} scenarios, "
        f"{_percent(result['generated_share_of_phases_at_098_of_best'])} at 0.98, ours: "
        f"{_percent(result['ours_share_of_phases_at_098_of_best'])}; "
        f"{args.out} and {args.out.with_suffix('.png')}",
        flush=True,
    )
    return 0


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{share:.1%}"


def _rows(chosen: list[scenarios.Scenario], controller: str, jobs: int) -> Iterator[dict]:
    """Each scenario's row, in the scenarios' order; a static search per process."""
    searches: dict[str, StaticSearch] = {}  # copied into each forked job, filled there

    def run(index: int) -> dict:
        search = searches.setdefault("search", StaticSearch())
        return run_scenario(chosen[index], controllers.CONTROLLERS[controller], search)

    # Small chunks: the scenarios' costs differ, and the jobs should end together.
    return sim_jobs.in_order(run, len(chosen), jobs, chunksize=2)


if __name__ == "__main__":
    sys.exit(main())
