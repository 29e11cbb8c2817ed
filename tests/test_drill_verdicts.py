"""How a drill with a stated bound judges its failed requests (hack.drills): only failures
inside the window Kubernetes cannot avoid are allowed, and the count outside is reported;
and how a drill counts the requests in flight inside a pod when its Triton process ended."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hack.drills.harness import Drills, Record, Settings, count_in_flight, tritonserver_exits
from hack.drills.oom import _ready_while_gate_closed
from hack.drills.runner import _outside_window
from tests.waiting import wait_for
from tritonscale.drivers.pods import INSTANCES_READY

unit = pytest.mark.unit


def failed_at(*starts: float) -> list[dict[str, float]]:
    return [{"start": start} for start in starts]


@unit
def test_failures_inside_the_window_are_allowed_and_counted_as_none_outside() -> None:
    record = Record("apiserver", detail={"failure_window": [100.0, 108.0]})
    assert _outside_window(record, failed_at(100.5, 104.0, 108.0)) == []
    assert record.detail == {"failed_outside_window": 0}


@unit
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


@unit
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


@unit
def test_a_pod_left_ready_with_its_gate_closed_is_reported_unended() -> None:
    changes = [(100.3, pod_at(0, "True", "True")), (112.0, pod_at(1, "False", "True"))]
    found = _ready_while_gate_closed(changes, [], restarts=0, start=100.0)
    assert found["ready_while_gate_closed"] == [] and found["ready_while_gate_closed_unended"]


# ---- the requests in flight when a Triton process ended --------------------------------

EXIT = 110.0  # the moment the killed pod's tritonserver ended


def logged(start: float, ms: float, error: str | None = "Stream removed") -> dict[str, Any]:
    return {"start": start, "ms": ms, "error": error}


@dataclass(frozen=True)
class InFlightCase:
    request: dict[str, Any]
    in_flight: bool
    open_then: bool


IN_FLIGHT_CASES = {
    "a request open on the pod when its process ended fails: in flight": InFlightCase(
        logged(109.8, 300), in_flight=True, open_then=True
    ),
    "a request open on another pod then is answered: open, not in flight": InFlightCase(
        logged(109.8, 300, error=None), in_flight=False, open_then=True
    ),
    # The kernel closes the sockets before the exit is reported: the client saw it first.
    "a failure seen 0.3 s before the exit was reported: in flight": InFlightCase(
        logged(109.5, 200), in_flight=True, open_then=False
    ),
    "a failure 5 s before the exit: not in flight": InFlightCase(
        logged(104.0, 100), in_flight=False, open_then=False
    ),
    "a request sent after the process had ended (refused): not in flight": InFlightCase(
        logged(110.4, 2), in_flight=False, open_then=False
    ),
}


@unit
@pytest.mark.parametrize("case", IN_FLIGHT_CASES.values(), ids=IN_FLIGHT_CASES.keys())
def test_a_request_is_in_flight_when_it_was_open_as_the_process_ended(case: InFlightCase) -> None:
    record = Record("oom", requests_failed=1 if case.request["error"] else 0)
    found = count_in_flight(record, [case.request], {"triton-a": EXIT}, start=100.0, end=130.0)
    assert found == ([case.request] if case.in_flight else [])
    assert record.requests_in_flight_at_fault == int(case.in_flight)
    assert record.detail["requests_open_at_fault"] == int(case.open_then)
    assert record.detail["tritonserver_ended_after_s"] == {"triton-a": 10.0}
    assert record.detail["failed_not_in_flight"] == record.requests_failed - int(case.in_flight)


@unit
def test_only_the_drills_requests_count_and_every_ended_process_is_a_moment() -> None:
    requests = [
        logged(99.9, 200),  # open when the drill began: not the drill's
        logged(109.9, 200),  # in flight on triton-a
        logged(120.0, 500),  # in flight on triton-b, drained with it still open
        logged(125.0, 10),  # refused after both had ended
    ]
    record = Record("rollout", requests_failed=3)
    ended = {"triton-b": 120.3, "triton-a": EXIT}
    assert count_in_flight(record, requests, ended, start=100.0, end=130.0) == requests[1:3]
    assert record.requests_in_flight_at_fault == 2
    assert record.detail["failed_not_in_flight"] == 1
    # In the order they ended.
    assert list(record.detail["tritonserver_ended_after_s"]) == ["triton-a", "triton-b"]


@unit
def test_no_process_ended_leaves_the_in_flight_count_unknown() -> None:
    record = Record("failover")
    assert count_in_flight(record, [logged(105.0, 3)], {}, start=100.0, end=130.0) == []
    assert record.requests_in_flight_at_fault is None
    assert record.detail == {"tritonserver_ended_after_s": {}}


class OneProcessPods:
    """The part of `Drills` that tritonserver_exits reads: one pod whose tritonserver is
    a process of this test's."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def pods(self, selector: str) -> list[dict[str, Any]]:
        return [{"metadata": {"name": "triton-a"}}, {"metadata": {"name": "triton-pending"}}]

    def container_pid(self, pod: dict[str, Any], container: str) -> int:
        if pod["metadata"]["name"] == "triton-pending":
            raise KeyError("tritonserver")  # no container running yet: nothing to watch
        return self.pid


def test_the_moment_a_watched_process_ends_is_noted_by_its_pod() -> None:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        with tritonserver_exits(OneProcessPods(process.pid)) as ended:  # type: ignore[arg-type]
            assert ended == {}
            killed = time.time()
            process.kill()
            wait_for(lambda: "triton-a" in ended, "the watch noting the end of triton-a's process")
        process.wait()
        assert set(ended) == {"triton-a"}
        assert ended["triton-a"] >= killed
    finally:
        process.kill()
        process.wait()


class _Events:
    """A kubectl that answers `get events` with what the operators posted."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events
        self.asked: list[tuple[str, ...]] = []

    def items(self, *args: str) -> list[dict[str, Any]]:
        self.asked.append(args)
        return self.events


@unit
def test_a_drill_counts_the_reload_timeouts_posted_with_their_repeats(tmp_path: Path) -> None:
    kubectl = _Events([{"count": 3}, {}, {"count": 1}])
    drills = Drills(kubectl, tmp_path, Settings.quick(), namespace="ns")  # type: ignore[arg-type]
    assert drills.reload_timeouts() == 5
    [asked] = kubectl.asked
    assert asked == ("events", "-n", "ns", "--field-selector", "reason=ReloadTimeout")
