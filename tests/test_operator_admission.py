"""Pods join at the right size, through the Kubernetes driver: kopf against kmock, and a real
Triton behind the pod that waits (tritonscale.drivers.admission).

A pod with the readinessGate tritonscale.io/instances-ready whose Triton answers (ContainersReady)
but whose gate is closed waits. The operator opens the gate (a JSON patch of pods/status) at
once when no autoscaler selects the pod, and, for a selected one, after bringing the pod to
its autoscaler's count.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from tests.operator_harness import (
    IGA,
    NAMESPACE,
    PODS,
    TRITON_LABELS,
    Emulator,
    autoscaler,
    eventually,
    register_resources,
    running_operator,
    triton_pod,
)
from tests.test_operator_kopf import add_sub_triton, live_instances  # noqa: F401 - a fixture
from tritonscale.drivers import kopf_operator as kopf_driver
from tritonscale.drivers.pods import INSTANCES_READY
from tritonscale.local.triton_server import LocalTriton

pytestmark = pytest.mark.kmock(cls=Emulator)


@pytest.fixture
def api(kmock: Emulator) -> Emulator:
    return register_resources(kmock)


def waiting_pod(name: str, port: int, metrics_port: int, labels: dict[str, str]) -> dict[str, Any]:
    """A pod as the kubelet reports it while the gate is closed: Triton answers, not Ready."""
    body = triton_pod(name, "127.0.0.1", port, metrics_port)
    body["metadata"]["labels"] = labels
    body["spec"]["readinessGates"] = [{"conditionType": INSTANCES_READY}]
    body["status"]["conditions"] = [
        {"type": "ContainersReady", "status": "True"},
        {"type": "Ready", "status": "False", "reason": "ReadinessGatesNotReady"},
    ]
    return body


def add_sub_autoscaler(desired: int) -> dict[str, Any]:
    """An autoscaler of add_sub on the Triton pods that last decided `desired` instances."""
    spec = {
        "selector": {"matchLabels": TRITON_LABELS},
        "model": "add_sub",
        "minInstances": 1,
        "maxInstances": 3,
        "intervalSeconds": 1,
    }
    body = autoscaler("add-sub", spec)
    body["status"] = {"desiredInstances": desired, "currentInstances": desired}
    return body


def gate(api: Emulator, name: str) -> dict[str, Any] | None:
    conditions = api.objects[PODS, NAMESPACE, name].get("status", {}).get("conditions", [])
    found = [c for c in conditions if c["type"] == INSTANCES_READY]
    return copy.deepcopy(found[0]) if found else None


async def test_a_pod_no_autoscaler_selects_joins_at_once(api: Emulator) -> None:
    api.objects[PODS, NAMESPACE, "loner-0"] = waiting_pod("loner-0", 1, 1, {"app": "loner"})
    spec = {"selector": {"matchLabels": TRITON_LABELS}, "model": "add_sub"}
    api.objects[IGA, NAMESPACE, "other"] = autoscaler("other", spec)

    async with running_operator(api):
        opened = await eventually(lambda: gate(api, "loner-0"), "the gate's condition")
    assert (opened["status"], opened["reason"]) == ("True", "NoAutoscaler")
    # The kubelet's conditions are untouched (a JSON patch, not a merge of the list).
    kinds = [c["type"] for c in api.objects[PODS, NAMESPACE, "loner-0"]["status"]["conditions"]]
    assert kinds == ["ContainersReady", "Ready", INSTANCES_READY]


async def test_a_selected_pod_is_brought_to_its_peers_count_then_joins(
    api: Emulator,
    add_sub_triton: LocalTriton,  # noqa: F811 - the fixture
) -> None:
    triton = add_sub_triton
    assert await asyncio.to_thread(live_instances, triton, "add_sub") == 1
    api.objects[PODS, NAMESPACE, "triton-1"] = waiting_pod(
        "triton-1", triton.http_port, triton.metrics_port, dict(TRITON_LABELS)
    )
    # Its peers run 2 (the count the autoscaler last decided); they are gone or elsewhere, so
    # the tick itself finds no ready pod and decides nothing new.
    api.objects[IGA, NAMESPACE, "add-sub"] = add_sub_autoscaler(desired=2)
    config = kopf_driver.DriverConfig(repository_key=triton.repository_key)

    async with running_operator(api, config):
        opened = await eventually(lambda: gate(api, "triton-1"), "the gate's condition")
    assert (opened["status"], opened["reason"]) == ("True", "InstancesMatch"), opened
    assert "add_sub=2" in opened["message"]
    assert await asyncio.to_thread(live_instances, triton, "add_sub") == 2


async def test_a_pod_whose_triton_restarted_is_taken_out_and_brought_back(
    api: Emulator,
    add_sub_triton: LocalTriton,  # noqa: F811 - the fixture
) -> None:
    """Its gate opened before its container last started (an OOM kill, say): the counts it
    vouched for are gone. The operator closes the gate and admits the pod again once it runs
    its peers' count."""
    triton = add_sub_triton
    assert await asyncio.to_thread(live_instances, triton, "add_sub") == 1
    body = waiting_pod("triton-2", triton.http_port, triton.metrics_port, dict(TRITON_LABELS))
    body["status"]["conditions"] = [
        {"type": "ContainersReady", "status": "True"},
        {"type": "Ready", "status": "True"},
        {
            "type": INSTANCES_READY,
            "status": "True",
            "reason": "InstancesMatch",
            "message": "before the restart",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        },
    ]
    body["status"]["containerStatuses"] = [
        {
            "name": "tritonserver",
            "image": "tritonserver",
            "imageID": "",
            "ready": True,
            "restartCount": 1,
            "state": {"running": {"startedAt": "2026-01-01T00:05:00Z"}},
        }
    ]
    api.objects[PODS, NAMESPACE, "triton-2"] = body
    api.objects[IGA, NAMESPACE, "add-sub"] = add_sub_autoscaler(desired=2)
    config = kopf_driver.DriverConfig(repository_key=triton.repository_key)

    async with running_operator(api, config):
        reopened = await eventually(
            lambda: (
                (g := gate(api, "triton-2"))
                and g["status"] == "True"
                and g["message"] != "before the restart"
                and g
            ),
            "the gate's condition set again",
        )
    assert (reopened["status"], reopened["reason"]) == ("True", "InstancesMatch"), reopened
    assert reopened["lastTransitionTime"] > "2026-01-01T00:05:00Z"
    assert await asyncio.to_thread(live_instances, triton, "add_sub") == 2
