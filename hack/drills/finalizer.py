"""finalizer: install / uninstall cycles with autoscalers (one in five with a Triton pod)."""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from hack.demo_k8s import CHART, DemoError, is_ready, merged, wait_for
from hack.drills.harness import Drills, Record

FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"


def finalizer(drills: Drills, values: dict[str, Any]) -> tuple[Record, float, float]:
    """Install and uninstall a release with autoscalers, `cycles` times; each uninstall
    must find the operator releasing its finalizers itself (well within the uninstall
    hook's timeout, after which the hook would strip them) and the namespace must go."""
    record = Record("finalizer")
    namespace = f"{drills.namespace}-cycles"
    hook_timeout = 60
    released: list[float] = []
    with_pod: list[float] = []
    start = time.time()
    with tempfile.TemporaryDirectory(prefix="tritonscale-drills-") as folder:
        files = {}
        # Most cycles have no Triton pod: fifty cycles in minutes, not an hour; the
        # daemons tick all the same. Every `pod_every`-th has one to act on.
        for pods in (0, 1):
            files[pods] = Path(folder) / f"values-{pods}.yaml"
            files[pods].write_text(yaml.safe_dump(_cycle_values(values, pods)))
        for cycle in range(1, drills.settings.cycles + 1):
            pods = 1 if cycle % drills.settings.pod_every == 0 else 0
            released.append(_cycle(drills, namespace, files[pods], hook_timeout, pods))
            if pods:
                with_pod.append(released[-1])
            drills.progress(
                f"  finalizer cycle {cycle}/{drills.settings.cycles} ({pods} Triton pod): "
                f"the operator released every autoscaler {released[-1]:.1f} s after the "
                "uninstall began"
            )
    end = time.time()
    record.recovery_s = round(max(released), 1)
    record.detail = {
        "cycles": len(released),
        "cycles_with_triton_pod": len(with_pod),
        "release_s_max": round(max(released), 1),
        "release_s_median": round(statistics.median(released), 1),
        "release_s_max_with_pod": round(max(with_pod), 1) if with_pod else None,
        "hook_timeout_s": hook_timeout,
    }
    return record, start, end


def _cycle_values(values: dict[str, Any], triton_pods: int) -> dict[str, Any]:
    return merged(
        values,
        {
            "triton": {"replicaCount": triton_pods},
            "operator": {"replicaCount": 1, "peering": {"enabled": False}},
            "locust": {"enabled": False},
        },
    )


def _cycle(
    drills: Drills, namespace: str, values_file: Path, hook_timeout: float, triton_pods: int
) -> float:
    k = drills.k
    k("kubectl", "create", "namespace", namespace)
    k("kubectl", "label", "namespace", namespace,
      "pod-security.kubernetes.io/enforce=restricted")  # fmt: skip
    k("helm", "install", "cycle", str(CHART), "-n", namespace, "-f", str(values_file),
      "--wait", "--timeout", "6m", timeout=420)  # fmt: skip

    def held() -> bool:
        items = k.items("instancegroupautoscalers", "-n", namespace)
        return bool(items) and all(
            FINALIZER in (a["metadata"].get("finalizers") or [])
            and (a.get("status") or {}).get("conditions")
            for a in items
        )

    wait_for("the operator to hold and reconcile every autoscaler", held, timeout_s=180)
    if triton_pods:
        # helm --wait saw the pod Ready, so the operator admitted it; its ticks act on
        # it now, and the uninstall comes in the middle of them.
        pods = k.items("pods", "-n", namespace, "-l", "app.kubernetes.io/component=triton")
        if len([p for p in pods if is_ready(p)]) < triton_pods:
            raise DemoError(f"{namespace}: no Ready Triton pod after helm install --wait")
    began = time.monotonic()
    k("helm", "uninstall", "cycle", "-n", namespace, "--wait", "--timeout", "5m", timeout=330)
    took = time.monotonic() - began
    left = k.items("instancegroupautoscalers", "-n", namespace)
    if left:
        raise DemoError(f"autoscalers left after helm uninstall: {left}")
    if took >= hook_timeout:
        raise DemoError(
            f"helm uninstall took {took:.0f} s: the hook waited past its {hook_timeout} s "
            "and stripped a finalizer the operator did not release"
        )
    k("kubectl", "delete", "namespace", namespace, "--wait=true", "--timeout=180s", timeout=200)
    return took
