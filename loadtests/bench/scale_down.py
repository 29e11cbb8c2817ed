"""Scale-down: after the load drops, how long until the instances are back at the floor,
with the windows the chart uses by default.

    python -m loadtests.bench.scale_down            # the chart's defaults; about 10 minutes
    python -m loadtests.bench.scale_down --quick    # short windows (CI)

1. A local Triton with pipeline_async and its three branches, and `tritonscale tune` with the
   chart's autoscalers (charts/tritonscale/values.yaml: `autoscalers.defaults`, each entry of
   `autoscalers.models` over them): 15 s ticks, 60 s rates, a 300 s scale-down window and
   one instance less per 60 s at most.
2. An open-loop load at 1.4 times what one instance each serves (pipeline_async, 8 rows per
   request) until the counts have risen and held for a while, then a twentieth of that capacity.
3. From the drop: when each model scaled down, and when the total was back at the floor
   (every model at minInstances), against what the windows allow: at the earliest, the
   scale-down window and then one rate period per further step; at the latest, the rate
   window first (until metricsWindowSeconds after the drop a tick may still read the high
   load and ask for the peak), each term in whole ticks (`allowed_floor_s`).

Result: reports/bench/scale_down.json (+ .png).
"""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from loadtests import chart
from loadtests.bench import common

PIPELINE = "pipeline_async"
MODELS = (PIPELINE, "branch_embed", "branch_classify", "branch_rank")
ROWS = 8
# Multiples of the capacity at one instance each. The low load is light enough for one
# instance each: that capacity is measured with 32 requests in flight, 4 to a batch, and one
# request alone costs a pipeline instance nearly as much as a batch (at a fifth of the
# capacity pipeline_async needs 2 instances, and the floor is never reached).
HIGH_LOAD, LOW_LOAD = 1.4, 0.05

QUICK = {
    "windows": {
        "intervalSeconds": 1,
        "metricsWindowSeconds": 2,
        "behavior": {
            "scaleUp": {"policies": [{"type": "Instances", "value": 2, "periodSeconds": 1}]},
            "scaleDown": {
                "stabilizationWindowSeconds": 4,
                "policies": [{"type": "Instances", "value": 1, "periodSeconds": 1}],
            },
        },
    },
    "capacity_seconds": 2.0,
    "high_max_s": 20.0,
    "high_settle_s": 4.0,
    "low_max_s": 40.0,
    "poll_s": 1.0,
}
FULL = {
    "windows": None,  # the chart's
    "capacity_seconds": 6.0,
    "high_max_s": 240.0,
    "high_settle_s": 45.0,
    "low_max_s": 900.0,
    "poll_s": 5.0,
}


def policy_file(triton: Any, settings: dict) -> dict[str, Any]:
    specs = chart.chart_autoscalers()
    if settings["windows"]:
        specs = {model: {**spec, **settings["windows"]} for model, spec in specs.items()}
    return {
        "triton": {"http": [triton.http_url], "metrics": [triton.metrics_url]},
        "metrics": {"source": "scrape"},
        "policies": [
            {"name": model.replace("_", "-"), "spec": spec}
            for model, spec in specs.items()
            if model in MODELS
        ],
    }


def _ticks_s(seconds: float, interval_s: float) -> float:
    """`seconds` rounded up to whole control intervals: the policy acts only on ticks."""
    return math.ceil(seconds / interval_s) * interval_s


def _model_floor_s(spec: dict[str, Any], excess: int, latest: bool) -> float:
    """From a drop to one model's floor, `excess` instances above it: the scale-down
    stabilization window, then one rate-policy period per further step (the quickest of the
    spec's Instances policies, as the chart's are), in whole ticks; at the latest, the rate
    window before them (`allowed_floor_s`)."""
    interval_s = spec["intervalSeconds"]
    down = spec["behavior"]["scaleDown"]
    steps_s = []
    for policy in down["policies"]:
        if policy["type"] != "Instances":
            raise ValueError(f"only Instances scale-down policies are counted, not {policy}")
        further_steps = math.ceil(excess / policy["value"]) - 1
        steps_s.append(further_steps * _ticks_s(policy["periodSeconds"], interval_s))
    held_s = _ticks_s(down["stabilizationWindowSeconds"], interval_s)
    if latest:
        held_s += spec["metricsWindowSeconds"]
    return held_s + min(steps_s)


def _floor_s(specs: list[dict[str, Any]], peak: dict[str, int], latest: bool) -> float:
    """The models step down side by side: the slowest one sets the time."""
    longest = 0.0
    for spec in specs:
        excess = peak.get(spec["model"], 1) - spec.get("minInstances", 1)
        if excess > 0:
            longest = max(longest, _model_floor_s(spec, excess, latest))
    return longest


def earliest_floor_s(specs: list[dict[str, Any]], peak: dict[str, int]) -> float:
    """The earliest the windows allow every model back at its floor after a drop, were the
    drop read at once; a rate window never reads it at once: a lower bound, not a promise."""
    return _floor_s(specs, peak, latest=False)


def allowed_floor_s(specs: list[dict[str, Any]], peak: dict[str, int]) -> float:
    """The latest an operator that honours its windows is back at every floor after a drop.

    The rates a tick reads cover the last metricsWindowSeconds: until that long after the
    drop a tick may still read enough of the high load to ask for the peak, and the
    stabilization window keeps that recommendation from then on. (The last such tick comes
    before the rate window has passed: that term needs no rounding to ticks.) It supposes
    that the ticks after it ask for the floor: one that asks for more (a squeeze after a
    step, a busy machine) starts the stabilization window again, as it should
    (`last_asked_above_floor_s` in the result shows when that happened)."""
    return _floor_s(specs, peak, latest=True)


def run(triton: Any, settings: dict) -> dict[str, Any]:
    instances = common.Instances(triton)
    instances.set(dict.fromkeys(MODELS, 1))
    capacity = common.measure(
        triton.grpc_url,
        PIPELINE,
        concurrency=32,
        seconds=settings["capacity_seconds"],
        rows=ROWS,
    ).throughput_rps
    common.progress(f"capacity at 1 instance each: {capacity:.0f} req/s of {ROWS} rows")
    config = policy_file(triton, settings)
    specs = [p["spec"] for p in config["policies"]]
    floor = sum(spec.get("minInstances", 1) for spec in specs)
    timeline: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-tune-") as folder:
        path = Path(folder) / "policies.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        log = Path(folder) / "decisions.jsonl"
        tune = common.start_tune(triton, path, log, Path(folder) / "tune.out")
        started = time.monotonic()

        def poll(phase: str) -> dict[str, Any]:
            if tune.poll() is not None:
                raise SystemExit(f"bench: tritonscale tune exited with code {tune.returncode}")
            counts = {model: instances.get(model) for model in MODELS}
            row = {
                "t_s": round(time.monotonic() - started, 1),
                "phase": phase,
                "instances": counts,
                "total_instances": sum(counts.values()),
            }
            timeline.append(row)
            return row

        try:
            with common.OpenLoopLoad(triton.grpc_url, PIPELINE, rows=ROWS) as load:
                load.set_rate(HIGH_LOAD * capacity)
                common.progress(
                    f"high load: {HIGH_LOAD * capacity:.0f} req/s until the counts have risen "
                    f"and held {settings['high_settle_s']:.0f} s"
                )
                last_change, peak = started, floor
                while time.monotonic() - started < settings["high_max_s"]:
                    row = poll("high")
                    if row["total_instances"] != peak:
                        last_change, peak = time.monotonic(), row["total_instances"]
                        common.progress(f"  t={row['t_s']:.0f}s: {row['instances']}")
                    if peak > floor and time.monotonic() - last_change >= settings["high_settle_s"]:
                        break
                    time.sleep(settings["poll_s"])
                at_drop = poll("high")
                dropped, dropped_at = time.monotonic(), time.time()
                load.set_rate(LOW_LOAD * capacity)
                common.progress(
                    f"load dropped to {LOW_LOAD * capacity:.0f} req/s at "
                    f"{at_drop['instances']} (total {at_drop['total_instances']}, floor {floor})"
                )
                back = None
                while time.monotonic() - dropped < settings["low_max_s"]:
                    time.sleep(settings["poll_s"])
                    row = poll("low")
                    if row["total_instances"] != timeline[-2]["total_instances"]:
                        common.progress(
                            f"  {row['t_s'] - at_drop['t_s']:.0f} s after the drop: {row['instances']}"
                        )
                    if row["total_instances"] == floor:
                        back = time.monotonic() - dropped
                        break
        finally:
            common.stop_tune(tune)
            instances.restore()
        decision_log, decisions = common.read_decisions(log)
    # Each scale-down after the drop, per model: seconds from the drop to the end of its load;
    # and the last tick that asked for more than the floor, which the stabilization window
    # keeps for its length.
    steps_down: dict[str, list[float]] = {}
    above_floor: dict[str, float] = {}
    floors = {spec["model"]: spec.get("minInstances", 1) for spec in specs}
    for record in decisions:
        if record["t"] < dropped_at:
            continue
        asked = record.get("recommended")
        if asked is not None and asked > floors.get(record["model"], 1):
            above_floor[record["model"]] = round(record["t"] - dropped_at, 1)
        if any(pod.get("ok") and pod["after"] < pod["before"] for pod in record["applied"]):
            steps_down.setdefault(record["model"], []).append(
                round(record["t"] + record["durationSeconds"] - dropped_at, 1)
            )
    return {
        "settings": {**settings, "high_load": HIGH_LOAD, "low_load": LOW_LOAD, "rows": ROWS},
        "policies": specs,
        "capacity_rps": round(capacity, 1),
        "floor": floor,
        "instances_at_drop": at_drop["instances"],
        "total_at_drop": at_drop["total_instances"],
        "seconds_to_floor": None if back is None else round(back, 1),
        "earliest_possible_s": earliest_floor_s(specs, at_drop["instances"]),
        "allowed_s": allowed_floor_s(specs, at_drop["instances"]),
        "first_scale_down_after_drop_s": {model: times[0] for model, times in steps_down.items()},
        "scale_downs_after_drop_s": steps_down,
        "last_asked_above_floor_s": above_floor,
        "drop_at_s": at_drop["t_s"],
        "timeline": timeline,
        "decisions": len(decisions),
        "decision_log": decision_log,
    }


def plot(result: dict, path: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timeline = result["timeline"]
    drop = result["drop_at_s"]
    figure, axes = plt.subplots(figsize=(9, 4))
    times = [w["t_s"] - drop for w in timeline]
    for model in MODELS:
        axes.step(times, [w["instances"][model] for w in timeline], where="post", label=model)
    axes.step(
        times, [w["total_instances"] for w in timeline], where="post", color="black",
        linewidth=2, label="total",
    )  # fmt: skip
    axes.axhline(result["floor"], color="grey", linestyle=":", label="floor")
    axes.axvline(0, color="black", linestyle=":", linewidth=0.8)
    if result["earliest_possible_s"]:
        axes.axvline(result["earliest_possible_s"], color="grey", linestyle="--", linewidth=0.8,
                     label="earliest the windows allow")  # fmt: skip
    if result.get("allowed_s"):
        axes.axvline(result["allowed_s"], color="black", linestyle="--", linewidth=0.8,
                     label="latest the windows allow")  # fmt: skip
    axes.set_xlabel("seconds after the load dropped")
    axes.set_ylabel("instances")
    axes.set_title("Scale-down with the chart's default windows")
    axes.legend(fontsize="small", loc="upper right")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


def main(argv: list[str] | None = None) -> None:
    args = common.parser(__doc__.splitlines()[0]).parse_args(argv)
    with common.local_triton(list(MODELS)) as triton:
        result = run(triton, QUICK if args.quick else FULL)
    common.write_outputs("scale_down", result, args, plot, decision_log=result.pop("decision_log"))
    common.progress(
        f"from {result['total_at_drop']} instances back to the floor of {result['floor']} "
        f"{result['seconds_to_floor']} s after the load dropped (the windows allow "
        f"{result['earliest_possible_s']:.0f} s at the earliest, {result['allowed_s']:.0f} s "
        "at the latest)"
    )


if __name__ == "__main__":
    main()
