"""`tritonscale demo`: the whole control loop on one machine, in under five minutes.

1. A local Triton on the default ports (HTTP 8000, gRPC 8001, metrics 8002), so that a
   person can curl it while the demo runs; it serves the pipeline and its branches.
2. A metrics source: a local Prometheus (Debian's binary) when installed, else Triton's
   /metrics read directly (`ScrapeSource`). The demo says which.
3. The local driver (`tune.Tuner`) with the short-window policies of
   operator/examples/local/policies.yaml (5 s ticks, 10 s rates, 30 s scale-down window).
4. A step load against pipeline_async: low, high, low. Locust headless through
   `locust -f loadtests/bls.py --shape spike` where that file and Locust exist, else the
   built-in gRPC generator (`loadgen.ClosedLoopLoad`). The demo says which.
5. Progress lines while it runs, then a table per phase (users, req/s, p95, instance
   counts per model), the measured reaction times, and where the decision log and the
   HTML report were written.
"""

from __future__ import annotations

import contextlib
import csv
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from tritonscale.control.operator_metrics import OperatorMetrics
from tritonscale.control.tick import TickResult
from tritonscale.drivers.tune import TuneConfig, Tuner, load_config
from tritonscale.local.loadgen import ClosedLoopLoad
from tritonscale.local.ports import free_port, port_is_taken
from tritonscale.local.prometheus_server import LocalPrometheus, prometheus_binary
from tritonscale.local.triton_server import LocalTriton
from tritonscale.triton.actuator import Actuator
from tritonscale.triton.endpoints import local_endpoints

# The demo runs from a checkout: its files, relative to the current directory.
POLICIES = Path("operator/examples/local/policies.yaml")
LOCUSTFILE = Path("loadtests/bls.py")
TARGET = "pipeline_async"
MODELS = ("pipeline_async", "branch_embed", "branch_classify", "branch_rank")


class DemoError(RuntimeError):
    """The demo cannot run (a port taken, a missing file); one line for a person."""


@dataclass(frozen=True)
class Phase:
    name: str
    users: int
    seconds: float


DEFAULT_PHASES = (Phase("low", 2, 40), Phase("high", 20, 110), Phase("low again", 2, 100))
# Each user pauses this long after each answer, so that "low" is light: without a pause even
# two users keep the pipeline busy all the time (a closed loop fills whatever it is given).
THINK_S = 0.1


@dataclass
class PhaseRow:
    phase: Phase
    start: float
    end: float
    rate: float | None = None  # successful requests per second, client side
    p95_ms: float | None = None
    failures: int = 0
    instances_end: dict[str, int] = field(default_factory=dict)
    instances_max: dict[str, int] = field(default_factory=dict)


@dataclass
class DemoResult:
    rows: list[PhaseRow]
    decision_log: Path
    report: Path | None
    load: str  # "locust" or "built-in"
    metrics: str  # "prometheus" or "scrape"
    step_to_applied_s: dict[str, float]  # model -> seconds from the high step to its first scale-up
    scale_down_after_s: dict[
        str, float
    ]  # model -> seconds from the low step to its first scale-down
    reversals: dict[
        str, int
    ]  # model -> applied changes against the previous direction in a steady phase
    # pipeline_async req/s under the high load: before the first scale-up, at the phase's end
    throughput_before_after: tuple[float | None, float | None]


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

    def request_rate(self, model: str) -> float | None:
        with self.lock:
            for _, result in reversed(self.ticks):
                if result.model == model and result.snapshot and result.snapshot.model(model):
                    return result.snapshot.models[model].request_rate
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
        server.wait_for(f'nv_inference_request_success{{model="{TARGET}"}}', timeout_s=30)
        echo(f"metrics: Prometheus at {server.url} scraping Triton every 1 s (PrometheusSource)")
        yield server


def _locust_command() -> list[str] | None:
    locust = shutil.which("locust") or str(Path(sys.executable).parent / "locust")
    if LOCUSTFILE.is_file() and Path(locust).is_file():
        return [locust, "-f", str(LOCUSTFILE)]
    return None


class _LocustLoad:
    """Locust headless with loadtests/bls.py's spike shape: low, high, low."""

    def __init__(
        self, command: list[str], phases: Sequence[Phase], csv_prefix: Path, http_url: str
    ):
        low, high, _ = phases
        total = sum(p.seconds for p in phases)
        self.csv_prefix = csv_prefix
        self.log_path = csv_prefix.with_suffix(".log")
        self.command = [
            *command, "--headless", "--only-summary",
            "--workload", TARGET, "--protocol", "grpc", "--payload", "1",
            "--think-time-ms", str(int(THINK_S * 1000)),
            "--host", f"http://{http_url}",
            "--shape", "spike", "-u", str(low.users), "-r", str(high.users),
            "--spike-factor", str(high.users / low.users),
            "--spike-at", str(low.seconds), "--spike-time", str(high.seconds),
            "-t", f"{int(total)}s", "--csv", str(csv_prefix), "--csv-full-history",
        ]  # fmt: skip
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = open(self.log_path, "wb")  # noqa: SIM115 - the child holds it
        self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=20)
            if self.process.poll() is None:
                self.process.kill()

    def failed(self) -> str | None:
        if self.process is not None and self.process.poll() not in (None, 0):
            tail = self.log_path.read_text(errors="replace").strip().splitlines()[-1:]
            return f"locust exited with {self.process.returncode}: {' '.join(tail)}"
        return None

    def stats(self, start: float, end: float) -> tuple[float | None, float | None, int]:
        """Mean req/s, median p95 (ms) and failures over the history rows in [start, end)."""
        path = Path(f"{self.csv_prefix}_stats_history.csv")
        if not path.is_file():
            return None, None, 0
        rates, p95s, failures = [], [], 0.0
        with path.open() as handle:
            for row in csv.DictReader(handle):
                if row.get("Name") != "Aggregated":
                    continue
                t = float(row["Timestamp"])
                if not start <= t < end:
                    continue
                rates.append(float(row["Requests/s"] or 0))
                failures += float(row["Failures/s"] or 0)
                with contextlib.suppress(ValueError):
                    p95s.append(float(row["95%"]))
        rate = statistics.mean(rates) if rates else None
        p95 = statistics.median(p95s) if p95s else None
        return rate, p95, int(failures)


def run_demo(
    out_dir: Path,
    *,
    phases: Sequence[Phase] = DEFAULT_PHASES,
    load: str = "auto",
    ports: tuple[int, int, int] = (8000, 8001, 8002),
    metrics_port: int = 9102,
    prometheus_port: int = 9090,
    policies: Path = POLICIES,
    echo: Callable[[str], None] = print,
) -> DemoResult:
    """Run the demo; raises DemoError (or LocalTritonError) for what a person must fix."""
    if len(phases) != 3:
        raise DemoError("the demo runs three phases: low, high, low")
    out_dir.mkdir(parents=True, exist_ok=True)
    decision_log = out_dir / "decisions.jsonl"
    config = load_config(policies)
    locust = _locust_command() if load in ("auto", "locust") else None
    if load == "locust" and locust is None:
        raise DemoError(f"Locust or {LOCUSTFILE} not found; use --load builtin")

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
        endpoints = local_endpoints([triton.http_url], [triton.metrics_url])
        with _prometheus(
            echo,
            triton.metrics_url.removeprefix("http://").removesuffix("/metrics"),
            prometheus_port,
        ) as prometheus:
            if prometheus is not None:
                config = replace(
                    config, endpoints=endpoints, source="prometheus", prometheus_url=prometheus.url
                )
            else:
                config = replace(config, endpoints=endpoints, source="scrape", prometheus_url=None)
            return _run(
                config,
                triton,
                prometheus,
                locust,
                phases,
                out_dir,
                decision_log,
                metrics_port,
                echo,
            )


def _run(
    config: TuneConfig,
    triton: LocalTriton,
    prometheus: LocalPrometheus | None,
    locust: list[str] | None,
    phases: Sequence[Phase],
    out_dir: Path,
    decision_log: Path,
    metrics_port: int,
    echo: Callable[[str], None],
) -> DemoResult:
    metrics = OperatorMetrics()
    metrics_server = None
    if metrics_port and not port_is_taken(metrics_port):
        metrics_server = metrics.serve(metrics_port, addr="127.0.0.1")
        echo(f"operator metrics: http://127.0.0.1:{metrics_port}/metrics")
    started = time.time()
    recorder = _Recorder(echo, started)
    stop = threading.Event()
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
        loop.start()
        locust_load = (
            _LocustLoad(locust, phases, out_dir / "locust", triton.http_url) if locust else None
        )
        builtin = None if locust_load else ClosedLoopLoad(triton.grpc_url, TARGET, think_s=THINK_S)
        echo(
            "load: Locust (loadtests/bls.py, spike shape) against pipeline_async"
            if locust_load
            else "load: the built-in gRPC load generator against pipeline_async"
        )
        rows: list[PhaseRow] = []
        try:
            if locust_load:
                locust_load.start()
            clock = time.time()
            for phase in phases:
                row = PhaseRow(phase, clock, clock + phase.seconds)
                rows.append(row)
                if builtin:
                    builtin.set_users(phase.users)
                echo(
                    f"[{clock - started:5.0f} s] phase '{phase.name}': {phase.users} users for {phase.seconds:.0f} s"
                )
                while time.time() < row.end:
                    time.sleep(min(10.0, max(0.0, row.end - time.time())))
                    problem = locust_load.failed() if locust_load else None
                    if problem:
                        raise DemoError(problem)
                    rate = recorder.request_rate(TARGET)
                    shown = f"{rate:.0f} req/s" if rate is not None else "no rate yet"
                    echo(
                        f"[{time.time() - started:5.0f} s]   {phase.name}: pipeline_async {shown}; "
                        f"instances {_counts(recorder.live())}"
                    )
                clock = row.end
        finally:
            stop.set()
            if builtin:
                builtin.stop()
            if locust_load:
                locust_load.stop()
            loop.join(timeout=60)
            if metrics_server is not None:
                metrics_server.shutdown()
    for row in rows:
        row.instances_end, row.instances_max = recorder.counts_in(row.start, row.end)
        if builtin:
            stats = builtin.stats(row.start, row.end)
            row.rate, row.p95_ms, row.failures = stats.rate, stats.p95_ms, stats.failures
        elif locust_load:
            row.rate, row.p95_ms, row.failures = locust_load.stats(row.start, row.end)
    scale_ups = _first_change(recorder.ticks, rows[1], +1)
    throughput = _before_after(
        builtin, locust_load, rows[1], min(scale_ups.values()) if scale_ups else None
    )
    report = _report(out_dir, decision_log, locust_load, prometheus, started, echo)
    result = DemoResult(
        rows=rows,
        decision_log=decision_log,
        report=report,
        load="locust" if locust_load else "built-in",
        metrics=config.source,
        step_to_applied_s=scale_ups,
        scale_down_after_s=_first_change(recorder.ticks, rows[2], -1),
        reversals=_reversals(recorder.ticks, rows),
        throughput_before_after=throughput,
    )
    for line in summary_lines(result):
        echo(line)
    return result


def _before_after(
    builtin: ClosedLoopLoad | None,
    locust_load: _LocustLoad | None,
    high: PhaseRow,
    first_scale_up_s: float | None,
) -> tuple[float | None, float | None]:
    """pipeline_async req/s under the high load before the first scale-up was applied, and
    over the end of the high phase (its last third, at most 20 s)."""
    span = min(20.0, high.phase.seconds / 3)
    windows = [
        (high.start, high.start + first_scale_up_s) if first_scale_up_s else None,
        (high.end - span, high.end),
    ]
    rates: list[float | None] = []
    for window in windows:
        if window is None:
            rates.append(None)
        elif builtin:
            rates.append(builtin.stats(*window).rate)
        elif locust_load:
            rates.append(locust_load.stats(*window)[0])
        else:
            rates.append(None)
    return rates[0], rates[1]


def _first_change(
    ticks: list[tuple[str, TickResult]], phase: PhaseRow, sign: int
) -> dict[str, float]:
    """Per model: seconds from the phase's start to the end of its first successful load in
    that direction within the phase."""
    found: dict[str, float] = {}
    since = phase.start
    for _, result in ticks:
        if not since <= result.at < phase.end or result.model in found:
            continue
        for pod in result.applied:
            if pod.ok and pod.before is not None and pod.after is not None:
                if (pod.after - pod.before) * sign > 0:
                    found[result.model] = result.at + result.duration_s - since
    return found


def _reversals(ticks: list[tuple[str, TickResult]], rows: list[PhaseRow]) -> dict[str, int]:
    """Applied changes that went against the model's previous change within one phase.

    Within a phase the load is steady; after the first 30 s (the reaction), a change back
    against the last one is flapping.
    """
    counts: dict[str, int] = {}
    for row in rows:
        last: dict[str, int] = {}
        for _, result in ticks:
            if not row.start + 30 <= result.at < row.end:
                continue
            for pod in result.applied:
                if not pod.ok or pod.before is None or pod.after is None:
                    continue
                direction = 1 if pod.after > pod.before else -1
                if last.get(result.model, direction) != direction:
                    counts[result.model] = counts.get(result.model, 0) + 1
                last[result.model] = direction
    return counts


def _report(
    out_dir: Path,
    decision_log: Path,
    locust_load: _LocustLoad | None,
    prometheus: LocalPrometheus | None,
    started: float,
    echo: Callable[[str], None],
) -> Path | None:
    try:
        from tritonscale.reports import report
    except ImportError:
        return None
    locust_csv = None
    if locust_load and Path(f"{locust_load.csv_prefix}_stats_history.csv").is_file():
        locust_csv = str(locust_load.csv_prefix)
    try:
        return report.write_report(
            out_dir / "report",
            locust_csv=locust_csv,
            prometheus_url=prometheus.url if prometheus else None,
            decisions=decision_log,
            window=(started, time.time()),
        )
    except Exception as error:  # the report is a bonus: the demo's own summary stands
        echo(f"(no HTML report: {' '.join(str(error).split())[:200]})")
        return None


def summary_lines(result: DemoResult) -> list[str]:
    def number(value: float | None, digits: int = 0) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    header = f"{'phase':<10} {'users':>5} {'req/s':>7} {'p95 ms':>7} {'fail':>5}  " + "  ".join(
        f"{model:>16}" for model in MODELS
    )
    lines = [
        "",
        f"summary (load: {result.load}, metrics: {result.metrics}); instances at the end (max in phase):",
        header,
    ]
    for row in result.rows:
        counts = "  ".join(
            f"{str(row.instances_end.get(m, '-')) + ' (' + str(row.instances_max.get(m, '-')) + ')':>16}"
            for m in MODELS
        )
        lines.append(
            f"{row.phase.name:<10} {row.phase.users:>5} {number(row.rate):>7} "
            f"{number(row.p95_ms):>7} {row.failures:>5}  {counts}"
        )
    up = ", ".join(f"{m} {s:.0f} s" for m, s in sorted(result.step_to_applied_s.items())) or "none"
    down = (
        ", ".join(f"{m} {s:.0f} s" for m, s in sorted(result.scale_down_after_s.items())) or "none"
    )
    first, last = result.throughput_before_after
    flaps = ", ".join(f"{m} {n}" for m, n in sorted(result.reversals.items())) or "none"
    lines += [
        "",
        f"high step -> first scale-up applied: {up}",
        f"low step -> first scale-down applied: {down}",
        f"pipeline_async under the high load: {number(first)} req/s before the first "
        f"scale-up was applied, {number(last)} req/s at the end of the phase",
        f"changes that reversed the previous one under steady load: {flaps}",
        f"decision log: {result.decision_log}",
    ]
    if result.report is not None:
        lines.append(f"report: {result.report}")
    return lines
