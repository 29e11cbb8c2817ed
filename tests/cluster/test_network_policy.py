"""The chart's NetworkPolicy, enforced (kube-network-policies on the node): the operator
reaches every Triton port it uses, in scrape mode and in Prometheus mode, a Prometheus in
the namespace `networkPolicy.metricsFrom` names scrapes Triton's metrics, and pods outside
the allowed set are refused.

The release runs with the policy on and `metricsFrom` set to the monitoring namespace: the
production setup the chart documents. A Prometheus (Debian's binary, in a `FROM scratch`
image with the C library it links) runs there and scrapes the Triton pods with the
`namespace` and `pod` labels the operator's queries select on, as a user's Prometheus
would. Debian builds Prometheus without Kubernetes discovery, so the test plays that part:
an HTTP service discovery endpoint (Prometheus' http_sd) on the node's address lists the
release's Triton pods, read from the API server at each refresh.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from hack import node as hack_node
from tests.chart.helm import CHART
from tests.cluster.harness import Cluster, is_ready, restricted_namespace, wait_namespace_gone
from tests.cluster.test_real_node import IMAGE as BUSYBOX_IMAGE
from tests.cluster.test_real_node import import_busybox
from tests.tooling import missing

NAMESPACE = "e2e-netpol"
MONITORING = "e2e-monitoring"
OUTSIDER = "e2e-outsider"
RELEASE = "guarded"
VALUES = Path(__file__).parent / "e2e-values.yaml"
TRITON = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=triton"
OPERATOR = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=operator"
PROMETHEUS_BINARY = Path("/usr/bin/prometheus")  # Debian's; it links only the C library
PROMETHEUS_IMAGE = "tritonscale.local/prometheus:debian"
PROMETHEUS_URL = f"http://prometheus.{MONITORING}.svc:9090"
POLICY_VALUES = {
    "networkPolicy": {
        "enabled": True,
        "metricsFrom": [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": MONITORING}}}
        ],
    }
}


def prometheus_config(discovery_url: str) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": "2s", "evaluation_interval": "2s"},
        "scrape_configs": [
            {
                "job_name": "triton",
                "http_sd_configs": [{"url": discovery_url, "refresh_interval": "5s"}],
            }
        ],
    }


def triton_targets(cluster: Cluster) -> list[dict[str, Any]]:
    """Prometheus' http_sd answer: each Triton pod's metrics address, with its labels."""
    return [
        {
            "targets": [f"{pod['status']['podIP']}:8002"],
            "labels": {"namespace": NAMESPACE, "pod": pod["metadata"]["name"]},
        }
        for pod in cluster.pods(NAMESPACE, TRITON)
        if pod["status"].get("podIP")
    ]


class Discovery(ThreadingHTTPServer):
    """The http_sd endpoint, on the node's address (pods reach it there), in a thread."""

    daemon_threads = True

    def __init__(self, cluster: Cluster) -> None:
        address = hack_node.node_ip()
        cluster_ = cluster

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                try:
                    body = json.dumps(triton_targets(cluster_)).encode()
                except AssertionError:  # kubectl failed this once: Prometheus keeps the last
                    self.send_error(503)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        super().__init__((address, 0), Handler)
        self.url = f"http://{address}:{self.server_address[1]}/targets"
        self.thread = threading.Thread(target=self.serve_forever, daemon=True, name="http-sd")

    def __enter__(self) -> Discovery:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()


def prometheus_objects(discovery_url: str) -> list[dict[str, Any]]:
    labels = {"app": "prometheus"}
    restricted = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
    }
    return [
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": "prometheus", "namespace": MONITORING},
         "data": {"prometheus.yml": yaml.safe_dump(prometheus_config(discovery_url))}},
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "prometheus", "namespace": MONITORING, "labels": labels},
            "spec": {
                "automountServiceAccountToken": False,
                "securityContext": {
                    "runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534,
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "containers": [{
                    "name": "prometheus",
                    "image": PROMETHEUS_IMAGE,
                    "imagePullPolicy": "Never",
                    "args": ["--config.file=/etc/prometheus/prometheus.yml",
                             "--storage.tsdb.path=/prometheus",
                             "--web.listen-address=:9090"],
                    "ports": [{"name": "web", "containerPort": 9090}],
                    "readinessProbe": {"httpGet": {"path": "/-/ready", "port": 9090},
                                       "periodSeconds": 2},
                    "securityContext": restricted,
                    "volumeMounts": [
                        {"name": "config", "mountPath": "/etc/prometheus"},
                        {"name": "data", "mountPath": "/prometheus"},
                    ],
                }],
                "volumes": [
                    {"name": "config", "configMap": {"name": "prometheus"}},
                    {"name": "data", "emptyDir": {}},
                ],
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "prometheus", "namespace": MONITORING},
            "spec": {"selector": labels, "ports": [{"port": 9090, "targetPort": 9090}]},
        },
    ]  # fmt: skip


def probe_pod(namespace: str) -> dict[str, Any]:
    """A busybox pod that only sleeps: the tests connect from it with `kubectl exec`."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "probe", "namespace": namespace},
        "spec": {
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65532,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "probe",
                    "image": BUSYBOX_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/busybox", "sleep", "3600"],
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }


def http_get(cluster: Cluster, namespace: str, address: str, port: int, path: str) -> str:
    """An HTTP GET from the probe pod in `namespace`, by nc (busybox's wget needs /etc files
    a `FROM scratch` image lacks): the whole answer, or "" when none came within 3 s."""
    request = f"printf 'GET {path} HTTP/1.0\\r\\n\\r\\n' | /bin/busybox nc -w 3 {address} {port}"
    done = cluster.run(
        "kubectl", "exec", "probe", "-n", namespace, "--", "/bin/busybox", "sh", "-c", request,
        timeout=30,
    )  # fmt: skip
    return done.stdout if done.stdout.startswith("HTTP/") else ""


def answers(cluster: Cluster, namespace: str, address: str, port: int, path: str) -> bool:
    """Whether an HTTP GET from the probe pod in `namespace` gets an answer (any status)."""
    return bool(http_get(cluster, namespace, address, port, path))


@pytest.fixture(scope="module")
def guarded(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if not PROMETHEUS_BINARY.is_file():
        missing(f"{PROMETHEUS_BINARY} not found (Debian's prometheus)")
    folder = tmp_path_factory.mktemp("netpol")
    libraries = {
        "/lib/x86_64-linux-gnu/libc.so.6": Path("/lib/x86_64-linux-gnu/libc.so.6"),
        "/lib64/ld-linux-x86-64.so.2": Path("/lib64/ld-linux-x86-64.so.2"),
    }
    archive = hack_node.build_scratch_image(
        folder / "prometheus.tar",
        PROMETHEUS_IMAGE,
        {"/bin/prometheus": PROMETHEUS_BINARY, **libraries},
        ["/bin/prometheus"],
    )
    hack_node.import_image(cluster.state_dir, archive)
    import_busybox(cluster.state_dir)
    for namespace in (NAMESPACE, MONITORING, OUTSIDER):
        restricted_namespace(cluster, namespace)
    values = folder / "policy.yaml"
    values.write_text(yaml.safe_dump(POLICY_VALUES))
    cluster.helm(
        "install", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(VALUES), "-f", str(values),
        *cluster.image_values(),
    )  # fmt: skip
    with Discovery(cluster) as discovery:
        for body in prometheus_objects(discovery.url):
            cluster.kubectl("apply", "-f", "-", stdin=json.dumps(body))
        for namespace in (MONITORING, OUTSIDER):
            cluster.kubectl("apply", "-f", "-", stdin=json.dumps(probe_pod(namespace)))
        yield cluster
    cluster.run("helm", "uninstall", RELEASE, "-n", NAMESPACE, "--timeout", "2m")
    for namespace in (NAMESPACE, MONITORING, OUTSIDER):
        cluster.run("kubectl", "delete", "namespace", namespace, "--wait=false")
    for namespace in (NAMESPACE, MONITORING, OUTSIDER):
        wait_namespace_gone(cluster, namespace)


def reconciled(cluster: Cluster) -> list[dict[str, Any]] | None:
    """The autoscalers, once each reports a current count and ScalingActive True."""
    items = cluster.items("instancegroupautoscalers", "-n", NAMESPACE)
    for item in items:
        status = item.get("status") or {}
        conditions = {c["type"]: c for c in status.get("conditions") or []}
        active = conditions.get("ScalingActive", {})
        if status.get("currentInstances") is None or active.get("status") != "True":
            return None
    return items or None


def wait_tuned(cluster: Cluster, pods: int, mode: str) -> None:
    """Wait for `pods` Triton pods Ready (each gate opened by the operator) and every
    autoscaler reconciled with ScalingActive True; then no pod may have been unreachable."""
    cluster.wait(
        f"{pods} Triton pod(s) Ready, their gates opened by the operator in {mode} mode",
        lambda: (
            len(found := cluster.pods(NAMESPACE, TRITON)) == pods
            and all(is_ready(p) for p in found)
        ),
        timeout_s=420,
        namespace=NAMESPACE,
    )
    cluster.wait(
        f"every autoscaler reconciled with ScalingActive True in {mode} mode",
        lambda: reconciled(cluster),
        timeout_s=180,
        namespace=NAMESPACE,
    )
    assert unreachable_events(cluster) == []


def unreachable_events(cluster: Cluster) -> list[str]:
    events = cluster.items("events", "-n", NAMESPACE)
    return [e["message"] for e in events if "PodUnreachable" in (e.get("reason") or "")]


def test_the_operator_reaches_triton_through_the_policy_in_scrape_mode(guarded: Cluster) -> None:
    wait_tuned(guarded, 1, "scrape")


def test_only_the_allowed_namespaces_reach_tritons_ports(guarded: Cluster) -> None:
    for namespace in (MONITORING, OUTSIDER):
        guarded.wait(
            f"the probe pod in {namespace} to run",
            lambda ns=namespace: (
                guarded.get("pod", "probe", "-n", ns)["status"].get("phase") == "Running"
            ),
            timeout_s=60,
            namespace=namespace,
        )
    (triton,) = guarded.pods(NAMESPACE, TRITON)
    address = triton["status"]["podIP"]
    prometheus = guarded.get("service", "prometheus", "-n", MONITORING)["spec"]["clusterIP"]
    # The outsider's network works (Prometheus has no policy)...
    guarded.wait(
        "the outsider's probe to reach Prometheus (no policy guards it)",
        lambda: answers(guarded, OUTSIDER, prometheus, 9090, "/-/ready"),
        timeout_s=60,
        namespace=OUTSIDER,
    )
    # ...so what refuses it at Triton is the policy: no port at all.
    assert not answers(guarded, OUTSIDER, address, 8000, "/v2/health/ready")
    assert not answers(guarded, OUTSIDER, address, 8002, "/metrics")
    # The monitoring namespace may scrape, and only scrape.
    assert answers(guarded, MONITORING, address, 8002, "/metrics")
    assert not answers(guarded, MONITORING, address, 8000, "/v2/health/ready")


def prometheus_has_triton(cluster: Cluster) -> bool:
    """Whether the Prometheus in MONITORING holds Triton's series for the release's pods
    (asked from this machine, which reaches every pod's address)."""
    address = cluster.get("pod", "prometheus", "-n", MONITORING)["status"].get("podIP")
    query = f'count(nv_inference_request_success{{namespace="{NAMESPACE}"}})'
    try:
        answer = requests.get(
            f"http://{address}:9090/api/v1/query", params={"query": query}, timeout=5
        )
    except requests.RequestException:
        return False
    result = answer.json()["data"]["result"] if answer.ok else []
    return bool(result) and float(result[0]["value"][1]) > 0


def test_in_prometheus_mode_the_operator_still_reaches_every_pod(guarded: Cluster) -> None:
    """The defect an outside review found: with `operator.prometheusUrl` set and the metrics
    port limited to the monitoring namespace, the operator's health checks (which read every
    pod's /metrics in both modes) were refused, every pod dropped as PodUnreachable and
    scaling stopped. Now a new pod joins at its peer's counts through the policy."""
    guarded.wait(
        "Prometheus (in the monitoring namespace) to hold Triton's series",
        lambda: prometheus_has_triton(guarded),
        timeout_s=120,
        namespace=MONITORING,
    )
    guarded.helm(
        "upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "--reuse-values",
        "--set", f"operator.prometheusUrl={PROMETHEUS_URL}", "--set", "triton.replicaCount=2",
    )  # fmt: skip
    guarded.kubectl(
        "rollout", "status", f"deployment/{RELEASE}-tritonscale-operator", "-n", NAMESPACE,
        "--timeout=180s", timeout=200,
    )  # fmt: skip
    operator = guarded.ready_pods(NAMESPACE, OPERATOR)[0]  # not one still terminating
    env = {e["name"]: e.get("value") for e in operator["spec"]["containers"][0].get("env", [])}
    assert PROMETHEUS_URL in env.values(), env
    wait_tuned(guarded, 2, "Prometheus")
