"""One pod on the node stand-in, from binding to deletion, in a thread of its own.

The worker builds the sandbox (an address on the node's bridge, the pod's network and
mount namespaces, its volumes and hosts file), runs the init containers one after the
other, then every container (`containers.Container`), and writes the pod's status as the
kubelet would: podIP, phase, init and container statuses, and the conditions
PodReadyToStartContainers, Initialized, ContainersReady and Ready, where Ready also waits
for every readinessGate's condition to be True. Deleting the pod stops its containers
within terminationGracePeriodSeconds, then removes the object (grace 0, as the kubelet
does) and everything the sandbox made.
"""

from __future__ import annotations

import base64
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import tritonscale.local.node.network as network
import tritonscale.local.node.services as services
import tritonscale.local.node.volumes as volumes
from tritonscale.local.node.containers import Container, die_with_parent, now_rfc3339
from tritonscale.local.node.errors import NodeError
from tritonscale.local.node.images import LocalImage, role_of
from tritonscale.local.node.kube import Kube, is_status, pod_path
from tritonscale.local.node.sandbox import Sandbox

SETUP_RETRY_S = 5.0
STATUS_RESYNC_S = 10.0
DEFAULT_GRACE_S = 30.0
OWN_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")


def _condition(kind: str, ok: bool, reason: str = "", message: str = "") -> dict[str, Any]:
    condition: dict[str, Any] = {"type": kind, "status": "True" if ok else "False"}
    if not ok and reason:
        condition["reason"] = reason
    if not ok and message:
        condition["message"] = message
    return condition


class Node(Protocol):
    """What a pod worker needs of its node (kubelet.Node)."""

    slot: network.Slot
    kube: Kube
    images: dict[str, LocalImage]
    restart_backoff_s: float
    progress: Callable[[str], Any]

    def allocate_octet(self) -> int: ...
    def release_octet(self, octet: int) -> None: ...
    def routes(self) -> dict[tuple[str, str], list[str]]: ...
    def forget(self, worker: PodWorker) -> None: ...
    def event(self, pod: Mapping[str, Any], reason: str, message: str, warning: bool) -> None: ...


class PodWorker(threading.Thread):
    """Runs the pod `uid` of `node` (see the module's docstring)."""

    def __init__(self, node: Node, pod: dict[str, Any]) -> None:
        metadata = pod["metadata"]
        super().__init__(name=f"pod-{metadata['namespace']}/{metadata['name']}", daemon=True)
        self.node = node
        self.pod = pod
        self.uid: str = metadata["uid"]
        self.namespace: str = metadata["namespace"]
        self.pod_name: str = metadata["name"]
        self.pod_dir = node.slot.state_dir / "pods" / f"{self.namespace}_{self.pod_name}_{self.uid}"
        self.hosts_file = self.pod_dir / "hosts"
        self.restart_backoff_s = node.restart_backoff_s
        self.octet: int | None = None
        self.pod_ip = ""
        self.sandbox: Sandbox | None = None
        self.volumes: volumes.PodVolumes | None = None
        self.init_containers: list[Container] = []
        self.containers: list[Container] = []
        self.initialized = False
        self.gone = False  # the object is deleted: nothing to write any more
        self._wake = threading.Event()
        self._stop_requested = False
        self._last_status: dict[str, Any] | None = None
        self._last_write = 0.0
        self._setup_error = ""

    # ---- from the node's watch ------------------------------------------------------------
    def update(self, pod: dict[str, Any]) -> None:
        self.pod = pod
        self._wake.set()

    def deleted(self) -> None:
        """The object is gone (deleted with grace 0 by someone): stop at once."""
        self.gone = True
        self._wake.set()

    def stop(self) -> None:
        """The node stops: end the containers quickly and clean up, leave the object."""
        self._stop_requested = True
        self._wake.set()

    # ---- what containers ask (containers.PodContext) ----------------------------------------
    def volume_folder(self, name: str) -> Path:
        assert self.volumes is not None
        if name not in self.volumes.folders:
            raise NodeError(f"volumeMount names no volume of the pod: {name!r}")
        return self.volumes.folders[name]

    def image(self, image: str) -> LocalImage:
        role = role_of(image)
        local = self.node.images.get(role or "")
        if local is None:
            known = ", ".join(sorted(self.node.images))
            raise NodeError(
                f"image {image!r} has no local stand-in (the node runs the roles {known}; "
                "see tritonscale.local.node.images)"
            )
        return local

    def env_from(self, source: Mapping[str, Any]) -> dict[str, str]:
        prefix = source.get("prefix", "")
        if "configMapRef" in source:
            ref, kind = source["configMapRef"], "configmaps"
        else:
            ref, kind = source["secretRef"], "secrets"
        try:
            obj = self.node.kube.get(f"/api/v1/namespaces/{self.namespace}/{kind}/{ref['name']}")
        except Exception as error:
            if is_status(error, 404) and ref.get("optional"):
                return {}
            raise NodeError(f"{kind[:-1]} {ref['name']!r} for envFrom: {error}") from None
        data = obj.get("data") or {}
        if kind == "secrets":
            data = {k: base64.b64decode(v).decode(errors="replace") for k, v in data.items()}
        return {f"{prefix}{key}": value for key, value in data.items()}

    def env_value(self, source: Mapping[str, Any], container: Mapping[str, Any]) -> str:
        if "fieldRef" in source:
            return volumes.field_value(self.pod, source["fieldRef"]["fieldPath"])
        if "resourceFieldRef" in source:
            return volumes.resource_value(container, source["resourceFieldRef"])
        kind, ref = (
            ("configmaps", source["configMapKeyRef"])
            if "configMapKeyRef" in source
            else ("secrets", source["secretKeyRef"])
        )
        try:
            obj = self.node.kube.get(f"/api/v1/namespaces/{self.namespace}/{kind}/{ref['name']}")
        except Exception as error:
            if is_status(error, 404) and ref.get("optional"):
                return ""
            raise NodeError(f"{kind[:-1]} {ref['name']!r} not found") from None
        value = (obj.get("data") or {}).get(ref["key"])
        if value is None:
            if ref.get("optional"):
                return ""
            raise NodeError(f"{kind[:-1]} {ref['name']!r} has no key {ref['key']!r}")
        return base64.b64decode(value).decode(errors="replace") if kind == "secrets" else value

    def event(self, reason: str, message: str, warning: bool = False) -> None:
        self.node.event(self.pod, reason, message, warning)

    def changed(self) -> None:
        self._wake.set()

    def grace_seconds(self) -> float:
        metadata, spec = self.pod["metadata"], self.pod["spec"]
        grace = metadata.get("deletionGracePeriodSeconds")
        if grace is None:
            grace = spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_S)
        return float(grace)

    # ---- the life of the pod ---------------------------------------------------------------
    def _deleting(self) -> bool:
        return (
            self.gone or self._stop_requested or bool(self.pod["metadata"].get("deletionTimestamp"))
        )

    def _setup(self) -> None:
        """Address, namespaces, volumes, hosts file and sandbox; undone by `_teardown`."""
        self.pod_dir.mkdir(parents=True, exist_ok=True)
        if self.octet is None:
            self.octet = self.node.allocate_octet()
            _, self.pod_ip = network.create_pod_network(self.node.slot, self.octet)
        self.volumes = volumes.prepare(self.node.kube, self.pod, self.pod_dir / "volumes")
        self.write_hosts()
        self.sandbox = Sandbox(
            self.pod_dir,
            self.node.slot.netns(self.octet),
            self.node.slot.state_dir,
            self.volumes.memory,
        )
        self.sandbox.start(preexec_fn=die_with_parent)

    def write_hosts(self) -> None:
        """The pod's /etc/hosts (rewritten in place: containers bind-mount the file)."""
        if not self.pod_ip:
            return
        text = services.hosts_file(
            self.pod_name, self.pod_ip, self.namespace, self.node.slot.gateway,
            self.node.routes(), self.octet or 0,
        )  # fmt: skip
        with open(self.hosts_file, "a+") as hosts:
            hosts.seek(0)
            if hosts.read() != text:
                hosts.seek(0)
                hosts.truncate()
                hosts.write(text)

    def run(self) -> None:
        try:
            self._run()
        except Exception as error:  # a bug in the stand-in: say so on the pod, and clean up
            self.node.progress(f"node: pod {self.namespace}/{self.pod_name}: {error!r}")
            self.event("NodeStandInError", str(error), warning=True)
        finally:
            self._teardown()
            self.node.forget(self)

    def _run(self) -> None:
        self.pod["status"] = dict(self.pod.get("status") or {}, startTime=now_rfc3339())
        self._start_time = self.pod["status"]["startTime"]
        while not self._setup_done():
            if self._deleting():
                self._finish()
                return
            self._write_status()
            self._wake.wait(SETUP_RETRY_S)
            self._wake.clear()
        if not self._run_init_containers():
            self._finish()
            return
        self.containers = [Container(self, spec) for spec in self.pod["spec"]["containers"]]
        for container in self.containers:
            container.start()
        torn_down = False
        while not self._deleting():
            self._wake.wait(1.0)
            self._wake.clear()
            assert self.volumes is not None
            try:
                self.volumes.renew_tokens(self.node.kube, self.pod, time.time())
            except Exception as error:  # the API server may be away for a moment
                self.event("FailedMount", f"renewing the service account token: {error}", True)
            self._write_status()
            if not torn_down and all(c.finished.is_set() for c in self.containers):
                # A finished pod (a Job's) keeps its object and logs, not its sandbox.
                self._release_sandbox()
                torn_down = True
        self._finish()

    def _setup_done(self) -> bool:
        try:
            self._setup()
        except NodeError as error:
            if str(error) != self._setup_error:
                self.event("FailedMount", str(error), warning=True)
                self._setup_error = str(error)
            self._teardown_sandbox()
            return False
        self._setup_error = ""
        return True

    def _run_init_containers(self) -> bool:
        """Each init container to success, in order; False when the pod cannot go on."""
        for spec in self.pod["spec"].get("initContainers") or []:
            container = Container(self, spec, init=True)
            self.init_containers.append(container)
            container.start()
            while not container.finished.is_set():
                if self._deleting():
                    container.stop(time.monotonic() + self.grace_seconds())
                    container.join()
                    return False
                self._wake.wait(1.0)
                self._wake.clear()
                self._write_status()
            if container.exit_code != 0:
                return False
        self.initialized = True
        return True

    def _finish(self) -> None:
        """Stop every container within the grace period; then remove the object."""
        deadline = time.monotonic() + (2.0 if self._stop_requested else self.grace_seconds())
        for container in self.init_containers + self.containers:
            container.stop(deadline)
        for container in self.init_containers + self.containers:
            container.join(timeout=max(1.0, deadline - time.monotonic()) + 15)
        if self._stop_requested or self.gone:
            return
        self._write_status()
        try:
            self.node.kube.delete(
                pod_path(self.namespace, self.pod_name),
                {"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}},
            )
        except Exception as error:
            if not is_status(error, 404, 409):
                raise

    def _teardown_sandbox(self) -> None:
        if self.sandbox is not None:
            self.sandbox.stop()
            self.sandbox = None

    def _release_sandbox(self) -> None:
        """Processes, namespaces and the address go; the pod's folder (its logs) stays."""
        self._teardown_sandbox()
        if self.octet is not None:
            network.delete_pod_network(self.node.slot, self.octet)
            self.node.release_octet(self.octet)
            self.octet = None

    def _teardown(self) -> None:
        self._release_sandbox()
        shutil.rmtree(self.pod_dir, ignore_errors=True)

    # ---- status ------------------------------------------------------------------------
    def _phase(self) -> str:
        policy = self.pod["spec"].get("restartPolicy", "Always")
        if any(c.finished.is_set() and c.exit_code not in (0, None) for c in self.init_containers):
            if policy == "Never":
                return "Failed"
        if not self.containers:
            return "Pending"
        if not all(c.finished.is_set() for c in self.containers):
            return "Running"
        if all(c.exit_code == 0 for c in self.containers):
            return "Succeeded"
        return "Failed"

    def _conditions(self, existing: list[dict[str, Any]]) -> list[dict[str, Any]]:
        containers_ready = bool(self.containers) and all(c.status.ready for c in self.containers)
        not_ready = [c.container_name for c in self.containers if not c.status.ready]
        by_type = {c["type"]: c for c in existing}
        gates = [g["conditionType"] for g in self.pod["spec"].get("readinessGates") or []]
        gates_open = all(by_type.get(g, {}).get("status") == "True" for g in gates)
        ready_message = (
            f"containers with unready status: [{' '.join(not_ready)}]"
            if not containers_ready
            else f"corresponding condition of pod readiness gate {gates} is not True"
        )
        terminal = self._phase() in ("Succeeded", "Failed")
        reason = "PodCompleted" if terminal else "ContainersNotReady"
        wanted = [
            _condition("PodReadyToStartContainers", self.sandbox is not None and not terminal),
            _condition("Initialized", self.initialized, "ContainersNotInitialized"),
            _condition("ContainersReady", containers_ready, reason, ready_message),
            _condition(
                "Ready",
                containers_ready and gates_open,
                "ReadinessGatesNotReady" if containers_ready else reason,
                ready_message,
            ),
        ]
        merged = [c for c in existing if c["type"] not in OWN_CONDITIONS]
        for condition in wanted:
            old = by_type.get(condition["type"])
            if old is not None and old.get("status") == condition["status"]:
                condition["lastTransitionTime"] = old.get("lastTransitionTime")
            else:
                condition["lastTransitionTime"] = now_rfc3339()
            condition["lastProbeTime"] = None
            merged.append(condition)
        return merged

    def _status(self) -> dict[str, Any]:
        status = dict(self.pod.get("status") or {})
        status.update(
            phase=self._phase(),
            hostIP=self.node.slot.gateway,
            hostIPs=[{"ip": self.node.slot.gateway}],
            startTime=status.get("startTime") or self._start_time,
        )
        if self.pod_ip:
            status.update(podIP=self.pod_ip, podIPs=[{"ip": self.pod_ip}])
        specs = self.pod["spec"]
        waiting = {
            "waiting": {
                "reason": "PodInitializing" if specs.get("initContainers") else "ContainerCreating"
            }
        }
        if self._setup_error:
            waiting = {"waiting": {"reason": "ContainerCreating", "message": self._setup_error}}
        running = {c.container_name: c for c in self.containers}
        status["containerStatuses"] = [
            running[spec["name"]].status.status()
            if spec["name"] in running
            else {"name": spec["name"], "image": spec.get("image", ""), "imageID": "",
                  "ready": False, "started": False, "restartCount": 0, "state": waiting,
                  "lastState": {}}
            for spec in specs["containers"]
        ]  # fmt: skip
        if specs.get("initContainers"):
            started = {c.container_name: c for c in self.init_containers}
            status["initContainerStatuses"] = [
                started[spec["name"]].status.status()
                if spec["name"] in started
                else {"name": spec["name"], "image": spec.get("image", ""), "imageID": "",
                      "ready": False, "started": False, "restartCount": 0,
                      "state": {"waiting": {"reason": "PodInitializing"}}, "lastState": {}}
                for spec in specs["initContainers"]
            ]  # fmt: skip
        status["conditions"] = self._conditions(list(status.get("conditions") or []))
        return status

    def _write_status(self) -> None:
        """PUT the status when it changed (or now and then), re-reading on a conflict."""
        if self.gone:
            return
        for _ in range(5):
            status = self._status()
            comparable = {k: v for k, v in status.items() if k != "conditions"}
            comparable["conditions"] = [
                {k: v for k, v in c.items() if k != "lastTransitionTime"}
                for c in status["conditions"]
            ]
            fresh = time.monotonic() - self._last_write < STATUS_RESYNC_S
            if comparable == self._last_status and fresh:
                return
            try:
                self.pod = self.node.kube.put(
                    pod_path(self.namespace, self.pod_name, "status"),
                    {**self.pod, "status": status},
                )
                self._last_status, self._last_write = comparable, time.monotonic()
                return
            except Exception as error:
                if is_status(error, 404):
                    self.gone = True
                    return
                if not is_status(error, 409):
                    raise
                try:
                    self.pod = self.node.kube.get(pod_path(self.namespace, self.pod_name))
                except Exception as again:
                    if is_status(again, 404):
                        self.gone = True
                        return
                    raise
                if self.pod["metadata"]["uid"] != self.uid:
                    self.gone = True
                    return

    # ---- for tests and tools -------------------------------------------------------------
    def container(self, name: str) -> Container | None:
        for container in self.init_containers + self.containers:
            if container.container_name == name:
                return container
        return None

    def logs(self, container: str) -> str:
        folder = self.pod_dir / "logs" / container
        files = sorted(folder.glob("*.log"), key=lambda p: int(p.stem)) if folder.is_dir() else []
        return files[-1].read_text(errors="replace") if files else ""
