"""The operator's readinessProbe (tritonscale.drivers.readiness): its role in a peering, the
verdict, the checks it asks of the API server, and its endpoint."""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from tests.operator_harness import (
    IGA,
    NAMESPACE,
    PEERINGS,
    TRITON_LABELS,
    Emulator,
    autoscaler,
    eventually_async,
    http_get,
    register_resources,
    running_operator,
)
from tritonscale.drivers.readiness import ProbeServer, Readiness, Role, Verdict, judge, role
from tritonscale.local.ports import free_ports

NOW = datetime.datetime(2026, 12, 3, 12, 0, 0, tzinfo=datetime.timezone.utc)
ME = "operator-abc"


def heartbeat(priority: int, seen_s_ago: float = 1, lifetime: int = 20) -> dict[str, Any]:
    seen = NOW - datetime.timedelta(seconds=seen_s_ago)
    return {"priority": priority, "lifetime": lifetime, "lastseen": seen.isoformat()}


@dataclass(frozen=True)
class RoleCase:
    peers: dict[str, Any]
    expected: Role


ROLE_CASES = {
    "alone: it acts": RoleCase({ME: heartbeat(5)}, Role.ACTIVE),
    "a live peer of a higher priority acts: standby": RoleCase(
        {ME: heartbeat(5), "other": heartbeat(9)}, Role.STANDBY
    ),
    "a lower peer stands by: it acts": RoleCase(
        {ME: heartbeat(5), "other": heartbeat(2)}, Role.ACTIVE
    ),
    # Seen 30 s ago with a 20 s lifetime: kopf counts it dead and takes over.
    "a higher peer whose heartbeat expired: it acts": RoleCase(
        {ME: heartbeat(5), "other": heartbeat(9, seen_s_ago=30)}, Role.ACTIVE
    ),
    "a live peer of the same priority: kopf pauses both": RoleCase(
        {ME: heartbeat(5), "other": heartbeat(5)}, Role.CONFLICT
    ),
    "its own heartbeat not written yet": RoleCase({"other": heartbeat(9)}, Role.UNSEEN),
    "its own heartbeat expired (it cannot reach the API server)": RoleCase(
        {ME: heartbeat(5, seen_s_ago=30)}, Role.UNSEEN
    ),
    "a heartbeat without a time": RoleCase({ME: {"priority": 5}}, Role.UNSEEN),
}


@pytest.mark.unit
@pytest.mark.parametrize("case", ROLE_CASES.values(), ids=ROLE_CASES.keys())
def test_a_replicas_role_in_the_peering_is_kopfs(case: RoleCase) -> None:
    assert role(case.peers, ME, 5, NOW) is case.expected


@dataclass(frozen=True)
class JudgeCase:
    synced: bool
    roles: dict[str, Role | str]
    nothing_to_index: bool
    ready: bool
    reason: str


JUDGE_CASES = {
    "standalone, indexes synced": JudgeCase(True, {}, False, True, "synced"),
    "standalone, not synced yet": JudgeCase(False, {}, False, False, "not synced"),
    "standalone, nothing to index": JudgeCase(False, {}, True, True, "nothing to index"),
    "active, synced": JudgeCase(True, {"ml": Role.ACTIVE}, False, True, "active"),
    "active, not synced yet": JudgeCase(False, {"ml": Role.ACTIVE}, False, False, "not synced"),
    # A standby watches nothing (kopf pauses it): it has no index to sync, and must be Ready.
    "standby, never synced": JudgeCase(False, {"ml": Role.STANDBY}, False, True, "standby"),
    "standby in every namespace": JudgeCase(
        False, {"ml": Role.STANDBY, "ci": Role.STANDBY}, False, True, "standby"
    ),
    # kopf holds every handler back while any namespace is paused: it cannot sync.
    "active in one namespace, standby in another": JudgeCase(
        False, {"ml": Role.ACTIVE, "ci": Role.STANDBY}, False, False, "not synced"
    ),
    "its heartbeat missing, although synced": JudgeCase(
        True, {"ml": Role.UNSEEN}, False, False, "heartbeat is not in the peering of ml"
    ),
    "same priority as a peer": JudgeCase(
        True, {"ml": Role.CONFLICT}, False, False, "has its priority"
    ),
    "the peering object unread": JudgeCase(
        True, {"ml": "connection refused"}, False, False, "peering in ml unread"
    ),
}


@pytest.mark.unit
@pytest.mark.parametrize("case", JUDGE_CASES.values(), ids=JUDGE_CASES.keys())
def test_the_verdict(case: JudgeCase) -> None:
    verdict = judge(case.synced, case.roles, case.nothing_to_index)
    assert verdict.ready is case.ready
    assert case.reason in verdict.reason.replace("have not synced", "not synced")


class FakeApi:
    """The API server's answers to the probe, and how often it was asked."""

    def __init__(
        self, peers: Mapping[str, Any] | Exception | None = None, empty: bool | Exception = False
    ) -> None:
        self.peers, self.empty = peers if peers is not None else {}, empty
        self.lists = 0

    async def nothing_to_index(self) -> bool:
        self.lists += 1
        if isinstance(self.empty, Exception):
            raise self.empty
        return self.empty

    async def read_peering(self, namespace: str) -> Mapping[str, Any]:
        if isinstance(self.peers, Exception):
            raise self.peers
        return self.peers


def readiness(api: FakeApi, peering: str | None = None) -> Readiness:
    return Readiness(
        peering=peering,
        identity=ME,
        priority=5,
        namespaces=["ml"],
        nothing_to_index=api.nothing_to_index,
        read_peering=api.read_peering,
        clock=lambda: NOW,
    )


@pytest.mark.unit
async def test_once_synced_it_asks_the_api_server_nothing_more_without_peering() -> None:
    api = FakeApi(empty=False)
    subject = readiness(api)
    assert (await subject.check()).ready is False
    assert api.lists == 1  # objects to index exist: wait for kopf's first handler call
    subject.note_synced()
    assert await subject.check() == Verdict(True, "synced")
    assert api.lists == 1


@pytest.mark.unit
async def test_namespaces_with_nothing_to_index_are_ready_without_a_handler_call() -> None:
    verdict = await readiness(FakeApi(empty=True)).check()
    assert verdict.ready, verdict


@pytest.mark.unit
async def test_an_api_server_out_of_reach_is_not_ready_and_says_why() -> None:
    verdict = await readiness(FakeApi(empty=ConnectionRefusedError("connection refused"))).check()
    assert not verdict.ready
    assert "connection refused" in verdict.reason


@pytest.mark.unit
async def test_a_standby_is_ready_without_listing_anything() -> None:
    api = FakeApi(peers={ME: heartbeat(5), "other": heartbeat(9)})
    verdict = await readiness(api, peering="ops").check()
    assert verdict.ready and "standby" in verdict.reason
    assert api.lists == 0


@pytest.mark.unit
async def test_an_unreadable_peering_is_not_ready_even_once_synced() -> None:
    subject = readiness(FakeApi(peers=LookupError("no KopfPeering 'ops'")), peering="ops")
    subject.note_synced()
    verdict = await subject.check()
    assert not verdict.ready
    assert "no KopfPeering 'ops'" in verdict.reason


@pytest.mark.unit
async def test_the_endpoint_answers_200_when_ready_and_503_when_not() -> None:
    (port,) = free_ports(1)
    subject = readiness(FakeApi(empty=False))
    server = ProbeServer(f"http://127.0.0.1:{port}/readyz", subject)
    await server.start()
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/readyz") as response:
                assert response.status == 503
                assert (await response.json())["ready"] is False
            subject.note_synced()
            async with session.get(f"http://127.0.0.1:{port}/readyz") as response:
                assert response.status == 200
                assert await response.json() == {"ready": True, "reason": "synced"}
    finally:
        await server.stop()


@pytest.fixture
def api(kmock: Emulator) -> Emulator:
    return register_resources(kmock)


@pytest.mark.unit
@pytest.mark.kmock(cls=Emulator)
async def test_with_peering_the_active_replica_and_its_standby_are_both_ready(
    api: Emulator,
) -> None:
    # The chart ships the KopfPeering; kopf only patches its heartbeats in.
    api.objects[PEERINGS, NAMESPACE, "ops"] = {
        "apiVersion": "kopf.dev/v1",
        "kind": "KopfPeering",
        "metadata": {"name": "ops", "namespace": NAMESPACE, "resourceVersion": "1"},
    }
    spec = {"selector": {"matchLabels": TRITON_LABELS}, "model": "add_sub"}
    api.objects[IGA, NAMESPACE, "watched"] = autoscaler("watched", spec)

    # The standby (the lower priority) stops first: a standby that took over from a stopping
    # active replica while it stops itself would be another test.
    async with (
        running_operator(api, peering="ops", priority=2) as active,
        running_operator(api, peering="ops", priority=1) as standby,
    ):

        async def both() -> list[tuple[int, str]]:
            return [await http_get(active.readiness_url), await http_get(standby.readiness_url)]

        answers = await eventually_async(
            both, lambda got: all(code == 200 for code, _ in got), "both replicas Ready"
        )
    reasons = [json.loads(body)["reason"] for _, body in answers]
    assert reasons == [
        "active: its indexes have synced",
        "standby: a live peer of a higher priority acts",
    ]
