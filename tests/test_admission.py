"""Pods join at the right size: who may open the readinessGate tritonscale.io/instances-ready,
and the patch that opens it (tritonscale.drivers.admission)."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from tests.test_operator_pods import pod_body
from tritonscale.core.spec import AutoscalerSpec, LabelSelector
from tritonscale.drivers.admission import (
    CONTAINER_RESTARTED,
    INSTANCES_MATCH,
    INSTANCES_PENDING,
    NO_AUTOSCALER,
    Autoscaler,
    PodStatusWriter,
    gate_patch,
    judge,
    restarted,
)
from tritonscale.drivers.pods import (
    INSTANCES_READY,
    TritonPod,
    ready_endpoints,
    restarted_behind_open_gate,
)

pytestmark = pytest.mark.unit

TRITON = LabelSelector.from_dict({"matchLabels": {"app.kubernetes.io/component": "triton"}})
OTHER = LabelSelector.from_dict({"matchLabels": {"app.kubernetes.io/component": "other"}})
NOW = 1_800_000_000.0


def gated_body(gate: str | None = None, containers_ready: str = "True") -> dict[str, Any]:
    """A Triton pod with the gate: Triton answers (ContainersReady), the pod is not Ready."""
    body = pod_body(ready="False")
    body["spec"]["readinessGates"] = [{"conditionType": INSTANCES_READY}]
    conditions = body["status"]["conditions"]
    conditions.append({"type": "ContainersReady", "status": containers_ready})
    if gate is not None:
        conditions.append({"type": INSTANCES_READY, "status": gate})
    return body


def scaler(
    name: str, model: str, desired: int | None, acting: bool = True, selector: Any = TRITON
) -> Autoscaler:
    return Autoscaler(name, model, selector, desired, acting)


class TestWaiting:
    def test_a_gated_pod_that_serves_waits_and_is_not_ready(self) -> None:
        pod = TritonPod.from_body(gated_body())
        assert pod.gated and pod.serving and not pod.ready
        assert pod.waiting_for_instances
        assert pod.gate_condition is None

    def test_an_open_gate_is_not_waited_for_again(self) -> None:
        pod = TritonPod.from_body(gated_body(gate="True"))
        assert pod.gate_open and not pod.waiting_for_instances

    def test_a_pod_whose_triton_does_not_answer_yet_is_not_waiting(self) -> None:
        assert not TritonPod.from_body(gated_body(containers_ready="False")).waiting_for_instances

    def test_a_pod_without_the_gate_never_waits(self) -> None:
        pod = TritonPod.from_body(pod_body())
        assert not pod.gated and not pod.waiting_for_instances

    def test_a_waiting_pod_is_not_measured_as_a_ready_one(self) -> None:
        # It takes no traffic yet: its idle counters must not dilute the signals.
        assert ready_endpoints([TritonPod.from_body(gated_body())], TRITON) == []


# (name, autoscalers, the pod's live counts, admitted, reason)
CASES = [
    (
        "no autoscaler selects the pod: at once",
        [scaler("a", "m", 3, selector=OTHER)],
        {},
        True,
        NO_AUTOSCALER,
    ),
    ("its count matches the autoscaler's", [scaler("a", "m", 3)], {"m": 3}, True, INSTANCES_MATCH),
    ("one fewer waits", [scaler("a", "m", 3)], {"m": 2}, False, INSTANCES_PENDING),
    ("one more waits", [scaler("a", "m", 3)], {"m": 4}, False, INSTANCES_PENDING),
    ("a count it cannot read waits", [scaler("a", "m", 3)], {"m": None}, False, INSTANCES_PENDING),
    (
        "every autoscaler that selects it must match",
        [scaler("a", "m", 3), scaler("b", "n", 2)],
        {"m": 3, "n": 1},
        False,
        INSTANCES_PENDING,
    ),
    (
        "all of them matching admits it",
        [scaler("a", "m", 3), scaler("b", "n", 2)],
        {"m": 3, "n": 2},
        True,
        INSTANCES_MATCH,
    ),
    (
        "an autoscaler of other pods has no say",
        [scaler("a", "m", 3), scaler("b", "n", 2, selector=OTHER)],
        {"m": 3, "n": 1},
        True,
        INSTANCES_MATCH,
    ),
    (
        "a paused or dry-running autoscaler brings no count to wait for",
        [scaler("a", "m", 3, acting=False)],
        {"m": 1},
        True,
        INSTANCES_MATCH,
    ),
    (
        "an autoscaler that has decided nothing yet (a new release's first pod)",
        [scaler("a", "m", None)],
        {"m": 1},
        True,
        INSTANCES_MATCH,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_who_may_join(case: tuple[Any, ...]) -> None:
    _, autoscalers, live, admitted, reason = case
    verdict = judge(TritonPod.from_body(gated_body()), autoscalers, live)
    assert (verdict.admit, verdict.reason) == (admitted, reason), verdict.message
    assert "\n" not in verdict.message


def test_a_waiting_pod_says_what_it_waits_for() -> None:
    verdict = judge(TritonPod.from_body(gated_body()), [scaler("a", "m", 3)], {"m": 1})
    assert verdict.message == "triton-0 waits: m 1, a wants 3"


def test_an_autoscaler_reads_from_its_spec() -> None:
    spec = {"selector": {"matchLabels": {"app": "triton"}}, "model": "m", "dryRun": True}
    found = Autoscaler.of("a", AutoscalerSpec.from_dict(spec), 3)
    assert (found.model, found.desired, found.acting) == ("m", 3, False)


class TestGatePatch:
    """The patch, applied as the API server applies a JSON patch, touches our condition only."""

    def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        pod = TritonPod.from_body(body)
        verdict = judge(pod, [], {})
        return jsonpatch.apply_patch(copy.deepcopy(body), gate_patch(pod, verdict, NOW))

    def test_it_adds_the_condition_beside_the_kubelets(self) -> None:
        body = gated_body()
        after = self.apply(body)["status"]["conditions"]
        assert after[:-1] == body["status"]["conditions"]
        assert after[-1] == {
            "type": INSTANCES_READY,
            "status": "True",
            "reason": NO_AUTOSCALER,
            "message": "no autoscaler selects triton-0",
            "lastTransitionTime": "2027-01-15T08:00:00Z",
        }

    def test_it_replaces_a_false_condition_in_place(self) -> None:
        body = gated_body(gate="False")
        after = self.apply(body)["status"]["conditions"]
        assert len(after) == len(body["status"]["conditions"])
        assert [c["status"] for c in after if c["type"] == INSTANCES_READY] == ["True"]

    def test_a_list_that_changed_since_the_read_is_refused_not_overwritten(self) -> None:
        body = gated_body(gate="False")
        pod = TritonPod.from_body(body)
        body["status"]["conditions"].insert(0, {"type": "PodScheduled", "status": "True"})
        with pytest.raises(jsonpatch.JsonPatchTestFailed):
            jsonpatch.apply_patch(body, gate_patch(pod, judge(pod, [], {}), NOW))

    def test_it_applies_to_the_pod_as_it_was_read_or_not_at_all(self) -> None:
        body = gated_body()
        body["metadata"]["resourceVersion"] = "41"
        pod = TritonPod.from_body(body)
        body["metadata"]["resourceVersion"] = "42"  # the kubelet wrote in between
        with pytest.raises(jsonpatch.JsonPatchTestFailed):
            jsonpatch.apply_patch(body, gate_patch(pod, judge(pod, [], {}), NOW))


def restarted_body(gate_set_at: str, container_started_at: str) -> dict[str, Any]:
    """An admitted pod (gate True since `gate_set_at`) whose container started at
    `container_started_at`."""
    body = gated_body(gate="True")
    for condition in body["status"]["conditions"]:
        if condition["type"] == INSTANCES_READY:
            condition["lastTransitionTime"] = gate_set_at
    body["status"]["containerStatuses"] = [
        {"name": "tritonserver", "state": {"running": {"startedAt": container_started_at}}}
    ]
    return body


class TestARestartedContainer:
    """A container that restarted after the gate opened runs the repository's counts again:
    the gate no longer holds, and the operator closes it until the pod is admitted again."""

    def test_a_container_started_before_the_gate_opened_keeps_it_open(self) -> None:
        body = restarted_body("2027-01-15T07:00:10Z", "2027-01-15T07:00:00Z")
        pod = TritonPod.from_body(body)
        assert pod.gate_open and not pod.gate_stale and not pod.waiting_for_instances
        assert not restarted_behind_open_gate(body)

    def test_a_container_started_after_it_makes_the_gate_stale_and_the_pod_wait(self) -> None:
        body = restarted_body("2027-01-15T07:00:10Z", "2027-01-15T07:05:00Z")
        pod = TritonPod.from_body(body)
        assert pod.gate_stale and not pod.gate_open
        assert pod.started_at == "2027-01-15T07:05:00Z"
        assert restarted_behind_open_gate(body)
        assert pod.waiting_for_instances  # the admit daemons bring it back

    def test_the_latest_container_start_counts(self) -> None:
        body = restarted_body("2027-01-15T07:00:10Z", "2027-01-15T07:00:00Z")
        body["status"]["containerStatuses"].append(
            {"name": "sidecar", "state": {"running": {"startedAt": "2027-01-15T07:30:00Z"}}}
        )
        assert restarted_behind_open_gate(body)

    def test_a_container_that_stopped_after_it_closes_it_before_the_next_starts(self) -> None:
        body = restarted_body("2027-01-15T07:00:10Z", "2027-01-15T07:00:00Z")
        body["status"]["containerStatuses"][0]["state"] = {
            "terminated": {"reason": "OOMKilled", "finishedAt": "2027-01-15T07:04:59Z"}
        }
        pod = TritonPod.from_body(body)
        assert restarted_behind_open_gate(body) and pod.gate_stale
        assert pod.stopped_at == "2027-01-15T07:04:59Z"
        assert "stopped at 2027-01-15T07:04:59Z" in restarted(pod).message

    def test_a_container_waiting_to_restart_closes_it_by_its_last_state(self) -> None:
        body = restarted_body("2027-01-15T07:00:10Z", "2027-01-15T07:00:00Z")
        container = body["status"]["containerStatuses"][0]
        container["state"] = {"waiting": {"reason": "CrashLoopBackOff"}}
        container["lastState"] = {"terminated": {"finishedAt": "2027-01-15T07:04:59Z"}}
        assert restarted_behind_open_gate(body)

    def test_a_container_that_stopped_before_the_gate_opened_keeps_it_open(self) -> None:
        body = restarted_body("2027-01-15T07:00:10Z", "2027-01-15T07:00:00Z")
        body["status"]["containerStatuses"][0]["lastState"] = {
            "terminated": {"finishedAt": "2027-01-15T06:59:58Z"}
        }
        assert not restarted_behind_open_gate(body)
        assert TritonPod.from_body(body).gate_open

    def test_a_container_not_running_yet_closes_nothing(self) -> None:
        body = restarted_body("2027-01-15T07:00:10Z", "2027-01-15T07:05:00Z")
        body["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "CrashLoop"}}
        assert not restarted_behind_open_gate(body)
        assert TritonPod.from_body(body).gate_open

    def test_a_pod_being_deleted_is_left_alone(self) -> None:
        body = restarted_body("2027-01-15T07:00:10Z", "2027-01-15T07:05:00Z")
        body["metadata"]["deletionTimestamp"] = "2027-01-15T07:06:00Z"
        assert not restarted_behind_open_gate(body)

    def test_the_patch_sets_the_condition_false_in_place_and_says_why(self) -> None:
        body = restarted_body("2027-01-15T07:00:10Z", "2027-01-15T07:05:00Z")
        pod = TritonPod.from_body(body)
        after = jsonpatch.apply_patch(copy.deepcopy(body), gate_patch(pod, restarted(pod), NOW))
        (gate,) = [c for c in after["status"]["conditions"] if c["type"] == INSTANCES_READY]
        assert gate["status"] == "False" and gate["reason"] == CONTAINER_RESTARTED
        assert gate["message"] == restarted(pod).message
        assert len(after["status"]["conditions"]) == len(body["status"]["conditions"])

    def test_once_closed_and_admitted_again_the_gate_holds(self) -> None:
        body = restarted_body("2027-01-15T07:00:10Z", "2027-01-15T07:05:00Z")
        pod = TritonPod.from_body(body)
        closed = jsonpatch.apply_patch(copy.deepcopy(body), gate_patch(pod, restarted(pod), NOW))
        assert TritonPod.from_body(closed).waiting_for_instances
        # Admitted again after the restart (NOW, 08:00, is later than the container's start).
        reopened_pod = TritonPod.from_body(closed)
        verdict = judge(reopened_pod, [], {})
        reopened = jsonpatch.apply_patch(closed, gate_patch(reopened_pod, verdict, NOW))
        assert TritonPod.from_body(reopened).gate_open
        assert not restarted_behind_open_gate(reopened)


class RecordingApi:
    """The one call PodStatusWriter makes, recorded."""

    def __init__(self) -> None:
        self.patched: list[str] = []

    async def patch(self, path: str, body: Any, content_type: str) -> dict[str, Any]:
        self.patched.append(path.split("/pods/")[1].removesuffix("/status"))
        return {}


class TestPodStatusWriter:
    """The writer skips a condition it already sent for the pod's container start, and holds
    memory for live pods only."""

    def writer(self) -> tuple[PodStatusWriter, RecordingApi]:
        api = RecordingApi()
        return PodStatusWriter(api), api  # type: ignore[arg-type]

    async def test_a_repeat_is_skipped_and_a_new_container_start_is_sent(self) -> None:
        writer, api = self.writer()
        body = restarted_body("2027-01-15T07:00:10Z", "2027-01-15T07:05:00Z")
        body["metadata"]["uid"] = "uid-1"
        pod = TritonPod.from_body(body)
        assert await writer.set_gate(pod, restarted(pod), NOW) is None
        assert await writer.set_gate(pod, restarted(pod), NOW) is None
        assert len(api.patched) == 1
        body["status"]["containerStatuses"][0]["state"]["running"]["startedAt"] = (
            "2027-01-15T07:09:00Z"
        )
        again = TritonPod.from_body(body)
        await writer.set_gate(again, restarted(again), NOW)
        assert len(api.patched) == 2

    async def test_a_forgotten_pod_is_sent_again(self) -> None:
        writer, api = self.writer()
        body = restarted_body("2027-01-15T07:00:10Z", "2027-01-15T07:05:00Z")
        body["metadata"]["uid"] = "uid-2"
        pod = TritonPod.from_body(body)
        await writer.set_gate(pod, restarted(pod), NOW)
        writer.forget("uid-2")
        writer.forget("never-seen")  # a pod it never wrote to: nothing to drop
        await writer.set_gate(pod, restarted(pod), NOW)
        assert len(api.patched) == 2
