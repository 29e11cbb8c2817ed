"""scale-in: the Triton Deployment 3 -> 1, under load."""

from __future__ import annotations

import time

from hack.demo_k8s import wait_for
from hack.drills.harness import TRITON_DEPLOYMENT, Drills, Record


def scale_in(drills: Drills) -> tuple[Record, float, float]:
    record = Record("scale-in")
    deployment = f"deployment/{TRITON_DEPLOYMENT}"
    drills.k("kubectl", "scale", deployment, "-n", drills.namespace, "--replicas=3")
    drills.wait_tuned(3)
    drills.settle()
    start = time.time()
    drills.k("kubectl", "scale", deployment, "-n", drills.namespace, "--replicas=1")
    wait_for("one Triton pod left", lambda: drills.tuned(1), timeout_s=240)
    end = time.time()
    record.recovery_s = round(end - start, 1)
    drills.k("kubectl", "scale", deployment, "-n", drills.namespace, "--replicas=2")
    drills.wait_tuned(2)
    return record, start, end
