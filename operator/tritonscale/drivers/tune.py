"""The local driver, `tritonscale tune --config policies.yaml`: the control loop without Kubernetes.

The policy file names static Triton URLs, a metrics source, and a list of policies, each
with the InstanceGroupAutoscaler's `spec` shape (docs/instancegroupautoscaler.md):

    triton:
      http: ["127.0.0.1:8000"]                      # one per Triton ("pod")
      metrics: ["http://127.0.0.1:8002/metrics"]    # the same order; optional with prometheus
    metrics:
      source: scrape                                # or prometheus
      prometheusUrl: http://127.0.0.1:9090          # with source: prometheus
    policies:
      - name: pipeline-async
        spec: {model: pipeline_async, minInstances: 1, maxInstances: 4, ...}

The policies are decided together at each tick, from a model of the pipeline
(tritonscale.control.set_planner).

Top-level keys starting with `x-` are ignored (a place for YAML anchors shared by the
specs). `spec.selector` may be left out here (the URLs name the pods); it is ignored when given.
The URLs name the pods of every policy, so the policies are one pod set
(tritonscale.control.pod_sets) and tick as the Kubernetes driver's sets do: at the set's phase,
at the shortest interval of the policies, each policy decided on its own `spec.intervalSeconds`
(tritonscale.control.loop.run_set). A tick (tritonscale.control.set_tick) reads each Triton's
metrics once for every policy due, decides them, grants a budget's members (`spec.budget`)
jointly, the ones that give instances back first, and sends the loads: a policy's load that
waits for its deadline does not hold back the other policies' loads of the same tick. Each tick
prints one line;
`--decision-log` appends one JSON object per tick (`TickResult.to_dict()` plus `autoscaler`):
time `t` (unix s) and `time`, `model`, `current`, `desired`, `recommended`, `direction`,
`reason`, `message`, `observed`, `requestRate`, `live` (pod -> count), `children`, `applied`
(pod, before, after, ok, reason, seconds), `errors`, `dryRun`, `durationSeconds`, `budget`,
and `latency` (status.latency) where the policy sets `spec.targets.latency`.

The repository-API key comes from TRITONSCALE_REPOSITORY_KEY.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from tritonscale.control.ledger import BudgetLedger
from tritonscale.control.loop import Stop, run_set
from tritonscale.control.operator_metrics import OperatorMetrics
from tritonscale.control.pod_sets import PodSet, set_name
from tritonscale.control.set_planner import SetPlanner
from tritonscale.control.set_tick import Member, tick_set
from tritonscale.control.tick import ReconcileState, TickResult
from tritonscale.core.spec import AutoscalerSpec, InvalidSpec, latency_objectives_off_root
from tritonscale.metrics.prometheus import PrometheusSource
from tritonscale.metrics.scrape import ScrapeSource
from tritonscale.metrics.source import MetricsSource
from tritonscale.triton.actuator import Actuator
from tritonscale.triton.connections import Connections
from tritonscale.triton.endpoints import Endpoint, local_endpoints
from tritonscale.triton.healing import Healer

# Locally the URLs name the pods; a spec without a selector gets this placeholder.
LOCAL_SELECTOR = {"matchLabels": {"app.kubernetes.io/component": "triton"}}
NAMESPACE = "local"  # the namespace label of the local driver's metrics and budgets
SOURCES = ("scrape", "prometheus")


class TuneConfigError(ValueError):
    """The policy file is wrong; one line naming the file and the field."""


@dataclass(frozen=True)
class Policy:
    name: str
    spec: AutoscalerSpec


@dataclass(frozen=True)
class TuneConfig:
    endpoints: list[Endpoint]
    source: str  # "scrape" or "prometheus"
    prometheus_url: str | None
    policies: list[Policy]
    path: str = "<config>"

    def make_source(self) -> MetricsSource:
        if self.source == "prometheus":
            assert self.prometheus_url is not None
            return PrometheusSource(self.prometheus_url)
        return ScrapeSource()


def _mapping(value: Any, where: str, known: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise TuneConfigError(f"{where} must be a mapping")
    unknown = [key for key in value if key not in known]
    if unknown:
        raise TuneConfigError(
            f"{where}.{unknown[0]} is not a known field (known: {', '.join(known)})"
        )
    return value


def _urls(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(u, str) and u for u in value):
        raise TuneConfigError(f"{where} must be a list of URLs")
    return value


def parse_config(data: Any, path: str = "<config>") -> TuneConfig:
    """Check a parsed policy file; TuneConfigError names `path` and the field."""
    try:
        return _parse(data, path)
    except (TuneConfigError, InvalidSpec) as error:
        raise TuneConfigError(f"{path}: {error}") from None


def _parse(data: Any, path: str) -> TuneConfig:
    if isinstance(data, Mapping):
        # YAML anchors may live under `x-` keys (as in docker-compose files).
        data = {k: v for k, v in data.items() if not (isinstance(k, str) and k.startswith("x-"))}
    top = _mapping(data, "the file", ("triton", "metrics", "policies"))
    for key in ("triton", "policies"):
        if key not in top:
            raise TuneConfigError(f"{key} is required")
    triton = _mapping(top["triton"], "triton", ("http", "metrics"))
    if "http" not in triton:
        raise TuneConfigError("triton.http is required")
    http = _urls(triton["http"], "triton.http")
    if not http:
        raise TuneConfigError("triton.http must name at least one Triton")
    metrics_urls = _urls(triton["metrics"], "triton.metrics") if "metrics" in triton else []
    if metrics_urls and len(metrics_urls) != len(http):
        raise TuneConfigError(
            f"triton.metrics must have one URL per triton.http URL ({len(http)}), got {len(metrics_urls)}"
        )
    metrics = _mapping(top.get("metrics") or {}, "metrics", ("source", "prometheusUrl"))
    source = metrics.get("source", "scrape")
    if source not in SOURCES:
        raise TuneConfigError(f"metrics.source must be one of {', '.join(SOURCES)}, got {source!r}")
    prometheus_url = metrics.get("prometheusUrl")
    if source == "prometheus" and not (isinstance(prometheus_url, str) and prometheus_url):
        raise TuneConfigError("metrics.prometheusUrl is required with metrics.source: prometheus")
    if source == "scrape" and not metrics_urls:
        raise TuneConfigError("triton.metrics is required with metrics.source: scrape")
    if source == "prometheus" and not metrics_urls:
        # Prometheus tells the Tritons apart by their metrics address (`instance`).
        raise TuneConfigError(
            "triton.metrics is required: Prometheus's instance label names each Triton"
        )

    raw_policies = top["policies"]
    if not isinstance(raw_policies, list) or not raw_policies:
        raise TuneConfigError("policies must be a non-empty list of {name, spec}")
    policies: list[Policy] = []
    seen: set[str] = set()
    for index, raw in enumerate(raw_policies):
        where = f"policies[{index}]"
        entry = _mapping(raw, where, ("name", "spec"))
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise TuneConfigError(f"{where}.name is required")
        if name in seen:
            raise TuneConfigError(f"{where}.name {name!r} is used twice")
        seen.add(name)
        spec = entry.get("spec")
        if isinstance(spec, Mapping) and "selector" not in spec:
            spec = {**spec, "selector": LOCAL_SELECTOR}
        policies.append(Policy(name, AutoscalerSpec.from_dict(spec, path=f"{where}.spec")))
    models = [p.spec.model for p in policies]
    for model in set(models):
        if models.count(model) > 1:
            raise TuneConfigError(f"two policies act on model {model!r}: keep one per model")
    # The URLs make the policies one pod set: a latency objective must be on its root.
    for model, caller in latency_objectives_off_root(p.spec for p in policies).items():
        index = models.index(model)
        raise TuneConfigError(
            f"policies[{index}].spec.targets.latency: only a pipeline's root may carry a latency"
            f" objective, and {model} is called by {caller} (set it on the root)"
        )
    return TuneConfig(
        endpoints=local_endpoints(http, metrics_urls or None),
        source=source,
        prometheus_url=prometheus_url,
        policies=policies,
        path=path,
    )


def load_config(path: str | Path) -> TuneConfig:
    """Read and check a policy file; every mistake is one TuneConfigError line."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise TuneConfigError(f"{path}: cannot read it ({error.strerror or error})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or "not valid YAML"
        raise TuneConfigError(f"{path}: invalid YAML{where}: {problem}") from None
    return parse_config(data, str(path))


@dataclass
class Tuner:
    """The loop: each policy ticks every intervalSeconds, in a task of its own (a budget's
    members share one); `run` until `stop` or the duration."""

    config: TuneConfig
    actuator: Actuator = field(default_factory=Actuator)
    metrics: OperatorMetrics | None = None
    decision_log: IO[str] | None = None
    echo: Callable[[str], None] = print
    source: MetricsSource | None = None
    on_tick: Callable[[str, TickResult], None] | None = None  # (policy name, result)
    # Checks each policy's model on every pod and reloads it where its stub died or hangs;
    # by default with the actuator's key. `heal=False` turns it off.
    healer: Healer | None = None
    heal: bool = True
    states: dict[str, ReconcileState] = field(default_factory=dict)
    ledger: BudgetLedger = field(default_factory=BudgetLedger)
    # The set's planner (its state lives across ticks).
    planner: SetPlanner | None = None

    def __post_init__(self) -> None:
        if self.planner is None:
            self.planner = SetPlanner(self.pod_set().name)
        if self.source is None:
            self.source = self.config.make_source()
        if self.heal and self.healer is None:
            # The actuator's loads: neither piles a load on one the other left in flight.
            source = self.source
            self.healer = Healer(
                repository_key=self.actuator.repository_key,
                loads=self.actuator.loads,
                # Scraping: one read of a pod's /metrics serves the healer and the snapshot;
                # with Prometheus, Prometheus answers it.
                request_counters=source.request_counters,
            )

    async def tick(self, policy: Policy, now: float) -> TickResult:
        """One policy's tick (a round of one)."""
        return (await self.round([policy], now))[0]

    async def round(
        self,
        policies: list[Policy],
        now: float,
        finished: Callable[[str], None] | None = None,
    ) -> list[TickResult]:
        """One tick of the set: the policies due at `now`, their budgets allocated jointly;
        `finished(name)` as each one's result is reported."""
        assert self.source is not None
        by_name = {policy.name: policy for policy in policies}

        async def report(name: str, result: TickResult) -> None:
            self._report(by_name[name], result)
            if finished is not None:
                finished(name)

        members = [
            Member(
                policy.name,
                policy.spec,
                self.states.get(policy.name, ReconcileState()),
                self.config.endpoints,
            )
            for policy in policies
        ]
        results = await tick_set(
            members,
            self.source,
            self.actuator,
            now,
            namespace=NAMESPACE,
            ledger=self.ledger,
            healer=self.healer,
            metrics=self.metrics,
            on_result=report,
            planner=self.planner,
        )
        return [results[policy.name] for policy in policies]

    def _report(self, policy: Policy, result: TickResult) -> None:
        self.states[policy.name] = result.state
        self.echo(result.line())
        if self.on_tick is not None:
            self.on_tick(policy.name, result)
        if self.decision_log is not None:
            self.decision_log.write(
                json.dumps({"autoscaler": policy.name, **result.to_dict()}) + "\n"
            )
            self.decision_log.flush()

    def run(self, duration_s: float | None = None, stop: threading.Event | None = None) -> None:
        """Tick every policy on its own schedule until `stop` is set or `duration_s` has passed
        (`run_async` on an event loop of its own).

        A tick that fails with an exception (a bug: Triton's and Prometheus's troubles are
        results) stops the others and is raised here.
        """
        asyncio.run(self.run_async(duration_s, stop))

    async def run_async(
        self, duration_s: float | None = None, stop: threading.Event | None = None
    ) -> None:
        """`run` on the running loop. `stop` may be set from any thread. In the main thread,
        SIGINT and SIGTERM stop the loops too, then raise KeyboardInterrupt here (so that a
        signal never lands inside a tick)."""
        stop = stop or threading.Event()
        interrupted = threading.Event()
        loop = asyncio.get_running_loop()
        previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                previous[signum] = signal.getsignal(signum)
                loop.add_signal_handler(signum, lambda: (interrupted.set(), stop.set()))
        # The run's calls to the pods and Prometheus go over connections kept open between
        # ticks (tritonscale.triton.connections), unless a caller gave its own.
        connections = Connections()
        users = [
            user
            for user in (self.actuator, self.healer, self.source)
            if user is not None and user.connections is None
        ]
        for user in users:
            user.connections = connections
        try:
            await self._run(duration_s, stop, Stop())
        finally:
            for user in users:
                user.connections = None
            await connections.close()
            for signum, handler in previous.items():
                loop.remove_signal_handler(signum)
                signal.signal(signum, handler)
        if interrupted.is_set():
            raise KeyboardInterrupt

    async def _run(self, duration_s: float | None, stop: threading.Event, stopping: Stop) -> None:
        # The caller's flag is a thread's: one waiter turns it (or the duration) into the loop's.
        waiter = asyncio.ensure_future(asyncio.to_thread(stop.wait, duration_s))
        loop = asyncio.ensure_future(self._loop(stopping))
        try:
            await asyncio.wait([waiter, loop], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.set()
            stopping.set()
            # A tick ends within the actuator's load deadline (per budget member) plus bounded
            # reads.
            join_s = self.actuator.load_deadline_s * max(len(self.config.policies), 1) + 60
            _, late = await asyncio.wait([loop], timeout=join_s)
            if late:
                self.echo(f"tune: its tick did not end within {join_s:g} s of the stop")
                loop.cancel()
            await waiter
        if loop.done() and not loop.cancelled() and (error := loop.exception()) is not None:
            raise error

    def pod_set(self) -> PodSet:
        """Every policy, as the config holds it now: the URLs name the same pods for all."""
        policies = self.config.policies
        return PodSet(
            NAMESPACE,
            set_name(NAMESPACE, [e.name for e in self.config.endpoints]),
            tuple(p.name for p in policies),
            tuple(float(p.spec.interval_seconds) for p in policies),
        )

    async def _loop(self, stop: Stop) -> None:
        async def tick(due: list[str], now: float, finished: Callable[[str], None]) -> None:
            # The policies as the config holds them now: a config replaced while the loop
            # runs (the demo pauses and resumes its policies) applies from the next tick.
            await self.round([p for p in self.config.policies if p.name in due], now, finished)

        try:
            await run_set(stop, self.pod_set, tick)
        except Exception:
            stop.set()  # a bug: run() raises it
            raise
