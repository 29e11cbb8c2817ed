"""The controllers the simulator can run, behind one interface, found by name.

A controller sees what a driver sees at each tick of a pod set: every model's spec, the live
counts, one metrics snapshot of the set, and the clock; it returns the count it wants for
each model and keeps its own state between calls. A new controller (an allocator that sizes
the whole set at once, say) is a class with `decide` and an entry in `CONTROLLERS`; then
`python -m loadtests.sim --controller NAME` judges it on every scenario.

`allocator` is the operator's set planner (loadtests.sim.allocator_controller); `static` holds
the counts it came in with, the baseline every controller must beat; `hpa_way` scales each
model by itself to its utilization target, as an HPA per model would (loadtests.hpa_way).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from loadtests.hpa_way import hpa_tick
from tritonscale.core.behavior import PolicyState
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


class HpaWayController:
    """Each model by itself: HPA's formula through the behavior windows (loadtests.hpa_way),
    no joint budget; a window not yet full holds the counts, as the HPA does without metrics."""

    def __init__(self) -> None:
        self.states: dict[str, PolicyState] = {}

    def decide(
        self,
        specs: Mapping[str, AutoscalerSpec],
        current: Mapping[str, int],
        snapshot: MetricSnapshot,
        now: float,
    ) -> dict[str, int]:
        desired = {}
        for model, spec in specs.items():
            signals = snapshot.model(model) if snapshot.complete else None
            state = self.states.get(model, PolicyState())
            desired[model], self.states[model] = hpa_tick(spec, state, current[model], signals, now)
        return desired


# Add a controller here: `--controller NAME` makes a fresh one per scenario.
def _allocator() -> Controller:
    # Imported when asked for: the set planner's controller lives in a module of its own.
    from loadtests.sim.allocator_controller import AllocatorController

    return AllocatorController()


CONTROLLERS: dict[str, Callable[[], Controller]] = {
    "static": StaticController,
    "allocator": _allocator,
    "hpa_way": HpaWayController,
}


def make(name: str) -> Controller:
    """A fresh controller by its registered name."""
    try:
        return CONTROLLERS[name]()
    except KeyError:
        known = ", ".join(sorted(CONTROLLERS))
        raise ValueError(f"unknown controller {name!r} (known: {known})") from None
