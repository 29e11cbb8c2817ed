"""One tick of a pod set: every due member observed, the metrics read once, decided together.

    results = await tick_set(
        [Member("pipeline-async", spec_a, state_a, endpoints), Member("branch-embed", ...)],
        source, actuator, now=time.time(), namespace="ml", ledger=ledger, healer=healer,
    )

Both drivers run their ticks through here (tritonscale.control.pod_sets says what a set is).
A set tick:

1. observes every member (heal, the live counts of its model and children), together;
2. reads the metrics once for the members that share pods: one snapshot of all their models
   over the longest window any asks (one read of each pod when scraping, one query per
   signal with Prometheus);
3. decides every member together (tritonscale.control.set_planner);
4. grants the budgets once: every member that names one claims first, then each is granted,
   the ones that give instances back first, so that what they release is there for the
   others in the same tick;
5. issues the loads: members without a budget at once, together; a budget's members one
   after another, in the grant's order (each settles what its pods then run); either way an
   increase of a caller goes after its callees' loads of the tick (`call_depth` says why).

Errors are results, not exceptions (tritonscale.control.reconcile): a member whose observation
or metrics fail gets its own TickResult with the reason; the others go on. `reconcile` is
the tick of one autoscaler alone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tritonscale.control.ledger import BudgetLedger
from tritonscale.control.operator_metrics import OperatorMetrics
from tritonscale.control.reconcile import (
    Observation,
    Plan,
    budget_key,
    budget_limits,
    finish,
    model_of,
    observe,
    read_snapshot,
)
from tritonscale.control.set_planner import SetPlanner
from tritonscale.control.tick import BACKOFF_BASE_S, BACKOFF_CAP_S, ReconcileState, TickResult
from tritonscale.core.signals import MetricSnapshot, MetricsUnavailable
from tritonscale.core.spec import AutoscalerSpec
from tritonscale.metrics.source import MetricsSource
from tritonscale.triton.actuator import Actuator
from tritonscale.triton.endpoints import Endpoint
from tritonscale.triton.healing import Healer


@dataclass(frozen=True)
class Member:
    """One autoscaler of the set, due at this tick."""

    name: str
    spec: AutoscalerSpec | Mapping[str, Any]  # the raw spec where it does not read
    state: ReconcileState
    endpoints: Sequence[Endpoint]  # the ready pods its selector matches
    child_instances: Mapping[str, int] | None = None  # None: read from the pods


async def tick_set(
    members: Sequence[Member],
    source: MetricsSource,
    actuator: Actuator,
    now: float,
    *,
    namespace: str = "local",
    ledger: BudgetLedger | None = None,
    healer: Healer | None = None,
    metrics: OperatorMetrics | None = None,
    backoff_base_s: float = BACKOFF_BASE_S,
    backoff_cap_s: float = BACKOFF_CAP_S,
    on_result: Callable[[str, TickResult], Awaitable[None]] | None = None,
    planner: SetPlanner | None = None,
) -> dict[str, TickResult]:
    """Tick `members` as one; each member's result, by name. Never raises for Triton's or
    Prometheus's troubles. The `planner` is the set's, kept by the driver between ticks (its
    pipeline windows and the verifier's checks live there); without one, a fresh planner
    decides from this tick's window and the members' behavior histories alone.

    `on_result(name, result)` is awaited for each member as soon as its result is ready (a
    member whose load waits for its deadline does not hold back the others' reports)."""
    started = time.monotonic()
    observed = await asyncio.gather(
        *(
            observe(
                m.spec,
                m.endpoints,
                actuator,
                m.state,
                now,
                child_instances=m.child_instances,
                healer=healer,
            )
            for m in members
        )
    )
    done: dict[str, TickResult] = {}

    async def finished(name: str, result: TickResult) -> TickResult:
        done[name] = result
        if metrics is not None:
            metrics.record(result, namespace, name)
        if on_result is not None:
            await on_result(name, result)
        return result

    observations: dict[str, Observation] = {}
    for member, seen in zip(members, observed, strict=True):
        if isinstance(seen, TickResult):
            await finished(member.name, seen)
        else:
            observations[member.name] = seen
    # A pod the healer read while observing was read for this tick: it serves the snapshot.
    snapshots = await _read_metrics(source, observations, time.monotonic() - started)
    plans = {name: seen.planned(snapshots[_reading(seen)]) for name, seen in observations.items()}
    set_planner = planner if planner is not None else SetPlanner()
    plans = set_planner.planned(plans, now)
    if metrics is not None and set_planner.name and set_planner.last is not None:
        prediction = set_planner.prediction
        metrics.record_set(
            namespace,
            set_planner.name,
            prediction.expected_rps if prediction is not None else None,
            set_planner.last.served_rps,
        )

    budgeted = {name: plan for name, plan in plans.items() if plan.spec.budget is not None}
    if ledger is not None:
        for name, plan in budgeted.items():
            key = budget_key(namespace, plan.spec)
            ledger.claim(key, budget_limits(plan.spec), plan.claim(name))
        for name in plans.keys() - budgeted.keys():
            for _namespace, budget in ledger.forget(namespace, name):
                if metrics is not None:
                    metrics.forget_budget(namespace, budget)
    else:
        budgeted = {}

    depth = call_depth({name: plan.spec for name, plan in plans.items()})
    finishing = {name: asyncio.Event() for name in plans}

    async def finish_member(name: str, plan: Plan) -> None:
        try:
            await _finish_member(name, plan)
        finally:
            finishing[name].set()

    async def _finish_member(name: str, plan: Plan) -> None:
        if _change(plan) > 0:
            # An increase waits for its callees of this tick (`call_depth`); a decrease does
            # not (the budget's decreases go first, whatever their depth).
            for callee, other in plans.items():
                if other.spec.model in plan.spec.calls and depth[callee] < depth[name]:
                    await finishing[callee].wait()
        if name not in budgeted or ledger is None:
            result = await finish(
                plan, actuator, backoff_base_s=backoff_base_s, backoff_cap_s=backoff_cap_s
            )
        else:
            key = budget_key(namespace, plan.spec)
            result = await finish(
                plan,
                actuator,
                ledger.grant(key, name),
                backoff_base_s=backoff_base_s,
                backoff_cap_s=backoff_cap_s,
            )
            ledger.settle(key, name, result.holding)
        if any(p.ok and not p.pending and p.after != p.before for p in result.applied):
            # In the ticks' clock: `now` plus the time this tick has taken.
            set_planner.went_live(plan.spec.model, now + result.duration_s)
        await finished(name, result)

    async def finish_budgeted() -> None:
        # Decreases first: what they release is there for the increases of this tick; then
        # the increases, callees before their callers.
        def order(name: str) -> tuple[bool, int, int, str]:
            change = _change(budgeted[name])
            return change > 0, depth[name] if change > 0 else 0, change, name

        for name in sorted(budgeted, key=order):
            await finish_member(name, budgeted[name])

    alone = [name for name in plans if name not in budgeted]
    await asyncio.gather(finish_budgeted(), *(finish_member(name, plans[name]) for name in alone))
    return {m.name: done[m.name] for m in members}


def call_depth(specs: Mapping[str, AutoscalerSpec]) -> dict[str, int]:
    """Per member, how deep its model calls into the other members' models (`spec.calls`):
    0 for one that calls none of them, one more than its deepest callee otherwise (a cycle
    is cut where it closes). A tick loads a caller after its callees.

    Why: under overload, Triton's reload of a BLS caller returns only once its old instances'
    queue has drained, and that queue drains only as fast as the callees serve; Triton runs
    one load at a time, so a callee's load sent beside its caller's waits behind it. Measured
    with 1,800 requests queued at pipeline_async (one instance each, open loop at 1.4 x
    capacity): pipeline_async and branch_embed to 2 at once, neither load done at 30 s
    (83.5 s in `tritonscale demo`, once the load fell); branch_embed first, 0.1 s, then
    pipeline_async, 18.2 s, the queue drained."""
    by_model = {spec.model: name for name, spec in specs.items()}
    depth: dict[str, int] = {}

    def of(name: str, path: frozenset[str]) -> int:
        if name not in depth:
            callees = [
                by_model[model]
                for model in specs[name].calls
                if model in by_model and by_model[model] not in path | {name}
            ]
            depth[name] = 1 + max((of(c, path | {name}) for c in callees), default=-1)
        return depth[name]

    for name in specs:
        of(name, frozenset())
    return depth


def _change(plan: Plan) -> int:
    return plan.decision.desired_instances - plan.current


def _reading(seen: Observation) -> tuple[str, ...]:
    """Members that read the same pods share one snapshot (over the longest window any of
    them asks): the planner decides them together."""
    return tuple(sorted(e.name for e in seen.endpoints))


async def _read_metrics(
    source: MetricsSource, observations: Mapping[str, Observation], reuse_within_s: float
) -> dict[tuple[str, ...], MetricSnapshot | MetricsUnavailable]:
    """One snapshot per reading (the pods read) of the set, the readings together. The pods
    read are those that answered any member sharing the reading; a pod read in the last
    `reuse_within_s` seconds is not read again."""
    groups: dict[tuple[str, ...], list[Observation]] = {}
    for seen in observations.values():
        groups.setdefault(_reading(seen), []).append(seen)

    async def read(group: list[Observation]) -> MetricSnapshot | MetricsUnavailable:
        answered = {pod.name for seen in group for pod in seen.pods}
        pods = [e for e in group[0].endpoints if e.name in answered]
        return await read_snapshot(source, pods, [seen.metrics for seen in group], reuse_within_s)

    keys = list(groups)
    snapshots = await asyncio.gather(*(read(groups[key]) for key in keys))
    return dict(zip(keys, snapshots, strict=True))


async def reconcile(
    spec: AutoscalerSpec | Mapping[str, Any],
    endpoints: Sequence[Endpoint],
    source: MetricsSource,
    actuator: Actuator,
    state: ReconcileState,
    now: float,
    *,
    child_instances: Mapping[str, int] | None = None,
    metrics: OperatorMetrics | None = None,
    namespace: str = "local",
    autoscaler: str | None = None,
    backoff_base_s: float = BACKOFF_BASE_S,
    backoff_cap_s: float = BACKOFF_CAP_S,
    healer: Healer | None = None,
    ledger: BudgetLedger | None = None,
    planner: SetPlanner | None = None,
) -> TickResult:
    """One autoscaler's tick: a set of one, through `tick_set`. Pass the same `planner` every
    tick to keep the pipeline's windows and the verifier's checks between ticks.

    `spec` may be the raw CR spec (a mapping): an invalid one gives an InvalidSpec result.
    `autoscaler` (the member's name, under which `metrics` records it) defaults to the model's.
    """
    name = autoscaler or model_of(spec)
    member = Member(name, spec, state, endpoints, child_instances)
    results = await tick_set(
        [member],
        source,
        actuator,
        now,
        namespace=namespace,
        ledger=ledger,
        healer=healer,
        metrics=metrics,
        backoff_base_s=backoff_base_s,
        backoff_cap_s=backoff_cap_s,
        planner=planner,
    )
    return results[name]
