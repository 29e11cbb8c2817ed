"""The traces the simulator's trace arms judge: pipelines, budgets, peaks and seeds.

Each case is one production-shaped day (loadtests.traces: `SECONDS` long, the trace
benchmark's ten minutes) offered to one pipeline's root:

- on our pipelines (`OURS`): pipeline_async and its three branches as models/ configures them
  (budget 7, the benchmark's), the same with branch_rank as the bottleneck (7), and with a
  fourth branch (8), from loadtests.sim.scenarios' families;
- on generated pipelines (loadtests.sim.generated: depths 1, 2 and 3 in turn, one root),
  each with the budget it was drawn with.

Each case draws its peak's share of the best full split's capacity from `PEAK_SHARES` (the
benchmark's 0.8 lies inside), and its seed gives its trace, its arrivals and its simulations.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from loadtests.sim import scenarios
from loadtests.sim.generated import generate_pipeline
from loadtests.sim.pipeline import Pipeline, real_pipeline

SECONDS = 600
PEAK_SHARES = (0.5, 0.9)
OURS_PER_PIPELINE = 8
GENERATED = 96  # with OURS_PER_PIPELINE x 3: 120 traces


@dataclass(frozen=True)
class TraceCase:
    name: str
    family: str  # "ours" or "generated"
    pipeline: Pipeline
    budget: int
    peak_share: float
    seed: int
    seconds: int = SECONDS
    # What a generated pipeline is made of (loadtests.sim.generated.tags); empty for ours.
    shape: Mapping[str, object] = field(default_factory=dict, compare=False)

    @property
    def root(self) -> str:
        return self.pipeline.entries[0]


OURS: Mapping[str, tuple[Callable[[Pipeline], Pipeline], int]] = MappingProxyType(
    {
        "pipeline": (lambda base: base, 7),
        "rank-25ms": (scenarios.rank_bottleneck, 7),
        "filter": (scenarios.fourth_branch, 8),
    }
)


def _ours(seed: int) -> list[TraceCase]:
    base = real_pipeline()
    cases = []
    for name, (make, budget) in OURS.items():
        rng = random.Random(f"trace-{name}-{seed}")
        cases.append(
            TraceCase(f"{name}-{seed}", "ours", make(base), budget, rng.uniform(*PEAK_SHARES), seed)
        )
    return cases


def _generated(seed: int) -> TraceCase:
    rng = random.Random(f"trace-generated-{seed}")
    drawn = generate_pipeline(rng, f"trace-generated-{seed}", depth=seed % 3 + 1)
    return TraceCase(
        f"generated-{seed}",
        "generated",
        drawn.pipeline,
        drawn.budget,
        rng.uniform(*PEAK_SHARES),
        seed,
        shape=MappingProxyType(dict(drawn.tags)),
    )


def generate(limit: int | None = None) -> list[TraceCase]:
    """Every case, ours and generated interleaved (so that the first N hold both)."""
    ours = [case for seed in range(OURS_PER_PIPELINE) for case in _ours(seed)]
    generated = [_generated(seed) for seed in range(GENERATED)]
    # Four generated cases after each of ours: both kinds spread over the whole list.
    cases: list[TraceCase] = []
    for index, mine in enumerate(ours):
        cases += [mine, *generated[4 * index : 4 * index + 4]]
    cases += generated[4 * len(ours) :]
    return cases[:limit] if limit is not None else cases
