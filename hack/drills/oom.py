"""oom: tritonserver OOM-killed by the kernel at its memory limit, under load."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from hack.demo_k8s import TOOLS, DemoError, is_ready, pod_counts, wait_for
from hack.drills.harness import SERVICE_SLICES, TRITON, Drills, Record
from tritonscale.drivers.pods import INSTANCES_READY

# The kubelet works out Ready, when a restarted container's readiness probe first passes,
# from its own copy of the pod's conditions, and that copy takes a change of a condition it
# does not own (the operator's gate) only along with a change of its own: a gate closed
# after the kubelet's last such change (the new container's start) stays True in it, and the
# kubelet sets the pod Ready for a moment with the gate False, until the pod sync that the
# probe triggers writes Ready False again (kubernetes/kubernetes#122002). Measured: 0.2 to
# 0.75 s, in 3 of 8 first restarts watched (1 of 6 since the operator closes the gate as
# soon as the container stops). Requests sent to the pod meanwhile are served, by fewer
# instances. The OOM drill allows such moments up to:
KUBELET_READY_BOUND_S = 2.0


def oom(drills: Drills) -> tuple[Record, float, float]:
    """The kernel kills tritonserver at its container's memory limit: a python3 exec'd
    into the container allocates the whole limit; tritonserver's oom_score_adj is raised
    to the most and the allocator's lowered, so that the kernel picks tritonserver."""
    record = Record("oom")
    # The pod restarted least: a container restarted again soon waits out the kubelet's
    # back-off (10 s, then doubling), which a first restart does not.
    pod = min(
        drills.ready(TRITON), key=lambda p: p["status"]["containerStatuses"][0]["restartCount"]
    )
    name = pod["metadata"]["name"]
    restarts = pod["status"]["containerStatuses"][0]["restartCount"]
    Path(f"/proc/{drills.container_pid(pod, 'tritonserver')}/oom_score_adj").write_text("1000\n")
    marker = "oom-drill"
    allocate = "import time; time.sleep(3); b = b'x' * (8 << 30)"  # written, so resident
    command = [
        str(TOOLS / "bin" / "kubectl"), "--kubeconfig", str(drills.k.kubeconfig), "exec", name,
        "-n", drills.namespace, "-c", "tritonserver", "--", "python3", "-c", allocate, marker,
    ]  # fmt: skip
    start = time.time()
    not_ready: list[float] = []
    address = pod["status"]["podIP"]
    watcher = threading.Thread(target=_note_not_ready, args=(drills, address, not_ready))
    with ExitStack() as watches:
        # Every change of the pod (when it was Ready with its gate closed) and of the
        # Service's endpoints (for the record).
        pod_changes = watches.enter_context(_watching(drills, "pod", name))
        endpoint_changes = watches.enter_context(
            _watching(drills, "endpointslices", "-l", SERVICE_SLICES)
        )
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as drill:
            Path(f"/proc/{pid_of(marker)}/oom_score_adj").write_text("0\n")
            watcher.start()
            drill.wait(timeout=120)
        killed = time.time()
        watcher.join(timeout=60)
        gate_states: set[str] = set()  # the gate's condition as seen while it came back

        def back() -> dict[str, Any] | None:
            pod = _pod(drills, name)
            if pod is None:
                return None
            gate = {
                c["status"] for c in pod["status"]["conditions"] if c["type"] == INSTANCES_READY
            }
            gate_states.update(gate)
            status = pod["status"]["containerStatuses"][0]
            # Back in the Service by the operator's gate: Ready, with the gate open (the
            # kubelet can set Ready for a moment with the gate closed: measured below).
            back_in = status["restartCount"] > restarts and is_ready(pod) and "True" in gate
            return pod if back_in else None

        restarted = wait_for("the OOM-killed tritonserver restarted and admitted", back, 300)
        # The readiness gate closed when the container stopped: back in the Service, the
        # pod already runs every autoscaler's count.
        back_counts = pod_counts(restarted["status"]["podIP"])
        conditions_when_back = {
            c["type"]: f"{c['status']} since {c.get('lastTransitionTime')}"
            for c in restarted["status"]["conditions"]
        }
        desired = drills.desired()
        drills.wait_tuned(len(drills.pods(TRITON)), timeout_s=240)
        end = time.time()
        last = restarted["status"]["containerStatuses"][0]["lastState"].get("terminated") or {}
        record.recovery_s = round(end - start, 1)
        record.detail = {
            "pod": name,
            "reason": last.get("reason"),
            "exit_code": last.get("exitCode"),
            "endpoint_not_ready_after_s": round(not_ready[0] - start, 1) if not_ready else None,
            "allocator_ended_after_s": round(killed - start, 1),
            "back_in_service_at_peers_counts": all(
                back_counts.get(m) == n for m, n in desired.items() if m in back_counts
            ),
            "counts_when_back": back_counts,
            "conditions_when_back": conditions_when_back,
            "gate_closed_meanwhile": "False" in gate_states,
            "kubelet_ready_bound_s": KUBELET_READY_BOUND_S,
        }
        record.allowed_failures = (
            "the requests in flight on the killed pod (requests_in_flight_at_fault), and, "
            "for clients that do not wait for a ready connection, those kube-proxy sent it "
            "before its EndpointSlice marked it not ready (plus kube-proxy's 1 s sync)"
        )
        # Every failure must lie between the kill and kube-proxy's next sync (at least 1 s
        # apart, its minSyncPeriod) after the EndpointSlice marked the pod not ready.
        record.detail["failure_window"] = [start, not_ready[0] + 2.0 if not_ready else end]
    record.detail.update(_ready_while_gate_closed(pod_changes, endpoint_changes, restarts, start))
    return record, start, end


@contextmanager
def _watching(drills: Drills, *args: str) -> Iterator[list[tuple[float, dict[str, Any]]]]:
    """`kubectl get ARGS --watch -o json`: each object it prints, with the time it
    arrived: every change, where polling would miss one that lasts less than a poll."""
    command = [
        str(TOOLS / "bin" / "kubectl"), "--kubeconfig", str(drills.k.kubeconfig),
        "get", "-n", drills.namespace, "--watch", "-o", "json", *args,
    ]  # fmt: skip
    seen: list[tuple[float, dict[str, Any]]] = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as watch:

        def read() -> None:
            # Objects one after another, each over many lines.
            assert watch.stdout is not None
            decoder, text = json.JSONDecoder(), ""
            for line in watch.stdout:
                text += line
                try:
                    item, _ = decoder.raw_decode(text.strip())
                except json.JSONDecodeError:
                    continue
                seen.append((time.time(), item))
                text = ""

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            yield seen
        finally:
            watch.terminate()
            reader.join(timeout=10)


def _pod(drills: Drills, name: str) -> dict[str, Any] | None:
    try:
        return json.loads(
            drills.k("kubectl", "get", "pod", name, "-n", drills.namespace, "-o", "json")
        )
    except DemoError:
        return None


def _note_not_ready(drills: Drills, address: str, into: list[float]) -> None:
    """Note when the Service's EndpointSlices stop listing `address` as ready: from then
    on kube-proxy sends it no new connection (after its next sync)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            slices, ready = drills.triton_endpoints()
        except DemoError:
            slices, ready = [], []
        if slices and address not in ready:
            into.append(time.time())
            return
        time.sleep(0.2)


def pid_of(marker: str, timeout_s: float = 20) -> int:
    """The host's pid of the python3 whose command line ends with `marker`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for entry in Path("/proc").iterdir():
            try:
                command = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"python3" in command[0] and marker.encode() in command:
                return int(entry.name)
        time.sleep(0.1)
    raise DemoError(f"no process `python3 ... {marker}` appeared in {timeout_s:.0f} s")


def _ready_while_gate_closed(
    pod_changes: list[tuple[float, dict[str, Any]]],
    endpoint_changes: list[tuple[float, dict[str, Any]]],
    restarts: int,
    start: float,
) -> dict[str, Any]:
    """From the OOM drill's watches: when the restarted container's gate closed and opened
    again, and each moment (from, for how long, in seconds after the kill) the pod was Ready
    while its gate was closed, which puts it in the Service's endpoints at its repository's
    counts: the kubelet's doing (KUBELET_READY_BOUND_S says why). The pod's own object says both at
    once, so no ordering between watches is assumed."""
    restarted_at = closed_at = gate_open_at = ready_since = None
    # (seconds after the kill, how long): each moment the pod was Ready with its gate closed.
    ready_while_closed: list[tuple[float, float]] = []
    pod_lines: list[list[Any]] = []
    for at, pod in pod_changes:
        status = pod.get("status") or {}
        count = max(
            (c.get("restartCount", 0) for c in status.get("containerStatuses") or []), default=0
        )
        states = {c["type"]: c["status"] for c in status.get("conditions") or []}
        pod_lines.append([round(at - start, 2), count, states])
        if restarted_at is None and count > restarts:
            restarted_at = at
        if gate_open_at is not None:
            continue
        # The gate may close before the restart shows, or after (it still reads True from
        # before the kill until the operator closes it).
        if states.get(INSTANCES_READY) != "True":
            closed_at = closed_at or at
        elif closed_at is not None:
            gate_open_at = at
        ready_now = closed_at is not None and gate_open_at is None and states.get("Ready") == "True"
        if ready_now and ready_since is None:
            ready_since = at
        elif not ready_now and ready_since is not None:
            ready_while_closed.append((round(ready_since - start, 2), round(at - ready_since, 2)))
            ready_since = None
    # The Service's endpoints, as they changed (for the record: they follow the pod's Ready,
    # and two watches' events arrive in no common order, so the verdict reads the pod's).
    endpoint_lines = [
        [
            round(at - start, 2),
            {
                address: (endpoint.get("conditions") or {}).get("ready")
                for endpoint in item.get("endpoints") or []
                for address in endpoint.get("addresses") or []
            },
        ]
        for at, item in endpoint_changes
    ]

    def after(at: float | None) -> float | None:
        return round(at - start, 2) if at is not None else None

    return {
        "container_restarted_after_s": after(restarted_at),
        "gate_closed_after_s": after(closed_at),
        "gate_reopened_after_s": after(gate_open_at),
        "ready_while_gate_closed": ready_while_closed,
        "ready_while_gate_closed_max_s": max((d for _, d in ready_while_closed), default=0.0),
        # Still Ready with the gate closed when the watch ended: no end to measure.
        "ready_while_gate_closed_unended": ready_since is not None,
        "pod_changes": pod_lines,
        "endpoint_changes": endpoint_lines,
    }
