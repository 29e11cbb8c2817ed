"""The operator's local driver against the best static configuration, under the same load.

    python -m loadtests.bench.operator_vs_static                      # full, about six minutes
    python -m loadtests.bench.operator_vs_static --budget 8           # another total
    python -m loadtests.bench.operator_vs_static --root chain_async   # another pipeline
    python -m loadtests.bench.operator_vs_static --quick              # tiny (CI)

The pipeline is a root model and the models it calls: `--root` (default pipeline_async),
its callees read from its spec's `calls` (operator/examples/, common.pipeline_models), so
that the benchmark, the policy file it writes and the operator see one pipeline. A root takes
FEATURES rows, as pipeline_async, chain_async and fanout_async do.

One closed-loop load (32 requests of 8 rows in flight) runs from the sweep's first window
to the recheck's last and never pauses: every count changes under it, and a window is a span
of its completions (common.SteadyClosedLoop), as users' traffic keeps coming between two
measurements.

1. Sweep, like Model Analyzer: every instance count of the root and its callees (each at
   least 1) that uses the whole budget, each set under the running load
   and measured on it after a settling span; the best throughput is the bar.
2. Every model back at 1 (under the load: the backlog is the load step), then `tritonscale
   tune` (the local driver, a subprocess, policies written here with short windows):
   throughput window by window as a fraction of the best static one, the time to reach 95 %
   of it, the instances held; then a low load (the same loop at 1 in flight), and the
   instances left after it.
3. The sweep's leading configurations (within 10 % of its best) measured again in the same
   windows as the driver's run (common.best_static_rechecked): the sweep's best is the
   highest of many short samples, and near ties swap places between runs, so the operator's
   steady state is held to the best of these (`operator_vs_best_static_rechecked`), with
   whether it ended on that configuration or one within 2 % of it (`best_static_splits`,
   common.best_splits: the goal's own tolerance) and when it first held one.
4. Before the low load, the operator running and stopped in turns on the counts it holds
   (common.tuner_against_its_split): with the recheck's rounds, both sides of every ratio
   are measured in turns (`operator_vs_best_static_interleaved`), so a machine's drift
   between the operator's windows and the recheck's does not decide the comparison.

Requests carry 8 rows: with one, the dynamic batcher packs 32 of pipeline_async's into one
execute and the two CPU cores, not the instance counts, set the pace (async_vs_sync shows it).
The JSON's contract: `budget`, `best_static_rps`, `operator_rps` (the mean of the last three
windows under the high load), `seconds_to_95pct` (from the load step; None when never) and
`max_total_instances` (the most the driver held at any time). `--budget` sets the sweep's
total and goes into the policy file as every policy's `spec.budget` (one budget shared by the
pipeline's models, allocated jointly by the local driver); `budget_enforced` and `budget_note`
say so. `root` and `models` say which pipeline ran.
Result: reports/bench/operator_vs_static.json (+ .png).
"""

from __future__ import annotations

import itertools
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from loadtests.bench import common

DEFAULT_ROOT = "pipeline_async"
# The budget the pipeline's models share (`--budget` instances per pod): every policy of the
# file names it in `spec.budget`, and the local driver grants their decisions jointly.
BUDGET_NAME = "pipeline"
BUDGET_ENFORCED = True
BUDGET_NOTE = (
    "enforced: every policy carries spec.budget (the models share instancesPerPod = budget), "
    "and the local driver grants their decisions jointly"
)


def budget_block(total: int) -> dict[str, Any]:
    """The `spec.budget` of each policy: one budget of `total` instances per pod."""
    return {"name": BUDGET_NAME, "instancesPerPod": total}


# The share of the best static throughput the operator must reach, and how soon.
TARGET_FRACTION = 0.95
WITHIN_S = 60.0
QUICK = {
    "budget": 4,
    "concurrency": 4,
    "rows": 8,
    "static_seconds": 1.0,
    "warmup_s": 0.3,
    "window_s": 1.0,
    "operator_seconds": 6.0,
    "low_concurrency": 1,
    "low_seconds": 3.0,
    "interval_s": 1,
    "metrics_window_s": 2,
    "scale_down_window_s": 2,
    "recheck_s": 2.0,
    "tuner_s": 8.0,
}
FULL = {
    "budget": 7,
    "concurrency": 32,
    "rows": 8,
    "static_seconds": 4.0,
    "warmup_s": 1.0,
    "window_s": 2.0,
    "operator_seconds": 90.0,
    "low_concurrency": 1,
    "low_seconds": 30.0,
    "interval_s": 2,
    "metrics_window_s": 6,
    "scale_down_window_s": 15,
    "recheck_s": 16.0,
    "tuner_s": 32.0,
}


def static_configurations(budget: int, models: Sequence[str]) -> list[dict[str, int]]:
    """Every count of the models, each >= 1, summing to the budget."""
    most = budget - (len(models) - 1)
    return [
        dict(zip(models, counts, strict=True))
        for counts in itertools.product(range(1, most + 1), repeat=len(models))
        if sum(counts) == budget
    ]


def sweep(
    load: common.SteadyClosedLoop,
    instances: common.Instances,
    settings: dict,
    models: Sequence[str],
) -> list[dict[str, Any]]:
    """Every configuration of the budget, set under the running load and measured on it."""
    configurations = static_configurations(settings["budget"], models)
    common.progress(
        f"static sweep: {len(configurations)} configurations of {settings['budget']} instances"
    )
    rows = []
    for index, counts in enumerate(configurations, start=1):
        instances.set(counts)
        m = common.steady_window(load, settings)
        rows.append({"instances": counts, **m.to_dict()})
        common.progress(
            f"  [{index}/{len(configurations)}] {counts}: {m.throughput_rps:.1f} rps, "
            f"p95 {m.p95_ms or 0:.0f} ms"
        )
    return rows


def policies(
    triton: Any,
    settings: dict,
    models: Sequence[str],
    calls: Mapping[str, Sequence[str]],
) -> dict[str, Any]:
    """The local driver's policy file: short windows, each model bounded to what the budget
    leaves when every other model holds one instance; `calls`: the models each BLS model
    calls (for one pipeline, {root: its callees}).

    Every policy carries the budget (`spec.budget`); whether the total stayed within it is
    measured (`within_budget`) too.
    """
    short = {
        "minInstances": 1,
        "maxInstances": settings["budget"] - (len(models) - 1),
        "metricsWindowSeconds": settings["metrics_window_s"],
        "intervalSeconds": settings["interval_s"],
        "behavior": {
            "scaleUp": {
                "stabilizationWindowSeconds": 0,
                "policies": [
                    {"type": "Instances", "value": 2, "periodSeconds": settings["interval_s"]}
                ],
            },
            "scaleDown": {
                "stabilizationWindowSeconds": settings["scale_down_window_s"],
                "policies": [
                    {"type": "Instances", "value": 1, "periodSeconds": settings["interval_s"]}
                ],
            },
        },
    }
    return {
        "triton": {"http": [triton.http_url], "metrics": [triton.metrics_url]},
        "metrics": {"source": "scrape"},
        "policies": [
            {
                "name": model.replace("_", "-"),
                "spec": {
                    **short,
                    "model": model,
                    "budget": budget_block(settings["budget"]),
                    **({"calls": list(calls[model])} if model in calls else {}),
                },
            }
            for model in models
        ],
    }


def with_operator(
    triton: Any,
    load: common.SteadyClosedLoop,
    instances: common.Instances,
    settings: dict,
    best_rps: float,
    models: Sequence[str],
) -> dict:
    instances.set(dict.fromkeys(models, 1))
    with tempfile.TemporaryDirectory(prefix="bench-tune-") as folder:
        config = Path(folder) / "policies.yaml"
        policy_file = policies(triton, settings, models, {models[0]: models[1:]})
        config.write_text(yaml.safe_dump(policy_file, sort_keys=False))
        log = Path(folder) / "decisions.jsonl"
        output = Path(folder) / "tune.out"
        common.progress("operator: every model at 1, tritonscale tune running, same load")
        tune = common.start_tune(triton, config, log, output)
        started = time.monotonic()
        try:
            high = common.closed_loop_windows(
                load, instances, settings, settings["operator_seconds"], started, tune,
                "high load", models,
            )  # fmt: skip
            common.progress("operator: running and stopped in turns, on the counts it holds")
            against_its_split = common.tuner_against_its_split(
                load, instances, settings, tune, models, settings["tuner_s"]
            )
            common.progress(f"operator: low load ({settings['low_concurrency']} in flight)")
            load.set_concurrency(settings["low_concurrency"])
            low = common.closed_loop_windows(
                load, instances, settings, settings["low_seconds"], started, tune, "low load",
                models,
            )  # fmt: skip
            load.set_concurrency(settings["concurrency"])
        finally:
            common.stop_tune(tune)
        decision_log, decisions = common.read_decisions(log)
        tune_tail = output.read_text().strip().splitlines()[-3:]
    target = TARGET_FRACTION * best_rps
    reached = next((w for w in high if w["throughput_rps"] >= target), None)
    tail = high[-3:] if len(high) >= 3 else high
    tail_rps = sum(w["throughput_rps"] for w in tail) / len(tail) if tail else 0.0
    return {
        "policy_file": policy_file,
        "timeline": high + low,
        "throughput_rps": round(tail_rps, 2),
        "throughput_fraction_of_best_static": common.ratio(tail_rps, best_rps),
        # A window's time is its end: the load step is at 0.
        "seconds_to_95pct": reached["t_s"] if reached else None,
        "instances_at_end_of_high_load": high[-1]["instances"] if high else None,
        "total_instances_at_end_of_high_load": high[-1]["total_instances"] if high else None,
        "max_total_instances": max((w["total_instances"] for w in high + low), default=None),
        "instances_at_end_of_low_load": low[-1]["instances"] if low else None,
        "total_instances_at_end_of_low_load": low[-1]["total_instances"] if low else None,
        "decisions": len(decisions),
        "scale_changes": sum(
            1 for d in decisions for pod in d.get("applied") or () if pod.get("ok")
        ),
        "against_its_split": against_its_split,
        "tune_output_tail": tune_tail,
        "decision_log": decision_log,
    }


def run(triton: Any, settings: dict) -> dict[str, Any]:
    """The benchmark on `triton`, for the pipeline of `settings["root"]` (default
    DEFAULT_ROOT): the root and the models its spec calls (common.pipeline_models)."""
    models = common.pipeline_models(settings.get("root", DEFAULT_ROOT))
    if settings["budget"] < len(models):
        raise SystemExit(
            f"bench: a budget of {settings['budget']} cannot give each of {len(models)} models "
            "one instance"
        )
    with common.emulated_costs(triton, settings.get("costs", {})):
        return _run(triton, settings, models)


def _run(triton: Any, settings: dict, models: Sequence[str]) -> dict[str, Any]:
    instances = common.Instances(triton)
    # One load from the sweep's first window to the recheck's last: the counts change under it.
    load = common.steady_load(triton, models[0], settings).start()
    try:
        static = sweep(load, instances, settings, models)
        best = max(static, key=lambda row: row["throughput_rps"])
        common.progress(f"best static: {best['instances']} at {best['throughput_rps']:.1f} rps")
        operator = with_operator(triton, load, instances, settings, best["throughput_rps"], models)
        common.progress("the leading static configurations again, in the operator's windows")
        rechecked = common.best_static_rechecked(
            load,
            instances,
            settings,
            [(row["instances"], row["throughput_rps"]) for row in static],
            models,
            held=operator["against_its_split"]["instances"],
        )
    finally:
        load.stop()
        instances.restore()
    operator["within_budget"] = (
        operator["max_total_instances"] is not None
        and operator["max_total_instances"] <= settings["budget"]
    )
    reached = operator["seconds_to_95pct"]
    return {
        "budget": settings["budget"],
        "budget_enforced": BUDGET_ENFORCED,
        "budget_note": BUDGET_NOTE,
        "best_static_rps": best["throughput_rps"],
        "operator_rps": operator["throughput_rps"],
        "seconds_to_95pct": reached,
        "reached_95pct_within_60s": reached is not None and reached <= WITHIN_S,
        "max_total_instances": operator["max_total_instances"],
        "within_budget": operator["within_budget"],
        # The benchmark's own count changes, each under the running load (seconds each).
        "instance_change_seconds_max": round(max(instances.change_seconds, default=0.0), 2),
        "settings": settings,
        "root": models[0],
        "models": list(models),
        "static_sweep": static,
        "best_static": {
            "instances": best["instances"],
            "throughput_rps": best["throughput_rps"],
            "p95_ms": best["p95_ms"],
        },
        # The leading configurations measured again in the operator's windows: the fair bar.
        "best_static_rechecked": rechecked,
        "operator_vs_best_static_rechecked": common.ratio(
            operator["throughput_rps"], rechecked["throughput_rps"]
        ),
        # The splits that serve as much as the best measured again (common.best_splits).
        "best_static_splits": common.best_splits(rechecked),
        "operator_ends_at_best_static": operator["instances_at_end_of_high_load"]
        in common.best_splits(rechecked),
        # Both sides of each ratio measured in turns: the operator against the counts it
        # holds without it, and those counts against the best in the recheck's rounds.
        "operator_vs_best_static_interleaved": common.tuner_vs_best(
            operator["against_its_split"], rechecked
        ),
        # From the load step until the operator first held that configuration.
        "seconds_to_best_static_configuration": common.first_held(
            operator["timeline"], "high load", common.best_splits(rechecked), 0.0
        ),
        "operator": operator,
    }


def plot(result: dict, path: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timeline = result["operator"]["timeline"]
    figure, axes = plt.subplots(figsize=(9, 4))
    times = [w["t_s"] for w in timeline]
    axes.plot(times, [w["throughput_rps"] for w in timeline], "o-", label="with tritonscale tune")
    axes.axhline(
        result["best_static"]["throughput_rps"], color="green", linestyle="--", label="best static"
    )
    axes.set_xlabel("seconds since the driver started")
    axes.set_ylabel(f"{result['root']} requests/s")
    twin = axes.twinx()
    twin.step(
        times,
        [w["total_instances"] for w in timeline],
        where="post",
        color="grey",
        label="total instances",
    )
    twin.axhline(result["settings"]["budget"], color="grey", linestyle=":", label="budget")
    twin.set_ylabel("instances")
    axes.legend(loc="upper left")
    twin.legend(loc="lower right")
    axes.set_title("Operator vs best static configuration")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


def main(argv: list[str] | None = None) -> None:
    args, settings = common.budget_arguments(
        __doc__.splitlines()[0],
        "Total instances over the pipeline's models (at least one each; default 7, 4 with --quick)",
        None,
        QUICK,
        FULL,
        argv,
        default_root=DEFAULT_ROOT,
    )
    with common.local_triton(list(common.pipeline_models(settings["root"]))) as triton:
        result = run(triton, settings)
    decision_log = result["operator"].pop("decision_log")
    common.write_outputs("operator_vs_static", result, args, plot, decision_log)
    op = result["operator"]
    common.progress(
        f"operator {result['operator_rps']} rps against the best static "
        f"{result['best_static_rps']} ({op['throughput_fraction_of_best_static']}; "
        f"{result['operator_vs_best_static_rechecked']} of it measured again in the operator's "
        f"windows, {result['operator_vs_best_static_interleaved']} in turns; ends on it: "
        f"{result['operator_ends_at_best_static']}), 95 % after "
        f"{result['seconds_to_95pct']} s, at most {result['max_total_instances']} instances "
        f"(budget {result['budget']}); {op['total_instances_at_end_of_low_load']} after low load"
    )


if __name__ == "__main__":
    main()
