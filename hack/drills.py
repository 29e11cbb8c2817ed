"""`make drills`: day-2 operations on the real node under a steady load, every request counted.

Each drill runs while Locust (loadtests/bls.py, over gRPC, each user at a fixed pace: an
open-loop load far below the pods' capacity) sends pipeline_async requests to the Triton
Service's cluster IP, through the node's kube-proxy, and writes every request to a log
(`--request-log`). A drill's figures come from that log: the requests sent from its start
to its end, the failed ones, and the p95 during it against the window before it.

    rollout        helm upgrade that rolls the Triton pods (a changed pod annotation)
    rollout-http   the same with an HTTP/1.1 keep-alive load beside (the bound HTTP clients get)
    scale-in       the Deployment 3 -> 1
    pod-delete     kubectl delete pod of each Triton pod in turn (one node: no drain)
    failover       SIGKILL of the active operator's container (two replicas, kopf peering)
    apiserver      kube-apiserver stopped and started again
    node-restart   containerd, then the kubelet, restarted
    oom            tritonserver OOM-killed by the kernel at its memory limit
    finalizer      install / uninstall cycles with autoscalers (one in five with a Triton pod)

A drill passes with 0 failed requests, except three that state their bound. `oom`: a killed
process answers nothing, so the requests in flight on that pod, and those kube-proxy sends
it until the EndpointSlice marks it not ready and kube-proxy syncs, are lost; the drill
passes when every failure lies in that window, the pod rejoins at its peers' counts, and a
watch of the pod saw it Ready with its readiness gate closed only for the kubelet's moments
(KUBELET_READY_BOUND_S says why).
`rollout-http`: at most one request per HTTP keep-alive connection left on an old pod.
`apiserver`: an outage longer than the node-lifecycle controller's grace period (here the
API server takes about 30 s to start again) lets the controller find the kubelet's lease
stale when the API returns: it marks the node and its pods not ready until the kubelet's
next heartbeat, the EndpointSlices empty, and kube-proxy refuses connections to the Service
meanwhile. Failures are allowed only inside that window, and only when the node was seen
marked not ready.

    python -m hack.drills            # the full drills: reports/drills/NAME.json and a table
    python -m hack.drills --quick    # shorter windows, fewer cycles (`make drills QUICK=1`)

It builds the images, brings up the local cluster in .cluster-drills (hack.cluster), pushes
the images, installs the chart, runs the drills, uninstalls and takes the cluster down, also
after Ctrl-C or a failure. tests/cluster/test_drills.py runs the quick forms of rollout,
scale-in, failover, oom and finalizer on the test session's cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hack import cluster, images, node
from hack.demo_k8s import (
    CHART,
    CLUSTER_ERRORS,
    TOOLS,
    VALUES,
    DemoError,
    Kubectl,
    image_values,
    is_ready,
    merged,
    pod_counts,
    ready_addresses,
    say,
    wait_for,
)
from tritonscale.drivers.pods import INSTANCES_READY

STATE = Path(".cluster-drills")
REPORTS = Path("reports/drills")
LOCUSTFILE = Path("loadtests/bls.py")
NAMESPACE = "tritonscale-drills"
RELEASE = "drills"
TARGET = "pipeline_async"
TRITON = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=triton"
OPERATOR = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=operator"
TRITON_DEPLOYMENT = f"{RELEASE}-tritonscale-triton"
SERVICE_SLICES = f"kubernetes.io/service-name={TRITON_DEPLOYMENT}"  # the Service's name
FINALIZER = "kopf.zalando.org/KopfFinalizerMarker"
# Offered load: USERS x USER_RATE requests/s, far below what two pods answer on two cores
# (about 90/s each): a failure is the drill's, not the load's.
USERS = 6
USER_RATE = 4.0
# The chart's own drain settings (preStop sleep 15 s, gRPC connections aged out after 8 s),
# which the drills exist to check; two operators with peering; a memory limit the OOM drill
# can reach.
DRILL_VALUES: dict[str, Any] = {
    "triton": {
        "preStopSleepSeconds": 15,
        "grpcMaxConnectionAgeSeconds": 8,
        "grpcMaxConnectionAgeGraceSeconds": 4,
        "exitTimeoutSeconds": 10,
        "terminationGracePeriodSeconds": 40,
        "resources": {"limits": {"memory": "3Gi"}},
    },
    "operator": {"replicaCount": 2, "peering": {"enabled": True, "lifetimeSeconds": 15}},
    "autoscalers": {
        # A shared instance budget: after a failover the new operator rebuilds its ledger
        # from the autoscalers' status.
        "budget": {"name": "pod", "instancesPerPod": 12},
        # Two from the start: a restarted Triton (the repository's one) has a count to be
        # brought back to before it rejoins.
        "models": {"branch_embed": {"minInstances": 2}},
    },
}
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
DRILLS = (
    "rollout",
    "rollout-http",
    "scale-in",
    "pod-delete",
    "failover",
    "apiserver",
    "node-restart",
    "oom",
    "finalizer",
)


@dataclass
class Record:
    """One drill's outcome: what reports/drills/NAME.json holds."""

    drill: str
    requests_sent: int = 0
    requests_failed: int = 0
    p95_before_ms: float | None = None
    p95_during_ms: float | None = None
    recovery_s: float | None = None
    passed: bool = False
    # Failures the drill allows, and why (0 unless Kubernetes itself cannot promise 0).
    allowed_failures: str = "0"
    detail: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


@dataclass
class Settings:
    """How long a drill's windows are: the full drills, or the quick ones of `make test`."""

    before_s: float = 60.0  # the window before a drill, its p95 baseline
    down_s: float = 10.0  # how long a restarted component stays down
    cycles: int = 50  # finalizer drill
    # Every this many cycles, one with a Triton pod the operator acts on (its loads and gate
    # in flight when the uninstall comes, where the stranded finalizer was once seen).
    pod_every: int = 5

    @classmethod
    def quick(cls) -> Settings:
        return cls(before_s=15.0, down_s=3.0, cycles=3, pod_every=3)


# ---- the load -------------------------------------------------------------------------


class Load:
    """Locust against the Triton Service's cluster IP, each request in a JSON-lines log."""

    def __init__(
        self,
        cluster_ip: str,
        log: Path,
        users: int = USERS,
        rate: float = USER_RATE,
        protocol: str = "grpc",
    ) -> None:
        self.log = log
        self.command = [
            sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
            "--only-summary", "-u", str(users), "-r", str(users), "-t", "24h",
            "--host", f"http://{cluster_ip}:8000", "--grpc-host", f"{cluster_ip}:8001",
            "--protocol", protocol, "--workload", TARGET, "--user-rate", str(rate),
            "--request-log", str(log), "--request-timeout-s", "10",
        ]  # fmt: skip
        self.process: subprocess.Popen[str] | None = None

    def __enter__(self) -> Load:
        self.log.unlink(missing_ok=True)
        self.process = subprocess.Popen(
            self.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        wait_for("the load's first answered request", self._flowing, timeout_s=90)
        return self

    def _flowing(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            output = (self.process.stdout.read() if self.process.stdout else "")[-1500:]
            raise DemoError(f"Locust exited ({self.process.returncode}): {output}")
        return any(r["error"] is None for r in self.requests())

    def __exit__(self, *exc: object) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def requests(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        lines = self.log.read_text().splitlines()
        # The last line may be half written.
        return [json.loads(line) for line in lines if line.endswith("}")]


def p95(values: Sequence[float]) -> float | None:
    if len(values) < 20:
        return None
    return round(statistics.quantiles(values, n=20)[-1], 1)


def tally(
    record: Record, requests: list[dict[str, Any]], start: float, end: float, before_s: float
) -> list[dict[str, Any]]:
    """Fill `record`'s request figures from the log lines; the failed requests."""
    during = [r for r in requests if start <= r["start"] <= end]
    before = [r for r in requests if start - before_s <= r["start"] < start]
    failed = [r for r in during if r["error"] is not None]
    record.requests_sent = len(during)
    record.requests_failed = len(failed)
    record.p95_before_ms = p95([r["ms"] for r in before if r["error"] is None])
    record.p95_during_ms = p95([r["ms"] for r in during if r["error"] is None])
    record.errors = sorted({r["error"] for r in failed})[:5]
    return failed


# ---- the cluster, as the drills see it ----------------------------------------------------


def _get_json(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return json.load(response)
    except (OSError, ValueError):
        return None


class Drills:
    """The drills against one release (RELEASE in `namespace`) on the node of `state_dir`."""

    def __init__(
        self,
        kubectl: Kubectl,
        state_dir: Path,
        settings: Settings,
        namespace: str = NAMESPACE,
        progress: Callable[[str], None] = say,
    ) -> None:
        self.k, self.state_dir, self.settings = kubectl, Path(state_dir), settings
        self.namespace, self.progress = namespace, progress

    # -- reading the release

    def pods(self, selector: str) -> list[dict[str, Any]]:
        return self.k.items("pods", "-n", self.namespace, "-l", selector)

    def ready(self, selector: str) -> list[dict[str, Any]]:
        return [p for p in self.pods(selector) if is_ready(p)]

    def autoscalers(self) -> list[dict[str, Any]]:
        return self.k.items("instancegroupautoscalers", "-n", self.namespace)

    def budgets(self) -> dict[str, tuple[int, int] | None]:
        """model -> (members, used instances) of its status.budget, as the last tick left it."""
        found: dict[str, tuple[int, int] | None] = {}
        for item in self.autoscalers():
            budget = (item.get("status") or {}).get("budget")
            found[item["spec"]["model"]] = (
                (budget["members"], budget["usedInstances"]) if budget else None
            )
        return found

    def desired(self) -> dict[str, int | None]:
        return {
            a["spec"]["model"]: (a.get("status") or {}).get("desiredInstances")
            for a in self.autoscalers()
        }

    def tuned(self, replicas: int) -> bool:
        """`replicas` Triton pods, all Ready, none going, each at every autoscaler's count."""
        pods = self.pods(TRITON)
        if len(pods) != replicas or not all(is_ready(p) for p in pods):
            return False
        desired = self.desired()
        for pod in pods:
            counts = pod_counts(pod["status"]["podIP"])
            if any(counts.get(m) != n for m, n in desired.items() if m in counts):
                return False
        return True

    def wait_tuned(self, replicas: int, timeout_s: float = 420) -> None:
        wait_for(
            f"{replicas} Triton pods Ready at the autoscalers' counts",
            lambda: self.tuned(replicas),
            timeout_s,
        )

    def service_ip(self) -> str:
        services = self.k.items("services", "-n", self.namespace, "-l", TRITON)
        return services[0]["spec"]["clusterIP"]

    def container_pid(self, pod: dict[str, Any], container: str) -> int:
        (status,) = [s for s in pod["status"]["containerStatuses"] if s["name"] == container]
        return node.task_pid(self.state_dir, status["containerID"].split("://", 1)[1])

    def tick_probe(self, pod: dict[str, Any]) -> dict[str, Any]:
        """The operator pod's `ticks` probe (count, lastTickAt) from its liveness endpoint."""
        answer = _get_json(f"http://{pod['status'].get('podIP')}:8080/healthz")
        return (answer or {}).get("ticks") or {}

    def ticks(self, pod: dict[str, Any]) -> int | None:
        return self.tick_probe(pod).get("count")

    def settle(self) -> None:
        """Let a baseline window of plain load pass before a drill."""
        time.sleep(self.settings.before_s)

    # -- the drills: each returns its record, with the window's start and end

    def rollout(self) -> tuple[Record, float, float]:
        record = Record("rollout")
        old = {p["metadata"]["name"] for p in self.pods(TRITON)}
        replicas = len(old)
        start = time.time()
        self.k(
            "helm", "upgrade", RELEASE, str(CHART), "-n", self.namespace, "--reuse-values",
            "--set-string", f"triton.podAnnotations.drill-rollout={int(start)}", timeout=120,
        )  # fmt: skip
        wait_for(
            "the rollout: new Triton pods tuned, the old ones gone",
            lambda: (
                self.tuned(replicas)
                and not old & {p["metadata"]["name"] for p in self.pods(TRITON)}
            ),
            timeout_s=600,
        )
        end = time.time()
        record.recovery_s = round(end - start, 1)
        record.detail = {"pods_replaced": replicas}
        return record, start, end

    def scale_in(self) -> tuple[Record, float, float]:
        record = Record("scale-in")
        deployment = f"deployment/{TRITON_DEPLOYMENT}"
        self.k("kubectl", "scale", deployment, "-n", self.namespace, "--replicas=3")
        self.wait_tuned(3)
        self.settle()
        start = time.time()
        self.k("kubectl", "scale", deployment, "-n", self.namespace, "--replicas=1")
        wait_for("one Triton pod left", lambda: self.tuned(1), timeout_s=240)
        end = time.time()
        record.recovery_s = round(end - start, 1)
        self.k("kubectl", "scale", deployment, "-n", self.namespace, "--replicas=2")
        self.wait_tuned(2)
        return record, start, end

    def pod_delete(self) -> tuple[Record, float, float]:
        record = Record("pod-delete")
        record.allowed_failures = "0 (no PodDisruptionBudget guards a delete: one pod serves alone)"
        start = time.time()
        names = [p["metadata"]["name"] for p in self.pods(TRITON)]
        for name in names:
            self.k("kubectl", "delete", "pod", name, "-n", self.namespace, "--wait=false")
            wait_for(
                f"{name} replaced and the pods tuned",
                lambda name=name: (
                    self.tuned(len(names))
                    and name not in {p["metadata"]["name"] for p in self.pods(TRITON)}
                ),
                timeout_s=420,
            )
        end = time.time()
        record.recovery_s = round(end - start, 1)
        record.detail = {"pods_deleted": len(names)}
        return record, start, end

    def failover(self) -> tuple[Record, float, float]:
        """SIGKILL of the active operator's container. Whichever resumes first, the standby
        (once the killed one's peering record expires) or the killed one (the kubelet
        restarts its container at once, under the same pod name, so the same peering
        identity), the gap is from the kill to the first tick after it."""
        record = Record("failover")
        wait_for("two operator pods Ready", lambda: self._operators(2), 240)
        active = wait_for("the active operator (its ticks rising)", self._active, 60)
        desired_before, budgets_before = self.desired(), self.budgets()
        events_before = self._rescale_events()
        start = time.time()
        os.kill(self.container_pid(active, "operator"), signal.SIGKILL)
        resumed = wait_for(
            "an operator ticking again after the kill",
            lambda: self._ticking_since(start),
            timeout_s=180,
        )
        takeover = time.time()
        # Two more rounds of ticks, then every autoscaler must agree with every pod.
        time.sleep(6)
        self.wait_tuned(len(self.pods(TRITON)), timeout_s=60)
        wait_for("both operators Ready again", lambda: self._operators(2), 240)
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
            "desired_after": self.desired(),
            "budget_before": budgets_before,
            "budget_after": self.budgets(),
            "rescale_events_during": self._rescale_events() - events_before,
        }
        return record, start, end

    def _ticking_since(self, moment: float) -> dict[str, Any] | None:
        for pod in self.ready(OPERATOR):
            last = self.tick_probe(pod).get("lastTickAt")
            if last is not None and last > moment:
                return pod
        return None

    def _operators(self, count: int) -> list[dict[str, Any]] | None:
        pods = self.ready(OPERATOR)
        return pods if len(pods) == count else None

    def _active(self) -> dict[str, Any] | None:
        pods = self.ready(OPERATOR)
        first = {p["metadata"]["name"]: self.ticks(p) for p in pods}
        time.sleep(3)
        for pod in pods:
            then, now = first[pod["metadata"]["name"]], self.ticks(pod)
            if then is not None and now is not None and now > then:
                return pod
        return None

    def _rescale_events(self) -> int:
        events = self.k.items("events", "-n", self.namespace)
        return sum(e.get("count", 1) for e in events if e.get("reason") == "SucceededRescale")

    def apiserver(self) -> tuple[Record, float, float]:
        """kube-apiserver stopped and started again: Triton serves on (nothing of the data
        path needs the API), the operator resumes ticking without a restart, and applies
        nothing twice."""
        record = Record("apiserver")
        restarts = self._restarts()
        events_before = self._rescale_events()
        samples: list[tuple[float, bool, int]] = []
        stop = threading.Event()
        watcher = threading.Thread(target=self._sample_node_and_service, args=(samples, stop))
        watcher.start()
        start = time.time()
        try:
            cluster.restart(self.state_dir, "kube-apiserver", down_s=self.settings.down_s)
            wait_for("the API server back", self._answers, timeout_s=120)
            back = time.time()
            resumed = wait_for(
                "an operator ticking after the API server came back",
                lambda: self._ticking_since(back),
                timeout_s=180,
            )
            ticking = time.time()
            self.wait_tuned(len(self.pods(TRITON)), timeout_s=120)
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
            "down_s": self.settings.down_s,
            "api_back_after_s": round(back - start, 1),
            "ticking_after_api_back_s": round(ticking - back, 1),
            "ticking_by": resumed["metadata"]["name"],
            "restarts": self._restarts_since(restarts),
            "rescale_events_during": self._rescale_events() - events_before,
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

    def _triton_endpoints(self) -> tuple[list[dict[str, Any]], list[str]]:
        """The Triton Service's EndpointSlices and the addresses they list as ready."""
        slices = self.k.items("endpointslices", "-n", self.namespace, "-l", SERVICE_SLICES)
        return slices, ready_addresses(slices)

    def _sample_node_and_service(
        self, samples: list[tuple[float, bool, int]], stop: threading.Event
    ) -> None:
        """(time, node Ready, ready Triton endpoints) twice a second while the API answers."""
        while not stop.is_set():
            try:
                ready = all(_is_node_ready(n) for n in self.k.items("nodes"))
                _, addresses = self._triton_endpoints()
            except DemoError:
                pass  # the API is down: nothing to see
            else:
                samples.append((time.time(), ready, len(addresses)))
            stop.wait(0.5)

    def _answers(self) -> bool:
        try:
            self.k("kubectl", "get", "--raw", "/readyz", timeout=10)
        except DemoError:
            return False
        return True

    def _restarts(self) -> dict[str, int]:
        return {
            f"{p['metadata']['name']}/{s['name']}": s["restartCount"]
            for p in self.k.items("pods", "-n", self.namespace)
            for s in p["status"].get("containerStatuses") or []
        }

    def _restarts_since(self, before: dict[str, int]) -> dict[str, int]:
        """Containers of `before` that restarted since."""
        now = self._restarts()
        return {name: now[name] - n for name, n in before.items() if now.get(name, n) != n}

    def node_restart(self) -> tuple[Record, float, float]:
        record = Record("node-restart")
        restarts = self._restarts()
        start = time.time()
        state = node.read_state(self.state_dir) or {}
        kubelet_health = f"http://127.0.0.1:{state['ports']['kubelet-healthz']}/healthz"
        back = {
            "containerd": lambda: node.ctr_answers(Path(state["containerd_address"])),
            "kubelet": lambda: node.http_ok(kubelet_health),
        }
        for component in ("containerd", "kubelet"):
            cluster.restart(self.state_dir, component, down_s=self.settings.down_s)
            wait_for(f"{component} back", back[component], timeout_s=120)
            wait_for("the node Ready", self._node_ready, timeout_s=180)
        self.wait_tuned(len(self.pods(TRITON)), timeout_s=180)
        end = time.time()
        record.recovery_s = round(end - start, 1)
        record.detail = {"down_s": self.settings.down_s, "restarts": self._restarts_since(restarts)}
        return record, start, end

    def _node_ready(self) -> bool:
        try:
            nodes = self.k.items("nodes")
        except DemoError:
            return False
        return all(_is_node_ready(n) for n in nodes)

    def oom(self) -> tuple[Record, float, float]:
        """The kernel kills tritonserver at its container's memory limit: a python3 exec'd
        into the container allocates the whole limit; tritonserver's oom_score_adj is raised
        to the most and the allocator's lowered, so that the kernel picks tritonserver."""
        record = Record("oom")
        # The pod restarted least: a container restarted again soon waits out the kubelet's
        # back-off (10 s, then doubling), which a first restart does not.
        pod = min(
            self.ready(TRITON), key=lambda p: p["status"]["containerStatuses"][0]["restartCount"]
        )
        name = pod["metadata"]["name"]
        restarts = pod["status"]["containerStatuses"][0]["restartCount"]
        Path(f"/proc/{self.container_pid(pod, 'tritonserver')}/oom_score_adj").write_text("1000\n")
        marker = "oom-drill"
        allocate = "import time; time.sleep(3); b = b'x' * (8 << 30)"  # written, so resident
        command = [
            str(TOOLS / "bin" / "kubectl"), "--kubeconfig", str(self.k.kubeconfig), "exec", name,
            "-n", self.namespace, "-c", "tritonserver", "--", "python3", "-c", allocate, marker,
        ]  # fmt: skip
        start = time.time()
        not_ready: list[float] = []
        address = pod["status"]["podIP"]
        watcher = threading.Thread(target=self._note_not_ready, args=(address, not_ready))
        with ExitStack() as watches:
            # Every change of the pod (when it was Ready with its gate closed) and of the
            # Service's endpoints (for the record).
            pod_changes = watches.enter_context(self._watching("pod", name))
            endpoint_changes = watches.enter_context(
                self._watching("endpointslices", "-l", SERVICE_SLICES)
            )
            with subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            ) as drill:
                Path(f"/proc/{pid_of(marker)}/oom_score_adj").write_text("0\n")
                watcher.start()
                drill.wait(timeout=120)
            killed = time.time()
            watcher.join(timeout=60)
            gate_states: set[str] = set()  # the gate's condition as seen while it came back

            def back() -> dict[str, Any] | None:
                pod = self._pod(name)
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
            desired = self.desired()
            self.wait_tuned(len(self.pods(TRITON)), timeout_s=240)
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
                "the requests in flight on the killed pod and those kube-proxy sent it before "
                "its EndpointSlice marked it not ready (plus kube-proxy's 1 s sync)"
            )
            # Every failure must lie between the kill and kube-proxy's next sync (at least 1 s
            # apart, its minSyncPeriod) after the EndpointSlice marked the pod not ready.
            record.detail["failure_window"] = [start, not_ready[0] + 2.0 if not_ready else end]
        record.detail.update(
            _ready_while_gate_closed(pod_changes, endpoint_changes, restarts, start)
        )
        return record, start, end

    @contextmanager
    def _watching(self, *args: str) -> Iterator[list[tuple[float, dict[str, Any]]]]:
        """`kubectl get ARGS --watch -o json`: each object it prints, with the time it
        arrived: every change, where polling would miss one that lasts less than a poll."""
        command = [
            str(TOOLS / "bin" / "kubectl"), "--kubeconfig", str(self.k.kubeconfig),
            "get", "-n", self.namespace, "--watch", "-o", "json", *args,
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

    def _pod(self, name: str) -> dict[str, Any] | None:
        try:
            return json.loads(
                self.k("kubectl", "get", "pod", name, "-n", self.namespace, "-o", "json")
            )
        except DemoError:
            return None

    def _note_not_ready(self, address: str, into: list[float]) -> None:
        """Note when the Service's EndpointSlices stop listing `address` as ready: from then
        on kube-proxy sends it no new connection (after its next sync)."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                slices, ready = self._triton_endpoints()
            except DemoError:
                slices, ready = [], []
            if slices and address not in ready:
                into.append(time.time())
                return
            time.sleep(0.2)

    def finalizer(self, values: dict[str, Any]) -> tuple[Record, float, float]:
        """Install and uninstall a release with autoscalers, `cycles` times; each uninstall
        must find the operator releasing its finalizers itself (well within the uninstall
        hook's timeout, after which the hook would strip them) and the namespace must go."""
        record = Record("finalizer")
        namespace = f"{self.namespace}-cycles"
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
                files[pods].write_text(yaml.safe_dump(self._cycle_values(values, pods)))
            for cycle in range(1, self.settings.cycles + 1):
                pods = 1 if cycle % self.settings.pod_every == 0 else 0
                released.append(self._cycle(namespace, files[pods], hook_timeout, pods))
                if pods:
                    with_pod.append(released[-1])
                self.progress(
                    f"  finalizer cycle {cycle}/{self.settings.cycles} ({pods} Triton pod): "
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

    @staticmethod
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
        self, namespace: str, values_file: Path, hook_timeout: float, triton_pods: int
    ) -> float:
        k = self.k
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


# ---- running them ---------------------------------------------------------------------


def _note_failure_span(record: Record, failed: list[dict[str, Any]], start: float) -> None:
    """When, in seconds from the drill's start, its first and last failed requests began."""
    if failed:
        record.detail["failures_from_s"] = round(min(r["start"] for r in failed) - start, 1)
        record.detail["failures_to_s"] = round(max(r["start"] for r in failed) - start, 1)


def _is_node_ready(node: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])


def _outside_window(record: Record, failed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The failed requests that began outside the drill's failure window (noted in its
    detail as a count)."""
    first, last = record.detail.pop("failure_window")
    outside = [r for r in failed if not first - 1 <= r["start"] <= last]
    record.detail["failed_outside_window"] = len(outside)
    return outside


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


def run_drill(drills: Drills, name: str, load: Load | None, values: dict[str, Any]) -> Record:
    """One drill, its request figures from the load's log, and its verdict."""
    if name == "finalizer":
        record, _, _ = drills.finalizer(values)
        record.passed = True  # a cycle that fails raises
        return record
    assert load is not None
    if name == "rollout-http":
        return _rollout_over_http(drills, load)
    drills.settle()
    method = getattr(drills, name.replace("-", "_"))
    record, start, end = method()
    time.sleep(2)  # the requests in flight at the end finish
    failed = tally(record, load.requests(), start, end, drills.settings.before_s)
    _note_failure_span(record, failed, start)
    if name == "oom":
        outside = _outside_window(record, failed)
        record.passed = (
            not outside
            and record.detail["reason"] == "OOMKilled"
            and (record.detail["counts_when_back"].get("branch_embed") or 0) >= 2
            and record.detail["gate_closed_meanwhile"]
            # Out of the Service while the gate was closed, but for the kubelet's moments.
            and record.detail["ready_while_gate_closed_max_s"] <= KUBELET_READY_BOUND_S
            and not record.detail["ready_while_gate_closed_unended"]
        )
    elif name == "apiserver" and "failure_window" in record.detail:
        record.passed = not _outside_window(record, failed)
    else:
        record.passed = record.requests_failed == 0
    record.passed = record.passed and record.requests_sent > 0
    return record


def _rollout_over_http(drills: Drills, grpc_load: Load) -> Record:
    """The rollout again, with an HTTP load beside the gRPC one: HTTP/1.1 keep-alive clients
    get no signal to leave a stopping pod (Triton 2.51 neither closes idle connections nor
    answers `Connection: close` while it drains), so each connection still on an old pod when
    Triton exits can lose the one request in flight on it. The drill passes when the HTTP
    failures stay within that bound (users x pods replaced) and the gRPC load loses none."""
    log = grpc_load.log.with_name("requests-http.jsonl")
    with Load(drills.service_ip(), log, protocol="http") as http_load:
        drills.settle()
        record, start, end = drills.rollout()
        time.sleep(2)
        failed = tally(record, http_load.requests(), start, end, drills.settings.before_s)
    record.drill = "rollout-http"
    bound = USERS * record.detail["pods_replaced"]
    grpc_failed = sum(
        1 for r in grpc_load.requests() if start <= r["start"] <= end and r["error"] is not None
    )
    record.allowed_failures = (
        f"{bound}: one request in flight per HTTP keep-alive connection on an old pod when "
        "Triton exits (Triton's HTTP server does not tell clients to leave)"
    )
    record.detail["grpc_failed_meanwhile"] = grpc_failed
    _note_failure_span(record, failed, start)
    record.passed = record.requests_sent > 0 and len(failed) <= bound and grpc_failed == 0
    return record


def install(k: Kubectl, namespace: str, values: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory(prefix="tritonscale-drills-") as folder:
        values_file = Path(folder) / "values.yaml"
        values_file.write_text(yaml.safe_dump(values))
        k("kubectl", "create", "namespace", namespace)
        k("kubectl", "label", "namespace", namespace,
          "pod-security.kubernetes.io/enforce=restricted")  # fmt: skip
        k("helm", "install", RELEASE, str(CHART), "-n", namespace, "-f", str(values_file),
          "--wait", "--timeout", "8m", timeout=500)  # fmt: skip


def release_values(registry_address: str) -> dict[str, Any]:
    return merged(VALUES, image_values(registry_address), DRILL_VALUES)


@contextmanager
def load_on(drills: Drills, folder: Path) -> Iterator[Load]:
    with Load(drills.service_ip(), folder / "requests.jsonl") as load:
        yield load


def table(records: Sequence[Record]) -> list[str]:
    def cell(value: Any) -> str:
        return "-" if value is None else str(value)

    lines = [
        f"{'drill':<14}{'sent':>7}{'failed':>8}{'p95 before':>12}{'p95 during':>12}"
        f"{'recovery s':>12}  passed"
    ]
    for r in records:
        lines.append(
            f"{r.drill:<14}{r.requests_sent:>7}{r.requests_failed:>8}"
            f"{cell(r.p95_before_ms):>12}{cell(r.p95_during_ms):>12}{cell(r.recovery_s):>12}"
            f"  {'yes' if r.passed else 'NO'}"
        )
    return lines


def save_logs(k: Kubectl, namespace: str, report: str, folder: Path = REPORTS) -> Path:
    """Every container's log in the namespace, and its previous container's where it
    restarted, into reports/drills/REPORT-logs/: what a failed drill is read from."""
    into = folder / f"{report}-logs"
    into.mkdir(parents=True, exist_ok=True)
    for pod in k.items("pods", "-n", namespace):
        name = pod["metadata"]["name"]
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            container = status["name"]
            for previous in (False, True) if status.get("restartCount") else (False,):
                args = ["logs", name, "-n", namespace, "-c", container, "--timestamps"]
                try:
                    text = k("kubectl", *args, *(["--previous"] if previous else []), timeout=60)
                except DemoError as error:
                    text = str(error)
                suffix = ".previous" if previous else ""
                (into / f"{name}.{container}{suffix}.log").write_text(text)
    return into


def write_report(record: Record, name: str = "", folder: Path = REPORTS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name or record.drill}.json"
    path.write_text(json.dumps(asdict(record), indent=2) + "\n")
    return path


def run(names: Sequence[str], settings: Settings) -> list[Record]:
    say("building the images (reused when nothing changed)")
    images.build_all(python_image="")
    records: list[Record] = []
    try:
        cluster.up(STATE, Path(".tools"), say)
        address = (node.read_state(STATE) or {})["registry"]
        say(f"pushing the images: make push REGISTRY={address}/tritonscale")
        images.push(f"{address}/tritonscale", dry_run=False)
        k = Kubectl(STATE / "kubeconfig")
        values = release_values(address)
        say(f"helm install {RELEASE} into {NAMESPACE} (two Triton pods, two operators)")
        install(k, NAMESPACE, values)
        drills = Drills(k, STATE, settings)
        drills.wait_tuned(2)
        with tempfile.TemporaryDirectory(prefix="tritonscale-drills-") as folder:
            with load_on(drills, Path(folder)) as load:
                say(f"load: {USERS} users x {USER_RATE:g} requests/s to {TARGET} over gRPC")
                for number, name in enumerate(names):
                    say(f"drill {name} ...")
                    record = run_drill(drills, name, load, values)
                    records.append(record)
                    # A drill named more than once: NAME.json, NAME-2.json...
                    runs = names[:number].count(name)
                    report = f"{record.drill}-{runs + 1}" if runs else record.drill
                    if not record.passed:
                        say(f"  the pods' logs: {save_logs(k, NAMESPACE, report)}")
                    say(f"  {table([record])[1].strip()}  -> {write_report(record, report)}")
        k("helm", "uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "3m", timeout=200)
    finally:
        say("taking the cluster down")
        cluster.down(STATE, say)
    return records


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short windows, few cycles")
    parser.add_argument("drills", nargs="*", help=f"default: all of {', '.join(DRILLS)}")
    args = parser.parse_args(argv)
    unknown = [name for name in args.drills if name not in DRILLS]
    if unknown:
        parser.error(f"unknown drill {', '.join(unknown)}; choose from {', '.join(DRILLS)}")
    settings = Settings.quick() if args.quick else Settings()
    names = args.drills or list(DRILLS)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        records = run(names, settings)
    except KeyboardInterrupt:
        say("interrupted: the cluster is down")
        return 130
    except CLUSTER_ERRORS as error:
        print(f"drills: {error}", file=sys.stderr)
        return 1
    say("")
    for line in table(records):
        say(line)
    return 0 if all(r.passed for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
