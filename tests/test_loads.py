"""LoadsInFlight alone: a load past its deadline is handed back and remembered until it ends.

The loads here are plain coroutines that wait until the test lets them go; the real thing,
a Triton reload that hangs, is in tests/test_reload_timeout.py.
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from tritonscale.triton.client import TritonError
from tritonscale.triton.loads import CHANGES_KEPT_S, LoadsInFlight

DEADLINE_S = 0.2
WAIT_S = 10.0


async def until(check, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def appends(sent: list[object], value: object):
    async def send() -> None:
        sent.append(value)

    return send


async def test_a_load_that_finishes_in_time_leaves_nothing_behind() -> None:
    loads = LoadsInFlight(deadline_s=WAIT_S)
    sent: list[object] = []
    assert await loads.run("pod-a", "m", "2 instances", appends(sent, 1)) is None
    assert sent == [1]
    assert loads.in_flight("pod-a", "m") is None


async def test_a_refused_load_is_raised_to_the_caller() -> None:
    loads = LoadsInFlight(deadline_s=WAIT_S)

    async def refused() -> None:
        raise TritonError("pod-a", "Triton refused to load m: no")

    with pytest.raises(TritonError, match="pod-a: Triton refused to load m"):
        await loads.run("pod-a", "m", "2 instances", refused)
    assert loads.in_flight("pod-a", "m") is None


async def test_a_load_past_its_deadline_is_in_flight_until_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loads = LoadsInFlight(deadline_s=DEADLINE_S)
    release = asyncio.Event()
    sent: list[object] = []

    async def hangs() -> None:
        sent.append("first")
        await asyncio.wait_for(release.wait(), WAIT_S)

    late = await loads.run("pod-a", "m", "2 instances", hangs)
    assert late is not None and not release.is_set()  # it returned while the load hung
    assert (late.pod, late.model, late.what, late.deadline_s) == ("pod-a", "m", "2 instances", 0.2)
    assert loads.in_flight("pod-a", "m") == late
    # Other pods and other models are not held.
    assert loads.in_flight("pod-b", "m") is None and loads.in_flight("pod-a", "other") is None
    assert await loads.run("pod-b", "m", "2 instances", appends(sent, "pod-b")) is None

    # A second load to the same pod is not sent: the first is handed back.
    assert await loads.run("pod-a", "m", "3 instances", appends(sent, "second")) == late
    assert sent == ["first", "pod-b"]

    caplog.set_level(logging.WARNING)
    release.set()
    await until(lambda: loads.in_flight("pod-a", "m") is None, "the released load to end")
    await until(lambda: "past its deadline of 0.2 s" in caplog.text, "the late load's log line")
    assert "pod-a: the load of m (2 instances) finished" in caplog.text
    assert await loads.run("pod-a", "m", "3 instances", appends(sent, "third")) is None
    assert sent == ["first", "pod-b", "third"]


async def test_the_end_of_a_late_load_is_told_and_a_load_in_time_is_not() -> None:
    loads = LoadsInFlight(deadline_s=DEADLINE_S)
    ended: list[tuple[str, str]] = []
    loads.on_late_end(lambda pod, model: ended.append((pod, model)))
    release = asyncio.Event()

    async def hangs() -> None:
        await asyncio.wait_for(release.wait(), WAIT_S)

    assert await loads.run("pod-a", "m", "2 instances", appends([], 1)) is None
    assert await loads.run("pod-b", "m", "2 instances", hangs) is not None
    assert ended == []  # nobody waits for the in-time load's end; the late one goes on
    release.set()
    await until(lambda: ended == [("pod-b", "m")], "the late load's end to be told")


async def test_a_late_failure_is_logged_with_its_reason(caplog: pytest.LogCaptureFixture) -> None:
    loads = LoadsInFlight(deadline_s=DEADLINE_S)
    release = asyncio.Event()

    async def hangs_then_fails() -> None:
        await asyncio.wait_for(release.wait(), WAIT_S)
        raise TritonError("pod-a", "Triton refused to load m: out of memory")

    caplog.set_level(logging.WARNING)
    assert await loads.run("pod-a", "m", "2 instances", hangs_then_fails) is not None
    release.set()
    await until(lambda: loads.in_flight("pod-a", "m") is None, "the failed load to end")
    await until(lambda: "failed: Triton refused" in caplog.text, "the late failure's log line")


async def test_a_caller_cancelled_while_waiting_leaves_the_load_in_flight() -> None:
    loads = LoadsInFlight(deadline_s=WAIT_S)
    release = asyncio.Event()
    sent = asyncio.Event()

    async def hangs() -> None:
        sent.set()
        await asyncio.wait_for(release.wait(), WAIT_S)

    caller = asyncio.ensure_future(loads.run("pod-a", "m", "2 instances", hangs))
    # The load's task first runs once its caller waits on it: cancelled after that, the
    # caller is cancelled while waiting.
    await until(sent.is_set, "the load to be sent")
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    # The load was not cancelled with its caller: Triton still works on it.
    assert loads.in_flight("pod-a", "m") is not None
    release.set()
    await until(lambda: loads.in_flight("pod-a", "m") is None, "the load to end")


@pytest.mark.parametrize("deadline_s", [0, -1])
def test_a_deadline_must_be_positive(deadline_s: float) -> None:
    with pytest.raises(ValueError, match="the load deadline must be > 0 s"):
        LoadsInFlight(deadline_s=deadline_s)


async def test_a_load_marks_when_the_count_may_have_moved_and_old_marks_go() -> None:
    now = [0.0]
    loads = LoadsInFlight(deadline_s=5, clock=lambda: now[0])
    assert loads.changed_at("pod-a", "m") is None
    release = asyncio.Event()

    async def send() -> None:
        await release.wait()

    now[0] = 10.0
    waiting = asyncio.ensure_future(loads.run("pod-a", "m", "2 instances", send))
    await asyncio.sleep(0)
    assert loads.changed_at("pod-a", "m") == 10.0  # sent
    now[0] = 12.0
    release.set()
    assert await waiting is None
    assert loads.changed_at("pod-a", "m") == 12.0  # ended
    assert loads.changed_at("pod-a", "other") is None
    # An hour on, a load elsewhere drops the marks of pods nobody loaded since.
    now[0] = 12.0 + CHANGES_KEPT_S + 1
    assert await loads.run("pod-b", "m", "1 instance", appends([], 1)) is None
    assert loads.changed_at("pod-a", "m") is None
    assert loads.changed_at("pod-b", "m") == now[0]


async def test_a_read_may_have_changed_after_a_restart_its_own_load_or_its_age() -> None:
    now = [100.0]
    loads = LoadsInFlight(deadline_s=5, clock=lambda: now[0])
    start = "2026-12-02T04:00:00Z"

    def stale(read, started_at: str | None = start) -> bool:
        return loads.may_have_changed("pod-a", "m", read, started_at, 60)

    assert stale(None)  # nothing read yet
    read = loads.read_began(start)
    assert not stale(read)
    assert stale(read, None)  # the pod's start unknown (no Kubernetes)
    assert stale(read, "2026-12-02T04:05:00Z")  # its containers restarted
    now[0] = 159.9
    assert not stale(read)
    now[0] = 160.0
    assert stale(read)  # its age

    now[0] = 120.0
    assert await loads.run("pod-b", "m", "2 instances", appends([], 1)) is None
    assert await loads.run("pod-a", "other", "2 instances", appends([], 1)) is None
    assert not stale(read)  # another pod's load, another model's
    assert await loads.run("pod-a", "m", "2 instances", appends([], 1)) is None
    assert stale(read)  # a load of the model to the pod since the read began
    now[0] = 121.0
    assert not stale(loads.read_began(start))  # a read begun after it
