"""The driver's own calls to the API server, on kopf's event loop: status patches and reads.

kopf writes what a handler returns or puts in its `patch` to that handler's own object, and
only when the handler returns: a daemon that runs a pod set's ticks for good, and writes the
status of every member of the set after each tick, has no such moment. So the driver sends
those writes itself, as kopf does its own: a request over aiohttp (kopf's HTTP client too),
awaited on the event loop, no thread held while the API server answers.

The credentials are the `kubernetes` client's (`kubernetes.client.Configuration`): found as
kopf finds its own (in-cluster service account, then kubeconfig), and the token read afresh
at each call through the configuration's own hook, so a rotated service-account token is
used once it is mounted.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Mapping
from typing import Any

import aiohttp

USER_AGENT = "tritonscale-operator"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class ApiError(Exception):
    """A call the API server refused or could not be reached for; the message is one line."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def default_configuration() -> Any:
    """The `kubernetes` client's configuration as kopf would log in: the in-cluster service
    account, else the kubeconfig."""
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        config.load_kube_config(client_configuration=configuration)
    return configuration


class KubeApi:
    """PATCH and GET against the API server over one aiohttp session, made on first use on
    the running loop (kopf's) and closed with the operator (`close`)."""

    def __init__(self, configuration: Any = None) -> None:
        self._configuration = configuration
        self._session: aiohttp.ClientSession | None = None

    @property
    def configuration(self) -> Any:
        if self._configuration is None:
            self._configuration = default_configuration()
        return self._configuration

    def _ssl(self) -> ssl.SSLContext | bool:
        configuration = self.configuration
        if not configuration.verify_ssl:
            return False
        context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
        if configuration.cert_file:
            context.load_cert_chain(configuration.cert_file, configuration.key_file)
        return context

    def _headers(self, content_type: str | None = None) -> dict[str, str]:
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        # The credentials as the official client's ApiClient sends them, from the same
        # `auth_settings`: the loaders keep the token under "BearerToken" (a lookup under the
        # header's name finds nothing, and the call goes out anonymous), and the in-cluster
        # configuration's hook reads the mounted token again when it is due.
        for auth in self.configuration.auth_settings().values():
            if auth["in"] == "header" and auth["value"]:
                headers[auth["key"]] = auth["value"]
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self._ssl())
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def patch(
        self, path: str, body: Any, content_type: str = MERGE_PATCH, timeout_s: float = 30.0
    ) -> dict[str, Any]:
        """PATCH `path` with `body`; the object the API server returns. ApiError on failure."""
        return await self._request("PATCH", path, json.dumps(body), content_type, {}, timeout_s)

    async def get(
        self, path: str, params: Mapping[str, str] | None = None, timeout_s: float = 30.0
    ) -> dict[str, Any]:
        """GET `path`; the answer. ApiError on failure."""
        return await self._request("GET", path, None, None, params or {}, timeout_s)

    async def _request(
        self,
        method: str,
        path: str,
        data: str | None,
        content_type: str | None,
        params: Mapping[str, str],
        timeout_s: float,
    ) -> dict[str, Any]:
        url = self.configuration.host.rstrip("/") + path
        try:
            async with self._session_now().request(
                method,
                url,
                data=data,
                params=dict(params),
                headers=self._headers(content_type),
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as response:
                if response.status >= 400:
                    raise ApiError(await _refusal(response), response.status)
                answer = await response.json(content_type=None)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as error:
            raise ApiError(" ".join(str(error).split()) or type(error).__name__) from None
        return answer if isinstance(answer, dict) else {}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def _refusal(response: aiohttp.ClientResponse) -> str:
    """A refusal in one line: its status, and the reason the API server gives in its Status
    object where it sends one (who was refused what: `User "system:anonymous" cannot patch
    ...`)."""
    line = f"{response.status} {response.reason}"
    try:
        answer = json.loads(await response.text())
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return line
    message = answer.get("message") if isinstance(answer, dict) else None
    if isinstance(message, str) and message.strip():
        return f"{line}: {' '.join(message.split())}"
    return line
