"""Prometheus' HTTP API: one GET, its JSON envelope checked, every failure one line.

The report, the dashboard preview and the local Prometheus read `/api/v1/...` through
`prometheus_get`, the metrics source of the control loop through its asyncio twin
`prometheus_get_async`; each turns `PrometheusApiError` into its own error.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
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
    return _data(base, path, response.status_code, response.text)


async def prometheus_get_async(
    session: aiohttp.ClientSession,
    url: str,
    path: str,
    params: dict[str, Any] | None = None,
    *,
    timeout_s: float = 10.0,
) -> Any:
    """`prometheus_get` on an aiohttp session, within `timeout_s` (`asyncio.wait_for`)."""
    base = url.rstrip("/")

    async def get() -> tuple[int, str]:
        async with session.get(f"{base}/api/v1/{path}", params=params) as response:
            return response.status, await response.text()

    try:
        status, text = await asyncio.wait_for(get(), timeout_s)
    except (asyncio.TimeoutError, OSError, aiohttp.ClientError) as error:
        raise PrometheusApiError(f"Prometheus at {base} is unreachable ({_kind(error)})") from None
    return _data(base, path, status, text)


def _kind(error: BaseException) -> str:
    """The failure in the words `prometheus_get` uses (requests' names), so that one situation
    reads the same whichever reader met it: ConnectionError, Timeout, or the error's class."""
    if isinstance(error, asyncio.TimeoutError):
        return "Timeout"
    if isinstance(error, (OSError, aiohttp.ClientConnectionError)):
        return "ConnectionError"
    return type(error).__name__


def _data(base: str, path: str, status: int, text: str) -> Any:
    """The `data` of Prometheus's JSON envelope; PrometheusApiError for anything else."""
    try:
        body = json.loads(text)
    except ValueError:
        raise PrometheusApiError(
            f"{base} does not answer like Prometheus (HTTP {status} on /api/v1/{path})"
        ) from None
    if not isinstance(body, dict) or body.get("status") != "success":
        error = " ".join(str(body.get("error", text) if isinstance(body, dict) else text).split())
        raise PrometheusApiError(f"Prometheus {path} failed: {error}")
    return body["data"]
