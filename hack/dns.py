"""Cluster DNS for the local cluster: CoreDNS, built from the Go module proxy and run as a pod.

`build` installs github.com/coredns/coredns at COREDNS_VERSION (its own go.mod and go.sum,
checked against the checksum database) into TOOLS/coredns-vX.Y.Z/bin; `deploy` packs it into a
`FROM scratch` image, imports it into the node's containerd and creates what kubeadm creates:
the `coredns` ServiceAccount and RBAC, the Corefile, a Deployment and the `kube-dns` Service on
hack.node.CLUSTER_DNS_IP, which the kubelet hands to every pod as its nameserver.

The API server listens on 127.0.0.1 only and the `kubernetes` Service has no endpoints, so
CoreDNS runs in the host's network namespace and reaches the API server on loopback (its
in-cluster configuration, pointed there by KUBERNETES_SERVICE_HOST/PORT). It listens on the
node's address at a free port; kube-dns maps port 53 there. Nothing is forwarded upstream:
only the cluster's names are answered, and no query leaves the machine.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hack import node
from hack.gotools import go_install
from hack.pki import AdminClient
from tritonscale.local.ports import LOOPBACK, free_ports

COREDNS_VERSION = "v1.15.0"
COREDNS_MODULE = "github.com/coredns/coredns"
IMAGE = f"tritonscale.local/coredns:{COREDNS_VERSION}"
NAMESPACE = "kube-system"
READY_TIMEOUT_S = 90.0


def binary(tools_dir: Path) -> Path:
    return Path(tools_dir).resolve() / f"coredns-{COREDNS_VERSION}" / "bin" / "coredns"


def build(tools_dir: Path, progress: Callable[[str], Any] = print) -> Path:
    """CoreDNS into TOOLS/coredns-vX.Y.Z/bin, or at once when it is there."""
    return go_install(f"{COREDNS_MODULE}@{COREDNS_VERSION}", binary(tools_dir), progress)


def corefile(address: str, ports: dict[str, int]) -> str:
    return f"""\
.:{ports["dns"]} {{
    bind {address}
    errors
    health 127.0.0.1:{ports["health"]}
    ready 127.0.0.1:{ports["ready"]}
    kubernetes {node.CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }}
    cache 30
    loadbalance
}}
"""


def objects(address: str, apiserver_port: int, ports: dict[str, int]) -> list[dict[str, Any]]:
    """The API objects of the cluster's DNS, as (path to POST to, body)."""
    labels = {"k8s-app": "kube-dns"}
    container = {
        "name": "coredns",
        "image": IMAGE,
        "imagePullPolicy": "Never",  # imported into containerd; no registry
        "args": ["-conf", "/etc/coredns/Corefile"],
        "env": [
            {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
            {"name": "KUBERNETES_SERVICE_PORT", "value": str(apiserver_port)},
        ],
        "ports": [
            {"name": "dns", "containerPort": ports["dns"], "protocol": "UDP"},
            {"name": "dns-tcp", "containerPort": ports["dns"], "protocol": "TCP"},
        ],
        "readinessProbe": {
            "httpGet": {"host": "127.0.0.1", "port": ports["ready"], "path": "/ready"},
            "periodSeconds": 2,
        },
        "livenessProbe": {
            "httpGet": {"host": "127.0.0.1", "port": ports["health"], "path": "/health"},
            "periodSeconds": 10,
            "failureThreshold": 5,
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
        },
        "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns", "readOnly": True}],
    }
    pod_spec = {
        "serviceAccountName": "coredns",
        "hostNetwork": True,
        "priorityClassName": "system-cluster-critical",
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "runAsGroup": 65532,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [{"name": "config", "configMap": {"name": "coredns"}}],
    }
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "coredns", "namespace": NAMESPACE}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "system:coredns"},
            "rules": [
                {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
                 "verbs": ["list", "watch"]},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                 "verbs": ["list", "watch"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "system:coredns"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "system:coredns"},
            "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": NAMESPACE}],
        },
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": "coredns", "namespace": NAMESPACE},
         "data": {"Corefile": corefile(address, ports)}},
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "coredns", "namespace": NAMESPACE, "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": pod_spec},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kube-dns", "namespace": NAMESPACE, "labels": labels},
            "spec": {
                "selector": labels,
                "clusterIP": node.CLUSTER_DNS_IP,
                "ports": [
                    {"name": "dns", "port": 53, "targetPort": ports["dns"], "protocol": "UDP"},
                    {"name": "dns-tcp", "port": 53, "targetPort": ports["dns"],
                     "protocol": "TCP"},
                ],
            },
        },
    ]  # fmt: skip


def _collection(body: dict[str, Any]) -> str:
    """The URL path to create `body` at."""
    group = "/api/v1" if body["apiVersion"] == "v1" else f"/apis/{body['apiVersion']}"
    plural = {"ServiceAccount": "serviceaccounts", "ClusterRole": "clusterroles",
              "ClusterRoleBinding": "clusterrolebindings", "ConfigMap": "configmaps",
              "Deployment": "deployments", "Service": "services"}[body["kind"]]  # fmt: skip
    namespace = body["metadata"].get("namespace")
    return f"{group}/namespaces/{namespace}/{plural}" if namespace else f"{group}/{plural}"


def create(server: str, context: ssl.SSLContext, body: dict[str, Any]) -> None:
    """POST `body` to the API server as the admin; a NodeError with its answer when refused."""
    request = urllib.request.Request(
        server + _collection(body),
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10, context=context):
            pass
    except urllib.error.HTTPError as error:
        detail = error.read().decode(errors="replace")[:300]
        raise node.NodeError(
            f"creating {body['kind']} {body['metadata']['name']} failed: HTTP {error.code} {detail}"
        ) from None


def deploy(
    state_dir: Path,
    tools_dir: Path,
    server: str,
    address: str,
    progress: Callable[[str], Any] = print,
    timeout_s: float = READY_TIMEOUT_S,
) -> None:
    """CoreDNS as the cluster's DNS, Ready; the node must be up (hack.node.start_node)."""
    state_dir = Path(state_dir).resolve()
    started = time.monotonic()
    image_dir = Path(tools_dir).resolve() / "images"
    archive = image_dir / f"coredns-{COREDNS_VERSION}.tar"
    if not archive.is_file():
        node.build_scratch_image(archive, IMAGE, {"/coredns": binary(tools_dir)}, ["/coredns"])
    node.import_image(state_dir, archive)
    ports = dict(
        zip(("dns", "health", "ready"), free_ports(3, [address, LOOPBACK, LOOPBACK]), strict=True)
    )
    admin = AdminClient(server, state_dir / "pki")
    context = admin.ssl_context()
    for body in objects(address, int(server.rsplit(":", 1)[1]), ports):
        create(server, context, body)
    path = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/coredns"
    deadline = started + timeout_s
    while True:
        code, body = admin.get(path)
        if code == 200 and json.loads(body).get("status", {}).get("readyReplicas", 0) >= 1:
            break
        if time.monotonic() > deadline:
            raise node.NodeError(
                f"timed out after {timeout_s:.0f} s waiting for CoreDNS to be Ready "
                f"(kubectl -n {NAMESPACE} describe pods -l k8s-app=kube-dns)"
            )
        time.sleep(0.5)
    progress(
        f"CoreDNS {COREDNS_VERSION} Ready in {time.monotonic() - started:.1f} s: "
        f"{node.CLUSTER_DNS_IP}:53 for *.{node.CLUSTER_DOMAIN}"
    )
