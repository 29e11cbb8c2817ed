"""One container of a pod: its process, its probes and its restarts, the kubelet's way.

A thread per container starts the command (`sandbox.container_command`), watches it and
runs its probes: startupProbe first, then livenessProbe and readinessProbe, each with its
initialDelaySeconds, periodSeconds, timeoutSeconds and thresholds; httpGet and tcpSocket
probe the pod's address from the machine, exec runs inside the container (grpc probes are
TCP connects here). A failed liveness or startup probe kills the container. A container
that ends is restarted as restartPolicy says: the first time at once, then after 10 s,
20 s, 40 s ... up to 5 minutes (CrashLoopBackOff), the back-off forgotten after 10 minutes
of running. Stopping runs the preStop hook, then SIGTERM, and SIGKILL at the deadline.
When the main process ends, the rest of the container's process group is killed, as the
end of PID 1 ends a container's PID namespace.

What the kubelet would report (state, lastState, restartCount, ready, started) is kept in
`ContainerState` for the pod's status.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tritonscale.local.node.errors import NodeError
from tritonscale.local.node.images import LocalImage
from tritonscale.local.node.sandbox import Mount, Sandbox

MAX_BACKOFF_S = 300.0
BACKOFF_RESET_S = 600.0
TICK_S = 0.1


def now_rfc3339() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL when the thread that started it ends, so no
    container outlives a crashed stand-in."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


_VARIABLE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, variables: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: known names are replaced, unknown ones kept, `$$` is `$`."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return variables.get(match.group(1), match.group(0))

    return _VARIABLE.sub(replace, text)


@dataclass
class ContainerState:
    """The kubelet's view of one container, as the pod status shows it."""

    name: str
    image: str
    state: dict[str, Any] = field(
        default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}}
    )
    last_state: dict[str, Any] = field(default_factory=dict)
    restart_count: int = 0
    ready: bool = False
    started: bool = False
    container_id: str = ""

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = {
            "name": self.name,
            "image": self.image,
            "imageID": "",
            "ready": self.ready,
            "started": self.started,
            "restartCount": self.restart_count,
            "state": self.state,
            "lastState": self.last_state,
        }
        if self.container_id:
            status["containerID"] = self.container_id
        return status


@dataclass
class _Probe:
    spec: Mapping[str, Any]
    started_at: float
    next_at: float = 0.0
    successes: int = 0
    failures: int = 0

    def __post_init__(self) -> None:
        self.next_at = self.started_at + float(self.spec.get("initialDelaySeconds", 0))

    @property
    def period(self) -> float:
        return float(self.spec.get("periodSeconds", 10))

    @property
    def timeout(self) -> float:
        return float(self.spec.get("timeoutSeconds", 1))

    def record(self, ok: bool) -> bool | None:
        """Count one result; True/False once a threshold is met, None while undecided."""
        if ok:
            self.successes, self.failures = self.successes + 1, 0
            if self.successes >= int(self.spec.get("successThreshold", 1)):
                return True
        else:
            self.successes, self.failures = 0, self.failures + 1
            if self.failures >= int(self.spec.get("failureThreshold", 3)):
                return False
        return None


class PodContext:
    """What a container needs of its pod (implemented by pod.PodWorker)."""

    pod: dict[str, Any]
    pod_ip: str
    sandbox: Sandbox
    hosts_file: Path
    pod_dir: Path
    restart_backoff_s: float

    def volume_folder(self, name: str) -> Path: ...
    def image(self, image: str) -> LocalImage: ...
    def env_from(self, source: Mapping[str, Any]) -> dict[str, str]: ...
    def env_value(self, source: Mapping[str, Any], container: Mapping[str, Any]) -> str: ...
    def event(self, reason: str, message: str, warning: bool = False) -> None: ...
    def changed(self) -> None: ...
    def grace_seconds(self) -> float: ...


class Container(threading.Thread):
    """Runs one container of `pod` until it finishes for good or `stop` is called."""

    def __init__(self, pod: PodContext, spec: Mapping[str, Any], *, init: bool = False) -> None:
        super().__init__(name=f"container-{spec['name']}", daemon=True)
        self.pod = pod
        self.spec = spec
        self.container_name: str = spec["name"]
        self.init = init
        self.status = ContainerState(spec["name"], spec.get("image", ""))
        self.process: subprocess.Popen[bytes] | None = None
        self.exit_code: int | None = None
        self.finished = threading.Event()  # ended, and will not be restarted
        self._stopping = threading.Event()
        self._stop_deadline = 0.0
        self._crashes = 0
        self._lock = threading.Lock()

    # ---- what the pod asks --------------------------------------------------------------
    def stop(self, deadline: float) -> None:
        """Terminate (preStop, SIGTERM, SIGKILL at `deadline`) and restart no more."""
        self._stop_deadline = deadline
        self._stopping.set()

    @property
    def pid(self) -> int | None:
        process = self.process
        return process.pid if process is not None and process.poll() is None else None

    # ---- the command ----------------------------------------------------------------------
    def _environment(self, image: LocalImage) -> dict[str, str]:
        env = {
            "PATH": image.path_variable,
            "HOSTNAME": self.pod.pod["metadata"]["name"],
            # What a runtime gives a user its image's passwd does not list (the chart's pods run
            # as a numeric non-root user): the pod's root, never this machine's home folders.
            "HOME": "/",
            # The API server, as the pods' hosts files route it (see network.ApiForwarder).
            "KUBERNETES_SERVICE_HOST": "kubernetes.default.svc",
            "KUBERNETES_SERVICE_PORT": "443",
            "KUBERNETES_SERVICE_PORT_HTTPS": "443",
            # Service names live in the pod's /etc/hosts (see services), which gRPC's default
            # resolver (c-ares) skips; the system's resolver reads it.
            "GRPC_DNS_RESOLVER": "native",
            **image.env,
        }
        for source in self.spec.get("envFrom") or []:
            env.update(self.pod.env_from(source))
        for item in self.spec.get("env") or []:
            if "valueFrom" in item:
                value = self.pod.env_value(item["valueFrom"], self.spec)
            else:
                value = expand(item.get("value", ""), env)
            env[item["name"]] = value
        return env

    def _argv(self, image: LocalImage, env: Mapping[str, str]) -> list[str]:
        command = list(self.spec.get("command") or [])
        args = list(self.spec.get("args") or [])
        if not command:
            command = list(image.entrypoint)
        argv = [expand(part, env) for part in command + args]
        if not argv:
            raise NodeError(
                f"container {self.container_name} has no command and its image no entrypoint"
            )
        return argv

    def _mounts(self) -> list[Mount]:
        mounts = []
        for item in self.spec.get("volumeMounts") or []:
            source = self.pod.volume_folder(item["name"])
            if item.get("subPath"):
                source = source / item["subPath"]
                if not source.exists():
                    source.mkdir(parents=True)
            mounts.append(Mount(source, item["mountPath"], bool(item.get("readOnly"))))
        return mounts

    def _start(self) -> None:
        image = self.pod.image(self.spec.get("image", ""))
        env = self._environment(image)
        argv = self._argv(image, env)
        working_dir = self.spec.get("workingDir") or image.working_dir
        logs = self.pod.pod_dir / "logs" / self.container_name
        logs.mkdir(parents=True, exist_ok=True)
        scratch = (
            self.pod.pod_dir / "containers" / f"{self.container_name}-{self.status.restart_count}"
        )
        command = self.pod.sandbox.container_command(
            argv, working_dir, self._mounts(), scratch, self.pod.hosts_file
        )
        with open(logs / f"{self.status.restart_count}.log", "ab") as log:
            self.process = subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stopping reaches its children
                preexec_fn=die_with_parent,
            )
        self._env = env
        with self._lock:
            self.status.state = {"running": {"startedAt": now_rfc3339()}}
            self.status.container_id = f"tritonscale-node://{self.process.pid}"
            self.status.started = "startupProbe" not in self.spec
            self.status.ready = False
        self.pod.event("Started", f"Started container {self.container_name}")
        self.pod.changed()

    # ---- probes and hooks -----------------------------------------------------------------
    def _port(self, port: Any) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for item in self.spec.get("ports") or []:
            if item.get("name") == port:
                return int(item["containerPort"])
        raise NodeError(f"container {self.container_name} has no port named {port!r}")

    def _exec(self, command: Sequence[str], timeout: float) -> tuple[bool, str]:
        pid = self.pid
        if pid is None:
            return False, "container not running"
        argv = self.pod.sandbox.exec_command(pid, [expand(c, self._env) for c in command])
        try:
            done = subprocess.run(
                argv,
                env=self._env,
                capture_output=True,
                timeout=timeout,
                start_new_session=True,
            )
        except subprocess.TimeoutExpired:
            return False, f"command timed out after {timeout:.0f}s"
        output = (done.stdout + done.stderr).decode(errors="replace").strip()
        return done.returncode == 0, output[-300:]

    def _check(self, action: Mapping[str, Any], timeout: float) -> tuple[bool, str]:
        """One probe (or hook) action: (ok, why it failed)."""
        try:
            if "exec" in action:
                return self._exec(action["exec"].get("command") or [], timeout)
            if "httpGet" in action:
                get = action["httpGet"]
                host = get.get("host") or self.pod.pod_ip
                scheme = str(get.get("scheme", "HTTP")).lower()
                url = f"{scheme}://{host}:{self._port(get['port'])}{get.get('path', '/')}"
                headers = {h["name"]: h["value"] for h in get.get("httpHeaders") or []}
                request = urllib.request.Request(url, headers=headers)
                try:
                    with urllib.request.urlopen(request, timeout=timeout) as response:
                        return 200 <= response.status < 400, f"HTTP {response.status}"
                except urllib.error.HTTPError as error:
                    return False, f"HTTP probe failed with statuscode: {error.code}"
            if "tcpSocket" in action or "grpc" in action:
                spec = action.get("tcpSocket") or action.get("grpc") or {}
                address = (spec.get("host") or self.pod.pod_ip, self._port(spec["port"]))
                with socket.create_connection(address, timeout=timeout):
                    return True, ""
            if "sleep" in action:
                time.sleep(min(float(action["sleep"].get("seconds", 0)), timeout))
                return True, ""
        except (OSError, NodeError) as error:
            return False, str(error)
        return False, f"unsupported probe {sorted(action)}"

    # ---- running ----------------------------------------------------------------------------
    def _backoff(self) -> float:
        """Seconds to wait before this restart: none the first time, then doubling."""
        if self._crashes <= 1:
            return 0.0
        return min(self.pod.restart_backoff_s * 2 ** (self._crashes - 2), MAX_BACKOFF_S)

    def _wait(self, seconds: float) -> bool:
        """Sleep unless stopped; True when stopped."""
        return self._stopping.wait(seconds)

    def _kill(self, deadline: float, reason: str) -> None:
        """preStop hook, SIGTERM, then SIGKILL once `deadline` passes (the pod's grace)."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        self.pod.event("Killing", f"Stopping container {self.container_name}: {reason}")
        pre_stop = (self.spec.get("lifecycle") or {}).get("preStop")
        if pre_stop:
            ok, why = self._check(pre_stop, max(0.0, deadline - time.monotonic()))
            if not ok and process.poll() is None:
                self.pod.event("FailedPreStopHook", f"PreStopHook failed: {why}", warning=True)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        # The whole group, also what outlived the main process (Triton's backend stubs).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)

    def _supervise(self) -> None:
        """Probe the running process until it ends (or is killed for a failed probe)."""
        process = self.process
        assert process is not None
        started_at = time.monotonic()
        probes = {
            kind: _Probe(self.spec[kind], started_at)
            for kind in ("startupProbe", "livenessProbe", "readinessProbe")
            if self.spec.get(kind)
        }
        while process.poll() is None:
            if self._stopping.is_set():
                self._kill(self._stop_deadline, "the pod is being deleted")
                break
            now = time.monotonic()
            for kind, probe in probes.items():
                if kind != "startupProbe" and not self.status.started:
                    continue
                if kind == "startupProbe" and self.status.started:
                    continue
                if now < probe.next_at or process.poll() is not None:
                    continue
                ok, why = self._check(probe.spec, probe.timeout)
                probe.next_at = time.monotonic() + probe.period
                if not ok:
                    name = kind.removesuffix("Probe").capitalize()
                    self.pod.event("Unhealthy", f"{name} probe failed: {why}", warning=True)
                verdict = probe.record(ok)
                if verdict is None:
                    continue
                if kind == "readinessProbe" and verdict != self.status.ready:
                    self.status.ready = verdict
                    self.pod.changed()
                elif kind == "startupProbe" and verdict:
                    self.status.started = True
                    if "readinessProbe" not in probes:
                        self.status.ready = True
                    self.pod.changed()
                elif verdict is False and kind in ("startupProbe", "livenessProbe"):
                    grace = float(probe.spec.get("terminationGracePeriodSeconds") or 0)
                    deadline = time.monotonic() + (grace or self.pod.grace_seconds())
                    what = "liveness" if kind == "livenessProbe" else "startup"
                    self._kill(deadline, f"failed {what} probe, will be restarted")
                    break
            if not probes.get("readinessProbe") and self.status.started and not self.status.ready:
                self.status.ready = True
                self.pod.changed()
            time.sleep(TICK_S)
        process.wait()
        # A container's processes end with its main one, as when PID 1 of its PID namespace
        # exits (Triton's backend stubs, for one, get no chance to clean up).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        if time.monotonic() - started_at > BACKOFF_RESET_S:
            self._crashes = 0

    def _terminated(self) -> None:
        process = self.process
        assert process is not None
        code = process.returncode
        if code < 0:
            code = 128 - code  # killed by a signal, as a runtime reports it
        self.exit_code = code
        started = (self.status.state.get("running") or {}).get("startedAt", now_rfc3339())
        with self._lock:
            self.status.state = {
                "terminated": {
                    "exitCode": code,
                    "reason": "Completed" if code == 0 else "Error",
                    "startedAt": started,
                    "finishedAt": now_rfc3339(),
                    "containerID": self.status.container_id,
                }
            }
            self.status.ready = False
        self.pod.changed()

    def _should_restart(self) -> bool:
        policy = self.pod.pod["spec"].get("restartPolicy", "Always")
        if self.init:
            return self.exit_code != 0 and policy != "Never"
        return policy == "Always" or (policy == "OnFailure" and self.exit_code != 0)

    def run(self) -> None:
        try:
            self._run()
        except Exception as error:  # a bug must not leave the pod hanging silently
            with self._lock:
                self.status.state = {
                    "waiting": {"reason": "RunContainerError", "message": str(error)}
                }
            self.pod.event("Failed", f"Error: {error}", warning=True)
        finally:
            self.finished.set()
            self.pod.changed()

    def _run(self) -> None:
        while not self._stopping.is_set():
            delay = self._backoff()
            if delay:
                message = f"back-off {delay:.0f}s restarting failed container={self.container_name}"
                with self._lock:
                    self.status.state = {
                        "waiting": {"reason": "CrashLoopBackOff", "message": message}
                    }
                self.pod.changed()
                self.pod.event(
                    "BackOff", f"Back-off restarting failed container {self.container_name}", True
                )
                if self._wait(delay):
                    return
            try:
                self._start()
            except NodeError as error:
                reason = "ErrImagePull" if "image" in str(error) else "CreateContainerError"
                with self._lock:
                    self.status.state = {"waiting": {"reason": reason, "message": str(error)}}
                self.pod.event("Failed", f"Error: {error}", warning=True)
                self.pod.changed()
                self._crashes += 1
                if self._wait(max(self._backoff(), self.pod.restart_backoff_s)):
                    return
                continue
            self._supervise()
            self._terminated()
            if self._stopping.is_set() or not self._should_restart():
                return
            self._crashes += 1
            with self._lock:
                self.status.last_state = self.status.state
                self.status.restart_count += 1
