"""Instance-count changes under a load that never drains, with Triton's rate limiter in
`execution_count` (what `tritonscale serve`, the benchmarks and the chart run) and in `off`
(Triton's default), side by side.

    python -m loadtests.bench.count_changes           # full, about six minutes
    python -m loadtests.bench.count_changes --quick   # tiny (CI)

Each arm is a tritonserver of its own with that `--rate-limit`; both run from the start, and
only the arm being measured is loaded. Every change goes through the operator's actuator
(`Actuator.apply_one`: the live config with a new `instance_group`, a repository load, then
READY with the new count in Triton's config), as the operator sends it.

1. Changes under a closed loop that never pauses (32 requests of 8 rows in flight on
   pipeline_async): every model of the pipeline 1 -> 2 -> 3 -> 2 -> 1, the root with its
   branches at 1 and each branch with the root at 3, so that the model that changes is the
   one its pipeline waits on and its queue never empties. A change is timed from the load's
   request until Triton's config shows the new count; one not done within `stall_s` is
   recorded as stalled, and is released by taking the load away until the config shows it
   (in `off`, that is what made such changes finish: docs/count-changes.md), then the load
   comes back.
2. The same changes under open-loop (Poisson) arrivals at 0.9 of the capacity the closed loop
   measured at the starting counts.
3. The cost at steady state: a few static splits under the closed loop (a settling span,
   then a window), arm after arm in alternating order for `rounds` rounds, each arm's load
   running across all its splits; the throughput and p95 of `execution_count` over `off`.

Result: reports/bench/count_changes.json (+ .png): per arm and load, every change's seconds
and `within_goal` (done within GOAL_S), and the cost per split.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from typing import Any

from loadtests.bench import common
from tritonscale.local.triton_server import RATE_LIMIT, LocalTriton
from tritonscale.triton.actuator import Actuator
from tritonscale.triton.endpoints import Endpoint

ROOT = "pipeline_async"
BRANCHES = ("branch_embed", "branch_classify", "branch_rank")
MODELS = (ROOT, *BRANCHES)
ARMS = (RATE_LIMIT, "off")
STEPS = (2, 3, 2, 1)  # from 1: up twice, down twice
# The bound for a change under load: answered, and shown in Triton's config.
GOAL_S = 5.0
OPEN_LOOP_SHARE = 0.9
QUICK = {
    "concurrency": 8,
    "rows": 8,
    "models": (ROOT,),
    "steps": (2, 1),
    "stall_s": 10.0,
    "capacity_s": 1.0,
    "warmup_s": 0.5,
    "static_seconds": 1.0,
    "splits": ({ROOT: 1},),
    "rounds": 1,
}
FULL = {
    "concurrency": 32,
    "rows": 8,
    "models": MODELS,
    "steps": STEPS,
    "stall_s": 15.0,
    "capacity_s": 4.0,
    "warmup_s": 2.0,
    "static_seconds": 6.0,
    "splits": (
        dict.fromkeys(MODELS, 1),
        {ROOT: 3, **dict.fromkeys(BRANCHES, 1)},
        {ROOT: 3, "branch_embed": 2, "branch_classify": 1, "branch_rank": 1},
    ),
    "rounds": 2,
}


class StalledChange(AssertionError):
    """A count change not confirmed within `stall_s` where stalls are not to be released."""


class Changes:
    """Count changes on one server through the operator's actuator, each timed. A change that
    stalls is released: `release` takes the load away until Triton's config shows the count,
    `restore` brings it back (set them for the load that runs); with `release` None a stall
    raises StalledChange instead."""

    def __init__(self, triton: LocalTriton, stall_s: float) -> None:
        self.actuator = Actuator(triton.repository_key, load_deadline_s=stall_s)
        self.endpoint = Endpoint("local", triton.http_url)
        self.release: Callable[[], None] | None = None
        self.restore: Callable[[], None] = lambda: None

    def count(self, model: str) -> int:
        return asyncio.run(self.actuator.live_count(self.endpoint, model))

    def set(self, counts: Mapping[str, int]) -> None:
        """Counts set before a measurement, as changes that are not recorded."""
        for model, count in counts.items():
            if self.count(model) != count:
                self.change(model, count)

    def change(self, model: str, count: int) -> dict[str, Any]:
        before = self.count(model)
        started = time.monotonic()
        result = asyncio.run(self.actuator.apply_one(self.endpoint, model, count))
        row: dict[str, Any] = {"model": model, "from": before, "to": count}
        if result is None or result.ok:
            seconds = round(time.monotonic() - started, 2)
            common.progress(f"    {model} {before} -> {count}: {seconds} s")
            return {**row, "seconds": seconds, "stalled": False, "within_goal": seconds <= GOAL_S}
        if not result.pending:
            raise SystemExit(f"bench: {model} {before} -> {count} failed: {result.reason}")
        if self.release is None:
            raise StalledChange(
                f"{model} {before} -> {count} was not confirmed within {self.actuator.load_deadline_s:g} s under "
                f"a load that never drains: {result.reason}"
            )
        self.release()
        deadline = time.monotonic() + 120
        while self.count(model) != count:
            if time.monotonic() > deadline:
                raise SystemExit(f"bench: {model} {before} -> {count} never finished")
            time.sleep(0.2)
        done_s = round(time.monotonic() - started, 2)
        self.restore()
        common.progress(f"    {model} {before} -> {count}: stalled; done {done_s} s after it")
        return {**row, "seconds": None, "stalled": True, "done_once_released_s": done_s,
                "within_goal": False}  # fmt: skip


def every_change(changes: Changes, settings: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every model of `settings["models"]` through `settings["steps"]`, the root's with its
    branches at 1, a branch's with the root at its highest count (the branch is then the
    pipeline's limit)."""
    rows = []
    top = max(settings["steps"])
    for model in settings["models"]:
        others = dict.fromkeys(MODELS, 1) | ({} if model == ROOT else {ROOT: top})
        changes.set({**others, model: 1})
        rows += [changes.change(model, count) for count in settings["steps"]]
    changes.set(dict.fromkeys(MODELS, 1))
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    done = [row["seconds"] for row in rows if row["seconds"] is not None]
    return {
        "changes": rows,
        "changes_total": len(rows),
        "within_goal": sum(1 for row in rows if row["within_goal"]),
        "stalled": sum(1 for row in rows if row["stalled"]),
        "max_seconds": max(done, default=None),
        "median_seconds": round(statistics.median(done), 2) if done else None,
    }


def under_loads(
    triton: LocalTriton, settings: Mapping[str, Any], release_stalls: bool = True
) -> dict[str, Any]:
    """The changes under the never-pausing closed loop, then under the open loop, with the
    requests each load had answered and failed meanwhile. `release_stalls` False: a stalled
    change raises StalledChange (a test) instead of being released (the baseline arm)."""
    changes = Changes(triton, settings["stall_s"])
    changes.set(dict.fromkeys(MODELS, 1))
    result: dict[str, Any] = {}
    with common.steady_load(triton, ROOT, settings) as closed:
        capacity = closed.window(settings["capacity_s"]).throughput_rps
        common.progress(f"  closed loop ({settings['concurrency']} in flight): {capacity:.0f} rps")
        if release_stalls:
            changes.release = lambda: closed.set_concurrency(0)
            changes.restore = lambda: closed.set_concurrency(settings["concurrency"])
        started = time.monotonic()
        rows = every_change(changes, settings)
        during = closed.stats(started, time.monotonic())
        result["closed_loop"] = {
            **summary(rows),
            "served": during.requests,
            "failed": during.failures,
            "first_error": during.first_error,
        }
    rate = round(OPEN_LOOP_SHARE * capacity, 1)
    result["open_loop_rps"] = rate
    common.progress(f"  open loop at {rate} rps ({OPEN_LOOP_SHARE} of {capacity:.0f})")
    with common.OpenLoopLoad(triton.grpc_url, ROOT, rows=settings["rows"], seed=7) as opened:
        opened.set_rate(rate)
        time.sleep(settings["warmup_s"])
        if release_stalls:
            changes.release = lambda: opened.set_rate(0)
            changes.restore = lambda: opened.set_rate(rate)
        started = time.time()  # the open loop's clock
        rows = every_change(changes, settings)
        during = opened.stats(started, time.time())
        result["open_loop"] = {
            **summary(rows),
            "served": during.served,
            "failed": during.failed,
            "dropped": during.dropped,
            "first_error": opened.last_error if during.failed else None,
        }
    return result


def cost(servers: Mapping[str, LocalTriton], settings: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each split's throughput and p95 under each arm, arms alternated over the rounds."""
    measured: dict[tuple[int, str], list[common.Measurement]] = {}
    for round_index in range(settings["rounds"]):
        order = ARMS if round_index % 2 == 0 else ARMS[::-1]
        for arm in order:
            triton = servers[arm]
            changes = Changes(triton, settings["stall_s"])
            with common.steady_load(triton, ROOT, settings) as load:
                changes.release = lambda load=load: load.set_concurrency(0)
                changes.restore = lambda load=load: load.set_concurrency(settings["concurrency"])
                for index, split in enumerate(settings["splits"]):
                    changes.set(split)
                    m = common.steady_window(load, settings)
                    measured.setdefault((index, arm), []).append(m)
                    common.progress(
                        f"  round {round_index + 1} {arm} {split}: {m.throughput_rps:.1f} rps, "
                        f"p95 {m.p95_ms or 0:.0f} ms"
                    )
            changes.release = None
            changes.set(dict.fromkeys(MODELS, 1))
    rows = []
    for index, split in enumerate(settings["splits"]):
        arms = {}
        for arm in ARMS:
            runs = measured[(index, arm)]
            arms[arm] = {
                "throughput_rps": round(statistics.mean(m.throughput_rps for m in runs), 2),
                "p95_ms": round(statistics.mean(m.p95_ms or 0.0 for m in runs), 2),
                "window_rps": [round(m.throughput_rps, 2) for m in runs],
            }
        ours, default = arms[RATE_LIMIT], arms["off"]
        rows.append(
            {
                "instances": dict(split),
                **arms,
                "throughput_ratio": common.ratio(ours["throughput_rps"], default["throughput_rps"]),
                "p95_ratio": common.ratio(ours["p95_ms"], default["p95_ms"]),
            }
        )
    return rows


@contextmanager
def servers() -> Iterator[dict[str, LocalTriton]]:
    """One tritonserver per arm, started together (only the measured one is loaded)."""
    with ExitStack() as stack:
        started = {}
        for arm in ARMS:
            common.progress(f"starting tritonserver with --rate-limit={arm} ...")
            triton = LocalTriton(
                http_port=0, grpc_port=0, metrics_port=0, models=list(MODELS), rate_limit=arm
            )
            started[arm] = stack.enter_context(triton)
        yield started


def run(settings: Mapping[str, Any]) -> dict[str, Any]:
    with servers() as started:
        arms = {}
        for arm in ARMS:
            common.progress(f"--rate-limit={arm}: count changes under load")
            arms[arm] = under_loads(started[arm], settings)
        common.progress("the cost at steady state, arms alternated")
        splits = cost(started, settings)
    ratios = [row["throughput_ratio"] for row in splits if row["throughput_ratio"]]
    return {
        "goal_s": GOAL_S,
        "arms": arms,
        "cost": splits,
        "throughput_ratio_min": min(ratios, default=None),
        "throughput_ratio_max": max(ratios, default=None),
        "settings": {k: v for k, v in settings.items() if k != "splits"},
    }


def plot(result: dict[str, Any], path: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (changes_axes, cost_axes) = plt.subplots(1, 2, figsize=(12, 4.5))
    stall_s = result["settings"]["stall_s"]
    for offset, arm in zip((-0.2, 0.2), ARMS, strict=True):
        rows = [
            row
            for load in ("closed_loop", "open_loop")
            for row in result["arms"][arm][load]["changes"]
        ]
        heights = [stall_s if row["stalled"] else row["seconds"] for row in rows]
        bars = changes_axes.bar([i + offset for i in range(len(rows))], heights, 0.4, label=arm)
        for bar, row in zip(bars, rows, strict=True):
            if row["stalled"]:
                bar.set_hatch("//")
    changes_axes.axhline(GOAL_S, color="grey", linestyle="--", label=f"goal {GOAL_S:g} s")
    changes_axes.set_xlabel("change (closed loop, then open loop; hatched: stalled)")
    changes_axes.set_ylabel("seconds until Triton's config shows it")
    changes_axes.set_title("Count changes under a load that never drains")
    changes_axes.legend()
    labels = ["/".join(str(c) for c in row["instances"].values()) for row in result["cost"]]
    xs = range(len(labels))
    for offset, arm in zip((-0.2, 0.2), ARMS, strict=True):
        cost_axes.bar(
            [x + offset for x in xs],
            [row[arm]["throughput_rps"] for row in result["cost"]],
            0.4,
            label=f"--rate-limit={arm}",
        )
    cost_axes.set_xticks(list(xs), labels)
    cost_axes.set_xlabel("instances (" + "/".join(MODELS) + ")")
    cost_axes.set_ylabel("requests/s")
    cost_axes.set_title("Steady-state throughput, same split and load")
    cost_axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


def main(argv: list[str] | None = None) -> None:
    args = common.parser(__doc__.splitlines()[0]).parse_args(argv)
    common.stop_on_signals()
    result = run(QUICK if args.quick else FULL)
    path = common.write_result("count_changes", result, args.out)
    if not args.no_plot:
        plot(result, common.plot_path(path))
    for arm in ARMS:
        for load in ("closed_loop", "open_loop"):
            row = result["arms"][arm][load]
            common.progress(
                f"--rate-limit={arm}, {load.replace('_', ' ')}: {row['within_goal']} of "
                f"{row['changes_total']} changes done within {GOAL_S:g} s, {row['stalled']} "
                f"stalled, the slowest done in {row['max_seconds']} s"
            )
    common.progress(
        f"throughput of {RATE_LIMIT} over off at steady state: {result['throughput_ratio_min']} "
        f"to {result['throughput_ratio_max']}"
    )


if __name__ == "__main__":
    main()
