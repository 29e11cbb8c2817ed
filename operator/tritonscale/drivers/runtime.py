"""What the Kubernetes driver's handlers share: its settings, the operator-wide objects, the
autoscalers as kopf's index holds them, and the wake-ups that replace polling.

kopf hands every handler the same `memo`; its `runtime` is built once at start-up
(`make_runtime`). The handlers wait on `Signal`s rather than look on a clock: the index of the
autoscalers fires its namespace's `sets` signal when a member joins, leaves or changes what
binds it to a set (its selector, budget, interval, or whether its spec reads), and the
admission signal when what a waiting pod waits for may have changed (tritonscale.drivers.gates);
a load that ended past its deadline fires the admission signals too.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from tritonscale.control.ledger import BudgetKey, BudgetLedger
from tritonscale.control.operator_metrics import OperatorMetrics
from tritonscale.control.pod_sets import PodSet, Shard, pod_sets
from tritonscale.control.set_planner import SetPlanner
from tritonscale.core.budget import Claim
from tritonscale.core.selectors import selector_to_string
from tritonscale.core.spec import AutoscalerSpec, InvalidSpec
from tritonscale.drivers import admission, pods, readiness
from tritonscale.drivers.kube_api import KubeApi
from tritonscale.drivers.status import Reported, StatusWriter
from tritonscale.metrics.prometheus import PrometheusSource
from tritonscale.metrics.scrape import ScrapeSource
from tritonscale.metrics.source import MetricsSource
from tritonscale.triton.actuator import Actuator
from tritonscale.triton.connections import Connections
from tritonscale.triton.healing import Healer
from tritonscale.triton.loads import DEFAULT_LOAD_DEADLINE_S


@dataclass(frozen=True)
class DriverConfig:
    """What `tritonscale operator` passes to the handlers (through kopf's memo)."""

    prometheus_url: str | None = None  # None: scrape each Triton pod's /metrics directly
    repository_key: str | None = None  # None: TRITONSCALE_REPOSITORY_KEY
    # Triton's ports where a pod names no container port "http" / "metrics".
    triton_http_port: int = pods.DEFAULT_HTTP_PORT
    triton_metrics_port: int = pods.DEFAULT_METRICS_PORT
    # How often an object whose spec cannot be read is looked at again (it has no
    # intervalSeconds to trust).
    invalid_spec_recheck_s: float = 15.0
    # How long a tick waits for one load of a model on a pod (tritonscale.triton.loads).
    load_deadline_s: float = DEFAULT_LOAD_DEADLINE_S
    # This replica's share of the pod sets (tritonscale.control.pod_sets.Shard).
    shard: Shard = field(default_factory=Shard)


class Signal:
    """Wakes every coroutine that waits on it, once per `notify`.

    A waiter takes `next()` before it looks at what it waits for, and then waits on that:
    a change between its look and its wait has set the event it holds, so none is missed.
    """

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.version = 0

    def notify(self) -> None:
        self.version += 1
        self._event.set()
        self._event = asyncio.Event()

    def next(self) -> asyncio.Event:
        return self._event


@functools.lru_cache(maxsize=4096)
def _parse(spec_json: str) -> AutoscalerSpec | str:
    try:
        return AutoscalerSpec.from_dict(json.loads(spec_json))
    except InvalidSpec as error:
        return str(error)


def parse_spec(spec: Mapping[str, Any]) -> AutoscalerSpec:
    """`AutoscalerSpec.from_dict`, worked out once per distinct spec (InvalidSpec as it raises).

    Checking a spec and its CEL rules takes about 10 ms here; the index sees every status
    write of every autoscaler and each tick reads its members' specs, so at 500 autoscalers
    parsing alone would take most of a core. The spec is a frozen model: one object serves
    every reader.
    """
    parsed = _parse(json.dumps(dict(spec), sort_keys=True))
    if isinstance(parsed, str):
        raise InvalidSpec(parsed)
    return parsed


@dataclass(frozen=True)
class Member:
    """One autoscaler as the index holds it: what its set's ticks, admission and the budgets
    need of it."""

    name: str
    uid: str | None
    raw_spec: Mapping[str, Any]
    spec: AutoscalerSpec | None  # None: the spec does not read
    status: Mapping[str, Any]
    generation: int | None
    autoscaler: admission.Autoscaler | None  # None: the spec does not read
    instance_kind: str = ""
    budget: BudgetKey | None = None  # None: it names no budget
    claim: Claim | None = None  # what its status last said it holds (with a budget)

    @property
    def binding(self) -> tuple[Any, ...]:
        """What decides its set (tritonscale.control.pod_sets): its selector, its budget, its
        interval, or that its spec does not read."""
        if self.spec is None:
            return (None,)
        budget = self.spec.budget.name if self.spec.budget is not None else None
        return (selector_to_string(self.spec.selector), budget, self.spec.interval_seconds)

    @property
    def admission_view(self) -> tuple[Any, ...]:
        """What a waiting pod's admission reads of it (its count, whether it acts)."""
        return (self.binding, self.autoscaler)


def autoscalers_of(members: Collection[Member]) -> list[admission.Autoscaler]:
    """The members whose spec reads, as admission sees them."""
    return [m.autoscaler for m in members if m.autoscaler is not None]


@dataclass
class Health:
    """Shared by every object's memo (kopf copies the memo shallowly): the liveness report."""

    ticks: int = 0
    last_tick_at: float | None = None


@dataclass
class Runtime:
    """The operator-wide objects the handlers use; built once at start-up."""

    config: DriverConfig
    source: MetricsSource
    actuator: Actuator
    metrics: OperatorMetrics
    healer: Healer
    connections: Connections
    api: KubeApi
    health: Health = field(default_factory=Health)
    # What the readinessProbe answers from (tritonscale.drivers.readiness), and its server.
    readiness: readiness.Readiness = field(default_factory=readiness.Readiness)
    readiness_url: str | None = None
    probe_server: readiness.ProbeServer | None = None
    ledger: BudgetLedger = field(default_factory=BudgetLedger)
    # Per (namespace, autoscaler): what its events last announced.
    reported: dict[tuple[str, str], Reported] = field(default_factory=dict)
    # Per namespace and autoscaler: its spec as the index last took it in (None: it does not
    # read), and what admission read of it. The sets are worked out from here, not from
    # kopf's index, which stores an entry after its function returns: a loop woken by the
    # function sees what it announced whatever kopf does between the two.
    seen: dict[str, dict[str, tuple[AutoscalerSpec | None, tuple[Any, ...]]]] = field(
        default_factory=dict
    )
    # Per namespace: its sets changed, and a waiting pod may be admitted now.
    sets_changed: dict[str, Signal] = field(default_factory=dict)
    admission_due: dict[str, Signal] = field(default_factory=dict)
    # Per namespace: its pod sets as of a version of its `sets_changed` signal.
    sets: dict[str, tuple[int, dict[str, PodSet]]] = field(default_factory=dict)
    # Per (namespace, set): the set's planner, its state across ticks.
    planners: dict[tuple[str, str], SetPlanner] = field(default_factory=dict)

    @property
    def status(self) -> StatusWriter:
        return StatusWriter(self.api)

    @functools.cached_property
    def pod_status(self) -> admission.PodStatusWriter:
        return admission.PodStatusWriter(self.api)

    def planner(self, pod_set: PodSet) -> SetPlanner:
        key = (pod_set.namespace, pod_set.name)
        if key not in self.planners:
            self.planners[key] = SetPlanner(pod_set.name)
        return self.planners[key]

    def sets_signal(self, namespace: str) -> Signal:
        return self.sets_changed.setdefault(namespace, Signal())

    def admission_signal(self, namespace: str) -> Signal:
        return self.admission_due.setdefault(namespace, Signal())

    def saw(self, namespace: str, member: Member) -> None:
        """The index took `member` in: wake those whom its change concerns."""
        seen = self.seen.setdefault(namespace, {})
        before = seen.get(member.name)
        seen[member.name] = (member.spec, member.admission_view)
        if before is None or before[1][0] != member.binding:
            self.sets_signal(namespace).notify()
        if before is None or before[1] != member.admission_view:
            self.admission_signal(namespace).notify()

    def left(self, namespace: str, name: str) -> None:
        """An autoscaler left the index (deleted, or being deleted)."""
        if self.seen.get(namespace, {}).pop(name, None) is not None:
            self.sets_signal(namespace).notify()
            self.admission_signal(namespace).notify()

    def set_of(self, namespace: str, name: str) -> PodSet | None:
        """The set of autoscaler `name`: worked out again only after the namespace's sets
        changed, however many loops ask."""
        version = self.sets_signal(namespace).version
        kept = self.sets.get(namespace)
        if kept is None or kept[0] != version:
            specs = {name: spec for name, (spec, _) in self.seen.get(namespace, {}).items()}
            found = pod_sets(namespace, specs, self.config.invalid_spec_recheck_s)
            kept = (version, {member: s for s in found for member in s.members})
            self.sets[namespace] = kept
        return kept[1].get(name)

    def load_ended(self) -> None:
        """A load that outlived its deadline ended: the pods it held back may be admitted
        (the load names its pod, not the pod's namespace: every namespace looks)."""
        for signal in self.admission_due.values():
            signal.notify()

    def owns(self, namespace: str, name: str) -> bool:
        """Whether this replica owns the set of autoscaler `name` (every replica owns all with
        one)."""
        if self.config.shard.total == 1:
            return True
        pod_set = self.set_of(namespace, name)
        return pod_set is not None and self.config.shard.owns(pod_set)

    def forget(self, namespace: str, name: str) -> None:
        """What the driver kept of an autoscaler that is gone."""
        self.reported.pop((namespace, name), None)
        self.left(namespace, name)


def make_runtime(
    config: DriverConfig, metrics: OperatorMetrics | None = None, api: KubeApi | None = None
) -> Runtime:
    # Every call to the pods and Prometheus goes over connections kept open between ticks.
    connections = Connections()
    source: PrometheusSource | ScrapeSource
    if config.prometheus_url:
        source = PrometheusSource(config.prometheus_url, connections=connections)
    else:
        source = ScrapeSource(connections=connections)
    actuator = Actuator(
        repository_key=config.repository_key,
        load_deadline_s=config.load_deadline_s,
        connections=connections,
    )
    runtime = Runtime(
        config=config,
        source=source,
        actuator=actuator,
        metrics=metrics if metrics is not None else OperatorMetrics(),
        # The actuator's loads: neither piles a load on one the other left in flight.
        healer=Healer(
            repository_key=actuator.repository_key,
            loads=actuator.loads,
            # One read serves the healer and the snapshot (scraping), or Prometheus answers it.
            request_counters=source.request_counters,
            connections=connections,
        ),
        connections=connections,
        api=api if api is not None else KubeApi(),
    )
    # A load past its deadline may hold a waiting pod back: its end is news for admission.
    actuator.loads.on_late_end(lambda _pod, _model: runtime.load_ended())
    return runtime
