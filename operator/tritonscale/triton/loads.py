"""Loads with a deadline: a reload that does not finish never holds its caller past it.

Triton 2.51 can leave a reload hanging. Two causes were seen here:
- With its rate limiter `off` (Triton's default), an instance-count change of a model whose
  queue never empties (a BLS root under steady load) waits until the queue empties: the new
  instance serves before Triton confirms it, a removed one serves until it exits, and the
  config shows the new count only at the end of an increase, at once for a decrease
  (docs/count-changes.md). `--rate-limit=execution_count`, which `tritonscale serve` and the
  chart set, removes this cause.
- A model whose new instance never finishes `initialize()`: the old instances keep serving.
Either way the model reads READY and the repository index says READY too, so nothing in
Triton's API tells that a reload is in flight; a second load of the model waits behind the
first (measured: it creates no instance until the first ends).

So a load runs as an asyncio task of its own and its caller waits at most `deadline_s`. Past
the deadline the caller gets the `LoadInFlight` and goes on; the task keeps the request open
(up to the load's own timeout), and while it does, `in_flight(pod, model)` says so, and no
other load of that model goes to that pod. When Triton answers at last, the outcome is
logged and the entry goes. A restarted operator does not know its predecessor's loads: its
first load waits behind them in Triton, past its deadline, and from then on it knows.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

# A normal reload took 0.4 to 3.5 s here (every model of models/, 2 busy cores; median
# 1.6 s): the deadline is about 20 times the median.
DEFAULT_LOAD_DEADLINE_S = 30.0
# How long a load's request stays open after its deadline; then Triton is left to it.
DEFAULT_LOAD_TIMEOUT_S = 600.0
# How long the time of a pod's last load is remembered: longer than any reader keeps a read.
CHANGES_KEPT_S = 3600.0


@dataclass(frozen=True)
class PodRead:
    """When a read of a model on a pod began (the clock of the LoadsInFlight that handed it
    out), and the pod's containers' start then (`Endpoint.started_at`; None: unknown)."""

    at: float
    started_at: str | None


@dataclass(frozen=True)
class LoadInFlight:
    """A load sent to one pod that had not finished at its deadline."""

    pod: str
    model: str
    what: str  # what the load asks for, e.g. "2 instances"
    started: float  # the clock's time when it was sent
    deadline_s: float
    # The most instances that may serve until Triton confirms the load (the larger of the
    # counts before and after a count change; None for a load that changes no count).
    may_serve: int | None = None


@dataclass
class _Running:
    load: LoadInFlight
    task: asyncio.Task[None]
    abandoned: bool = False  # the caller stopped waiting at the deadline


class LoadsInFlight:
    """Runs loads with a deadline and remembers those that outlived it, per (pod, model).

    One instance is shared by everything that loads models on the same pods (the actuator
    and the healer), so that neither piles a load on one the other left in flight. It belongs
    to one event loop (its loads are that loop's tasks).
    """

    def __init__(
        self,
        *,
        deadline_s: float = DEFAULT_LOAD_DEADLINE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if deadline_s <= 0:
            raise ValueError(f"the load deadline must be > 0 s, not {deadline_s:g}")
        self.deadline_s = deadline_s
        self._clock = clock
        self._running: dict[tuple[str, str], _Running] = {}
        self._changed_at: dict[tuple[str, str], float] = {}
        # Called with (pod, model) when a load that outlived its deadline ends: nobody waits
        # for it any more, and a caller that held back for it may go on.
        self._on_late_end: list[Callable[[str, str], None]] = []

    def on_late_end(self, listener: Callable[[str, str], None]) -> None:
        """Call `listener(pod, model)` whenever a load ends after its deadline."""
        self._on_late_end.append(listener)

    def changed_at(self, pod: str, model: str) -> float | None:
        """When a load of `model` on `pod` was last sent or ended (the clock's time): a config
        read that began before then may be out of date. None: not within CHANGES_KEPT_S."""
        return self._changed_at.get((pod, model))

    def read_began(self, started_at: str | None) -> PodRead:
        """Mark the start of a read of a pod (its config, a model's readiness) to keep."""
        return PodRead(self._clock(), started_at)

    def may_have_changed(
        self, pod: str, model: str, read: PodRead | None, started_at: str | None, max_age_s: float
    ) -> bool:
        """Whether what `read` found of `model` on `pod` may be out of date and must be read
        again: nothing read yet, the pod's start unknown or changed since (its containers
        restarted), a load of the model to the pod sent or ended since the read began, or
        the read `max_age_s` old (a change made behind the operator's back shows then)."""
        if read is None or started_at is None or read.started_at != started_at:
            return True
        if self._clock() - read.at >= max_age_s:
            return True
        changed = self.changed_at(pod, model)
        return changed is not None and changed >= read.at

    def _changed(self, key: tuple[str, str]) -> None:
        now = self._clock()
        self._changed_at[key] = now
        # Loads are rare (a few a minute): the pods gone long ago are dropped as they come.
        for old in [k for k, at in self._changed_at.items() if at < now - CHANGES_KEPT_S]:
            del self._changed_at[old]

    def in_flight(self, pod: str, model: str) -> LoadInFlight | None:
        """The load of `model` on `pod` that is still waiting for Triton, if any."""
        running = self._running.get((pod, model))
        return running.load if running is not None and running.abandoned else None

    async def run(
        self,
        pod: str,
        model: str,
        what: str,
        send: Callable[[], Awaitable[None]],
        may_serve: int | None = None,
    ) -> LoadInFlight | None:
        """Run `send()` (one load) as a task of its own; wait for it up to the deadline.

        None: the load finished in time. A TritonError: it failed in time (raised here).
        A LoadInFlight: the deadline passed first, or a load of `model` to `pod` was already
        under way (then `send` is not run at all).
        """
        key = (pod, model)
        if key in self._running:
            return self._running[key].load
        load = LoadInFlight(pod, model, what, self._clock(), self.deadline_s, may_serve)
        self._changed(key)
        task = asyncio.ensure_future(send())
        running = self._running[key] = _Running(load, task)
        task.add_done_callback(lambda _: self._ended(key, running))
        # `wait`, not `wait_for`: past the deadline the load goes on, and a cancelled caller
        # (a stopped daemon) leaves it to Triton as well.
        try:
            done, _ = await asyncio.wait({task}, timeout=self.deadline_s)
        except asyncio.CancelledError:
            running.abandoned = not task.done()
            raise
        if not done:
            running.abandoned = True
            return load
        error = task.exception()
        if error is not None:
            raise error
        return None

    def _ended(self, key: tuple[str, str], running: _Running) -> None:
        self._changed(key)
        if self._running.get(key) is running:
            del self._running[key]
        if not running.abandoned:
            return
        load = running.load
        took = self._clock() - load.started
        if running.task.cancelled():  # its event loop ended first: Triton may still finish it
            ended = "was given up (its request closed)"
        elif (error := running.task.exception()) is not None:
            ended = f"failed: {getattr(error, 'reason', error)}"
        else:
            ended = "finished"
        log.warning(
            "%s: the load of %s (%s) %s %.1f s after it was sent, past its deadline of %g s",
            load.pod,
            load.model,
            load.what,
            ended,
            took,
            load.deadline_s,
        )
        for listener in self._on_late_end:
            listener(load.pod, load.model)
