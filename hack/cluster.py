"""A real Kubernetes control plane on loopback, built from upstream sources.

No container engine and no prebuilt Kubernetes binary exist on our machines, but Go and
the Go module proxy do. `build` compiles etcd, kube-apiserver, kube-controller-manager and
the node's kube-scheduler, kube-proxy and kubelet from the tiny Go module in `controlplane/`
(hack.kubernetes_build) into TOOLS/kubernetes-vX.Y.Z/bin, and CoreDNS, the registry and
kube-router beside them.

`ControlPlane` (a context manager) starts the three on 127.0.0.1 with a small CA made by
openssl: TLS everywhere (etcd included), Node and RBAC authorization, PodSecurity
admission, service account tokens, aggregator routing to endpoints, and the controllers
a Deployment/HPA workload needs. It writes an admin kubeconfig and returns once /readyz
is ok and the default ServiceAccount exists. `up`/`down` do the same for processes that
outlive Python (their pids and ports are in STATE/cluster.json), and `up` adds a real node
(hack.node: containerd, kubelet, kube-proxy, kube-scheduler; root needed) that `down` removes
with everything it made.

    python -m hack.cluster build   # once: 10-25 minutes cold on 2 cores
    python -m hack.cluster up      # then: kubectl --kubeconfig .cluster/kubeconfig
    python -m hack.cluster status
    python -m hack.cluster down
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from hack import dns, kubernetes_build, netpol, node, registry
from hack.pki import AdminClient, new_cert, new_key, openssl, write_kubeconfig
from hack.processes import (
    ClusterError,
    dying_with_parent,
    is_running,
    last_meaningful_line,
    stop_pids,
)
from tritonscale.local.ports import free_ports, port_is_taken

CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager")
# The controllers a Deployment + DaemonSet + Service + HPA + PDB + Job workload needs, and the
# ones that make RBAC, service accounts and quotas behave as in a real cluster: clusterrole-aggregation
# fills admin/edit/view, root-ca-certificate-publisher writes kube-root-ca.crt, and a
# ResourceQuota admits nothing until resourcequota-controller has computed its usage.
CONTROLLERS = (
    "deployment-controller",
    "daemonset-controller",
    "replicaset-controller",
    # The chart's operator shards (operator.shards) are a StatefulSet.
    "statefulset-controller",
    "job-controller",
    "resourcequota-controller",
    "endpoints-controller",
    "endpointslice-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "horizontal-pod-autoscaler-controller",
    "disruption-controller",
    "clusterrole-aggregation-controller",
    "root-ca-certificate-publisher-controller",
)
STATE_FILE = "cluster.json"


def build(tools_dir: Path, progress: Callable[[str], Any] = print) -> dict[str, Path]:
    """Build Kubernetes (hack.kubernetes_build) into TOOLS/kubernetes-vX.Y.Z/bin, CoreDNS
    (hack.dns), the registry (hack.registry) and kube-router (hack.netpol), or return at once
    when they are there already."""
    paths = kubernetes_build.build(tools_dir, progress)
    return {
        **paths,
        "coredns": dns.build(tools_dir, progress),
        "registry": registry.build(tools_dir, progress),
        "kube-router": netpol.build(tools_dir, progress),
    }


# ---------------------------------------------------------------------- certificates


def _make_pki(pki: Path, advertise_address: str | None = None) -> None:
    """The CAs, keys and certificates of one cluster, all fresh. The API server's certificate
    also names `advertise_address`, where pods reach it through the `kubernetes` Service."""
    if shutil.which("openssl") is None:
        raise ClusterError("openssl not found on PATH: apt-get install openssl")
    pki.mkdir(parents=True, exist_ok=True)
    new_cert(pki, "ca", "tritonscale-local-ca")
    # The aggregator's front proxy gets its own CA, as in kubeadm: a client certificate
    # from the main CA must not be able to pose as the proxy and assert any user.
    new_cert(pki, "front-proxy-ca", "tritonscale-local-front-proxy-ca")
    local = "IP:127.0.0.1, DNS:localhost"
    advertised = f", IP:{advertise_address}" if advertise_address else ""
    in_cluster = ", ".join(
        f"DNS:{name}"
        for name in (
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        )
    )
    server, client = "serverAuth, clientAuth", "clientAuth"
    new_cert(pki, "apiserver", "kube-apiserver", ca="ca", usage=server,
             sans=f"{local}{advertised}, IP:{node.SERVICE_CLUSTER_IP}, {in_cluster}")  # fmt: skip
    new_cert(pki, "etcd", "etcd", ca="ca", usage=server, sans=local)
    new_cert(pki, "apiserver-etcd-client", "kube-apiserver-etcd-client", ca="ca", usage=client)
    new_cert(pki, "admin", "tritonscale-admin", ca="ca", org="system:masters", usage=client)
    new_cert(pki, "controller-manager", "system:kube-controller-manager", ca="ca", usage=client)
    new_cert(pki, "front-proxy-client", "front-proxy-client", ca="front-proxy-ca", usage=client)
    # The API server's identity towards kubelets (logs, exec, port-forward): the kubelet's
    # webhook authorizer asks the API server, and system:masters may do all of it.
    new_cert(pki, "apiserver-kubelet-client", "kube-apiserver-kubelet-client", ca="ca",
             org="system:masters", usage=client)  # fmt: skip
    # The service account signing key: RSA, which every token consumer understands.
    new_key(pki / "sa.key", "RSA")
    openssl("pkey", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))


def _stop_components(
    pids: dict[str, int], binaries_by_name: dict[str, str], grace_s: float
) -> dict[str, int]:
    """etcd last: an apiserver whose etcd is gone takes longer than the grace to shut down,
    where it needs ~1 s otherwise. Return the components that were running."""
    first = stop_pids({n: p for n, p in pids.items() if n != "etcd"}, binaries_by_name, grace_s)
    last = stop_pids({n: p for n, p in pids.items() if n == "etcd"}, binaries_by_name, grace_s)
    return {**first, **last}


def _remove_state(state_dir: Path, kubeconfig: Path) -> None:
    """Remove what a cluster keeps in state_dir; only our own paths, as state_dir may hold
    other things."""
    for name in ("pki", "etcd", "logs", "controller-manager"):
        shutil.rmtree(state_dir / name, ignore_errors=True)
    for name in (STATE_FILE, "controller-manager.kubeconfig"):
        (state_dir / name).unlink(missing_ok=True)
    kubeconfig.unlink(missing_ok=True)


class ControlPlane:
    """etcd, kube-apiserver and kube-controller-manager on 127.0.0.1, fresh at each start.

    `state_dir` holds the certificates, etcd's data, the logs (logs/NAME.log), cluster.json
    and, unless `kubeconfig` says otherwise, the admin kubeconfig. Ports left at 0 are
    picked free. `extra_args` adds flags per component, e.g.
    {"kube-controller-manager": ["--horizontal-pod-autoscaler-sync-period=2s"]}.
    With `detach`, the processes do not die with this Python process (see `up`).

    Alone, the API server listens on 127.0.0.1 only. With `advertise_address` (the node's
    address, given when a node joins) it listens on every address and advertises that one:
    the `kubernetes` Service's endpoint, which kube-proxy routes pods' in-cluster clients
    to (the operator's pod among them).
    """

    def __init__(
        self,
        state_dir: Path = Path(".cluster"),
        tools_dir: Path = Path(".tools"),
        *,
        kubeconfig: Path | None = None,
        apiserver_port: int = 0,
        etcd_port: int = 0,
        etcd_peer_port: int = 0,
        controller_manager_port: int = 0,
        extra_args: dict[str, list[str]] | None = None,
        startup_timeout_s: float = 180.0,
        stop_grace_s: float = 5.0,
        detach: bool = False,
        advertise_address: str | None = None,
        progress: Callable[[str], Any] = lambda _line: None,
    ) -> None:
        self.advertise_address = advertise_address
        self.state_dir = Path(state_dir).resolve()
        self.tools_dir = Path(tools_dir)
        self.kubeconfig = Path(kubeconfig or self.state_dir / "kubeconfig").resolve()
        self.requested_ports = {
            "apiserver": apiserver_port,
            "etcd": etcd_port,
            "etcd-peer": etcd_peer_port,
            "controller-manager": controller_manager_port,
        }
        self.ports: dict[str, int] = {}
        self.extra_args = extra_args or {}
        self.startup_timeout_s = startup_timeout_s
        self.stop_grace_s = stop_grace_s
        self.detach = detach
        self.progress = progress
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.programs: dict[str, str] = {}  # each component's binary (setpriv may run it)
        self.start_seconds: float | None = None
        self._admin: AdminClient | None = None

    @property
    def pki(self) -> Path:
        return self.state_dir / "pki"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    def log_path(self, name: str) -> Path:
        return self.state_dir / "logs" / f"{name}.log"

    def _pick_ports(self) -> None:
        self.ports = {}
        drawn = iter(free_ports(sum(not port for port in self.requested_ports.values())))
        for role, port in self.requested_ports.items():
            if port and port_is_taken(port):
                raise ClusterError(f"port {port} ({role}) is already in use on 127.0.0.1")
            self.ports[role] = port or next(drawn)

    def _commands(self, paths: dict[str, Path]) -> dict[str, list[str]]:
        pki, ports = self.pki, self.ports
        etcd_url = f"https://127.0.0.1:{ports['etcd']}"
        peer_url = f"http://127.0.0.1:{ports['etcd-peer']}"
        return {
            "etcd": [
                str(paths["etcd"]),
                "--name=tritonscale-local",
                f"--data-dir={self.state_dir / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                # A single member: the peer port only has to be ours, never carries data.
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=tritonscale-local={peer_url}",
                "--initial-cluster-state=new",
                f"--cert-file={pki / 'etcd.crt'}",
                f"--key-file={pki / 'etcd.key'}",
                "--client-cert-auth=true",
                f"--trusted-ca-file={pki / 'ca.crt'}",
                # Throwaway data: fsync only slows a test cluster down.
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
            "kube-apiserver": [
                str(paths["kube-apiserver"]),
                f"--bind-address={'0.0.0.0' if self.advertise_address else '127.0.0.1'}",
                f"--advertise-address={self.advertise_address or '127.0.0.1'}",
                f"--secure-port={ports['apiserver']}",
                f"--etcd-servers={etcd_url}",
                f"--etcd-cafile={pki / 'ca.crt'}",
                f"--etcd-certfile={pki / 'apiserver-etcd-client.crt'}",
                f"--etcd-keyfile={pki / 'apiserver-etcd-client.key'}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                "--authorization-mode=Node,RBAC",
                # Added to the default plugins (PodSecurity is one of them already; naming
                # it keeps it on should the defaults change). NodeRestriction goes with
                # the Node authorizer.
                "--enable-admission-plugins=NodeRestriction,PodSecurity",
                # As on kubeadm clusters: PodSecurity, not this flag, decides what may run.
                "--allow-privileged=true",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--service-cluster-ip-range={node.SERVICE_CLUSTER_IP_RANGE}",
                # Aggregated APIs (metrics, custom metrics) are reached at their endpoints:
                # there is no kube-proxy to route a Service's cluster IP.
                "--enable-aggregator-routing=true",
                # Alone, the `kubernetes` Service's Endpoints would be 127.0.0.1, which
                # Endpoints validation rejects (every 10 s, in the log): keep the Service
                # without them. With a node, the lease reconciler lists the advertised address.
                f"--endpoint-reconciler-type={'lease' if self.advertise_address else 'none'}",
                f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
                f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
                # Kubelets are reached at their node's InternalIP (the node's --node-ip),
                # checked against the cluster's CA, as the kubelet client above.
                f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
                f"--kubelet-certificate-authority={pki / 'ca.crt'}",
                "--kubelet-preferred-address-types=InternalIP",
                "--profiling=false",
            ],
            "kube-controller-manager": [
                str(paths["kube-controller-manager"]),
                "--bind-address=127.0.0.1",
                f"--secure-port={ports['controller-manager']}",
                f"--cert-dir={self.state_dir / 'controller-manager'}",
                f"--kubeconfig={self.state_dir / 'controller-manager.kubeconfig'}",
                f"--authentication-kubeconfig={self.state_dir / 'controller-manager.kubeconfig'}",
                f"--authorization-kubeconfig={self.state_dir / 'controller-manager.kubeconfig'}",
                f"--controllers={','.join(CONTROLLERS)}",
                # Each controller acts as its own service account, so RBAC is exercised
                # as in a real cluster.
                "--use-service-account-credentials=true",
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                # One instance: leader election would only delay the start.
                "--leader-elect=false",
                "--profiling=false",
            ],
        }

    def _spawn(self, name: str, command: list[str]) -> None:
        with open(self.log_path(name), "ab") as log:
            command = [*command, *self.extra_args.get(name, [])]
            self.programs[name] = str(command[0])
            self.processes[name] = subprocess.Popen(
                command if self.detach else dying_with_parent(command),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.state_dir,
                # Its own session and process group: stop() signals the whole group, and a
                # detached cluster takes no signal meant for our terminal.
                start_new_session=True,
            )

    def _check_alive(self) -> None:
        for name, process in self.processes.items():
            if process.poll() is not None:
                raise ClusterError(
                    f"{name} exited during start (code {process.returncode}): "
                    f"{last_meaningful_line(self.log_path(name))} "
                    f"(log: {self.log_path(name)})"
                )

    def admin(self) -> AdminClient:
        """The API server as the admin, with this start's certificates."""
        if self._admin is None:
            self._admin = AdminClient(self.server, self.pki)
        return self._admin

    def get(self, path: str, timeout_s: float = 2.0) -> tuple[int, str]:
        """GET `path` from the apiserver as the admin: (status, body); (0, error) when the
        connection fails."""
        return self.admin().get(path, timeout_s)

    def _wait(self, what: str, ready: Callable[[], bool], deadline: float) -> None:
        while not ready():
            self._check_alive()
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"timed out after {self.startup_timeout_s:.0f} s waiting for {what} "
                    f"(logs: {self.state_dir / 'logs'})"
                )
            time.sleep(0.2)

    def start(self) -> ControlPlane:
        paths = kubernetes_build.binaries(self.tools_dir)
        missing = [name for name, path in paths.items() if not path.is_file()]
        if missing:
            raise ClusterError(
                f"{', '.join(missing)} not built in "
                f"{kubernetes_build.bin_dir(self.tools_dir)}: run "
                f"`python -m hack.cluster build --tools-dir {self.tools_dir}`"
            )
        self._pick_ports()
        _remove_state(self.state_dir, self.kubeconfig)  # each start is a fresh cluster
        self._admin = None
        (self.state_dir / "logs").mkdir(parents=True, exist_ok=True)
        _make_pki(self.pki, self.advertise_address)
        write_kubeconfig(self.kubeconfig, self.server, self.pki, "admin")
        write_kubeconfig(
            self.state_dir / "controller-manager.kubeconfig",
            self.server,
            self.pki,
            "controller-manager",
        )
        commands = self._commands(paths)
        started = time.monotonic()
        deadline = started + self.startup_timeout_s
        try:
            self._spawn("etcd", commands["etcd"])
            self._spawn("kube-apiserver", commands["kube-apiserver"])
            self._write_state()  # from here on, `down` can clean up whatever happens
            self._wait(
                "kube-apiserver /readyz", lambda: self.get("/readyz") == (200, "ok"), deadline
            )
            # After /readyz: the controller-manager gives up when the apiserver is slow.
            self._spawn("kube-controller-manager", commands["kube-controller-manager"])
            self._write_state()
            self._wait(
                "the default ServiceAccount",
                lambda: self.get("/api/v1/namespaces/default/serviceaccounts/default")[0] == 200,
                deadline,
            )
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - started
        self.progress(f"control plane ready in {self.start_seconds:.1f} s at {self.server}")
        return self

    def _write_state(self) -> None:
        state = {
            "server": self.server,
            "kubeconfig": str(self.kubeconfig),
            "ports": self.ports,
            "pids": {name: process.pid for name, process in self.processes.items()},
            "binaries": {name: self.programs[name] for name in self.processes},
            "logs": str(self.state_dir / "logs"),
        }
        partial = self.state_dir / f".{STATE_FILE}.partial"
        partial.write_text(json.dumps(state, indent=2) + "\n")
        os.replace(partial, self.state_dir / STATE_FILE)

    def stop(self) -> None:
        """Stop every component (SIGTERM, SIGKILL after stop_grace_s); keep the logs."""
        processes, self.processes = self.processes, {}
        if processes:
            _stop_components(
                {name: process.pid for name, process in processes.items()},
                {name: self.programs[name] for name in processes},
                self.stop_grace_s,
            )
            for process in processes.values():
                process.wait(timeout=5)  # reap: they are dead by now
        (self.state_dir / STATE_FILE).unlink(missing_ok=True)

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


# ------------------------------------------------------------- detached: up / down


def _read_state(state_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((Path(state_dir) / STATE_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return None


def _running(state: dict[str, Any]) -> dict[str, int]:
    return {
        name: pid for name, pid in state["pids"].items() if is_running(pid, state["binaries"][name])
    }


def _node_running(state_dir: Path) -> bool:
    state = node.read_state(state_dir)
    if state is None:
        return True  # a cluster started without a node
    return all(is_running(pid, state["binaries"][n]) for n, pid in state["pids"].items())


def restart(
    state_dir: Path, name: str, down_s: float = 0.0, grace_s: float = 30.0
) -> tuple[int, int]:
    """Stop one component of the running cluster of STATE (SIGTERM to its process alone: a
    container runtime's shims and containers stay; SIGKILL after `grace_s`), keep it down
    `down_s` seconds, and start it again as it ran (same command line, folder and log);
    (old pid, new pid). For the day-2 drills: an API server, a kubelet or containerd that
    restarts under load."""
    state_dir = Path(state_dir).resolve()
    for state_file in (state_dir / STATE_FILE, state_dir / node.STATE_FILE):
        state = json.loads(state_file.read_text()) if state_file.exists() else {}
        if name in state.get("pids", {}):
            break
    else:
        raise ClusterError(f"the cluster of {state_dir} has no component {name}")
    pid, binary = state["pids"][name], state["binaries"][name]
    if not is_running(pid, binary):
        raise ClusterError(f"{name} (pid {pid}) is not running")
    command = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").decode().split("\0")
    folder = os.readlink(f"/proc/{pid}/cwd")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while is_running(pid, binary):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    time.sleep(down_s)
    with open(state_dir / "logs" / f"{name}.log", "ab") as log:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=folder,
            start_new_session=True,
        )
    state["pids"][name] = process.pid
    partial = state_file.with_name(f".{state_file.name}.partial")
    partial.write_text(json.dumps(state, indent=2) + "\n")
    os.replace(partial, state_file)
    return pid, process.pid


def up(
    state_dir: Path = Path(".cluster"),
    tools_dir: Path = Path(".tools"),
    progress: Callable[[str], Any] = print,
    with_node: bool = True,
) -> dict[str, Any]:
    """Build if needed, then start a control plane and (`with_node`) a node (hack.node) that
    outlive this process; return cluster.json. When one is up already, say so and return its
    state. What a crashed run left is removed first."""
    state = _read_state(state_dir)
    if state is not None:
        if len(_running(state)) == len(CONTROL_PLANE) and _node_running(state_dir):
            progress(f"cluster already up at {state['server']} (kubeconfig {state['kubeconfig']})")
            return state
        down(state_dir, progress=lambda _line: None)  # a half-dead one: clear it first
    build(tools_dir, progress)
    # The kubelet registers its node tainted not-ready; node-lifecycle-controller lifts the
    # taint once the node is Ready (a repeated --controllers adds to the list).
    extra = {"kube-controller-manager": ["--controllers=node-lifecycle-controller"]}
    address = node.node_ip() if with_node else None
    plane = ControlPlane(
        state_dir,
        tools_dir,
        detach=True,
        progress=progress,
        extra_args=extra if with_node else {},
        advertise_address=address,
    )
    plane.start()
    if with_node:
        try:
            node.start_node(state_dir, tools_dir, plane.server, progress)
            dns.deploy(state_dir, tools_dir, plane.server, address, progress)
            netpol.start(state_dir, tools_dir, plane.server, progress)
        except BaseException:
            node.stop_node(state_dir, progress=lambda _line: None)
            plane.stop()
            raise
    progress(f"cluster up: kubectl --kubeconfig {plane.kubeconfig} get nodes")
    return _read_state(state_dir) or {}


def down(state_dir: Path = Path(".cluster"), progress: Callable[[str], Any] = print) -> None:
    """Stop the components recorded in STATE/cluster.json, verify that none remains, and
    remove the state. When no cluster is up, say so."""
    state_dir = Path(state_dir)
    # The node first, and always: a run that crashed before cluster.json was written may
    # have left a node's processes, mounts, namespaces or chains.
    node.stop_node(state_dir, progress)
    state = _read_state(state_dir)
    if state is None:
        progress(f"no cluster up in {state_dir}")
        return
    stopped = _stop_components(state["pids"], state["binaries"], grace_s=5.0)
    _remove_state(state_dir, Path(state["kubeconfig"]))
    with contextlib.suppress(OSError):
        state_dir.rmdir()  # only when nothing of anyone else's is left in it
    if stopped:
        progress(f"cluster down: stopped {', '.join(f'{n} (pid {p})' for n, p in stopped.items())}")
    else:
        progress(f"cluster down: nothing was running any more; removed its state in {state_dir}")


def status(state_dir: Path = Path(".cluster"), progress: Callable[[str], Any] = print) -> bool:
    """Print each component's state; True when all run and /readyz is ok."""
    state = _read_state(state_dir)
    if state is None:
        progress(f"no cluster up in {state_dir}")
        return False
    running = _running(state)
    for name, pid in state["pids"].items():
        progress(f"{name}: pid {pid} {'running' if name in running else 'NOT running'}")
    node_state = node.read_state(state_dir) or {"pids": {}, "binaries": {}}
    for name, pid in node_state["pids"].items():
        alive = is_running(pid, node_state["binaries"][name])
        progress(f"{name}: pid {pid} {'running' if alive else 'NOT running'}")
    plane = ControlPlane(state_dir)
    plane.ports = state["ports"]
    readyz = plane.get("/readyz")
    answer = readyz[1] if readyz[0] == 200 else f"HTTP {readyz[0]}: {readyz[1].strip()[:200]}"
    progress(f"{state['server']}/readyz: {answer if readyz[0] else 'unreachable'}")
    progress(f"kubeconfig: {state['kubeconfig']}")
    return len(running) == len(CONTROL_PLANE) and _node_running(state_dir) and readyz == (200, "ok")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hack.cluster", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("command", choices=("build", "up", "down", "status"))
    parser.add_argument("--state-dir", type=Path, default=Path(".cluster"))
    parser.add_argument("--tools-dir", type=Path, default=Path(".tools"))
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            for path in build(args.tools_dir).values():
                print(path)
        elif args.command == "up":
            up(args.state_dir, args.tools_dir)
        elif args.command == "down":
            down(args.state_dir)
        else:
            return 0 if status(args.state_dir) else 1
    except (ClusterError, node.NodeError, registry.RegistryError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
