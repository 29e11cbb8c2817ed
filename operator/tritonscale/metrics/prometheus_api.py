"""Prometheus' HTTP API: one GET, its JSON envelope checked, every failure one line.

The metrics source, the report, the dashboard preview and the local Prometheus all read
`/api/v1/...` through `prometheus_get`; each turns `PrometheusApiError` into its own error.
"""

from __future__ import annotations

from typing import Any

import requests


class PrometheusApiError(RuntimeError):
    """Prometheus could not be reached or refused the request; the message is one line."""


def prometheus_get(
    url: str,
    path: str,
    params: dict[str, Any] | None = None,
    *,
    timeout_s: float = 10.0,
    session: requests.Session | None = None,
) -> Any:
    """GET `{url}/api/v1/{path}` and return the `data` of a successful answer."""
    base = url.rstrip("/")
    try:
        response = (session or requests).get(
            f"{base}/api/v1/{path}", params=params, timeout=timeout_s
        )
    except requests.RequestException as error:
        raise PrometheusApiError(
            f"Prometheus at {base} is unreachable ({type(error).__name__})"
        ) from None
    try:
        body = response.json()
    except ValueError:
        raise PrometheusApiError(
            f"{base} does not answer like Prometheus (HTTP {response.status_code} on /api/v1/{path})"
        ) from None
    if body.get("status") != "success":
        error = " ".join(str(body.get("error", response.text)).split())
        raise PrometheusApiError(f"Prometheus {path} failed: {error}")
    return body["data"]
