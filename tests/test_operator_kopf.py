"""The Kubernetes driver against kmock (kopf's mock API server) and, end to end, a real Triton.

kopf runs in its own thread and event loop (`running_operator`), exactly as
`tritonscale operator` runs it, with a pre-filled credentials vault pointing at kmock.
Everything else is real: the policy, the actuator, the metrics source, the operator's
metrics and liveness servers, and a tritonserver whose address a kmock Pod carries.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import json
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import kmock
import kopf
import pytest
import requests
from kopf._cogs.structs import credentials
from prometheus_client.parser import text_string_to_metric_families

from tests.tooling import missing
from tritonscale import kopf_driver
from tritonscale.local_triton import LocalTriton, LocalTritonError, TritonInstall, free_port

IGA = "tritonscale.io/v1alpha1/instancegroupautoscalers"
PODS = "v1/pods"
EVENTS = "v1/events"
NAMESPACE = "ml"
TRITON_LABELS = {"app.kubernetes.io/name": "tritonscale", "app.kubernetes.io/component": "triton"}
CONTRACT_METRICS = (
    "tritonscale_desired_instances",
    "tritonscale_current_instances",
    "tritonscale_decisions_total",
    "tritonscale_actuations_total",
    "tritonscale_reconcile_duration_seconds",
    "tritonscale_reconcile_errors_total",
    "tritonscale_observed_signal",
    "tritonscale_last_reconcile_timestamp_seconds",
)
WAIT_S = 30.0


class Emulator(kmock.KubernetesEmulator):
    """kmock's emulator, plus the API server's naming of `generateName` objects (kopf's events)."""

    _serial = itertools.count(1)

    async def _handle(self, request: Any) -> Any:
        if request.action == kmock.action.CREATE and isinstance(request.data, dict):
            metadata = request.data.setdefault("metadata", {})
            if not metadata.get("name") and metadata.get("generateName"):
                metadata["name"] = f"{metadata['generateName']}{next(self._serial)}"
        return await super()._handle(request)


pytestmark = pytest.mark.kmock(cls=Emulator)


@pytest.fixture
def api(kmock: Emulator) -> Emulator:
    """The resources kopf discovers and uses: the CRD's, pods, events (and namespaces)."""
    kmock.resources[IGA] = kmock.ResourceInfo(
        kind="InstanceGroupAutoscaler",
        singular="instancegroupautoscaler",
        namespaced=True,
        verbs={"get", "list", "watch", "patch"},
        shortnames={"iga"},
        subresources={"status"},
    )
    kmock.resources[PODS] = kmock.ResourceInfo(
        kind="Pod", singular="pod", namespaced=True, verbs={"get", "list", "watch"}
    )
    kmock.resources[EVENTS] = kmock.ResourceInfo(
        kind="Event", singular="event", namespaced=True, verbs={"create", "list"}
    )
    kmock.resources["v1/namespaces"] = kmock.ResourceInfo(
        kind="Namespace", singular="namespace", namespaced=False, verbs={"get", "list", "watch"}
    )
    return kmock


def autoscaler(name: str, spec: dict[str, Any], generation: int = 1) -> dict[str, Any]:
    # resourceVersion: kmock does not assign one, and kopf's finalizer patch needs it.
    return {
        "apiVersion": "tritonscale.io/v1alpha1",
        "kind": "InstanceGroupAutoscaler",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "generation": generation,
        },
        "spec": spec,
    }


def triton_pod(name: str, ip: str, http_port: int, metrics_port: int) -> dict[str, Any]:
    """A ready Triton pod as the kubelet reports it; its named ports lead to a real server."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "labels": dict(TRITON_LABELS),
        },
        "spec": {
            "containers": [
                {
                    "name": "triton",
                    "ports": [
                        {"name": "http", "containerPort": http_port},
                        {"name": "metrics", "containerPort": metrics_port},
                    ],
                }
            ]
        },
        "status": {
            "phase": "Running",
            "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def status_of(api: Emulator, name: str) -> dict[str, Any]:
    return copy.deepcopy(dict(api.objects[IGA, NAMESPACE, name].get("status") or {}))


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    [found] = [c for c in status.get("conditions", []) if c["type"] == kind]
    return found


def events_for(api: Emulator, name: str) -> list[dict[str, Any]]:
    events = []
    for (resource, _, _), obj in api.objects.items():
        if resource == kmock.resource(EVENTS) and not obj.deleted:
            body = copy.deepcopy(dict(obj))
            if body.get("involvedObject", {}).get("name") == name:
                events.append(body)
    return events


async def eventually(check: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    """Poll until `check()` is truthy (the operator works in its own thread)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(0.1)


async def eventually_async(
    read: Callable[[], Any], check: Callable[[Any], bool], what: str, timeout_s: float = WAIT_S
) -> Any:
    """Like `eventually`, for a value that takes an await to read."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = await read()
        if check(value):
            return value
        if loop.time() > deadline:
            raise AssertionError(
                f"timed out after {timeout_s:.0f} s waiting for {what} (last: {value!r})"
            )
        await asyncio.sleep(0.2)


@dataclass
class Operator:
    metrics_url: str
    liveness_url: str
    thread: threading.Thread
    errors: list[BaseException]


@contextlib.asynccontextmanager
async def running_operator(
    api: Emulator, config: kopf_driver.DriverConfig | None = None
) -> AsyncIterator[Operator]:
    """`kopf_driver.run` in a thread of its own; stopped and joined on exit."""
    stop, ready = threading.Event(), threading.Event()
    metrics_port, liveness_port = free_port(), free_port()
    errors: list[BaseException] = []

    def target() -> None:
        loop = asyncio.new_event_loop()
        try:
            vault = credentials.Vault({"kmock": kopf.ConnectionInfo(server=str(api.url))})
            kopf_driver.run(
                config or kopf_driver.DriverConfig(),
                namespaces=[NAMESPACE],
                liveness=f"http://127.0.0.1:{liveness_port}/healthz",
                metrics_port=metrics_port,
                stop_flag=stop,
                ready_flag=ready,
                vault=vault,
                loop=loop,
            )
        except BaseException as error:  # reported to the test below
            errors.append(error)
        finally:
            loop.close()

    thread = threading.Thread(target=target, name="kopf-under-test", daemon=True)
    thread.start()
    try:
        await asyncio.to_thread(ready.wait, WAIT_S)
        yield Operator(
            metrics_url=f"http://127.0.0.1:{metrics_port}/metrics",
            liveness_url=f"http://127.0.0.1:{liveness_port}/healthz",
            thread=thread,
            errors=errors,
        )
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, WAIT_S)
    assert not thread.is_alive(), "the operator did not stop"
    assert errors == [], f"the operator crashed: {errors!r}"


async def ticks(operator: Operator, name: str) -> float:
    """How many ticks the operator's own metrics counted for one autoscaler."""
    _, text = await http_get(operator.metrics_url)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (
                sample.name == "tritonscale_reconcile_duration_seconds_count"
                and sample.labels.get("autoscaler") == name
            ):
                return sample.value
    return 0.0


async def error_count(operator: Operator, name: str, reason: str) -> float:
    _, text = await http_get(operator.metrics_url)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (
                sample.name == "tritonscale_reconcile_errors_total"
                and sample.labels.get("autoscaler") == name
                and sample.labels.get("reason") == reason
            ):
                return sample.value
    return 0.0


async def http_get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.text()


async def patch_object(api: Emulator, name: str, body: dict[str, Any]) -> None:
    """A user's `kubectl patch` (a merge patch) through the API, so that kopf sees it."""
    url = f"{api.url}/apis/tritonscale.io/v1alpha1/namespaces/{NAMESPACE}/instancegroupautoscalers/{name}"
    async with aiohttp.ClientSession() as session:
        headers = {"Content-Type": "application/merge-patch+json"}
        async with session.patch(url, json=body, headers=headers) as response:
            assert response.status == 200, await response.text()


async def delete_object(api: Emulator, name: str) -> None:
    url = f"{api.url}/apis/tritonscale.io/v1alpha1/namespaces/{NAMESPACE}/instancegroupautoscalers/{name}"
    async with aiohttp.ClientSession() as session, session.delete(url) as response:
        assert response.status == 200, await response.text()


# ---------------------------------------------------------------------------------------


async def test_an_autoscaler_without_ready_pods_gets_status_conditions_and_one_warning(
    api: Emulator,
) -> None:
    spec = {"selector": {"matchLabels": TRITON_LABELS}, "model": "add_sub", "intervalSeconds": 1}
    api.objects[IGA, NAMESPACE, "lonely"] = autoscaler("lonely", spec, generation=3)

    async with running_operator(api) as operator:
        status = await eventually(
            lambda: status_of(api, "lonely").get("conditions") and status_of(api, "lonely"),
            "the operator's first status",
        )
        assert status["pods"] == 0
        assert status["observedGeneration"] == 3
        active = condition(status, "ScalingActive")
        assert active["status"] == "False"
        assert active["reason"] == "NoReadyPods"
        assert "selector" in active["message"]
        assert condition(status, "AbleToScale")["status"] == "False"
        assert condition(status, "ScalingLimited")["status"] == "False"
        assert "lastTransitionTime" in active

        # The failure persists over several ticks (intervalSeconds 1): its condition keeps its
        # transition time, and it was announced by one Warning, not one per tick.
        first_transition = active["lastTransitionTime"]
        await eventually_async(lambda: ticks(operator, "lonely"), lambda n: n >= 3, "three ticks")
        later = status_of(api, "lonely")
        assert condition(later, "ScalingActive")["lastTransitionTime"] == first_transition
        warnings = [e for e in events_for(api, "lonely") if e["type"] == "Warning"]
        assert [e["reason"] for e in warnings] == ["NoReadyPods"]
        assert warnings[0]["involvedObject"]["kind"] == "InstanceGroupAutoscaler"

        # Deleting the object stops its timer, releases kopf's finalizer and drops its series
        # from the operator's metrics (a stale timestamp would fire a "not reconciling" alert).
        await delete_object(api, "lonely")
        await eventually(
            lambda: (
                (IGA, NAMESPACE, "lonely") not in api.objects
                or api.objects[IGA, NAMESPACE, "lonely"].deleted
            ),
            "the object to be gone",
        )
        await eventually_async(
            lambda: http_get(operator.metrics_url),
            lambda got: 'autoscaler="lonely"' not in got[1],
            "the deleted autoscaler's series to go",
        )


async def test_an_invalid_spec_is_a_condition_and_one_warning_not_a_crash(api: Emulator) -> None:
    spec = {
        "selector": {"matchLabels": TRITON_LABELS},
        "model": "add_sub",
        "minInstances": 5,
        "maxInstances": 2,
    }
    api.objects[IGA, NAMESPACE, "broken"] = autoscaler("broken", spec, generation=1)
    config = kopf_driver.DriverConfig(invalid_spec_recheck_s=0.5)

    async with running_operator(api, config) as operator:
        status = await eventually(
            lambda: status_of(api, "broken").get("conditions") and status_of(api, "broken"),
            "a status for the broken object",
        )
        active = condition(status, "ScalingActive")
        assert (active["status"], active["reason"]) == ("False", "InvalidSpec")
        assert active["message"] == "spec.minInstances (5) must be <= spec.maxInstances (2)"
        assert status["observedGeneration"] == 1

        # Looked at again and again (every 0.5 s here), it stays one condition and one event.
        await eventually_async(
            lambda: error_count(operator, "broken", "InvalidSpec"), lambda n: n >= 3, "rechecks"
        )
        warnings = [e for e in events_for(api, "broken") if e["type"] == "Warning"]
        assert [(e["reason"], e["message"]) for e in warnings] == [
            ("InvalidSpec", "spec.minInstances (5) must be <= spec.maxInstances (2)")
        ]
        assert operator.thread.is_alive()

        # Fixed by the user, the spec is read on the next tick: the InvalidSpec goes away.
        await patch_object(
            api, "broken", {"metadata": {"generation": 2}, "spec": {"minInstances": 1}}
        )
        fixed = await eventually(
            lambda: (
                status_of(api, "broken").get("observedGeneration") == 2 and status_of(api, "broken")
            ),
            "the fixed spec to be observed",
        )
        assert condition(fixed, "ScalingActive")["reason"] == "NoReadyPods"


@pytest.fixture
def add_sub_triton() -> Any:
    """A real tritonserver serving add_sub alone (its instance count is ours to change)."""
    try:
        TritonInstall()
    except LocalTritonError as error:
        missing(str(error))
    with LocalTriton(
        http_port=0, grpc_port=0, metrics_port=0, models=["add_sub"], exit_timeout_s=2
    ) as server:
        yield server


def live_instances(triton: LocalTriton, model: str) -> int:
    config = requests.get(f"http://{triton.http_url}/v2/models/{model}/config", timeout=5)
    config.raise_for_status()
    return sum(group.get("count", 1) for group in config.json()["instance_group"])


async def test_the_operator_changes_a_live_instance_count_on_a_real_triton(
    api: Emulator, add_sub_triton: LocalTriton
) -> None:
    triton = add_sub_triton
    assert await asyncio.to_thread(live_instances, triton, "add_sub") == 1
    api.objects[PODS, NAMESPACE, "triton-0"] = triton_pod(
        "triton-0", "127.0.0.1", triton.http_port, triton.metrics_port
    )
    # The live count (1) is below minInstances (2): the policy goes to the bound whatever
    # the load, as the HPA does. First as a dry run: decided and reported, not applied.
    spec = {
        "selector": {"matchLabels": TRITON_LABELS},
        "model": "add_sub",
        "minInstances": 2,
        "maxInstances": 3,
        "intervalSeconds": 1,
        "metricsWindowSeconds": 5,
        "dryRun": True,
    }
    api.objects[IGA, NAMESPACE, "add-sub"] = autoscaler("add-sub", spec, generation=1)
    config = kopf_driver.DriverConfig(repository_key=triton.repository_key)

    async with running_operator(api, config) as operator:
        dry = await eventually(
            lambda: status_of(api, "add-sub").get("lastDecision") and status_of(api, "add-sub"),
            "the dry run's decision",
        )
        assert dry["lastDecision"]["reason"] == "DryRun"
        assert (dry["currentInstances"], dry["desiredInstances"], dry["pods"]) == (1, 2, 1)
        assert await asyncio.to_thread(live_instances, triton, "add_sub") == 1

        await patch_object(
            api, "add-sub", {"metadata": {"generation": 2}, "spec": {"dryRun": False}}
        )
        scaled = await eventually(
            lambda: (
                status_of(api, "add-sub").get("currentInstances") == 2 and status_of(api, "add-sub")
            ),
            "the live count of 2 in status",
        )
        assert await asyncio.to_thread(live_instances, triton, "add_sub") == 2
        assert scaled["desiredInstances"] == 2
        assert scaled["observedGeneration"] == 2
        assert "lastScaleTime" in scaled
        assert scaled["policyState"], "the policy's history must be kept in status"
        assert condition(scaled, "AbleToScale")["status"] == "True"

        normal = [e for e in events_for(api, "add-sub") if e["type"] == "Normal"]
        assert [e["reason"] for e in normal] == ["SucceededRescale"]
        assert "add_sub 1 -> 2 instances" in normal[0]["message"]

        # The operator's own metrics, as the contract names them, for this autoscaler.
        _, text = await http_get(operator.metrics_url)
        families = {family.name: family for family in text_string_to_metric_families(text)}
        for name in CONTRACT_METRICS:
            family = families.get(name.removesuffix("_total"))
            assert family is not None, f"{name} is not served"
        labelled = {
            sample.name
            for family in families.values()
            for sample in family.samples
            if sample.labels.get("autoscaler") == "add-sub"
            and sample.labels.get("namespace") == NAMESPACE
            and sample.labels.get("model") == "add_sub"
        }
        assert {
            "tritonscale_desired_instances",
            "tritonscale_current_instances",
            "tritonscale_decisions_total",
            "tritonscale_actuations_total",
            "tritonscale_reconcile_duration_seconds_count",
            "tritonscale_last_reconcile_timestamp_seconds",
        } <= labelled

        # kopf's liveness endpoint answers, with this operator's probes.
        code, body = await http_get(operator.liveness_url)
        assert code == 200
        assert json.loads(body)["ticks"] >= 2
