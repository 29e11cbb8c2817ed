"""kopf's indexes of what the driver watches: the pods, the pods waiting at the gate, and the
autoscalers, each by namespace.

kopf keeps them up to date from its watches and hands them to every handler, so nothing
lists the API server. An index function sees every event of its objects: where the event may
concern a loop that sleeps, it wakes it (tritonscale.drivers.runtime.Signal), so that the
loops wait on what changes instead of looking on a clock.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import kopf

from tritonscale.control.reconcile import budget_key
from tritonscale.core.budget import Claim
from tritonscale.core.spec import InvalidSpec
from tritonscale.drivers import admission, pods
from tritonscale.drivers.runtime import Member, Runtime, parse_spec
from tritonscale.drivers.status import GROUP, PLURAL, VERSION

# Every handler is a coroutine: kopf then runs it on its event loop, not in its executor.


@kopf.index("pods")
async def triton_pods(body: kopf.Body, namespace: str, **_: Any) -> dict[str, pods.TritonPod]:
    """Every pod of the watched namespaces, by namespace; the ticks filter by selector."""
    return {namespace: pods.TritonPod.from_body(body)}


@kopf.index("pods", when=lambda body, **_: pods.waits_for_instances(body))
async def waiting_pods(
    body: kopf.Body, namespace: str, memo: kopf.Memo, **_: Any
) -> dict[str, pods.TritonPod]:
    """The pods waiting at the gate, by namespace (kopf drops a pod once it stops waiting):
    what admission looks through, a few pods rather than all. A pod that starts or goes on
    waiting wakes its namespace's admission (tritonscale.drivers.gates)."""
    memo.runtime.admission_signal(namespace).notify()
    return {namespace: pods.TritonPod.from_body(body)}


def _not_deleted(meta: kopf.Meta, **_: Any) -> bool:
    return not meta.get("deletionTimestamp")


@kopf.index(GROUP, VERSION, PLURAL, when=_not_deleted)
async def autoscalers(
    spec: kopf.Spec,
    status: kopf.Status,
    meta: kopf.Meta,
    name: str,
    namespace: str,
    uid: str,
    memo: kopf.Memo,
    **_: Any,
) -> dict[str, Member]:
    """Every autoscaler, by namespace: the sets' members, which pods a new pod must match,
    and what each budget's members hold. One being deleted leaves at once (kopf drops it as
    it stops matching), so that its set's next leader takes over while it goes."""
    member = _member(spec, status, meta, name, namespace, uid)
    runtime: Runtime = memo.runtime
    runtime.saw(namespace, member)
    return {namespace: member}


def _member(
    spec: kopf.Spec, status: kopf.Status, meta: kopf.Meta, name: str, namespace: str, uid: str
) -> Member:
    raw_spec, raw_status = copy.deepcopy(dict(spec)), copy.deepcopy(dict(status))
    generation = meta.get("generation")
    generation = generation if isinstance(generation, int) else None
    try:
        parsed = parse_spec(raw_spec)
    except InvalidSpec:
        return Member(name, uid, raw_spec, None, raw_status, generation, None)
    desired = raw_status.get("desiredInstances")
    found = admission.Autoscaler.of(name, parsed, desired if isinstance(desired, int) else None)
    member = Member(
        name, uid, raw_spec, parsed, raw_status, generation, found, parsed.instance_kind
    )
    if parsed.budget is None:
        return member
    held = max(
        (n for n in (raw_status.get("currentInstances"), desired) if isinstance(n, int) and n),
        default=parsed.min_instances,
    )
    claim = Claim(name, parsed.model, int(held), int(held), parsed.min_instances)
    return replace(member, budget=budget_key(namespace, parsed), claim=claim)
