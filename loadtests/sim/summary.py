"""The summary of a run over many scenarios: one JSON and one PNG.

    share_of_phases_at_098_of_best   phases whose configuration held at the end serves at
                                     least 0.98 of that phase's best static configuration
    budget_overruns                  ticks, over all scenarios, at which the counts asked for
                                     or held exceeded the budget
    steady_reversals                 reversals in phases of constant load (and the reasons
                                     of the changes that reversed, where the controller says)
    seconds                          wall-clock seconds the run took
    generated_scenarios              scenarios on generated pipelines (families `generated_*`)
    generated_share_of_phases_at_098_of_best
                                     the share above, of their phases only; and
                                     `ours_share_of_phases_at_098_of_best` of the others'
    generated_by_shape               of the generated phases, per trait of the pipeline (depth,
                                     conditional calls, a child shared by two roots...): how
                                     many and their share at 0.98 of the best

and per family the same, the mean served ratio (measured served rate over the best static's),
of the phases whose first configuration served less than 0.98 of the best how many got there
and the median seconds it took, the same for the first hold of the best static configuration
(or one that serves as much: the real benchmarks' `first_held`), and instance-seconds against
the best's.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

GENERATED = "generated_"  # the families on generated pipelines (loadtests.sim.scenarios)


def summarize(rows: Sequence[dict], controller: str, seconds: float) -> dict[str, Any]:
    """The JSON document: totals, per family, and every scenario's row."""
    families: dict[str, list[dict]] = {}
    for row in rows:
        families.setdefault(row["family"], []).append(row)
    generated = [row for row in rows if row["family"].startswith(GENERATED)]
    ours = [row for row in rows if not row["family"].startswith(GENERATED)]
    return {
        "controller": controller,
        **_totals(rows),
        "seconds": round(seconds, 1),
        "generated_scenarios": len(generated),
        "generated_share_of_phases_at_098_of_best": _share(
            p["at_098_of_best"] for row in generated for p in row["phases"]
        ),
        "ours_share_of_phases_at_098_of_best": _share(
            p["at_098_of_best"] for row in ours for p in row["phases"]
        ),
        "generated_by_shape": _by_shape(generated),
        "families": {name: _totals(members) for name, members in families.items()},
        "rows": list(rows),
    }


def _by_shape(rows: Sequence[dict]) -> dict[str, dict[str, Any]]:
    """Per trait and value of the generated pipelines (`depth=2`, `conditional=True`...): the
    phases and their share at 0.98 of the best."""
    groups: dict[str, list[bool]] = {}
    for row in rows:
        for trait, value in row.get("shape", {}).items():
            flags = groups.setdefault(f"{trait}={value}", [])
            flags.extend(p["at_098_of_best"] for p in row["phases"])
    return {
        name: {"phases": len(flags), "share_of_phases_at_098_of_best": _share(flags)}
        for name, flags in sorted(groups.items())
    }


def _totals(rows: Sequence[dict]) -> dict[str, Any]:
    phases = [phase for row in rows for phase in row["phases"]]
    # The phases whose first configuration was not good enough: how long the controller took.
    reached = [
        p["seconds_to_098"]
        for p in phases
        if p["seconds_to_098"] is not None and not p["started_at_098"]
    ]
    behind = [p for p in phases if not p["started_at_098"]]
    # The same for the first hold of the best (or its equal), of the phases that began without.
    not_best = [p for p in phases if p["seconds_to_best"] != 0.0]
    held_best = [p["seconds_to_best"] for p in not_best if p["seconds_to_best"] is not None]
    ratios = [p["served_ratio"] for p in phases if p["served_ratio"] is not None]
    instance_seconds = sum(p["instance_seconds"] for p in phases)
    best_instance_seconds = sum(p["best_instance_seconds"] for p in phases)
    return {
        "scenarios": len(rows),
        "phases": len(phases),
        "share_of_phases_at_098_of_best": _share(p["at_098_of_best"] for p in phases),
        "mean_served_ratio": round(statistics.fmean(ratios), 4) if ratios else None,
        "phases_started_below_098": len(behind),
        "share_of_those_reaching_098": _share(p["seconds_to_098"] is not None for p in behind),
        "median_seconds_to_098": statistics.median(reached) if reached else None,
        "phases_started_below_best": len(not_best),
        "share_of_those_holding_best": _share(p["seconds_to_best"] is not None for p in not_best),
        "median_seconds_to_best": statistics.median(held_best) if held_best else None,
        "budget_overruns": sum(p["budget_overruns"] for p in phases),
        "steady_reversals": sum(p["reversals"] for p in phases if p["steady"]),
        "reversals": sum(p["reversals"] for p in phases),
        "steady_reversal_reasons": dict(
            sum((Counter(p["reversal_reasons"]) for p in phases if p["steady"]), Counter())
        ),
        "instance_seconds": round(instance_seconds, 1),
        "instance_seconds_over_best": (
            round(instance_seconds / best_instance_seconds, 4) if best_instance_seconds else None
        ),
    }


def _share(flags: Iterable[bool]) -> float | None:
    flags = list(flags)
    return round(sum(flags) / len(flags), 4) if flags else None


def plot(summary: dict[str, Any], path: Path) -> None:
    """Four panels: share at 0.98 per family, served ratios, seconds to 0.98, reversals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = summary["families"]
    names = list(families)
    phases = [phase for row in summary["rows"] for phase in row["phases"]]
    figure, axes = plt.subplots(2, 2, figsize=(13, 9))
    share = axes[0][0]
    share.bar(names, [families[n]["share_of_phases_at_098_of_best"] or 0 for n in names])
    share.set_ylim(0, 1.05)
    share.set_title("phases ending at >= 0.98 of the best static configuration")
    _family_labels(share, names)

    ratios = axes[0][1]
    ratios.hist([p["served_ratio"] for p in phases if p["served_ratio"] is not None], bins=40)
    ratios.axvline(0.98, color="black", linestyle="--", linewidth=1)
    ratios.set_title("served rate over the best static's, per phase")

    reach = axes[1][0]
    reach.hist(
        [p["seconds_to_098"] for p in phases if p["seconds_to_098"] and not p["started_at_098"]],
        bins=30,
    )
    reach.set_title("seconds until a configuration at >= 0.98 of the best was held")

    flips = axes[1][1]
    flips.bar(names, [families[n]["steady_reversals"] for n in names], label="steady reversals")
    flips.bar(
        names,
        [families[n]["budget_overruns"] for n in names],
        bottom=[families[n]["steady_reversals"] for n in names],
        label="budget overruns",
    )
    most = max(families[n]["steady_reversals"] + families[n]["budget_overruns"] for n in names)
    flips.set_ylim(0, max(most, 1) * 1.1)  # a zero axis, also where there is none of either
    flips.legend()
    flips.set_title(
        f"steady reversals ({summary['steady_reversals']}) "
        f"and budget overruns ({summary['budget_overruns']})"
    )
    _family_labels(flips, names)

    figure.suptitle(
        f"controller {summary['controller']}: {summary['scenarios']} scenarios, "
        f"{summary['phases']} phases, {summary['share_of_phases_at_098_of_best']:.0%} at 0.98 of best"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _family_labels(axis: Any, names: list[str]) -> None:
    """Slanted labels anchored at their bars' right ends: with 16 families, centred ones sit
    under the next bar."""
    axis.set_xticks(range(len(names)))
    axis.set_xticklabels(names, rotation=40, ha="right", rotation_mode="anchor", fontsize=8)
