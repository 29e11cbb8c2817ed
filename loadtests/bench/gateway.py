"""The decoupled gateway against pipeline_async and pipeline_sync, side by side in one run.

    python -m loadtests.bench.gateway                # full, about twenty-five minutes
    python -m loadtests.bench.gateway --quick        # one point per part, seconds (CI)
    python -m loadtests.bench.gateway --parts users  # only the users' client paths
    python -m loadtests.bench.gateway --parts paths  # the gateway's paths beside async's

Five variants of the same pipeline, at equal instances, under the same closed-loop load over
one gRPC stream (the only way to a decoupled model; the others get the same client path), and
then each on the path its users take:

- gateway: pipeline_gateway as shipped (decoupled, its own micro-batcher);
- plain gateway: pipeline_gateway reloaded with `max_batch_rows: 1`, so every request makes
  its own three branch calls (a decoupled async model without a micro-batcher);
- async: pipeline_async (non-decoupled; the dynamic batcher batches, one execute at a time);
- sync: pipeline_sync (the same, branches one after another);
- ensemble: pipeline_ensemble, the same steps as a Triton ensemble (pre-processing and the
  score as Python models of their own, at the parents' count; Triton's C++ scheduler moves
  the tensors, no Python orchestrates).

Parts (`--parts` picks some; all by default):

1. Concurrency sweep (sweep), 1 to 64 requests in flight, one instance of each model, every
   variant over one shared gRPC stream. Variants run in
   the order A B C D D C B A, and each result is the mean of its two runs, so that a machine
   whose load drifts favours none. Per variant: throughput, p95, the ratio to sync, the
   fraction of the branch-time ceiling reached (min(in flight, branch instances x 64 rows) per
   15 ms, branch_embed's emulated time: what the branches alone would allow), rows per
   branch call, and the server's CPU per request (steadier than throughput on a shared box).
2. The users' client paths (users), 1 to 32 in flight, one instance of each model: each
   in-flight request is a user in a closed loop, on the path that user takes. The
   non-decoupled models (pipeline_async, pipeline_sync, the ensemble) over unary gRPC and
   over unary HTTP; the two decoupled gateways over a gRPC stream per user, one request at
   a time (as loadtests/bls.py's users call it). The (variant, path) pairs run in rounds of
   alternating order (A B C, C B A, A B C, ...; `--rounds`, 2 by default), and the
   gateway's ratio to pipeline_async on each of its paths is given per round as well as
   for the means: on a shared machine the spread of the rounds says how far to trust it.
3. The gateway's client paths beside pipeline_async's (paths), 1 to 16 in flight, one
   instance of each model: the gateway over one shared gRPC stream (every request on it,
   as in the sweep) and over a stream per user; pipeline_async over unary gRPC, unary HTTP
   and one shared stream. The pairs run in rounds of alternating order as in part 2, and
   the gateway's ratio to pipeline_async is given for every pair of paths, per round and
   for the means: what a user sees who picks one path for the gateway and another for
   pipeline_async.
4. Branches alone (branches): each branch at its count under more load than any pipeline
   sends it, so the report can show that the branches were not the bottleneck.
5. The grid of async_vs_sync (grid): pipeline instances x instances of each branch at 32 in
   flight.
6. The pre-processing pool (pool): pipeline_async and the gateway with `preprocess_threads`
   0 (on the event loop) and 2 (a thread pool), at 8 and 32 in flight.

Result: reports/bench/gateway.json (+ .png).
"""

from __future__ import annotations

import os
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
# The client path shared by every variant in the sweep: one gRPC stream for all requests.
SHARED_STREAM = "shared_stream"
# Variant -> the paths its users take (common.CLIENT_PATHS): a decoupled model only streams.
USERS_PATHS: dict[str, tuple[str, ...]] = {
    "gateway": ("stream",),
    "plain_gateway": ("stream",),
    "async": ("grpc", "http"),
    "sync": ("grpc", "http"),
    "ensemble": ("grpc", "http"),
}
# The gateway on each of its client paths beside pipeline_async on each of its own (part
# `paths`): a user of either may send everything over one shared stream or call the model
# one request at a time, a stream or a unary call each; async over one shared stream says
# what that path costs a model that is not decoupled.
GATEWAY_PATHS: dict[str, tuple[str, ...]] = {
    "gateway": (SHARED_STREAM, "stream"),
    "async": ("grpc", "http", SHARED_STREAM),
}
PARTS = ("sweep", "users", "paths", "branches", "grid", "pool")


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

    def run(self, variant: str, in_flight: int, path: str = SHARED_STREAM) -> dict[str, Any]:
        model, parameters = VARIANTS[variant]
        if model == GATEWAY:
            self.use_gateway_parameters(parameters)
        return self.measure(model, in_flight, path)

    def measure(self, model: str, in_flight: int, path: str = SHARED_STREAM) -> dict[str, Any]:
        before = {m: self.counters.read(m) for m in (model, "branch_embed")}
        cpu_before = self.cpu.per_process()
        load = {
            "concurrency": in_flight,
            "seconds": self.settings["seconds"],
            "warmup_s": self.settings["warmup_s"],
        }
        inputs = common.pipeline_inputs(self.settings["rows"])
        if path == SHARED_STREAM:
            result = common.measure_stream(self.triton.grpc_url, model, inputs, **load)
        else:
            url = self.triton.http_url if path == "http" else self.triton.grpc_url
            result = common.measure(url, model, inputs, path=path, **load)
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


def interleaved(
    bench: Bench, in_flight: int, table: dict[str, tuple[str, ...]]
) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Every (variant, path) pair of `table` at `in_flight`, in rounds of alternating order
    (A B C, C B A, ...; `path_rounds` of them): each pair's runs, one per round."""
    order = [(variant, path) for variant, paths in table.items() for path in paths]
    runs: dict[tuple[str, str], list[dict]] = {pair: [] for pair in order}
    for number in range(bench.settings["path_rounds"]):
        for variant, path in order if number % 2 == 0 else order[::-1]:
            runs[variant, path].append(bench.run(variant, in_flight, path))
    return runs


def means_by_path(
    runs: dict[tuple[str, str], list[dict[str, Any]]], ceiling: float
) -> dict[str, dict[str, dict[str, Any]]]:
    """variant -> path -> the mean of its runs, with the fraction of the branch-time ceiling."""
    variants: dict[str, dict[str, Any]] = {}
    for (variant, path), measured in runs.items():
        run = mean_of(measured)
        run["fraction_of_ceiling"] = round(run["throughput_rps"] / ceiling, 3)
        variants.setdefault(variant, {})[path] = run
    return variants


def per_round(gateway_runs: list[dict], other_runs: list[dict]) -> list[float | None]:
    """The gateway over another (variant, path) in each round: runs of one round side by side."""
    return [
        common.ratio(gateway["throughput_rps"], other["throughput_rps"])
        for gateway, other in zip(gateway_runs, other_runs, strict=True)
    ]


def users_paths(bench: Bench, in_flight: int, branch_instances: int) -> dict[str, Any]:
    """Every variant on each path its users take (USERS_PATHS), at `in_flight` users, and the
    gateway's ratio to pipeline_async on each of async's paths."""
    runs = interleaved(bench, in_flight, USERS_PATHS)
    ceiling = ceiling_rps(in_flight, branch_instances)
    variants = means_by_path(runs, ceiling)
    by_round = {
        path: per_round(runs["gateway", "stream"], runs["async", path])
        for path in USERS_PATHS["async"]
    }
    gateway_rps = variants["gateway"]["stream"]["throughput_rps"]
    point = {
        "in_flight": in_flight,
        "ceiling_rps": round(ceiling, 1),
        "variants": variants,
        "gateway_over_async": {
            path: common.ratio(gateway_rps, variants["async"][path]["throughput_rps"])
            for path in USERS_PATHS["async"]
        },
        "gateway_over_async_by_round": by_round,
    }
    common.progress(
        f"  {in_flight:>3} in flight: "
        + ", ".join(
            f"{variant} {path} {run['throughput_rps']:.0f} rps (p95 {run['p95_ms'] or 0:.0f} ms)"
            for variant, paths in variants.items()
            for path, run in paths.items()
        )
        + "; gateway / async: "
        + ", ".join(
            f"{path} x{ratio} (rounds {', '.join(str(r) for r in by_round[path])})"
            for path, ratio in point["gateway_over_async"].items()
        )
    )
    return point


def gateway_paths(bench: Bench, in_flight: int, branch_instances: int) -> dict[str, Any]:
    """The gateway on each of its client paths beside pipeline_async on each of its own
    (GATEWAY_PATHS), at `in_flight`, and the gateway over async for every pair of paths."""
    runs = interleaved(bench, in_flight, GATEWAY_PATHS)
    ceiling = ceiling_rps(in_flight, branch_instances)
    variants = means_by_path(runs, ceiling)
    point = {
        "in_flight": in_flight,
        "ceiling_rps": round(ceiling, 1),
        "variants": variants,
        # gateway path -> async path -> the gateway's rate over async's.
        "gateway_over_async": {
            mine: {
                theirs: common.ratio(run["throughput_rps"], other["throughput_rps"])
                for theirs, other in variants["async"].items()
            }
            for mine, run in variants["gateway"].items()
        },
        "gateway_over_async_by_round": {
            mine: {
                theirs: per_round(runs["gateway", mine], runs["async", theirs])
                for theirs in GATEWAY_PATHS["async"]
            }
            for mine in GATEWAY_PATHS["gateway"]
        },
    }
    common.progress(
        f"  {in_flight:>3} in flight: "
        + ", ".join(
            f"{variant} {path} {run['throughput_rps']:.0f} rps (p95 {run['p95_ms'] or 0:.0f} ms, "
            f"{run['rows_per_branch_call']} rows per branch call)"
            for variant, paths in variants.items()
            for path, run in paths.items()
        )
        + "; gateway / async: "
        + ", ".join(
            f"{mine} / {theirs} x{ratio} (rounds "
            + ", ".join(str(r) for r in point["gateway_over_async_by_round"][mine][theirs])
            + ")"
            for mine, ratios in point["gateway_over_async"].items()
            for theirs, ratio in ratios.items()
        )
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
    """Throughput and p95 per variant: a row for the sweep (one shared stream), one for the
    users' paths and one for the gateway's paths beside async's, each where the run had
    that part."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # (title, points, {label: function from a point to its variant's run})
    rows = []
    if result["by_in_flight"]:
        rows.append(
            (
                "every variant on one shared gRPC stream",
                result["by_in_flight"],
                {v: (lambda p, v=v: p["variants"][v]) for v in VARIANTS},
            )
        )
    if result["users_paths"]:
        rows.append(
            (
                "each variant on its users' paths",
                result["users_paths"],
                {
                    f"{v} ({path})": (lambda p, v=v, path=path: p["variants"][v][path])
                    for v, paths in USERS_PATHS.items()
                    for path in paths
                },
            )
        )
    if result["gateway_paths"]:
        rows.append(
            (
                "the gateway's and pipeline_async's client paths",
                result["gateway_paths"],
                {
                    f"{v} ({path})": (lambda p, v=v, path=path: p["variants"][v][path])
                    for v, paths in GATEWAY_PATHS.items()
                    for path in paths
                },
            )
        )
    figure, axes_rows = plt.subplots(
        max(len(rows), 1), 2, figsize=(11, 4 * max(len(rows), 1)), squeeze=False
    )
    for (title, points, runs), (left, right) in zip(rows, axes_rows, strict=False):
        xs = [p["in_flight"] for p in points]
        for label, run_of in runs.items():
            left.plot(xs, [run_of(p)["throughput_rps"] for p in points], "o-", label=label)
            right.plot(xs, [run_of(p)["p95_ms"] or 0 for p in points], "o-", label=label)
        left.plot(xs, [p["ceiling_rps"] for p in points], "k:", label="branch-time ceiling")
        highest = max(run_of(p)["throughput_rps"] for run_of in runs.values() for p in points)
        left.set_ylim(0, highest * 1.3)
        for axes, label in ((left, "requests/s"), (right, "p95 latency (ms)")):
            axes.set_xscale("log", base=2)
            axes.set_xticks(xs, [str(x) for x in xs])
            axes.set_xlabel("requests in flight")
            axes.set_ylabel(label)
            axes.set_title(title, fontsize="medium")
            axes.legend(fontsize="small")
    figure.suptitle("Pipeline variants at one instance each (branches: one instance each)")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


QUICK = {
    "parts": list(PARTS),
    "in_flight": [2],
    "users_in_flight": [2],
    "paths_in_flight": [2],
    "path_rounds": 1,
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
    "parts": list(PARTS),
    "in_flight": [1, 2, 4, 8, 16, 32, 64],
    "users_in_flight": [1, 2, 4, 8, 16, 32],
    "paths_in_flight": [1, 2, 4, 8, 16],
    "path_rounds": 2,
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
    # On a shared machine the load at the start says what the run competed with.
    load_average = [round(x, 2) for x in os.getloadavg()]
    bench = Bench(triton, settings)
    parts = settings["parts"]
    points: list[dict[str, Any]] = []
    users: list[dict[str, Any]] = []
    paths: list[dict[str, Any]] = []
    alone: list[dict[str, Any]] = []
    grid_points: list[dict[str, Any]] = []
    pool: list[dict[str, Any]] = []
    try:
        bench.instances.set({**dict.fromkeys(PARENTS, 1), **dict.fromkeys(BRANCHES, 1)})
        if "sweep" in parts:
            common.progress("concurrency sweep, one instance of each model, one shared stream")
            points = [sweep(bench, in_flight, 1) for in_flight in settings["in_flight"]]
        if "users" in parts:
            common.progress("each variant on its users' paths, one instance of each model")
            users = [users_paths(bench, n, 1) for n in settings["users_in_flight"]]
        if "paths" in parts:
            common.progress(
                "the gateway and pipeline_async on each client path, one instance of each model"
            )
            paths = [gateway_paths(bench, n, 1) for n in settings["paths_in_flight"]]
        if "branches" in parts:
            common.progress("each branch alone, one instance")
            alone = branches_alone(bench, 1)
        if "grid" in parts:
            common.progress(f"grid at {settings['grid_in_flight']} in flight")
            grid_points = grid(bench)
        if "pool" in parts:
            common.progress("pre-processing: inline vs a thread pool")
            pool = preprocess_pool(bench)
    finally:
        bench.restore()
    ratios = [p["gateway_over_best_other"] for p in points if p["gateway_over_best_other"]]
    return {
        "settings": settings,
        "load_average_at_run_start": load_average,
        "variants": {v: {"model": m, "parameters": p or {}} for v, (m, p) in VARIANTS.items()},
        "gateway_parameters": bench.shipped,
        "branch_emulated_ms": BRANCH_MS,
        "by_in_flight": points,
        "gateway_over_best_other_min": min(ratios) if ratios else None,
        "users_paths": users,
        "gateway_paths": paths,
        "branches_alone": alone,
        "grid": grid_points,
        "preprocess_pool": pool,
    }


def main(argv: list[str] | None = None) -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument(
        "--parts",
        default=",".join(PARTS),
        help=f"Comma-separated parts to run, of {', '.join(PARTS)} (default: all)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        help="Rounds of the users' paths and of the gateway's paths, in alternating order "
        "(default: 2, --quick 1)",
    )
    args = p.parse_args(argv)
    if args.rounds is not None and args.rounds < 1:
        p.error("--rounds must be at least 1")
    parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    if unknown := sorted(set(parts) - set(PARTS)):
        p.error(f"unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    settings = {**(QUICK if args.quick else FULL), "parts": parts}
    if args.rounds is not None:
        settings["path_rounds"] = args.rounds
    models = [*PARENTS, *BRANCHES, ENSEMBLE]
    with common.local_triton(models) as triton:
        result = run(triton, settings)
    path = common.write_result("gateway", result, args.out)
    if not args.no_plot:
        plot(result, common.plot_path(path))
    if result["by_in_flight"]:
        common.progress(
            "one shared stream, gateway / better of async and the plain gateway: at least "
            f"x{result['gateway_over_best_other_min']}"
        )
    for point in result["users_paths"]:
        common.progress(
            f"users' paths, {point['in_flight']} in flight, gateway (a stream each) / "
            + ", ".join(f"async {k} x{v}" for k, v in point["gateway_over_async"].items())
        )
    for point in result["gateway_paths"]:
        common.progress(
            f"gateway's paths, {point['in_flight']} in flight, gateway / async: "
            + ", ".join(
                f"{mine} / {theirs} x{ratio}"
                for mine, ratios in point["gateway_over_async"].items()
                for theirs, ratio in ratios.items()
            )
        )


if __name__ == "__main__":
    main()
