"""Pods that stopped answering: left out of the ticks until they answer again.

A pod that accepts connections and never answers (a stopped or wedged tritonserver, a node
that lost its network) costs every call one timeout. A tick that meets it pays that once;
without a memory, every later tick of every model on that pod would pay it again, and the
pods that do answer would get their counts one timeout late, tick after tick.

So the tick that met the silence marks the pod (`mark`), and later ticks leave it out at
once (`reason` says why, for the tick's notes) while one background call at a time (an asyncio
task) asks the pod whether it is live (`GET /v2/health/live`). The first tick after it answered takes it
back. Kubernetes takes a hung pod out of the Service's endpoints by its own readiness probe
after a while; this is for the time until then, and for pods without such a probe.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tritonscale.triton.endpoints import Endpoint


@dataclass
class _Silence:
    since: float  # the clock's time of the call that got no answer
    reason: str  # that call's one line
    probe: asyncio.Task[None] | None = None
    answered: bool = False


class SilentPods:
    """The pods that did not answer, each with the background call that asks it again.

    `is_live(endpoint)` is that call: True when the pod answered, False (or an exception)
    when it did not; it runs as a task of its own on the caller's event loop. The ticks of
    several autoscalers share one instance (the actuator's), on one loop.
    """

    def __init__(
        self,
        is_live: Callable[[Endpoint], Awaitable[bool]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._is_live = is_live
        self._clock = clock
        self._silent: dict[tuple[str, str], _Silence] = {}

    def mark(self, endpoint: Endpoint, reason: str) -> None:
        """`endpoint` did not answer a call of this tick; ask it again in the background."""
        key = _key(endpoint)
        if key not in self._silent:
            self._silent[key] = _Silence(since=self._clock(), reason=reason)
        self._ask(endpoint, self._silent[key])

    def reason(self, endpoint: Endpoint) -> str | None:
        """Why `endpoint` is left out of this tick; None when it takes part."""
        key = _key(endpoint)
        silence = self._silent.get(key)
        if silence is None:
            return None
        if silence.answered:
            del self._silent[key]
            return None
        self._ask(endpoint, silence)
        age = self._clock() - silence.since
        return (
            f"{silence.reason}; left out for {age:.0f} s until it answers again "
            "(asked in the background)"
        )

    def _ask(self, endpoint: Endpoint, silence: _Silence) -> None:
        """Start the background call unless one is running."""
        if silence.answered or (silence.probe is not None and not silence.probe.done()):
            return

        async def ask() -> None:
            try:
                live = await self._is_live(endpoint)
            except Exception:  # any failure to answer is still silence
                live = False
            if live:
                silence.answered = True

        silence.probe = asyncio.ensure_future(ask())

    def __len__(self) -> int:
        return sum(1 for silence in self._silent.values() if not silence.answered)


def _key(endpoint: Endpoint) -> tuple[str, str]:
    # A pod recreated under the same name at another address is another pod.
    return endpoint.name, endpoint.base_url
