"""The Kubernetes driver: the autoscalers' pod sets tick in kopf daemons.

    tritonscale operator --namespace ml --liveness http://0.0.0.0:8080/healthz

The autoscalers that select the same pods or share a budget form a pod set
(tritonscale.control.pod_sets) and tick as one (tritonscale.control.set_tick): one read of
each pod, or one Prometheus query per signal, serves every member. kopf starts a daemon
(`reconcile`) for each object when it appears (or when the operator starts) and stops it when
the object goes; the daemon of the set's leader (its first member by name) runs the set's
ticks at the set's phase (tritonscale.control.loop.run_set), the others look every interval
whether they lead now (the leader was deleted, or the set split). Sets and their members come
from kopf's index of the autoscalers (`autoscalers`), so a member added, changed or deleted
joins or leaves its set at the next tick. The handlers only move data between kopf and the
control loop; the arithmetic lives in the policy.

State lives in each object's status (`status.policyState`, `status.backoff`,
`status.loadInFlight`, the conditions), so a restarted or failed-over operator carries on
where the last one stopped. The leader writes each member's status after the set's tick
(tritonscale.drivers.status: only what changed, the signals that move with time at most once
a minute), and remembers what it wrote: kopf's view of an object catches up with a write only
when its watch event arrives, and the next tick must not read the old state. An invalid spec
is a status condition (ScalingActive False, InvalidSpec) and one Warning event, never an
exception: kopf would retry it forever, and a fixed spec is picked up on the next wake.

Sets tick independently: each leader's daemon is an asyncio task on kopf's event loop, and a
tick waits on Triton and Prometheus through asyncio clients (no thread is held while a pod is
slow). A tick is bounded: a load waits at most the actuator's deadline (`--load-deadline`),
and a load still in flight from an earlier tick is not waited for again (the tick reports
ReloadTimeout and sends nothing more to that pod). Writes to the API server (status, the
pods' gate) go through the `kubernetes` client, one short call in a worker thread each.

New Triton pods wait at the readinessGate `tritonscale.io/instances-ready` until they run
their peers' counts. A second daemon per autoscaler (`admit`), apart from its ticks, brings
the waiting pods it selects to its count and opens the gate once every autoscaler selecting
the pod is matched; a watch of the pods opens it at once for a pod that no autoscaler selects
(tritonscale.drivers.admission).

A budget (`spec.budget`) is granted once per tick of its set, through one `BudgetLedger` in
the operator process (kopf's peering keeps one operator active). After a restart the ledger
is seeded from the other members' status (the index of the autoscalers), so a member that
ticks first cannot take the room the others hold.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import logging
import os
import random
import socket
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit
from uuid import uuid4

import kopf

from tritonscale.control import set_tick
from tritonscale.control.ledger import BudgetKey, BudgetLedger
from tritonscale.control.loop import run_set
from tritonscale.control.operator_metrics import OperatorMetrics
from tritonscale.control.pod_sets import PodSet, Shard, pod_sets, set_of
from tritonscale.control.reconcile import budget_key, budget_limits
from tritonscale.control.set_planner import SetPlanner
from tritonscale.control.tick import ReconcileState, TickResult, iso_time
from tritonscale.core.budget import Claim
from tritonscale.core.selectors import selector_to_string
from tritonscale.core.spec import AutoscalerSpec, InvalidSpec
from tritonscale.drivers import admission, kopf_startup, pods, readiness
from tritonscale.drivers.status import (
    GROUP,
    HEARTBEAT,
    PLURAL,
    VERSION,
    Reported,
    StatusWriter,
    changed,
    post_events,
    reference,
)
from tritonscale.metrics.prometheus import PrometheusSource
from tritonscale.metrics.scrape import ScrapeSource
from tritonscale.metrics.source import MetricsSource
from tritonscale.triton.actuator import Actuator
from tritonscale.triton.connections import Connections
from tritonscale.triton.healing import Healer
from tritonscale.triton.loads import DEFAULT_LOAD_DEADLINE_S


class OperatorError(RuntimeError):
    """The operator cannot start; the message is one line for a person."""


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
    # How often each autoscaler looks for pods waiting at the gate that it selects.
    admission_interval_s: float = 1.0
    # This replica's share of the pod sets (tritonscale.control.pod_sets.Shard).
    shard: Shard = field(default_factory=Shard)


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
    health: Health = field(default_factory=Health)
    # What the readinessProbe answers from (tritonscale.drivers.readiness), and its server.
    readiness: readiness.Readiness = field(default_factory=readiness.Readiness)
    readiness_url: str | None = None
    probe_server: readiness.ProbeServer | None = None
    ledger: BudgetLedger = field(default_factory=BudgetLedger)
    pod_status: admission.PodStatusWriter = field(default_factory=admission.PodStatusWriter)
    # Per (namespace, autoscaler): the status as this operator last wrote it, and what its
    # events last announced.
    written: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    reported: dict[tuple[str, str], Reported] = field(default_factory=dict)
    # Per namespace: its pod sets, worked out at most once a second (monotonic seconds, sets).
    sets: dict[str, tuple[float, list[PodSet]]] = field(default_factory=dict)
    # Per namespace: set when a pod starts or goes on waiting at the gate (the `admit` daemons).
    waiting: dict[str, asyncio.Event] = field(default_factory=dict)
    # Per (namespace, set): the set's planner, its state across ticks.
    planners: dict[tuple[str, str], SetPlanner] = field(default_factory=dict)

    def planner(self, pod_set: PodSet) -> SetPlanner:
        key = (pod_set.namespace, pod_set.name)
        if key not in self.planners:
            self.planners[key] = SetPlanner(pod_set.name)
        return self.planners[key]

    def pods_waiting(self, namespace: str) -> asyncio.Event:
        return self.waiting.setdefault(namespace, asyncio.Event())

    @property
    def status(self) -> StatusWriter:
        return StatusWriter(self.pod_status)

    def forget(self, namespace: str, name: str) -> None:
        """What the driver kept of an autoscaler that is gone."""
        self.written.pop((namespace, name), None)
        self.reported.pop((namespace, name), None)
        self.sets.pop(namespace, None)


def make_runtime(
    config: DriverConfig,
    metrics: OperatorMetrics | None = None,
    pod_status: admission.PodStatusWriter | None = None,
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
    return Runtime(
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
        pod_status=pod_status or admission.PodStatusWriter(),
    )


@functools.lru_cache(maxsize=4096)
def _parse(spec_json: str) -> AutoscalerSpec | str:
    try:
        return AutoscalerSpec.from_dict(json.loads(spec_json))
    except InvalidSpec as error:
        return str(error)


def parse_spec(spec: Mapping[str, Any]) -> AutoscalerSpec:
    """`AutoscalerSpec.from_dict`, worked out once per distinct spec (InvalidSpec as it raises).

    Checking a spec and its CEL rules takes about 10 ms here; the index sees every status
    write of every autoscaler and each daemon reads its spec every tick, so at 500 autoscalers
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


def autoscalers_of(members: Collection[Member]) -> list[admission.Autoscaler]:
    """The members whose spec reads, as admission sees them."""
    return [m.autoscaler for m in members if m.autoscaler is not None]


# ---------------------------------------------------------------------------------------
# Handlers.


# Every handler is a coroutine: kopf then runs it on its event loop, not in its executor.


@kopf.index("pods")
async def triton_pods(body: kopf.Body, namespace: str, **_: Any) -> dict[str, pods.TritonPod]:
    """Every pod of the watched namespaces, by namespace; the daemons filter by selector."""
    return {namespace: pods.TritonPod.from_body(body)}


@kopf.index("pods", when=lambda body, **_: pods.waits_for_instances(body))
async def waiting_pods(
    body: kopf.Body, namespace: str, memo: kopf.Memo, **_: Any
) -> dict[str, pods.TritonPod]:
    """The pods waiting at the gate, by namespace (kopf drops a pod once it stops waiting):
    what the `admit` daemons look through, a few pods rather than all. A pod that starts or
    goes on waiting wakes its namespace's daemons."""
    memo.runtime.pods_waiting(namespace).set()
    return {namespace: pods.TritonPod.from_body(body)}


@kopf.index(GROUP, VERSION, PLURAL)
async def autoscalers(
    spec: kopf.Spec,
    status: kopf.Status,
    meta: kopf.Meta,
    name: str,
    namespace: str,
    uid: str,
    **_: Any,
) -> dict[str, Member]:
    """Every autoscaler, by namespace: the sets' members, which pods a new pod must match,
    and what each budget's members hold."""
    raw_spec, raw_status = copy.deepcopy(dict(spec)), copy.deepcopy(dict(status))
    generation = meta.get("generation")
    generation = generation if isinstance(generation, int) else None
    try:
        parsed = parse_spec(raw_spec)
    except InvalidSpec:
        return {namespace: Member(name, uid, raw_spec, None, raw_status, generation, None)}
    desired = raw_status.get("desiredInstances")
    found = admission.Autoscaler.of(name, parsed, desired if isinstance(desired, int) else None)
    member = Member(
        name, uid, raw_spec, parsed, raw_status, generation, found, parsed.instance_kind
    )
    if parsed.budget is None:
        return {namespace: member}
    held = max(
        (n for n in (raw_status.get("currentInstances"), desired) if isinstance(n, int) and n),
        default=parsed.min_instances,
    )
    claim = Claim(name, parsed.model, int(held), int(held), parsed.min_instances)
    return {namespace: replace(member, budget=budget_key(namespace, parsed), claim=claim)}


@kopf.on.event("pods", when=lambda body, **_: pods.waits_for_instances(body))
async def admit_unselected_pods(
    body: kopf.Body,
    namespace: str,
    memo: kopf.Memo,
    autoscalers: kopf.Index[str, Member],
    logger: kopf.Logger,
    **_: Any,
) -> None:
    """A pod waiting at the gate that no autoscaler selects joins at once (the `admit`
    daemons of its autoscalers admit the others: tritonscale.drivers.admission)."""
    pod = pods.TritonPod.from_body(body)
    if admission.selecting(pod, autoscalers_of(autoscalers.get(namespace, []))):
        return
    if memo.runtime.config.shard.index != 0:
        return  # a pod of no set: the first replica opens its gate
    await _set_gate(memo.runtime, pod, admission.judge(pod, [], {}), logger)


@kopf.on.event("pods", when=lambda body, **_: pods.restarted_behind_open_gate(body))
async def close_gate_of_restarted_pods(
    body: kopf.Body,
    namespace: str,
    memo: kopf.Memo,
    autoscalers: kopf.Index[str, Member],
    logger: kopf.Logger,
    **_: Any,
) -> None:
    """A container of the pod restarted after its gate opened (an OOM kill, a failed liveness
    probe): Triton runs its repository's counts again. Close the gate while it starts, so the
    pod stays out of the Service until the `admit` daemons have brought it back."""
    pod = pods.TritonPod.from_body(body)
    chosen = admission.selecting(pod, autoscalers_of(autoscalers.get(namespace, [])))
    runtime: Runtime = memo.runtime
    if chosen and not owns(runtime, namespace, chosen[0].name, autoscalers):
        return  # the replica that owns the set of its first autoscaler closes it
    if not chosen and runtime.config.shard.index != 0:
        return
    await _set_gate(runtime, pod, admission.restarted(pod), logger)


def owns(
    runtime: Runtime, namespace: str, autoscaler: str, autoscalers: kopf.Index[str, Member]
) -> bool:
    """Whether this replica owns the set of `autoscaler` (every replica owns all with one)."""
    if runtime.config.shard.total == 1:
        return True
    pod_set = set_of(namespace_sets(runtime, namespace, autoscalers), autoscaler)
    return pod_set is not None and runtime.config.shard.owns(pod_set)


@kopf.on.event("pods", when=lambda type, **_: type == "DELETED")
async def forget_deleted_pods(uid: str, memo: kopf.Memo, **_: Any) -> None:
    """A deleted pod's last gate condition is forgotten (the writer skips repeats per pod)."""
    memo.runtime.pod_status.forget(uid)


# A tick waits for at most a load's deadline; past CANCELLATION_S after a stop (the object
# deleted, the operator leaving) kopf cancels it, and a load in flight stays in flight.
CANCELLATION_S = 10.0


# How long a namespace's pod sets, once worked out, serve the daemons that ask.
SETS_MAX_AGE_S = 1.0


@kopf.daemon(GROUP, VERSION, PLURAL, id="reconcile", cancellation_timeout=CANCELLATION_S)
async def reconcile_daemon(
    stopped: kopf.DaemonStopped,
    name: str,
    namespace: str,
    spec: kopf.Spec,
    memo: kopf.Memo,
    triton_pods: kopf.Index[str, pods.TritonPod],
    autoscalers: kopf.Index[str, Member],
    logger: kopf.Logger,
    **_: Any,
) -> None:
    """Run the ticks of this autoscaler's pod set while it leads the set, until kopf stops
    the daemon."""
    runtime: Runtime = memo.runtime

    def leading() -> PodSet | None:
        pod_set = set_of(namespace_sets(runtime, namespace, autoscalers), name)
        if pod_set is None or pod_set.leader != name or not runtime.config.shard.owns(pod_set):
            return None
        return pod_set

    async def tick(due: list[str], now: float, finished: Callable[[str], None]) -> None:
        pod_set = leading()
        if pod_set is not None:
            await tick_set(runtime, pod_set, due, now, triton_pods, autoscalers, logger, finished)

    try:
        parsed: AutoscalerSpec | None = parse_spec(spec)
    except InvalidSpec:
        parsed = None
    idle_s = parsed.interval_seconds if parsed else runtime.config.invalid_spec_recheck_s
    try:
        await run_set(stopped, leading, tick, idle_s=idle_s)
    finally:
        reason = stopped.reason or kopf.DaemonStoppingReason(0)
        if reason & kopf.DaemonStoppingReason.RESOURCE_DELETED:
            # A tick that ended after the deletion handler ran recorded the series again.
            _forget(runtime, namespace, name, str(spec.get("model", "?")))
        if reason & kopf.DaemonStoppingReason.OPERATOR_PAUSING:
            # A peer holds this operator paused and may change the pods' counts and the
            # statuses meanwhile: what this operator read and wrote of them before is void.
            runtime.actuator.forget_configs()
            runtime.written.clear()
            runtime.planners.clear()


def namespace_sets(
    runtime: Runtime, namespace: str, autoscalers: kopf.Index[str, Member]
) -> list[PodSet]:
    """The namespace's pod sets as the index holds its autoscalers (worked out at most once
    per `SETS_MAX_AGE_S`: every daemon of the namespace asks at every wake)."""
    now = time.monotonic()
    kept = runtime.sets.get(namespace)
    if kept is not None and now - kept[0] < SETS_MAX_AGE_S:
        return kept[1]
    members = {m.name: m.spec for m in autoscalers.get(namespace, [])}
    sets = pod_sets(namespace, members, runtime.config.invalid_spec_recheck_s)
    runtime.sets[namespace] = (now, sets)
    return sets


async def tick_set(
    runtime: Runtime,
    pod_set: PodSet,
    due: Sequence[str],
    now: float,
    triton_pods: kopf.Index[str, pods.TritonPod],
    autoscalers: kopf.Index[str, Member],
    logger: Any,
    finished: Callable[[str], None] = lambda _name: None,
) -> None:
    """One tick of a pod set: its due members decided together, then each one's status and
    events written as soon as its result is ready (`finished(name)` after it)."""
    namespace = pod_set.namespace
    found = {m.name: m for m in autoscalers.get(namespace, [])}
    entries = [found[name] for name in due if name in found]
    for key, limits in {
        budget_key(namespace, m.spec): budget_limits(m.spec)
        for m in entries
        if m.spec is not None and m.spec.budget is not None
    }.items():
        seeds = [m.claim for m in found.values() if m.budget == key and m.claim]
        runtime.ledger.seed(key, limits, seeds)
    namespace_pods = triton_pods.get(namespace, [])
    endpoints_of: dict[str, list[Any]] = {}  # by selector: the members of a set share one
    members = []
    for entry in entries:
        endpoints: list[Any] = []
        if entry.spec is not None:
            selector = selector_to_string(entry.spec.selector)
            if selector not in endpoints_of:
                endpoints_of[selector] = pods.ready_endpoints(
                    namespace_pods,
                    entry.spec.selector,
                    runtime.config.triton_http_port,
                    runtime.config.triton_metrics_port,
                )
            endpoints = endpoints_of[selector]
        members.append(
            set_tick.Member(
                entry.name,
                entry.spec or entry.raw_spec,
                ReconcileState.from_status(_status(runtime, namespace, entry)),
                endpoints,
            )
        )
    by_name = {entry.name: entry for entry in entries}

    async def write(name: str, result: TickResult) -> None:
        runtime.health.ticks += 1
        runtime.health.last_tick_at = result.finished_at
        await _write(runtime, pod_set, by_name[name], result, logger)
        finished(name)

    await set_tick.tick_set(
        members,
        runtime.source,
        runtime.actuator,
        now,
        namespace=namespace,
        ledger=runtime.ledger,
        healer=runtime.healer,
        metrics=runtime.metrics,
        on_result=write,
        planner=runtime.planner(pod_set),
    )


def _status(runtime: Runtime, namespace: str, entry: Member) -> dict[str, Any]:
    """The member's status as this operator last wrote it, over the index's view."""
    return {**entry.status, **runtime.written.get((namespace, entry.name), {})}


async def _write(
    runtime: Runtime, pod_set: PodSet, entry: Member, result: TickResult, logger: Any
) -> None:
    """A member's status (what changed) and events after its set's tick."""
    namespace = pod_set.namespace
    before = _status(runtime, namespace, entry)
    new_status = result.status()
    new_status[HEARTBEAT] = iso_time(result.at)
    new_status["podSet"] = {**pod_set.to_dict(), "shard": str(runtime.config.shard)}
    if entry.generation is not None:
        new_status["observedGeneration"] = entry.generation
    fields = changed(before, new_status)
    if fields:
        problem = await asyncio.to_thread(runtime.status.patch, namespace, entry.name, fields)
        if problem is not None:
            logger.warning(problem)
        else:
            runtime.written[(namespace, entry.name)] = {**before, **fields}
    reported = runtime.reported.setdefault((namespace, entry.name), Reported())
    post_events(reference(namespace, entry.name, entry.uid), result, reported, logger)


@kopf.daemon(GROUP, VERSION, PLURAL, id="admit", cancellation_timeout=CANCELLATION_S)
async def admit_daemon(
    stopped: kopf.DaemonStopped,
    name: str,
    namespace: str,
    memo: kopf.Memo,
    waiting_pods: kopf.Index[str, pods.TritonPod],
    autoscalers: kopf.Index[str, Member],
    logger: kopf.Logger,
    **_: Any,
) -> None:
    """Bring the pods waiting at the gate that this autoscaler selects to its count, and open
    the gate of those that run every count they must (apart from the ticks: a pod's load
    never delays them). It sleeps until a pod waits (the `waiting_pods` index wakes it), then
    looks every `admission_interval_s` while one does."""
    runtime: Runtime = memo.runtime
    while not stopped.is_set():
        woken = runtime.pods_waiting(namespace)
        # A copy: the index changes under the loop while a pod is being admitted.
        waiting = list(waiting_pods.get(namespace, []))
        if not waiting:
            woken.clear()
            if not waiting_pods.get(namespace):  # none came between the look and the clear
                await _until(stopped, woken)
            continue
        await _admit_waiting(runtime, name, namespace, waiting, autoscalers, logger)
        await stopped.wait(runtime.config.admission_interval_s)


async def _until(stopped: kopf.DaemonStopped, event: asyncio.Event) -> None:
    """Until `event` is set or the daemon is stopped."""
    waits = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(stopped.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


async def _admit_waiting(
    runtime: Runtime,
    name: str,
    namespace: str,
    waiting: list[pods.TritonPod],
    autoscalers: kopf.Index[str, Member],
    logger: Any,
) -> None:
    """The waiting pods that autoscaler `name` selects, brought to its count and admitted."""
    members = autoscalers.get(namespace, [])
    this = next((m for m in members if m.name == name and m.autoscaler), None)
    if this is None:
        return  # its spec does not read: it selects nothing
    if not owns(runtime, namespace, name, autoscalers):
        return  # another replica owns its set
    others = [a for a in autoscalers_of(members) if a.name != name]
    for pod in waiting:
        if pod.waiting_for_instances and admission.selecting(pod, [this.autoscaler]):
            await _admit(runtime, pod, this, others, logger)


async def _admit(
    runtime: Runtime,
    pod: pods.TritonPod,
    this: Member,
    others: list[admission.Autoscaler],
    logger: Any,
) -> None:
    """Bring a pod waiting at the gate to this autoscaler's count, then admit it if every
    autoscaler that selects it is matched (tritonscale.drivers.admission)."""
    endpoint = pod.endpoint(runtime.config.triton_http_port, runtime.config.triton_metrics_port)
    actuator, autoscaler = runtime.actuator, this.autoscaler
    assert autoscaler is not None
    if autoscaler.acting and autoscaler.desired is not None:
        counts, _ = await actuator.live_counts([endpoint], autoscaler.model)
        if counts.get(pod.name) != autoscaler.desired and not actuator.in_flight(
            endpoint, autoscaler.model
        ):
            await actuator.apply(
                [endpoint], autoscaler.model, autoscaler.desired, this.instance_kind
            )
    live: dict[str, int | None] = {}
    for selecting in admission.selecting(pod, [autoscaler, *others]):
        counts, _ = await actuator.live_counts([endpoint], selecting.model)
        live[selecting.model] = counts.get(pod.name)
    verdict = admission.judge(pod, [autoscaler, *others], live)
    if verdict.admit:
        await _set_gate(runtime, pod, verdict, logger)
    else:
        logger.debug(verdict.message)


async def _set_gate(
    runtime: Runtime, pod: pods.TritonPod, verdict: admission.Verdict, logger: Any
) -> None:
    problem = await asyncio.to_thread(runtime.pod_status.set_gate, pod, verdict, time.time())
    if problem is not None:
        logger.warning(problem)
    else:
        state = "True" if verdict.admit else "False"
        logger.info(f"{pods.INSTANCES_READY} of {pod.name}: {state} ({verdict.message})")


@kopf.on.delete(GROUP, VERSION, PLURAL, optional=True)
async def forget_autoscaler(
    spec: kopf.Spec, name: str, namespace: str, memo: kopf.Memo, **_: Any
) -> None:
    """A deleted autoscaler's series must go, or its stale timestamp would fire alerts; it
    leaves its budget, and a budget without members loses its series too. Optional: the
    object's deletion never waits for it."""
    _forget(memo.runtime, namespace, name, str(spec.get("model", "?")))


def _forget(runtime: Runtime, namespace: str, name: str, model: str) -> None:
    runtime.forget(namespace, name)
    runtime.metrics.forget(namespace, name, model)
    for _namespace, budget in runtime.ledger.forget(namespace, name):
        runtime.metrics.forget_budget(namespace, budget)


@kopf.on.cleanup()
async def close_connections(memo: kopf.Memo, **_: Any) -> None:
    """The connections to the pods and Prometheus close with the operator."""
    await memo.runtime.connections.close()


@kopf.on.event("pods", when=lambda memo, **_: not memo.runtime.readiness.synced)
@kopf.on.event(GROUP, VERSION, PLURAL, when=lambda memo, **_: not memo.runtime.readiness.synced)
async def note_indexes_synced(memo: kopf.Memo, **_: Any) -> None:
    """kopf calls no handler before every index is full: the first call says they are (the
    readinessProbe: tritonscale.drivers.readiness)."""
    memo.runtime.readiness.note_synced()


@kopf.on.startup()
async def serve_readiness(memo: kopf.Memo, **_: Any) -> None:
    """The readinessProbe's endpoint, on kopf's loop (`--readiness`)."""
    runtime: Runtime = memo.runtime
    if runtime.readiness_url is None:
        return
    server = readiness.ProbeServer(runtime.readiness_url, runtime.readiness)
    try:
        await server.start()
    except OSError as error:
        raise kopf.PermanentError(
            f"cannot serve the readiness probe at {runtime.readiness_url}: {error.strerror}"
        ) from None
    runtime.probe_server = server


@kopf.on.cleanup()
async def stop_readiness(memo: kopf.Memo, **_: Any) -> None:
    if memo.runtime.probe_server is not None:
        await memo.runtime.probe_server.stop()


@kopf.on.probe(id="ticks")
async def ticks_probe(memo: kopf.Memo, **_: Any) -> dict[str, Any]:
    """In kopf's liveness answer: how many ticks ran, and when the last one ended."""
    health: Health = memo.runtime.health
    return {"count": health.ticks, "lastTickAt": health.last_tick_at}


# ---------------------------------------------------------------------------------------
# Running.


class _QuietProbes(logging.Filter):
    """Drop kopf's line for every liveness probe: the kubelet asks every few seconds."""

    NOISE = frozenset({"Activity 'ticks' succeeded."})

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.INFO and record.getMessage() in self.NOISE)


def shard_of(shard: str, total: int) -> Shard:
    """`--shard` as given (a number, or a StatefulSet pod's name ending in its ordinal) of
    `--total-shards`; ValueError with one line when it is neither, or out of range."""
    ordinal = shard.rsplit("-", 1)[-1]
    if not ordinal.isdigit():
        raise ValueError(f"--shard must be a number or a pod name ending in -N, got {shard!r}")
    index = int(ordinal)
    if index >= total:
        raise ValueError(f"--shard {index} is out of range for --total-shards {total}")
    return Shard(index, total)


def credentials_problem() -> str | None:
    """Why kopf could not log in to Kubernetes, in one line; None when it can.

    kopf would find out too, but with a page of tracebacks; this is the same search
    (in-cluster service account, then kubeconfig) through the same `kubernetes` client.
    """
    from kubernetes import config

    try:
        config.load_incluster_config()
        return None
    except config.ConfigException:
        pass
    try:
        config.load_kube_config()
        return None
    except (config.ConfigException, OSError, ValueError) as error:
        detail = " ".join(str(error).split())
        return f"no Kubernetes credentials: not in a cluster, and no usable kubeconfig ({detail})"


def liveness_problem(url: str) -> str | None:
    """kopf serves its probe on http://HOST:PORT/PATH; anything else fails deep inside it."""
    return probe_url_problem("--liveness", url, "http://0.0.0.0:8080/healthz")


def probe_url_problem(option: str, url: str, example: str) -> str | None:
    """A probe's endpoint must be http://HOST:PORT/PATH; why `url` is not, in one line."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "http" or not parts.hostname or port is None:
        return f"{option} must look like {example}, got {url!r}"
    return None


def settings(peering_lifetime_s: int = 60) -> kopf.OperatorSettings:
    """kopf's settings for this operator."""
    operator_settings = kopf.OperatorSettings()
    # A replica killed without a word (SIGKILL, a lost node) keeps its peering record until
    # this expires: the standby's takeover time. kopf's default is 60 s.
    operator_settings.peering.lifetime = peering_lifetime_s
    # No cluster-wide scans of namespaces and CRDs: they would need a ClusterRole (list and
    # watch namespaces and customresourcedefinitions) for nothing this operator uses. It
    # serves the namespaces it is given and the resources present at start (the chart
    # installs the CRD before the operator).
    operator_settings.scanning.disabled = True
    operator_settings.posting.level = logging.INFO
    return operator_settings


def _readiness(
    runtime: Runtime,
    identity: str,
    namespaces: Collection[str],
    peering: str | None,
    priority: int,
) -> readiness.Readiness:
    """What the readinessProbe asks, and of whom (an empty `namespaces`: cluster-wide)."""
    reads = readiness.ApiReads(lambda: runtime.pod_status.api_client, namespaces, peering)
    return readiness.Readiness(
        peering=peering,
        identity=identity,
        priority=priority,
        namespaces=list(namespaces) or [""],
        nothing_to_index=reads.nothing_to_index,
        read_peering=reads.peering_status,
    )


def run(
    config: DriverConfig,
    *,
    namespaces: Collection[str] = (),
    clusterwide: bool = False,
    peering: str | None = None,
    priority: int | None = None,
    peering_lifetime_s: int = 60,
    liveness: str | None = None,
    readiness_url: str | None = None,
    metrics_port: int | None = 9102,
    metrics: OperatorMetrics | None = None,
    stop_flag: Any = None,
    ready_flag: Any = None,
    vault: Any = None,
    loop: Any = None,
    pod_status: admission.PodStatusWriter | None = None,
) -> None:
    """Run the operator until stopped (SIGTERM/SIGINT in the main thread, or `stop_flag`).

    `peering` names the KopfPeering objects; None runs standalone. Replicas sharing a
    peering must not share a priority (kopf pauses all of them then): by default each picks
    a random one, so exactly one is active and another takes over when it goes: at once when
    it stops cleanly, within `peering_lifetime_s` when it is killed.
    `liveness` and `readiness_url` are where kopf's liveness probe and the readinessProbe
    (tritonscale.drivers.readiness) are served, if anywhere.
    `vault`, `loop` and `pod_status` are for tests (credentials for a mock API server, a
    thread's loop, the client that patches the pods' readinessGate condition).
    """
    if not clusterwide and not namespaces:
        raise ValueError("name at least one namespace, or serve all namespaces")
    if peering and priority is None:
        priority = random.randint(1, 2**31 - 1)
    runtime = make_runtime(config, metrics, pod_status)
    # A restarted replica waits on kopf's indexing of every pod and autoscaler before its
    # first tick; kopf's own barrier for it is quadratic in their number.
    kopf_startup.install()
    # kopf names a replica in the peering object by this (the chart sets POD_ID to the pod's
    # name); the readinessProbe finds it there.
    identity = os.environ.get("POD_ID") or f"{socket.gethostname()}/{os.getpid()}/{uuid4().hex[:6]}"
    runtime.readiness_url = readiness_url
    runtime.readiness = _readiness(runtime, identity, namespaces, peering, priority or 0)
    logging.getLogger("kopf.activities.probe").addFilter(_QuietProbes())
    server = None
    if metrics_port is not None:
        try:
            server = runtime.metrics.serve(metrics_port)
        except OSError as error:
            raise OperatorError(
                f"cannot serve the operator's metrics on port {metrics_port}: {error.strerror}"
            ) from None
    try:
        kopf.run(
            loop=loop,
            settings=settings(peering_lifetime_s),
            standalone=peering is None,
            peering_name=peering,
            priority=priority or 0,
            identity=identity,
            liveness_endpoint=liveness,
            clusterwide=clusterwide,
            namespaces=list(namespaces),
            stop_flag=stop_flag,
            ready_flag=ready_flag,
            vault=vault,
            memo=kopf.Memo(runtime=runtime),
        )
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
