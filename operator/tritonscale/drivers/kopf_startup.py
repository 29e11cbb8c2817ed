"""kopf's start-up barrier, made linear in the objects watched (a restarted shard's wait).

At start, kopf holds every handler (the daemons that tick the sets among them) until every
watched object is indexed: each object's worker drops its own toggle of one `ToggleSet` and
waits for the whole set to be on. kopf 1.45 wakes every waiting worker at each toggle made
or dropped, so n objects cost about n²/2 wake-ups, each a task switch and a turn at the
condition's lock. Measured here on one core: 250 objects 0.16 s of CPU in the barrier alone,
1,000 3.2 s, 2,000 14 s; a shard restarted beside 2,000 pods and 1,000 autoscalers spent
151 s there, half of its samples in kopf's toggles, before its first tick.

The waiters wait for the set's state (all on, or any on), and a toggle made or dropped can
change nothing else; so they are woken only when that state changes. A member turned on or
off still wakes them, as kopf does. `install()` leaves kopf as it is where its toggles are
not the ones this was written against.
"""

from __future__ import annotations

from kopf._cogs.aiokits import aiotoggles

_ToggleSet = aiotoggles.ToggleSet


async def _make_toggle(
    self: aiotoggles.ToggleSet, __val: bool = False, *, name: str | None = None
) -> aiotoggles.Toggle:
    toggle = aiotoggles.Toggle(__val, name=name, condition=self._condition)
    async with self._condition:
        before = self.is_on()
        self._toggles.add(toggle)
        if self.is_on() != before:
            self._condition.notify_all()
    return toggle


async def _drop_toggle(self: aiotoggles.ToggleSet, toggle: aiotoggles.Toggle) -> None:
    async with self._condition:
        before = self.is_on()
        self._toggles.discard(toggle)
        if self.is_on() != before:
            self._condition.notify_all()


def install() -> bool:
    """Wake the barrier's waiters on a change of its state only; whether it could (False:
    kopf's toggles are not what this expects, and stay as they are)."""
    probe = _ToggleSet(all)
    if not all(hasattr(probe, name) for name in ("_condition", "_toggles", "is_on")):
        return False
    _ToggleSet.make_toggle = _make_toggle  # type: ignore[method-assign]
    _ToggleSet.drop_toggle = _drop_toggle  # type: ignore[method-assign]
    return True
