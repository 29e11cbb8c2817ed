"""The Kubernetes API as the node stand-in speaks it: plain JSON over the official client.

The typed models of the `kubernetes` client are large and, for a few kinds (a Binding's
answer), fail to deserialize; the stand-in reads and writes dicts by path instead, through
the client's `DynamicClient.request` (the same connection, authentication and TLS), whose
signature has stayed put across the client's releases.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from kubernetes import client, config, dynamic, watch

REQUEST_TIMEOUT_S = 30.0
# Strategic merge keeps the list entries this patch does not name (conditions, statuses).
STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"


class Kube:
    """GET/POST/PUT/PATCH/DELETE of API paths, as dicts; `watch` streams events."""

    def __init__(self, kubeconfig: Path) -> None:
        self.api_client = config.new_client_from_config(config_file=str(kubeconfig))
        self.core = client.CoreV1Api(self.api_client)
        self.dynamic = dynamic.DynamicClient(self.api_client)
        self.server = self.api_client.configuration.host

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> dict[str, Any]:
        response = self.dynamic.request(
            method,
            path,
            body=body,
            query_params=list((query or {}).items()),
            content_type=content_type,
            _request_timeout=timeout_s,
            serialize=False,
        )
        data = response.data
        return json.loads(data) if data else {}

    def get(self, path: str, **query: Any) -> dict[str, Any]:
        return self.call("GET", path, query=query)

    def post(self, path: str, body: Any) -> dict[str, Any]:
        return self.call("POST", path, body)

    def put(self, path: str, body: Any) -> dict[str, Any]:
        return self.call("PUT", path, body)

    def patch(self, path: str, body: Any, content_type: str = STRATEGIC) -> dict[str, Any]:
        return self.call("PATCH", path, body, content_type=content_type)

    def delete(self, path: str, body: Any = None) -> dict[str, Any]:
        return self.call("DELETE", path, body)

    def watch_pods(self, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        """Pod events of every namespace from `resource_version`, for up to `timeout_s`."""
        stream = watch.Watch().stream(
            self.core.list_pod_for_all_namespaces,
            resource_version=resource_version,
            timeout_seconds=timeout_s,
            allow_watch_bookmarks=True,
            _request_timeout=timeout_s + 10,
        )
        for event in stream:
            yield {"type": event["type"], "object": event["raw_object"]}

    def close(self) -> None:
        self.api_client.close()


def is_status(error: BaseException, *codes: int) -> bool:
    """True when `error` is the API answering with one of these HTTP status codes (the
    client's ApiException and the dynamic client's errors both carry `status`)."""
    return getattr(error, "status", None) in codes


def pod_path(namespace: str, name: str, sub: str = "") -> str:
    return f"/api/v1/namespaces/{namespace}/pods/{name}{'/' + sub if sub else ''}"
