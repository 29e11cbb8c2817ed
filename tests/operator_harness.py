"""A kopf operator against kmock: the emulator, its resources, objects, and the operator's thread.

kopf runs in its own thread and event loop (`running_operator`), exactly as
`tritonscale operator` runs it (`kopf_driver.run`), with a pre-filled credentials vault
pointing at kmock; the emulator runs on the test's loop. What kopf needs from kmock (0.8)
that it does not give by itself:

- discovery for every resource kopf uses (`register_resources`), or kopf silently watches
  nothing and posts no events;
- a `resourceVersion` on pre-created objects, or kopf's finalizer patch fails;
- names for `generateName` objects (`Emulator`), or kopf's second event collides;
- blocking calls (joining kopf's thread) through `asyncio.to_thread`, so that the emulator
  on the test's loop keeps answering.

kmock has no label selectors, schema validation or resourceVersion bumps: those are tested
elsewhere (selectors in test_operator_pods.py, the CRD schema in test_crd.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import kmock
import kopf
import kubernetes
from kopf._cogs.structs import credentials
from prometheus_client.parser import text_string_to_metric_families

from tritonscale.drivers import kopf_operator as kopf_driver
from tritonscale.drivers.kube_api import KubeApi
from tritonscale.local.ports import free_ports

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


PEERINGS = "kopf.dev/v1/kopfpeerings"


def register_resources(kmock: Emulator) -> Emulator:
    """Discovery for what kopf uses: the CRD's resource, pods, events, peerings, namespaces.

    Without it kopf silently watches nothing and posts no events.
    """
    kmock.resources[IGA] = kmock.ResourceInfo(
        kind="InstanceGroupAutoscaler",
        singular="instancegroupautoscaler",
        namespaced=True,
        verbs={"get", "list", "watch", "patch"},
        shortnames={"iga"},
        subresources={"status"},
    )
    kmock.resources[PODS] = kmock.ResourceInfo(
        kind="Pod",
        singular="pod",
        namespaced=True,
        verbs={"get", "list", "watch", "patch"},
        subresources={"status"},
    )
    kmock.resources[EVENTS] = kmock.ResourceInfo(
        kind="Event", singular="event", namespaced=True, verbs={"create", "list"}
    )
    kmock.resources["v1/namespaces"] = kmock.ResourceInfo(
        kind="Namespace", singular="namespace", namespaced=False, verbs={"get", "list", "watch"}
    )
    kmock.resources[PEERINGS] = kmock.ResourceInfo(
        kind="KopfPeering",
        singular="kopfpeering",
        namespaced=True,
        verbs={"list", "watch", "patch"},
    )
    return kmock


def kube_api(api: Emulator) -> KubeApi:
    """The client of the operator's own calls to the API server (status, the pods' gate, the
    readinessProbe's reads), pointed at the emulator."""
    return KubeApi(kubernetes.client.Configuration(host=str(api.url).rstrip("/")))


def autoscaler(
    name: str, spec: dict[str, Any], generation: int = 1, namespace: str = NAMESPACE
) -> dict[str, Any]:
    # resourceVersion: kmock does not assign one, and kopf's finalizer patch needs it.
    return {
        "apiVersion": "tritonscale.io/v1alpha1",
        "kind": "InstanceGroupAutoscaler",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "generation": generation,
        },
        "spec": spec,
    }


def triton_pod(
    name: str, ip: str, http_port: int, metrics_port: int, namespace: str = NAMESPACE
) -> dict[str, Any]:
    """A ready Triton pod as the kubelet reports it; its named ports lead to a real server."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
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


def status_of(api: Emulator, name: str, namespace: str = NAMESPACE) -> dict[str, Any]:
    return copy.deepcopy(dict(api.objects[IGA, namespace, name].get("status") or {}))


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
    readiness_url: str
    thread: threading.Thread
    errors: list[BaseException]


@contextlib.asynccontextmanager
async def running_operator(
    api: Emulator,
    config: kopf_driver.DriverConfig | None = None,
    namespace: str = NAMESPACE,
    peering: str | None = None,
    priority: int | None = None,
) -> AsyncIterator[Operator]:
    """`kopf_driver.run` in a thread of its own; stopped and joined on exit. Its own calls to
    the API server go to the emulator too, never to a kubeconfig's cluster."""
    stop, ready = threading.Event(), threading.Event()
    metrics_port, liveness_port, readiness_port = free_ports(3)
    errors: list[BaseException] = []

    def target() -> None:
        loop = asyncio.new_event_loop()
        try:
            vault = credentials.Vault({"kmock": kopf.ConnectionInfo(server=str(api.url))})
            kopf_driver.run(
                config or kopf_driver.DriverConfig(),
                namespaces=[namespace],
                peering=peering,
                priority=priority,
                liveness=f"http://127.0.0.1:{liveness_port}/healthz",
                readiness_url=f"http://127.0.0.1:{readiness_port}/readyz",
                metrics_port=metrics_port,
                stop_flag=stop,
                ready_flag=ready,
                vault=vault,
                loop=loop,
                api=kube_api(api),
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
            readiness_url=f"http://127.0.0.1:{readiness_port}/readyz",
            thread=thread,
            errors=errors,
        )
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, WAIT_S)
    assert not thread.is_alive(), "the operator did not stop"
    assert errors == [], f"the operator crashed: {errors!r}"


async def ticks(operator: Operator, name: str) -> float:
    """How many ticks the operator's own metrics counted for one autoscaler (every tick counts
    one decision, a hold where it could not decide)."""
    _, text = await http_get(operator.metrics_url)
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "tritonscale_decisions_total" and sample.labels.get("autoscaler") == name
    )


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


def object_url(api: Emulator, name: str, namespace: str = NAMESPACE) -> str:
    return f"{api.url}/apis/tritonscale.io/v1alpha1/namespaces/{namespace}/instancegroupautoscalers/{name}"


async def patch_object(api: Emulator, name: str, body: dict[str, Any]) -> None:
    """A user's `kubectl patch` (a merge patch) through the API, so that kopf sees it."""
    url = object_url(api, name)
    async with aiohttp.ClientSession() as session:
        headers = {"Content-Type": "application/merge-patch+json"}
        async with session.patch(url, json=body, headers=headers) as response:
            assert response.status == 200, await response.text()


async def delete_object(api: Emulator, name: str, namespace: str = NAMESPACE) -> None:
    """A user's `kubectl delete`: kopf's finalizer holds the object until the operator lets go."""
    async with (
        aiohttp.ClientSession() as session,
        session.delete(object_url(api, name, namespace)) as response,
    ):
        assert response.status == 200, await response.text()
