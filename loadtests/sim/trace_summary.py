"""The summary of the trace arms over many traces: one JSON and one PNG.

Per arm (static_at_peak, hpa_way, operator, and the limit), over the traces:

    traces_at_098_of_windows        the share of traces in which at least 0.98 of the 10 s
                                    windows met the objective
    median_windows_met_share        the median trace's share of windows met
    median_requests_met_share       ...and of requests within the objective
    median_instance_seconds_over_limit
                                    the median of the arm's instance-seconds over the limit's
                                    on the same trace
    median_goodput_over_static_at_peak, median_goodput_over_hpa_way
                                    the medians of its goodput per instance-second over those
                                    arms' on the same trace

`goals` holds issue 49's for the simulator, judged on the operator's arm: at least 0.98 of
the windows met in at least 0.95 of the traces, and a median instance-seconds at most 1.3
times the limit's. The same per family (`ours`, `generated`), and every trace's row.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ARMS = ("static_at_peak", "hpa_way", "operator", "limit")
WINDOWS_GOAL = 0.98
TRACES_GOAL = 0.95
COST_GOAL = 1.3  # the operator's instance-seconds over the limit's, at most


def _median_ratio(rows: Sequence[dict], arm: str, other: str, key: str) -> float | None:
    ratios = [
        row["arms"][arm][key] / row["arms"][other][key]
        for row in rows
        if row["arms"][arm][key] is not None and row["arms"][other][key]
    ]
    return round(statistics.median(ratios), 4) if ratios else None


def _median(rows: Sequence[dict], arm: str, key: str) -> float | None:
    values = [row["arms"][arm][key] for row in rows if row["arms"][arm][key] is not None]
    return round(statistics.median(values), 4) if values else None


def _arms(rows: Sequence[dict]) -> dict[str, dict[str, Any]]:
    found = {}
    for arm in ARMS:
        met = [(row["arms"][arm]["windows_met_share"] or 0.0) >= WINDOWS_GOAL for row in rows]
        found[arm] = {
            "traces_at_098_of_windows": round(sum(met) / len(met), 4) if met else None,
            "median_windows_met_share": _median(rows, arm, "windows_met_share"),
            "median_requests_met_share": _median(rows, arm, "requests_met_share"),
            "median_instance_seconds_over_limit": _median_ratio(
                rows, arm, "limit", "instance_seconds"
            ),
            "median_goodput_over_static_at_peak": _median_ratio(
                rows, arm, "static_at_peak", "goodput_per_instance_second"
            ),
            "median_goodput_over_hpa_way": _median_ratio(
                rows, arm, "hpa_way", "goodput_per_instance_second"
            ),
        }
    return found


def summarize(rows: Sequence[dict], cpu_seconds: float) -> dict[str, Any]:
    """The JSON document: per arm over every trace, the goals, per family, and the rows."""
    arms = _arms(rows)
    operator = arms["operator"]
    families: dict[str, list[dict]] = {}
    for row in rows:
        families.setdefault(row["family"], []).append(row)
    return {
        "traces": len(rows),
        "cpu_seconds": round(cpu_seconds, 1),
        "arms": arms,
        "goals": {
            "operator_traces_at_098_of_windows": operator["traces_at_098_of_windows"],
            "operator_traces_at_098_of_windows_goal": TRACES_GOAL,
            "operator_median_instance_seconds_over_limit": operator[
                "median_instance_seconds_over_limit"
            ],
            "operator_median_instance_seconds_over_limit_goal": COST_GOAL,
            "met": (operator["traces_at_098_of_windows"] or 0.0) >= TRACES_GOAL
            and (operator["median_instance_seconds_over_limit"] or float("inf")) <= COST_GOAL,
        },
        "families": {
            name: {"traces": len(members), "arms": _arms(members)}
            for name, members in families.items()
        },
        "rows": list(rows),
    }


def plot(result: dict[str, Any], path: Path) -> None:
    """Each trace's windows met against its instance-seconds over the limit's, per arm; and
    the share of traces at or below each cost."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    shown = ("static_at_peak", "hpa_way", "operator")
    figure, (scatter, cost) = plt.subplots(1, 2, figsize=(12, 4.8))
    for arm in shown:
        over = [row["arms"][arm]["instance_seconds"] / row["arms"]["limit"]["instance_seconds"]
                for row in rows]  # fmt: skip
        met = [row["arms"][arm]["windows_met_share"] or 0.0 for row in rows]
        summary = result["arms"][arm]
        scatter.scatter(
            over,
            met,
            s=12,
            alpha=0.6,
            label=f"{arm}: {100 * (summary['traces_at_098_of_windows'] or 0):.0f} % of traces "
            f"at >= 98 % windows, median cost {summary['median_instance_seconds_over_limit']}",
        )
        ordered = sorted(over)
        cost.step(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], label=arm)
    scatter.axhline(WINDOWS_GOAL, color="black", linestyle="--", linewidth=0.8)
    scatter.axvline(COST_GOAL, color="black", linestyle=":", linewidth=0.8)
    scatter.set_xlabel("instance-seconds over the limit's (same trace)")
    scatter.set_ylabel("share of 10 s windows whose p95 met the objective")
    scatter.set_title(f"{result['traces']} simulated days, one point per trace and arm",
                      fontsize="small")  # fmt: skip
    scatter.legend(fontsize="x-small", loc="lower right")
    scatter.grid(alpha=0.3)
    cost.axvline(COST_GOAL, color="black", linestyle=":", linewidth=0.8)
    cost.set_xlabel("instance-seconds over the limit's")
    cost.set_ylabel("share of traces at or below")
    cost.legend(fontsize="small")
    cost.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
