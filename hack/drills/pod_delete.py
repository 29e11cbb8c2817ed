"""pod-delete: kubectl delete pod of each Triton pod in turn (one node: no drain)."""

from __future__ import annotations

import time

from hack.demo_k8s import wait_for
from hack.drills.harness import TRITON, Drills, Record


def pod_delete(drills: Drills) -> tuple[Record, float, float]:
    record = Record("pod-delete")
    record.allowed_failures = "0 (no PodDisruptionBudget guards a delete: one pod serves alone)"
    start = time.time()
    names = [p["metadata"]["name"] for p in drills.pods(TRITON)]
    for name in names:
        drills.k("kubectl", "delete", "pod", name, "-n", drills.namespace, "--wait=false")
        wait_for(
            f"{name} replaced and the pods tuned",
            lambda name=name: (
                drills.tuned(len(names))
                and name not in {p["metadata"]["name"] for p in drills.pods(TRITON)}
            ),
            timeout_s=420,
        )
    end = time.time()
    record.recovery_s = round(end - start, 1)
    record.detail = {"pods_deleted": len(names)}
    return record, start, end
