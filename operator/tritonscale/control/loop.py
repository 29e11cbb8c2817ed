"""The schedules of the control loop: when a pod set ticks, and how long to sleep between.

    await run_set(stopped, lambda: the_set, tick)   # tick(due members, now) at the set's phase

Both drivers tick their pod sets (tritonscale.control.pod_sets) through `run_set`: the
Kubernetes driver in the kopf daemon of each set's leader (`stopped` is kopf's
`DaemonStopped`), the local driver (`tritonscale tune`) in one task (`stopped` is a `Stop`).
A set ticks at its phase, one interval apart; each tick decides the members that are due.

`every` is the plain per-name schedule, for work that is not a set's tick (the admission of
waiting pods): the period is kept, the next run is due one interval after this one was; a run
that overran its interval is followed one interval after it ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Protocol

from tritonscale.control.pod_sets import PodSet


class Stopped(Protocol):
    """What the loop needs of its stop signal (kopf's `DaemonStopped`, a `Stop`)."""

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


async def every(
    stopped: Stopped,
    members: Callable[[], Sequence[tuple[str, float]]],
    clock: Callable[[], float] = time.monotonic,
) -> AsyncIterator[list[str]]:
    """Yield the names due now (every member at first), sleep until the next is due, repeat,
    until `stopped` is set. `members()` gives each member's (name, interval in seconds) as
    they are now."""
    due: dict[str, float] = {}
    while not stopped.is_set():
        now = clock()
        current = dict(members())
        for name in list(due):
            if name not in current:
                del due[name]
        ready = [name for name in current if due.setdefault(name, now) <= now]
        if ready:
            yield ready
            # Asked again: the tick itself may have read a new interval (a changed spec).
            current = {**current, **dict(members())}
        ended = clock()
        for name in ready:
            due[name] += current[name]
            if due[name] < ended:
                due[name] = ended + current[name]
        if not due:
            return
        await stopped.wait(max(0.0, min(due.values()) - clock()))


async def run_set(
    stopped: Stopped,
    current: Callable[[], PodSet | None],
    tick: Callable[[list[str], float], Awaitable[object]],
    *,
    idle_s: float = 15.0,
    clock: Callable[[], float] = time.time,
) -> None:
    """Tick the set `current()` gives, at its phase, until `stopped` is set: `tick(due, now)`
    with the members due at `now` (unix seconds; all of them at the first tick).

    `current()` is asked at every wake, so a member added, changed or removed joins or leaves
    at the next tick. None means this loop does not run the set now (another member's loop
    leads it): it looks again after `idle_s`, and decides every member at once when it leads.
    """
    last: dict[str, float] = {}
    while not stopped.is_set():
        pod_set = current()
        if pod_set is None:
            last.clear()
            await stopped.wait(idle_s)
            continue
        last = {member: t for member, t in last.items() if member in pod_set.members}
        now = clock()
        due = pod_set.due(last, now)
        if due:
            await tick(due, now)
            last.update(dict.fromkeys(due, now))
        await stopped.wait(max(0.0, pod_set.next_tick(clock()) - clock()))
