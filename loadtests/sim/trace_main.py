"""`python -m loadtests.sim.trace_main`: the trace benchmark's four arms on many simulated days.

python -m loadtests.sim.trace_main                # every trace (trace_cases: 120)
python -m loadtests.sim.trace_main --traces 10    # the first ten (ours and generated)
python -m loadtests.sim.trace_main --jobs 1       # in this process alone

Each trace (loadtests.sim.trace_cases) is swept, replayed under static_at_peak, hpa_way and
the operator, and judged against the limit (loadtests.sim.trace_arms); the traces are shared
among `--jobs` forked processes, the rows gathered in the traces' order, so that the result is
the same for any number of jobs. Result: reports/sim/traces.json (+ .png), the summary of
loadtests.sim.trace_summary; `cpu_seconds` counts every job's processor time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from loadtests.sim import jobs as sim_jobs
from loadtests.sim import trace_arms, trace_cases, trace_summary
from loadtests.sim.static import StaticSearch

RESULTS_DIR = Path(__file__).resolve().parents[2] / "reports" / "sim"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.sim.trace_main", description=__doc__)
    parser.add_argument("--traces", type=int, default=None, help="run only the first N")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "traces.json")
    sim_jobs.add_jobs_argument(parser, "traces")
    args = parser.parse_args(argv)
    if args.traces is not None and args.traces < 1:
        parser.error(f"--traces must be at least 1, got {args.traces}")

    started = time.monotonic()
    chosen = trace_cases.generate(args.traces)
    print(f"sim traces: {len(chosen)} traces, {args.jobs} job(s)", flush=True)
    rows = []
    for number, row in enumerate(_rows(chosen, args.jobs), start=1):
        rows.append(row)
        if number % 10 == 0 or number == len(chosen):
            print(f"  [{number}/{len(chosen)}] {time.monotonic() - started:5.1f} s", flush=True)
    times = os.times()
    cpu = times.user + times.system + times.children_user + times.children_system
    result = trace_summary.summarize(rows, cpu)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    trace_summary.plot(result, args.out.with_suffix(".png"))
    for arm, numbers in result["arms"].items():
        print(
            f"  {arm}: {_percent(numbers['traces_at_098_of_windows'])} of traces at >= 98 % of "
            f"windows (median {_percent(numbers['median_windows_met_share'])}), instance-seconds "
            f"{numbers['median_instance_seconds_over_limit']} x the limit's, goodput per "
            f"instance-second {numbers['median_goodput_over_static_at_peak']} x static at peak's "
            f"and {numbers['median_goodput_over_hpa_way']} x the HPA way's (medians)",
            flush=True,
        )
    print(
        f"sim traces: {len(rows)} traces, {cpu:.0f} s of CPU, "
        f"{time.monotonic() - started:.0f} s; {args.out} and {args.out.with_suffix('.png')}",
        flush=True,
    )
    return 0


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{share:.1%}"


def _rows(chosen: list[trace_cases.TraceCase], jobs: int) -> Iterator[dict]:
    """Each trace's row, in the traces' order; a static search per process."""
    searches: dict[str, StaticSearch] = {}  # copied into each forked job, filled there

    def run(index: int) -> dict:
        search = searches.setdefault("search", StaticSearch(trace_arms.ROWS_PER_REQUEST))
        return trace_arms.run_case(chosen[index], search)

    return sim_jobs.in_order(run, len(chosen), jobs)


if __name__ == "__main__":
    sys.exit(main())
