"""The readinessGate of Triton pods, through kopf: who opens it, who closes it, and when
(what a pod must run to join: tritonscale.drivers.admission).

- A waiting pod that no autoscaler selects joins at once, from its own watch event
  (`admit_unselected_pods`); a pod whose container restarted behind an open gate has it
  closed from the same event (`close_gate_of_restarted_pods`).
- The pods that a set's members select are admitted by the set's loop (`admit_set`, beside
  its ticks in tritonscale.drivers.set_loop, so that a pod's load never delays a tick): it
  brings each waiting pod to its members' counts and opens the gate once every autoscaler
  that selects the pod is matched. It sleeps until something a waiting pod waits for may
  have changed: a pod starts or goes on waiting (its events, through the `waiting_pods`
  index), an autoscaler's count or spec changes (the `autoscalers` index), a load that
  outlived its deadline ends, or the set ticks. No clock: a pod that waits on nothing new is
  not looked at again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection
from typing import Any

import kopf

from tritonscale.control.loop import Stopped
from tritonscale.control.pod_sets import PodSet
from tritonscale.drivers import admission, pods
from tritonscale.drivers.runtime import Member, Runtime, Signal, autoscalers_of


@kopf.on.event("pods", when=lambda body, **_: pods.waits_for_instances(body))
async def admit_unselected_pods(
    body: kopf.Body,
    namespace: str,
    memo: kopf.Memo,
    autoscalers: kopf.Index[str, Member],
    logger: kopf.Logger,
    **_: Any,
) -> None:
    """A pod waiting at the gate that no autoscaler selects joins at once (its sets' loops
    admit the others)."""
    pod = pods.TritonPod.from_body(body)
    if admission.selecting(pod, autoscalers_of(autoscalers.get(namespace, []))):
        return
    if memo.runtime.config.shard.index != 0:
        return  # a pod of no set: the first replica opens its gate
    await set_gate(memo.runtime, pod, admission.judge(pod, [], {}), logger)


@kopf.on.event("pods", when=lambda body, **_: pods.restarted_behind_open_gate(body))
async def close_gate_of_restarted_pods(
    body: kopf.Body,
    namespace: str,
    memo: kopf.Memo,
    autoscalers: kopf.Index[str, Member],
    logger: kopf.Logger,
    **_: Any,
) -> None:
    """A container of the pod restarted after its gate opened (an OOM kill, a failed liveness
    probe): Triton runs its repository's counts again. Close the gate while it starts, so the
    pod stays out of the Service until its sets' loops have brought it back."""
    pod = pods.TritonPod.from_body(body)
    members = autoscalers.get(namespace, [])
    chosen = admission.selecting(pod, autoscalers_of(members))
    runtime: Runtime = memo.runtime
    if chosen and not runtime.owns(namespace, chosen[0].name):
        return  # the replica that owns the set of its first autoscaler closes it
    if not chosen and runtime.config.shard.index != 0:
        return
    await set_gate(runtime, pod, admission.restarted(pod), logger)


@kopf.on.event("pods", when=lambda type, **_: type == "DELETED")
async def forget_deleted_pods(uid: str, memo: kopf.Memo, **_: Any) -> None:
    """A deleted pod's last gate condition is forgotten (the writer skips repeats per pod)."""
    memo.runtime.pod_status.forget(uid)


async def admit_set(
    runtime: Runtime,
    namespace: str,
    tenure: Stopped,
    leading: Callable[[], PodSet | None],
    ticked: Signal,
    waiting_pods: kopf.Index[str, pods.TritonPod],
    autoscalers: kopf.Index[str, Member],
    logger: Any,
) -> None:
    """Admit the waiting pods that the members of the set `leading()` select, until `tenure`
    ends (kopf stops the daemon, or the loop no longer leads its set); `ticked` fires when
    the set has ticked."""
    signal = runtime.admission_signal(namespace)
    while not tenure.is_set():
        woken = (signal.next(), ticked.next())
        pod_set = leading()
        # A copy: the index changes under the loop while a pod is being admitted.
        waiting = list(waiting_pods.get(namespace, []))
        if pod_set is not None and waiting:
            members = list(autoscalers.get(namespace, []))
            await asyncio.gather(
                *(_admit(runtime, pod, pod_set, members, logger) for pod in waiting)
            )
        await until(tenure, *woken)


async def until(stopped: Stopped, *events: asyncio.Event) -> None:
    """Until one of `events` is set or `stopped.wait()` returns."""
    waits = [asyncio.ensure_future(stopped.wait())]
    waits += [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


async def _admit(
    runtime: Runtime,
    pod: pods.TritonPod,
    pod_set: PodSet,
    members: Collection[Member],
    logger: Any,
) -> None:
    """Bring a waiting pod to the counts of the set's members that select it, then admit it
    if every autoscaler that selects it is matched (tritonscale.drivers.admission)."""
    if not pod.waiting_for_instances:
        return
    everyone = autoscalers_of(members)
    chosen = admission.selecting(pod, everyone)
    selecting = {autoscaler.name for autoscaler in chosen}
    ours = [m for m in members if m.name in pod_set.members and m.name in selecting]
    if not ours:
        return
    endpoint = pod.endpoint(runtime.config.triton_http_port, runtime.config.triton_metrics_port)
    await asyncio.gather(*(_bring(runtime, endpoint, member) for member in ours))
    live: dict[str, int | None] = {}
    for autoscaler in chosen:
        counts, _ = await runtime.actuator.live_counts([endpoint], autoscaler.model)
        live[autoscaler.model] = counts.get(pod.name)
    verdict = admission.judge(pod, everyone, live)
    if verdict.admit:
        await set_gate(runtime, pod, verdict, logger)
    else:
        logger.debug(verdict.message)


async def _bring(runtime: Runtime, endpoint: Any, member: Member) -> None:
    """The pod's count of the member's model, made the member's (where it acts and has one)."""
    autoscaler, actuator = member.autoscaler, runtime.actuator
    if autoscaler is None or not autoscaler.acting or autoscaler.desired is None:
        return
    counts, _ = await actuator.live_counts([endpoint], autoscaler.model)
    if counts.get(endpoint.name) != autoscaler.desired and not actuator.in_flight(
        endpoint, autoscaler.model
    ):
        await actuator.apply([endpoint], autoscaler.model, autoscaler.desired, member.instance_kind)


async def set_gate(
    runtime: Runtime, pod: pods.TritonPod, verdict: admission.Verdict, logger: Any
) -> None:
    problem = await runtime.pod_status.set_gate(pod, verdict, time.time())
    if problem is not None:
        logger.warning(problem)
    else:
        state = "True" if verdict.admit else "False"
        logger.info(f"{pods.INSTANCES_READY} of {pod.name}: {state} ({verdict.message})")
