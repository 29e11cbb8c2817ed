"""The control loop's schedule (tritonscale.control.loop) on a fake clock."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from tritonscale.control.loop import Stop, every

pytestmark = pytest.mark.unit


class FakeStop:
    """A stop signal whose `wait` moves the fake clock instead of sleeping."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []
        self.stopped = False

    def clock(self) -> float:
        return self.now

    def is_set(self) -> bool:
        return self.stopped

    async def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.waits.append(timeout)
        self.now += timeout
        return self.stopped


async def run(
    stop: FakeStop, members: Sequence[tuple[str, float]], wakes: int, tick_s: float = 0.0
) -> list[tuple[float, list[str]]]:
    seen = []
    async for due in every(stop, lambda: members, stop.clock):
        seen.append((stop.now, due))
        stop.now += tick_s  # the tick's own time
        if len(seen) == wakes:
            stop.stopped = True
    return seen


async def test_every_member_ticks_at_once_then_on_its_own_interval() -> None:
    stop = FakeStop()
    seen = await run(stop, [("a", 2.0), ("b", 3.0)], wakes=5)
    assert seen == [
        (0.0, ["a", "b"]),
        (2.0, ["a"]),
        (3.0, ["b"]),
        (4.0, ["a"]),
        (6.0, ["a", "b"]),
    ]


async def test_the_period_is_kept_and_an_overrun_is_followed_an_interval_after_it() -> None:
    stop = FakeStop()
    # 0.5 s ticks every 2 s: the next is due 2 s after the last was, not after it ended.
    assert [at for at, _ in await run(stop, [("a", 2.0)], wakes=3, tick_s=0.5)] == [0.0, 2.0, 4.0]
    stop = FakeStop()
    # A 3 s tick overran its 2 s interval: the next follows 2 s after it ended.
    assert [at for at, _ in await run(stop, [("a", 2.0)], wakes=3, tick_s=3.0)] == [0.0, 5.0, 10.0]


async def test_a_changed_interval_counts_from_the_next_tick() -> None:
    stop = FakeStop()
    intervals = {"a": 1.0}
    seen = []
    async for _due in every(stop, lambda: list(intervals.items()), stop.clock):
        seen.append(stop.now)
        intervals["a"] = 5.0  # the spec changed during the first tick
        if len(seen) == 3:
            stop.stopped = True
    assert seen == [0.0, 5.0, 10.0]


async def test_a_stopped_loop_yields_nothing() -> None:
    stop = FakeStop()
    stop.stopped = True
    assert [due async for due in every(stop, lambda: [("a", 1.0)], stop.clock)] == []


async def test_a_stop_wakes_a_sleeping_loop_at_once() -> None:
    stop = Stop()
    woke = asyncio.ensure_future(stop.wait(60.0))
    await asyncio.sleep(0)
    stop.set()
    assert await asyncio.wait_for(woke, 5.0) is True
    assert await Stop().wait(0.01) is False
