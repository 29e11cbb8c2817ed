"""A pod set's loop moves between its members' daemons as the set changes (kopf against kmock;
tritonscale.drivers.set_loop), and the driver's own calls to the API server
(tritonscale.drivers.kube_api).

Every autoscaler has one kopf daemon; the set's leader (its first member by name) runs the
set. The others sleep until the namespace's sets change: a member that joins under a smaller
name takes the set over, and when the leader is deleted the next member carries on.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp.web
import kubernetes
import pytest

from tests.operator_harness import (
    IGA,
    NAMESPACE,
    TRITON_LABELS,
    Emulator,
    autoscaler,
    delete_object,
    eventually,
    eventually_async,
    patch_object,
    register_resources,
    running_operator,
    status_of,
    ticks,
)
from tritonscale.drivers.kube_api import USER_AGENT, ApiError, KubeApi
from tritonscale.local.ports import free_ports

pytestmark = [pytest.mark.unit]


# Another Deployment's pods: the same keys as TRITON_LABELS, so that a merge patch of
# TRITON_LABELS turns the selector into theirs.
ELSEWHERE = {**TRITON_LABELS, "app.kubernetes.io/name": "elsewhere"}


@pytest.fixture
def api(kmock: Emulator) -> Emulator:
    return register_resources(kmock)


def spec(labels: dict[str, str]) -> dict[str, Any]:
    return {"selector": {"matchLabels": labels}, "model": "add_sub", "intervalSeconds": 1}


@pytest.mark.kmock(cls=Emulator)
async def test_a_member_joining_under_a_smaller_name_leads_and_the_next_one_follows_a_deletion(
    api: Emulator,
) -> None:
    api.objects[IGA, NAMESPACE, "b-member"] = autoscaler("b-member", spec(TRITON_LABELS))
    api.objects[IGA, NAMESPACE, "a-member"] = autoscaler("a-member", spec(ELSEWHERE))

    def pod_set(name: str) -> list[str] | None:
        return (status_of(api, name).get("podSet") or {}).get("members")

    async with running_operator(api) as operator:
        # Two sets of one member each: each is its own leader.
        await eventually(lambda: pod_set("a-member") == ["a-member"], "a-member's own set")
        await eventually(lambda: pod_set("b-member") == ["b-member"], "b-member's own set")

        # a-member takes b-member's selector: one set, led by a-member, ticking both.
        await patch_object(api, "a-member", {"spec": {"selector": spec(TRITON_LABELS)["selector"]}})
        for name in ("a-member", "b-member"):
            await eventually(
                lambda name=name: pod_set(name) == ["a-member", "b-member"],
                f"{name} in the joined set",
            )
        before = await ticks(operator, "b-member")
        await eventually_async(
            lambda: ticks(operator, "b-member"), lambda n: n >= before + 2, "the set ticking on"
        )

        # The leader goes: b-member's daemon leads its set now, alone.
        await delete_object(api, "a-member")
        await eventually(
            lambda: pod_set("b-member") == ["b-member"], "b-member leading its set alone"
        )
        after = await ticks(operator, "b-member")
        await eventually_async(
            lambda: ticks(operator, "b-member"), lambda n: n >= after + 2, "b-member ticking on"
        )


async def kube_api_against(
    runners: list[aiohttp.web.AppRunner], answer: aiohttp.web.Response
) -> tuple[KubeApi, list[aiohttp.web.Request], list[Any]]:
    """A KubeApi with a token, against a server that records each request and gives `answer`."""
    seen: list[aiohttp.web.Request] = []
    bodies: list[Any] = []

    async def handle(request: aiohttp.web.Request) -> aiohttp.web.Response:
        seen.append(request)
        bodies.append(json.loads(await request.text()) if request.can_read_body else None)
        return answer

    app = aiohttp.web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    runners.append(runner)
    (port,) = free_ports(1)
    await aiohttp.web.TCPSite(runner, "127.0.0.1", port).start()
    configuration = kubernetes.client.Configuration(host=f"http://127.0.0.1:{port}")
    configuration.api_key["authorization"] = "token-1"
    configuration.api_key_prefix["authorization"] = "Bearer"
    return KubeApi(configuration), seen, bodies


@pytest.fixture
async def servers() -> Any:
    """The test's servers, cleaned up after it."""
    runners: list[aiohttp.web.AppRunner] = []
    yield runners
    for runner in runners:
        await runner.cleanup()


async def test_a_patch_says_who_sends_it_with_the_configurations_token(servers: Any) -> None:
    api, seen, bodies = await kube_api_against(
        servers, aiohttp.web.json_response({"metadata": {"name": "x"}})
    )
    try:
        answer = await api.patch("/apis/g/v1/namespaces/ml/things/x/status", {"status": {"a": 1}})
    finally:
        await api.close()
    assert answer == {"metadata": {"name": "x"}}
    (request,) = seen
    assert (request.method, request.path) == ("PATCH", "/apis/g/v1/namespaces/ml/things/x/status")
    assert request.headers["Authorization"] == "Bearer token-1"
    assert request.headers["User-Agent"] == USER_AGENT
    assert request.headers["Content-Type"] == "application/merge-patch+json"
    assert bodies == [{"status": {"a": 1}}]


async def test_a_refusal_is_one_line_with_its_status(servers: Any) -> None:
    api, _, _ = await kube_api_against(
        servers, aiohttp.web.Response(status=409, text="the object has been modified")
    )
    try:
        with pytest.raises(ApiError, match="^409 Conflict$") as raised:
            await api.patch(
                "/api/v1/namespaces/ml/pods/p/status", [], "application/json-patch+json"
            )
    finally:
        await api.close()
    assert raised.value.status == 409


async def test_an_api_server_out_of_reach_is_an_api_error() -> None:
    api = KubeApi(kubernetes.client.Configuration(host="http://127.0.0.1:1"))
    try:
        with pytest.raises(ApiError):
            await api.get("/api/v1/pods", {"limit": "1"}, timeout_s=2)
    finally:
        await api.close()
