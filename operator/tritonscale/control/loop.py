"""The schedule of the control loop: which autoscalers tick now, and how long to sleep.

    async for due in every(stopped, lambda: [("pipeline-async", spec.interval_seconds)]):
        ...  # one tick (or one round) of the autoscalers named in `due`

Both drivers run their ticks through this one loop: the Kubernetes driver in one kopf daemon
per InstanceGroupAutoscaler (`stopped` is kopf's `DaemonStopped`), the local driver
(`tritonscale tune`) in one task per policy or budget (`stopped` is a `Stop`). Each wake asks
`members` again, and so does the end of each tick, so an interval the tick read from a
changed spec sets the sleep after it. The period is kept: the next tick is due one interval
after this one was; a tick that overran its interval is followed one interval after it ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Protocol


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
