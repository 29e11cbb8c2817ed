"""The operator's local driver against the best static configuration, under the same load.

    python -m loadtests.bench.operator_vs_static            # full, about six minutes
    python -m loadtests.bench.operator_vs_static --quick    # tiny (CI)

1. Offline sweep, like Model Analyzer: every instance count of pipeline_async and its three
   branches (each at least 1) that uses the whole budget, under one closed-loop load;
   the best throughput is the bar.
2. Every model back at 1, then `tritonscale tune` (the local driver, a subprocess, policies
   written here with short windows and maxInstances = budget - 3 per model) under the same
   load: throughput second by second as a fraction of the best static one, the time to reach
   90 % of it, the instances used; then a low load, and the instances left after it.
The driver's policies are per model: the budget is not one of their inputs, so whether the
total stayed within it is reported, not enforced.
Result: reports/bench/operator_vs_static.json (+ .png).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from loadtests.bench import common

PIPELINE = "pipeline_async"
BRANCHES = ("branch_embed", "branch_classify", "branch_rank")
MODELS = (PIPELINE, *BRANCHES)
QUICK = {
    "budget": 4,
    "concurrency": 4,
    "rows": 1,
    "static_seconds": 1.0,
    "warmup_s": 0.3,
    "window_s": 1.0,
    "operator_seconds": 6.0,
    "low_concurrency": 1,
    "low_seconds": 3.0,
    "interval_s": 1,
    "metrics_window_s": 2,
    "scale_down_window_s": 2,
}
FULL = {
    "budget": 7,
    "concurrency": 32,
    "rows": 1,
    "static_seconds": 4.0,
    "warmup_s": 1.0,
    "window_s": 2.0,
    "operator_seconds": 90.0,
    "low_concurrency": 1,
    "low_seconds": 60.0,
    "interval_s": 2,
    "metrics_window_s": 6,
    "scale_down_window_s": 15,
}


def static_configurations(budget: int) -> list[dict[str, int]]:
    """Every count of the four models, each >= 1, summing to the budget."""
    return [
        dict(zip(MODELS, counts, strict=True))
        for counts in itertools.product(range(1, budget - 2), repeat=len(MODELS))
        if sum(counts) == budget
    ]


def sweep(triton: Any, instances: common.Instances, settings: dict) -> list[dict[str, Any]]:
    configurations = static_configurations(settings["budget"])
    common.progress(
        f"static sweep: {len(configurations)} configurations of {settings['budget']} instances"
    )
    rows = []
    for index, counts in enumerate(configurations, start=1):
        instances.set(counts)
        m = common.measure(
            triton.grpc_url,
            PIPELINE,
            common.pipeline_inputs(settings["rows"]),
            concurrency=settings["concurrency"],
            seconds=settings["static_seconds"],
            warmup_s=settings["warmup_s"],
        )
        rows.append({"instances": counts, **m.to_dict()})
        common.progress(
            f"  [{index}/{len(configurations)}] {counts}: {m.throughput_rps:.1f} rps, "
            f"p95 {m.p95_ms or 0:.0f} ms"
        )
    return rows


def policies(triton: Any, settings: dict) -> dict[str, Any]:
    short = {
        "minInstances": 1,
        "maxInstances": settings["budget"] - (len(MODELS) - 1),
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
                    **({"calls": list(BRANCHES)} if model == PIPELINE else {}),
                },
            }
            for model in MODELS
        ],
    }


def _start_tune(triton: Any, config: Path, log: Path, output: Path) -> subprocess.Popen:
    env = {**os.environ, "TRITONSCALE_REPOSITORY_KEY": triton.repository_key}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tritonscale.cli",
            "tune",
            "--config",
            str(config),
            "--decision-log",
            str(log),
            "--metrics-port",
            "0",
        ],
        stdout=output.open("w"),
        stderr=subprocess.STDOUT,
        env=env,
    )


def _phase(
    triton: Any,
    instances: common.Instances,
    settings: dict,
    concurrency: int,
    seconds: float,
    started: float,
    tune: subprocess.Popen,
    label: str,
) -> list[dict[str, Any]]:
    timeline = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if tune.poll() is not None:
            raise SystemExit(f"bench: tritonscale tune exited with code {tune.returncode}")
        m = common.measure(
            triton.grpc_url,
            PIPELINE,
            common.pipeline_inputs(settings["rows"]),
            concurrency=concurrency,
            seconds=settings["window_s"],
            warmup_s=0.0,
        )
        counts = {model: instances.get(model) for model in MODELS}
        timeline.append(
            {
                "t_s": round(time.monotonic() - started, 2),
                "phase": label,
                "throughput_rps": round(m.throughput_rps, 2),
                "p95_ms": round(m.p95_ms, 2) if m.p95_ms else None,
                "instances": counts,
                "total_instances": sum(counts.values()),
            }
        )
        common.progress(
            f"  {label} t={timeline[-1]['t_s']:.0f}s: {m.throughput_rps:.1f} rps, "
            f"instances {counts}"
        )
    return timeline


def with_operator(
    triton: Any, instances: common.Instances, settings: dict, best_rps: float
) -> dict:
    instances.set(dict.fromkeys(MODELS, 1))
    with tempfile.TemporaryDirectory(prefix="bench-tune-") as folder:
        config = Path(folder) / "policies.yaml"
        config.write_text(yaml.safe_dump(policies(triton, settings), sort_keys=False))
        log = Path(folder) / "decisions.jsonl"
        output = Path(folder) / "tune.out"
        common.progress("operator: every model at 1, tritonscale tune running, same load")
        tune = _start_tune(triton, config, log, output)
        started = time.monotonic()
        try:
            high = _phase(
                triton,
                instances,
                settings,
                settings["concurrency"],
                settings["operator_seconds"],
                started,
                tune,
                "high load",
            )
            common.progress(f"operator: low load ({settings['low_concurrency']} in flight)")
            low = _phase(
                triton,
                instances,
                settings,
                settings["low_concurrency"],
                settings["low_seconds"],
                started,
                tune,
                "low load",
            )
        finally:
            tune.send_signal(signal.SIGTERM)
            try:
                tune.wait(timeout=30)
            except subprocess.TimeoutExpired:
                tune.kill()
        decision_log = log.read_text() if log.exists() else ""
        decisions = [json.loads(line) for line in decision_log.splitlines() if line.strip()]
        tune_tail = output.read_text().strip().splitlines()[-3:]
    target = 0.9 * best_rps
    reached = next((w for w in high if w["throughput_rps"] >= target), None)
    tail = high[-3:] if len(high) >= 3 else high
    tail_rps = sum(w["throughput_rps"] for w in tail) / len(tail) if tail else 0.0
    return {
        "timeline": high + low,
        "throughput_fraction_of_best_static": common.ratio(tail_rps, best_rps),
        "time_to_90pct_of_best_static_s": reached["t_s"] if reached else None,
        "instances_at_end_of_high_load": high[-1]["instances"] if high else None,
        "total_instances_at_end_of_high_load": high[-1]["total_instances"] if high else None,
        "max_total_instances": max((w["total_instances"] for w in high + low), default=None),
        "instances_at_end_of_low_load": low[-1]["instances"] if low else None,
        "total_instances_at_end_of_low_load": low[-1]["total_instances"] if low else None,
        "decisions": len(decisions),
        "scale_changes": sum(
            1 for d in decisions for pod in d.get("applied") or () if pod.get("ok")
        ),
        "tune_output_tail": tune_tail,
        "decision_log": decision_log,
    }


def run(triton: Any, settings: dict) -> dict[str, Any]:
    instances = common.Instances(triton)
    try:
        static = sweep(triton, instances, settings)
        best = max(static, key=lambda row: row["throughput_rps"])
        common.progress(f"best static: {best['instances']} at {best['throughput_rps']:.1f} rps")
        operator = with_operator(triton, instances, settings, best["throughput_rps"])
    finally:
        instances.restore()
    operator["within_budget"] = (
        operator["max_total_instances"] is not None
        and operator["max_total_instances"] <= settings["budget"]
    )
    return {
        "settings": settings,
        "models": list(MODELS),
        "static_sweep": static,
        "best_static": {
            "instances": best["instances"],
            "throughput_rps": best["throughput_rps"],
            "p95_ms": best["p95_ms"],
        },
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
    axes.set_ylabel("pipeline_async requests/s")
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
    args = common.parser(__doc__.splitlines()[0]).parse_args(argv)
    with common.local_triton(list(MODELS)) as triton:
        result = run(triton, QUICK if args.quick else FULL)
    # The driver's own log beside the JSON, for `tritonscale report --decisions`.
    decision_log = result["operator"].pop("decision_log")
    path = common.write_result("operator_vs_static", result, args.out)
    path.with_suffix(".decisions.jsonl").write_text(decision_log)
    if not args.no_plot:
        plot(result, common.plot_path(path))
    op = result["operator"]
    common.progress(
        f"operator reached {op['throughput_fraction_of_best_static']} of the best static "
        f"throughput, 90 % after {op['time_to_90pct_of_best_static_s']} s, "
        f"{op['total_instances_at_end_of_high_load']} instances (budget {result['settings']['budget']}); "
        f"{op['total_instances_at_end_of_low_load']} after low load"
    )


if __name__ == "__main__":
    main()
