"""The control loop's cost as pods and autoscalers grow, and one hung pod among them.

    python -m loadtests.bench.control_loop_scale            # 1, 4 and 16 pods; about 10 minutes
    python -m loadtests.bench.control_loop_scale --quick    # 1 and 2 pods (CI)

Pods are light local Tritons serving the pipeline's four models only (about 220 MB each;
the benchmark checks the machine's free memory first). The autoscalers are the pipeline's
four policies per pod set, run by the local driver: one `tune.Tuner` per pod set, each in
a thread of its own, as the Kubernetes driver runs each set's InstanceGroupAutoscalers apart
from the others'. Layouts: 1 pod (4 autoscalers); 4 pods in one set (4) or in four sets of
one (16); 16 pods in one set (4) or in four sets of four (16). No load is sent: the cost of a
tick is the reading, deciding and loading, whatever the traffic.

For each layout:
1. steady: every autoscaler ticks with nothing to change. The tick's time (reconcile's
   duration), the time for every autoscaler of a set to tick once (a round), and how late
   ticks came against their interval;
2. a change on every pod: minInstances 1 -> 2, then maxInstances back to 1. The time of the
   tick that loads every pod of its set, against the number of pods;
3. one hung pod (its tritonserver stopped with SIGSTOP; it accepts connections and never
   answers) while its set's minInstances goes to 2: how long that set's ticks take, when
   the set's other pods got the change, and the longest any autoscaler of the other sets
   (which have nothing to change) went without a decision. Then SIGCONT.

Result: reports/bench/control_loop_scale.json (+ .png: tick time against pods).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from loadtests.bench import common
from tritonscale.control.tick import TickResult
from tritonscale.core.spec import AutoscalerSpec
from tritonscale.drivers.tune import Policy, TuneConfig, Tuner
from tritonscale.local.triton_server import LocalTriton
from tritonscale.triton.actuator import Actuator
from tritonscale.triton.endpoints import local_endpoints

PIPELINE = "pipeline_async"
BRANCHES = ("branch_embed", "branch_classify", "branch_rank")
MODELS = (PIPELINE, *BRANCHES)
# Resident memory of one pod serving the four models, measured here (tritonserver and four
# Python stubs): the benchmark wants this much free per pod, with room to spare.
MB_PER_POD = 300

QUICK = {
    "layouts": [[1, 1], [2, 1], [2, 2]],
    "interval_s": 1,
    "steady_s": 3.0,
    "change_timeout_s": 60.0,
    "hung_min_s": 6.0,
    "hung_max_s": 60.0,
}
FULL = {
    "layouts": [[1, 1], [4, 1], [4, 4], [16, 1], [16, 4]],
    "interval_s": 2,
    "steady_s": 12.0,
    "change_timeout_s": 180.0,
    "hung_min_s": 20.0,
    "hung_max_s": 240.0,
}


# ---- pods -----------------------------------------------------------------------------


def _group_rss_mb(process: subprocess.Popen[bytes] | None) -> float | None:
    """Resident memory of a server's process group (the server and its stubs), in MB."""
    if process is None:
        return None
    try:
        group = os.getpgid(process.pid)
    except ProcessLookupError:
        return None
    out = subprocess.run(
        ["ps", "-o", "rss=", "-g", str(group)], capture_output=True, text=True, timeout=10
    ).stdout
    return sum(int(value) for value in out.split()) / 1024


def _available_mb() -> float:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return float("inf")


@contextlib.contextmanager
def tritons(count: int) -> Iterator[list[LocalTriton]]:
    """`count` light Tritons on free ports, started a few at a time; all stopped at the end."""
    needed = count * MB_PER_POD
    available = _available_mb()
    if available < needed:
        raise SystemExit(
            f"bench: {count} pods need about {needed:.0f} MB and {available:.0f} MB is available"
        )
    common.progress(f"starting {count} tritonserver(s) serving {', '.join(MODELS)} ...")
    # One repository key for every pod, as the chart gives every pod the same Secret.
    key = secrets.token_urlsafe(24)
    servers = [
        LocalTriton(
            http_port=0, grpc_port=0, metrics_port=0, models=list(MODELS), repository_key=key
        )
        for _ in range(count)
    ]
    started: list[LocalTriton] = []
    try:
        with ThreadPoolExecutor(max_workers=4) as pool:
            for server in pool.map(lambda s: s.start(), servers):
                started.append(server)
        memory = [_group_rss_mb(s.process) for s in started]
        common.progress(
            f"  ready; resident memory per pod {statistics.median(m for m in memory if m):.0f} MB"
        )
        yield started
    finally:
        # Each waits for its models to unload: side by side, not one after another.
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(lambda s: s.stop(), servers))


# ---- the driver, per pod set ----------------------------------------------------------


def _spec(model: str, settings: dict, min_instances: int, max_instances: int) -> AutoscalerSpec:
    return AutoscalerSpec.from_dict(
        {
            "model": model,
            "selector": {"matchLabels": {"app.kubernetes.io/component": "triton"}},
            **({"calls": list(BRANCHES)} if model == PIPELINE else {}),
            "minInstances": min_instances,
            "maxInstances": max_instances,
            "intervalSeconds": settings["interval_s"],
            "metricsWindowSeconds": 2 * settings["interval_s"],
        }
    )


def _config(
    index: int, pods: Sequence[LocalTriton], settings: dict, bounds: tuple[int, int]
) -> TuneConfig:
    endpoints = local_endpoints([p.http_url for p in pods], [p.metrics_url for p in pods])
    policies = [
        Policy(f"set{index}-{model.replace('_', '-')}", _spec(model, settings, *bounds))
        for model in MODELS
    ]
    return TuneConfig(endpoints=endpoints, source="scrape", prometheus_url=None, policies=policies)


@dataclass
class Tick:
    pod_set: int
    autoscaler: str
    result: TickResult


@dataclass
class Loops:
    """One Tuner per pod set, each in its own thread, for one phase."""

    sets: list[list[LocalTriton]]
    settings: dict
    bounds: tuple[int, int]
    # A set whose autoscalers get other bounds (the rest keep `bounds`): {set index: bounds}.
    bounds_of: dict[int, tuple[int, int]] = field(default_factory=dict)
    states: dict[str, Any] = field(default_factory=dict)
    ticks: list[Tick] = field(default_factory=list)

    started_at: float = 0.0  # unix s
    ended_at: float = 0.0

    def run(self, until: Any, timeout_s: float) -> float:
        """Tick until `until(ticks)` is true or `timeout_s` passed; returns the seconds."""
        lock = threading.Lock()
        stop = threading.Event()
        threads = []
        started = time.monotonic()
        self.started_at = time.time()
        for index, pods in enumerate(self.sets):

            def record(name: str, result: TickResult, index: int = index) -> None:
                with lock:
                    self.ticks.append(Tick(index, name, result))

            tuner = Tuner(
                _config(index, pods, self.settings, self.bounds_of.get(index, self.bounds)),
                actuator=Actuator(pods[0].repository_key),
                echo=lambda line: None,
                on_tick=record,
                states=self.states,
            )
            thread = threading.Thread(target=tuner.run, kwargs={"stop": stop}, daemon=True)
            threads.append(thread)
            thread.start()
        while time.monotonic() - started < timeout_s:
            with lock:
                done = until(list(self.ticks))
            if done:
                break
            time.sleep(0.2)
        self.ended_at = time.time()
        stop.set()
        for thread in threads:
            # A tick in flight ends within its reads' timeouts.
            thread.join(timeout=120)
        return time.monotonic() - started


def _all_ticked(autoscalers: int, times: int = 1) -> Any:
    def check(ticks: list[Tick]) -> bool:
        counts: dict[str, int] = {}
        for tick in ticks:
            counts[tick.autoscaler] = counts.get(tick.autoscaler, 0) + 1
        return len(counts) == autoscalers and min(counts.values()) >= times

    return check


def _name(pod: LocalTriton) -> str:
    """The pod's name as the local driver knows it (host:port)."""
    return local_endpoints([pod.http_url])[0].name


def _all_at(sets: list[list[LocalTriton]], count: int) -> Any:
    """True once every autoscaler's latest tick saw `count` on every pod of its set."""
    pods_of = {index: [_name(p) for p in pods] for index, pods in enumerate(sets)}

    def check(ticks: list[Tick]) -> bool:
        latest: dict[str, Tick] = {}
        for tick in ticks:
            latest[tick.autoscaler] = tick
        if len(latest) < len(MODELS) * len(sets):
            return False
        return all(
            tick.result.live_counts.get(pod) == count
            for tick in latest.values()
            for pod in pods_of[tick.pod_set]
        )

    return check


def _first_all_at(ticks: Sequence[Tick], pods: Sequence[str], count: int) -> float | None:
    """When (unix s, a tick's end) every autoscaler of `ticks` had last seen `count` on `pods`."""
    latest: dict[str, Tick] = {}
    for tick in sorted(ticks, key=lambda t: t.result.at + t.result.duration_s):
        latest[tick.autoscaler] = tick
        if len(latest) == len(MODELS) and all(
            t.result.live_counts.get(pod) == count for t in latest.values() for pod in pods
        ):
            return tick.result.at + tick.result.duration_s
    return None


# ---- measurements ---------------------------------------------------------------------


def _ms(values: Sequence[float]) -> dict[str, float | None]:
    if not values:
        return {"median": None, "p95": None, "max": None}
    ordered = sorted(values)
    return {
        "median": round(1000 * statistics.median(ordered), 1),
        "p95": round(1000 * ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 1),
        "max": round(1000 * ordered[-1], 1),
    }


def _longest_without_decision_s(ticks: Sequence[Tick], start: float, end: float) -> float | None:
    """The longest any autoscaler went without a decision between `start` and `end` (unix s):
    the gaps between the ends of its ticks, the phase's start and end included. A loop that
    keeps its cadence shows about one interval plus one tick."""
    ends: dict[str, list[float]] = {}
    for tick in ticks:
        ends.setdefault(tick.autoscaler, []).append(tick.result.at + tick.result.duration_s)
    gaps = []
    for times in ends.values():
        edges = [start, *sorted(times), end]
        gaps += [b - a for a, b in zip(edges, edges[1:], strict=False)]
    return round(max(gaps), 1) if gaps else None


def _rounds_s(ticks: Sequence[Tick]) -> list[float]:
    """Per set: from the start of a tick of its first autoscaler to the end of its last one's."""
    rounds = []
    by_set: dict[int, list[Tick]] = {}
    for tick in ticks:
        by_set.setdefault(tick.pod_set, []).append(tick)
    for set_ticks in by_set.values():
        for start in range(0, len(set_ticks) - len(MODELS) + 1, len(MODELS)):
            group = set_ticks[start : start + len(MODELS)]
            first = min(t.result.at for t in group)
            last = max(t.result.at + t.result.duration_s for t in group)
            rounds.append(last - first)
    return rounds


def _applied(ticks: Sequence[Tick]) -> list[Tick]:
    return [t for t in ticks if t.result.applied and all(p.ok for p in t.result.applied)]


def measure_layout(
    pods: list[LocalTriton], sets: int, settings: dict, instances: list[common.Instances]
) -> dict[str, Any]:
    size = len(pods) // sets
    groups = [pods[i * size : (i + 1) * size] for i in range(sets)]
    autoscalers = len(MODELS) * sets
    label = f"{len(pods)} pod(s) in {sets} set(s), {autoscalers} autoscalers"
    for each in instances:
        each.set(dict.fromkeys(MODELS, 1))
    states: dict[str, Any] = {}

    common.progress(f"{label}: steady ({settings['steady_s']:.0f} s)")
    steady = Loops(groups, settings, (1, 4), states=states)
    steady.run(lambda ticks: False, settings["steady_s"])
    steady_durations = [t.result.duration_s for t in steady.ticks]

    common.progress(f"{label}: minInstances 1 -> 2 on every pod")
    up = Loops(groups, settings, (2, 4), states=states)
    up_s = up.run(_all_at(groups, 2), settings["change_timeout_s"])
    common.progress(f"{label}: maxInstances 2 -> 1 on every pod")
    down = Loops(groups, settings, (1, 1), states=states)
    down_s = down.run(_all_at(groups, 1), settings["change_timeout_s"])
    loads = _applied(up.ticks) + _applied(down.ticks)
    per_pod = [p.seconds for t in loads for p in t.result.applied]

    row: dict[str, Any] = {
        "pods": len(pods),
        "sets": sets,
        "pods_per_set": size,
        "autoscalers": autoscalers,
        "steady": {
            "ticks": len(steady.ticks),
            "tick_ms": _ms(steady_durations),
            "round_ms": _ms(_rounds_s(steady.ticks)),
            "longest_without_decision_s": _longest_without_decision_s(
                steady.ticks, steady.started_at, steady.ended_at
            ),
        },
        "change": {
            "up_s": round(up_s, 2),
            "down_s": round(down_s, 2),
            "loading_tick_ms": _ms([t.result.duration_s for t in loads]),
            "load_per_pod_ms": _ms(per_pod),
            "pods_per_loading_tick": statistics.median([len(t.result.applied) for t in loads])
            if loads
            else None,
        },
    }
    common.progress(
        f"  steady tick {row['steady']['tick_ms']['median']} ms (median), round "
        f"{row['steady']['round_ms']['median']} ms; a change on all {size} pod(s) of a set: "
        f"tick {row['change']['loading_tick_ms']['median']} ms"
    )
    if size >= 2:
        row["hung"] = _hung(groups, settings, states, label, instances)
    return row


def _hung(
    groups: list[list[LocalTriton]],
    settings: dict,
    states: dict[str, Any],
    label: str,
    instances: list[common.Instances],
) -> dict[str, Any]:
    hung = groups[0][0]
    hung_name = _name(hung)
    assert hung.process is not None
    common.progress(
        f"{label}: {hung_name} stopped (SIGSTOP) while its set's minInstances goes 1 -> 2"
    )
    os.kill(hung.process.pid, signal.SIGSTOP)
    # Only the hung pod's set has a change to make: the other sets' ticks compare with steady.
    loops = Loops(groups, settings, (1, 4), {0: (2, 4)}, states=states)
    answering = [_name(p) for p in groups[0] if p is not hung]

    def done(ticks: list[Tick]) -> bool:
        own = [t for t in ticks if t.pod_set == 0]
        long_enough = time.time() - loops.started_at >= settings["hung_min_s"]
        return long_enough and _first_all_at(own, answering, 2) is not None

    try:
        seconds = loops.run(done, settings["hung_max_s"])
    finally:
        os.kill(hung.process.pid, signal.SIGCONT)
    own = [t for t in loops.ticks if t.pod_set == 0]
    others = [t for t in loops.ticks if t.pod_set != 0]
    reached = _first_all_at(own, answering, 2)
    span = (loops.started_at, loops.ended_at)
    result = {
        "hung_pod": hung_name,
        "seconds": round(seconds, 1),
        "own_set": {
            "ticks": len(own),
            "tick_ms": _ms([t.result.duration_s for t in own]),
            "longest_without_decision_s": _longest_without_decision_s(own, *span),
            "other_pods_changed_after_s": None
            if reached is None
            else round(reached - loops.started_at, 1),
        },
        "other_sets": {
            "ticks": len(others),
            "tick_ms": _ms([t.result.duration_s for t in others]),
            "longest_without_decision_s": _longest_without_decision_s(others, *span),
        }
        if others
        else None,
    }
    common.progress(
        f"  with {hung_name} hung: its set's ticks {result['own_set']['tick_ms']['median']} ms "
        f"(median), up to {result['own_set']['longest_without_decision_s']} s without a "
        f"decision; its other pods at the new count after "
        f"{result['own_set']['other_pods_changed_after_s']} s"
        + (
            f"; other sets up to {result['other_sets']['longest_without_decision_s']} s "
            "without a decision"
            if others
            else ""
        )
    )
    # Back to one instance each before the next layout (the hung pod answers again).
    for each in instances:
        each.set(dict.fromkeys(MODELS, 1))
    return result


def run(pods: list[LocalTriton], settings: dict) -> dict[str, Any]:
    instances = [common.Instances(p) for p in pods]
    memory = [_group_rss_mb(p.process) for p in pods]
    rows = []
    try:
        for count, sets in settings["layouts"]:
            rows.append(measure_layout(pods[:count], sets, settings, instances[:count]))
    finally:
        for each in instances:
            each.restore()
    return {
        "settings": settings,
        "models": list(MODELS),
        "pod_memory_mb": round(statistics.median(m for m in memory if m), 1),
        "layouts": rows,
    }


def plot(result: dict, path: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(9, 4.5))
    for autoscalers in sorted({row["autoscalers"] for row in result["layouts"]}):
        rows = sorted(
            (r for r in result["layouts"] if r["autoscalers"] == autoscalers),
            key=lambda r: r["pods"],
        )
        pods = [r["pods"] for r in rows]
        axes.plot(
            pods,
            [r["steady"]["tick_ms"]["median"] for r in rows],
            "o-",
            label=f"steady tick, {autoscalers} autoscalers",
        )
        axes.plot(
            pods,
            [r["change"]["loading_tick_ms"]["median"] for r in rows],
            "s--",
            label=f"tick that loads every pod of its set, {autoscalers} autoscalers",
        )
    hung = [r for r in result["layouts"] if r.get("hung")]
    if hung:
        axes.plot(
            [r["pods"] for r in hung],
            [r["hung"]["own_set"]["tick_ms"]["median"] for r in hung],
            "x:",
            color="red",
            label="tick of a set with one hung pod",
        )
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_xlabel("Triton pods")
    axes.set_ylabel("tick time, ms (median)")
    axes.set_title("Control tick time against pods")
    axes.grid(alpha=0.3, which="both")
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


def main(argv: list[str] | None = None) -> None:
    args = common.parser(__doc__.splitlines()[0]).parse_args(argv)
    settings = QUICK if args.quick else FULL
    most = max(count for count, _ in settings["layouts"])
    with tritons(most) as pods:
        result = run(pods, settings)
    path = common.write_result("control_loop_scale", result, args.out)
    if not args.no_plot:
        plot(result, common.plot_path(path))
    for row in result["layouts"]:
        common.progress(
            f"{row['pods']} pod(s), {row['autoscalers']} autoscalers: steady tick "
            f"{row['steady']['tick_ms']['median']} ms, loading tick "
            f"{row['change']['loading_tick_ms']['median']} ms"
        )


if __name__ == "__main__":
    main()
