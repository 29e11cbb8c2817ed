"""The Kubernetes driver: one kopf daemon per InstanceGroupAutoscaler runs its control ticks.

    tritonscale operator --namespace ml --liveness http://0.0.0.0:8080/healthz

kopf starts a daemon (`reconcile`) for each object when it appears (or when the operator
starts) and stops it when the object goes. The daemon ticks, then sleeps on kopf's `stopped`
for the spec's `intervalSeconds` (tritonscale.control.loop, the loop `tritonscale tune` runs
too): the ready Triton pods its selector matches (from kopf's index of pods), then
`reconcile.reconcile` (snapshot, policy, actuator), then the result into `status` and
Kubernetes events. The daemon reads the object as kopf last saw it, so a changed spec applies
from the next wake. The handlers only move data between kopf and `reconcile`; the arithmetic
lives in the policy.

State lives in the object's status (`status.policyState`, `status.backoff`,
`status.loadInFlight`, the conditions), so a restarted or failed-over operator carries on
where the last one stopped. A daemon writes its status itself after every tick (kopf applies
a daemon's `patch` only when the daemon returns). An invalid spec is a status condition
(ScalingActive False, InvalidSpec) and one Warning event, never an exception: kopf would
retry it forever, and a fixed spec is picked up on the next wake.

Objects tick independently: each daemon is an asyncio task on kopf's event loop, and a tick
waits on Triton and Prometheus through asyncio clients (no thread is held while a pod is
slow). A tick is bounded: a load waits at most the actuator's deadline (`--load-deadline`),
and a load still in flight from an earlier tick is not waited for again (the tick reports
ReloadTimeout and sends nothing more to that pod). So one object's hung reload delays its own
next tick by at most the deadline, once, and never delays another object's tick. Writes to
the API server (status, the pods' gate) go through the `kubernetes` client, one short call
in a worker thread each.

New Triton pods wait at the readinessGate `tritonscale.io/instances-ready` until they run
their peers' counts. A second daemon per autoscaler (`admit`), apart from its ticks, brings
the waiting pods it selects to its count and opens the gate once every autoscaler selecting
the pod is matched; a watch of the pods opens it at once for a pod that no autoscaler selects
(tritonscale.drivers.admission).

Autoscalers that name a budget (`spec.budget`) share it through one `BudgetLedger` in the
operator process (kopf's peering keeps one operator active): each tick claims and is granted
under its lock, so the grants never exceed the budget although the ticks run apart. After a
restart the ledger is seeded from the other members' status (the index of the autoscalers),
so a member that ticks first cannot take the room the others hold.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import random
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import kopf

from tritonscale.control.ledger import BudgetKey, BudgetLedger
from tritonscale.control.loop import every
from tritonscale.control.operator_metrics import OperatorMetrics
from tritonscale.control.reconcile import budget_key, budget_limits, reconcile
from tritonscale.control.tick import FAILED_RESCALE, RELOAD_TIMEOUT, ReconcileState, TickResult
from tritonscale.core.budget import BUDGET_EXHAUSTED, Claim
from tritonscale.core.spec import AutoscalerSpec, InvalidSpec
from tritonscale.drivers import admission, pods
from tritonscale.metrics.prometheus import PrometheusSource
from tritonscale.metrics.scrape import ScrapeSource
from tritonscale.metrics.source import MetricsSource
from tritonscale.triton.actuator import Actuator
from tritonscale.triton.connections import Connections
from tritonscale.triton.healing import Healer
from tritonscale.triton.loads import DEFAULT_LOAD_DEADLINE_S

GROUP, VERSION, PLURAL = "tritonscale.io", "v1alpha1", "instancegroupautoscalers"


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


@dataclass
class Health:
    """Shared by every object's memo (kopf copies the memo shallowly): the liveness report."""

    ticks: int = 0
    last_tick_at: float | None = None


class StatusWriter:
    """Merge-patches an autoscaler's status with the `kubernetes` client (credentials and
    client as the pods' writer has them: tritonscale.drivers.admission.PodStatusWriter)."""

    def __init__(self, pod_status: admission.PodStatusWriter) -> None:
        self._pod_status = pod_status

    def patch(self, namespace: str, name: str, status: Mapping[str, Any]) -> str | None:
        """Write the fields of `status`; the reason it failed, in one line, or None."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        api = client.CustomObjectsApi(self._pod_status.api_client)
        try:
            api.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, PLURAL, name, {"status": dict(status)}
            )
        except ApiException as error:
            return f"patching {namespace}/{name}'s status failed: {error.status} {error.reason}"
        except Exception as error:  # noqa: BLE001 - the connection's trouble, reported by the caller
            return f"patching {namespace}/{name}'s status failed: {error}"
        return None


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
    ledger: BudgetLedger = field(default_factory=BudgetLedger)
    pod_status: admission.PodStatusWriter = field(default_factory=admission.PodStatusWriter)

    @property
    def status(self) -> StatusWriter:
        return StatusWriter(self.pod_status)


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
    """One autoscaler as the index holds it: what admission and the budgets need of it."""

    autoscaler: admission.Autoscaler
    instance_kind: str
    budget: BudgetKey | None  # None: it names no budget
    claim: Claim | None  # what its status last said it holds (with a budget)


# ---------------------------------------------------------------------------------------
# Handlers.


# Every handler is a coroutine: kopf then runs it on its event loop, not in its executor.


@kopf.index("pods")
async def triton_pods(body: kopf.Body, namespace: str, **_: Any) -> dict[str, pods.TritonPod]:
    """Every pod of the watched namespaces, by namespace; the daemons filter by selector."""
    return {namespace: pods.TritonPod.from_body(body)}


@kopf.index("pods", when=lambda body, **_: pods.waits_for_instances(body))
async def waiting_pods(body: kopf.Body, namespace: str, **_: Any) -> dict[str, pods.TritonPod]:
    """The pods waiting at the gate, by namespace (kopf drops a pod once it stops waiting):
    what the `admit` daemons look through every second, a few pods rather than all."""
    return {namespace: pods.TritonPod.from_body(body)}


@kopf.index(GROUP, VERSION, PLURAL)
async def autoscalers(
    spec: kopf.Spec, status: kopf.Status, name: str, namespace: str, **_: Any
) -> dict[str, Member]:
    """Every autoscaler whose spec reads, by namespace: which pods a new pod must match, and
    what each budget's members hold."""
    try:
        parsed = parse_spec(spec)
    except InvalidSpec:
        return {}
    desired = status.get("desiredInstances")
    found = admission.Autoscaler.of(name, parsed, desired if isinstance(desired, int) else None)
    if parsed.budget is None:
        return {namespace: Member(found, parsed.instance_kind, None, None)}
    held = max(
        (n for n in (status.get("currentInstances"), status.get("desiredInstances")) if n),
        default=parsed.min_instances,
    )
    claim = Claim(name, parsed.model, int(held), int(held), parsed.min_instances)
    return {namespace: Member(found, parsed.instance_kind, budget_key(namespace, parsed), claim)}


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
    if admission.selecting(pod, [m.autoscaler for m in autoscalers.get(namespace, [])]):
        return
    await _set_gate(memo.runtime, pod, admission.judge(pod, [], {}), logger)


@kopf.on.event("pods", when=lambda body, **_: pods.restarted_behind_open_gate(body))
async def close_gate_of_restarted_pods(
    body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    """A container of the pod restarted after its gate opened (an OOM kill, a failed liveness
    probe): Triton runs its repository's counts again. Close the gate while it starts, so the
    pod stays out of the Service until the `admit` daemons have brought it back."""
    pod = pods.TritonPod.from_body(body)
    await _set_gate(memo.runtime, pod, admission.restarted(pod), logger)


@kopf.on.event("pods", when=lambda type, **_: type == "DELETED")
async def forget_deleted_pods(uid: str, memo: kopf.Memo, **_: Any) -> None:
    """A deleted pod's last gate condition is forgotten (the writer skips repeats per pod)."""
    memo.runtime.pod_status.forget(uid)


# A tick waits for at most a load's deadline; past CANCELLATION_S after a stop (the object
# deleted, the operator leaving) kopf cancels it, and a load in flight stays in flight.
CANCELLATION_S = 10.0


@kopf.daemon(GROUP, VERSION, PLURAL, id="reconcile", cancellation_timeout=CANCELLATION_S)
async def reconcile_daemon(
    stopped: kopf.DaemonStopped,
    body: kopf.Body,
    memo: kopf.Memo,
    triton_pods: kopf.Index[str, pods.TritonPod],
    autoscalers: kopf.Index[str, Member],
    logger: kopf.Logger,
    **_: Any,
) -> None:
    """Tick every `spec.intervalSeconds` until kopf stops the daemon."""
    runtime: Runtime = memo.runtime
    # kopf stops every daemon while a peer holds this operator paused, and that peer may
    # change the pods' counts meanwhile: what this operator read of them before is void.
    runtime.actuator.forget_configs()
    name, namespace = body.metadata.name or "", body.metadata.namespace or ""
    # The status as this daemon last wrote it: kopf's view of the body catches up with a
    # write only when its watch event arrives, and the next tick must not read the old state.
    status = dict(body.get("status") or {})
    reported = _Reported()
    # The interval each tick read from the spec (the spec is parsed once per tick).
    schedule = {name: runtime.config.invalid_spec_recheck_s}
    try:
        async for _due in every(stopped, lambda: list(schedule.items())):
            # The spec and its generation as they are now: the status says which one it ran.
            raw_spec, generation = dict(body.spec), body.metadata.get("generation")
            try:
                parsed: AutoscalerSpec | None = parse_spec(raw_spec)
            except InvalidSpec:
                parsed = None
            if parsed is not None:
                schedule[name] = parsed.interval_seconds
            else:
                schedule[name] = runtime.config.invalid_spec_recheck_s
            status = await _tick(
                runtime,
                body,
                parsed or raw_spec,
                generation,
                {**body.status, **status},
                triton_pods,
                autoscalers,
                reported,
                logger,
            )
    finally:
        deleted = kopf.DaemonStoppingReason.RESOURCE_DELETED
        if stopped.reason is not None and stopped.reason & deleted:
            # A tick that ended after the deletion handler ran recorded the series again.
            _forget(runtime, namespace, name, str(body.spec.get("model", "?")))


async def _tick(
    runtime: Runtime,
    body: kopf.Body,
    spec: AutoscalerSpec | dict[str, Any],
    generation: Any,
    status: Mapping[str, Any],
    triton_pods: kopf.Index[str, pods.TritonPod],
    autoscalers: kopf.Index[str, Member],
    reported: _Reported,
    logger: Any,
) -> dict[str, Any]:
    """One tick of one object (`spec` the raw one where it does not read); the status it has
    after it."""
    name, namespace = body.metadata.name or "", body.metadata.namespace or ""
    parsed = spec if isinstance(spec, AutoscalerSpec) else None
    if parsed is not None and parsed.budget is not None:
        key = budget_key(namespace, parsed)
        members = [m.claim for m in autoscalers.get(namespace, []) if m.budget == key and m.claim]
        runtime.ledger.seed(key, budget_limits(parsed), members)
    endpoints = []
    if parsed is not None:
        endpoints = pods.ready_endpoints(
            triton_pods.get(namespace, []),
            parsed.selector,
            runtime.config.triton_http_port,
            runtime.config.triton_metrics_port,
        )
    result = await reconcile(
        spec,
        endpoints,
        runtime.source,
        runtime.actuator,
        ReconcileState.from_status(status),
        time.time(),
        metrics=runtime.metrics,
        namespace=namespace,
        autoscaler=name,
        healer=runtime.healer,
        ledger=runtime.ledger,
    )
    runtime.health.ticks += 1
    runtime.health.last_tick_at = result.finished_at

    new_status = result.status()
    if generation is not None:
        new_status["observedGeneration"] = generation
    changed = _changed(status, new_status)
    if changed:
        problem = await asyncio.to_thread(runtime.status.patch, namespace, name, changed)
        if problem is not None:
            logger.warning(problem)
    _post_events(body, result, reported, logger)
    return {**status, **new_status}


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
    never delays them)."""
    runtime: Runtime = memo.runtime
    runtime.actuator.forget_configs()  # as the reconcile daemon does: a pause voids them
    async for _due in every(stopped, lambda: [(name, runtime.config.admission_interval_s)]):
        # A copy: the index changes under the loop while a pod is being admitted.
        waiting = list(waiting_pods.get(namespace, []))
        if not waiting:
            continue  # the common second: a fleet's daemons cost no walk of its autoscalers
        members = autoscalers.get(namespace, [])
        this = next((m for m in members if m.autoscaler.name == name), None)
        if this is None:
            continue  # its spec does not read: it selects nothing
        others = [m.autoscaler for m in members if m.autoscaler.name != name]
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
    runtime.metrics.forget(namespace, name, model)
    for _namespace, budget in runtime.ledger.forget(namespace, name):
        runtime.metrics.forget_budget(namespace, budget)


@kopf.on.cleanup()
async def close_connections(memo: kopf.Memo, **_: Any) -> None:
    """The connections to the pods and Prometheus close with the operator."""
    await memo.runtime.connections.close()


@kopf.on.probe(id="ticks")
async def ticks_probe(memo: kopf.Memo, **_: Any) -> dict[str, Any]:
    """In kopf's liveness answer: how many ticks ran, and when the last one ended."""
    health: Health = memo.runtime.health
    return {"count": health.ticks, "lastTickAt": health.last_tick_at}


def _changed(status: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """Only the fields that differ: a tick that learnt nothing new writes nothing."""
    return {key: value for key, value in new.items() if status.get(key) != value}


@dataclass
class _Reported:
    """What one object's events last announced (kept by its daemon)."""

    failing: frozenset[str] = frozenset()
    budget_exhausted: bool = False


def _post_events(body: kopf.Body, result: TickResult, reported: _Reported, logger: Any) -> None:
    """A Normal event per change of count, a Warning per failure.

    A failure that persists (no pods, Prometheus down, a bad spec, a load still in flight)
    is reported when it starts, not on every tick: kopf's events are not aggregated as the
    kubelet's are, and a Warning every interval would flood the namespace's events. Each
    failed load, and each load that outlived its deadline, is new.
    """
    logger.debug(result.line())
    if result.applied_ok and result.decision is not None:
        kopf.info(body, reason="SucceededRescale", message=result.decision.message)
        logger.info(result.line())
    previous: Collection[str] = reported.failing
    new_this_tick = {
        FAILED_RESCALE: any(not pod.ok and not pod.pending for pod in result.applied),
        RELOAD_TIMEOUT: any(pod.pending for pod in result.applied),
    }
    for error in result.errors:
        if error.reason not in previous or new_this_tick.get(error.reason, False):
            kopf.warn(body, reason=error.reason, message=error.message)
            logger.warning(result.line())
    reported.failing = frozenset(error.reason for error in result.errors)
    # The budget refusing instances is a Warning when it starts: more pods are the answer.
    exhausted = result.reason == BUDGET_EXHAUSTED
    if exhausted and not reported.budget_exhausted and result.decision is not None:
        kopf.warn(body, reason=BUDGET_EXHAUSTED, message=result.decision.message)
        logger.warning(result.line())
    reported.budget_exhausted = exhausted
    # Healing results are events of their own; the Healer's back-off and attempt limit
    # bound how often a sick model can post one.
    for healing in result.healing_actions:
        if healing.event_type == "Normal":
            kopf.info(body, reason=healing.reason, message=healing.message)
        else:
            kopf.warn(body, reason=healing.reason, message=healing.message)
        logger.warning(healing.message)


# ---------------------------------------------------------------------------------------
# Running.


class _QuietProbes(logging.Filter):
    """Drop kopf's line for every liveness probe: the kubelet asks every few seconds."""

    NOISE = frozenset({"Activity 'ticks' succeeded."})

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.INFO and record.getMessage() in self.NOISE)


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
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "http" or not parts.hostname or port is None:
        return f"--liveness must look like http://0.0.0.0:8080/healthz, got {url!r}"
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


def run(
    config: DriverConfig,
    *,
    namespaces: Collection[str] = (),
    clusterwide: bool = False,
    peering: str | None = None,
    priority: int | None = None,
    peering_lifetime_s: int = 60,
    liveness: str | None = None,
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
    `vault`, `loop` and `pod_status` are for tests (credentials for a mock API server, a
    thread's loop, the client that patches the pods' readinessGate condition).
    """
    if not clusterwide and not namespaces:
        raise ValueError("name at least one namespace, or serve all namespaces")
    if peering and priority is None:
        priority = random.randint(1, 2**31 - 1)
    runtime = make_runtime(config, metrics, pod_status)
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
