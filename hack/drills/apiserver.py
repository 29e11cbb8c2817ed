"""apiserver: kube-apiserver stopped and started again, under load."""

from __future__ import annotations

import threading
import time

from hack import cluster
from hack.demo_k8s import DemoError, wait_for
from hack.drills.harness import TRITON, Drills, Record, is_node_ready


def apiserver(drills: Drills) -> tuple[Record, float, float]:
    """kube-apiserver stopped and started again: Triton serves on (nothing of the data
    path needs the API), the operator resumes ticking without a restart, and applies
    nothing twice."""
    record = Record("apiserver")
    restarts = drills.restarts()
    events_before = drills.rescale_events()
    samples: list[tuple[float, bool, int]] = []
    stop = threading.Event()
    watcher = threading.Thread(target=_sample_node_and_service, args=(drills, samples, stop))
    watcher.start()
    start = time.time()
    try:
        cluster.restart(drills.state_dir, "kube-apiserver", down_s=drills.settings.down_s)
        wait_for("the API server back", lambda: _answers(drills), timeout_s=120)
        back = time.time()
        resumed = wait_for(
            "an operator ticking after the API server came back",
            lambda: drills.ticking_since(back),
            timeout_s=180,
        )
        ticking = time.time()
        drills.wait_tuned(len(drills.pods(TRITON)), timeout_s=120)
        end = time.time()
    finally:
        stop.set()
        watcher.join(timeout=30)
    node_not_ready = [t for t, node_ready, _ in samples if not node_ready]
    emptied = [t for t, _, endpoints in samples if endpoints == 0]
    record.allowed_failures = (
        "0, or, when the node-lifecycle controller marked the node not ready after the "
        "outage, the requests kube-proxy refused while the Service had no ready endpoint "
        "(plus kube-proxy's 1 s sync)"
    )
    record.recovery_s = round(ticking - start, 1)
    record.detail = {
        "down_s": drills.settings.down_s,
        "api_back_after_s": round(back - start, 1),
        "ticking_after_api_back_s": round(ticking - back, 1),
        "ticking_by": resumed["metadata"]["name"],
        "restarts": drills.restarts_since(restarts),
        "rescale_events_during": drills.rescale_events() - events_before,
        "node_marked_not_ready_s": (
            [round(node_not_ready[0] - start, 1), round(node_not_ready[-1] - start, 1)]
            if node_not_ready
            else None
        ),
        "service_without_endpoints_s": (
            [round(emptied[0] - start, 1), round(emptied[-1] - start, 1)] if emptied else None
        ),
    }
    if node_not_ready and emptied:
        # From the last sample that still listed endpoints to the first that listed
        # them again, and kube-proxy's next sync after it.
        before = max((t for t, _, n in samples if n and t < emptied[0]), default=start)
        after = min((t for t, _, n in samples if n and t > emptied[-1]), default=end)
        record.detail["failure_window"] = [before, after + 2.0]
    return record, start, end


def _sample_node_and_service(
    drills: Drills, samples: list[tuple[float, bool, int]], stop: threading.Event
) -> None:
    """(time, node Ready, ready Triton endpoints) twice a second while the API answers."""
    while not stop.is_set():
        try:
            ready = all(is_node_ready(n) for n in drills.k.items("nodes"))
            _, addresses = drills.triton_endpoints()
        except DemoError:
            pass  # the API is down: nothing to see
        else:
            samples.append((time.time(), ready, len(addresses)))
        stop.wait(0.5)


def _answers(drills: Drills) -> bool:
    try:
        drills.k("kubectl", "get", "--raw", "/readyz", timeout=10)
    except DemoError:
        return False
    return True
