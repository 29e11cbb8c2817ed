"""A shifted mix: the traffic moves from pipeline_async to pipeline_sync halfway through.

    python -m loadtests.bench.shifted_mix              # full, about eight minutes
    python -m loadtests.bench.shifted_mix --budget 8   # another total
    python -m loadtests.bench.shifted_mix --quick      # tiny (CI)

The two pipelines share the pods and their three branches; the sync twin pays the branches'
times one after another, so it needs more parent instances for the same throughput, while
the async one needs its branches. No static configuration is best for both halves.

One closed-loop load (32 requests of 8 rows in flight) runs from the sweep's first window to
the recheck's last and never pauses (common.SteadyClosedLoop); what moves is the model its
requests go to. Every count changes under it.

1. Sweep: every count of the five models (each at least 1) that uses the whole budget, set
   under the running load and measured with the load on pipeline_async (the first half's
   mix) and then on pipeline_sync (the second's), each after a settling span.
2. Every model back at 1, then `tritonscale tune` (the local driver, policies with short
   windows) under the first half's load, then the second's: throughput window by window.
3. The operator (mean of the last three windows of each half) against the best static
   configuration of each half, and against the first half's best kept through both; the time
   after the shift until it reached 95 % of the second half's best.
4. Each half's leading static configurations measured again in the operator's windows
   (common.best_static_rechecked), the fairer bar: the operator against the best of them,
   whether it ended the half on that configuration, and when it first held it. At each
   half's end the operator runs and stops in turns on the counts it holds, so that both sides
   of the comparison are measured in turns (`operator_vs_best_static_interleaved`,
   common.tuner_vs_best).

Every policy carries the budget (`spec.budget`, operator_vs_static.budget_block): the local
driver grants the five models' decisions jointly, and the total it held is measured against it.
Result: reports/bench/shifted_mix.json (+ .png).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from loadtests.bench import common
from loadtests.bench.operator_vs_static import (
    BUDGET_ENFORCED,
    BUDGET_NOTE,
    TARGET_FRACTION,
    policies,
    static_configurations,
)

FIRST, SECOND = "pipeline_async", "pipeline_sync"
# What each root calls, as its spec says (operator/examples/): the same three branches.
CALLS = {root: common.pipeline_models(root)[1:] for root in (FIRST, SECOND)}
MODELS = (FIRST, SECOND, *dict.fromkeys(CALLS[FIRST] + CALLS[SECOND]))
QUICK = {
    "budget": 5,
    "concurrency": 4,
    "rows": 8,
    "static_seconds": 1.0,
    "warmup_s": 0.3,
    "window_s": 1.0,
    "half_seconds": 5.0,
    "interval_s": 1,
    "metrics_window_s": 2,
    "scale_down_window_s": 2,
    "recheck_s": 2.0,
    "tuner_s": 4.0,
}
FULL = {
    "budget": 7,
    "concurrency": 32,
    "rows": 8,
    "static_seconds": 4.0,
    "warmup_s": 1.0,
    "window_s": 2.0,
    "half_seconds": 90.0,
    "interval_s": 2,
    "metrics_window_s": 6,
    "scale_down_window_s": 15,
    "recheck_s": 16.0,
    "tuner_s": 32.0,
}


def sweep(
    load: common.SteadyClosedLoop, instances: common.Instances, settings: dict
) -> list[dict[str, Any]]:
    """Every configuration of the budget, set under the running load and measured on it with
    the load on each half's root in turn (the mix moves, the load never stops)."""
    configurations = static_configurations(settings["budget"], MODELS)
    common.progress(
        f"static sweep: {len(configurations)} configurations of {settings['budget']} instances, "
        "each under both halves' loads"
    )
    rows = []
    for index, counts in enumerate(configurations, start=1):
        instances.set(counts)
        halves = []
        for model in (FIRST, SECOND):
            load.set_model(model)
            halves.append(common.steady_window(load, settings))
        first, second = halves
        rows.append({"instances": counts, "first": first.to_dict(), "second": second.to_dict()})
        common.progress(
            f"  [{index}/{len(configurations)}] {counts}: {FIRST} {first.throughput_rps:.1f} rps, "
            f"{SECOND} {second.throughput_rps:.1f} rps"
        )
    return rows


def with_operator(
    triton: Any, load: common.SteadyClosedLoop, instances: common.Instances, settings: dict
) -> dict[str, Any]:
    load.set_model(FIRST)
    instances.set(dict.fromkeys(MODELS, 1))
    with tempfile.TemporaryDirectory(prefix="bench-tune-") as folder:
        config = Path(folder) / "policies.yaml"
        config.write_text(
            yaml.safe_dump(policies(triton, settings, MODELS, CALLS), sort_keys=False)
        )
        log = Path(folder) / "decisions.jsonl"
        output = Path(folder) / "tune.out"
        common.progress(f"operator: every model at 1, tritonscale tune running, load on {FIRST}")
        tune = common.start_tune(triton, config, log, output)
        started = time.monotonic()
        try:
            first = common.closed_loop_windows(
                load, instances, settings, settings["half_seconds"], started, tune,
                "first half", MODELS,
            )  # fmt: skip
            first_against_its_split = common.tuner_against_its_split(
                load, instances, settings, tune, MODELS, settings["tuner_s"]
            )
            shifted_at = time.monotonic() - started
            common.progress(f"operator: the load moves to {SECOND}")
            load.set_model(SECOND)
            second = common.closed_loop_windows(
                load, instances, settings, settings["half_seconds"], started, tune,
                "second half", MODELS,
            )  # fmt: skip
            second_against_its_split = common.tuner_against_its_split(
                load, instances, settings, tune, MODELS, settings["tuner_s"]
            )
        finally:
            common.stop_tune(tune)
        decision_log, decisions = common.read_decisions(log)
        tune_tail = output.read_text().strip().splitlines()[-3:]
    return {
        "timeline": first + second,
        "shifted_at_s": round(shifted_at, 2),
        "first_rps": _tail_rps(first),
        "second_rps": _tail_rps(second),
        "instances_at_end_of_first_half": first[-1]["instances"] if first else None,
        "instances_at_end_of_second_half": second[-1]["instances"] if second else None,
        "max_total_instances": max((w["total_instances"] for w in first + second), default=None),
        "decisions": len(decisions),
        "decision_log": decision_log,
        "scale_changes": sum(
            1 for d in decisions for pod in d.get("applied") or () if pod.get("ok")
        ),
        "tune_output_tail": tune_tail,
        # Each half's end: the operator running and stopped in turns on the counts it holds.
        "against_its_split": {
            "first_half": first_against_its_split,
            "second_half": second_against_its_split,
        },
    }


def _tail_rps(windows: list[dict[str, Any]]) -> float | None:
    tail = windows[-3:]
    return round(sum(w["throughput_rps"] for w in tail) / len(tail), 2) if tail else None


def _static(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "instances": row["instances"],
        "first_rps": row["first"]["throughput_rps"],
        "second_rps": row["second"]["throughput_rps"],
    }


def run(triton: Any, settings: dict) -> dict[str, Any]:
    with common.emulated_costs(triton, settings.get("costs", {})):
        return _run(triton, settings)


def _run(triton: Any, settings: dict) -> dict[str, Any]:
    instances = common.Instances(triton)
    # One load from the sweep's first window to the recheck's last; only its model moves.
    load = common.steady_load(triton, FIRST, settings).start()
    try:
        static = sweep(load, instances, settings)
        best_first = max(static, key=lambda row: row["first"]["throughput_rps"])
        best_second = max(static, key=lambda row: row["second"]["throughput_rps"])
        # The configuration with the best mean over the run, had one been picked for both.
        best_both = max(
            static,
            key=lambda row: row["first"]["throughput_rps"] + row["second"]["throughput_rps"],
        )
        common.progress(
            f"best static for {FIRST}: {best_first['instances']}; for {SECOND}: "
            f"{best_second['instances']}"
        )
        operator = with_operator(triton, load, instances, settings)
        common.progress("the leading static configurations again, in the operator's windows")
        rechecked = {}
        for half, key, model in (
            ("first_half", "first", FIRST),
            ("second_half", "second", SECOND),
        ):
            load.set_model(model)
            rechecked[half] = common.best_static_rechecked(
                load,
                instances,
                settings,
                [(row["instances"], row[key]["throughput_rps"]) for row in static],
                MODELS,
                held=operator["against_its_split"][half]["instances"],
            )
    finally:
        load.stop()
        instances.restore()
    best_second_rps = best_second["second"]["throughput_rps"]
    target = TARGET_FRACTION * best_second_rps
    shifted = operator["shifted_at_s"]
    reached = next(
        (
            w["t_s"] - shifted
            for w in operator["timeline"]
            if w["phase"] == "second half" and w["throughput_rps"] >= target
        ),
        None,
    )
    return {
        "budget": settings["budget"],
        "budget_enforced": BUDGET_ENFORCED,
        "budget_note": BUDGET_NOTE,
        "settings": settings,
        "models": list(MODELS),
        "halves": [FIRST, SECOND],
        "static_sweep": static,
        "best_static_first_half": _static(best_first),
        "best_static_second_half": _static(best_second),
        "best_static_over_both": _static(best_both),
        "one_configuration_best_for_both": best_first["instances"] == best_second["instances"],
        "operator": operator,
        "operator_vs_best_static": {
            "first_half": common.ratio(
                operator["first_rps"], best_first["first"]["throughput_rps"]
            ),
            "second_half": common.ratio(operator["second_rps"], best_second_rps),
        },
        # The same configurations measured again in the operator's windows (the fair bar).
        "best_static_rechecked": rechecked,
        "operator_vs_best_static_rechecked": {
            "first_half": common.ratio(
                operator["first_rps"], rechecked["first_half"]["throughput_rps"]
            ),
            "second_half": common.ratio(
                operator["second_rps"], rechecked["second_half"]["throughput_rps"]
            ),
        },
        # Both sides of each ratio measured in turns (common.tuner_vs_best).
        "operator_vs_best_static_interleaved": {
            half: common.tuner_vs_best(operator["against_its_split"][half], rechecked[half])
            for half in ("first_half", "second_half")
        },
        # Each half's splits that serve as much as its best measured again (common.best_splits).
        "best_static_splits": {
            half: common.best_splits(rechecked[half]) for half in ("first_half", "second_half")
        },
        "operator_ends_at_best_static": {
            "first_half": operator["instances_at_end_of_first_half"]
            in common.best_splits(rechecked["first_half"]),
            "second_half": operator["instances_at_end_of_second_half"]
            in common.best_splits(rechecked["second_half"]),
        },
        # From each half's start until the operator first held that half's best configuration
        # (as measured again).
        "seconds_to_best_static_configuration": {
            "first_half": common.first_held(
                operator["timeline"], "first half", common.best_splits(rechecked["first_half"]), 0.0
            ),
            "second_half": common.first_held(
                operator["timeline"],
                "second half",
                common.best_splits(rechecked["second_half"]),
                shifted,
            ),
        },
        "operator_vs_first_half_best_kept": {
            "first_half": common.ratio(
                operator["first_rps"], best_first["first"]["throughput_rps"]
            ),
            "second_half": common.ratio(
                operator["second_rps"], best_first["second"]["throughput_rps"]
            ),
        },
        "seconds_after_shift_to_95pct_of_second_best": None
        if reached is None
        else round(reached, 2),
    }


def plot(result: dict, path: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    operator = result["operator"]
    timeline = operator["timeline"]
    figure, axes = plt.subplots(figsize=(10, 4.5))
    times = [w["t_s"] for w in timeline]
    axes.plot(times, [w["throughput_rps"] for w in timeline], "o-", label="tritonscale tune")
    shifted = operator["shifted_at_s"]
    end = times[-1] if times else shifted
    for key, style, label in (
        ("best_static_first_half", "--", "best static of the first half"),
        ("best_static_second_half", "-.", "best static of the second half"),
    ):
        row = result[key]
        axes.plot(
            [0, shifted, shifted, end],
            [row["first_rps"], row["first_rps"], row["second_rps"], row["second_rps"]],
            style,
            label=f"{label} {row['instances']}",
        )
    axes.axvline(shifted, color="black", linestyle=":", linewidth=0.8)
    axes.set_xlabel(f"seconds since the load step ({FIRST}, then {SECOND} from the dotted line)")
    axes.set_ylabel("requests/s")
    twin = axes.twinx()
    twin.step(
        times, [w["total_instances"] for w in timeline], where="post", color="grey",
        label="operator's total instances",
    )  # fmt: skip
    twin.axhline(result["budget"], color="grey", linestyle=":", label="budget")
    twin.set_ylabel("instances")
    axes.legend(loc="upper left", fontsize="small")
    twin.legend(loc="lower right", fontsize="small")
    axes.set_title("A shifted mix: the operator against static configurations")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


def main(argv: list[str] | None = None) -> None:
    args, settings = common.budget_arguments(
        __doc__.splitlines()[0],
        f"Total instances over the {len(MODELS)} models (default 7, 5 with --quick)",
        MODELS,
        QUICK,
        FULL,
        argv,
    )
    with common.local_triton(list(MODELS)) as triton:
        result = run(triton, settings)
    decision_log = result["operator"].pop("decision_log")
    common.write_outputs("shifted_mix", result, args, plot, decision_log)
    vs_best, vs_kept = result["operator_vs_best_static"], result["operator_vs_first_half_best_kept"]
    again, held = (
        result["operator_vs_best_static_rechecked"],
        result["operator_ends_at_best_static"],
    )
    turns = result["operator_vs_best_static_interleaved"]
    common.progress(
        f"operator / best static of each half: {vs_best['first_half']}, {vs_best['second_half']} "
        f"(measured again in the operator's windows: {again['first_half']}, "
        f"{again['second_half']}; in turns: {turns['first_half']}, {turns['second_half']}; "
        f"ends on that configuration: {held['first_half']}, "
        f"{held['second_half']}); "
        f"/ the first half's best kept: {vs_kept['second_half']} in the second half; 95 % of the "
        f"second half's best {result['seconds_after_shift_to_95pct_of_second_best']} s after the shift"
    )


if __name__ == "__main__":
    main()
