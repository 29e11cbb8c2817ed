"""The node: registration, binding, the pod watch and the Service routes (see the package)."""

from __future__ import annotations

import os
import platform
import sys
import threading
import time
from collections.abc import Callable, Mapping
from decimal import Decimal
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

from kubernetes.utils.quantity import parse_quantity

# The modules, not the package: the package's __init__ imports this module.
import tritonscale.local.node.images as images
import tritonscale.local.node.network as network
import tritonscale.local.node.services as services
from tritonscale.local.node.containers import now_rfc3339
from tritonscale.local.node.errors import NodeError
from tritonscale.local.node.kube import STRATEGIC, Kube, is_status, pod_path
from tritonscale.local.node.pod import PodWorker
from tritonscale.local.triton_server import LocalTritonError

DEFAULT_RUN_DIR = Path("/run/tritonscale-node")
WATCH_TIMEOUT_S = 20
HOUSEKEEPING_S = 1.0
HEARTBEAT_S = 30.0
SCHEDULE_RETRY_S = 5.0
EVENT_REPEAT_S = 60.0
TERMINAL = ("Succeeded", "Failed")
STAND_IN_VERSION = "tritonscale-node/0.1"


def _memory_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return 0


def pod_requests(pod: Mapping[str, Any]) -> dict[str, Decimal]:
    """What a pod asks of a node, as the scheduler counts it: the containers' requests
    summed, or the largest init container's where that is more."""

    def requests(container: Mapping[str, Any]) -> dict[str, Decimal]:
        resources = container.get("resources") or {}
        # A limit without a request requests the limit (API defaulting does the same).
        asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        return {name: parse_quantity(str(value)) for name, value in asked.items()}

    total: dict[str, Decimal] = {}
    for container in pod["spec"].get("containers") or []:
        for name, value in requests(container).items():
            total[name] = total.get(name, Decimal(0)) + value
    for container in pod["spec"].get("initContainers") or []:
        for name, value in requests(container).items():
            total[name] = max(total.get(name, Decimal(0)), value)
    return total


class Node:
    """A kubelet stand-in for one Node of a real control plane; a context manager.

    `kubeconfig` is an admin's (the stand-in also binds pods, as a scheduler would).
    `capacity` adds to or overrides the Node's capacity (default: this machine's CPUs and
    memory, 110 pods). `restart_backoff_s` is the first CrashLoopBackOff delay.
    """

    def __init__(
        self,
        kubeconfig: Path,
        *,
        name: str = "tritonscale-node",
        run_dir: Path = DEFAULT_RUN_DIR,
        capacity: Mapping[str, str] | None = None,
        restart_backoff_s: float = 10.0,
        python_bin: Path | None = None,
        progress: Callable[[str], Any] = lambda _line: None,
    ) -> None:
        self.kubeconfig = Path(kubeconfig)
        self.name = name
        self.run_dir = Path(run_dir)
        self.capacity = {
            "cpu": str(os.cpu_count() or 1),
            "memory": str(_memory_bytes()),
            "pods": "110",
            **(capacity or {}),
        }
        self.restart_backoff_s = restart_backoff_s
        self.python_bin = Path(python_bin or Path(sys.executable).parent)
        self.progress = progress
        self.slot: network.Slot = None  # type: ignore[assignment]  # set by start()
        self.kube: Kube = None  # type: ignore[assignment]
        self.images: dict[str, images.LocalImage] = {}
        self.workers: dict[str, PodWorker] = {}
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._forwarder: network.ApiForwarder | None = None
        self._routes: dict[tuple[str, str], list[str]] = {}
        self._octets_in_use: set[int] = set()
        self._next_octet = network.POD_OCTETS.start
        self._recent_events: dict[tuple[str, str, str], float] = {}
        self._unschedulable: dict[str, str] = {}

    # ---- life cycle -------------------------------------------------------------------------
    def start(self) -> Node:
        network.require_network_tools()
        removed = network.clean_leftovers(self.run_dir)
        if removed:
            self.progress(f"node: removed what a stopped stand-in left: {', '.join(removed)}")
        self.slot = network.take_slot(self.run_dir)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        self.slot.state_dir.mkdir(parents=True)
        network.create_bridge(self.slot)
        self.kube = Kube(self.kubeconfig)
        server = urlsplit(self.kube.server)
        self._forwarder = network.ApiForwarder(
            (self.slot.gateway, network.API_PORT), (server.hostname or "", server.port or 443)
        ).start()
        try:
            triton_bin = images.write_triton_wrapper(self.slot.images_dir / "triton")
        except LocalTritonError as error:
            triton_bin = None
            self.progress(f"node: no triton image here: {error}")
        self.images = images.image_table(self.python_bin, triton_bin)
        self._register()
        for target, name in ((self._watch, "watch"), (self._housekeeping, "housekeeping")):
            thread = threading.Thread(target=target, name=f"node-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        self.progress(
            f"node: {self.name} ready (pods on {self.slot.subnet}, bridge {self.slot.bridge})"
        )

    def stop(self) -> None:
        """Stop every pod's processes, remove the Node object, the network and the state."""
        self._stopping.set()
        with self._lock:
            workers = list(self.workers.values())
        for worker in workers:
            worker.stop()
        for worker in workers:
            worker.join(timeout=30)
        if self.kube is not None:
            try:
                self.kube.delete(f"/api/v1/nodes/{self.name}")
            except Exception as error:
                if not is_status(error, 404):
                    self.progress(f"node: could not delete Node {self.name}: {error}")
        if self._forwarder is not None:
            self._forwarder.stop()
            self._forwarder = None
        if self.slot is not None:
            network.clean_slot(self.slot)
            self.slot.release()
        if self.kube is not None:
            self.kube.close()
        for thread in self._threads:
            thread.join(timeout=2)

    def __enter__(self) -> Node:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ---- the Node object ---------------------------------------------------------------------
    def _node_status(self) -> dict[str, Any]:
        now = now_rfc3339()

        def condition(kind: str, ok: bool, reason: str, message: str) -> dict[str, Any]:
            return {"type": kind, "status": "True" if ok else "False", "reason": reason,
                    "message": message, "lastHeartbeatTime": now}  # fmt: skip

        return {
            "capacity": self.capacity,
            "allocatable": self.capacity,
            "conditions": [
                condition("MemoryPressure", False, "KubeletHasSufficientMemory", "no pressure"),
                condition("DiskPressure", False, "KubeletHasNoDiskPressure", "no pressure"),
                condition("PIDPressure", False, "KubeletHasSufficientPID", "no pressure"),
                condition("Ready", True, "KubeletReady", "the tritonscale node stand-in runs pods"),
            ],
            "addresses": [
                {"type": "InternalIP", "address": self.slot.gateway},
                {"type": "Hostname", "address": self.name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kernelVersion": platform.release(),
                "osImage": "tritonscale node stand-in",
                "containerRuntimeVersion": STAND_IN_VERSION,
                "kubeletVersion": STAND_IN_VERSION,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": {"x86_64": "amd64", "aarch64": "arm64"}.get(
                    platform.machine(), platform.machine()
                ),
            },  # fmt: skip
        }

    def _register(self) -> None:
        labels = {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "tritonscale.io/node-stand-in": "true",
        }
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": labels},
        }
        try:
            self.kube.post("/api/v1/nodes", body)
        except Exception as error:
            if not is_status(error, 409):
                raise NodeError(f"cannot register Node {self.name}: {error}") from None
            self.kube.patch(f"/api/v1/nodes/{self.name}", {"metadata": {"labels": labels}})
        self.kube.patch(f"/api/v1/nodes/{self.name}/status", {"status": self._node_status()})

    # ---- what pods ask of the node -----------------------------------------------------------
    def allocate_octet(self) -> int:
        """The next free pod address, round robin: a freed address is reused last."""
        with self._lock:
            octets = list(network.POD_OCTETS)
            start = octets.index(self._next_octet)
            for octet in octets[start:] + octets[:start]:
                if octet not in self._octets_in_use:
                    self._octets_in_use.add(octet)
                    following = octets.index(octet) + 1
                    self._next_octet = octets[following % len(octets)]
                    return octet
        raise NodeError(f"no free pod address left in {self.slot.subnet}")

    def release_octet(self, octet: int) -> None:
        with self._lock:
            self._octets_in_use.discard(octet)

    def routes(self) -> dict[tuple[str, str], list[str]]:
        with self._lock:
            return dict(self._routes)

    def forget(self, worker: PodWorker) -> None:
        with self._lock:
            if self.workers.get(worker.uid) is worker:
                del self.workers[worker.uid]

    def event(self, pod: Mapping[str, Any], reason: str, message: str, warning: bool) -> None:
        """A core/v1 Event on the pod, as the kubelet posts them; repeats within a minute
        are dropped (the kubelet aggregates them)."""
        metadata = pod["metadata"]
        key = (metadata["uid"], reason, message)
        now = time.monotonic()
        with self._lock:
            if now - self._recent_events.get(key, -EVENT_REPEAT_S) < EVENT_REPEAT_S:
                return
            self._recent_events[key] = now
        timestamp = now_rfc3339()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "generateName": f"{metadata['name']}.",
                "namespace": metadata["namespace"],
            },
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": metadata["name"],
                "namespace": metadata["namespace"],
                "uid": metadata["uid"],
            },  # fmt: skip
            "reason": reason,
            "message": message,
            "type": "Warning" if warning else "Normal",
            "source": {"component": "kubelet", "host": self.name},
            "reportingComponent": "tritonscale-node",
            "reportingInstance": self.name,
            "firstTimestamp": timestamp,
            "lastTimestamp": timestamp,
            "count": 1,
        }
        try:
            self.kube.post(f"/api/v1/namespaces/{metadata['namespace']}/events", body)
        except Exception:  # events are best effort (a namespace being deleted refuses them)
            pass

    # ---- scheduling ------------------------------------------------------------------------
    def _fit_problem(self, pod: Mapping[str, Any]) -> str | None:
        """Why the pod does not fit on this node (None: it does), in the scheduler's words."""
        selector = pod["spec"].get("nodeSelector") or {}
        labels = {"kubernetes.io/hostname": self.name, "kubernetes.io/os": "linux",
                  "tritonscale.io/node-stand-in": "true"}  # fmt: skip
        if any(labels.get(key) != value for key, value in selector.items()):
            return "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."
        with self._lock:
            active = [
                w.pod
                for w in self.workers.values()
                if not w.gone and (w.pod.get("status") or {}).get("phase") not in TERMINAL
            ]
        used: dict[str, Decimal] = {"pods": Decimal(len(active))}
        for other in active:
            for resource, amount in pod_requests(other).items():
                used[resource] = used.get(resource, Decimal(0)) + amount
        wanted = {"pods": Decimal(1), **pod_requests(pod)}
        short = sorted(
            resource
            for resource, amount in wanted.items()
            if used.get(resource, Decimal(0)) + amount
            > parse_quantity(self.capacity.get(resource, "0"))
        )
        if short:
            reasons = ", ".join(f"1 Insufficient {resource}" for resource in short)
            return f"0/1 nodes are available: {reasons}."
        return None

    def _schedule(self, pod: dict[str, Any]) -> None:
        metadata = pod["metadata"]
        problem = self._fit_problem(pod)
        if problem is not None:
            if self._unschedulable.get(metadata["uid"]) != problem:
                self._unschedulable[metadata["uid"]] = problem
                self.event(pod, "FailedScheduling", problem, warning=True)
            return
        self._unschedulable.pop(metadata["uid"], None)
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": metadata["name"], "namespace": metadata["namespace"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.name},
        }
        try:
            self.kube.post(pod_path(metadata["namespace"], metadata["name"], "binding"), binding)
        except Exception as error:
            if is_status(error, 404, 409):
                return  # gone, or bound meanwhile
            raise
        message = f"Successfully assigned {metadata['namespace']}/{metadata['name']} to {self.name}"
        self.event(pod, "Scheduled", message, warning=False)

    # ---- watching pods -----------------------------------------------------------------------
    def _handle(self, kind: str, pod: dict[str, Any]) -> None:
        metadata, spec = pod["metadata"], pod["spec"]
        uid = metadata["uid"]
        with self._lock:
            worker = self.workers.get(uid)
            if kind == "DELETED":
                if worker is not None:
                    worker.deleted()
                self._unschedulable.pop(uid, None)
                return
            if self._stopping.is_set():
                return
            if spec.get("nodeName") == self.name:
                if worker is not None:
                    worker.update(pod)
                    return
                if (pod.get("status") or {}).get("phase") in TERMINAL:
                    return
                if metadata.get("deletionTimestamp"):
                    # Bound here by a stand-in that is gone: nothing runs it, let it go.
                    self._delete_now(pod)
                    return
                worker = PodWorker(self, pod)
                self.workers[uid] = worker
                worker.start()
                return
        if (
            not spec.get("nodeName")
            and spec.get("schedulerName", "default-scheduler") == "default-scheduler"
            and (pod.get("status") or {}).get("phase", "Pending") == "Pending"
            and not metadata.get("deletionTimestamp")
        ):
            self._schedule(pod)

    def _delete_now(self, pod: Mapping[str, Any]) -> None:
        metadata = pod["metadata"]
        try:
            self.kube.delete(
                pod_path(metadata["namespace"], metadata["name"]),
                {"gracePeriodSeconds": 0, "preconditions": {"uid": metadata["uid"]}},
            )
        except Exception as error:
            if not is_status(error, 404, 409):
                raise

    def _watch(self) -> None:
        version: str | None = None
        while not self._stopping.is_set():
            try:
                if version is None:
                    listing = self.kube.get("/api/v1/pods")
                    version = listing["metadata"]["resourceVersion"]
                    listed = {pod["metadata"]["uid"] for pod in listing["items"]}
                    with self._lock:
                        vanished = [w for uid, w in self.workers.items() if uid not in listed]
                    for worker in vanished:
                        worker.deleted()
                    for pod in listing["items"]:
                        self._handle("ADDED", pod)
                for event in self.kube.watch_pods(version, WATCH_TIMEOUT_S):
                    if self._stopping.is_set():
                        return
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        version = None  # expired: list again
                        break
                    version = obj["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK":
                        self._handle(event["type"], obj)
            except Exception as error:
                if self._stopping.is_set():
                    return
                if not is_status(error, 410):
                    self.progress(f"node: pod watch: {error}; listing again")
                version = None
                self._stopping.wait(1.0)

    def _housekeeping(self) -> None:
        """Service routes every second; Pending pods and the heartbeat now and then."""
        last_heartbeat = last_schedule = time.monotonic()
        while not self._stopping.wait(HOUSEKEEPING_S):
            try:
                slices = self.kube.get("/apis/discovery.k8s.io/v1/endpointslices")["items"]
                routes = services.routes_from_slices(slices)
                with self._lock:
                    changed, self._routes = routes != self._routes, routes
                    workers = list(self.workers.values())
                if changed:
                    for worker in workers:
                        worker.write_hosts()
                now = time.monotonic()
                if now - last_schedule >= SCHEDULE_RETRY_S:
                    last_schedule = now
                    pending = self.kube.get("/api/v1/pods", fieldSelector="spec.nodeName=")
                    for pod in pending["items"]:
                        self._handle("MODIFIED", pod)
                if now - last_heartbeat >= HEARTBEAT_S:
                    last_heartbeat = now
                    self.kube.patch(
                        f"/api/v1/nodes/{self.name}/status",
                        {"status": {"conditions": self._node_status()["conditions"]}},
                        STRATEGIC,
                    )
            except Exception as error:
                if not self._stopping.is_set():
                    self.progress(f"node: housekeeping: {error}")

    # ---- for tests and tools ----------------------------------------------------------------
    def worker(self, namespace: str, name: str) -> PodWorker:
        with self._lock:
            for worker in self.workers.values():
                if (worker.namespace, worker.pod_name) == (namespace, name):
                    return worker
        raise NodeError(f"pod {namespace}/{name} does not run on {self.name}")

    def container_pid(self, namespace: str, pod: str, container: str) -> int | None:
        """The main process of a running container (None while it is not running)."""
        found = self.worker(namespace, pod).container(container)
        return found.pid if found is not None else None

    def container_path(self, namespace: str, pod: str, container: str, path: str) -> Path:
        """`path` as the container sees it (its root, its mounts), from this machine."""
        pid = self.container_pid(namespace, pod, container)
        if pid is None:
            raise NodeError(f"container {container} of {namespace}/{pod} is not running")
        return Path("/proc", str(pid), "root", path.lstrip("/"))

    def logs(self, namespace: str, pod: str, container: str) -> str:
        """The output of the container's current (or last) run."""
        return self.worker(namespace, pod).logs(container)
