"""The schedule of the control loop: when a pod set ticks, and how long to sleep between.

    await run_set(stopped, lambda: the_set, tick)   # tick(due members, now) at the set's phase

Both drivers tick their pod sets (tritonscale.control.pod_sets) through `run_set`: the
Kubernetes driver in the kopf daemon of each set's leader (`stopped` is set when kopf stops the
daemon or another member leads the set: tritonscale.drivers.set_loop.Tenure), the local driver
(`tritonscale tune`) in one task (`stopped` is a `Stop`).
A set ticks at its phase, one interval apart; each tick decides the members that are due.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

from tritonscale.control.pod_sets import PodSet


class Stopped(Protocol):
    """What the loop needs of its stop signal (a kopf daemon's tenure as its set's leader, a
    `Stop`); `wait` may return before its timeout without being set, and the loop then looks
    at its set again."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> Awaitable[object]: ...


class Stop:
    """A stop signal for loops outside kopf: `set()` ends every loop waiting on it."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self, timeout: float | None = None) -> bool:
        """Sleep until set or until `timeout` has passed; whether it is set."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout)
        return self._event.is_set()


async def run_set(
    stopped: Stopped,
    current: Callable[[], PodSet | None],
    tick: Callable[[list[str], float, Callable[[str], None]], Awaitable[object]],
    *,
    idle_s: float = 15.0,
    clock: Callable[[], float] = time.time,
) -> None:
    """Tick the set `current()` gives, at its phase, until `stopped` is set:
    `tick(due, now, finished)` with the members due at `now` (unix seconds; all of them at
    the first tick).

    `current()` is asked at every wake, so a member added, changed or removed joins or leaves
    at the next tick. None means this loop does not run the set now (another member's loop
    leads it): it looks again after `idle_s`, and decides every member at once when it leads.

    A tick runs as a task of its own; a member is not due again until its tick calls
    `finished(member)` (or ends): a load that waits for its deadline holds back the next
    decision of its own member, never the other members' (they tick on at the set's phase).
    A tick that raises (a bug: Triton's and Prometheus's troubles are results) ends the loop
    and is raised here; at the stop the loop waits for the ticks under way.
    """
    last: dict[str, float] = {}
    running: set[str] = set()
    tasks: set[asyncio.Task[object]] = set()

    async def run_tick(due: list[str], now: float) -> None:
        try:
            await tick(due, now, running.discard)
        finally:
            running.difference_update(due)

    try:
        while not stopped.is_set():
            _raise_failed(tasks)
            tasks = {task for task in tasks if not task.done()}
            pod_set = current()
            if pod_set is None:
                last.clear()
                await stopped.wait(idle_s)
                continue
            last = {member: t for member, t in last.items() if member in pod_set.members}
            now = clock()
            due = [member for member in pod_set.due(last, now) if member not in running]
            if due:
                running.update(due)
                tasks.add(asyncio.ensure_future(run_tick(due, now)))
                last.update(dict.fromkeys(due, now))
            await stopped.wait(max(0.0, pod_set.next_tick(clock()) - clock()))
    except BaseException:
        # Cancelled (kopf gave up waiting), or a tick failed: the other ticks go too.
        for task in tasks:
            task.cancel()
        raise
    finally:
        if tasks:
            await asyncio.wait(tasks)
    _raise_failed(tasks)


def _raise_failed(tasks: Iterable[asyncio.Task[object]]) -> None:
    for task in tasks:
        if task.done() and not task.cancelled() and (error := task.exception()) is not None:
            raise error
