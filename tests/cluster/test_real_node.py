"""The node itself: pods from a locally built `FROM scratch` image run confined, log, get an
address from the node's CNI bridge, sit behind a ClusterIP Service that kube-proxy routes and
that CoreDNS names, pull from the node's registry, and reach the API server through the
`kubernetes` Service. (test_teardown.py checks that `down` leaves nothing behind.)
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from hack import images as hack_images
from hack import node as hack_node
from hack import registry as hack_registry
from tests.cluster.harness import Cluster
from tests.tooling import missing

T = TypeVar("T")
NAMESPACE = "real-node"
IMAGE = "tritonscale.local/busybox:test"
BUSYBOX = Path("/bin/busybox")  # Debian's busybox-static: one static binary, no libraries
PODS = ("web-0", "web-1")
UID = 65532
COMMAND_TIMEOUT_S = 60
# Each pod writes its name as the page it serves, so an answer says which pod gave it.
SERVE = (
    "echo $POD_NAME > /www/index.html && echo serving $POD_NAME "
    "&& exec /bin/busybox httpd -f -p 8080 -h /www"
)


@dataclass
class RealCluster:
    state_dir: Path
    kubectl_path: str

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        command = [self.kubectl_path, "--kubeconfig", str(self.kubeconfig), "-n", NAMESPACE]
        try:
            done = subprocess.run(
                [*command, *args],
                capture_output=True,
                text=True,
                input=stdin,
                timeout=COMMAND_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"`kubectl {' '.join(args)}` hung for {COMMAND_TIMEOUT_S} s"
            ) from None
        if check:
            assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr.strip()}"
        return done.stdout

    def get(self, *args: str) -> dict[str, Any]:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def diagnosis(self) -> str:
        pods = self.kubectl("get", "pods", "-o", "wide", check=False)
        events = self.kubectl("get", "events", "--sort-by=.lastTimestamp", check=False)
        logs = self.state_dir / "logs"
        return f"{pods}\n{events[-3000:]}\n(component logs: {logs})"

    def wait(self, what: str, check: Callable[[], T | None], timeout_s: float) -> T:
        """`check` until it returns something truthy; fail naming `what` at the deadline."""
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while True:
            try:
                last = check()
            except (AssertionError, OSError) as error:
                last = error
            else:
                if last:
                    return last
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout_s:.0f} s waiting for {what}; last seen: "
                    f"{last!r}\n{self.diagnosis()}"
                )
            time.sleep(0.5)


def pod_manifest(name: str) -> dict[str, Any]:
    """A pod the restricted PodSecurity level admits: non-root, no capabilities, seccomp."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": UID,
                "runAsGroup": UID,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "httpd",
                    "image": IMAGE,
                    "imagePullPolicy": "Never",  # imported into containerd; no registry
                    "command": ["/bin/busybox", "sh", "-c", SERVE],
                    "env": [
                        {
                            "name": "POD_NAME",
                            "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                        }
                    ],
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "volumeMounts": [{"name": "www", "mountPath": "/www"}],
                }
            ],
            "volumes": [{"name": "www", "emptyDir": {}}],
        },
    }


SERVICE = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": "web"},
    "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
}


def import_busybox(state_dir: Path) -> None:
    """IMAGE in the node's containerd: built once per cluster folder (a `FROM scratch` image
    of Debian's static busybox), imported again after each `up`."""
    if not BUSYBOX.is_file():
        missing(f"{BUSYBOX} not found (Debian's busybox-static)")
    archive = state_dir / "busybox.tar"
    if not archive.is_file():
        hack_node.build_scratch_image(archive, IMAGE, {"/bin/busybox": BUSYBOX}, ["/bin/busybox"])
    hack_node.import_image(state_dir, archive)


@pytest.fixture(scope="module")
def real(cluster: Cluster) -> Iterator[RealCluster]:
    real = RealCluster(cluster.state_dir, cluster.tools["kubectl"])
    import_busybox(cluster.state_dir)
    real.kubectl("create", "namespace", NAMESPACE)
    real.kubectl("label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=restricted")
    for name in PODS:
        real.kubectl("apply", "-f", "-", stdin=json.dumps(pod_manifest(name)))
    real.kubectl("apply", "-f", "-", stdin=json.dumps(SERVICE))
    yield real
    real.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


def ready(real: RealCluster) -> list[dict[str, Any]] | None:
    pods = real.get("pods", "-l", "app=web")["items"]
    conditions = [{c["type"]: c["status"] for c in p["status"].get("conditions", [])} for p in pods]
    if len(pods) == len(PODS) and all(c.get("Ready") == "True" for c in conditions):
        return pods
    return None


def test_pods_run_confined_on_the_real_node_with_addresses_from_its_bridge(
    real: RealCluster,
) -> None:
    pods = real.wait("both web pods Ready on the real node", lambda: ready(real), 120)
    node = real.get("node", hack_node.NODE_NAME)
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://1.")
    subnet = ipaddress.ip_network(hack_node.POD_SUBNET)
    addresses = {pod["status"]["podIP"] for pod in pods}
    assert len(addresses) == len(PODS), f"the pods share an address: {addresses}"
    assert all(ipaddress.ip_address(a) in subnet for a in addresses), addresses
    assert {pod["spec"]["nodeName"] for pod in pods} == {hack_node.NODE_NAME}

    # Through the API server to the kubelet (its client certificate, the webhook authorizer).
    status = real.kubectl("exec", PODS[0], "--", "/bin/busybox", "cat", "/proc/1/status")
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    assert fields["Uid"].split() == [str(UID)] * 4, fields["Uid"]
    assert int(fields["CapEff"], 16) == 0, fields["CapEff"]
    assert fields["Seccomp"].strip() == "2", "not under a seccomp filter"
    assert f"serving {PODS[0]}" in real.kubectl("logs", PODS[0])


def test_a_cluster_ip_service_reaches_both_pods_through_kube_proxy(real: RealCluster) -> None:
    real.wait("both web pods Ready", lambda: ready(real), 120)
    cluster_ip = real.get("service", "web")["spec"]["clusterIP"]

    def from_this_machine() -> str:
        with urllib.request.urlopen(f"http://{cluster_ip}/", timeout=2) as response:
            return response.read().decode().strip()

    def from_a_pod() -> str:
        # busybox's wget dies in a FROM-scratch image (no /etc files): a raw request by nc.
        request = f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | /bin/busybox nc {cluster_ip} 80"
        answer = real.kubectl("exec", PODS[0], "--", "/bin/busybox", "sh", "-c", request)
        return answer.strip().splitlines()[-1]

    for where, fetch in (("this machine", from_this_machine), ("a pod", from_a_pod)):
        seen: set[str] = set()

        def both(fetch: Callable[[], str] = fetch, seen: set[str] = seen) -> bool:
            seen.add(fetch())
            return seen == set(PODS)

        real.wait(f"answers from both pods via {cluster_ip} from {where}", both, 60)


def test_pods_resolve_a_service_by_name_through_coredns(real: RealCluster) -> None:
    real.wait("both web pods Ready", lambda: ready(real), 120)
    cluster_ip = real.get("service", "web")["spec"]["clusterIP"]
    resolv = real.kubectl("exec", PODS[0], "--", "/bin/busybox", "cat", "/etc/resolv.conf")
    assert f"nameserver {hack_node.CLUSTER_DNS_IP}" in resolv, resolv
    name = f"web.{NAMESPACE}.svc.{hack_node.CLUSTER_DOMAIN}"

    def resolved() -> str | None:
        lookup = ("exec", PODS[0], "--", "/bin/busybox", "nslookup", name)
        answer = real.kubectl(*lookup, check=False)
        return answer if cluster_ip in answer else None

    real.wait(f"{name} to resolve to {cluster_ip} in a pod", resolved, 30)


def test_a_pod_pulls_its_image_from_the_local_registry(real: RealCluster) -> None:
    address = hack_node.read_state(real.state_dir)["registry"]
    reference = f"{address}/tritonscale/busybox:pushed"
    hack_registry.push(real.state_dir / "busybox.tar", reference)
    manifest = pod_manifest("pulled")
    manifest["metadata"]["labels"] = {"app": "pulled"}  # not behind the web Service
    manifest["spec"]["containers"][0].update(image=reference, imagePullPolicy="Always")
    real.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))

    def running() -> bool:
        return real.get("pod", "pulled")["status"].get("phase") == "Running"

    real.wait(f"a pod of {reference}, pulled from the registry, Running", running, 90)
    events = real.kubectl("get", "events", "--field-selector", "involvedObject.name=pulled")
    assert "Successfully pulled image" in events, events


def test_pods_reach_the_api_server_through_the_kubernetes_service(real: RealCluster) -> None:
    """In-cluster clients (the operator among them) find the API server at the `kubernetes`
    Service, which kube-proxy routes to the address the API server advertises."""
    real.wait("both web pods Ready", lambda: ready(real), 120)
    endpoints = real.get("endpointslices", "-n", "default", "-l",
                         "kubernetes.io/service-name=kubernetes")["items"]  # fmt: skip
    addresses = [a for item in endpoints for e in item["endpoints"] for a in e["addresses"]]
    assert addresses == [hack_node.node_ip()], addresses
    # Plain HTTP to its TLS port: Go's server answers 400 "Client sent an HTTP request to an
    # HTTPS server", which only the API server's own socket can have said.
    service = f"{hack_node.SERVICE_CLUSTER_IP} 443"
    request = f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | /bin/busybox nc {service}"
    answer = real.kubectl("exec", PODS[0], "--", "/bin/busybox", "sh", "-c", request)
    assert "HTTP request to an HTTPS server" in answer, answer


def test_a_service_address_with_no_endpoint_is_unreachable_at_once(real: RealCluster) -> None:
    """A Service address kube-proxy does not translate fails the pod's connect at once, as a
    client expects; the packet does not leave the machine by its default route."""
    real.wait("both web pods Ready", lambda: ready(real), 120)
    # An address of the Service range that no Service holds now: the API server hands out
    # the range's addresses at random, so a fixed one (10.0.0.99) may be a live Service's.
    held = {svc["spec"].get("clusterIP") for svc in real.get("services", "-A")["items"]}
    unserved = next(f"10.0.0.{n}" for n in range(250, 1, -1) if f"10.0.0.{n}" not in held)
    done = subprocess.run(
        [real.kubectl_path, "--kubeconfig", str(real.kubeconfig), "-n", NAMESPACE, "exec",
         PODS[0], "--", "/bin/busybox", "nc", "-w", "5", unserved, "80"],
        capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode != 0 and "unreachable" in done.stderr.lower(), done.stderr


def test_make_push_put_every_image_in_the_nodes_registry(real: RealCluster) -> None:
    """The session ran `make push REGISTRY=<the node's registry>/tritonscale`, as the README
    tells users to; each image is there under the chart's appVersion (and the chart's pods,
    in test_release.py, pull them from there)."""
    address = hack_node.read_state(real.state_dir)["registry"]
    version = hack_images.chart_version()
    for image in hack_images.IMAGES:
        url = f"http://{address}/v2/tritonscale/{image.name}/tags/list"
        with urllib.request.urlopen(url, timeout=10) as answer:
            assert json.load(answer)["tags"] == [version], image.name
