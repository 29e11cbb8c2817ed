"""The controllers the simulator can run, behind one interface, found by name.

A controller sees what a driver sees at each tick of a pod set: every model's spec, the live
counts, one metrics snapshot of the set, and the clock; it returns the count it wants for
each model and keeps its own state between calls. A new controller (an allocator that sizes
the whole set at once, say) is a class with `decide` and an entry in `CONTROLLERS`; then
`python -m loadtests.sim --controller NAME` judges it on every scenario.

`allocator` is the operator's set planner (loadtests.sim.allocator_controller); `static` holds
the counts it came in with, the baseline every controller must beat.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from tritonscale.core.signals import MetricSnapshot
from tritonscale.core.spec import AutoscalerSpec


class Controller(Protocol):
    """Decides every model's count of one pod set at one tick."""

    def decide(
        self,
        specs: Mapping[str, AutoscalerSpec],
        current: Mapping[str, int],
        snapshot: MetricSnapshot,
        now: float,
    ) -> dict[str, int]:
        """model -> desired count; `current` holds the live count of every model."""
        ...


class StaticController:
    """Holds the counts it started with: the baseline every policy must beat."""

    def decide(
        self,
        specs: Mapping[str, AutoscalerSpec],
        current: Mapping[str, int],
        snapshot: MetricSnapshot,
        now: float,
    ) -> dict[str, int]:
        return dict(current)


# Add a controller here: `--controller NAME` makes a fresh one per scenario.
def _allocator() -> Controller:
    # Imported when asked for: the set planner's controller lives in a module of its own.
    from loadtests.sim.allocator_controller import AllocatorController

    return AllocatorController()


CONTROLLERS: dict[str, Callable[[], Controller]] = {
    "static": StaticController,
    "allocator": _allocator,
}


def make(name: str) -> Controller:
    """A fresh controller by its registered name."""
    try:
        return CONTROLLERS[name]()
    except KeyError:
        known = ", ".join(sorted(CONTROLLERS))
        raise ValueError(f"unknown controller {name!r} (known: {known})") from None
