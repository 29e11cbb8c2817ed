"""failover: SIGKILL of the active operator's container (two replicas, kopf peering)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from hack.demo_k8s import wait_for
from hack.drills.harness import OPERATOR, TRITON, Drills, Record


def failover(drills: Drills) -> tuple[Record, float, float]:
    """SIGKILL of the active operator's container. Whichever resumes first, the standby
    (once the killed one's peering record expires) or the killed one (the kubelet
    restarts its container at once, under the same pod name, so the same peering
    identity), the gap is from the kill to the first tick after it."""
    record = Record("failover")
    wait_for("two operator pods Ready", lambda: _operators(drills, 2), 240)
    active = wait_for("the active operator (its ticks rising)", lambda: _active(drills), 60)
    desired_before, budgets_before = drills.desired(), drills.budgets()
    events_before = drills.rescale_events()
    start = time.time()
    os.kill(drills.container_pid(active, "operator"), signal.SIGKILL)
    resumed = wait_for(
        "an operator ticking again after the kill",
        lambda: drills.ticking_since(start),
        timeout_s=180,
    )
    takeover = time.time()
    # Two more rounds of ticks, then every autoscaler must agree with every pod.
    time.sleep(6)
    drills.wait_tuned(len(drills.pods(TRITON)), timeout_s=60)
    wait_for("both operators Ready again", lambda: _operators(drills, 2), 240)
    end = time.time()
    record.recovery_s = round(takeover - start, 1)
    record.detail = {
        "killed": active["metadata"]["name"],
        "resumed": resumed["metadata"]["name"],
        "resumed_by": (
            "the killed pod, restarted"
            if resumed["metadata"]["name"] == active["metadata"]["name"]
            else "the standby"
        ),
        "desired_before": desired_before,
        "desired_after": drills.desired(),
        "budget_before": budgets_before,
        "budget_after": drills.budgets(),
        "rescale_events_during": drills.rescale_events() - events_before,
    }
    return record, start, end


def _operators(drills: Drills, count: int) -> list[dict[str, Any]] | None:
    pods = drills.ready(OPERATOR)
    return pods if len(pods) == count else None


def _active(drills: Drills) -> dict[str, Any] | None:
    pods = drills.ready(OPERATOR)
    first = {p["metadata"]["name"]: drills.ticks(p) for p in pods}
    time.sleep(3)
    for pod in pods:
        then, now = first[pod["metadata"]["name"]], drills.ticks(pod)
        if then is not None and now is not None and now > then:
            return pod
    return None
