"""One loop per pod set: kopf's daemon of the set's leader runs its ticks and its admission.

kopf schedules work per object, and a pod set is not an object: it follows from the specs of
its members (tritonscale.control.pod_sets). So every autoscaler has one daemon (`pod_set_loop`),
which kopf starts with the object, stops when the object goes, cancels at the operator's exit
and stops while a peer holds the operator paused (peering); and the daemon of the set's leader
runs the set: its ticks at the set's phase (tritonscale.control.loop.run_set) and, beside
them, the admission of the pods its members select (tritonscale.drivers.gates.admit_set).
The leader is decided from kopf's index of the autoscalers by a rule every replica computes
alike, with no lock and no word to the others: the first member by name
(`PodSet.leader`), of a set this replica's shard owns (`Shard.owns`).

The other members' daemons sleep until the namespace's sets change (the index wakes them:
tritonscale.drivers.runtime.Signal), never on a clock: a member added, deleted or given
another selector, budget or interval may make one of them the leader, and the old leader's
run ends at the same wake-up.

Why a daemon per autoscaler rather than one task per set started from a start-up handler:
kopf stops daemons when a peer pauses the operator and starts them again on resume, and
cancels them with their object; a task of the operator's own would have to find out about
pausing through kopf's private state. The sleeping daemons cost a coroutine each.

After a tick each member's status is written (tritonscale.drivers.status: what changed, the
signals that move with time at most once a minute) and its events posted. The next tick reads
the state back from kopf's index, which shows a write once its watch event has arrived,
typically within milliseconds of the write, an interval before the next tick: no copy of
what was written is kept beside it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import kopf

from tritonscale.control import set_tick
from tritonscale.control.loop import run_set
from tritonscale.control.pod_sets import PodSet
from tritonscale.control.reconcile import budget_key, budget_limits
from tritonscale.control.tick import ReconcileState, TickResult, iso_time
from tritonscale.core.selectors import selector_to_string
from tritonscale.drivers import pods
from tritonscale.drivers.gates import admit_set, until
from tritonscale.drivers.runtime import Member, Runtime, Signal
from tritonscale.drivers.status import (
    GROUP,
    HEARTBEAT,
    PLURAL,
    VERSION,
    Reported,
    changed,
    post_events,
    reference,
)

# A tick waits for at most a load's deadline; past CANCELLATION_S after a stop (the object
# deleted, the operator leaving) kopf cancels it, and a load in flight stays in flight.
CANCELLATION_S = 10.0


class Tenure:
    """How long a daemon leads its set (tritonscale.control.loop.Stopped): until kopf stops
    the daemon or the set has another leader; `wait` wakes when the namespace's sets change,
    so that the loop looks again."""

    def __init__(
        self,
        stopped: kopf.DaemonStopped,
        changed: Signal,
        leading: Callable[[], PodSet | None],
    ) -> None:
        self._stopped, self._changed, self._leading = stopped, changed, leading

    def is_set(self) -> bool:
        return self._stopped.is_set() or self._leading() is None

    async def wait(self, timeout: float | None = None) -> bool:
        woken = self._changed.next()
        if not self.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(until(self._stopped, woken), timeout)
        return self.is_set()


@kopf.daemon(GROUP, VERSION, PLURAL, id="pod-set", cancellation_timeout=CANCELLATION_S)
async def pod_set_loop(
    stopped: kopf.DaemonStopped,
    name: str,
    namespace: str,
    spec: kopf.Spec,
    memo: kopf.Memo,
    triton_pods: kopf.Index[str, pods.TritonPod],
    waiting_pods: kopf.Index[str, pods.TritonPod],
    autoscalers: kopf.Index[str, Member],
    logger: kopf.Logger,
    **_: Any,
) -> None:
    """Run this autoscaler's set while it leads it; sleep until the sets change while not."""
    runtime: Runtime = memo.runtime
    changed_sets = runtime.sets_signal(namespace)

    def leading() -> PodSet | None:
        pod_set = runtime.set_of(namespace, name)
        if pod_set is None or pod_set.leader != name or not runtime.config.shard.owns(pod_set):
            return None
        return pod_set

    async def tick(due: list[str], now: float, finished: Callable[[str], None]) -> None:
        pod_set = leading()
        if pod_set is not None:
            await tick_set(runtime, pod_set, due, now, triton_pods, autoscalers, logger, finished)
            if waiting_pods.get(namespace):
                # A pod whose counts could not be read is looked at again at the set's pace.
                ticked.notify()

    ticked = Signal()
    try:
        while not stopped.is_set():
            woken = changed_sets.next()
            if leading() is None:
                await until(stopped, woken)
                continue
            tenure = Tenure(stopped, changed_sets, leading)
            await _together(
                run_set(tenure, leading, tick, idle_s=runtime.config.invalid_spec_recheck_s),
                admit_set(
                    runtime, namespace, tenure, leading, ticked, waiting_pods, autoscalers, logger
                ),
            )
    finally:
        reason = stopped.reason or kopf.DaemonStoppingReason(0)
        if reason & kopf.DaemonStoppingReason.RESOURCE_DELETED:
            # A tick that ended after the deletion handler ran recorded the series again.
            forget(runtime, namespace, name, str(spec.get("model", "?")))
        if reason & kopf.DaemonStoppingReason.OPERATOR_PAUSING:
            # A peer holds this operator paused and may change the pods' counts meanwhile:
            # what this operator read of them, and planned from it, is void.
            runtime.actuator.forget_configs()
            runtime.planners.clear()


async def _together(*runs: Awaitable[None]) -> None:
    """Run `runs` to their ends; the first to fail cancels the others and is raised."""
    tasks = [asyncio.ensure_future(run) for run in runs]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def forget(runtime: Runtime, namespace: str, name: str, model: str) -> None:
    """What the operator kept of an autoscaler that is gone: its series (a stale timestamp
    would fire alerts) and its place in its budget (a budget without members loses its series
    too)."""
    runtime.forget(namespace, name)
    runtime.metrics.forget(namespace, name, model)
    for _namespace, budget in runtime.ledger.forget(namespace, name):
        runtime.metrics.forget_budget(namespace, budget)


async def tick_set(
    runtime: Runtime,
    pod_set: PodSet,
    due: Sequence[str],
    now: float,
    triton_pods: kopf.Index[str, pods.TritonPod],
    autoscalers: kopf.Index[str, Member],
    logger: Any,
    finished: Callable[[str], None] = lambda _name: None,
) -> None:
    """One tick of a pod set: its due members decided together, then each one's status and
    events written as soon as its result is ready (`finished(name)` after it)."""
    namespace = pod_set.namespace
    found = {m.name: m for m in autoscalers.get(namespace, [])}
    entries = [found[name] for name in due if name in found]
    # A budget is granted once per tick of its set, through the operator's one ledger; after
    # a restart it is seeded from every member's status, so that a member that ticks first
    # cannot take the room the others hold.
    for key, limits in {
        budget_key(namespace, m.spec): budget_limits(m.spec)
        for m in entries
        if m.spec is not None and m.spec.budget is not None
    }.items():
        seeds = [m.claim for m in found.values() if m.budget == key and m.claim]
        runtime.ledger.seed(key, limits, seeds)
    namespace_pods = triton_pods.get(namespace, [])
    endpoints_of: dict[str, list[Any]] = {}  # by selector: the members of a set share one
    members = []
    for entry in entries:
        endpoints: list[Any] = []
        if entry.spec is not None:
            selector = selector_to_string(entry.spec.selector)
            if selector not in endpoints_of:
                endpoints_of[selector] = pods.ready_endpoints(
                    namespace_pods,
                    entry.spec.selector,
                    runtime.config.triton_http_port,
                    runtime.config.triton_metrics_port,
                )
            endpoints = endpoints_of[selector]
        members.append(
            set_tick.Member(
                entry.name,
                entry.spec or entry.raw_spec,
                ReconcileState.from_status(entry.status),
                endpoints,
            )
        )
    by_name = {entry.name: entry for entry in entries}

    async def write(name: str, result: TickResult) -> None:
        runtime.health.ticks += 1
        runtime.health.last_tick_at = result.finished_at
        await _write(runtime, pod_set, by_name[name], result, logger)
        finished(name)

    await set_tick.tick_set(
        members,
        runtime.source,
        runtime.actuator,
        now,
        namespace=namespace,
        ledger=runtime.ledger,
        healer=runtime.healer,
        metrics=runtime.metrics,
        on_result=write,
        planner=runtime.planner(pod_set),
    )


async def _write(
    runtime: Runtime, pod_set: PodSet, entry: Member, result: TickResult, logger: Any
) -> None:
    """A member's status (what changed) and events after its set's tick."""
    namespace = pod_set.namespace
    new_status = result.status()
    new_status[HEARTBEAT] = iso_time(result.at)
    new_status["podSet"] = {**pod_set.to_dict(), "shard": str(runtime.config.shard)}
    if entry.generation is not None:
        new_status["observedGeneration"] = entry.generation
    fields = changed(entry.status, new_status)
    if fields:
        problem = await runtime.status.patch(namespace, entry.name, fields)
        if problem is not None:
            logger.warning(problem)
    reported = runtime.reported.setdefault((namespace, entry.name), Reported())
    post_events(reference(namespace, entry.name, entry.uid), result, reported, logger)
