"""hack.node's configuration, pure: what containerd, the CNI plugins, the kubelet and kube-proxy
are told. tests/cluster/test_real_node.py runs them for real."""

from __future__ import annotations

import hashlib
import ipaddress
from pathlib import Path

import pytest
import tomllib

from hack import dns, node, registry

pytestmark = pytest.mark.unit

STATE = Path("/state")
PATHS = node._paths(STATE)
PORTS = {
    "kubelet": 10250,
    "kubelet-healthz": 10248,
    "kube-proxy-healthz": 10256,
    "kube-proxy-metrics": 10249,
    "kube-scheduler": 10259,
}


def test_containerd_keeps_everything_under_the_state_folder_and_restricts_oom_score_adj() -> None:
    config = tomllib.loads(node._containerd_config(PATHS))
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["restrict_oom_score_adj"] is True
    assert cri["sandbox_image"] == node.PAUSE_IMAGE
    runc = cri["containerd"]["runtimes"]["runc"]["options"]
    assert runc["SystemdCgroup"] is False
    paths = [config["root"], config["state"], config["grpc"]["address"], runc["Root"]]
    paths.append(cri["cni"]["conf_dir"])
    assert all(Path(path).is_relative_to(STATE / "node") for path in paths), paths


def test_the_pod_network_is_ours_and_apart_from_the_usual_cni_defaults() -> None:
    config = node._cni_config(PATHS)
    bridge = config["plugins"][0]
    assert bridge["bridge"] == node.BRIDGE and not bridge["bridge"].startswith("tsn")
    subnet = ipaddress.ip_network(bridge["ipam"]["ranges"][0][0]["subnet"])
    assert not subnet.overlaps(ipaddress.ip_network("10.244.0.0/16"))  # flannel's, kubeadm's
    assert Path(bridge["ipam"]["dataDir"]).is_relative_to(STATE / "node")


def test_the_kubelet_runs_on_cgroup_v1_without_qos_cgroups_and_authorizes_by_webhook() -> None:
    config = node._kubelet_config(PATHS, STATE / "pki", "192.0.2.2", PORTS)
    assert config["cgroupDriver"] == "cgroupfs"
    assert config["failCgroupV1"] is False and config["cgroupsPerQOS"] is False
    assert config["enforceNodeAllocatable"] == []
    assert config["authentication"]["anonymous"]["enabled"] is False
    assert config["authorization"]["mode"] == "Webhook"
    assert config["address"] == "192.0.2.2" and config["readOnlyPort"] == 0


def test_kube_proxy_uses_iptables_and_leaves_route_localnet_alone() -> None:
    config = node._kube_proxy_config(STATE / "kube-proxy.kubeconfig", PORTS)
    assert config["mode"] == "iptables"
    assert config["iptables"]["localhostNodePorts"] is False
    assert config["hostnameOverride"] == node.NODE_NAME


def test_a_shim_socket_is_where_containerd_1_6_puts_it() -> None:
    # runtime/v2/shim.SocketAddress: sha256 of ADDRESS/NAMESPACE/ID, under /run/containerd/s.
    digest = hashlib.sha256(b"/s/containerd.sock/k8s.io/abc").hexdigest()
    assert node._shim_socket(Path("/s/containerd.sock"), "abc") == Path(
        f"/run/containerd/s/{digest}"
    )


def test_coredns_is_the_kubelets_cluster_dns_and_answers_only_the_cluster() -> None:
    ports = {"dns": 40053, "health": 40080, "ready": 40081}
    objects = {body["kind"]: body for body in dns.objects("192.0.2.2", 6443, ports)}
    service = objects["Service"]["spec"]
    kubelet = node._kubelet_config(PATHS, STATE / "pki", "192.0.2.2", PORTS)
    assert kubelet["clusterDNS"] == [service["clusterIP"]]
    assert {(p["port"], p["targetPort"], p["protocol"]) for p in service["ports"]} == {
        (53, 40053, "UDP"),
        (53, 40053, "TCP"),
    }
    corefile = objects["ConfigMap"]["data"]["Corefile"]
    assert "bind 192.0.2.2" in corefile and "forward" not in corefile  # nothing leaves
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    environment = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert environment == {
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": "6443",
    }


@pytest.mark.parametrize(
    ("kind", "path"),
    [
        ("ServiceAccount", "/api/v1/namespaces/kube-system/serviceaccounts"),
        ("ClusterRole", "/apis/rbac.authorization.k8s.io/v1/clusterroles"),
        ("Deployment", "/apis/apps/v1/namespaces/kube-system/deployments"),
    ],
)
def test_each_dns_object_is_created_at_its_collection(kind: str, path: str) -> None:
    ports = {"dns": 1, "health": 2, "ready": 3}
    body = next(b for b in dns.objects("192.0.2.2", 6443, ports) if b["kind"] == kind)
    assert dns._collection(body) == path


def test_the_registry_listens_on_loopback_and_containerd_pulls_from_it_over_http() -> None:
    config = registry.config(Path("/state/node/registry/data"), 5123, 5124)
    assert config["http"]["addr"] == "127.0.0.1:5123"
    assert config["http"]["debug"]["addr"] == "127.0.0.1:5124"
    hosts = tomllib.loads(registry.containerd_hosts(5123))
    assert hosts["server"] == "http://127.0.0.1:5123"
    assert hosts["host"]["http://127.0.0.1:5123"]["capabilities"] == ["pull", "resolve"]
    containerd = tomllib.loads(node._containerd_config(PATHS))
    cri_registry = containerd["plugins"]["io.containerd.grpc.v1.cri"]["registry"]
    assert Path(cri_registry["config_path"]) == PATHS["certs.d"]


MOUNTINFO = """\
22 1 254:0 / / rw,relatime - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w
23 22 0:5 / /proc rw - proc proc rw
24 22 8:1 / /__w rw,relatime - ext4 /dev/sda1 rw
"""


@pytest.mark.parametrize(
    ("folder", "kind"),
    [
        ("/cluster/node/containerd", "overlay"),
        ("/__w/tritonscale/.cluster/node/containerd", "ext4"),
        ("/__w", "ext4"),
        ("/proc/1", "proc"),
    ],
)
def test_the_filesystem_of_a_folder_is_its_deepest_mount(folder: str, kind: str) -> None:
    assert node.filesystem_type(Path(folder), MOUNTINFO) == kind


def test_only_pods_untranslated_service_traffic_is_made_unreachable() -> None:
    # From the pods' bridge only (the machine's own clients go through kube-proxy's OUTPUT
    # rules, whose routing decision comes before translation), to the Service range only.
    rule = node._service_rule()
    assert rule[rule.index("iif") + 1] == node.BRIDGE
    assert rule[rule.index("to") + 1] == node.SERVICE_CLUSTER_IP_RANGE
    assert rule[-1] == "unreachable"
