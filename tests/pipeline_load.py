"""A pod set's metrics in closed form: what Triton would report for a steady load on a BLS
parent that fans out to its children concurrently (pipeline_async and its branches).

Each child serves a request in `service_s` of an instance (batches of one); the parent does
`own_s` of work per execution and waits for the slowest child's queue and execution; its
batches hold `parent_batch` requests. The set serves the offered load or, when a stage is
short, what its slowest stage serves. Queues follow M/M/1 per instance (capped at five
service times when saturated): rough, but the parent's wait grows with its child's queue as
it does on a real server. Used by the pipeline model's, the allocator's and the planner's tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tritonscale.core.signals import MetricSnapshot, ModelSignals
from tritonscale.core.spec import AutoscalerSpec

PARENT = "pipeline_async"
CHILDREN = ("branch_embed", "branch_classify", "branch_rank")
WINDOW_S = 60.0


@dataclass(frozen=True)
class Load:
    offered_rps: float
    service_s: Mapping[str, float] = field(
        default_factory=lambda: {
            "branch_embed": 0.020,
            "branch_classify": 0.005,
            "branch_rank": 0.005,
        }
    )
    own_s: float = 0.004
    parent_batch: float = 4.0
    failure_rate: float = 0.0  # failed requests per second at the parent

    def stage_capacity_rps(self, counts: Mapping[str, int]) -> dict[str, float]:
        capacity = {child: counts[child] / s for child, s in self.service_s.items()}
        hold = self.own_s + max(self.service_s.values())
        capacity[PARENT] = counts[PARENT] * self.parent_batch / hold
        return capacity

    def served_rps(self, counts: Mapping[str, int]) -> float:
        return min(self.offered_rps, *self.stage_capacity_rps(counts).values())

    def signals(self, counts: Mapping[str, int]) -> dict[str, ModelSignals]:
        served = self.served_rps(counts)
        models = {}
        time_in_model = {}
        for child, service in self.service_s.items():
            busy = served * service / counts[child]
            queue = service * (min(busy / (1 - busy), 5.0) if busy < 1 else 5.0)
            time_in_model[child] = service + queue
            models[child] = ModelSignals(
                child, served, 0.0, served, served * service, served * queue, 0.0, 1
            )
        execution = self.own_s + max(time_in_model.values())
        models[PARENT] = ModelSignals(
            PARENT,
            served,
            self.failure_rate,
            served / self.parent_batch,
            served * execution,
            0.0,
            0.0,
            1,
        )
        return models

    def snapshot(self, taken_at: float, counts: Mapping[str, int]) -> MetricSnapshot:
        return MetricSnapshot(taken_at, WINDOW_S, self.signals(counts))


def make_spec(model: str, **overrides: Any) -> AutoscalerSpec:
    d: dict[str, Any] = {
        "selector": {"matchLabels": {"app.kubernetes.io/component": "triton"}},
        "model": model,
        "calls": list(CHILDREN) if model == PARENT else [],
        "minInstances": 1,
        "maxInstances": 8,
    }
    d.update(overrides)
    return AutoscalerSpec.from_dict(d)


def pipeline_specs(
    instances_per_pod: int | None = 7, **overrides: Any
) -> dict[str, AutoscalerSpec]:
    """The four models of the pipeline, sharing a budget of `instances_per_pod` (None: none);
    `overrides` per model: `branch_embed={"maxInstances": 2}`."""
    budget = {"budget": {"name": "triton", "instancesPerPod": instances_per_pod}}
    specs = {}
    for model in (PARENT, *CHILDREN):
        fields = {**(budget if instances_per_pod else {}), **overrides.get(model, {})}
        specs[model] = make_spec(model, **fields)
    return specs


def counts(parent: int, embed: int, classify: int = 1, rank: int = 1) -> dict[str, int]:
    return {PARENT: parent, "branch_embed": embed, "branch_classify": classify, "branch_rank": rank}
