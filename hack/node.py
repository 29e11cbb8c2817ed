"""A real Kubernetes node beside the local control plane (hack.cluster).

kubelet, kube-proxy and kube-scheduler come from the control plane's Go module; the container
runtime is Debian's containerd with Debian's runc and CNI plugins; the local registry
(hack.registry) starts and stops with the node, and hack.dns deploys CoreDNS on it. Everything the node keeps
lives under STATE/node (containerd's root, state and socket, the kubelet's root, pod logs, the
CNI configuration and its address leases), plus what the kernel keeps machine-wide: the bridge
BRIDGE, the pods' network namespaces, kube-proxy's and the kubelet's iptables chains.
`stop_node` removes all of it, also after a crash (`up` calls it first).

Facts that shaped it (each met on these machines):
- lowering `oom_score_adj` is denied here, so runc fails every sandbox ("can't get final
  child's PID from pipe: EOF") unless the CRI plugin sets `restrict_oom_score_adj`;
- `kubectl logs/exec` go from the API server to the kubelet at the node's InternalIP: the
  kubelet serves on an address the API server reaches, with a certificate of the cluster's
  CA, and authorizes the API server's client certificate through the webhook;
- the kubelet's KUBE-FIREWALL / KUBE-KUBELET-CANARY chains outlive it, and KUBE-FIREWALL drops
  traffic to 127.0.0.0/8 from other sources: they are removed on the way down;
- no registry is reachable: the pause image is built from Kubernetes' own pause.c (in the Go
  module cache) as a `FROM scratch` OCI image with buildah, and imported into containerd.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hack import images, kubernetes_build, registry
from hack.pki import AdminClient, new_cert, write_kubeconfig
from hack.processes import last_meaningful_line, stop_pids
from tritonscale.local.ports import LOOPBACK, free_ports

NODE_NAME = "tritonscale-node"
# Names and addresses of our own, apart from the usual CNI defaults (cni0, 10.244.0.0/16).
BRIDGE = "tscni0"
CNI_NETWORK = "tritonscale-node"
POD_SUBNET = "10.88.0.0/24"
POD_GATEWAY = "10.88.0.1"
CLUSTER_DOMAIN = "cluster.local"
# The API server's Service addresses (hack.cluster's --service-cluster-ip-range).
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
SERVICE_CLUSTER_IP = "10.0.0.1"  # the `kubernetes` Service: first address of the range
# The kube-dns Service (hack.dns): in the service range, .10 as kubeadm picks.
CLUSTER_DNS_IP = "10.0.0.10"
CNI_BIN_DIR = Path("/usr/lib/cni")
PAUSE_IMAGE = "tritonscale.local/pause:3.10.1"
COMPONENTS = ("containerd", "kube-scheduler", "kube-proxy", "kubelet")
STATE_FILE = "node.json"
IPTABLES_TABLES = ("filter", "nat", "mangle")
# The shims' sockets sit here whatever containerd's own state folder is (containerd 1.6).
SHIM_SOCKET_DIR = Path("/run/containerd/s")
# The kubelet links every container's log here; the folder is not configurable.
CONTAINER_LOG_LINKS = Path("/var/log/containers")
CNI_CACHE = Path("/var/lib/cni/results")
# Debian's packages the node runs, by the program that must be on PATH.
PROGRAMS = {
    "containerd": "containerd",
    "ctr": "containerd",
    "runc": "runc",
    "iptables": "iptables",
    "ip": "iproute2",
    "conntrack": "conntrack",
    "buildah": "buildah",
    "gcc": "gcc",
    "ipset": "ipset",  # kube-router's NetworkPolicy (hack.netpol)
}
READY_TIMEOUT_S = 120.0


class NodeError(RuntimeError):
    """The node could not be started or removed; one line for a person."""


def _run(*command: str, timeout_s: float = 60.0, check: bool = True) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise NodeError(f"`{' '.join(command)}` did not finish in {timeout_s:.0f} s") from None
    if check and done.returncode != 0:
        raise NodeError(f"`{' '.join(command)}` failed: {(done.stderr or done.stdout).strip()}")
    return done.stdout


def require_programs() -> None:
    missing = [
        f"{name} ({package})" for name, package in PROGRAMS.items() if not shutil.which(name)
    ]
    if not (CNI_BIN_DIR / "bridge").is_file():
        missing.append(f"{CNI_BIN_DIR}/bridge (containernetworking-plugins)")
    if missing:
        raise NodeError(f"the node needs {', '.join(missing)}: `make debian` installs them")


def node_ip() -> str:
    """The machine's address on its default route: the kubelet refuses a loopback node IP,
    and the API server reaches the kubelet there."""
    routes = json.loads(_run("ip", "-j", "route", "get", "192.0.2.255"))
    if not routes or "prefsrc" not in routes[0]:
        raise NodeError("no address on a default route for the kubelet's --node-ip")
    return routes[0]["prefsrc"]


# ------------------------------------------------------------------------ images


def build_scratch_image(
    archive: Path,
    reference: str,
    files: dict[str, Path],
    entrypoint: list[str],
    user: str = "65532:65532",
) -> Path:
    """A `FROM scratch` OCI image of `files` (path in the image -> file here), written to
    `archive` (oci-archive) by buildah, with no daemon and storage of its own that is
    thrown away."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    with images.throwaway_buildah(lambda line: NodeError(f"{reference}: {line}")) as run:
        container = run("from", "scratch")
        for destination, source in files.items():
            run("copy", "--chmod=0755", container, str(source), destination)
        run("config", f"--entrypoint={json.dumps(entrypoint)}", f"--user={user}", container)
        partial = archive.with_name(f".{archive.name}.partial")
        run("commit", "--quiet", container, f"oci-archive:{partial}:{reference}")
        run("rm", container)
        os.replace(partial, archive)
    return archive


def pause_image(tools_dir: Path) -> Path:
    """The pause image as an OCI archive in TOOLS/images, built once from the pause.c of the
    k8s.io/kubernetes module that hack/controlplane requires."""
    version = kubernetes_build.kubernetes_version()
    archive = Path(tools_dir).resolve() / "images" / f"pause-{version}.tar"
    if archive.is_file():
        return archive
    source = Path(_module_dir()) / "build" / "pause" / "linux" / "pause.c"
    with tempfile.TemporaryDirectory(prefix="tritonscale-pause-") as scratch:
        binary = Path(scratch) / "pause"
        # The flags of build/pause/Makefile: static, nothing to load at run time.
        _run("gcc", "-Os", "-Wall", "-Werror", "-static",
             f"-DVERSION=v3.10.1-{version}", "-o", str(binary), str(source))  # fmt: skip
        return build_scratch_image(
            archive, PAUSE_IMAGE, {"/pause": binary}, ["/pause"], user="65535:65535"
        )


def _module_dir() -> str:
    """Where Go keeps k8s.io/kubernetes's sources (downloaded by the build)."""
    done = subprocess.run(
        ["go", "list", "-mod=mod", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes"],
        cwd=kubernetes_build.GO_MODULE_DIR,
        env=dict(os.environ, GOWORK="off", GOFLAGS="-mod=mod"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0 or not done.stdout.strip():
        raise NodeError(f"go list k8s.io/kubernetes failed: {done.stderr.strip()}")
    return done.stdout.strip()


def import_image(state_dir: Path, archive: Path) -> None:
    """Import an OCI archive into the node's containerd, for the kubelet (namespace k8s.io),
    unpacked for the snapshotter the kubelet's containers use."""
    paths = _paths(Path(state_dir).resolve())
    address, snapshotter = paths["socket"], snapshotter_for(paths["containerd"])
    _run("ctr", f"--address={address}", "-n", "k8s.io", "images", "import",
         f"--snapshotter={snapshotter}", str(archive),
         timeout_s=120)  # fmt: skip


# ------------------------------------------------------------------ configuration


def _paths(state_dir: Path) -> dict[str, Path]:
    node = state_dir / "node"
    return {
        "node": node,
        "containerd": node / "containerd",
        "socket": node / "containerd" / "containerd.sock",
        "kubelet": node / "kubelet",
        "pod-logs": node / "pod-logs",
        "cni-conf": node / "cni" / "net.d",
        "cni-ipam": node / "cni" / "ipam",
        "config": node / "config",
        "registry": node / "registry",
        "certs.d": node / "containerd" / "certs.d",
        "logs": state_dir / "logs",
    }


def filesystem_type(folder: Path, mountinfo: str | None = None) -> str:
    """The type of the filesystem `folder` (existing or not) is on, from the mount table."""
    if mountinfo is None:
        mountinfo = Path("/proc/self/mountinfo").read_text()
    best, kind = "", ""
    for line in mountinfo.splitlines():
        fields, _, rest = line.partition(" - ")
        point = fields.split()[4].encode().decode("unicode_escape")
        inside = str(folder) == point or str(folder).startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, rest.split()[0]
    return kind


def snapshotter_for(folder: Path) -> str:
    """overlayfs, unless containerd's root is itself on overlayfs (a container's root, as in
    CI), where the kernel refuses an overlay upper layer: then the copying `native`."""
    return "native" if filesystem_type(Path(folder).resolve()) == "overlay" else "overlayfs"


def _containerd_config(paths: dict[str, Path]) -> str:
    root = paths["containerd"]
    return f"""\
version = 2
root = "{root / "root"}"
state = "{root / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "{paths["socket"]}"

[ttrpc]
  address = "{root / "containerd.sock.ttrpc"}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{root / "opt"}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # This machine denies lowering oom_score_adj: without this runc fails every sandbox.
  restrict_oom_score_adj = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "{snapshotter_for(paths["containerd"])}"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        # runc's state beside ours, not in the machine-wide /run/containerd/runc.
        Root = "{root / "runc"}"
  [plugins."io.containerd.grpc.v1.cri".registry]
    # hosts.toml per registry: the local one (hack.registry) is plain HTTP on loopback.
    config_path = "{paths["certs.d"]}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{paths["cni-conf"]}"
"""


def _cni_config(paths: dict[str, Path]) -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0",
        "name": CNI_NETWORK,
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                # Pods talk to each other and to this machine; nothing leaves it, so no
                # masquerading (which would add chains of the plugin's own).
                "ipMasq": False,
                # A pod reaching itself through a Service comes back over the same port.
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET, "gateway": POD_GATEWAY}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(paths["cni-ipam"]),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def _kubelet_config(paths: dict[str, Path], pki: Path, address: str, ports: dict[str, int]) -> dict:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": address,
        "port": ports["kubelet"],
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": ports["kubelet-healthz"],
        "tlsCertFile": str(pki / "kubelet-serving.crt"),
        "tlsPrivateKeyFile": str(pki / "kubelet-serving.key"),
        # The API server's client certificate is checked against the cluster's CA and each
        # request authorized by a SubjectAccessReview: `kubectl logs/exec` work, strangers not.
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(pki / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{paths['socket']}",
        # cgroup v1 and no systemd: cgroupfs, no QoS hierarchy, nothing to enforce.
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "failSwapOn": False,
        "clusterDomain": CLUSTER_DOMAIN,
        "clusterDNS": [CLUSTER_DNS_IP],
        "podLogsDir": str(paths["pod-logs"]),
        "volumePluginDir": str(paths["node"] / "volume-plugins"),
        # A shared development disk is often fuller than eviction's defaults allow, and image
        # garbage collection would delete the imported images, which no registry can restore.
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "registerNode": True,
    }


def _kube_proxy_config(kubeconfig: Path, ports: dict[str, int]) -> dict:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": NODE_NAME,
        "clusterCIDR": POD_SUBNET,
        "bindAddress": "127.0.0.1",
        "healthzBindAddress": f"127.0.0.1:{ports['kube-proxy-healthz']}",
        "metricsBindAddress": f"127.0.0.1:{ports['kube-proxy-metrics']}",
        # NodePorts on 127.0.0.1 would need route_localnet=1 machine-wide: not wanted here.
        "iptables": {"localhostNodePorts": False},
        # Leave the machine's conntrack table sizes alone.
        "conntrack": {"maxPerCore": 0, "min": 0},
    }


def _make_certificates(pki: Path, address: str) -> None:
    client = "clientAuth"
    # The Node authorizer and NodeRestriction know a kubelet by this name and group.
    new_cert(pki, "kubelet", f"system:node:{NODE_NAME}", ca="ca", org="system:nodes",
             usage=client)  # fmt: skip
    new_cert(pki, "kubelet-serving", NODE_NAME, ca="ca", usage="serverAuth",
             sans=f"IP:{address}, DNS:{NODE_NAME}")  # fmt: skip
    # The default RBAC policy binds these users to the roles their components need.
    new_cert(pki, "kube-scheduler", "system:kube-scheduler", ca="ca", usage=client)
    new_cert(pki, "kube-proxy", "system:kube-proxy", ca="ca", usage=client)


# ------------------------------------------------------------------------- start


def start_node(
    state_dir: Path,
    tools_dir: Path,
    server: str,
    progress: Callable[[str], Any] = print,
    timeout_s: float = READY_TIMEOUT_S,
) -> dict[str, Any]:
    """Start the registry, containerd, kube-scheduler, kube-proxy and the kubelet against
    `server` (the control plane of STATE), detached; return STATE/node.json once the node is
    Ready and kube-proxy has synced."""
    if os.geteuid() != 0:
        raise NodeError("the node needs root (containerd, iptables, network namespaces)")
    require_programs()
    state_dir = Path(state_dir).resolve()
    paths = _paths(state_dir)
    pki = state_dir / "pki"
    binaries = kubernetes_build.binaries(tools_dir)
    missing = [name for name in COMPONENTS[1:] if not binaries[name].is_file()]
    if not registry.binary(tools_dir).is_file():
        missing.append("registry")
    if missing:
        raise NodeError(f"{', '.join(missing)} not built: run `python -m hack.cluster build`")
    others = other_kubelets(state_dir)
    if others:
        raise NodeError(
            f"another node runs on this machine (kubelet pid {others[0]}): one node at a time; "
            "`make cluster-down` in the checkout that started it stops it"
        )
    stop_node(state_dir, progress=lambda _line: None)  # whatever a crashed run left
    started = time.monotonic()
    pause = pause_image(tools_dir)
    address = node_ip()
    for name in ("containerd", "kubelet", "pod-logs", "cni-conf", "cni-ipam", "config", "logs"):
        paths[name].mkdir(parents=True, exist_ok=True)
    _make_certificates(pki, address)
    for user in ("kubelet", "kube-scheduler", "kube-proxy"):
        write_kubeconfig(paths["config"] / f"{user}.kubeconfig", server, pki, user)
    roles = (
        "kubelet",
        "kubelet-healthz",
        "kube-proxy-healthz",
        "kube-proxy-metrics",
        "kube-scheduler",
        "registry",
        "registry-debug",
    )
    hosts = [address] + [LOOPBACK] * (len(roles) - 1)
    ports = dict(zip(roles, free_ports(len(roles), hosts), strict=True))
    config = paths["config"]
    (config / "containerd.toml").write_text(_containerd_config(paths))
    (paths["cni-conf"] / "10-tritonscale.conflist").write_text(
        json.dumps(_cni_config(paths), indent=2) + "\n"
    )
    # JSON is YAML: the components read these as their config files.
    (config / "kubelet.yaml").write_text(
        json.dumps(_kubelet_config(paths, pki, address, ports), indent=2) + "\n"
    )
    (config / "kube-proxy.yaml").write_text(
        json.dumps(_kube_proxy_config(config / "kube-proxy.kubeconfig", ports), indent=2) + "\n"
    )
    hosts = paths["certs.d"] / f"127.0.0.1:{ports['registry']}" / "hosts.toml"
    hosts.parent.mkdir(parents=True, exist_ok=True)
    hosts.write_text(registry.containerd_hosts(ports["registry"]))
    registry_config = registry.write_config(
        paths["registry"], ports["registry"], ports["registry-debug"]
    )
    ip_forward = Path("/proc/sys/net/ipv4/ip_forward")
    state: dict[str, Any] = {
        "node": NODE_NAME,
        "node_ip": address,
        "ports": ports,
        "containerd_address": str(paths["socket"]),
        "registry": f"127.0.0.1:{ports['registry']}",
        "ip_forward_before": ip_forward.read_text().strip(),
        "pids": {},
        "binaries": {},
    }
    processes: dict[str, subprocess.Popen[bytes]] = {}

    def start(name: str, command: list[str]) -> None:
        processes[name] = spawn(state_dir, name, command)
        state.update(read_state(state_dir) or {})  # spawn recorded its pid there

    def wait(what: str, ready: Callable[[], bool]) -> None:
        deadline = started + timeout_s
        while not ready():
            for name, process in processes.items():
                if process.poll() is not None:
                    log = paths["logs"] / f"{name}.log"
                    raise NodeError(
                        f"{name} exited during start (code {process.returncode}): "
                        f"{last_meaningful_line(log)} (log: {log})"
                    )
            if time.monotonic() > deadline:
                raise NodeError(
                    f"timed out after {timeout_s:.0f} s waiting for {what} (logs: {paths['logs']})"
                )
            time.sleep(0.3)

    try:
        _write_state(state_dir, state)  # from here on, `down` cleans up whatever happens
        # Service cluster IPs are forwarded to pods on the bridge: routing must be on.
        ip_forward.write_text("1\n")
        _guard_service_range()
        start("registry", [str(registry.binary(tools_dir)), "serve", str(registry_config)])
        wait("the registry", lambda: registry.answers(state["registry"]))
        containerd = shutil.which("containerd") or "containerd"
        start("containerd", [containerd, f"--config={config / 'containerd.toml'}"])
        wait("containerd's socket", lambda: ctr_answers(paths["socket"]))
        import_image(state_dir, pause)
        start(
            "kube-scheduler",
            [
                str(binaries["kube-scheduler"]),
                f"--kubeconfig={config / 'kube-scheduler.kubeconfig'}",
                f"--authentication-kubeconfig={config / 'kube-scheduler.kubeconfig'}",
                f"--authorization-kubeconfig={config / 'kube-scheduler.kubeconfig'}",
                "--bind-address=127.0.0.1",
                f"--secure-port={ports['kube-scheduler']}",
                "--leader-elect=false",
                "--profiling=false",
            ],
        )
        start(
            "kube-proxy",
            [str(binaries["kube-proxy"]), f"--config={config / 'kube-proxy.yaml'}"],
        )
        start(
            "kubelet",
            [
                str(binaries["kubelet"]),
                f"--config={config / 'kubelet.yaml'}",
                f"--kubeconfig={config / 'kubelet.kubeconfig'}",
                f"--root-dir={paths['kubelet']}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={address}",
            ],
        )
        admin = AdminClient(server, pki)
        wait(f"node {NODE_NAME} Ready", lambda: _node_ready(admin))
        wait(
            "kube-proxy's first sync (healthz)",
            lambda: http_ok(f"http://127.0.0.1:{ports['kube-proxy-healthz']}/healthz"),
        )
    except BaseException:
        stop_node(state_dir, progress=lambda _line: None)
        raise
    progress(
        f"node {NODE_NAME} Ready in {time.monotonic() - started:.1f} s "
        f"(kubelet at {address}:{ports['kubelet']}, containerd {_containerd_version()}, "
        f"pods on {BRIDGE} {POD_SUBNET}, registry {state['registry']})"
    )
    return state


def spawn(state_dir: Path, name: str, command: list[str]) -> subprocess.Popen[bytes]:
    """Start a component of the node of STATE, detached, its output in STATE/node/logs, its
    pid in node.json (so that `stop_node` stops it)."""
    paths = _paths(Path(state_dir).resolve())
    with open(paths["logs"] / f"{name}.log", "ab") as log:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=paths["node"],
            start_new_session=True,
        )
    state = read_state(state_dir) or {"pids": {}, "binaries": {}}
    state["pids"][name] = process.pid
    state["binaries"][name] = command[0]
    _write_state(state_dir, state)
    return process


# A rule of the routing policy database, ours by its priority.
SERVICE_RULE_PRIORITY = "1000"


def _service_rule() -> list[str]:
    return ["iif", BRIDGE, "to", SERVICE_CLUSTER_IP_RANGE,
            "priority", SERVICE_RULE_PRIORITY, "unreachable"]  # fmt: skip


def _guard_service_range() -> None:
    """A pod's packet to a Service address that kube-proxy did not translate (no ready
    endpoint) is unreachable at once, and never leaves the machine by its default route.

    kube-proxy rejects such packets in FORWARD, but kube-router's policy chains come first
    there and accept whatever the policies allow: the SYN would be routed on, unanswered,
    and its retries keep the untranslated conntrack entry for minutes (a Locust worker that
    started before its master waited two minutes). Translated packets are routed to the
    pod's address and never meet the rule.
    """
    _run("ip", "rule", "del", *_service_rule(), check=False)  # what a crashed run left
    _run("ip", "rule", "add", *_service_rule())


def _write_state(state_dir: Path, state: dict[str, Any]) -> None:
    partial = state_dir / f".{STATE_FILE}.partial"
    partial.write_text(json.dumps(state, indent=2) + "\n")
    os.replace(partial, state_dir / STATE_FILE)


def read_state(state_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((Path(state_dir) / STATE_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return None


def task_pid(state_dir: Path, container_id: str) -> int:
    """The host's pid of a running container's first process, as containerd knows it."""
    socket = (read_state(state_dir) or {}).get("containerd_address")
    if not socket:
        raise NodeError(f"no node runs in {state_dir}")
    tasks = _run("ctr", "--address", socket, "--namespace", "k8s.io", "tasks", "list")
    for line in tasks.splitlines()[1:]:
        task, pid, *_ = line.split()
        if task == container_id:
            return int(pid)
    raise NodeError(f"containerd runs no task {container_id}")


def ctr_answers(socket: Path) -> bool:
    if not socket.exists():
        return False
    done = subprocess.run(
        ["ctr", f"--address={socket}", "version"], capture_output=True, timeout=10
    )
    return done.returncode == 0


def _containerd_version() -> str:
    output = _run("containerd", "--version", check=False).split()
    return output[2] if len(output) > 2 else "?"


def _node_ready(admin: AdminClient) -> bool:
    code, body = admin.get(f"/api/v1/nodes/{NODE_NAME}")
    if code != 200:
        return False
    conditions = json.loads(body).get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def http_ok(url: str) -> bool:
    """Whether a GET of `url` answers 200 within 2 s."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


# -------------------------------------------------------------------------- stop


def _pids_by_parent() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    return children


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def other_kubelets(state_dir: Path) -> list[int]:
    """Running kubelets whose configuration is not under STATE: another node on this machine
    (bridge, iptables chains and /var/log/containers are machine-wide: one node at a time)."""
    ours = str(Path(state_dir).resolve() / "node")
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            command = _cmdline(int(entry.name))
            if (
                command
                and Path(command[0]).name == "kubelet"
                and not any(ours in argument for argument in command)
            ):
                pids.append(int(entry.name))
    return pids


def shim_pids(socket: Path) -> list[int]:
    """Our containerd's shims: they name its socket in their command line."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            command = _cmdline(int(entry.name))
            if command and "containerd-shim" in command[0] and str(socket) in command:
                pids.append(int(entry.name))
    return pids


def _kill_shims_and_containers(socket: Path) -> int:
    """SIGKILL every shim of our containerd and every process below it (the containers):
    what `down` does not stop through the kubelet must not run on. Return how many died."""
    children = _pids_by_parent()
    doomed: list[int] = []
    todo = shim_pids(socket)
    while todo:
        pid = todo.pop()
        doomed.append(pid)
        todo.extend(children.get(pid, []))
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() and _state(pid) not in "ZX" for pid in doomed):
        if time.monotonic() > deadline:
            raise NodeError(f"containers of {socket} still run 10 s after SIGKILL")
        time.sleep(0.1)
    return len(doomed)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "X"


def _our_netns() -> list[str]:
    """The network namespaces whose veth is a port of our bridge (containerd names them
    cni-UUID, and other people's namespaces share /run/netns)."""
    links = json.loads(_run("ip", "-j", "link", "show", "master", BRIDGE, check=False) or "[]")
    ids = {link["link_netnsid"] for link in links if "link_netnsid" in link}
    names = []
    for entry in json.loads(_run("ip", "-j", "netns", "list", check=False) or "[]"):
        if entry.get("id") in ids:
            names.append(entry["name"])
    return names


def _unmount_below(folder: Path) -> int:
    """Detach every mount at or below `folder`, deepest first (pods' tmpfs volumes, the
    sandboxes' /dev/shm, the containers' overlay roots)."""
    libc = ctypes.CDLL(None, use_errno=True)
    mnt_detach = 2
    prefix = str(folder)
    count = 0
    for _attempt in range(3):  # a detached mount can uncover another below it
        points = []
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            # Field 5 is the mount point, with spaces and such escaped as \\040 etc.
            point = line.split()[4].encode().decode("unicode_escape")
            if point == prefix or point.startswith(prefix + "/"):
                points.append(point)
        if not points:
            break
        for point in sorted(points, key=len, reverse=True):
            if libc.umount2(point.encode(), mnt_detach) == 0:
                count += 1
    return count


def _kube_tables() -> Iterator[tuple[str, str, str, list[str]]]:
    """(tool, table, iptables-save's dump of it, its KUBE-* chains) for every iptables table,
    IPv4 and IPv6, that holds such a chain; each dump is taken when its turn comes."""
    for tool in ("iptables", "ip6tables"):
        if not shutil.which(f"{tool}-save"):
            continue
        for table in IPTABLES_TABLES:
            dump = _run(f"{tool}-save", "-t", table, check=False)
            chains = re.findall(r"^:(KUBE-\S+)", dump, re.MULTILINE)
            if chains:
                yield tool, table, dump, chains


def kube_chains() -> dict[str, list[str]]:
    """KUBE-* chains in each iptables table, IPv4 and IPv6 ("ip6tables:nat" keys for v6)."""
    return {f"{tool}:{table}": chains for tool, table, _, chains in _kube_tables()}


def _remove_kube_chains() -> None:
    """kube-proxy's and the kubelet's chains: first every rule that jumps to one (from the
    built-in chains too), then the chains themselves."""
    for tool, table, dump, chains in _kube_tables():
        for chain, spec in re.findall(r"^-A (\S+) (.*-j KUBE-\S+.*)$", dump, re.MULTILINE):
            if not chain.startswith("KUBE-"):
                # iptables-save quotes comments as a shell does: shlex splits them back.
                _run(tool, "-w", "-t", table, "-D", chain, *shlex.split(spec), check=False)
        for chain in chains:
            _run(tool, "-w", "-t", table, "-F", chain, check=False)
        for chain in chains:
            _run(tool, "-w", "-t", table, "-X", chain, check=False)


def kube_ipsets() -> list[str]:
    """The ipsets kube-router's policy controller makes (KUBE-*, kube-router-*)."""
    if not shutil.which("ipset"):
        return []
    names = _run("ipset", "list", "-n", check=False).split()
    return [name for name in names if name.startswith(("KUBE-", "kube-router-"))]


def _remove_kube_ipsets() -> None:
    """After the chains: an ipset a rule still refers to cannot be destroyed."""
    for name in kube_ipsets():
        _run("ipset", "destroy", name, check=False)


def _shim_socket(address: Path, container_id: str) -> Path:
    """Where containerd 1.6 puts a shim's socket: /run/containerd/s/sha256(ADDRESS/NS/ID)."""
    digest = hashlib.sha256(f"{address}/k8s.io/{container_id}".encode()).hexdigest()
    return SHIM_SOCKET_DIR / digest


def _remove_cgroups(container_ids: list[str]) -> None:
    """With no cgroup parent (cgroupsPerQOS off), containerd puts each container in
    CONTROLLER/k8s.io/ID (cgroup v1) or k8s.io/ID (v2). rmdir removes only empty groups, so a
    k8s.io that another containerd still uses stays."""
    root = Path("/sys/fs/cgroup")
    for group in [root / "k8s.io", *(c / "k8s.io" for c in root.iterdir() if c.is_dir())]:
        for folder in [*(group / name for name in container_ids), group]:
            with contextlib.suppress(OSError):
                folder.rmdir()


def stop_node(state_dir: Path, progress: Callable[[str], Any] = print) -> dict[str, int]:
    """Stop the node of STATE and remove everything it made; return the components that
    were running. Safe to call when nothing runs, and after a crash."""
    state_dir = Path(state_dir).resolve()
    paths = _paths(state_dir)
    state = read_state(state_dir)
    if state is None and not paths["node"].exists():
        # No node was started here (node.json is written before anything else): the
        # machine-wide chains and the bridge may be someone else's.
        return {}
    state = state or {"pids": {}, "binaries": {}}
    # The kubelet first, so that it restarts nothing while the rest goes.
    stopped = stop_pids(
        {n: p for n, p in state["pids"].items() if n != "containerd"},
        state["binaries"],
        grace_s=5.0,
    )
    socket = paths["socket"]
    container_ids = [
        entry.name
        for entry in (
            paths["containerd"] / "state" / "io.containerd.runtime.v2.task" / "k8s.io"
        ).glob("*")
    ]
    killed = _kill_shims_and_containers(socket)
    stopped.update(
        stop_pids(
            {n: p for n, p in state["pids"].items() if n == "containerd"},
            state["binaries"],
            grace_s=5.0,
        )
    )
    for container_id in container_ids:
        _shim_socket(socket, container_id).unlink(missing_ok=True)
    _remove_cgroups(container_ids)
    namespaces = _our_netns()
    for name in namespaces:
        _run("ip", "netns", "delete", name, check=False)
    unmounted = _unmount_below(paths["node"])
    _remove_kube_chains()
    _remove_kube_ipsets()
    _run("ip", "rule", "del", *_service_rule(), check=False)
    _run("ip", "link", "delete", BRIDGE, check=False)
    if CONTAINER_LOG_LINKS.is_dir():
        for link in CONTAINER_LOG_LINKS.iterdir():
            if link.is_symlink() and os.readlink(link).startswith(str(paths["pod-logs"])):
                link.unlink()
    if CNI_CACHE.is_dir():
        for entry in CNI_CACHE.glob(f"{CNI_NETWORK}-*"):
            entry.unlink(missing_ok=True)
    if state.get("ip_forward_before") == "0":
        Path("/proc/sys/net/ipv4/ip_forward").write_text("0\n")
    shutil.rmtree(paths["node"], ignore_errors=True)
    if paths["node"].exists():
        raise NodeError(f"could not remove {paths['node']} (a mount still busy?)")
    for name in ("kubelet", "kubelet-serving", "kube-scheduler", "kube-proxy", "kube-router"):
        for suffix in ("crt", "key", "cnf"):
            (state_dir / "pki" / f"{name}.{suffix}").unlink(missing_ok=True)
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    if stopped or killed or namespaces or unmounted:
        progress(
            f"node down: stopped {', '.join(stopped) or 'no component'}, "
            f"{killed} container processes, {len(namespaces)} pod networks, "
            f"{unmounted} mounts"
        )
    return stopped
