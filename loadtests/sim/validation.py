"""The simulator against what the real server measured: `python -m loadtests.sim.validation`.

Each row is a configuration a benchmark measured on the development machine (loadtests/README.md,
and the fan-out below; closed loops on a real tritonserver), simulated under the same closed
loop: the pipeline's sweep (32 requests of 8 rows in flight; `operator_vs_static` on
2 December 2026, its whole sweep of 4 December, and `shifted_mix`'s halves) and the 3-way
fan-out to a 20 ms branch (32 requests of one row). It prints one markdown table, the ranking of each group and whether
the simulator's top two match the measured top two.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass

from loadtests.sim.pipeline import PIPELINE, PIPELINE_SYNC, Pipeline, fan_out, real_pipeline
from loadtests.sim.queueing import Simulation

CLOSE = 0.15  # a simulated rate within 15 % of the measured one is close


@dataclass(frozen=True)
class Measured:
    group: str
    label: str  # the counts as the README writes them
    counts: Mapping[str, int]
    entry: str
    measured_rps: tuple[float, ...]  # every run's
    clients: int = 32
    rows_per_request: int = 8

    @property
    def mean_rps(self) -> float:
        return sum(self.measured_rps) / len(self.measured_rps)


def _pipeline_counts(label: str, names: tuple[str, ...]) -> dict[str, int]:
    return dict(zip(names, (int(part) for part in label.split("/")), strict=True))


def measured_rows() -> list[tuple[Pipeline, Measured]]:
    pipeline = real_pipeline()
    mix = real_pipeline(with_sync=True)
    rows: list[tuple[Pipeline, Measured]] = []
    # operator_vs_static's sweep, 2 December 2026, three runs (the sweep's own numbers).
    for label, rps in (
        ("3/2/1/1", (466.0, 471.2, 489.0)),
        ("4/1/1/1", (443.2, 442.5, 448.0)),
        ("2/2/2/1", (367.0,)),
    ):
        rows.append(
            (
                pipeline,
                Measured(
                    "operator_vs_static (budget 7)",
                    label,
                    _pipeline_counts(label, pipeline.names),
                    PIPELINE,
                    rps,
                ),
            )
        )
    # operator_vs_static's whole sweep, 4 December 2026, five runs on a quiet machine.
    for label, rps in (
        ("1/1/1/4", (210.0, 209.0, 209.0, 209.0, 206.75)),
        ("1/1/2/3", (210.0, 209.0, 208.0, 209.0, 207.0)),
        ("1/1/3/2", (210.0, 209.0, 208.0, 208.0, 203.0)),
        ("1/1/4/1", (209.0, 209.0, 206.75, 207.0, 206.0)),
        ("1/2/1/3", (210.0, 210.0, 204.0, 208.0, 208.0)),
        ("1/2/2/2", (210.0, 209.0, 208.0, 209.0, 208.0)),
        ("1/2/3/1", (205.0, 208.0, 208.0, 207.25, 207.0)),
        ("1/3/1/2", (207.0, 209.0, 205.0, 206.25, 209.0)),
        ("1/3/2/1", (207.0, 209.0, 209.0, 208.0, 208.0)),
        ("1/4/1/1", (207.0, 209.0, 208.75, 209.0, 209.0)),
        ("2/1/1/3", (269.0, 267.0, 265.0, 273.0, 280.0)),
        ("2/1/2/2", (280.0, 270.0, 277.0, 286.0, 274.0)),
        ("2/1/3/1", (270.0, 272.0, 286.0, 277.0, 280.0)),
        ("2/2/1/2", (388.0, 385.25, 387.0, 387.0, 385.0)),
        ("2/2/2/1", (415.0, 414.0, 413.0, 415.0, 405.0)),
        ("2/3/1/1", (386.0, 390.0, 387.0, 386.0, 384.0)),
        ("3/1/1/2", (383.0, 381.0, 382.75, 383.0, 382.0)),
        ("3/1/2/1", (379.0, 378.0, 379.0, 378.0, 377.0)),
        ("3/2/1/1", (520.0, 515.0, 513.0, 520.0, 515.0)),
        ("4/1/1/1", (478.0, 480.0, 482.0, 488.0, 482.0)),
    ):
        group = "operator_vs_static's whole sweep (budget 7, 4 December)"
        counts = _pipeline_counts(label, pipeline.names)
        rows.append((pipeline, Measured(group, label, counts, PIPELINE, rps)))
    # shifted_mix: pipeline_async, pipeline_sync, branch_embed, branch_classify, branch_rank.
    for group, entry, label, rps in (
        ("shifted_mix, first half", PIPELINE, "3/1/1/1/1", (275.8, 370.0, 361.1)),
        ("shifted_mix, first half", PIPELINE, "2/1/2/1/1", (321.0, 363.0, 359.4)),
        ("shifted_mix, second half", PIPELINE_SYNC, "1/3/1/1/1", (255.0, 255.0, 256.2)),
    ):
        rows.append((mix, Measured(group, label, _pipeline_counts(label, mix.names), entry, rps)))
    # Measured on a real tritonserver: 3-way async fan-out to a 20 ms branch, 32 requests in
    # flight, (branches, parents) -> req/s.
    fan = fan_out(branch_ms=20.0, calls=3)
    for branches, by_parents in (
        (3, (47, 53, 53, 53)),
        (6, (45, 85, 100, 100)),
        (12, (46, 83, 153, 187)),
    ):
        for parents, rps in zip((1, 2, 4, 8), by_parents, strict=True):
            rows.append(
                (
                    fan,
                    Measured(
                        f"fan-out, {branches} branch instances",
                        f"{parents} parents",
                        {"bls": parents, "leaf": branches},
                        "bls",
                        (float(rps),),
                        rows_per_request=1,
                    ),
                )
            )
    return rows


def simulated_rps(pipeline: Pipeline, row: Measured, seconds: float = 10.0) -> float:
    """Requests a second the configuration serves under the row's closed loop."""
    sim = Simulation(pipeline, row.counts, rows_per_request=row.rows_per_request)
    sim.closed_loop(row.entry, row.clients)
    sim.run_until(1.0)
    before = sim.counters()[row.entry].success
    sim.run_until(1.0 + seconds)
    return (sim.counters()[row.entry].success - before) / seconds


def table() -> str:
    lines = [
        "| measured in | configuration | measured req/s (runs) | simulated req/s | simulated / measured |",
        "|---|---|---|---|---|",
    ]
    groups: dict[str, list[tuple[Measured, float]]] = {}
    for pipeline, row in measured_rows():
        rps = simulated_rps(pipeline, row)
        groups.setdefault(row.group, []).append((row, rps))
        runs = ", ".join(f"{value:g}" for value in row.measured_rps)
        lines.append(
            f"| {row.group} | {row.label} | {row.mean_rps:.1f} ({runs}) | {rps:.1f} | "
            f"{rps / row.mean_rps:.2f} |"
        )
    lines.append("")
    close = sum(
        abs(rps / row.mean_rps - 1) <= CLOSE for members in groups.values() for row, rps in members
    )
    total = sum(len(members) for members in groups.values())
    lines.append(f"Within {CLOSE:.0%} of the measured mean: {close} of {total}.")
    for group, members in groups.items():
        if len(members) < 2:
            continue
        by_measured = [r.label for r, _ in sorted(members, key=lambda m: -m[0].mean_rps)]
        by_simulated = [r.label for r, _ in sorted(members, key=lambda m: -m[1])]
        same = "same" if by_measured[:2] == by_simulated[:2] else "differ"
        lines.append(
            f"- {group}: measured top two {', '.join(by_measured[:2])}; simulated "
            f"{', '.join(by_simulated[:2])} ({same})"
        )
    return "\n".join(lines)


def main() -> int:
    print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
