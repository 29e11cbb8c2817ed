"""Triton pods as the Kubernetes driver sees them: which are ready, and where to reach them.

kopf keeps an index of the pods of the watched namespaces (`TritonPod.from_body` for each);
`ready_endpoints` picks the ready ones that an autoscaler's selector matches and turns each
into the `Endpoint` the metrics sources and the actuator talk to. The ports come from the
container ports named `http` and `metrics` (the chart names them so), else from the
driver's defaults (Triton's 8000 and 8002).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tritonscale.core.selectors import selector_matches
from tritonscale.core.spec import LabelSelector
from tritonscale.triton.endpoints import Endpoint

# The readinessGate the chart puts on Triton pods: the operator sets it True once the pod's
# instance counts match its peers' (tritonscale.drivers.admission).
INSTANCES_READY = "tritonscale.io/instances-ready"
DEFAULT_HTTP_PORT = 8000
DEFAULT_METRICS_PORT = 8002
HTTP_PORT_NAME = "http"
METRICS_PORT_NAME = "metrics"


@dataclass(frozen=True)
class TritonPod:
    """What the driver needs of one pod; small, so that an index of many pods stays small."""

    name: str
    namespace: str
    labels: Mapping[str, str] = field(hash=False)
    ip: str | None
    ready: bool
    http_port: int | None = None  # the container port named "http", if any
    metrics_port: int | None = None  # the container port named "metrics", if any
    # The readinessGate INSTANCES_READY: whether the pod has it, and where its condition is.
    gated: bool = False
    gate_condition: int | None = None  # its index in status.conditions; None: not there yet
    # The condition is True and still holds: no container restarted since it was set (a
    # restarted Triton runs its repository's counts again, not the ones the gate vouched for).
    gate_open: bool = False
    gate_stale: bool = False  # the condition is True, but a container stopped since
    started_at: str | None = None  # when the latest of its running containers started
    stopped_at: str | None = None  # when the latest of its containers that stopped did
    resource_version: str | None = None  # of the body read: a patch is based on it
    uid: str | None = None
    serving: bool = False  # Triton answers (its containers are ready), whatever the gate says

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> TritonPod:
        """Read a Pod object (a dict or kopf's body)."""
        metadata = body.get("metadata") or {}
        status = body.get("status") or {}
        ports = _named_ports(body.get("spec") or {})
        gated, gate, gate_open, gate_stale = _gate(body)
        return cls(
            name=metadata.get("name", ""),
            namespace=metadata.get("namespace", ""),
            labels=dict(metadata.get("labels") or {}),
            ip=status.get("podIP") or None,
            ready=_is_ready(metadata, status),
            http_port=ports.get(HTTP_PORT_NAME),
            metrics_port=ports.get(METRICS_PORT_NAME),
            gated=gated,
            gate_condition=gate,
            resource_version=metadata.get("resourceVersion"),
            uid=metadata.get("uid"),
            gate_open=gate_open,
            gate_stale=gate_stale,
            started_at=_started_at(status),
            stopped_at=_stopped_at(status),
            serving=_is_serving(metadata, status),
        )

    @property
    def waiting_for_instances(self) -> bool:
        """Held out of the Service by the gate alone: Triton answers, the gate is not open."""
        return self.gated and not self.gate_open and self.serving

    def endpoint(self, http_port: int, metrics_port: int) -> Endpoint:
        """Where to reach this pod: its own named ports win over the defaults given."""
        host = f"[{self.ip}]" if self.ip and ":" in self.ip else self.ip  # IPv6 in a URL
        return Endpoint(
            name=self.name,
            http_url=f"{host}:{self.http_port or http_port}",
            metrics_url=f"http://{host}:{self.metrics_port or metrics_port}/metrics",
            namespace=self.namespace,
            started_at=self.started_at,
        )


def waits_for_instances(body: Mapping[str, Any]) -> bool:
    """`TritonPod.waiting_for_instances` of a Pod object, read without building the TritonPod
    (kopf asks it of every pod event)."""
    gated, _, gate_open, _ = _gate(body)
    if not gated or gate_open:
        return False
    return _is_serving(body.get("metadata") or {}, body.get("status") or {})


def restarted_behind_open_gate(body: Mapping[str, Any]) -> bool:
    """The gate is True, but a container of the pod stopped or started after it was set: the
    gate must close until the pod runs its peers' counts again (kopf asks it of every pod
    event)."""
    return _gate(body)[3] and not (body.get("metadata") or {}).get("deletionTimestamp")


def _gate(body: Mapping[str, Any]) -> tuple[bool, int | None, bool, bool]:
    """Whether the pod has the gate INSTANCES_READY, its condition's index, whether it is
    True and holds, whether it is True but a container stopped or started since it was set.

    A container that stopped is enough: the gate closes while the kubelet starts the next
    one, not after. The kubelet works out Ready, when a container's readiness probe first
    passes, from its own copy of the pod's conditions, which takes the closed gate only along
    with a change of the kubelet's own (kubernetes#122002): a gate closed after the new
    container's start can let that probe set the pod Ready for a moment, gate closed or not,
    and the Service send it traffic at the repository's counts.
    """
    gated = any(
        readiness_gate.get("conditionType") == INSTANCES_READY
        for readiness_gate in (body.get("spec") or {}).get("readinessGates") or []
    )
    status = body.get("status") or {}
    conditions = status.get("conditions") or []
    gate = next((i for i, c in enumerate(conditions) if c.get("type") == INSTANCES_READY), None)
    if gate is None or conditions[gate].get("status") != "True":
        return gated, gate, False, False
    # RFC 3339 times in UTC to the second, as the API server writes them: they sort as text.
    set_at = str(conditions[gate].get("lastTransitionTime") or "")
    started, stopped = _started_at(status), _stopped_at(status)
    stale = gated and any(t is not None and t > set_at for t in (started, stopped))
    return gated, gate, not stale, stale


def _started_at(status: Mapping[str, Any]) -> str | None:
    """When the latest of the pod's running containers started (RFC 3339), if any runs."""
    times = [
        str(((container.get("state") or {}).get("running") or {}).get("startedAt") or "")
        for container in status.get("containerStatuses") or []
    ]
    return max((t for t in times if t), default=None)


def _stopped_at(status: Mapping[str, Any]) -> str | None:
    """When the latest of the pod's containers that stopped did (RFC 3339), if any did: its
    state while the kubelet restarts it, or its last state once it runs again."""
    times = [
        str(((container.get(state) or {}).get("terminated") or {}).get("finishedAt") or "")
        for container in status.get("containerStatuses") or []
        for state in ("state", "lastState")
    ]
    return max((t for t in times if t), default=None)


def _is_serving(metadata: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    """Triton answers: running, and its containers are ready (whatever the gate says)."""
    return _is_running(metadata, status) and _condition(status, "ContainersReady")


def _is_ready(metadata: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    """Running, not being deleted, with an IP and the Ready condition True (the kubelet's view)."""
    return _is_running(metadata, status) and _condition(status, "Ready")


def _is_running(metadata: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    """Running, not being deleted, with an IP."""
    if metadata.get("deletionTimestamp") or not status.get("podIP"):
        return False
    return status.get("phase") == "Running"


def _condition(status: Mapping[str, Any], kind: str) -> bool:
    return any(
        condition.get("type") == kind and condition.get("status") == "True"
        for condition in status.get("conditions") or []
    )


def _named_ports(spec: Mapping[str, Any]) -> dict[str, int]:
    """Container ports by name, over all containers (the first of a name wins)."""
    ports: dict[str, int] = {}
    for container in spec.get("containers") or []:
        for port in container.get("ports") or []:
            name, number = port.get("name"), port.get("containerPort")
            if name and isinstance(number, int) and name not in ports:
                ports[name] = number
    return ports


def ready_endpoints(
    pods: Iterable[TritonPod],
    selector: LabelSelector,
    http_port: int = DEFAULT_HTTP_PORT,
    metrics_port: int = DEFAULT_METRICS_PORT,
) -> list[Endpoint]:
    """The ready pods the selector matches, as endpoints, sorted by pod name.

    The order is stable so that the actuator walks the pods the same way every tick.
    """
    chosen = [pod for pod in pods if pod.ready and selector_matches(selector, pod.labels)]
    return [pod.endpoint(http_port, metrics_port) for pod in sorted(chosen, key=lambda p: p.name)]
