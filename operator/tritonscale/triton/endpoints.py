"""One ready Triton pod, as the metrics sources and the actuator address it.

The Kubernetes driver builds one `Endpoint` per ready pod that the selector matches
(`Endpoint(pod.name, f"{pod_ip}:8000", f"http://{pod_ip}:8002/metrics", namespace)`);
the local driver one per static URL of its policy file.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Endpoint:
    name: str  # the pod's name (Kubernetes) or "host:port" (local)
    http_url: str  # Triton's HTTP API: "host:port" or "http://host:port"
    metrics_url: str | None = None  # the full URL of Triton's /metrics
    namespace: str | None = None  # the pod's namespace; None outside Kubernetes
    # When the pod's containers last started (Kubernetes): what the actuator read of this
    # Triton holds until it restarts. None: not known (the actuator reads it every time).
    started_at: str | None = None

    @property
    def base_url(self) -> str:
        """The HTTP API with a scheme and no trailing slash."""
        url = self.http_url.rstrip("/")
        return url if "://" in url else f"http://{url}"

    @property
    def metrics_instance(self) -> str | None:
        """The metrics endpoint's host:port: Prometheus's `instance` label for it."""
        if not self.metrics_url:
            return None
        return urlsplit(self.metrics_url).netloc or None


def local_endpoints(http_urls: list[str], metrics_urls: list[str] | None = None) -> list[Endpoint]:
    """Endpoints for static Triton URLs; the i-th metrics URL belongs to the i-th HTTP URL."""
    metrics_urls = list(metrics_urls or [])
    if metrics_urls and len(metrics_urls) != len(http_urls):
        raise ValueError(
            f"{len(http_urls)} HTTP URLs but {len(metrics_urls)} metrics URLs: give one of each per Triton"
        )
    endpoints = []
    for index, http_url in enumerate(http_urls):
        name = urlsplit(http_url if "://" in http_url else f"http://{http_url}").netloc
        metrics = metrics_urls[index] if metrics_urls else None
        endpoints.append(Endpoint(name=name, http_url=http_url, metrics_url=metrics))
    return endpoints
