"""LoadsInFlight alone: a load past its deadline is handed back and remembered until it ends.

The loads here are plain callables that block until the test lets them go; the real thing,
a Triton reload that hangs, is in tests/test_reload_timeout.py.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest

from tritonscale.triton.client import TritonError
from tritonscale.triton.loads import LoadsInFlight

DEADLINE_S = 0.2
WAIT_S = 10.0


def until(check, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_a_load_that_finishes_in_time_leaves_nothing_behind() -> None:
    loads = LoadsInFlight(deadline_s=WAIT_S)
    sent = []
    assert loads.run("pod-a", "m", "2 instances", lambda: sent.append(1)) is None
    assert sent == [1]
    assert loads.in_flight("pod-a", "m") is None


def test_a_refused_load_is_raised_to_the_caller() -> None:
    loads = LoadsInFlight(deadline_s=WAIT_S)

    def refused() -> None:
        raise TritonError("pod-a", "Triton refused to load m: no")

    with pytest.raises(TritonError, match="pod-a: Triton refused to load m"):
        loads.run("pod-a", "m", "2 instances", refused)
    assert loads.in_flight("pod-a", "m") is None


def test_a_load_past_its_deadline_is_in_flight_until_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loads = LoadsInFlight(deadline_s=DEADLINE_S)
    release = threading.Event()
    sent = []

    def hangs() -> None:
        sent.append("first")
        assert release.wait(WAIT_S), "never released"

    late = loads.run("pod-a", "m", "2 instances", hangs)
    assert late is not None and not release.is_set()  # it returned while the load hung
    assert (late.pod, late.model, late.what, late.deadline_s) == ("pod-a", "m", "2 instances", 0.2)
    assert loads.in_flight("pod-a", "m") == late
    # Other pods and other models are not held.
    assert loads.in_flight("pod-b", "m") is None and loads.in_flight("pod-a", "other") is None
    assert loads.run("pod-b", "m", "2 instances", lambda: sent.append("pod-b")) is None

    # A second load to the same pod is not sent: the first is handed back.
    assert loads.run("pod-a", "m", "3 instances", lambda: sent.append("second")) == late
    assert sent == ["first", "pod-b"]

    caplog.set_level(logging.WARNING)
    release.set()
    until(lambda: loads.in_flight("pod-a", "m") is None, "the released load to end")
    until(lambda: "past its deadline of 0.2 s" in caplog.text, "the late load's log line")
    assert "pod-a: the load of m (2 instances) finished" in caplog.text
    assert loads.run("pod-a", "m", "3 instances", lambda: sent.append("third")) is None
    assert sent == ["first", "pod-b", "third"]


def test_a_late_failure_is_logged_with_its_reason(caplog: pytest.LogCaptureFixture) -> None:
    loads = LoadsInFlight(deadline_s=DEADLINE_S)
    release = threading.Event()

    def hangs_then_fails() -> None:
        release.wait(WAIT_S)
        raise TritonError("pod-a", "Triton refused to load m: out of memory")

    caplog.set_level(logging.WARNING)
    assert loads.run("pod-a", "m", "2 instances", hangs_then_fails) is not None
    release.set()
    until(lambda: loads.in_flight("pod-a", "m") is None, "the failed load to end")
    until(lambda: "failed: Triton refused" in caplog.text, "the late failure's log line")


@pytest.mark.parametrize("deadline_s", [0, -1])
def test_a_deadline_must_be_positive(deadline_s: float) -> None:
    with pytest.raises(ValueError, match="the load deadline must be > 0 s"):
        LoadsInFlight(deadline_s=deadline_s)
