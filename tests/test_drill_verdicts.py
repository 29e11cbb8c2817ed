"""How a drill with a stated bound judges its failed requests (hack.drills): only failures
inside the window Kubernetes cannot avoid are allowed, and the count outside is reported."""

from __future__ import annotations

import pytest

from hack.drills.harness import Record
from hack.drills.oom import _ready_while_gate_closed
from hack.drills.runner import _outside_window
from tritonscale.drivers.pods import INSTANCES_READY

pytestmark = pytest.mark.unit


def failed_at(*starts: float) -> list[dict[str, float]]:
    return [{"start": start} for start in starts]


def test_failures_inside_the_window_are_allowed_and_counted_as_none_outside() -> None:
    record = Record("apiserver", detail={"failure_window": [100.0, 108.0]})
    assert _outside_window(record, failed_at(100.5, 104.0, 108.0)) == []
    assert record.detail == {"failed_outside_window": 0}


def test_a_failure_before_or_after_the_window_is_outside() -> None:
    record = Record("oom", detail={"failure_window": [100.0, 108.0]})
    # A second of slack before the window: the request began just before the sample that
    # saw the endpoints go.
    outside = _outside_window(record, failed_at(98.5, 99.5, 108.5))
    assert outside == failed_at(98.5, 108.5)
    assert record.detail["failed_outside_window"] == 2


def pod_at(restarts: int, gate: str, ready: str) -> dict:
    conditions = [{"type": INSTANCES_READY, "status": gate}, {"type": "Ready", "status": ready}]
    return {"status": {"containerStatuses": [{"restartCount": restarts}], "conditions": conditions}}


def test_the_oom_drill_times_each_moment_the_pod_was_ready_with_its_gate_closed() -> None:
    """The watch of a restart as seen on the node: the gate closes as the container stops,
    the kubelet sets Ready for 0.75 s with the gate still closed, the operator opens it."""
    changes = [
        (100.3, pod_at(0, "True", "True")),  # before the kill
        (111.0, pod_at(0, "True", "False")),  # the container died
        (111.2, pod_at(0, "False", "False")),  # the operator closed the gate
        (111.9, pod_at(1, "False", "False")),  # restarted
        (125.4, pod_at(1, "False", "True")),  # the kubelet's moment
        (126.1, pod_at(1, "False", "False")),
        (126.5, pod_at(1, "True", "False")),  # admitted
        (128.0, pod_at(1, "True", "True")),
    ]
    found = _ready_while_gate_closed(changes, [], restarts=0, start=100.0)
    assert found["gate_closed_after_s"] == 11.2 and found["gate_reopened_after_s"] == 26.5
    assert found["container_restarted_after_s"] == 11.9
    assert found["ready_while_gate_closed"] == [(25.4, 0.7)]
    assert found["ready_while_gate_closed_max_s"] == 0.7
    assert not found["ready_while_gate_closed_unended"]


def test_a_pod_left_ready_with_its_gate_closed_is_reported_unended() -> None:
    changes = [(100.3, pod_at(0, "True", "True")), (112.0, pod_at(1, "False", "True"))]
    found = _ready_while_gate_closed(changes, [], restarts=0, start=100.0)
    assert found["ready_while_gate_closed"] == [] and found["ready_while_gate_closed_unended"]
