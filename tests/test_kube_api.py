"""The driver's own calls to the API server (tritonscale.drivers.kube_api), with the
configurations the official `kubernetes` client loads: a kubeconfig's user token, and a pod's
service account (the API server's address from KUBERNETES_SERVICE_HOST/PORT, its CA bundle and
the mounted token), as the operator finds them in a cluster.

The tests hand KubeApi a configuration as `kubernetes.config` makes it, never one with the
token put where the code under test happens to look: the loaders keep it under "BearerToken",
and a client that looked under the header's name sent every call anonymous in a real cluster
while passing tests against a mock API server that asks for no credentials.
"""

from __future__ import annotations

import json
import ssl
from pathlib import Path
from typing import Any

import aiohttp.web
import kubernetes
import pytest

from hack import pki
from tests.tooling import require_tool
from tritonscale.drivers.kube_api import USER_AGENT, ApiError, KubeApi
from tritonscale.local.ports import free_ports

STATUS_PATH = "/apis/g/v1/namespaces/ml/things/x/status"


class Recorder:
    """A stand-in API server on loopback that records each request and gives `answer`."""

    def __init__(self, answer: aiohttp.web.Response) -> None:
        self.answer = answer
        self.requests: list[aiohttp.web.Request] = []
        self.bodies: list[Any] = []
        self.port = 0

    async def _handle(self, request: aiohttp.web.Request) -> aiohttp.web.Response:
        self.requests.append(request)
        self.bodies.append(json.loads(await request.text()) if request.can_read_body else None)
        return self.answer

    async def start(
        self, runners: list[aiohttp.web.AppRunner], tls: ssl.SSLContext | None = None
    ) -> Recorder:
        app = aiohttp.web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = aiohttp.web.AppRunner(app)
        await runner.setup()
        runners.append(runner)
        (self.port,) = free_ports(1)
        await aiohttp.web.TCPSite(runner, "127.0.0.1", self.port, ssl_context=tls).start()
        return self


@pytest.fixture
async def servers() -> Any:
    """The test's servers, cleaned up after it."""
    runners: list[aiohttp.web.AppRunner] = []
    yield runners
    for runner in runners:
        await runner.cleanup()


def kubeconfig_configuration(path: Path, server: str, token: str) -> Any:
    """The configuration `kubernetes.config.load_kube_config` makes of a kubeconfig whose user
    has a bearer token (JSON is valid YAML)."""
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": token}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    configuration = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=str(path), client_configuration=configuration)
    return configuration


async def patch_once(api: KubeApi) -> dict[str, Any]:
    try:
        return await api.patch(STATUS_PATH, {"status": {"a": 1}})
    finally:
        await api.close()


@pytest.mark.unit
async def test_a_patch_carries_the_kubeconfig_users_token(servers: Any, tmp_path: Path) -> None:
    server = await Recorder(aiohttp.web.json_response({"metadata": {"name": "x"}})).start(servers)
    configuration = kubeconfig_configuration(
        tmp_path / "kubeconfig", f"http://127.0.0.1:{server.port}", "token-1"
    )

    answer = await patch_once(KubeApi(configuration))

    assert answer == {"metadata": {"name": "x"}}
    (request,) = server.requests
    assert (request.method, request.path) == ("PATCH", STATUS_PATH)
    # Without the token the API server takes the call for system:anonymous's and refuses it.
    assert request.headers.get("Authorization") == "Bearer token-1"
    assert request.headers["User-Agent"] == USER_AGENT
    assert request.headers["Content-Type"] == "application/merge-patch+json"
    assert server.bodies == [{"status": {"a": 1}}]


async def test_in_a_pod_a_patch_goes_to_the_service_address_over_its_ca_with_its_token(
    servers: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator's own path in a cluster: no configuration given, so KubeApi loads the
    service account's as `kubernetes.config.load_incluster_config` does in a pod."""
    require_tool("openssl")
    # A CA and the API server's certificate for the address the service variables name, as
    # the local cluster makes them (hack.pki).
    pki.new_cert(tmp_path, "ca", "test-ca")
    pki.new_cert(
        tmp_path, "apiserver", "kube-apiserver", ca="ca", usage="serverAuth", sans="IP:127.0.0.1"
    )
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(tmp_path / "apiserver.crt", tmp_path / "apiserver.key")
    server = await Recorder(aiohttp.web.json_response({"metadata": {"name": "x"}})).start(
        servers, tls
    )
    # What the kubelet mounts and sets in every pod with a service account.
    (tmp_path / "token").write_text("service-account-token")
    incluster = kubernetes.config.incluster_config
    monkeypatch.setattr(incluster, "SERVICE_TOKEN_FILENAME", str(tmp_path / "token"))
    monkeypatch.setattr(incluster, "SERVICE_CERT_FILENAME", str(tmp_path / "ca.crt"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(server.port))

    answer = await patch_once(KubeApi())

    assert answer == {"metadata": {"name": "x"}}
    (request,) = server.requests
    assert (request.method, request.path, request.secure) == ("PATCH", STATUS_PATH, True)
    assert request.headers.get("Authorization") == "bearer service-account-token"


@pytest.mark.unit
async def test_a_refusal_says_whom_the_api_server_refused_and_what(servers: Any) -> None:
    # The Status object a real API server sends with a 403 (its message verbatim).
    message = (
        'instancegroupautoscalers.tritonscale.dev "x" is forbidden: User "system:anonymous" '
        'cannot patch resource "instancegroupautoscalers/status" in API group '
        '"tritonscale.dev" in the namespace "ml"'
    )
    refusal = {"kind": "Status", "status": "Failure", "message": message, "code": 403}
    server = await Recorder(aiohttp.web.json_response(refusal, status=403)).start(servers)
    api = KubeApi(kubernetes.client.Configuration(host=f"http://127.0.0.1:{server.port}"))

    with pytest.raises(ApiError) as raised:
        await patch_once(api)

    assert str(raised.value) == f"403 Forbidden: {message}"
    assert raised.value.status == 403


@pytest.mark.unit
async def test_a_refusal_without_a_status_object_is_its_status_line(servers: Any) -> None:
    answer = aiohttp.web.Response(status=409, text="the object has been modified")
    server = await Recorder(answer).start(servers)
    api = KubeApi(kubernetes.client.Configuration(host=f"http://127.0.0.1:{server.port}"))
    try:
        with pytest.raises(ApiError, match="^409 Conflict$") as raised:
            await api.patch(
                "/api/v1/namespaces/ml/pods/p/status", [], "application/json-patch+json"
            )
    finally:
        await api.close()
    assert raised.value.status == 409


@pytest.mark.unit
async def test_an_api_server_out_of_reach_is_an_api_error() -> None:
    api = KubeApi(kubernetes.client.Configuration(host="http://127.0.0.1:1"))
    try:
        with pytest.raises(ApiError):
            await api.get("/api/v1/pods", {"limit": "1"}, timeout_s=2)
    finally:
        await api.close()
