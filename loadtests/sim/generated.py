"""Pipelines of other shapes than ours, generated from a seed: topologies and costs.

`generate_pipeline(rng)` draws one pod's pipeline (loadtests.sim.pipeline) within these bounds:

- a call tree 1 to 3 deep below its root (a called model that calls others in turn), each
  BLS model calling 1 to 4 distinct models, 1 to 6 calls per execution (a child called more
  than once), at most `MAX_MODELS` models in all (the static search tries every split);
- some calls conditional: a child called for a share (0.2 to 0.8) of the requests only;
- each model with a dynamic batcher, with `max_batch_size` and no batcher (one request an
  execution), or with `max_batch_size: 0`; its BLS calls together (`async def execute`) or
  one after another (blocking `exec()`);
- where asked (`shared=True`), a second root that calls one of the first root's children;
- service times of 1 to 50 ms an execution of `TYPICAL_ROWS` rows (BLS models: 1 to 10 ms of
  their own work), a fixed part plus a part per row.

Its load is scaled to the pipeline: `GeneratedPipeline.capacity_rps` is what the budget would
serve as a fluid (every instance busy, full batches, the budget's whole instances where they
raise the rate most); the scenarios offer fractions of it. Costs are
drawn again (from the same generator) until that capacity lies between `MIN_RPS` and
`MAX_RPS`, so that a scenario's events (and its simulation's time) stay bounded.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from loadtests.sim.pipeline import ModelShape, Pipeline

MAX_MODELS = 6
MAX_CALLS = 6  # calls per execution of one BLS model
MAX_FAN_OUT = 4
TYPICAL_ROWS = 16  # the rows of an execution its service time is drawn for
LEAF_MS = (1.0, 50.0)
BLS_OWN_MS = (1.0, 10.0)
MIN_RPS, MAX_RPS = 30.0, 300.0
ROWS_PER_REQUEST = 8  # the scenarios' (and the static search's) rows of a client request
MAX_DRAWS = 50


@dataclass(frozen=True)
class GeneratedPipeline:
    """A drawn pipeline, what it is made of (for the reports), and its fluid capacity."""

    pipeline: Pipeline
    tags: Mapping[str, object]
    capacity_rps: Mapping[str, float]  # per root: requests a second the budget serves of it
    budget: int


def generate_pipeline(
    rng: random.Random, name: str, *, shared: bool = False, depth: int | None = None
) -> GeneratedPipeline:
    """One pipeline drawn from `rng` (depth drawn too unless given), with its budget."""
    depth = depth if depth is not None else rng.randint(1, 3)
    roots = ["root_a", "root_b"] if shared else ["root_a"]
    children: dict[str, list[str]] = {root: [] for root in roots}
    slots = MAX_MODELS - len(roots)
    # The deepest path first (root_a -> m1 -> m2 ...), then more children where room is left.
    parent = roots[0]
    for level in range(depth):
        child = f"m{level + 1}"
        children[parent].append(child)
        children[child] = []
        parent = child
        slots -= 1
    inner = [roots[0], *[f"m{level + 1}" for level in range(depth - 1)]]
    for bls in inner:
        wanted = rng.randint(1, MAX_FAN_OUT) - len(children[bls])
        for _ in range(max(0, min(wanted, slots - (1 if shared else 0)))):
            leaf = f"leaf{len(children)}"
            children[bls].append(leaf)
            children[leaf] = []
            slots -= 1
    if shared:
        # The second root calls one of the first root's children, and one of its own if room.
        children["root_b"].append(rng.choice(children[roots[0]]))
        if slots > 0 and rng.random() < 0.5:
            leaf = f"leaf{len(children)}"
            children["root_b"].append(leaf)
            children[leaf] = []
    for _ in range(MAX_DRAWS):
        drawn = _draw_costs(rng, name, children, roots)
        if drawn is not None:
            return drawn
    raise ValueError(f"{name}: no costs within {MIN_RPS:g} to {MAX_RPS:g} req/s in {MAX_DRAWS}")


def _draw_costs(
    rng: random.Random, name: str, children: Mapping[str, list[str]], roots: list[str]
) -> GeneratedPipeline | None:
    shapes: dict[str, ModelShape] = {}
    conditional = rng.random() < 0.5
    for model, called in children.items():
        calls: dict[str, int] = {}
        share: dict[str, float] = {}
        if called:
            # 1 to 6 calls an execution, each child at least once.
            total = rng.randint(len(called), MAX_CALLS)
            calls = dict.fromkeys(called, 1)
            for _ in range(total - len(called)):
                calls[rng.choice(called)] += 1
            if conditional:
                for child in called:
                    if rng.random() < 0.4:
                        share[child] = round(rng.uniform(0.2, 0.8), 2)
        low, high = BLS_OWN_MS if called else LEAF_MS
        total_ms = math.exp(rng.uniform(math.log(low), math.log(high)))
        fixed = rng.uniform(0.2, 0.9)
        kind = rng.choice(("dynamic", "dynamic", "no batcher", "max_batch_size 0"))
        if model in roots and kind == "max_batch_size 0":
            kind = "dynamic"  # a root takes the clients' rows: it has a batch dimension
        rows = {"dynamic": rng.choice((16, 32, 64)), "no batcher": 32, "max_batch_size 0": 1}
        shapes[model] = ModelShape(
            model,
            execute_ms=round((1 - fixed) * total_ms / TYPICAL_ROWS, 4),
            batch_exponent=1.0,
            overhead_ms=round(fixed * total_ms, 3),
            max_batch_rows=rows[kind],
            calls=MappingProxyType(calls),
            sequential=bool(called) and rng.random() < 0.3,
            call_share=MappingProxyType(share),
            batcher=kind == "dynamic",
        )
    order = [*roots, *(m for m in children if m not in roots)]
    pipeline = Pipeline(name, {m: shapes[m] for m in order}, tuple(roots))
    # Two to four instances beyond one each (two or three from five models on: the static
    # search simulates every split, 28 to 84 of six models).
    budget = len(pipeline.models) + rng.randint(2, 4 if len(pipeline.models) < 5 else 3)
    capacity = {root: fluid_capacity(pipeline, root, budget) for root in roots}
    if not all(MIN_RPS <= rps <= MAX_RPS for rps in capacity.values()):
        return None
    return GeneratedPipeline(pipeline, tags(pipeline, children), capacity, budget)


def tags(pipeline: Pipeline, children: Mapping[str, list[str]]) -> dict[str, object]:
    """What the pipeline is made of, as the reports count it."""

    def depth(model: str) -> int:
        return 1 + max((depth(c) for c in children[model]), default=-1) if children[model] else 0

    shapes = pipeline.models.values()
    callers: dict[str, int] = {}
    for shape in shapes:
        for child in shape.calls:
            callers[child] = callers.get(child, 0) + 1
    return {
        "depth": max(depth(root) for root in pipeline.entries),
        "models": len(pipeline.models),
        "fan_out": max(len(s.calls) for s in shapes),
        "calls_per_execution": max(sum(s.calls.values()) for s in shapes),
        "conditional": any(s.call_share for s in shapes),
        "no_batcher": any(not s.batcher and s.max_batch_rows > 1 for s in shapes),
        "max_batch_size_0": any(s.max_batch_rows <= 1 for s in shapes),
        "sequential": any(s.sequential for s in shapes),
        "shared_child": any(count > 1 for count in callers.values()),
    }


def fluid_capacity(pipeline: Pipeline, root: str, budget: int) -> float:
    """Requests a second of `root` that `budget` instances serve as a fluid: each model's
    instance-seconds per request (its execution, a BLS model's wait for its calls included,
    at full batches), and the budget split in whole instances, one each first, then each to
    the model that bounds the rate (the split that serves the most, where each model serves
    its instances over its instance-seconds per request)."""
    work: dict[str, float] = {}
    shape = pipeline.models[root]
    per_batch = max(1, shape.max_batch_rows // ROWS_PER_REQUEST) if shape.batcher else 1
    rows = per_batch * ROWS_PER_REQUEST
    held = _held_s(pipeline, root, rows, work, 1.0 / per_batch)
    work[root] = work.get(root, 0.0) + held / per_batch
    working = {model: seconds for model, seconds in work.items() if seconds > 0}
    if not working:
        return math.inf
    counts = dict.fromkeys(working, 1)
    for _ in range(budget - len(pipeline.models)):
        tightest = min(working, key=lambda m: counts[m] / working[m])
        counts[tightest] += 1
    return min(counts[m] / working[m] for m in working)


def _held_s(
    pipeline: Pipeline, model: str, rows: int, work: dict[str, float], executions: float
) -> float:
    """Seconds an execution of `rows` rows holds its instance (its calls answered), adding to
    `work` the instance-seconds its calls cost their models for `executions` of it a request."""
    shape = pipeline.models[model]
    waits = []
    for child, times in shape.calls.items():
        share = shape.call_share.get(child, 1.0)
        call_rows = max(1, round(rows * share)) if share < 1 else rows
        child_shape = pipeline.models[child]
        joined = (
            max(1, child_shape.max_batch_rows // call_rows)
            if child_shape.batcher and child_shape.max_batch_rows > call_rows
            else 1
        )
        child_held = _held_s(
            pipeline, child, call_rows * joined, work, executions * times * share / joined
        )
        work[child] = work.get(child, 0.0) + executions * times * share * child_held / joined
        waits.extend([child_held * share] * times)
    own = shape.execute_s(rows)
    if not waits:
        return own
    return own + (sum(waits) if shape.sequential else max(waits))
