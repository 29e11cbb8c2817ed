"""A production-shaped day replayed on the real server: attainment of a latency objective
and the instances paid for it, four ways.

    python -m loadtests.bench.trace                       # a ten-minute day, each arm twice
    python -m loadtests.bench.trace --minutes 5 --repeats 1
    python -m loadtests.bench.trace --root pipeline_sync  # another pipeline's root
    python -m loadtests.bench.trace --quick               # tiny (CI)

The load is open: requests arrive whether or not the earlier ones were answered, Poisson
within each second at the second's rate of a seeded trace (loadtests.traces: a diurnal swing
of 5x compressed into the run, bursts of 2 to 3x for 10 to 30 s, a slow ramp), each request
8 rows (with one row the dynamic batcher packs dozens into one execute and the two cores,
not the instance counts, set the pace). A request's latency counts from when it was due.

Calibration, on this machine, at the start of every run (the numbers follow the server, not
constants):

1. **Capacity.** Every split of the instance budget (`--budget`, each model at least one) is
   measured under a closed loop (32 requests in flight), as operator_vs_static's sweep; the
   trace's peak is `PEAK_SHARE` (0.8) of the best full split's throughput, so that the
   largest configuration serves the peak with room for its bursts of arrivals.
2. **The objective.** p95 (`QUANTILE`) within `OBJECTIVE_MARGIN` (2) x the p95 that best
   split shows under open arrivals at the peak rate, rounded up to 5 ms: what the largest
   configuration meets with a margin, and a small one does not.
3. **The sweep under open arrivals.** At `levels` rates from the peak down (the peak x k /
   levels), the fewest-instance split that meets the objective: for each total from one
   instance each upward, the splits of that total that served most in step 1 (the best
   `splits_per_total`, two at the peak), each set, offered the level's rate, measured, and
   drained. A split that meets a level is taken to meet the lower ones.

The arms, back to back on the same trace and server, each `--repeats` times (every model at
one instance, the static arm at its split, and the load drained before each):

- **static_at_peak**: the sweep's fewest-instance split that meets the objective at the peak,
  held all day;
- **hpa_way**: each model by itself to a utilization target, as an HPA (or KEDA) per model
  would: every `intervalSeconds`, `ceil(count x utilization / target)` outside a tolerance of
  0.1, with utilization the busy fraction per instance (tritonscale.core.sizing) over the
  chart's `metricsWindowSeconds`, bounded by the chart's min and max, through the chart's
  behavior windows (tritonscale.core.behavior: the stabilization windows and rate policies);
  no joint budget. The target, windows and bounds are the chart's defaults
  (charts/tritonscale/values.yaml); a controller of this benchmark, not of the product;
- **operator**: `tritonscale tune` on the chart's autoscalers with the budget as `spec.budget`
  and the latency objective in the root's `spec.targets.latency`: the planner sizes the
  root's pipeline to it (tritonscale.core.latency: the fewest instances whose predicted
  quantile meets the objective at the rate it sizes for, within the budget);
- **limit**: computed, not run: for each second, the fewest-instance split that meets the
  objective at the sweep's level for that second's rate, summed; what perfect foresight of the
  trace would pay.

Per arm: `windows_met_share` (the 10 s windows, by when requests were due, whose p95 meets the
objective; a request failed, dropped or unanswered counts as over it), `requests_met_share`,
`instance_seconds` (the live counts, read every second, integrated) and
`goodput_per_instance_second` (requests within the objective per instance-second); the
means over the runs under `arms`, each run under `runs`. The limit's shares are the sweep's
measurements at each second's level. Result: reports/bench/trace.json (+ .png: rate,
instances and p95 over the day, one row per arm).

The objective's arithmetic, the attainment, the sweep's search and the limit are
loadtests.objective's, the HPA way's tick loadtests.hpa_way's: the simulator's trace arms
(loadtests.sim.trace_arms) judge their days with the same code.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from loadtests import chart, hpa_way, objective, traces
from loadtests.bench import common, operator_vs_static
from tritonscale.core.behavior import PolicyState
from tritonscale.core.signals import MetricSnapshot, MetricsUnavailable
from tritonscale.core.spec import AutoscalerSpec
from tritonscale.metrics.scrape import ScrapeSource
from tritonscale.triton.actuator import Actuator
from tritonscale.triton.endpoints import Endpoint

BRANCHES = ("branch_embed", "branch_classify", "branch_rank")
# The roots this benchmark knows, and the models each calls.
ROOTS: dict[str, tuple[str, ...]] = {"pipeline_async": BRANCHES, "pipeline_sync": BRANCHES}
ROWS = 8
PEAK_SHARE = 0.8
ARMS = ("static_at_peak", "hpa_way", "operator")

QUICK: dict[str, Any] = {
    # One instance each (a sweep of one split) and one window per arm: the plumbing of every
    # arm in about a minute, not their numbers.
    "budget": 4,
    "seconds": 10,
    "repeats": 1,
    "seed": 1,
    "capacity_concurrency": 8,
    "capacity_warmup_s": 0.3,
    "capacity_s": 1.0,
    "levels": 2,
    "splits_per_total": 1,
    "level_settle_s": 1.0,
    "level_measure_s": 2.0,
    "drain_s": 10.0,
    # The chart's windows are minutes long: a tiny run would see none of them act.
    "windows": {
        "intervalSeconds": 2,
        "metricsWindowSeconds": 4,
        "maxInstances": 2,
        "behavior": {
            "scaleUp": {"policies": [{"type": "Instances", "value": 1, "periodSeconds": 2}]},
            "scaleDown": {
                "stabilizationWindowSeconds": 4,
                "policies": [{"type": "Instances", "value": 1, "periodSeconds": 2}],
            },
        },
    },
}
FULL: dict[str, Any] = {
    "budget": 7,
    "seconds": 600,
    "repeats": 2,
    "seed": 1,
    "capacity_concurrency": 32,
    "capacity_warmup_s": 1.0,
    "capacity_s": 2.0,
    "levels": 5,
    "splits_per_total": 1,
    "level_settle_s": 2.0,
    "level_measure_s": 5.0,
    "drain_s": 30.0,
    "windows": None,  # the chart's own
}


# ---- the arms' specs: the chart's autoscalers -----------------------------------------


def chart_specs(root: str, settings: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """model -> spec as the chart renders it for the root and its branches (the chart's entry
    for pipeline_async stands for any root), with the quick run's windows over it."""
    autoscalers = chart.chart_autoscalers()
    specs = {}
    for model in (root, *ROOTS[root]):
        calls = ROOTS[root] if model == root else ()
        spec = chart.chart_spec(autoscalers, model, calls, root=model == root)
        specs[model] = {**spec, **(settings["windows"] or {})}
    return specs


def hpa_specs(root: str, settings: Mapping[str, Any]) -> dict[str, AutoscalerSpec]:
    selector = {"matchLabels": {"app.kubernetes.io/component": "triton"}}
    return {
        model: AutoscalerSpec.from_dict({**spec, "selector": selector})
        for model, spec in chart_specs(root, settings).items()
    }


def operator_policies(
    triton: Any, root: str, settings: Mapping[str, Any], objective_ms: float
) -> dict[str, Any]:
    """The local driver's policy file: the chart's autoscalers, the budget on each, and the
    latency objective on the root."""
    policies = []
    for model, spec in chart_specs(root, settings).items():
        spec = {**spec, "budget": {"name": "pipeline", "instancesPerPod": settings["budget"]}}
        if model == root:
            latency = {"quantile": objective.QUANTILE, "milliseconds": objective_ms}
            spec["targets"] = {**spec.get("targets", {}), "latency": latency}
        policies.append({"name": model.replace("_", "-"), "spec": spec})
    return {
        "triton": {"http": [triton.http_url], "metrics": [triton.metrics_url]},
        "metrics": {"source": "scrape"},
        "policies": policies,
    }


# ---- splits and the sweep ----------------------------------------------------------------


def splits(models: Sequence[str], budget: int) -> list[dict[str, int]]:
    """Every count of the models, each >= 1, with a total of at most `budget`."""
    return [
        counts
        for total in range(len(models), budget + 1)
        for counts in operator_vs_static.static_configurations(total, models)
    ]


def label(counts: Mapping[str, int]) -> str:
    return "/".join(str(n) for n in counts.values())


class OpenLoad:
    """One open-loop load on the root for the whole run, its rate set from outside."""

    def __init__(self, triton: Any, root: str, seed: int) -> None:
        self.load = common.OpenLoopLoad(triton.grpc_url, root, ROWS, seed=seed)

    def drain(self, timeout_s: float) -> bool:
        drained = self.load.drain(timeout_s)
        if not drained:
            common.progress(
                f"  {self.load.in_flight} requests still in flight after {timeout_s:g} s"
            )
        return drained

    def measure(self, rate: float, settle_s: float, seconds: float, objective_s: float) -> dict:
        """Offer `rate`, let the queues settle, measure, then drain: p95 (misses counted)
        and the share of requests within the objective among those due in the window."""
        self.load.set_rate(rate)
        time.sleep(settle_s)
        start = time.time()
        time.sleep(seconds)
        end = time.time()
        self.drain(max(seconds * 4, 10.0))
        due, answered = self.load.due_and_latencies(start, end)
        ok = [latency for _, latency in answered if latency is not None]
        p95 = objective.quantile_with_misses(ok, len(due), objective.QUANTILE)
        met = sum(1 for latency in ok if latency <= objective_s)
        return {
            "rate": round(rate, 2),
            "due": len(due),
            "p95_ms": None if p95 is None or math.isinf(p95) else round(1000 * p95, 1),
            "met_share": round(met / len(due), 4) if due else None,
            "meets": p95 is not None and p95 <= objective_s,
        }


def capacity_sweep(
    triton: Any, instances: common.Instances, root: str, settings: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Every split of the budget under one closed loop that runs throughout (its throughput)."""
    models = (root, *ROOTS[root])
    candidates = splits(models, settings["budget"])
    common.progress(f"capacity: {len(candidates)} splits of at most {settings['budget']} instances")
    load = common.SteadyClosedLoop(
        triton.grpc_url,
        root,
        common.pipeline_inputs(ROWS),
        concurrency=settings["capacity_concurrency"],
    )
    rows = []
    with load:
        for index, counts in enumerate(candidates, start=1):
            instances.set(counts)
            load.window(settings["capacity_warmup_s"])
            m = load.window(settings["capacity_s"])
            rows.append({"instances": counts, "throughput_rps": round(m.throughput_rps, 1)})
            common.progress(
                f"  [{index}/{len(candidates)}] {label(counts)}: {m.throughput_rps:.1f} rps"
            )
    return rows


def objective_sweep(
    load: OpenLoad,
    instances: common.Instances,
    capacity: Sequence[Mapping[str, Any]],
    peak: float,
    settings: Mapping[str, Any],
) -> tuple[float, dict[str, Any], list[dict[str, Any]]]:
    """The objective (ms), the best full split's measurement at the peak, and each level's
    fewest-instance split that meets it, from the peak down."""
    budget = settings["budget"]
    full = [row for row in capacity if sum(row["instances"].values()) == budget]
    best = max(full, key=lambda row: row["throughput_rps"])["instances"]
    instances.set(best)
    common.progress(f"objective: {label(best)} under open arrivals at the peak, {peak:.0f} rps")
    probe = load.measure(
        peak, settings["level_settle_s"], settings["level_measure_s"] * 2, math.inf
    )
    if probe["p95_ms"] is None:
        raise SystemExit(f"bench: {label(best)} answered nothing at {peak:.0f} rps")
    objective_ms = objective.objective_ms(probe["p95_ms"])
    common.progress(f"  p95 {probe['p95_ms']} ms: the objective is p95 <= {objective_ms:g} ms")
    ranked: dict[int, list[dict[str, int]]] = {}
    for row in sorted(capacity, key=lambda row: -row["throughput_rps"]):
        ranked.setdefault(sum(row["instances"].values()), []).append(row["instances"])

    def measure(counts: dict[str, int], rate: float) -> dict[str, Any]:
        instances.set(counts)
        row = load.measure(
            rate, settings["level_settle_s"], settings["level_measure_s"], objective_ms / 1000
        )
        common.progress(
            f"  {rate:.0f} rps on {label(counts)}: p95 {row['p95_ms']} ms, "
            f"{100 * (row['met_share'] or 0):.0f} % within, "
            f"{'meets' if row['meets'] else 'misses'}"
        )
        return row

    def announce(rate: float) -> None:
        common.progress(
            f"level {rate:.0f} rps: the fewest instances that meet p95 <= {objective_ms:g} ms"
        )

    levels = objective.sweep_levels(
        ranked, measure, peak, settings["levels"], settings["splits_per_total"], announce
    )
    return objective_ms, probe, levels


class HpaWay:
    """Every model to its utilization target by itself, through the chart's behavior windows,
    on a thread: every `intervalSeconds` one metrics read (the operator's ScrapeSource) and,
    per model, HPA's formula, stabilization and rate policies (tritonscale.core.behavior)."""

    def __init__(self, triton: Any, specs: Mapping[str, AutoscalerSpec]) -> None:
        self.specs = dict(specs)
        self.endpoint = Endpoint("local", triton.http_url, triton.metrics_url)
        self.actuator = Actuator(triton.repository_key)
        self.source = ScrapeSource()
        self.states = {model: PolicyState() for model in specs}
        self.stopping = threading.Event()
        self.changes: list[dict[str, Any]] = []
        self.skipped: list[dict[str, Any]] = []  # ticks, or a model's, that changed nothing
        self.error: str | None = None
        self.thread = threading.Thread(target=self._run, name="hpa-way", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=120)

    def _run(self) -> None:
        interval = min(spec.interval_seconds for spec in self.specs.values())
        try:
            asyncio.run(self._loop(interval))
        except Exception as error:  # noqa: BLE001 - reported in the result, the run goes on
            self.error = f"{type(error).__name__}: {error}"

    async def _loop(self, interval: float) -> None:
        window = max(spec.metrics_window_seconds for spec in self.specs.values())
        next_at = time.time()
        while not self.stopping.is_set():
            now = time.time()
            try:
                snapshot = await self.source.snapshot(list(self.specs), [self.endpoint], window)
            except MetricsUnavailable as error:
                # As the HPA does without metrics: nothing changes this tick.
                self.skipped.append({"t": round(now, 2), "reason": str(error)})
                snapshot = None
            for model, spec in self.specs.items():
                if snapshot is None:
                    break
                try:
                    await self._tick(model, spec, snapshot, now)
                except Exception as error:  # noqa: BLE001 - this model waits for the next tick
                    self.skipped.append({"t": round(now, 2), "reason": f"{model}: {error}"})
            next_at += interval
            self.stopping.wait(max(0.0, next_at - time.time()))

    async def _tick(
        self, model: str, spec: AutoscalerSpec, snapshot: MetricSnapshot, now: float
    ) -> None:
        """One model's HPA tick (loadtests.hpa_way), then the load when the count changes."""
        current = await self.actuator.live_count(self.endpoint, model)
        # HPA's caution: no metrics (or a window not yet full), no change.
        signals = snapshot.model(model) if snapshot.complete else None
        count, self.states[model] = hpa_way.hpa_tick(
            spec, self.states[model], current, signals, now
        )
        if count != current:
            result = await self.actuator.apply_one(self.endpoint, model, count)
            self.changes.append(
                {"t": round(now, 2), "model": model, "from": current, "to": count,
                 "ok": result is None or result.ok}
            )  # fmt: skip


# ---- one arm on the trace -------------------------------------------------------------


class CountPoller:
    """The live counts of the models, read every second on a thread, with when."""

    def __init__(self, triton: Any, models: Sequence[str]) -> None:
        self.models = list(models)
        self.actuator = Actuator(triton.repository_key)
        self.endpoint = Endpoint("local", triton.http_url)
        self.samples: list[tuple[float, dict[str, int]]] = []
        self.failed_reads = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="counts", daemon=True)

    def _run(self) -> None:
        async def loop() -> None:
            while not self.stopping.is_set():
                counts = dict(self.samples[-1][1]) if self.samples else {}
                for model in self.models:
                    try:
                        counts[model] = await self.actuator.live_count(self.endpoint, model)
                    except Exception:  # noqa: BLE001 - a read that fails keeps the last count
                        self.failed_reads += 1
                if counts:
                    self.samples.append((time.time(), counts))
                await asyncio.sleep(1.0)

        asyncio.run(loop())

    def __enter__(self) -> CountPoller:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(timeout=30)


def replay(
    load: OpenLoad,
    trace: traces.Trace,
    arm: str,
    poller: CountPoller,
    check: Callable[[], None] | None = None,
) -> tuple[float, float]:
    """The trace's rate second by second (Poisson within each); returns its start and end."""
    start = time.time()
    for second, rate in enumerate(trace.rates):
        load.load.set_rate(rate)
        if second % 30 == 0:
            counts = label(poller.samples[-1][1]) if poller.samples else "?"
            common.progress(
                f"  {arm} t={second}s: {rate:.0f} rps offered, {load.load.in_flight} in flight, "
                f"instances {counts}"
            )
        if check is not None:
            check()
        time.sleep(max(0.0, start + second + 1 - time.time()))
    end = start + trace.seconds
    load.load.set_rate(0)
    return start, end


def run_arm(
    triton: Any,
    arm: str,
    load: OpenLoad,
    instances: common.Instances,
    trace: traces.Trace,
    root: str,
    settings: Mapping[str, Any],
    static_counts: Mapping[str, int],
    objective_ms: float,
    run_label: str,
) -> dict[str, Any]:
    models = (root, *ROOTS[root])
    instances.set(dict(static_counts) if arm == "static_at_peak" else dict.fromkeys(models, 1))
    load.drain(settings["drain_s"])
    common.progress(f"{run_label}: {arm}")
    extra: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory(prefix="bench-trace-") as folder,
        CountPoller(triton, models) as poller,
    ):
        if arm == "operator":
            config = Path(folder) / "policies.yaml"
            policy_file = operator_policies(triton, root, settings, objective_ms)
            config.write_text(yaml.safe_dump(policy_file, sort_keys=False))
            log, output = Path(folder) / "decisions.jsonl", Path(folder) / "tune.out"
            tune = common.start_tune(triton, config, log, output)
            common.wait_for_first_tick(tune, log, output)

            def driver_up() -> None:
                common.exit_if_stopped(tune, output)

            try:
                start, end = replay(load, trace, arm, poller, driver_up)
            finally:
                common.stop_tune(tune)
            _, decisions = common.read_decisions(log)
            extra = {
                "decisions": len(decisions),
                "scale_changes": sum(
                    1 for d in decisions for pod in d.get("applied") or () if pod.get("ok")
                ),
                "tune_output_tail": output.read_text().strip().splitlines()[-3:],
            }
        elif arm == "hpa_way":
            controller = HpaWay(triton, hpa_specs(root, settings))
            controller.start()
            try:
                start, end = replay(load, trace, arm, poller)
            finally:
                controller.stop()
            changes = [
                {**change, "t": round(change["t"] - start, 1)} for change in controller.changes
            ]
            extra = {
                "changes": changes,
                # Ticks (or one model's) that changed nothing: no metrics, a failed read.
                "skipped": [
                    {**skip, "t": round(skip["t"] - start, 1)} for skip in controller.skipped
                ],
                "controller_error": controller.error,
            }
        else:
            start, end = replay(load, trace, arm, poller)
    load.drain(settings["drain_s"])
    due, answered = load.load.due_and_latencies(start, end)
    attained = objective.attainment(due, answered, start, trace.seconds, objective_ms / 1000)
    totals = [(at, sum(counts.values())) for at, counts in poller.samples]
    if not totals:  # the counts could not be read: only a static arm's are known
        totals = [(start, sum(static_counts.values()) if arm == "static_at_peak" else 0)]
    spent = objective.instance_seconds(totals, start, end)
    timeline = []
    for row in attained.per_second:
        at = start + row["t"]
        held = [counts for when, counts in poller.samples if when <= at + 1]
        counts = held[-1] if held else (dict(static_counts) if arm == "static_at_peak" else {})
        timeline.append({**row, "rate": round(trace.rates[row["t"]], 1), "instances": counts})
    result = {
        **objective.arm_metrics(attained, spent),
        "requests_due": attained.due,
        "requests_met": attained.met,
        "windows": attained.windows,
        "max_total_instances": max((total for _, total in totals), default=None),
        "failed_count_reads": poller.failed_reads,
        "timeline": timeline,
        **extra,
    }
    common.progress(
        f"  {arm}: {100 * (result['windows_met_share'] or 0):.0f} % of windows and "
        f"{100 * (result['requests_met_share'] or 0):.1f} % of requests within "
        f"{objective_ms:g} ms, {result['instance_seconds']:.0f} instance-seconds, "
        f"{result['goodput_per_instance_second']} good requests per instance-second"
    )
    return result


def mean_of(runs: Sequence[Mapping[str, Any]], key: str) -> float | None:
    values = [run[key] for run in runs if run.get(key) is not None]
    return round(statistics.mean(values), 4) if values else None


def run(triton: Any, settings: Mapping[str, Any], root: str = "pipeline_async") -> dict[str, Any]:
    if root not in ROOTS:
        raise SystemExit(f"bench: unknown root {root!r} (known: {', '.join(ROOTS)})")
    instances = common.Instances(triton)
    models = (root, *ROOTS[root])
    try:
        capacity = capacity_sweep(triton, instances, root, settings)
        full = [row for row in capacity if sum(row["instances"].values()) == settings["budget"]]
        largest = max(row["throughput_rps"] for row in full)
        peak = PEAK_SHARE * largest
        common.progress(
            f"the best full split serves {largest:.0f} rps: the trace peaks at {peak:.0f}"
        )
        load = OpenLoad(triton, root, settings["seed"])
        with load.load:
            objective_ms, probe, levels = objective_sweep(load, instances, capacity, peak, settings)
            static = levels[0]["chosen"]
            if not static["meets"]:
                common.progress("  no split of the budget meets the objective at the peak")
            trace = traces.production_trace(settings["seconds"], peak, settings["seed"])
            common.progress(
                f"trace: {trace.seconds} s, {trace.trough_rps:.0f} to {trace.peak_rps:.0f} rps, "
                f"{len(trace.bursts)} bursts; static at peak {label(static['instances'])}"
            )
            runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
            for repeat in range(settings["repeats"]):
                for arm in ARMS:
                    runs[arm].append(
                        run_arm(
                            triton, arm, load, instances, trace, root, settings,
                            static["instances"], objective_ms,
                            f"run {repeat + 1} of {settings['repeats']}",
                        )
                    )  # fmt: skip
    finally:
        instances.restore()
    arms: dict[str, Any] = {
        arm: {**{key: mean_of(runs[arm], key) for key in objective.ARM_KEYS}, "runs": runs[arm]}
        for arm in ARMS
    }
    arms["static_at_peak"]["instances"] = static["instances"]
    arms["limit"] = objective.limit_arm(trace, levels)
    return {
        "settings": {key: value for key, value in settings.items()},
        "root": root,
        "models": list(models),
        "budget": settings["budget"],
        "capacity": capacity,
        "largest_split_rps": largest,
        "peak_rps": round(peak, 2),
        "objective": {"quantile": objective.QUANTILE, "milliseconds": objective_ms},
        "objective_probe": probe,
        "levels": levels,
        "trace": trace.to_dict(),
        "arms": arms,
    }


def plot(result: Mapping[str, Any], path: Any) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = ["static_at_peak", "hpa_way", "operator", "limit"]
    objective = result["objective"]["milliseconds"]
    rates = result["trace"]["rates"]
    figure, rows = plt.subplots(len(shown), 1, figsize=(10, 2.6 * len(shown)), sharex=True)
    for axes, arm in zip(rows, shown, strict=True):
        seconds = list(range(len(rates)))
        axes.fill_between(seconds, rates, color="0.85", label="offered rate (req/s)")
        axes.set_ylabel("req/s")
        counts = axes.twinx()
        if arm == "limit":
            totals = result["arms"]["limit"]["total_instances"]
            counts.step(seconds, totals, where="post", color="black", label="instances")
        else:
            run = result["arms"][arm]["runs"][0]
            totals = [sum(row["instances"].values()) or math.nan for row in run["timeline"]]
            counts.step(seconds, totals, where="post", color="black", label="instances (run 1)")
            latency = axes.twinx()
            latency.spines["right"].set_position(("axes", 1.08))
            p95 = [math.nan if row["p95_ms"] is None else row["p95_ms"] for row in run["timeline"]]
            latency.plot(seconds, p95, color="tab:red", linewidth=0.7, label="p95 per second")
            latency.axhline(objective, color="tab:red", linestyle="--", linewidth=0.8)
            latency.set_ylabel("p95 ms", color="tab:red")
            latency.set_yscale("log")
        counts.set_ylabel("instances")
        counts.set_ylim(0, max((t for t in totals if not math.isnan(t)), default=0) + 2)
        share = result["arms"][arm]["windows_met_share"]
        axes.set_title(
            f"{arm}: {100 * (share or 0):.0f} % of 10 s windows within p95 <= {objective:g} ms, "
            f"{result['arms'][arm]['instance_seconds']:.0f} instance-seconds",
            fontsize="small",
        )
        axes.grid(alpha=0.3)
    rows[-1].set_xlabel("seconds into the trace")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


def main(argv: list[str] | None = None) -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--root", default="pipeline_async", choices=sorted(ROOTS))
    p.add_argument("--budget", type=int, help="the instance budget of the sweep and the operator")
    p.add_argument("--minutes", type=float, help="the trace's length (default 10)")
    p.add_argument("--repeats", type=int, help="runs of each arm (default 2)")
    p.add_argument("--seed", type=int, help="the trace's and the arrivals' seed (default 1)")
    args = p.parse_args(argv)
    settings = dict(QUICK if args.quick else FULL)
    models = 1 + len(ROOTS[args.root])
    if args.budget is not None:
        if args.budget < models:
            p.error(f"--budget must be at least {models} (one instance per model)")
        settings["budget"] = args.budget
    if args.minutes is not None:
        if args.minutes * 60 < 2 * objective.WINDOW_S:
            p.error(f"--minutes must give at least {2 * objective.WINDOW_S} s")
        settings["seconds"] = round(args.minutes * 60)
    if args.repeats is not None:
        if args.repeats < 1:
            p.error("--repeats must be at least 1")
        settings["repeats"] = args.repeats
    if args.seed is not None:
        settings["seed"] = args.seed
    with common.local_triton([args.root, *ROOTS[args.root]]) as triton:
        result = run(triton, settings, args.root)
    path = common.write_outputs("trace", result, args, plot)
    arms = result["arms"]
    common.progress(
        "; ".join(
            f"{arm}: {100 * (arms[arm]['windows_met_share'] or 0):.0f} % windows, "
            f"{arms[arm]['instance_seconds']:.0f} instance-s"
            for arm in (*ARMS, "limit")
        )
        + f" ({path})"
    )


if __name__ == "__main__":
    main()
