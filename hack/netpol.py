"""NetworkPolicy for the local cluster: kube-router's network policy controller, on the node.

SIG Network's kube-network-policies judges new connections in an nfqueue, which needs the
kernel's nftables `queue` expression (CONFIG_NFT_QUEUE); the kernel of our machines has
none ("No such file or directory" from netlink on every rule sync). kube-router's firewall
(github.com/cloudnativelabs/kube-router, its policy controller alone: no routing, no service
proxy) enforces NetworkPolicy with iptables and ipset, which the kernel has: per pod a
KUBE-POD-FW-* chain that jumps to a KUBE-NWPLCY-* chain per policy selecting it, with ipsets
of the peers each policy admits; whatever no policy admits is dropped.

`build` installs kube-router at VERSION (its own go.mod and go.sum, checked against the
checksum database) into TOOLS/kube-router-vX.Y.Z/bin. `start` runs it on the node as the
kubelet and kube-proxy run (a process of the machine, iptables and ipset there), as the user
system:kube-router with a ClusterRole that lists and watches what its informers read; its pid
joins node.json, so `hack.node.stop_node` stops it, and its chains (KUBE-*) and ipsets go
with the node's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hack import dns, node
from hack.gotools import go_install
from hack.pki import AdminClient, new_cert, write_kubeconfig
from tritonscale.local.ports import free_port

VERSION = "v2.1.0"
PACKAGE = "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router"
NAME = "kube-router"
USER = "system:kube-router"
READY_TIMEOUT_S = 60.0


def binary(tools_dir: Path) -> Path:
    return Path(tools_dir).resolve() / f"{NAME}-{VERSION}" / "bin" / NAME


def build(tools_dir: Path, progress: Callable[[str], Any] = print) -> Path:
    """kube-router into TOOLS/kube-router-vX.Y.Z/bin, or at once when it is there."""
    return go_install(f"{PACKAGE}@{VERSION}", binary(tools_dir), progress)


def rbac() -> list[dict[str, Any]]:
    """What kube-router's informers read (it starts them all, whichever controller runs)."""
    read = ["get", "list", "watch"]
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": NAME},
            "rules": [
                {"apiGroups": [""], "resources": ["pods", "namespaces", "nodes", "services",
                                                  "endpoints"], "verbs": read},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                 "verbs": read},
                {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"],
                 "verbs": read},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": NAME},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": NAME},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                          "name": USER}],
        },
    ]  # fmt: skip


def command(tools_dir: Path, kubeconfig: Path, health_port: int) -> list[str]:
    return [
        str(binary(tools_dir)),
        f"--kubeconfig={kubeconfig}",
        f"--hostname-override={node.NODE_NAME}",
        "--run-firewall=true",
        "--run-router=false",
        "--run-service-proxy=false",
        f"--service-cluster-ip-range={node.SERVICE_CLUSTER_IP_RANGE}",
        f"--health-port={health_port}",
        "--v=1",
    ]


def start(
    state_dir: Path,
    tools_dir: Path,
    server: str,
    progress: Callable[[str], Any] = print,
    timeout_s: float = READY_TIMEOUT_S,
) -> None:
    """kube-router's policy controller on the node, healthy; the node must be up."""
    state_dir = Path(state_dir).resolve()
    state = node.read_state(state_dir)
    if state is None:
        raise node.NodeError(f"no node runs in {state_dir}: start it first")
    started = time.monotonic()
    pki = state_dir / "pki"
    new_cert(pki, NAME, USER, ca="ca", usage="clientAuth")
    kubeconfig = state_dir / "node" / "config" / f"{NAME}.kubeconfig"
    write_kubeconfig(kubeconfig, server, pki, NAME)
    context = AdminClient(server, pki).ssl_context()
    for body in rbac():
        dns.create(server, context, body)
    port = free_port()
    process = node.spawn(state_dir, NAME, command(tools_dir, kubeconfig, port))
    deadline = started + timeout_s
    while not node.http_ok(f"http://127.0.0.1:{port}/healthz"):
        if process.poll() is not None or time.monotonic() > deadline:
            log = state_dir / "node" / "logs" / f"{NAME}.log"
            raise node.NodeError(
                f"{NAME} did not become healthy in {timeout_s:.0f} s "
                f"(exit code {process.poll()}; log {log})"
            )
        time.sleep(0.3)
    progress(
        f"{NAME} {VERSION} enforcing NetworkPolicy in {time.monotonic() - started:.1f} s "
        "(iptables and ipset)"
    )
