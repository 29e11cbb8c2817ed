"""Pods join at the right size: the readinessGate `tritonscale.io/instances-ready`.

The chart gives each Triton pod that readinessGate, so the kubelet keeps a new pod out of the
Service's endpoints (not Ready) until the operator sets the pod's condition of that type True.
A pod waits while Triton answers in it but the gate is closed (`TritonPod.waiting_for_instances`).

- The loop of each autoscaler's pod set brings the waiting pods it selects to the count it
  decided (the count its peers run; tritonscale.drivers.gates), then asks `judge`: the pod is admitted once, for every autoscaler that
  selects it and acts (neither paused nor dryRun) and has decided a count, the pod's live count
  of that model is that count.
- A pod that no autoscaler selects is admitted at once (the operator's watch of the pods does
  it): nothing is there to match, and it must not wait forever. So is a pod whose autoscalers
  act on nothing (paused, dryRun) or have decided nothing yet (the first pod of a new release:
  its autoscalers size it once it serves).
- The condition stays True while the pod's counts change (Triton changes them in place,
  serving meanwhile). It is set back to False only when a container of the pod stops (an
  OOM kill, a failed liveness probe): the restarted Triton runs its repository's counts, so
  the operator's watch of the pods closes the gate (`restarted`) as soon as the kubelet
  reports the container stopped (before it starts the next one, where it can: see
  `pods._gate` for why the earlier the better), and the pod waits to be admitted again like
  a new one.

`judge` and `gate_patch` are pure; `PodStatusWriter` sends the patch (the RBAC: `patch` on
`pods/status`, nothing else of a pod).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tritonscale.core.selectors import selector_matches
from tritonscale.core.spec import AutoscalerSpec, LabelSelector
from tritonscale.drivers.kube_api import JSON_PATCH, ApiError, KubeApi
from tritonscale.drivers.kube_api import USER_AGENT as USER_AGENT  # what the calls say they are
from tritonscale.drivers.pods import INSTANCES_READY, TritonPod

NO_AUTOSCALER = "NoAutoscaler"
INSTANCES_MATCH = "InstancesMatch"
INSTANCES_PENDING = "InstancesPending"
CONTAINER_RESTARTED = "ContainerRestarted"


@dataclass(frozen=True)
class Autoscaler:
    """What admission needs of one autoscaler."""

    name: str
    model: str
    selector: LabelSelector
    desired: int | None  # the count it last decided (status.desiredInstances); None: none yet
    acting: bool  # neither paused nor dryRun: it brings the pods to `desired`

    @classmethod
    def of(cls, name: str, spec: AutoscalerSpec, desired: int | None) -> Autoscaler:
        return cls(name, spec.model, spec.selector, desired, not (spec.paused or spec.dry_run))


@dataclass(frozen=True)
class Verdict:
    admit: bool
    reason: str  # NoAutoscaler, InstancesMatch, InstancesPending, ContainerRestarted
    message: str


def selecting(pod: TritonPod, autoscalers: Iterable[Autoscaler]) -> list[Autoscaler]:
    """The autoscalers whose selector matches the pod, by name."""
    chosen = [a for a in autoscalers if selector_matches(a.selector, pod.labels)]
    return sorted(chosen, key=lambda a: a.name)


def judge(
    pod: TritonPod, autoscalers: Iterable[Autoscaler], live: Mapping[str, int | None]
) -> Verdict:
    """Whether the pod may join: `live` is its count of each model (None: not readable)."""
    chosen = selecting(pod, autoscalers)
    if not chosen:
        return Verdict(True, NO_AUTOSCALER, f"no autoscaler selects {pod.name}")
    waiting, matched = [], []
    for autoscaler in chosen:
        if not autoscaler.acting or autoscaler.desired is None:
            continue  # it brings the pods to no count: nothing to wait for
        count = live.get(autoscaler.model)
        if count == autoscaler.desired:
            matched.append(f"{autoscaler.model}={count}")
        else:
            have = "unreadable" if count is None else str(count)
            waiting.append(
                f"{autoscaler.model} {have}, {autoscaler.name} wants {autoscaler.desired}"
            )
    if waiting:
        return Verdict(False, INSTANCES_PENDING, f"{pod.name} waits: " + "; ".join(waiting))
    if not matched:
        return Verdict(
            True, INSTANCES_MATCH, f"the autoscalers of {pod.name} have no count to match yet"
        )
    return Verdict(
        True, INSTANCES_MATCH, f"{pod.name} runs its peers' counts: " + ", ".join(matched)
    )


def restarted(pod: TritonPod) -> Verdict:
    """The verdict that closes the gate of a pod whose container restarted behind it."""
    return Verdict(
        False,
        CONTAINER_RESTARTED,
        f"a container of {pod.name} stopped at {pod.stopped_at}: Triton runs its "
        "repository's counts once restarted, until the operator brings it to its peers'",
    )


def gate_patch(pod: TritonPod, verdict: Verdict, now: float) -> list[dict[str, Any]]:
    """The JSON patch of pods/status that sets the gate's condition: True when the verdict
    admits the pod, False when it closes the gate (`restarted`).

    A JSON patch, not a merge patch: a merge patch would replace the whole conditions list,
    and with it the kubelet's own conditions. A `test` of the pod's resourceVersion makes it
    apply to the pod as it was read, or not at all (the API server answers 409 or 422, and the
    next look tries again): the index is right, and a second writer cannot add the condition
    twice. Where the condition exists, a `test` of its type guards the index too.
    """
    condition = {
        "type": INSTANCES_READY,
        "status": "True" if verdict.admit else "False",
        "reason": verdict.reason,
        "message": verdict.message,
        "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
    }
    ops: list[dict[str, Any]] = []
    if pod.resource_version is not None:
        ops.append(
            {"op": "test", "path": "/metadata/resourceVersion", "value": pod.resource_version}
        )
    if pod.gate_condition is not None:
        at = f"/status/conditions/{pod.gate_condition}"
        ops.append({"op": "test", "path": f"{at}/type", "value": INSTANCES_READY})
        ops.append({"op": "replace", "path": at, "value": condition})
    else:
        ops.append({"op": "add", "path": "/status/conditions/-", "value": condition})
    return ops


class PodStatusWriter:
    """Sends `gate_patch` to the API server (tritonscale.drivers.kube_api), awaited on kopf's
    loop."""

    def __init__(self, api: KubeApi) -> None:
        self._api = api
        self._sent: dict[str, tuple[str | None, bool]] = {}

    async def set_gate(self, pod: TritonPod, verdict: Verdict, now: float) -> str | None:
        """Set the pod's condition as the verdict says; the reason it failed, in one line, or
        None."""
        # A second look at the pod before its new status arrives (a watch event, a tick)
        # sends the same condition again for nothing: skip what was last sent for this pod
        # and container start.
        key = pod.uid or f"{pod.namespace}/{pod.name}"
        sent = (pod.started_at, verdict.admit)
        if self._sent.get(key) == sent:
            return None
        path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/status"
        try:
            await self._api.patch(path, gate_patch(pod, verdict, now), JSON_PATCH)
        except ApiError as error:
            # 409/422: the pod changed since it was read; the next look tries again.
            return f"patching {pod.namespace}/{pod.name}'s status failed: {error}"
        self._sent[key] = sent
        return None

    def forget(self, uid: str) -> None:
        """Drop what was last sent to a pod that is gone (the memory holds live pods only)."""
        self._sent.pop(uid, None)
