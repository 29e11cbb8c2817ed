"""`tritonscale demo`: the control loop earning its keep on one machine, in about four minutes.

1. A local Triton on the default ports (HTTP 8000, gRPC 8001, metrics 8002), so that a
   person can curl it while the demo runs; it serves the pipeline and its branches.
2. A metrics source: a local Prometheus (Debian's binary) when installed, else Triton's
   /metrics read directly (`ScrapeSource`). The demo says which.
3. The capacity at one instance each: pipeline_async requests of 8 rows, 32 in flight, for a
   few seconds (`loadgen.measure`). The load's rates are multiples of it, so the story is the
   same on a fast or a busy machine.
4. The local driver (`tune.Tuner`) with the short-window policies of
   operator/examples/local/policies.yaml (5 s ticks, 10 s rates, 30 s scale-down window).
5. An open-loop load against pipeline_async (`loadgen.OpenLoopLoad`): requests arrive at a
   set rate whether or not the earlier ones were answered, as independent users do. Phases:
   high (1.4 times the capacity) with the operator paused, where the backlog and p95 grow
   without bound; the same rate with the operator running, where the counts rise, the
   backlog drains and p95 comes back under the objective; low (a fifth of the capacity), where
   the counts come back down. (A closed loop, a fixed number of users each waiting for its answer, would slow down
   with the server and hide all of this.)
6. Progress lines while it runs, then a table per phase (offered and served req/s, p95,
   Triton's queue time, the backlog, instance counts per model), the reaction times, and
   where the decision log, the load's history and the HTML report were written.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from tritonscale.control.operator_metrics import OperatorMetrics
from tritonscale.control.tick import TickResult
from tritonscale.core.verifier import STEP_FELL_SHORT
from tritonscale.drivers.tune import TuneConfig, Tuner, load_config
from tritonscale.local.loadgen import OpenLoopLoad, OpenLoopStats, measure
from tritonscale.local.ports import free_port, port_is_taken
from tritonscale.local.prometheus_server import LocalPrometheus, prometheus_binary
from tritonscale.local.triton_server import LocalTriton
from tritonscale.triton.actuator import Actuator
from tritonscale.triton.endpoints import local_endpoints

# The demo runs from a checkout: its files, relative to the current directory.
POLICIES = Path("operator/examples/local/policies.yaml")
# The reason of an increase given back by a verdict on it, not by a reading of the load: the
# set planner's verifier (tritonscale.core.verifier).
GIVEN_BACK = frozenset({STEP_FELL_SHORT})
TARGET = "pipeline_async"
MODELS = ("pipeline_async", "branch_embed", "branch_classify", "branch_rank")
# Rows per request. With one row the pipeline's dynamic batcher packs 32 requests into one
# execute and the CPU, not the instance counts, sets the pace; with 8 rows (4 requests per
# execute) the branches' time per batch does, which is what instances are for.
ROWS = 8
# The latency a user of this pipeline is promised; the high phase ends under it or it says so.
P95_OBJECTIVE_MS = 250.0
# p95 and queue time of a phase are read over its last seconds: the state it ended in.
END_SPAN_S = 10.0
# The capacity check: requests in flight and seconds.
CAPACITY_CONCURRENCY = 32
CAPACITY_SECONDS = 6.0


class DemoError(RuntimeError):
    """The demo cannot run (a port taken, a missing file); one line for a person."""


@dataclass(frozen=True)
class Phase:
    name: str
    load: float  # offered rate as a multiple of the capacity at one instance each
    seconds: float
    operator: bool = True  # False: every autoscaler is paused (observes, never acts)


# The paused phase comes first, from one instance each: a BLS parent's busy time includes its
# wait for the branches, so under light load the operator already adds parents, and the
# overload would not show.
DEFAULT_PHASES = (
    Phase("high, operator paused", 1.4, 25, operator=False),
    Phase("high", 1.4, 75),
    Phase("low", 0.2, 70),
)


@dataclass
class PhaseRow:
    phase: Phase
    start: float
    end: float
    rate: float  # offered requests per second (the phase's setting)
    load: OpenLoopStats | None = None  # the whole phase
    end_load: OpenLoopStats | None = None  # its last END_SPAN_S
    queue_ms: float | None = None  # Triton's mean queue time per request, last tick of the phase
    instances_end: dict[str, int] = field(default_factory=dict)
    instances_max: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class EarlyScaleDown:
    phase: str
    seconds_into_phase: float
    reason: str  # the decision's reason: the signal that took the count down


@dataclass
class DemoResult:
    rows: list[PhaseRow]
    capacity_rps: float  # pipeline_async at one instance each, closed loop
    p95_objective_ms: float
    decision_log: Path
    load_history: Path
    report: Path | None
    metrics: str  # "prometheus" or "scrape"
    # model -> seconds from the operator's start under the high load to its first scale-up
    step_to_applied_s: dict[str, float]
    # model -> seconds from the last low step to its first scale-down
    scale_down_after_s: dict[str, float]
    # model -> its first scale-down while the operator ran before the load dropped (a count
    # that rose in the reaction and came back within the phase): when, and which signal
    scaled_down_before_drop: dict[str, EarlyScaleDown]
    # model -> applied changes against the previous direction in a steady phase
    reversals: dict[str, int]
    # model -> increases the verifier gave back under steady load (not flapping: once)
    given_back: dict[str, int]
    # seconds from the operator's start under the high load until p95 stayed under the
    # objective (every 5 s window to the phase's end); None when it never did
    seconds_to_objective: float | None

    def row(self, name: str) -> PhaseRow:
        return next(row for row in self.rows if row.phase.name == name)


class _Recorder:
    """Collects the ticks (thread-safe) and prints a line when a count changes or a tick fails."""

    def __init__(self, echo: Callable[[str], None], started: float) -> None:
        self.echo = echo
        self.started = started
        self.ticks: list[tuple[str, TickResult]] = []
        self.lock = threading.Lock()

    def __call__(self, name: str, result: TickResult) -> None:
        with self.lock:
            self.ticks.append((name, result))
        elapsed = result.at - self.started
        if result.applied or result.errors:
            self.echo(f"[{elapsed:5.0f} s] {result.line()}")

    def live(self, until: float | None = None) -> dict[str, int]:
        """Each model's live count after its latest tick (before `until` when given)."""
        with self.lock:
            latest: dict[str, int] = {}
            for _, result in self.ticks:
                if result.live_counts and (until is None or result.at < until):
                    latest[result.model] = min(result.live_counts.values())
            return latest

    def counts_in(self, start: float, end: float) -> tuple[dict[str, int], dict[str, int]]:
        """(counts at the end, highest counts) of the ticks in [start, end)."""
        highest: dict[str, int] = {}
        with self.lock:
            for _, result in self.ticks:
                if result.live_counts and start <= result.at < end:
                    count = min(result.live_counts.values())
                    highest[result.model] = max(count, highest.get(result.model, 0))
        return self.live(until=end), highest

    def queue_ms(self, model: str, until: float) -> float | None:
        """Mean queue time per request of `model` in the latest snapshot before `until`."""
        with self.lock:
            for _, result in reversed(self.ticks):
                signals = result.snapshot.model(model) if result.snapshot else None
                if result.at < until and signals is not None and signals.request_rate > 0:
                    return 1000.0 * signals.queue_seconds_per_second / signals.request_rate
        return None


def _counts(counts: dict[str, int]) -> str:
    return " ".join(f"{model}={counts[model]}" for model in MODELS if model in counts)


@contextlib.contextmanager
def _prometheus(
    echo: Callable[[str], None], metrics_target: str, port: int
) -> Iterator[LocalPrometheus | None]:
    if prometheus_binary() is None:
        echo(
            "metrics: Prometheus is not installed; reading Triton's /metrics directly (ScrapeSource)"
        )
        yield None
        return
    # Prometheus's usual port when it is free, so that a person finds it; else any.
    port = port if port and not port_is_taken(port) else free_port()
    # Triton's series in the local driver's namespace, as the recording rules expect them.
    labels = {"triton": {"namespace": "local"}}
    with LocalPrometheus(
        {"triton": [metrics_target]}, scrape_interval_s=1.0, labels=labels, port=port
    ) as server:
        echo(f"metrics: Prometheus at {server.url} scraping Triton every 1 s (PrometheusSource)")
        yield server


def paused(config: TuneConfig, is_paused: bool) -> TuneConfig:
    """The same policies with `spec.paused` set (observe and report, never act) or cleared."""
    policies = [
        replace(p, spec=p.spec.model_copy(update={"paused": is_paused})) for p in config.policies
    ]
    return replace(config, policies=policies)


def run_demo(
    out_dir: Path,
    *,
    phases: Sequence[Phase] = DEFAULT_PHASES,
    ports: tuple[int, int, int] = (8000, 8001, 8002),
    metrics_port: int = 9102,
    prometheus_port: int = 9090,
    policies: Path = POLICIES,
    p95_objective_ms: float = P95_OBJECTIVE_MS,
    capacity_seconds: float = CAPACITY_SECONDS,
    echo: Callable[[str], None] = print,
) -> DemoResult:
    """Run the demo; raises DemoError (or LocalTritonError) for what a person must fix."""
    if not phases:
        raise DemoError("the demo needs at least one phase")
    out_dir.mkdir(parents=True, exist_ok=True)
    config = load_config(policies)
    http_port, grpc_port, triton_metrics_port = ports
    for port in ports:
        if port_is_taken(port):
            raise DemoError(
                f"port {port} is in use (another tritonserver?): the demo runs its own Triton on "
                f"{', '.join(map(str, ports))} so that you can curl it; stop the other one first"
            )
    echo(f"starting Triton (HTTP {http_port}, gRPC {grpc_port}, metrics {triton_metrics_port}) ...")
    triton = LocalTriton(
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=triton_metrics_port,
        models=list(MODELS),
    )
    with triton:
        echo(
            f"Triton ready in {triton.startup_s:.0f} s; try: curl http://{triton.http_url}/v2/models/"
            f"{TARGET}/config   (metrics: {triton.metrics_url})"
        )
        capacity = measure(
            triton.grpc_url,
            TARGET,
            concurrency=CAPACITY_CONCURRENCY,
            seconds=capacity_seconds,
            rows=ROWS,
        )
        if capacity.requests == 0:
            raise DemoError(f"{TARGET} answered no request: {capacity.first_error}")
        echo(
            f"capacity at 1 instance each: {capacity.throughput_rps:.0f} req/s of {ROWS} rows "
            f"({CAPACITY_CONCURRENCY} in flight, {capacity_seconds:.0f} s); the load's rates "
            "are multiples of it"
        )
        endpoints = local_endpoints([triton.http_url], [triton.metrics_url])
        with _prometheus(
            echo,
            triton.metrics_url.removeprefix("http://").removesuffix("/metrics"),
            prometheus_port,
        ) as prometheus:
            if prometheus is not None:
                prometheus.wait_for(
                    f'nv_inference_request_success{{model="{TARGET}"}}', timeout_s=30
                )
                config = replace(
                    config, endpoints=endpoints, source="prometheus", prometheus_url=prometheus.url
                )
            else:
                config = replace(config, endpoints=endpoints, source="scrape", prometheus_url=None)
            return _run(
                config,
                triton,
                prometheus,
                capacity.throughput_rps,
                phases,
                out_dir,
                metrics_port,
                p95_objective_ms,
                echo,
            )


def _run(
    config: TuneConfig,
    triton: LocalTriton,
    prometheus: LocalPrometheus | None,
    capacity_rps: float,
    phases: Sequence[Phase],
    out_dir: Path,
    metrics_port: int,
    p95_objective_ms: float,
    echo: Callable[[str], None],
) -> DemoResult:
    decision_log = out_dir / "decisions.jsonl"
    load_history = out_dir / "load.csv"
    metrics = OperatorMetrics()
    metrics_server = None
    if metrics_port and not port_is_taken(metrics_port):
        metrics_server = metrics.serve(metrics_port, addr="127.0.0.1")
        echo(f"operator metrics: http://127.0.0.1:{metrics_port}/metrics")
    started = time.time()
    recorder = _Recorder(echo, started)
    stop = threading.Event()
    load = OpenLoopLoad(triton.grpc_url, TARGET, rows=ROWS)
    rows: list[PhaseRow] = []
    with decision_log.open("w") as log:
        tuner = Tuner(
            config,
            actuator=Actuator(triton.repository_key),
            metrics=metrics,
            decision_log=log,
            echo=lambda line: None,
            on_tick=recorder,
        )
        loop = threading.Thread(target=tuner.run, kwargs={"stop": stop}, name="tune", daemon=True)
        names = ", ".join(p.spec.model for p in config.policies)
        interval = config.policies[0].spec.interval_seconds
        echo(f"control loop: {names}, every {interval} s; decision log {decision_log}")
        echo(
            f"load: open loop against {TARGET}, {ROWS} rows per request, Poisson arrivals; "
            f"p95 objective {p95_objective_ms:.0f} ms"
        )
        loop.start()
        try:
            load.start()
            clock = time.time()
            for phase in phases:
                rate = phase.load * capacity_rps
                row = PhaseRow(phase, clock, clock + phase.seconds, rate)
                rows.append(row)
                tuner.config = paused(config, not phase.operator)
                load.set_rate(rate)
                echo(
                    f"[{clock - started:5.0f} s] phase '{phase.name}': {rate:.0f} req/s offered "
                    f"({phase.load:g} x capacity) for {phase.seconds:.0f} s, operator "
                    f"{'running' if phase.operator else 'paused'}"
                )
                while time.time() < row.end:
                    time.sleep(min(10.0, max(0.0, row.end - time.time())))
                    if load.error:
                        raise DemoError(f"the load generator stopped: {load.error}")
                    now = time.time()
                    window = load.stats(max(row.start, now - 10), now)
                    p95 = "-" if window.p95_ms is None else f"{window.p95_ms:.0f} ms"
                    echo(
                        f"[{now - started:5.0f} s]   {phase.name}: offered {window.offered_rps:.0f}, "
                        f"served {window.served_rps:.0f} req/s, p95 {p95}, backlog "
                        f"{window.in_flight}; instances {_counts(recorder.live())}"
                    )
                clock = row.end
        finally:
            stop.set()
            load.stop()
            loop.join(timeout=60)
            if metrics_server is not None:
                metrics_server.shutdown()
    for row in rows:
        row.load = load.stats(row.start, row.end)
        row.end_load = load.stats(max(row.start, row.end - END_SPAN_S), row.end)
        row.queue_ms = recorder.queue_ms(TARGET, row.end)
        row.instances_end, row.instances_max = recorder.counts_in(row.start, row.end)
    load.write_history(load_history, started, rows[-1].end)
    marks = [(row.start, row.phase.name) for row in rows]
    report = _report(out_dir, decision_log, load_history, prometheus, started, marks, echo)
    reversals, given_back = _reversals(recorder.ticks, rows)
    high = _operator_under_high_load(rows)
    last_low = _last_drop(rows)
    result = DemoResult(
        rows=rows,
        capacity_rps=capacity_rps,
        p95_objective_ms=p95_objective_ms,
        decision_log=decision_log,
        load_history=load_history,
        report=report,
        metrics=config.source,
        step_to_applied_s=_first_change(recorder.ticks, high, +1) if high else {},
        scale_down_after_s=_first_change(recorder.ticks, last_low, -1) if last_low else {},
        scaled_down_before_drop=_scale_downs_before(recorder.ticks, rows, last_low),
        reversals=reversals,
        given_back=given_back,
        seconds_to_objective=_seconds_to_objective(load, high, p95_objective_ms) if high else None,
    )
    for line in summary_lines(result):
        echo(line)
    return result


def _operator_under_high_load(rows: list[PhaseRow]) -> PhaseRow | None:
    """The first phase with the operator running at the highest offered rate."""
    running = [row for row in rows if row.phase.operator]
    return max(running, key=lambda row: row.rate, default=None)


def _last_drop(rows: list[PhaseRow]) -> PhaseRow | None:
    """The last phase whose rate is lower than the one before it."""
    drops = [
        after for before, after in zip(rows, rows[1:], strict=False) if after.rate < before.rate
    ]
    return drops[-1] if drops else None


def _seconds_to_objective(
    load: OpenLoopLoad, phase: PhaseRow, objective_ms: float, step_s: float = 5.0
) -> float | None:
    """Seconds from the phase's start to the first 5 s window from which p95 stayed under
    the objective to the phase's end (a window with no answer counts as over it)."""
    windows = []
    t = phase.start
    while t + step_s <= phase.end + 1e-9:
        p95 = load.stats(t, t + step_s).p95_ms
        windows.append((t + step_s, p95 is not None and p95 <= objective_ms))
        t += step_s
    reached = None
    for end, under in windows:
        if not under:
            reached = None
        elif reached is None:
            reached = end
    return None if reached is None else reached - phase.start


def _first_change(
    ticks: list[tuple[str, TickResult]], phase: PhaseRow, sign: int
) -> dict[str, float]:
    """Per model: seconds from the phase's start to the end of its first successful load in
    that direction within the phase."""
    found: dict[str, float] = {}
    for _, result in ticks:
        if not phase.start <= result.at < phase.end or result.model in found:
            continue
        for pod in result.applied:
            if pod.ok and pod.before is not None and pod.after is not None:
                if (pod.after - pod.before) * sign > 0:
                    found[result.model] = result.at + result.duration_s - phase.start
    return found


def _scale_downs_before(
    ticks: list[tuple[str, TickResult]], rows: list[PhaseRow], drop: PhaseRow | None
) -> dict[str, EarlyScaleDown]:
    """Per model: its first applied decrease in a phase with the operator running before
    `drop` (every phase when there is no drop)."""
    found: dict[str, EarlyScaleDown] = {}
    before = [row for row in rows if row.phase.operator and (drop is None or row.end <= drop.start)]
    for _, result in ticks:
        row = next((r for r in before if r.start <= result.at < r.end), None)
        if row is None or result.model in found:
            continue
        if any(
            pod.ok and pod.before is not None and pod.after is not None and pod.after < pod.before
            for pod in result.applied
        ):
            found[result.model] = EarlyScaleDown(
                row.phase.name,
                result.at - row.start,
                result.decision.reason if result.decision else result.reason,
            )
    return found


def _reversals(
    ticks: list[tuple[str, TickResult]], rows: list[PhaseRow]
) -> tuple[dict[str, int], dict[str, int]]:
    """(reversals, increases given back by a verdict) per model, within each phase.

    Within a phase the load is steady. A reversal is an applied change, after the phase's
    first 30 s (the reaction), against the model's previous change in the phase (that one may
    fall within the reaction): flapping. A verdict's revert, an increase that fell short of its
    prediction given back once by design (`GIVEN_BACK`), is counted apart, whenever in the
    phase it came: it is the verifier's verdict, not the reaction's. An increase after it is
    counted as a reversal like any other (the verdict did not hold).
    """
    reversals: dict[str, int] = {}
    given_back: dict[str, int] = {}
    for row in rows:
        last: dict[str, int] = {}
        for _, result in ticks:
            if not row.start <= result.at < row.end:
                continue
            for pod in result.applied:
                if not pod.ok or pod.before is None or pod.after is None:
                    continue
                direction = 1 if pod.after > pod.before else -1
                model = result.model
                if result.decision is not None and result.decision.reason in GIVEN_BACK:
                    given_back[model] = given_back.get(model, 0) + 1
                elif result.at >= row.start + 30 and last.get(model, direction) != direction:
                    reversals[model] = reversals.get(model, 0) + 1
                last[model] = direction
    return reversals, given_back


def _report(
    out_dir: Path,
    decision_log: Path,
    load_history: Path,
    prometheus: LocalPrometheus | None,
    started: float,
    marks: list[tuple[float, str]],
    echo: Callable[[str], None],
) -> Path | None:
    try:
        from tritonscale.reports import report
    except ImportError:
        return None
    try:
        return report.write_report(
            out_dir / "report",
            load_csv=load_history,
            prometheus_url=prometheus.url if prometheus else None,
            decisions=decision_log,
            window=(started, time.time()),
            title="tritonscale demo",
            marks=marks,
        )
    except Exception as error:  # the report is a bonus: the demo's own summary stands
        echo(f"(no HTML report: {' '.join(str(error).split())[:200]})")
        return None


def summary_lines(result: DemoResult) -> list[str]:
    def number(value: float | None, digits: int = 0) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    width = max(len(row.phase.name) for row in result.rows)
    header = (
        f"{'phase':<{width}} {'offered':>7} {'served':>7} {'p95 ms':>7} {'queue ms':>8} "
        f"{'backlog':>7} {'fail':>5}  " + "  ".join(f"{model:>16}" for model in MODELS)
    )
    lines = [
        "",
        f"summary: req/s offered and served over each phase; p95, Triton's queue time per "
        f"request and the backlog at its end (last {END_SPAN_S:.0f} s); instances at the end "
        f"(most in the phase). Capacity at 1 instance each: {result.capacity_rps:.0f} req/s; "
        f"metrics: {result.metrics}.",
        header,
    ]
    for row in result.rows:
        whole, end = row.load, row.end_load
        counts = "  ".join(
            f"{str(row.instances_end.get(m, '-')) + ' (' + str(row.instances_max.get(m, '-')) + ')':>16}"
            for m in MODELS
        )
        lines.append(
            f"{row.phase.name:<{width}} {number(whole.offered_rps if whole else None):>7} "
            f"{number(whole.served_rps if whole else None):>7} "
            f"{number(end.p95_ms if end else None):>7} {number(row.queue_ms):>8} "
            f"{number(end.in_flight if end else None):>7} "
            f"{(whole.failed + whole.dropped) if whole else 0:>5}  {counts}"
        )
    up = ", ".join(f"{m} {s:.0f} s" for m, s in sorted(result.step_to_applied_s.items())) or "none"
    down = (
        ", ".join(f"{m} {s:.0f} s" for m, s in sorted(result.scale_down_after_s.items())) or "none"
    )
    early = (
        ", ".join(
            f"{m} {e.seconds_into_phase:.0f} s into '{e.phase}' ({e.reason})"
            for m, e in sorted(result.scaled_down_before_drop.items())
        )
        or "none"
    )
    flaps = ", ".join(f"{m} {n}" for m, n in sorted(result.reversals.items())) or "none"
    given_back = ", ".join(f"{m} {n}" for m, n in sorted(result.given_back.items())) or "none"
    objective = (
        f"after {result.seconds_to_objective:.0f} s"
        if result.seconds_to_objective is not None
        else "not within the phase"
    )
    lines += [
        "",
        f"operator running under the high load -> first scale-up applied: {up}",
        f"p95 back under the {result.p95_objective_ms:.0f} ms objective and kept there: {objective}",
        f"load dropped -> first scale-down applied: {down}",
        f"came down before the load dropped (first decrease, its signal): {early}",
        f"changes that reversed the previous one under steady load: {flaps}",
        f"increases given back once because they fell short (StepFellShort): {given_back}",
        f"decision log: {result.decision_log}",
        f"load, second by second: {result.load_history}",
    ]
    if result.report is not None:
        lines.append(f"report: {result.report}")
    return lines
