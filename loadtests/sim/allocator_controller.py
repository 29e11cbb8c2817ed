"""The set planner as a controller: `tritonscale.core.planner.decide_set`, once a tick.

Its `SetState` goes through its dict form between ticks, as a custom resource's status would
keep it. The runner gives it the pipeline's live configs (`configure`, as the operator's
actuator reads them from Triton), from which it tells each model's batching.
`controllers.CONTROLLERS` names it `allocator`; run it on the scenarios with

    python -m loadtests.sim --controller allocator [--scenarios N] [--family F] [--out PATH]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tritonscale.core.pipeline_model import Batching
from tritonscale.core.planner import SetState, decide_set
from tritonscale.core.signals import MetricSnapshot
from tritonscale.core.spec import AutoscalerSpec


class AllocatorController:
    """Every model of the set decided together, as the operator decides them."""

    def __init__(self) -> None:
        self.state: dict[str, Any] = {}
        self.reasons: dict[str, str] = {}  # model -> the reason of its last decision
        self.messages: dict[str, str] = {}  # model -> the message of its last decision
        self.batching: dict[str, Batching] = {}  # model -> its batching, from its config
        self.live_since: dict[str, float] = {}  # model -> when its last load ended

    def went_live(self, model: str, at: float) -> None:
        """The load of a new count of `model` ended at `at` (the runner's clock)."""
        self.live_since[model] = at

    def configure(self, configs: Mapping[str, Mapping[str, Any]]) -> None:
        """The live configs of the set's models (Triton's JSON); one that cannot be read is
        left out, and its model is taken at today's batch."""
        self.batching = {
            model: batching
            for model, config in configs.items()
            if (batching := Batching.of_config(config)) is not None
        }

    def decide(
        self,
        specs: Mapping[str, AutoscalerSpec],
        current: Mapping[str, int],
        snapshot: MetricSnapshot,
        now: float,
    ) -> dict[str, int]:
        decision = decide_set(
            specs,
            current,
            snapshot,
            SetState.from_dict(self.state),
            now,
            self.batching,
            self.live_since,
        )
        self.state = decision.state.to_dict()
        self.reasons = {model: d.reason for model, d in decision.models.items()}
        self.messages = {model: d.message for model, d in decision.models.items()}
        return decision.targets
