"""The set planner as a controller: `tritonscale.core.planner.decide_set`, once a tick.

Its `SetState` goes through its dict form between ticks, as a custom resource's status would
keep it. `controllers.CONTROLLERS` names it `allocator`; run it on the scenarios with

    python -m loadtests.sim --controller allocator [--scenarios N] [--family F] [--out PATH]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tritonscale.core.planner import SetState, decide_set
from tritonscale.core.signals import MetricSnapshot
from tritonscale.core.spec import AutoscalerSpec


class AllocatorController:
    """Every model of the set decided together (not yet the operator's default)."""

    def __init__(self) -> None:
        self.state: dict[str, Any] = {}
        self.reasons: dict[str, str] = {}  # model -> the reason of its last decision

    def decide(
        self,
        specs: Mapping[str, AutoscalerSpec],
        current: Mapping[str, int],
        snapshot: MetricSnapshot,
        now: float,
    ) -> dict[str, int]:
        decision = decide_set(specs, current, snapshot, SetState.from_dict(self.state), now)
        self.state = decision.state.to_dict()
        self.reasons = {model: d.reason for model, d in decision.models.items()}
        return decision.targets
