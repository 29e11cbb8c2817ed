"""The decoupled gateway against pipeline_async and pipeline_sync, side by side in one run.

    python -m loadtests.bench.gateway            # full, about ten minutes
    python -m loadtests.bench.gateway --quick    # one point per part, seconds (CI)

Five variants of the same pipeline, at equal instances, under the same closed-loop load over
a gRPC stream (the only way to a decoupled model; the others get the same client path):

- gateway: pipeline_gateway as shipped (decoupled, its own micro-batcher);
- plain gateway: pipeline_gateway reloaded with `max_batch_rows: 1`, so every request makes
  its own three branch calls (a decoupled async model without a micro-batcher);
- async: pipeline_async (non-decoupled; the dynamic batcher batches, one execute at a time);
- sync: pipeline_sync (the same, branches one after another);
- ensemble: pipeline_ensemble, the same steps as a Triton ensemble (pre-processing and the
  score as Python models of their own, at the parents' count; Triton's C++ scheduler moves
  the tensors, no Python orchestrates).

Parts:

1. Concurrency sweep, 1 to 64 requests in flight, one instance of each model. Variants run in
   the order A B C D D C B A, and each result is the mean of its two runs, so that a machine
   whose load drifts favours none. Per variant: throughput, p95, the ratio to sync, the
   fraction of the branch-time ceiling reached (min(in flight, branch instances x 64 rows) per
   15 ms, branch_embed's emulated time: what the branches alone would allow), rows per
   branch call, and the server's CPU per request (steadier than throughput on a shared box).
2. Branches alone: each branch at its count under more load than any pipeline sends it, so
   the report can show that the branches were not the bottleneck.
3. The grid of async_vs_sync (pipeline instances x instances of each branch) at 32 in flight.
4. The pre-processing pool: pipeline_async and the gateway with `preprocess_threads` 0 (on
   the event loop) and 2 (a thread pool), at 8 and 32 in flight.

Result: reports/bench/gateway.json (+ .png).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import tritonclient.http

from loadtests.bench import common

BRANCHES = ("branch_embed", "branch_classify", "branch_rank")
BRANCH_MS = {"branch_embed": 15, "branch_classify": 10, "branch_rank": 5}
BRANCH_MAX_BATCH = 64
GATEWAY = "pipeline_gateway"
# The ensemble's Python steps count as its parents: they get the parents' instances.
PARENTS = (
    "pipeline_gateway",
    "pipeline_async",
    "pipeline_sync",
    "pipeline_preprocess",
    "pipeline_score",
)
ENSEMBLE = "pipeline_ensemble"
# Variant name -> (model, parameters the gateway is reloaded with, or None for as shipped).
VARIANTS: dict[str, tuple[str, dict[str, str] | None]] = {
    "gateway": (GATEWAY, None),
    "plain_gateway": (GATEWAY, {"max_batch_rows": "1"}),
    "async": ("pipeline_async", None),
    "sync": ("pipeline_sync", None),
    "ensemble": (ENSEMBLE, None),
}


def ceiling_rps(in_flight: int, branch_instances: int) -> float:
    """Requests/s the branches' emulated time alone allows: every request spends the slowest
    branch's time, and a branch instance takes up to BRANCH_MAX_BATCH rows at once."""
    rows_at_once = min(in_flight, branch_instances * BRANCH_MAX_BATCH)
    return rows_at_once / (max(BRANCH_MS.values()) / 1000.0)


def live_parameters(triton: Any, model: str) -> dict[str, str]:
    """The config.pbtxt parameters `model` is loaded with now."""
    with tritonclient.http.InferenceServerClient(triton.http_url) as client:
        config = client.get_model_config(model)
    return {k: v["string_value"] for k, v in config.get("parameters", {}).items()}


class Counters:
    """Model statistics: requests answered and executions, per model, since the server started."""

    def __init__(self, triton: Any) -> None:
        self.client = tritonclient.http.InferenceServerClient(triton.http_url)

    def read(self, model: str) -> tuple[int, int]:
        stats = self.client.get_inference_statistics(model)["model_stats"][0]
        return stats["inference_stats"]["success"]["count"], stats["execution_count"]

    def settled(
        self, models: tuple[str, ...], timeout_s: float = 2.0
    ) -> dict[str, tuple[int, int]]:
        """Every model's counters once two reads 50 ms apart agree. The client has every
        answer when a run ends, but a decoupled model's statistics are updated after its last
        response is sent: read at once, its count can trail its branches' by a request."""
        last = {model: self.read(model) for model in models}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            time.sleep(0.05)
            now = {model: self.read(model) for model in models}
            if now == last:
                break
            last = now
        return last

    def close(self) -> None:
        self.client.close()


class Bench:
    """One server, its counts and parameters, and the measurements taken on it."""

    def __init__(self, triton: Any, settings: dict) -> None:
        self.triton = triton
        self.settings = settings
        self.instances = common.Instances(triton)
        self.counters = Counters(triton)
        self.cpu = common.ServerCpu(triton)
        self.gateway_parameters: dict[str, str] | None = None
        self.shipped = live_parameters(triton, GATEWAY)

    def use_gateway_parameters(self, parameters: dict[str, str] | None) -> None:
        wanted = parameters or {}
        if wanted == self.gateway_parameters:
            return
        # Back to the shipped values first, so that variants never mix.
        common.set_parameters(self.triton, GATEWAY, {**self.shipped, **wanted})
        self.gateway_parameters = wanted

    def run(self, variant: str, in_flight: int) -> dict[str, Any]:
        model, parameters = VARIANTS[variant]
        if model == GATEWAY:
            self.use_gateway_parameters(parameters)
        return self.measure(model, in_flight)

    def measure(self, model: str, in_flight: int) -> dict[str, Any]:
        before = {m: self.counters.read(m) for m in (model, "branch_embed")}
        cpu_before = self.cpu.per_process()
        result = common.measure_stream(
            self.triton.grpc_url,
            model,
            common.pipeline_inputs(self.settings["rows"]),
            concurrency=in_flight,
            seconds=self.settings["seconds"],
            warmup_s=self.settings["warmup_s"],
        )
        cpu_s = self.cpu.spent(cpu_before, self.cpu.per_process())
        after = self.counters.settled((model, "branch_embed"))
        answered = after[model][0] - before[model][0]
        branch_calls = after["branch_embed"][0] - before["branch_embed"][0]
        row = result.to_dict()
        row["server_cpu_ms_per_request"] = round(1000 * cpu_s / answered, 3) if answered else None
        # Each pipeline request carries `rows` rows; a branch call carries a batch of them.
        row["rows_per_branch_call"] = (
            round(answered * self.settings["rows"] / branch_calls, 2) if branch_calls else None
        )
        return row

    def restore(self) -> None:
        self.use_gateway_parameters(None)
        self.instances.restore()
        self.counters.close()


def mean_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The mean of repeated runs of one variant (numbers averaged, the first error kept)."""
    merged: dict[str, Any] = dict(runs[0])
    for key, value in runs[0].items():
        values = [run[key] for run in runs]
        if isinstance(value, int | float) and not isinstance(value, bool):
            if all(isinstance(v, int | float) for v in values):
                merged[key] = round(float(np.mean(values)), 3)
    merged["runs"] = len(runs)
    merged["first_error"] = next((run["first_error"] for run in runs if run["first_error"]), None)
    return merged


def compare(runs: dict[str, dict[str, Any]], in_flight: int, branch_instances: int) -> dict:
    """Ratios to sync and the fraction of the branch-time ceiling, per variant."""
    ceiling = ceiling_rps(in_flight, branch_instances)
    sync_rps = runs["sync"]["throughput_rps"]
    for run in runs.values():
        run["ratio_to_sync"] = common.ratio(run["throughput_rps"], sync_rps)
        run["fraction_of_ceiling"] = round(run["throughput_rps"] / ceiling, 3)
    best_other = max(runs["async"]["throughput_rps"], runs["plain_gateway"]["throughput_rps"])
    return {
        "in_flight": in_flight,
        "ceiling_rps": round(ceiling, 1),
        "variants": runs,
        # The goal: the gateway at least as fast as the better of async and the plain gateway.
        "gateway_over_best_other": common.ratio(runs["gateway"]["throughput_rps"], best_other),
    }


def sweep(bench: Bench, in_flight: int, branch_instances: int) -> dict[str, Any]:
    order = list(VARIANTS)
    order = order + order[::-1] if bench.settings["balanced_rounds"] else order
    runs: dict[str, list[dict]] = {variant: [] for variant in VARIANTS}
    for variant in order:
        runs[variant].append(bench.run(variant, in_flight))
    point = compare({v: mean_of(r) for v, r in runs.items()}, in_flight, branch_instances)
    common.progress(
        f"  {in_flight:>3} in flight: "
        + ", ".join(
            f"{v} {r['throughput_rps']:.0f} rps (p95 {r['p95_ms'] or 0:.0f} ms)"
            for v, r in point["variants"].items()
        )
        + f"; gateway / best other x{point['gateway_over_best_other']}"
    )
    return point


def branches_alone(bench: Bench, branch_instances: int) -> list[dict[str, Any]]:
    """Each branch on its own: rows/s at more load than a pipeline ever sends it."""
    rows = []
    in_flight = bench.settings["branch_in_flight"]
    batch = bench.settings["branch_rows"]
    for branch in BRANCHES:
        result = common.measure(
            bench.triton.grpc_url,
            branch,
            lambda rng: {"HIDDEN": rng.standard_normal((batch, 32), dtype=np.float32)},
            concurrency=in_flight,
            seconds=bench.settings["seconds"],
            warmup_s=bench.settings["warmup_s"],
        )
        rows.append(
            {
                "branch": branch,
                "instances": branch_instances,
                "in_flight": in_flight,
                "rows_per_request": batch,
                "rows_per_s": round(result.throughput_rps * batch, 1),
                "failures": result.failures,
            }
        )
        common.progress(
            f"  {branch} alone ({branch_instances} instance(s), {in_flight} x {batch} rows in "
            f"flight): {rows[-1]['rows_per_s']:.0f} rows/s"
        )
    return rows


def grid(bench: Bench) -> list[dict[str, Any]]:
    points = []
    in_flight = bench.settings["grid_in_flight"]
    for branches in bench.settings["branches"]:
        for parents in bench.settings["parents"]:
            bench.instances.set(
                {**dict.fromkeys(PARENTS, parents), **dict.fromkeys(BRANCHES, branches)}
            )
            runs = {variant: bench.run(variant, in_flight) for variant in VARIANTS}
            point = compare(runs, in_flight, branches)
            point.update(parent_instances=parents, branch_instances=branches)
            points.append(point)
            common.progress(
                f"  parents {parents}, branches {branches}: "
                + ", ".join(f"{v} {r['throughput_rps']:.0f}" for v, r in runs.items())
                + " rps"
            )
    bench.instances.set({**dict.fromkeys(PARENTS, 1), **dict.fromkeys(BRANCHES, 1)})
    return points


def preprocess_pool(bench: Bench) -> list[dict[str, Any]]:
    """preprocess_threads 0 (inline) against 2 (a pool), for pipeline_async and the gateway."""
    rows = []
    for model in ("pipeline_async", GATEWAY):
        shipped = live_parameters(bench.triton, model)
        try:
            for in_flight in bench.settings["pool_in_flight"]:
                runs: dict[str, list[dict]] = {"0": [], "2": []}
                for threads in ("0", "2", "2", "0"):
                    if model == GATEWAY:
                        bench.use_gateway_parameters({"preprocess_threads": threads})
                    else:
                        common.set_parameters(bench.triton, model, {"preprocess_threads": threads})
                    runs[threads].append(bench.measure(model, in_flight))
                inline, pool = mean_of(runs["0"]), mean_of(runs["2"])
                rows.append(
                    {
                        "model": model,
                        "in_flight": in_flight,
                        "inline": inline,
                        "pool": pool,
                        "pool_over_inline": common.ratio(
                            pool["throughput_rps"], inline["throughput_rps"]
                        ),
                    }
                )
                common.progress(
                    f"  {model}, {in_flight} in flight: inline {inline['throughput_rps']:.0f} "
                    f"rps, pool {pool['throughput_rps']:.0f} rps: x{rows[-1]['pool_over_inline']}"
                )
        finally:
            if model == GATEWAY:
                bench.use_gateway_parameters(None)
            else:
                common.set_parameters(bench.triton, model, shipped)
    return rows


def plot(result: dict[str, Any], path: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = result["by_in_flight"]
    xs = [p["in_flight"] for p in points]
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for variant in VARIANTS:
        left.plot(
            xs, [p["variants"][variant]["throughput_rps"] for p in points], "o-", label=variant
        )
        right.plot(xs, [p["variants"][variant]["p95_ms"] or 0 for p in points], "o-", label=variant)
    left.plot(xs, [p["ceiling_rps"] for p in points], "k:", label="branch-time ceiling")
    for axes, label in ((left, "requests/s"), (right, "p95 latency (ms)")):
        axes.set_xscale("log", base=2)
        axes.set_xticks(xs, [str(x) for x in xs])
        axes.set_xlabel("requests in flight")
        axes.set_ylabel(label)
        axes.legend()
    left.set_ylim(
        0, max(max(p["variants"][v]["throughput_rps"] for v in VARIANTS) for p in points) * 1.3
    )
    figure.suptitle("Pipeline variants at one instance each (branches: one instance each)")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


QUICK = {
    "in_flight": [2],
    "balanced_rounds": False,
    "rows": 1,
    "seconds": 1.0,
    "warmup_s": 0.3,
    "branch_in_flight": 2,
    "branch_rows": 16,
    "parents": [],
    "branches": [],
    "grid_in_flight": 32,
    "pool_in_flight": [],
}
FULL = {
    "in_flight": [1, 2, 4, 8, 16, 32, 64],
    "balanced_rounds": True,
    "rows": 1,
    "seconds": 4.0,
    "warmup_s": 1.0,
    "branch_in_flight": 4,
    "branch_rows": 32,
    "parents": [1, 2, 4],
    "branches": [1, 2, 4],
    "grid_in_flight": 32,
    "pool_in_flight": [8, 32],
}


def run(triton: Any, settings: dict) -> dict[str, Any]:
    """The whole benchmark on a running server; counts and parameters are put back."""
    bench = Bench(triton, settings)
    try:
        bench.instances.set({**dict.fromkeys(PARENTS, 1), **dict.fromkeys(BRANCHES, 1)})
        common.progress("concurrency sweep, one instance of each model")
        points = [sweep(bench, in_flight, 1) for in_flight in settings["in_flight"]]
        common.progress("each branch alone, one instance")
        alone = branches_alone(bench, 1)
        common.progress(f"grid at {settings['grid_in_flight']} in flight")
        grid_points = grid(bench)
        common.progress("pre-processing: inline vs a thread pool")
        pool = preprocess_pool(bench)
    finally:
        bench.restore()
    ratios = [p["gateway_over_best_other"] for p in points if p["gateway_over_best_other"]]
    return {
        "settings": settings,
        "variants": {v: {"model": m, "parameters": p or {}} for v, (m, p) in VARIANTS.items()},
        "gateway_parameters": bench.shipped,
        "branch_emulated_ms": BRANCH_MS,
        "by_in_flight": points,
        "gateway_over_best_other_min": min(ratios) if ratios else None,
        "branches_alone": alone,
        "grid": grid_points,
        "preprocess_pool": pool,
    }


def main(argv: list[str] | None = None) -> None:
    args = common.parser(__doc__.splitlines()[0]).parse_args(argv)
    models = [*PARENTS, *BRANCHES, ENSEMBLE]
    with common.local_triton(models) as triton:
        result = run(triton, QUICK if args.quick else FULL)
    path = common.write_result("gateway", result, args.out)
    if not args.no_plot:
        plot(result, common.plot_path(path))
    common.progress(
        f"gateway / better of async and the plain gateway: at least "
        f"x{result['gateway_over_best_other_min']} from 1 to 64 in flight"
    )


if __name__ == "__main__":
    main()
