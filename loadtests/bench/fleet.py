"""The operator on a fleet: 10, 100 and 1,000 fake Triton pods on a real API server.

    python -m loadtests.bench.fleet              # 10, 100, 1,000 pods, scrape and prometheus
    python -m loadtests.bench.fleet --quick      # 100 pods, both sources (make bench-fleet QUICK=1)

Root: each row runs in a network namespace of its own (hack.fleet.netns). A row is one fleet
(hack.fleet.fleet: control plane, KWOK, one process answering as every pod's Triton, the
operator as the chart runs it, and with the prometheus source a Prometheus scraping each pod
through file_sd), with PODS_PER_SET pods per Deployment and one autoscaler per (Deployment,
model), five models: 100 pods are 10 sets and 50 autoscalers. Every pod gets a load below one
instance's target for each model. Then:

1. warm-up: until every autoscaler has ticked twice and its metrics window is full;
2. steady (`--steady-intervals` intervals): nothing to change. Each autoscaler's ticks, from
   the operator's `tritonscale_last_reconcile_timestamp_seconds` (read every 5 s, or every
   half interval when shorter): a tick's lateness is the time between its end and the end
   of its autoscaler's previous tick beyond intervalSeconds (a tick that ends late by its
   own length counts too), and the mean tick from `tritonscale_reconcile_duration_seconds`.
   The operator's CPU (from /proc) and its largest resident memory; the API server's
   requests by the operator's user (its audit log) and by everyone (apiserver_request_total),
   and the Triton requests the operator sent (the fleet process counts them, Prometheus's
   scrapes apart), each per interval;
3. step: a tenth of the sets (at least one) get STEP_FACTOR times the load; the seconds until
   every pod of those sets runs its new count of every model (the last change of any of
   them, once all have risen and one more interval has passed without a change).

Result: reports/bench/fleet.json, a list of rows (and fleet.png: lateness and CPU by pods).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from hack.fleet import build, netns
from hack.fleet.fleet import PODS_PER_SET, Fleet, FleetConfig, remove_workdir, set_name
from loadtests.bench import common
from tritonscale.local.interrupts import stop_on_signals

NAME = "fleet"
STEP_FACTOR = 6.0  # 0.4 busy instances per pod and model become 2.4
# How often the operator's metrics are read: under half an interval, so that no tick is
# missed (an autoscaler's ticks end at least an interval apart), and seldom enough that
# rendering them (15,000 lines at 500 autoscalers) costs the operator little.
POLL_S = 5.0
QUICK: dict[str, Any] = {"sizes": [100], "sources": ["scrape", "prometheus"], "sharded": []}
FULL: dict[str, Any] = {
    "sizes": [10, 100, 1000],
    "sources": ["scrape", "prometheus"],
    # Two operator processes, each with its own share of the sets; one killed after the step.
    "sharded": [2000],
}
LAST_TICK = "tritonscale_last_reconcile_timestamp_seconds"
TICK_SECONDS = "tritonscale_reconcile_duration_seconds"


class Probe:
    """What the bench reads while a fleet runs: ticks, the operator's processes, the API
    server's and the fleet's request counts."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.poll_s = min(POLL_S, fleet.config.interval_s / 2)
        self.ticks: dict[str, list[float]] = {}
        # Which operator process ticked each autoscaler (with shards: its set's owner).
        self.shard_of: dict[str, set[int]] = {}
        self.tick_seconds = (0.0, 0.0)  # every autoscaler's ticks: seconds, count
        self.series = 0  # the operators' own series, summed over the processes
        self.rss_mib: list[float] = []
        self._audit_offset = 0
        self._ticks_per_s = os.sysconf("SC_CLK_TCK")

    def poll(self) -> None:
        """Record each autoscaler's last tick, and the operators' resident memory."""
        seconds = count = 0.0
        series = 0
        for shard in range(self.fleet.config.shards):
            if self.fleet.operator_name(shard) not in self.fleet.processes:
                continue  # killed, not started again yet
            try:
                text = self.fleet.operator_metrics(shard)
            except OSError:  # not serving yet
                self.fleet.check_alive()
                continue
            process_seconds, process_count = tick_totals(text)
            seconds += process_seconds
            count += process_count
            for line in text.splitlines():
                if not line or line.startswith("#"):
                    continue
                series += 1
                if not line.startswith(LAST_TICK + "{"):
                    continue
                labels, value = line[len(LAST_TICK) :].rsplit(" ", 1)
                name = labels.split('autoscaler="', 1)[1].split('"', 1)[0]
                self.shard_of.setdefault(name, set()).add(shard)
                seen = self.ticks.setdefault(name, [])
                if not seen or seen[-1] != float(value):
                    seen.append(float(value))
        self.tick_seconds = (seconds, count)
        self.series = series
        self.rss_mib.append(
            max((self._rss_mib(pid) for pid in self.fleet.operator_pids), default=0)
        )

    def operators_cpu_s(self) -> float:
        """CPU seconds so far of every operator process."""
        return sum(self.cpu_s(pid) for pid in self.fleet.operator_pids)

    def _proc(self, name: str, pid: int | None = None) -> str:
        return Path(f"/proc/{pid or self.fleet.operator_pid}/{name}").read_text()

    def cpu_s(self, pid: int | None = None) -> float:
        """CPU seconds so far of the operator (or of the process `pid`)."""
        fields = self._proc("stat", pid).rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self._ticks_per_s

    def prometheus(self) -> tuple[float, float] | None:
        """Prometheus's CPU seconds and the instant queries it answered so far (None
        without Prometheus)."""
        prometheus = self.fleet.prometheus
        if prometheus is None or prometheus.process is None:
            return None
        queries = 0.0
        with urllib.request.urlopen(f"{prometheus.url}/metrics", timeout=10) as answer:
            text = answer.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "prometheus_http_requests_total" and sample.labels.get(
                    "handler"
                ) in ("/api/v1/query", "/api/v1/query_range"):
                    queries += sample.value
        return self.cpu_s(prometheus.process.pid), queries

    def _rss_mib(self, pid: int | None = None) -> float:
        for line in self._proc("status", pid).splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def apiserver_requests(self) -> float:
        """apiserver_request_total over every label: every client's requests so far."""
        total = 0.0
        for family in text_string_to_metric_families(self.fleet.apiserver_metrics()):
            for sample in family.samples:
                if sample.name == "apiserver_request_total":
                    total += sample.value
        return total

    def operator_requests(self, start: float, end: float) -> Counter[str]:
        """The operator's requests to the API server between two unix times, by verb and
        resource, from the audit log (one event per request)."""
        counts: Counter[str] = Counter()
        with open(self.fleet.audit_log) as log:
            for line in log:
                event = json.loads(line)
                at = _unix(event["stageTimestamp"])
                if start <= at < end:
                    ref = event.get("objectRef") or {}
                    resource = ref.get("resource", "")
                    if ref.get("subresource"):
                        resource += "/" + ref["subresource"]
                    counts[f"{event['verb']} {resource}"] += 1
        return counts

    def wait_ticks(self, timeout_s: float, at_least: int, after: float = 0.0) -> None:
        """Until every autoscaler has ended `at_least` ticks after unix time `after`."""
        expected = self.fleet.config.sets * len(self.fleet.config.models)
        deadline = time.monotonic() + timeout_s
        while True:
            self.poll()
            done = [n for n, t in self.ticks.items() if sum(x > after for x in t) >= at_least]
            if len(done) >= expected:
                return
            if time.monotonic() > deadline:
                raise SystemExit(
                    f"bench: only {len(done)} of {expected} autoscalers ticked {at_least} times "
                    f"within {timeout_s:.0f} s"
                )
            time.sleep(self.poll_s)

    def sleep(self, seconds: float) -> None:
        """Poll for `seconds`."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.poll()
            time.sleep(min(self.poll_s, max(0.0, end - time.monotonic())))


def _unix(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def lateness(
    ticks: dict[str, list[float]], start: float, end: float, interval_s: float
) -> list[float]:
    """For each tick that ended within [start, end): how much longer than one interval after
    its autoscaler's previous tick it ended (0 when on time)."""
    late = []
    for times in ticks.values():
        late += [
            max(0.0, b - a - interval_s)
            for a, b in zip(times, times[1:], strict=False)
            if start <= b < end
        ]
    return late


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def counts_of(state: dict[str, Any], sets: Iterable[str]) -> dict[tuple[str, str], int]:
    wanted = set(sets)
    return {
        (name, model): count
        for name, pod in state["pods"].items()
        if pod["set"] in wanted
        for model, count in pod["counts"].items()
    }


def step(fleet: Fleet, probe: Probe, interval_s: float) -> dict[str, Any]:
    """The load step on a tenth of the sets: when every pod of them ran its new counts."""
    config = fleet.config
    affected = [set_name(i) for i in range(max(1, config.sets // 10))]
    others = [set_name(i) for i in range(len(affected), config.sets)]
    before = fleet.state()
    rates = {m: config.base_rate * STEP_FACTOR for m in config.models}
    started = time.time()
    fleet.set_rates({name: rates for name in affected})
    common.progress(f"  step: {len(affected)} sets at {STEP_FACTOR:g}x the load")
    old = counts_of(before, affected)
    timeout_s = 8 * interval_s + config.metrics_window_s
    deadline = time.monotonic() + timeout_s
    risen_at = None
    last_change = started
    while time.monotonic() < deadline:
        probe.sleep(probe.poll_s)
        state = fleet.state()
        now = counts_of(state, affected)
        if risen_at is None and all(now[key] > old[key] for key in old):
            risen_at = time.monotonic()
        last_change = max(
            pod["changed_at"][m]
            for pod in state["pods"].values()
            if pod["set"] in affected
            for m in config.models
        )
        # Settled: all rose, and nothing changed for an interval since.
        if risen_at is not None and time.time() - last_change > interval_s + probe.poll_s:
            break
    after = fleet.state()
    now = counts_of(after, affected)
    settled = risen_at is not None
    unaffected_changed = sum(
        counts_of(after, others)[k] != v for k, v in counts_of(before, others).items()
    )
    return {
        "seconds_to_apply_step": round(last_change - started, 1) if settled else None,
        "step": {
            "sets": len(affected),
            "factor": STEP_FACTOR,
            "pod_models": len(old),
            "risen": sum(now[k] > old[k] for k in old),
            "counts_after": dict(sorted(Counter(now.values()).items())),
            "unaffected_changed": unaffected_changed,
            "timeout_s": None if settled else timeout_s,
        },
        "step_window": (started, time.time()),
    }


def kill_shard(fleet: Fleet, probe: Probe, shard: int, interval_s: float) -> dict[str, Any]:
    """SIGKILL one operator process and start it again at once (as the kubelet restarts a
    StatefulSet's pod): the seconds until every autoscaler it owned ticked again, and where
    they went: until the new process served its metrics (start-up and imports), until its
    first tick ended (kopf's listing and indexes, its daemons, that tick), the mean length of
    its ticks so far, and its CPU seconds meanwhile."""
    owned = [name for name, shards in probe.shard_of.items() if shard in shards]
    killed_at = time.time()
    fleet.kill_operator(shard)
    fleet.start_operator(shard)
    common.progress(f"  shard {shard} killed and started again; {len(owned)} autoscalers")
    name = fleet.operator_name(shard)
    pid = fleet.processes[name].pid
    timeline: dict[str, Any] = {"killed_shard": shard}

    def since_kill(at: float) -> float:
        return round(at - killed_at, 1)

    deadline = time.monotonic() + 8 * interval_s + 120
    while time.monotonic() < deadline:
        if "seconds_to_serve_metrics" not in timeline:
            try:
                fleet.operator_metrics(shard)
                timeline["seconds_to_serve_metrics"] = since_kill(time.time())
            except OSError:
                pass
        probe.sleep(
            min(1.0, probe.poll_s) if "seconds_to_first_tick" not in timeline else probe.poll_s
        )
        firsts = [
            min(t for t in probe.ticks.get(n, ()) if t > killed_at)
            for n in owned
            if any(t > killed_at for t in probe.ticks.get(n, ()))
        ]
        if firsts and "seconds_to_first_tick" not in timeline:
            timeline["seconds_to_first_tick"] = since_kill(min(firsts))
            timeline["cpu_s_to_first_tick"] = round(probe.cpu_s(pid), 1)
        if len(firsts) == len(owned):
            timeline["seconds_to_tick_again"] = since_kill(max(firsts))
            timeline["cpu_s_to_tick_again"] = round(probe.cpu_s(pid), 1)
            seconds, count = tick_totals(fleet.operator_metrics(shard))
            timeline["mean_tick_s_after_restart"] = _round(seconds / count if count else None)
            return timeline
    return {**timeline, "seconds_to_tick_again": None, "ticked_again": len(firsts)}


def tick_totals(metrics_text: str) -> tuple[float, float]:
    """One operator process's ticks since it started: their seconds and their count."""
    seconds = count = 0.0
    for line in metrics_text.splitlines():
        if line.startswith(TICK_SECONDS + "_sum{"):
            seconds += float(line.rsplit(" ", 1)[1])
        elif line.startswith(TICK_SECONDS + "_count{"):
            count += float(line.rsplit(" ", 1)[1])
    return seconds, count


def run_row(
    pods: int,
    source: str,
    interval_s: int,
    steady_intervals: int,
    window_s: int,
    shards: int = 1,
) -> dict[str, Any]:
    """One fleet: bring-up, warm-up, the steady window and the step (and with shards, one
    killed)."""
    config = FleetConfig(
        pods=pods,
        source=source,
        interval_s=interval_s,
        metrics_window_s=window_s,
        shards=shards,
    )
    autoscalers = config.sets * len(config.models)
    common.progress(f"{pods} pods, {autoscalers} autoscalers, {source}, {shards} shard(s)")
    workdir = Path(tempfile.mkdtemp(prefix="tritonscale-fleet-"))
    started = time.monotonic()
    failed = True
    try:
        with Fleet(config, workdir, progress=lambda line: common.progress("  " + line)) as fleet:
            bring_up_s = time.monotonic() - started
            probe = Probe(fleet)
            warm_from = time.time()
            probe.wait_ticks(timeout_s=4 * interval_s + 120 + pods * 0.3, at_least=2)
            # The metrics window full, so that the policy sees the whole load.
            probe.sleep(max(0.0, warm_from + config.metrics_window_s - time.time()))
            common.progress("  warm: every autoscaler ticked twice; steady window")
            # Steady: nothing to change.
            t0, cpu0 = time.time(), probe.operators_cpu_s()
            cpu_each0 = [probe.cpu_s(pid) for pid in fleet.operator_pids]
            api0, triton0 = probe.apiserver_requests(), fleet.state()["requests"]
            prometheus0 = probe.prometheus()
            probe.rss_mib.clear()
            ticks0 = probe.tick_seconds
            probe.sleep(steady_intervals * interval_s)
            ticks1 = probe.tick_seconds
            t1, cpu1 = time.time(), probe.operators_cpu_s()
            cpu_each1 = [probe.cpu_s(pid) for pid in fleet.operator_pids]
            series = probe.series
            api1, triton1 = probe.apiserver_requests(), fleet.state()["requests"]
            prometheus1 = probe.prometheus()
            intervals = (t1 - t0) / interval_s
            late = lateness(probe.ticks, t0, t1, interval_s)
            operator_requests = probe.operator_requests(t0, t1)
            rss = max(probe.rss_mib)
            by_shard = [
                lateness(
                    {n: t for n, t in probe.ticks.items() if probe.shard_of.get(n) == {shard}},
                    t0,
                    t1,
                    interval_s,
                )
                for shard in range(shards)
            ]
            stepped = step(fleet, probe, interval_s)
            step_start, step_end = stepped.pop("step_window")
            step_late = lateness(probe.ticks, step_start, step_end, interval_s)
            step_requests = probe.operator_requests(step_start, step_end)
            killed = kill_shard(fleet, probe, shards - 1, interval_s) if shards > 1 else {}

            def per_interval(key: str) -> float:
                return round((triton1.get(key, 0) - triton0.get(key, 0)) / intervals, 1)

            row = {
                "pods": pods,
                "sets": config.sets,
                "autoscalers": autoscalers,
                "source": source,
                "shards": shards,
                "interval_s": interval_s,
                "metrics_window_s": window_s,
                "steady_s": round(t1 - t0, 1),
                "ticks_observed": len(late),
                "mean_tick_s": _round(
                    (ticks1[0] - ticks0[0]) / (ticks1[1] - ticks0[1])
                    if ticks1[1] > ticks0[1]
                    else None
                ),
                "p50_tick_lateness_s": _round(percentile(late, 0.5)),
                "p99_tick_lateness_s": _round(percentile(late, 0.99)),
                "max_tick_lateness_s": _round(max(late, default=None)),
                "max_tick_lateness_in_step_s": _round(max(step_late, default=None)),
                "operator_cpu_cores": round((cpu1 - cpu0) / (t1 - t0), 3),
                "operator_rss_mib": round(rss, 1),
                "operator_series": series,
                "operator_series_per_autoscaler": round(series / autoscalers, 1),
                "apiserver_requests_per_interval": round(
                    sum(operator_requests.values()) / intervals, 1
                ),
                "apiserver_requests_per_interval_by_kind": {
                    k: round(v / intervals, 1) for k, v in sorted(operator_requests.items())
                },
                "apiserver_requests_per_interval_all_clients": round((api1 - api0) / intervals, 1),
                # The step's new counts are status changes: the operator's writes while it ran.
                "apiserver_requests_in_step_by_kind": dict(sorted(step_requests.items())),
                "triton_requests_per_interval": round(
                    per_interval("http") + per_interval("metrics"), 1
                ),
                "triton_http_requests_per_interval": per_interval("http"),
                "triton_http_requests_per_interval_by_call": {
                    key.removeprefix("http:"): per_interval(key)
                    for key in sorted(set(triton0) | set(triton1))
                    if key.startswith("http:")
                },
                "triton_metrics_requests_per_interval": per_interval("metrics"),
                "triton_metrics_requests_per_pod_and_interval": round(
                    per_interval("metrics") / pods, 2
                ),
                "prometheus_scrapes_per_interval": per_interval("prometheus"),
                "prometheus_queries_per_interval": (
                    round((prometheus1[1] - prometheus0[1]) / intervals, 1)
                    if prometheus0 and prometheus1
                    else None
                ),
                "prometheus_queries_per_set_and_interval": (
                    round((prometheus1[1] - prometheus0[1]) / intervals / config.sets, 2)
                    if prometheus0 and prometheus1
                    else None
                ),
                "prometheus_cpu_cores": (
                    round((prometheus1[0] - prometheus0[0]) / (t1 - t0), 3)
                    if prometheus0 and prometheus1
                    else None
                ),
                **stepped,
                "bring_up_s": round(bring_up_s, 1),
            }
            if shards > 1:
                row["per_shard"] = [
                    {
                        "shard": shard,
                        "autoscalers": sum(1 for o in probe.shard_of.values() if o == {shard}),
                        "p99_tick_lateness_s": _round(percentile(late_of_shard, 0.99)),
                        "cpu_cores": round((cpu_each1[shard] - cpu_each0[shard]) / (t1 - t0), 3),
                    }
                    for shard, late_of_shard in enumerate(by_shard)
                ]
                # A set decided by two shards would show its autoscalers in both.
                row["autoscalers_ticked_by_two_shards"] = sum(
                    1 for owners in probe.shard_of.values() if len(owners) > 1
                )
                row.update(killed)
            failed = False
    finally:
        if failed:
            common.progress(f"  logs kept in {workdir}")
        else:
            remove_workdir(workdir)
    common.progress(
        f"  p99 lateness {row['p99_tick_lateness_s']} s, CPU {row['operator_cpu_cores']} cores, "
        f"RSS {row['operator_rss_mib']} MiB, API {row['apiserver_requests_per_interval']}"
        f"/interval, step applied in {row['seconds_to_apply_step']} s"
    )
    return row


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def plot(result: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        common.progress("matplotlib is not installed: no plot")
        return
    rows = result["rows"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for source in sorted({r["source"] for r in rows}):
        mine = [r for r in rows if r["source"] == source]
        pods = [r["pods"] for r in mine]
        # A row without a lateness (no tick pair in its window) is a gap, not a zero.
        late = [r["p99_tick_lateness_s"] for r in mine]
        left.plot(pods, [float("nan") if x is None else x for x in late], "o-", label=source)
        right.plot(pods, [r["operator_cpu_cores"] for r in mine], "o-", label=source)
    for axis, label in ((left, "p99 tick lateness (s)"), (right, "operator CPU (cores)")):
        axis.set_xscale("log")
        axis.set_xlabel("pods (5 autoscalers per 10 pods)")
        axis.set_ylabel(label)
        axis.legend()
        axis.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", help="Pod counts (multiples of 10)")
    p.add_argument("--sources", nargs="+", choices=("scrape", "prometheus"))
    p.add_argument("--interval", type=int, default=15, help="The autoscalers' intervalSeconds")
    p.add_argument("--steady-intervals", type=int, default=4)
    p.add_argument("--window", type=int, default=30, help="The autoscalers' metricsWindowSeconds")
    p.add_argument(
        "--sharded",
        type=int,
        nargs="*",
        metavar="PODS",
        help="Rows of PODS pods on two operator shards, after the others (the full run: 2000; "
        "none when --sizes or --sources name the rows; alone, the only rows)",
    )
    args = p.parse_args(argv)
    if not netns.inside():
        build.build_before_namespace()
        return netns.reexec(f"loadtests.bench.{NAME}", sys.argv[1:] if argv is None else argv)
    stop_on_signals()
    settings = dict(QUICK if args.quick else FULL)
    # Rows named on the command line are the run: the sharded rows only where asked for, or
    # in the full run; with --sharded alone, only those.
    sizes = args.sizes or ([] if args.sharded else settings["sizes"])
    if any(size % PODS_PER_SET for size in sizes):
        p.error(f"--sizes must be multiples of {PODS_PER_SET}")
    sources = args.sources or settings["sources"]
    named = args.sizes is not None or args.sources is not None
    sharded = args.sharded if args.sharded is not None else [] if named else settings["sharded"]
    rows = []
    for size in sizes:
        for source in sources:
            rows.append(run_row(size, source, args.interval, args.steady_intervals, args.window))
    for size in sharded:
        rows.append(
            run_row(size, "scrape", args.interval, args.steady_intervals, args.window, shards=2)
        )
    result = {"rows": rows, "pods_per_set": PODS_PER_SET, "step_factor": STEP_FACTOR}
    path = common.write_result(NAME, result, args.out)
    if not args.no_plot:
        plot(result, common.plot_path(path))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
