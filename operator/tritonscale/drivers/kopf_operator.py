"""The Kubernetes driver: kopf handlers that run one control tick per InstanceGroupAutoscaler.

    tritonscale operator --namespace ml --liveness http://0.0.0.0:8080/healthz

A timer wakes every `TICK_S` for each object and runs a tick when the object's
`spec.intervalSeconds` has passed (or its spec changed): the ready Triton pods its selector
matches (from kopf's index of pods), then `reconcile.reconcile` (snapshot, policy,
actuator), then the result into `status` and Kubernetes events. The handlers only move
data between kopf and `reconcile`; the arithmetic lives in the policy.

State lives in the object's status (`status.policyState`, `status.backoff`,
`status.loadInFlight`, the conditions), so a restarted or failed-over operator carries on
where the last one stopped. An invalid spec is a status condition (ScalingActive False,
InvalidSpec) and one Warning event, never an exception: kopf would retry it forever, and a
fixed spec is picked up on the next tick.

Objects tick independently: kopf runs each object's timer as a task of its own, its sync
handler in a worker thread. A tick is bounded: a load waits at most the actuator's
deadline (`--load-deadline`), and a load still in flight from an earlier tick is not waited
for again (the tick reports ReloadTimeout and sends nothing more to that pod). So one
object's hung reload holds one worker thread for at most the deadline, once, and never
delays another object's tick.

New Triton pods wait at the readinessGate `tritonscale.io/instances-ready` until they run
their peers' counts: each tick brings the waiting pods its autoscaler selects to its count and
opens the gate once every autoscaler selecting the pod is matched; a watch of the pods opens it
at once for a pod that no autoscaler selects (tritonscale.drivers.admission).

Autoscalers that name a budget (`spec.budget`) share it through one `BudgetLedger` in the
operator process (kopf's peering keeps one operator active): each tick claims and is granted
under its lock, so the grants never exceed the budget although the ticks run apart. After a
restart the ledger is seeded from the other members' status (an index of the autoscalers by
budget), so a member that ticks first cannot take the room the others hold.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import kopf

from tritonscale.control.ledger import BudgetKey, BudgetLedger
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
from tritonscale.triton.healing import Healer
from tritonscale.triton.loads import DEFAULT_LOAD_DEADLINE_S

GROUP, VERSION, PLURAL = "tritonscale.io", "v1alpha1", "instancegroupautoscalers"
# How often each object's timer wakes to see whether its interval has passed. The spec's
# intervalSeconds (>= 1) sets the real period; kopf fixes a timer's interval at import time.
TICK_S = 1.0


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
    # intervalSeconds to trust); a change of its spec is looked at at once.
    invalid_spec_recheck_s: float = 15.0
    # How long a tick waits for one load of a model on a pod (tritonscale.triton.loads).
    load_deadline_s: float = DEFAULT_LOAD_DEADLINE_S


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
    health: Health = field(default_factory=Health)
    ledger: BudgetLedger = field(default_factory=BudgetLedger)
    pod_status: admission.PodStatusWriter = field(default_factory=admission.PodStatusWriter)


def make_runtime(
    config: DriverConfig,
    metrics: OperatorMetrics | None = None,
    pod_status: admission.PodStatusWriter | None = None,
) -> Runtime:
    if config.prometheus_url:
        source: MetricsSource = PrometheusSource(config.prometheus_url)
    else:
        source = ScrapeSource()
    actuator = Actuator(
        repository_key=config.repository_key, load_deadline_s=config.load_deadline_s
    )
    return Runtime(
        config=config,
        source=source,
        actuator=actuator,
        metrics=metrics if metrics is not None else OperatorMetrics(),
        # The actuator's loads: neither piles a load on one the other left in flight.
        healer=Healer(repository_key=actuator.repository_key, loads=actuator.loads),
        pod_status=pod_status or admission.PodStatusWriter(),
    )


# ---------------------------------------------------------------------------------------
# Handlers.


@kopf.index("pods")
def triton_pods(body: kopf.Body, namespace: str, **_: Any) -> dict[str, pods.TritonPod]:
    """Every pod of the watched namespaces, by namespace; the timer filters by selector."""
    return {namespace: pods.TritonPod.from_body(body)}


@kopf.index(GROUP, VERSION, PLURAL)
def autoscalers(
    spec: kopf.Spec, status: kopf.Status, name: str, namespace: str, **_: Any
) -> dict[str, admission.Autoscaler]:
    """Every autoscaler whose spec reads, by namespace: which pods a new pod must match."""
    found = admission.Autoscaler.from_object(name, spec, status)
    return {namespace: found} if found is not None else {}


@kopf.on.event("pods", when=lambda body, **_: pods.TritonPod.from_body(body).waiting_for_instances)
def admit_unselected_pods(
    body: kopf.Body,
    namespace: str,
    memo: kopf.Memo,
    autoscalers: kopf.Index[str, admission.Autoscaler],
    logger: kopf.Logger,
    **_: Any,
) -> None:
    """A pod waiting at the gate that no autoscaler selects joins at once (its autoscalers'
    ticks admit the others: tritonscale.drivers.admission)."""
    pod = pods.TritonPod.from_body(body)
    if admission.selecting(pod, autoscalers.get(namespace, [])):
        return
    _open_gate(memo.runtime, pod, admission.judge(pod, [], {}), logger)


@kopf.index(GROUP, VERSION, PLURAL)
def budget_members(
    spec: kopf.Spec, status: kopf.Status, name: str, namespace: str, **_: Any
) -> dict[BudgetKey, Claim]:
    """Every autoscaler that names a budget, holding what its status last said."""
    try:
        parsed = AutoscalerSpec.from_dict(dict(spec))
    except InvalidSpec:
        return {}
    if parsed.budget is None:
        return {}
    held = max(
        (n for n in (status.get("currentInstances"), status.get("desiredInstances")) if n),
        default=parsed.min_instances,
    )
    claim = Claim(name, parsed.model, int(held), int(held), parsed.min_instances)
    return {budget_key(namespace, parsed): claim}


@kopf.timer(GROUP, VERSION, PLURAL, id="reconcile", interval=TICK_S)
def reconcile_timer(
    body: kopf.Body,
    spec: kopf.Spec,
    status: kopf.Status,
    meta: kopf.Meta,
    name: str,
    namespace: str,
    patch: kopf.Patch,
    memo: kopf.Memo,
    triton_pods: kopf.Index[str, pods.TritonPod],
    budget_members: kopf.Index[BudgetKey, Claim],
    autoscalers: kopf.Index[str, admission.Autoscaler],
    logger: kopf.Logger,
    **_: Any,
) -> None:
    runtime: Runtime = memo.runtime
    now = time.time()
    raw_spec = dict(spec)
    try:
        parsed: AutoscalerSpec | None = AutoscalerSpec.from_dict(raw_spec)
    except InvalidSpec:
        parsed = None
    interval_s = parsed.interval_seconds if parsed else runtime.config.invalid_spec_recheck_s
    generation = meta.get("generation")
    if not _due(memo, now, interval_s, generation):
        return

    if parsed is not None and parsed.budget is not None:
        key = budget_key(namespace, parsed)
        runtime.ledger.seed(key, budget_limits(parsed), budget_members.get(key, []))
    endpoints = []
    if parsed is not None:
        endpoints = pods.ready_endpoints(
            triton_pods.get(namespace, []),
            parsed.selector,
            runtime.config.triton_http_port,
            runtime.config.triton_metrics_port,
        )
    result = reconcile(
        parsed or raw_spec,
        endpoints,
        runtime.source,
        runtime.actuator,
        ReconcileState.from_status(status),
        now,
        metrics=runtime.metrics,
        namespace=namespace,
        autoscaler=name,
        healer=runtime.healer,
        ledger=runtime.ledger,
    )
    memo.last_tick_at, memo.last_generation = now, generation
    runtime.health.ticks += 1
    runtime.health.last_tick_at = result.finished_at

    new_status = result.status()
    if generation is not None:
        new_status["observedGeneration"] = generation
    patch.status.update(_changed(status, new_status))
    _post_events(body, result, memo, logger)
    if parsed is not None:
        desired = new_status.get("desiredInstances") or status.get("desiredInstances")
        this = admission.Autoscaler.of(name, parsed, desired if isinstance(desired, int) else None)
        others = [a for a in autoscalers.get(namespace, []) if a.name != name]
        for pod in triton_pods.get(namespace, []):
            if pod.waiting_for_instances and admission.selecting(pod, [this]):
                _admit(runtime, pod, parsed, this, others, logger)


def _admit(
    runtime: Runtime,
    pod: pods.TritonPod,
    spec: AutoscalerSpec,
    this: admission.Autoscaler,
    others: list[admission.Autoscaler],
    logger: Any,
) -> None:
    """Bring a pod waiting at the gate to this autoscaler's count, then admit it if every
    autoscaler that selects it is matched (tritonscale.drivers.admission)."""
    endpoint = pod.endpoint(runtime.config.triton_http_port, runtime.config.triton_metrics_port)
    actuator = runtime.actuator
    if this.acting and this.desired is not None:
        counts, _ = actuator.live_counts([endpoint], spec.model)
        if counts.get(pod.name) != this.desired and not actuator.in_flight(endpoint, spec.model):
            actuator.apply([endpoint], spec.model, this.desired, spec.instance_kind)
    live: dict[str, int | None] = {}
    for autoscaler in admission.selecting(pod, [this, *others]):
        counts, _ = actuator.live_counts([endpoint], autoscaler.model)
        live[autoscaler.model] = counts.get(pod.name)
    verdict = admission.judge(pod, [this, *others], live)
    if verdict.admit:
        _open_gate(runtime, pod, verdict, logger)
    else:
        logger.debug(verdict.message)


def _open_gate(
    runtime: Runtime, pod: pods.TritonPod, verdict: admission.Verdict, logger: Any
) -> None:
    problem = runtime.pod_status.open_gate(pod, verdict, time.time())
    if problem is not None:
        logger.warning(problem)
    else:
        logger.info(f"{pods.INSTANCES_READY} of {pod.name}: True ({verdict.message})")


@kopf.on.event(GROUP, VERSION, PLURAL, when=lambda type, **_: type == "DELETED")
def forget_metrics(spec: kopf.Spec, name: str, namespace: str, memo: kopf.Memo, **_: Any) -> None:
    """A deleted autoscaler's series must go, or its stale timestamp would fire alerts; it
    leaves its budget, and a budget without members loses its series too.

    A watching handler, not `on.delete`: it keeps no state on the object (no annotations).
    """
    runtime: Runtime = memo.runtime
    runtime.metrics.forget(namespace, name, str(spec.get("model", "?")))
    for _namespace, budget in runtime.ledger.forget(namespace, name):
        runtime.metrics.forget_budget(namespace, budget)


@kopf.on.probe(id="ticks")
def ticks_probe(memo: kopf.Memo, **_: Any) -> dict[str, Any]:
    """In kopf's liveness answer: how many ticks ran, and when the last one ended."""
    health: Health = memo.runtime.health
    return {"count": health.ticks, "lastTickAt": health.last_tick_at}


def _due(memo: kopf.Memo, now: float, interval_s: float, generation: Any) -> bool:
    """Tick on the first wake, on a spec change, and once `interval_s` has passed."""
    last = memo.get("last_tick_at")
    if last is None or generation != memo.get("last_generation"):
        return True
    return now - last >= interval_s


def _changed(status: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """Only the fields that differ: a tick that learnt nothing new writes nothing."""
    return {key: value for key, value in new.items() if status.get(key) != value}


def _post_events(body: kopf.Body, result: TickResult, memo: kopf.Memo, logger: Any) -> None:
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
    previous: Collection[str] = memo.get("failing", ())
    new_this_tick = {
        FAILED_RESCALE: any(not pod.ok and not pod.pending for pod in result.applied),
        RELOAD_TIMEOUT: any(pod.pending for pod in result.applied),
    }
    for error in result.errors:
        if error.reason not in previous or new_this_tick.get(error.reason, False):
            kopf.warn(body, reason=error.reason, message=error.message)
            logger.warning(result.line())
    memo.failing = frozenset(error.reason for error in result.errors)
    # The budget refusing instances is a Warning when it starts: more pods are the answer.
    exhausted = result.reason == BUDGET_EXHAUSTED
    if exhausted and not memo.get("budget_exhausted", False) and result.decision is not None:
        kopf.warn(body, reason=BUDGET_EXHAUSTED, message=result.decision.message)
        logger.warning(result.line())
    memo.budget_exhausted = exhausted
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


class _QuietTicks(logging.Filter):
    """Drop kopf's lines for every timer run and liveness probe: they would bury the rest."""

    NOISE = frozenset({"Timer 'reconcile' succeeded.", "Activity 'ticks' succeeded."})

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


def settings() -> kopf.OperatorSettings:
    """kopf's settings for this operator."""
    operator_settings = kopf.OperatorSettings()
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
    a random one, so exactly one is active and another takes over when it goes.
    `vault`, `loop` and `pod_status` are for tests (credentials for a mock API server, a
    thread's loop, the client that patches the pods' readinessGate condition).
    """
    if not clusterwide and not namespaces:
        raise ValueError("name at least one namespace, or serve all namespaces")
    if peering and priority is None:
        priority = random.randint(1, 2**31 - 1)
    runtime = make_runtime(config, metrics, pod_status)
    for name in ("kopf.objects", "kopf.activities.probe"):
        logging.getLogger(name).addFilter(_QuietTicks())
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
            settings=settings(),
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
