"""The cluster tests' tools: kubectl and helm against the local control plane, bounded waits.

Every wait has a deadline and, when it passes, fails with what it waited for and what it
saw last, plus the namespace's pods and recent events: a hang names itself.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import requests

from hack import node as hack_node
from hack.demo_k8s import ready_addresses
from tritonscale.metrics import queries
from tritonscale.metrics.scrape import parse_metrics
from tritonscale.triton.actuator import instance_count

T = TypeVar("T")
COMMAND_TIMEOUT_S = 180


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return (self.stdout + self.stderr).strip()


@dataclass
class Cluster:
    """A local cluster with a real node (hack.cluster up), and the tools to drive it.

    `registry` is the node's registry (127.0.0.1:PORT), where the session pushed the images
    with `make push REGISTRY=<registry>/tritonscale`; `image_values` points a release there.
    """

    state_dir: Path
    tools: dict[str, str]
    registry: str
    version: str  # the chart's appVersion: every image's tag
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    def image_values(self) -> list[str]:
        """helm arguments that pull every image from the node's registry, as the chart's
        README says for a registry of one's own: `global.imageRegistry`, and the CPU Triton
        image `make images` builds in place of NGC's."""
        return [
            "--set", f"global.imageRegistry={self.registry}",
            "--set", "triton.image.repository=tritonscale/tritonscale-triton-cpu",
            "--set", f"triton.image.tag={self.version}",
        ]  # fmt: skip

    def container_pid(self, namespace: str, pod: str, container: str) -> int:
        """The host's pid of a running container's first process, from containerd."""
        statuses = self.get("pod", pod, "-n", namespace)["status"]["containerStatuses"]
        (status,) = [s for s in statuses if s["name"] == container]
        container_id = status["containerID"].split("://", 1)[1]
        return hack_node.task_pid(self.state_dir, container_id)

    def run(
        self, tool: str, *args: str, timeout: float = COMMAND_TIMEOUT_S, stdin: str | None = None
    ) -> Done:
        command = [self.tools[tool], "--kubeconfig", str(self.kubeconfig), *args]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=timeout, input=stdin
            )
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"`{tool} {' '.join(args)}` did not finish within {timeout:.0f} s"
            ) from None
        return Done(done.returncode, done.stdout, done.stderr)

    def kubectl(
        self, *args: str, timeout: float = COMMAND_TIMEOUT_S, stdin: str | None = None
    ) -> str:
        """kubectl ARGS, which must succeed; its stdout."""
        done = self.run("kubectl", *args, timeout=timeout, stdin=stdin)
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.output}"
        return done.stdout

    def helm(self, *args: str, major: int = 4, timeout: float = COMMAND_TIMEOUT_S) -> str:
        done = self.run("helm" if major == 4 else "helm3", *args, timeout=timeout)
        assert done.returncode == 0, f"helm{major} {' '.join(args)}: {done.output}"
        return done.stdout

    def get(self, *args: str) -> dict[str, Any]:
        """`kubectl get ARGS -o json`, parsed."""
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def items(self, *args: str) -> list[dict[str, Any]]:
        return self.get(*args)["items"]

    def diagnosis(self, namespace: str | None) -> str:
        """What a person needs to see when a wait in `namespace` fails."""
        if namespace is None:
            return ""
        parts = []
        for args in (
            ("get", "pods", "-o", "wide"),
            ("get", "events", "--sort-by=.lastTimestamp"),
            ("get", "instancegroupautoscalers", "-o", "wide"),
        ):
            done = self.run("kubectl", "-n", namespace, *args, timeout=30)
            parts.append(f"$ kubectl -n {namespace} {' '.join(args)}\n{done.output[-3000:]}")
        # The output of every container that restarted, ended or is not ready.
        done = self.run("kubectl", "-n", namespace, "get", "pods", "-o", "json", timeout=30)
        pods = json.loads(done.stdout)["items"] if done.returncode == 0 else []
        for pod in pods:
            for status in (pod.get("status") or {}).get("containerStatuses") or []:
                if status["restartCount"] or "terminated" in status["state"] or not status["ready"]:
                    name = f"{pod['metadata']['name']}/{status['name']}"
                    previous = ["--previous"] if status["restartCount"] else []
                    logs = self.run(
                        "kubectl", "-n", namespace, "logs", pod["metadata"]["name"],
                        "-c", status["name"], "--tail=15", *previous, timeout=30,
                    )  # fmt: skip
                    parts.append(f"--- output of {name}{' (previous)' if previous else ''}:")
                    parts.append(logs.output)
        return "\n".join(parts)

    def wait(
        self,
        what: str,
        check: Callable[[], T | None],
        timeout_s: float,
        namespace: str | None = None,
        every_s: float = 1.0,
    ) -> T:
        """Call `check` until it returns something truthy; fail naming `what` at the deadline."""
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while True:
            try:
                last = check()
            except AssertionError as error:  # a kubectl that failed this once
                last = error
            else:
                if last:
                    return last
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout_s:.0f} s waiting for {what}; last seen: {last!r}\n"
                    f"{self.diagnosis(namespace)}"
                )
            time.sleep(every_s)

    # ---- pods ------------------------------------------------------------------------------
    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return self.items("pods", "-n", namespace, "-l", selector)

    def ready_pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        return [pod for pod in self.pods(namespace, selector) if is_ready(pod)]


def restricted_namespace(cluster: Cluster, name: str) -> None:
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("label", "namespace", name, "pod-security.kubernetes.io/enforce=restricted")


def release_objects(cluster: Cluster, namespace: str, selector: str) -> list[str]:
    """Every namespaced object of the release's kinds that the selector finds."""
    kinds = (
        "all,configmaps,secrets,serviceaccounts,roles,rolebindings,poddisruptionbudgets,"
        "networkpolicies,jobs"
    )
    out = cluster.kubectl("get", kinds, "-n", namespace, "-l", selector, "-o", "name")
    # Asked apart: once the CRD is deleted too (kubectl delete -f), the kind is unknown.
    autoscalers = cluster.run(
        "kubectl", "get", "instancegroupautoscalers", "-n", namespace, "-l", selector, "-o", "name"
    )
    crd_gone = any(
        words in autoscalers.output
        for words in ("doesn't have a resource type", "could not find the requested resource")
    )
    assert autoscalers.returncode == 0 or crd_gone, autoscalers.output
    return out.split() + autoscalers.stdout.split()


def wait_release_gone(cluster: Cluster, namespace: str, selector: str) -> None:
    """Wait until no object of the release is left (pods go after their grace period)."""
    cluster.wait(
        f"every object labelled {selector} in {namespace} to be deleted",
        lambda: release_objects(cluster, namespace, selector) == [],
        timeout_s=120,
        namespace=namespace,
    )


def wait_namespace_gone(cluster: Cluster, namespace: str, timeout_s: float = 180) -> None:
    def gone() -> bool:
        done = cluster.run("kubectl", "get", "namespace", namespace)
        return done.returncode != 0 and "NotFound" in done.output

    cluster.wait(f"namespace {namespace} to be deleted", gone, timeout_s, namespace)


def is_ready(pod: dict[str, Any]) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def live_count(pod: dict[str, Any], model: str) -> int | None:
    """The model's instance count on the pod, from Triton itself (None when unreachable)."""
    try:
        response = requests.get(
            f"http://{pod['status']['podIP']}:8000/v2/models/{model}/config", timeout=5
        )
    except requests.RequestException:
        return None
    return instance_count(response.json()) if response.ok else None


def live_counts(pods: Sequence[dict[str, Any]], model: str) -> dict[str, int | None]:
    return {pod["metadata"]["name"]: live_count(pod, model) for pod in pods}


class Stopwatch:
    """`with Stopwatch(cluster.timings, "name"):` records the block's seconds."""

    def __init__(self, timings: dict[str, float], name: str) -> None:
        self.timings, self.name = timings, name

    def __enter__(self) -> Stopwatch:
        self.started = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.timings[self.name] = round(time.monotonic() - self.started, 1)


def served_requests(address: str, model: str) -> float | None:
    """Inference requests `model` has answered (successes and failures) on the Triton at
    `address`, from its metrics port (read as the operator reads them); None when it does
    not answer."""
    try:
        text = requests.get(f"http://{address}:8002/metrics", timeout=5).text
    except requests.RequestException:
        return None
    return sum(
        value
        for (name, labels), value in parse_metrics(text).items()
        if name in (queries.REQUEST_SUCCESS, queries.REQUEST_FAILURE)
        and dict(labels).get("model") == model
    )


class ServiceLoad:
    """Inference requests to a Service's cluster IP, routed by the node's kube-proxy.

    One request at a time, `pause_s` apart: a light, steady load. `ready` is the latest list
    of the addresses the Service's EndpointSlices list as ready (read from the API server
    every half second); `answered` counts the requests that succeeded. Which pod answered
    shows in each pod's own metrics (`served_requests`).
    """

    def __init__(
        self, cluster: Cluster, namespace: str, service: str, model: str, pause_s: float = 0.05
    ) -> None:
        self.cluster, self.namespace, self.service = cluster, namespace, service
        self.model, self.pause_s = model, pause_s
        self.cluster_ip = cluster.get("service", service, "-n", namespace)["spec"]["clusterIP"]
        self.ready: list[str] = []
        self.answered = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._watch, name="service-endpoints", daemon=True),
            threading.Thread(target=self._send, name="service-load", daemon=True),
        ]

    def __enter__(self) -> ServiceLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
            assert not thread.is_alive(), f"{thread.name} did not stop within 30 s"

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                done = self.cluster.run(
                    "kubectl", "get", "endpointslices", "-n", self.namespace, "-l",
                    f"kubernetes.io/service-name={self.service}", "-o", "json", timeout=30,
                )  # fmt: skip
            except AssertionError as error:  # kubectl timed out: keep the last list
                self.errors.append(str(error))
                continue
            if done.returncode == 0:
                self.ready = ready_addresses(json.loads(done.stdout)["items"])
            self._stop.wait(0.5)

    def _send(self) -> None:
        body = {
            "inputs": [
                {"name": "FEATURES", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}
            ]
        }
        url = f"http://{self.cluster_ip}:8000/v2/models/{self.model}/infer"
        while not self._stop.is_set():
            try:
                response = requests.post(url, json=body, timeout=10)
                if response.ok:
                    self.answered += 1
                else:
                    self.errors.append(f"HTTP {response.status_code}: {response.text[:200]}")
            except requests.RequestException as error:
                self.errors.append(type(error).__name__)
            self._stop.wait(self.pause_s)
