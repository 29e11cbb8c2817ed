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

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> TritonPod:
        """Read a Pod object (a dict or kopf's body)."""
        metadata = body.get("metadata") or {}
        status = body.get("status") or {}
        ports = _named_ports(body.get("spec") or {})
        return cls(
            name=metadata.get("name", ""),
            namespace=metadata.get("namespace", ""),
            labels=dict(metadata.get("labels") or {}),
            ip=status.get("podIP") or None,
            ready=_is_ready(metadata, status),
            http_port=ports.get(HTTP_PORT_NAME),
            metrics_port=ports.get(METRICS_PORT_NAME),
        )

    def endpoint(self, http_port: int, metrics_port: int) -> Endpoint:
        """Where to reach this pod: its own named ports win over the defaults given."""
        host = f"[{self.ip}]" if self.ip and ":" in self.ip else self.ip  # IPv6 in a URL
        return Endpoint(
            name=self.name,
            http_url=f"{host}:{self.http_port or http_port}",
            metrics_url=f"http://{host}:{self.metrics_port or metrics_port}/metrics",
            namespace=self.namespace,
        )


def _is_ready(metadata: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    """Running, not being deleted, with an IP and the Ready condition True (the kubelet's view)."""
    if metadata.get("deletionTimestamp") or not status.get("podIP"):
        return False
    if status.get("phase") != "Running":
        return False
    return any(
        condition.get("type") == "Ready" and condition.get("status") == "True"
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
