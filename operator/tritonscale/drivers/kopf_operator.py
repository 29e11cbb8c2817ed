"""The Kubernetes driver: `tritonscale operator`, the autoscalers' pod sets run by kopf.

    tritonscale operator --namespace ml --liveness http://0.0.0.0:8080/healthz

The driver is kopf's handlers, one concern to a module, and `run`, which starts kopf:

- tritonscale.drivers.indexes: kopf's indexes of the pods, the pods waiting at the gate and
  the autoscalers (the sets' members), by namespace; nothing lists the API server;
- tritonscale.drivers.set_loop: one daemon per autoscaler; the daemon of each set's leader
  runs the set's ticks and admission (why a daemon per autoscaler: its docstring);
- tritonscale.drivers.gates: the pods' readinessGate, opened by the sets' loops when a pod
  runs its peers' counts and by a pod's own events when no autoscaler selects it;
- tritonscale.drivers.status and kube_api: each member's status and events, written from
  kopf's event loop;
- here: what lives as long as the operator (the readinessProbe, the liveness probe's ticks,
  the connections), what an autoscaler's deletion leaves behind, and kopf's settings.

The handlers only move data between kopf and the control loop; the arithmetic lives in the
policy. State lives in each object's status (`status.policyState`, `status.backoff`,
`status.loadInFlight`, the conditions), so a restarted or failed-over operator carries on
where the last one stopped. An invalid spec is a status condition (ScalingActive False,
InvalidSpec) and one Warning event, never an exception: kopf would retry it forever, and a
fixed spec is picked up on the next tick.

Sets tick independently: each is driven by a coroutine on kopf's event loop, and a tick waits
on Triton, Prometheus and the API server through asyncio clients (no thread is held while a
pod is slow). A tick is bounded: a load waits at most the actuator's deadline
(`--load-deadline`), and a load still in flight from an earlier tick is not waited for again
(the tick reports ReloadTimeout and sends nothing more to that pod).

Several replicas share the sets by shard (`--shard`, `--total-shards`: each owns the sets
whose stable hash falls in its share) or stand by for one another (peering: kopf keeps one
replica of a peering active and pauses the others, whose daemons it stops meanwhile). A
budget (`spec.budget`) is granted once per tick of its set, through one `BudgetLedger` in
the operator process (a budget's members are one set, so one replica).

kopf holds every handler back until its indexes are full; it wakes every waiting object at
each object indexed (quadratic in the objects watched), which a replica restarted beside
thousands of pods pays before its first tick.
"""

from __future__ import annotations

import logging
import os
import random
import socket
from collections.abc import Collection
from typing import Any
from urllib.parse import urlsplit
from uuid import uuid4

import kopf

from tritonscale.control.operator_metrics import OperatorMetrics
from tritonscale.control.pod_sets import Shard

# kopf registers the handlers of these modules as they are imported.
from tritonscale.drivers import gates, indexes, readiness, set_loop  # noqa: F401
from tritonscale.drivers.kube_api import KubeApi
from tritonscale.drivers.runtime import (
    DriverConfig,
    Health,
    Runtime,
    make_runtime,
    parse_spec,
)
from tritonscale.drivers.status import GROUP, PLURAL, VERSION

__all__ = [
    "DriverConfig",
    "OperatorError",
    "credentials_problem",
    "liveness_problem",
    "parse_spec",
    "probe_url_problem",
    "run",
    "settings",
    "shard_of",
]


class OperatorError(RuntimeError):
    """The operator cannot start; the message is one line for a person."""


@kopf.on.delete(GROUP, VERSION, PLURAL, optional=True)
async def forget_autoscaler(
    spec: kopf.Spec, name: str, namespace: str, memo: kopf.Memo, **_: Any
) -> None:
    """A deleted autoscaler's series must go, or its stale timestamp would fire alerts; it
    leaves its budget, and a budget without members loses its series too. Optional: the
    object's deletion never waits for it."""
    set_loop.forget(memo.runtime, namespace, name, str(spec.get("model", "?")))


@kopf.on.cleanup()
async def close_connections(memo: kopf.Memo, **_: Any) -> None:
    """The connections to the pods, Prometheus and the API server close with the operator."""
    await memo.runtime.connections.close()
    await memo.runtime.api.close()


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
    reads = readiness.ApiReads(runtime.api, namespaces, peering)
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
    api: KubeApi | None = None,
) -> None:
    """Run the operator until stopped (SIGTERM/SIGINT in the main thread, or `stop_flag`).

    `peering` names the KopfPeering objects; None runs standalone. Replicas sharing a
    peering must not share a priority (kopf pauses all of them then): by default each picks
    a random one, so exactly one is active and another takes over when it goes: at once when
    it stops cleanly, within `peering_lifetime_s` when it is killed.
    `liveness` and `readiness_url` are where kopf's liveness probe and the readinessProbe
    (tritonscale.drivers.readiness) are served, if anywhere.
    `vault`, `loop` and `api` are for tests (credentials for a mock API server, a thread's
    loop, the client of the driver's own calls to the API server).
    """
    if not clusterwide and not namespaces:
        raise ValueError("name at least one namespace, or serve all namespaces")
    if peering and priority is None:
        priority = random.randint(1, 2**31 - 1)
    runtime = make_runtime(config, metrics, api)
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
