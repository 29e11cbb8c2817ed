"""What the Kubernetes driver writes about each autoscaler: its status and its events.

A set's tick (tritonscale.control.set_tick) gives one `TickResult` per member; the driver
writes each member's status (`StatusWriter`, a merge patch of the status subresource,
awaited on kopf's event loop) and its events (`post_events`). Status is written when its
content changed (a count, a condition, the decision's direction or reason, a condition's
status or reason, the budget, the set). What changes at every tick by the passing of time
alone (the measured signals, the policy's history, the messages with their numbers,
`lastTickTime`) goes with such a write, or once a minute as a heartbeat (`changed`): a fleet
at steady state costs the API server one write per autoscaler a minute, and a restarted
operator still finds the policy's history at most a minute old.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import kopf

from tritonscale.control.tick import FAILED_RESCALE, RELOAD_TIMEOUT, TickResult, parse_iso_time
from tritonscale.core.budget import BUDGET_EXHAUSTED
from tritonscale.core.latency import LatencyPrediction
from tritonscale.drivers.kube_api import ApiError, KubeApi

GROUP, VERSION, PLURAL = "tritonscale.io", "v1alpha1", "instancegroupautoscalers"
# The Warning event's reason where no split within the budget meets a latency objective.
LATENCY_OBJECTIVE_UNMET = "LatencyObjectiveUnmet"
KIND = "InstanceGroupAutoscaler"
# The status field that says when the last tick ran, and how often the fields that change
# with time alone are worth a write of their own.
HEARTBEAT = "lastTickTime"
HEARTBEAT_S = 60.0
# Fields that change at every tick with time alone (rates move, the history grows).
_VOLATILE = frozenset({HEARTBEAT, "observedMetrics", "policyState", "prediction", "latency"})


class StatusWriter:
    """Merge-patches an autoscaler's status subresource (tritonscale.drivers.kube_api)."""

    def __init__(self, api: KubeApi) -> None:
        self._api = api

    async def patch(self, namespace: str, name: str, status: Mapping[str, Any]) -> str | None:
        """Write the fields of `status`; the reason it failed, in one line, or None."""
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}/status"
        try:
            await self._api.patch(path, {"status": dict(status)})
        except ApiError as error:
            return f"patching {namespace}/{name}'s status failed: {error}"
        return None


def changed(status: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of `new` to write over `status`: nothing when only what moves with time
    changed and the last write is younger than `HEARTBEAT_S`; else every field that differs."""
    # `status` is what the API server kept of the last write, `new` what the tick made: compare
    # them as stored, or a field whose value holds a null (a merge patch deletes the key) would
    # differ at every tick and be written at every tick.
    differing = {
        key: value for key, value in new.items() if _stored(status.get(key)) != _stored(value)
    }
    if any(
        _content(key, _stored(status.get(key))) != _content(key, _stored(value))
        for key, value in differing.items()
    ):
        return differing
    before, now = status.get(HEARTBEAT), new.get(HEARTBEAT)
    written = parse_iso_time(before) if isinstance(before, str) else None
    at = parse_iso_time(now) if isinstance(now, str) else None
    if written is None or at is None or at - written >= HEARTBEAT_S:
        return differing
    return {}


def _stored(value: Any) -> Any:
    """`value` as the API server keeps it from a merge patch: objects without their null
    members (a null deletes the key), sequences as lists."""
    if isinstance(value, Mapping):
        return {key: _stored(item) for key, item in value.items() if item is not None}
    if isinstance(value, (list, tuple)):
        return [_stored(item) for item in value]
    return value


def _content(key: str, value: Any) -> Any:
    """What of a status field is content, not the passing of time."""
    if key in _VOLATILE:
        return None
    # Messages carry the numbers of the moment; the direction, status and reason are the news.
    if key == "lastDecision" and isinstance(value, Mapping):
        return (value.get("direction"), value.get("reason"))
    if key == "conditions" and isinstance(value, list):
        return [
            (c.get("type"), c.get("status"), c.get("reason"))
            for c in value
            if isinstance(c, Mapping)
        ]
    if key == "budget" and isinstance(value, Mapping):
        return {k: v for k, v in value.items() if k != "demandRatio"}
    return value


def reference(namespace: str, name: str, uid: str | None) -> dict[str, Any]:
    """The object an event is about, as kopf's posting reads it."""
    metadata = {"name": name, "namespace": namespace, **({"uid": uid} if uid else {})}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": metadata}


@dataclass
class Reported:
    """What one object's events last announced (kept per autoscaler by the driver)."""

    failing: frozenset[str] = frozenset()
    budget_exhausted: bool = False
    latency_unmet: bool = False


def latency_unmet_message(latency: LatencyPrediction) -> str:
    """The event's message: the objective against the prediction, and what is done instead."""
    return (
        f"no split within the budget meets the latency objective ({latency.describe}); the "
        "split that serves the most is chosen instead"
    )


def post_events(
    obj: Mapping[str, Any], result: TickResult, reported: Reported, logger: Any
) -> None:
    """A Normal event per change of count, a Warning per failure.

    A failure that persists (no pods, Prometheus down, a bad spec, a load still in flight)
    is reported when it starts, not on every tick: kopf's events are not aggregated as the
    kubelet's are, and a Warning every interval would flood the namespace's events. Each
    failed load, and each load that outlived its deadline, is new.
    """
    logger.debug(result.line())
    if result.applied_ok and result.decision is not None:
        kopf.info(obj, reason="SucceededRescale", message=result.decision.message)
        logger.info(result.line())
    previous: Collection[str] = reported.failing
    new_this_tick = {
        FAILED_RESCALE: any(not pod.ok and not pod.pending for pod in result.applied),
        RELOAD_TIMEOUT: any(pod.pending for pod in result.applied),
    }
    for error in result.errors:
        if error.reason not in previous or new_this_tick.get(error.reason, False):
            kopf.warn(obj, reason=error.reason, message=error.message)
            logger.warning(result.line())
    reported.failing = frozenset(error.reason for error in result.errors)
    # The budget refusing instances is a Warning when it starts: more pods are the answer.
    # The set planner fits its split to the budget and says so in ScalingLimited.
    limited = result.decision.scaling_limited if result.decision is not None else None
    exhausted = result.reason == BUDGET_EXHAUSTED or (
        limited is not None and limited.status and limited.reason == BUDGET_EXHAUSTED
    )
    if exhausted and not reported.budget_exhausted and result.decision is not None:
        kopf.warn(obj, reason=BUDGET_EXHAUSTED, message=result.decision.message)
        logger.warning(result.line())
    reported.budget_exhausted = exhausted
    # A latency objective that no split within the budget meets is a Warning when it starts.
    latency = result.decision.latency if result.decision is not None else None
    unmet = latency is not None and not latency.met
    if unmet and not reported.latency_unmet and latency is not None:
        kopf.warn(obj, reason=LATENCY_OBJECTIVE_UNMET, message=latency_unmet_message(latency))
        logger.warning(result.line())
    reported.latency_unmet = unmet
    # Healing results are events of their own; the Healer's back-off and attempt limit
    # bound how often a sick model can post one.
    for healing in result.healing_actions:
        if healing.event_type == "Normal":
            kopf.info(obj, reason=healing.reason, message=healing.message)
        else:
            kopf.warn(obj, reason=healing.reason, message=healing.message)
        logger.warning(healing.message)
