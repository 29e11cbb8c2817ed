"""The counts of every model of a pod set, chosen together from the pipeline model.

What it maximises, under what:

- a stage's capacity is what its count serves at the batch it would run
  (`Stage.capacity_rps`: a child with a dynamic batcher batches the calls its callers can
  have out to it; otherwise today's batch, `Stage.capacity_per_instance_rps` an instance);
  the set serves its load as many times over as its slowest stage does:
  `headroom = min over the stages of capacity / demand`, demand counting the calls per
  request down the pipeline. The set's capacity is the roots' demand times it;
- the constraints: each model's minInstances and maxInstances (and a lower ceiling the
  verifier learnt, `ceilings`), and each budget (`AutoscalerSpec.budget`): the instances of its
  members together per pod, and their GPU memory at a cost per instance;
- when the budget holds every model under its target utilization (`spec.targets.utilization`),
  the answer is the fewest instances that do: each model's own count, with the policy's
  tolerance and scale-down margin (tritonscale.core.sizing), so that a steady load keeps it;
- where a root carries a latency objective (`spec.targets.latency`, the `latency` search of
  tritonscale.core.latency), its pipeline's models get the fewest instances whose predicted
  latency meets it within the bounds and the budget, the other models their targets beside
  them (LATENCY_OBJECTIVE); where no split within the budget meets it, the split that
  serves the most, below, with what the objective would take as the models' `wanted`;
- when the budget cannot hold the targets (or the latency objective), or a root is a closed
  loop (`Stage.closed_loop`: its clients wait on the set and send more as soon as it serves
  more, so no count holds it under its target), the answer is the split with the most
  headroom, and among equals the fewest instances.
  Today's split is kept while it serves within `switch_margin` of the best (a
  configuration can only be told from a better one by more than the noise), unless the
  set's requests pile up at some stage (its queue grows): that stage's limit is measured,
  while the stages they do not pile up at serve what they are sent, their capacity a lower
  bound (their batches grow with the load): they get the benefit of the noise (unless their
  batches are already the largest their batcher forms), and a split that gives instances to
  where the requests wait is taken. A child whose caller is full
  with its own work is not where they wait, whatever its queue: it is sent no more at once
  than the caller's instances call, so its batch and its capacity are a lower bound until
  the caller is relieved (`held_back`). Instances may move from one model to another, every
  model going to the split in one decision (the verifier judges the step, and one that falls
  short goes back); a model that is `settling` (its count just changed, not yet measured)
  does not go down, and one just `lowered` does not go back up. Under a closed loop, a child
  that limits today's split at a bigger batch than it runs, and that served clearly less than
  it was counted to, is counted at the share it served (`served_short`).

The search (`best_split`) is exact at any size while each stage's capacity grows with its own
count alone: the fewest instances that reach a headroom are each stage's own fewest, and the
best headroom is the largest of the finitely many stage capacities (count x capacity per
instance / demand) whose fewest instances fit. That is a binary search over at most models x
maxInstances levels, not a search over splits (tests/test_allocator.py checks it against every
split of small sets). A child's batch also grows with its callers' counts; so the search runs
again with the callers at the split it found, until a split comes back, and each split found
is judged at its own callers' counts (`_most_headroom`).

A model that is quiet, unmeasured or `held` keeps its count, and its instances count in the
budget; an idle one (no request finished or queued) goes to its minimum. A model the pipeline
model cannot measure but whose own signals size it (`alone`: a decoupled model that reports
its streams) gets the count those signals ask for, and its instances count in the budget too.

Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tritonscale.core import sizing
from tritonscale.core.budget import Limits, strictest
from tritonscale.core.latency import Choice, LatencyPrediction, LatencySearch
from tritonscale.core.pipeline_model import (
    MIN_REQUESTS_PER_WINDOW,
    NOISE_FLOOR,
    NOISE_SIGMAS,
    SATURATED_UTILIZATION,
    UNKNOWN_NOISE,
    PipelineModel,
    Stage,
)
from tritonscale.core.spec import AutoscalerSpec

# Per model, its capacity (requests per second) at a count.
Capacity = Mapping[str, Callable[[int], float]]

HIGH_UTILIZATION = sizing.HIGH_UTILIZATION
LOW_UTILIZATION = sizing.LOW_UTILIZATION
WITHIN_TOLERANCE = sizing.WITHIN_TOLERANCE
MAX_THROUGHPUT = "MaxThroughput"  # the budget is short: this split serves the most
REALLOCATED = "Reallocated"  # instances taken back for a stage that serves the set more
LOW_TRAFFIC = "LowTraffic"
IDLE = "Idle"
UNMEASURED = "Unmeasured"
HELD = "Held"

HOLD_TARGETS = "HoldTargets"  # every model under its target utilization, fewest instances
MOST_HEADROOM = "MostHeadroom"  # the budget is short: the most the set can serve
# A root's latency objective (spec.targets.latency) met at the fewest instances
# (tritonscale.core.latency): the objective and the models' reason.
LATENCY_OBJECTIVE = "LatencyObjective"

# Two floats of a headroom that differ by less than this are equal.
_EQUAL = 1e-9


@dataclass(frozen=True)
class Target:
    model: str
    current: int
    count: int
    reason: str
    message: str
    # What the model would take were there room: the count that holds it under its target
    # utilization, within [min, max]. Above
    # `count` where a budget is short: what the budget's demand ratio (the HPA's signal that
    # the pods are too few) counts. None: `count`.
    wanted: int | None = None

    @property
    def wanted_count(self) -> int:
        return self.count if self.wanted is None else self.wanted


@dataclass(frozen=True)
class Prediction:
    """What the chosen counts should serve, in requests per second at the set's roots."""

    capacity_rps: float  # the most the set serves at today's mix
    offered_rps: float  # the roots' arrival rate (a floor when a stage is saturated)
    expected_rps: float  # min(offered, capacity); capacity when a stage is saturated
    bottleneck: str | None  # the stage whose capacity over demand is least
    stage_capacity_rps: Mapping[str, float] = field(hash=False)  # per model, at its count

    def to_dict(self) -> dict[str, Any]:
        return {
            "capacityRps": self.capacity_rps,
            "offeredRps": self.offered_rps,
            "expectedRps": self.expected_rps,
            "bottleneck": self.bottleneck,
            "stageCapacityRps": dict(self.stage_capacity_rps),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Prediction:
        return cls(
            float(d["capacityRps"]),
            float(d["offeredRps"]),
            float(d["expectedRps"]),
            None if d.get("bottleneck") is None else str(d["bottleneck"]),
            {str(m): float(v) for m, v in d.get("stageCapacityRps", {}).items()},
        )


@dataclass(frozen=True)
class Allocation:
    targets: Mapping[str, Target] = field(hash=False)
    prediction: Prediction
    objective: str  # HOLD_TARGETS, LATENCY_OBJECTIVE or MOST_HEADROOM
    problem: str | None  # the budget cannot hold the models' minimums (one line)
    # Per root with a latency objective: what the model predicts of the chosen counts.
    latency: tuple[LatencyPrediction, ...] = ()

    @property
    def counts(self) -> dict[str, int]:
        return {model: target.count for model, target in self.targets.items()}


@dataclass(frozen=True)
class Room:
    """The budgets of a set: each holds its members' instances (and GPU memory) per pod."""

    budgets: tuple[tuple[str, Limits, Mapping[str, int]], ...]  # name, limits, member -> MiB

    @classmethod
    def of(cls, specs: Mapping[str, AutoscalerSpec]) -> Room:
        """The specs' budgets; members that disagree on a budget's limits get the strictest."""
        by_name: dict[str, dict[str, AutoscalerSpec]] = {}
        for model, spec in specs.items():
            if spec.budget is not None:
                by_name.setdefault(spec.budget.name, {})[model] = spec
        budgets = []
        for name, members in sorted(by_name.items()):
            limits = strictest(
                [
                    Limits(s.budget.instances_per_pod, s.budget.gpu_memory_per_pod_mib)
                    for s in members.values()
                    if s.budget is not None
                ]
            )
            memory = {
                model: s.budget.gpu_memory_per_instance_mib
                for model, s in members.items()
                if s.budget is not None
            }
            budgets.append((name, limits, memory))
        return cls(tuple(budgets))

    def fits(self, counts: Mapping[str, int]) -> bool:
        return self.overflow(counts) is None

    def overflow(self, counts: Mapping[str, int]) -> str | None:
        """Which budget the counts overrun, in words; None when they fit."""
        for name, limits, memory in self.budgets:
            used = sum(counts.get(model, 0) for model in memory)
            if used > limits.instances:
                return f"the budget {name} holds {limits.instances} instances per pod, {used} asked"
            if limits.gpu_memory_mib > 0:
                mib = sum(counts.get(model, 0) * cost for model, cost in memory.items())
                if mib > limits.gpu_memory_mib:
                    return (
                        f"the budget {name} holds {limits.gpu_memory_mib} MiB of GPU memory per "
                        f"pod, {mib} asked"
                    )
        return None


def allocate(
    pipeline: PipelineModel,
    specs: Mapping[str, AutoscalerSpec],
    current: Mapping[str, int],
    *,
    held: Mapping[str, int] | None = None,
    alone: Mapping[str, Target] | None = None,
    ceilings: Mapping[str, int] | None = None,
    settling: frozenset[str] = frozenset(),
    lowered: frozenset[str] = frozenset(),
    switch_margin: float = 0.0,
    latency: LatencySearch | None = None,
) -> Allocation:
    """Every model's count (see the module's docstring for the objective).

    `current`: each model's live count per pod. `held`: models that keep a given count
    whatever the load (paused, or out of their bounds). `alone`: the targets of models the
    pipeline model cannot measure, sized on their own signals by the caller; they go through
    behavior like the others and count in the budget. `ceilings`: the most instances that
    help a model (the verifier's corrections). `settling`: models whose estimates do not yet
    come from windows at their counts; they do not go down (a count just changed is not
    taken back on the estimates it was changed by). `lowered`: models whose count just went
    down and whose load has not risen since; they do not go back up until a window at their
    new count says so, for the same reason. `switch_margin`: relative headroom a better split
    must gain over today's before the counts move (the estimates' noise). `latency`: the
    roots with a latency objective (tritonscale.core.latency): their pipelines' models get the
    fewest instances that meet it, the other models their targets; where no split within the
    budget meets it, the split that serves the most, as when the budget is short.
    """
    held = dict(held or {})
    alone = alone or {}
    ceilings = ceilings or {}
    room = Room.of(specs)
    active = pipeline.active
    fixed: dict[str, Target] = {}
    for model, spec in specs.items():
        count = current[model]
        if model in held:
            fixed[model] = Target(model, count, held[model], HELD, "held by an earlier stage")
        elif model in alone:
            fixed[model] = alone[model]
        elif model in pipeline.unmeasured:
            kept = _within(count, spec.min_instances, spec.max_instances)
            fixed[model] = Target(model, count, kept, UNMEASURED, pipeline.unmeasured[model])
        elif pipeline.stages[model].idle:
            fixed[model] = Target(
                model,
                count,
                spec.min_instances,
                IDLE,
                "no request finished or queued in the window: minInstances is enough",
            )
        elif model not in active:
            kept = _within(count, spec.min_instances, spec.max_instances)
            fixed[model] = Target(
                model,
                count,
                kept,
                LOW_TRAFFIC,
                f"too little traffic to measure (fewer than "
                f"{MIN_REQUESTS_PER_WINDOW:g} requests in the window): keeps its count",
            )
    sized = {m: stage for m, stage in active.items() if m not in fixed}
    upper = {
        m: max(
            specs[m].min_instances,
            min(specs[m].max_instances, ceilings.get(m, specs[m].max_instances)),
        )
        for m in sized
    }
    helpful = upper  # the most instances that help each model, whatever it did last
    upper = {
        m: max(specs[m].min_instances, min(count, current[m])) if m in lowered else count
        for m, count in upper.items()
    }
    lower = {
        m: min(upper[m], max(specs[m].min_instances, current[m] if m in settling else 0))
        for m in sized
    }
    fixed_counts = {m: t.count for m, t in fixed.items()}

    def fits(counts: Mapping[str, int]) -> bool:
        return room.fits({**fixed_counts, **counts})

    needed = {m: _count_at_target(stage, specs[m], current[m]) for m, stage in sized.items()}
    at_target = {m: _within(n, lower[m], upper[m]) for m, n in needed.items()}
    problem = None
    counts = at_target
    shortfall: dict[str, float] = {}
    # Whether the budget holds every model under its target is a question of the load: a
    # model held at a count it was just lowered to still needs what its target says. Asked
    # with that hold, the room it leaves would go to another model, which is then lowered in
    # turn for the fewest instances, and the two would swap an instance every few windows.
    closed_loops = sorted(m for m in pipeline.roots if m in sized and sized[m].closed_loop)
    why = ""  # why the split serving the most is chosen
    choice = None
    if latency is not None and not closed_loops:
        choice = _latency_choice(latency, fixed_counts, lower, upper, at_target, fits)
    if choice is not None and choice.counts is not None:
        objective = LATENCY_OBJECTIVE
        counts = {**at_target, **{m: n for m, n in choice.counts.items() if m in sized}}
    elif choice is None and (
        not closed_loops and fits({m: _within(n, lower[m], helpful[m]) for m, n in needed.items()})
    ):
        objective = HOLD_TARGETS
    else:
        objective = MOST_HEADROOM
        why = _closed_loops(closed_loops) or (
            "no split within the budget meets the latency objective"
            if choice is not None
            else "the budget cannot hold every model under its target"
        )
        shortfall = served_short(pipeline, sized, current, switch_margin)
        for model, share in shortfall.items():
            why += (
                f"; today's split served {share:.2f} of what {model} was counted to serve at "
                f"the batch its callers' calls would make, and {model} is counted at that share"
            )
        most = _most_headroom(sized, current, lower, upper, fits, switch_margin, shortfall)
        counts = most if most is not None else dict(lower)
        if most is None:
            problem = room.overflow({**fixed_counts, **counts})
    prediction = predict(pipeline, sized, counts, shortfall)
    predicted = ()
    if latency is not None and choice is not None:
        predicted = latency.predictions({**current, **fixed_counts, **counts})
    # Beside a latency objective met, the models outside its pipelines hold their targets.
    sized_for = HOLD_TARGETS if objective == LATENCY_OBJECTIVE else objective
    targets = dict(fixed)
    for model, stage in sized.items():
        target = _target(
            stage, specs[model], current[model], counts[model], sized_for, why, prediction
        )
        wanted = _within(needed[model], specs[model].min_instances, specs[model].max_instances)
        if choice is not None and model in choice.wanted:
            wanted = choice.wanted[model]  # what the latency objective asks, were there room
            target = _latency_target(target, objective, predicted)
        targets[model] = replace(target, wanted=max(wanted, target.count))
    return Allocation(targets, prediction, objective, problem, predicted)


def _latency_choice(
    latency: LatencySearch,
    fixed_counts: Mapping[str, int],
    lower: Mapping[str, int],
    upper: Mapping[str, int],
    at_target: Mapping[str, int],
    fits: Callable[[Mapping[str, int]], bool],
) -> Choice:
    """The latency search over its pipelines' models: a fixed model (held, quiet, unmeasured)
    at its count, the others within their bounds; the models outside those pipelines at
    their targets, in the budget beside them."""
    models = latency.models
    low = {m: fixed_counts.get(m, lower.get(m, 1)) for m in models}
    high = {m: fixed_counts.get(m, upper.get(m, 1)) for m in models}
    others = {m: n for m, n in at_target.items() if m not in models}
    return latency.choose(low, high, lambda counts: fits({**others, **counts}))


def _latency_target(
    target: Target, objective: str, predicted: tuple[LatencyPrediction, ...]
) -> Target:
    """A model of a pipeline sized to its root's latency objective: the reason, and the
    objective against the prediction in its message."""
    said = "; ".join(p.describe for p in predicted)
    if objective == LATENCY_OBJECTIVE:
        return replace(
            target,
            reason=LATENCY_OBJECTIVE,
            message=f"the fewest instances that meet the latency objective: {said}",
        )
    return replace(target, message=f"{target.message}; {said}")


def _most_headroom(
    sized: Mapping[str, Stage],
    current: Mapping[str, int],
    lower: Mapping[str, int],
    upper: Mapping[str, int],
    fits: Callable[[Mapping[str, int]], bool],
    switch_margin: float,
    shortfall: Mapping[str, float],
) -> dict[str, int] | None:
    """The best split (`best_split`), or today's where it serves within `switch_margin` of
    it; None when not even the lower bounds fit. A stage in `shortfall` (`served_short`) is
    counted at that share of what the model says it serves, at every count.

    Where the set's requests pile up at some stages (`waited_at`), those stages serve what
    they can, while the capacity of a stage they do not pile up at is a lower bound (it
    serves what it is sent, and its batches grow when it is sent more): those get the
    benefit of the noise (`benefit_of_the_noise`). A split that gives instances to a stage
    the requests pile up at is then taken without today's protection: within the noise, the
    instances go where the requests wait (a child that reads as slow as its saturated parent
    at one instance, batching nothing, serves more once the parent sends it more). A child
    whose caller is busy on its own is not where they wait (`held_back`): its batch is the
    caller's to set.
    """
    demand = {m: stage.demand_rps for m, stage in sized.items()}
    today = {m: _within(current[m], lower[m], upper[m]) for m in sized}
    waited = {m for m, stage in sized.items() if waited_at(stage)} - held_back(sized)
    gain = dict.fromkeys(sized, 1.0)
    if waited:
        # A stage whose batches are already the largest its batcher forms serves no more
        # once it is sent more: its estimate is no lower bound.
        benefit = benefit_of_the_noise(switch_margin)
        gain = {
            m: 1.0 if m in waited or stage.batch_full else 1 + benefit for m, stage in sized.items()
        }
    gain.update(shortfall)

    def capacity(at: Mapping[str, int]) -> Capacity:
        """Each stage's capacity with its callers at their counts in `at`."""
        return {m: _at_callers(stage, at, gain[m]) for m, stage in sized.items()}

    best = best_split(demand, capacity(today), lower, upper, fits)
    if best is None:
        return None
    # A child's batch grows with its callers' counts, which the search holds at today's: run
    # it again with the callers at the split found, until a split comes back; the best of
    # them, each at its own callers' counts (among equals, the fewest instances, then the
    # first found).
    found = [best]
    for _ in range(_SEARCHES - 1):
        best = best_split(demand, capacity(best), lower, upper, fits)
        if best is None or best in found:
            break
        found.append(best)
    judged = [(headroom(split, demand, capacity(split)), split) for split in found]
    top = max(level for level, _ in judged)
    most, best = min(
        ((level, split) for level, split in judged if level >= top * (1 - _EQUAL)),
        key=lambda pair: sum(pair[1].values()),
    )
    if any(best[m] > today[m] for m in waited):
        return best  # instances go where the requests wait
    kept = headroom(today, demand, capacity(today))
    if fits(today) and most * (1 - switch_margin) <= kept < most * (1 - _EQUAL):
        return today  # it serves about as much: within the noise, a move is no gain
    return best


# The most times the split search runs with the callers at the split it found last (a split
# comes back after two or three on the pipelines measured).
_SEARCHES = 4


def _at_callers(stage: Stage, callers: Mapping[str, int], gain: float) -> Callable[[int], float]:
    return lambda count: stage.capacity_rps(count, callers) * gain


def waited_at(stage: Stage) -> bool:
    """Whether the set's requests pile up at the stage: it is overloaded (saturated with its
    queue growing, or a root whose queue stands), or its queue grows beyond the noise,
    saturated or not (a load that just rose). What it serves is then what it can."""
    return stage.overloaded or stage.queue_grows


def held_back(sized: Mapping[str, Stage]) -> set[str]:
    """The children of a caller that is busy on its own (`busy_on_its_own`): their limit is
    not measured, whatever their queue says.

    A child's requests are its callers' calls: it never has more of them at once than its
    callers' instances send, so the batches it runs (and the instance seconds a request
    costs it) are set by its callers' count as much as by its own. While a caller is full
    with its own work, a child at today's batch reads busier than it is (one with a dynamic
    batcher runs bigger batches once the caller sends more): its capacity is a lower bound,
    as that of a stage nothing waits at, even when its queue grows. The caller's estimates
    do not depend on its children's counts (its hold counts their execution, not their
    queue). So within the noise the caller is relieved first: where the child does not
    batch that costs at most the noise, and the child's next window shows what it serves.
    """
    return {
        child
        for stage in sized.values()
        if busy_on_its_own(stage)
        for child in stage.calls
        if child in sized
    }


def busy_on_its_own(stage: Stage) -> bool:
    """Whether what the stage finishes fills its instances by what an instance holds per
    request (its own work and its children's execution, without their queue): saturated by
    its own count, not by a wait in a child's queue (a caller in front of a slow child reads
    busy too, but finishes less than its instances could hold: there the child is the
    limit)."""
    instances = max(1, stage.pods) * stage.instances
    busy = stage.arrival_rps.value * stage.hold_per_request_s.value / instances
    return busy >= SATURATED_UTILIZATION


def benefit_of_the_noise(switch_margin: float) -> float:
    """How much more a stage nothing waits at may serve than its estimate says: as far as a
    reading strays by chance (`NOISE_SIGMAS` standard deviations, `switch_margin` being one),
    at most `UNKNOWN_NOISE` (what one window's noise is taken to be)."""
    return min(UNKNOWN_NOISE, NOISE_SIGMAS * switch_margin)


def headroom(counts: Mapping[str, int], demand: Mapping[str, float], capacity: Capacity) -> float:
    """How many times over the stages serve their demand: the least of capacity / demand."""
    levels = [capacity[m](counts[m]) / demand[m] for m in counts if demand[m] > 0]
    return min(levels, default=math.inf)


def fewest_for(
    level: float,
    demand: Mapping[str, float],
    capacity: Capacity,
    lower: Mapping[str, int],
    upper: Mapping[str, int],
) -> dict[str, int] | None:
    """Each stage's fewest instances that serve `level` times its demand; None if one cannot.
    A capacity must not fall as the count grows."""
    counts = {}
    for model in lower:
        wanted = level * demand[model] * (1 - _EQUAL)
        count = next(
            (n for n in range(lower[model], upper[model] + 1) if capacity[model](n) >= wanted),
            upper[model] + 1,
        )
        if count > upper[model]:
            return None
        counts[model] = count
    return counts


def best_split(
    demand: Mapping[str, float],
    capacity: Capacity,
    lower: Mapping[str, int],
    upper: Mapping[str, int],
    fits: Callable[[Mapping[str, int]], bool],
) -> dict[str, int] | None:
    """The counts with the most headroom that fit, the fewest instances among equals; None
    when even the lower bounds do not fit. `fits` must be monotone: fewer instances of any
    model never break a budget that more fit in; a capacity must not fall as the count
    grows."""
    if not fits(dict(lower)):
        return None
    levels = sorted(
        {
            capacity[m](count) / demand[m]
            for m in lower
            if demand[m] > 0
            for count in range(lower[m], upper[m] + 1)
        }
    )
    best = dict(lower)
    # The fewest instances of a level grow with the level, so the levels that fit are a prefix.
    low, high = 0, len(levels) - 1
    while low <= high:
        middle = (low + high) // 2
        counts = fewest_for(levels[middle], demand, capacity, lower, upper)
        if counts is not None and fits(counts):
            best, low = counts, middle + 1
        else:
            high = middle - 1
    return best


def served_short(
    pipeline: PipelineModel,
    sized: Mapping[str, Stage],
    current: Mapping[str, int],
    switch_margin: float,
) -> dict[str, float]:
    """A child that limits today's split at a batch it does not run, with the share of the
    capacity counted for it that the set served; empty where there is none.

    A child with a dynamic batcher is counted at the batch its callers' calls in flight
    would make (`Stage.batch_at`), not at the one it runs: a lower bound would keep it from
    ever getting an instance its callers will fill. When a root is a closed loop, what it
    finishes is what today's split serves, measured. If the model's limit at today's counts
    is such a child and the set served clearly less than it was counted to serve (by more
    than `NOISE_SIGMAS` times `switch_margin`), the calls did not all reach it at once: its
    callers work between them, and a batch starts with those that wait (three calls to a
    child that takes two run as batches of two and one, one of the three always away). It is
    then counted at that share of its capacity at every count, and a split that relieves it
    can win over today's. Stages counted at the batch they run are left as they are: their
    estimates are measured, and a parent's leaves out, on purpose, the queue its children
    would lose at another split. None of it while a stage's estimates come from other counts.
    """
    roots = [m for m in pipeline.roots if m in sized]
    if not any(sized[m].closed_loop for m in roots) or not all(
        stage.measured_at_counts for stage in sized.values()
    ):
        return {}
    today = predict(pipeline, sized, current)
    limit = today.bottleneck
    served = sum(sized[m].arrival_rps.value for m in roots)
    if limit is None or served <= 0:
        return {}
    stage = sized[limit]
    if stage.batch_at(current[limit], current) <= stage.mean_batch * (1 + NOISE_FLOOR):
        return {}
    if today.capacity_rps <= served * (1 + NOISE_SIGMAS * switch_margin):
        return {}
    return {limit: served / today.capacity_rps}


def predict(
    pipeline: PipelineModel,
    sized: Mapping[str, Stage],
    counts: Mapping[str, int],
    shortfall: Mapping[str, float] | None = None,
) -> Prediction:
    """What the counts should serve: the roots' demand times the stages' least headroom, each
    stage at the batch it would reach with its callers at their counts (`Stage.capacity_rps`),
    a stage in `shortfall` at that share of it (`served_short`)."""
    shortfall = shortfall or {}
    capacity = {
        m: stage.capacity_rps(counts[m], counts) * shortfall.get(m, 1.0)
        for m, stage in sized.items()
    }
    ratios = {
        m: capacity[m] / stage.demand_rps for m, stage in sized.items() if stage.demand_rps > 0
    }
    bottleneck = min(ratios, key=lambda m: (ratios[m], m)) if ratios else None
    level = ratios[bottleneck] if bottleneck is not None else 0.0
    offered = sum(sized[m].demand_rps for m in pipeline.roots if m in sized)
    saturated = any(stage.saturated for stage in sized.values())
    capacity_rps = offered * level
    expected = capacity_rps if saturated else min(offered, capacity_rps)
    return Prediction(capacity_rps, offered, expected, bottleneck, capacity)


def _count_at_target(stage: Stage, spec: AutoscalerSpec, current: int) -> int:
    """The fewest instances that hold the stage under its target utilization, with the
    policy's tolerance (a ratio within it keeps the count) and scale-down margin (down only
    to a count where the load reads clearly below the target)."""
    target = spec.targets.utilization
    # Per pod: the demand is the set's, spread over its pods.
    needed = stage.demand_rps / (target * stage.capacity_per_instance_rps * max(1, stage.pods))
    ratio = needed / current
    if round(abs(1.0 - ratio), 9) <= spec.tolerance:
        return current
    if ratio > 1:
        return math.ceil(round(needed, 9))
    return min(current, math.ceil(round(needed / (1 - sizing.SCALE_DOWN_MARGIN), 9)))


def _target(
    stage: Stage,
    spec: AutoscalerSpec,
    current: int,
    count: int,
    objective: str,
    why: str,
    prediction: Prediction,
) -> Target:
    """The model's target and the reason for it; `why`: why the split serving the most was
    chosen (MOST_HEADROOM)."""
    utilization_then = stage.demand_rps / (
        count * max(1, stage.pods) * stage.capacity_per_instance_rps
    )
    seen = (
        f"demand {stage.demand_rps:.1f} req/s, {1000 * stage.hold_per_request_s.value:.1f} ms "
        f"of an instance per request: busy {utilization_then:.2f} per instance at "
        f"{_instances(count)} (target {spec.targets.utilization:.2f})"
    )
    if objective == HOLD_TARGETS:
        reason = (
            HIGH_UTILIZATION
            if count > current
            else LOW_UTILIZATION
            if count < current
            else WITHIN_TOLERANCE
        )
        return Target(stage.model, current, count, reason, seen)
    where = (
        "the set's bottleneck"
        if stage.model == prediction.bottleneck
        else f"bottleneck {prediction.bottleneck}"
    )
    share = f"{why}; this split serves the most, {prediction.capacity_rps:.1f} req/s ({where})"
    reason = REALLOCATED if count < current else MAX_THROUGHPUT
    return Target(stage.model, current, count, reason, f"{share}: {seen}")


def _closed_loops(models: list[str]) -> str:
    """Why the split serving the most is chosen when roots are closed loops ("" for none)."""
    if not models:
        return ""
    if len(models) == 1:
        return (
            f"{models[0]} is a closed loop (saturated, its clients waiting: it serves more as "
            f"it is given more)"
        )
    return (
        f"{' and '.join(models)} are closed loops (saturated, their clients waiting: they "
        f"serve more as they are given more)"
    )


def _within(count: int, lowest: int, highest: int) -> int:
    return max(lowest, min(count, highest))


def _instances(count: int) -> str:
    return f"{count} instance" if count == 1 else f"{count} instances"
