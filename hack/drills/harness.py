"""What every drill works with: the release's names, the steady load and its request log, a
drill's record, and `Drills`, the cluster as the drills see it."""

from __future__ import annotations

import json
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hack import node
from hack.demo_k8s import DemoError, Kubectl, is_ready, pod_counts, ready_addresses, say, wait_for

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
# Offered load: USERS x USER_RATE requests/s, far below what two pods answer on two cores
# (about 90/s each): a failure is the drill's, not the load's.
USERS = 6
USER_RATE = 4.0


@dataclass
class Record:
    """One drill's outcome: what reports/drills/NAME.json holds."""

    drill: str
    requests_sent: int = 0
    requests_failed: int = 0
    p95_before_ms: float | None = None
    p95_during_ms: float | None = None
    recovery_s: float | None = None
    # The failed requests that were inside a Triton pod when its process ended (killed or
    # drained): what no client can save. None when no Triton process ended during the drill.
    requests_in_flight_at_fault: int | None = None
    # The operators' ReloadTimeout events during the drill: a count change that did not
    # finish within its deadline (issue: none in any drill, whatever the fault).
    reload_timeouts: int = 0
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

    def reload_timeouts(self) -> int:
        """The ReloadTimeout events the operators have posted in the namespace so far (an
        event repeated is one object with a count)."""
        events = self.k.items(
            "events", "-n", self.namespace, "--field-selector", "reason=ReloadTimeout"
        )
        return sum(int(event.get("count") or 1) for event in events)

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

    # -- what several drills read

    def ticking_since(self, moment: float) -> dict[str, Any] | None:
        for pod in self.ready(OPERATOR):
            last = self.tick_probe(pod).get("lastTickAt")
            if last is not None and last > moment:
                return pod
        return None

    def rescale_events(self) -> int:
        events = self.k.items("events", "-n", self.namespace)
        return sum(e.get("count", 1) for e in events if e.get("reason") == "SucceededRescale")

    def triton_endpoints(self) -> tuple[list[dict[str, Any]], list[str]]:
        """The Triton Service's EndpointSlices and the addresses they list as ready."""
        slices = self.k.items("endpointslices", "-n", self.namespace, "-l", SERVICE_SLICES)
        return slices, ready_addresses(slices)

    def restarts(self) -> dict[str, int]:
        return {
            f"{p['metadata']['name']}/{s['name']}": s["restartCount"]
            for p in self.k.items("pods", "-n", self.namespace)
            for s in p["status"].get("containerStatuses") or []
        }

    def restarts_since(self, before: dict[str, int]) -> dict[str, int]:
        """Containers of `before` that restarted since."""
        now = self.restarts()
        return {name: now[name] - n for name, n in before.items() if now.get(name, n) != n}


# ---- the moments Triton processes end ----------------------------------------------------

# How a drill counts `requests_in_flight_at_fault`, and the limits of that count.
IN_FLIGHT_BASIS = (
    "from the load's request log: the failed requests that began before a Triton pod's "
    "tritonserver process started to exit (seen on the node in /proc, polled every 50 ms) "
    "and failed less than a second before that moment or after it. A process that exits "
    "answers nothing more, so every request open on it then fails, and a request open then "
    "on another pod is answered: which pod held a request is not in the log. A request open "
    "at that moment that failed for another reason would count too."
)
# The kernel closes a dying process's sockets after it marks it exiting, so a client sees
# its request fail after that moment, but the poll can note the moment up to a poll late.
EXIT_SLACK_S = 1.0
EXIT_POLL_S = 0.05
PF_EXITING = 0x4  # include/linux/sched.h: set as a process starts to exit


def exiting(pid: int) -> bool:
    """Whether process `pid` has started to exit or is gone. Its exit is reported (a pidfd,
    waitpid) only once it has fully ended, and a container's first process ends only after
    every other process of its pid namespace: after an OOM kill that took more than a
    second here, long after its sockets had closed. /proc/PID/stat's flags say it at once."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    # "pid (comm) state ppid pgrp session tty_nr tpgid flags ...": comm may hold spaces.
    fields = stat.rsplit(")", 1)[1].split()
    return fields[0] in "ZX" or bool(int(fields[6]) & PF_EXITING)


@contextmanager
def tritonserver_exits(drills: Drills) -> Iterator[dict[str, float]]:
    """The moment (time.time()) the tritonserver process of each Triton pod running now
    starts to exit, by pod name, filled in as they do while the block runs (the node is this
    machine: its processes are in /proc)."""
    watched: dict[str, int] = {}
    for pod in drills.pods(TRITON):
        try:
            watched[pod["metadata"]["name"]] = drills.container_pid(pod, "tritonserver")
        except (KeyError, node.NodeError):
            continue  # not running (yet): it has no process to end
    ended: dict[str, float] = {}
    stop = threading.Event()

    def watch() -> None:
        while len(ended) < len(watched) and not stop.wait(EXIT_POLL_S):
            for name, pid in watched.items():
                if name not in ended and exiting(pid):
                    ended[name] = time.time()

    watcher = threading.Thread(target=watch, name="tritonserver-exits", daemon=True)
    watcher.start()
    try:
        yield ended
    finally:
        stop.set()
        watcher.join(timeout=5)


def count_in_flight(
    record: Record,
    requests: list[dict[str, Any]],
    ended: dict[str, float],
    start: float,
    end: float,
) -> list[dict[str, Any]]:
    """Fill `record.requests_in_flight_at_fault` (IN_FLIGHT_BASIS says how) from the log's
    requests of the drill (begun from `start` to `end`, as `tally` counts them) and the
    moments Triton processes ended; the failed requests that were in flight then."""
    record.detail["tritonserver_ended_after_s"] = {
        name: round(at - start, 2) for name, at in sorted(ended.items(), key=lambda i: i[1])
    }
    if not ended:
        return []
    requests = [r for r in requests if start <= r["start"] <= end]
    in_flight = [
        r
        for r in requests
        if r["error"] is not None
        and any(
            r["start"] < at <= r["start"] + r["ms"] / 1000 + EXIT_SLACK_S for at in ended.values()
        )
    ]
    record.requests_in_flight_at_fault = len(in_flight)
    # Failures a client could have been spared: begun after the process had ended (sent to
    # a pod that was gone), or not near any such moment.
    record.detail["failed_not_in_flight"] = record.requests_failed - len(in_flight)
    record.detail["requests_open_at_fault"] = sum(
        1
        for r in requests
        if any(r["start"] < at <= r["start"] + r["ms"] / 1000 for at in ended.values())
    )
    record.detail["in_flight_basis"] = IN_FLIGHT_BASIS
    return in_flight


def note_failure_span(record: Record, failed: list[dict[str, Any]], start: float) -> None:
    """When, in seconds from the drill's start, its first and last failed requests began."""
    if failed:
        record.detail["failures_from_s"] = round(min(r["start"] for r in failed) - start, 1)
        record.detail["failures_to_s"] = round(max(r["start"] for r in failed) - start, 1)


def is_node_ready(node: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])
