"""Finding the ready Triton pods an autoscaler selects, and where to reach them."""

from __future__ import annotations

from typing import Any

import pytest

from tritonscale.core.spec import LabelSelector
from tritonscale.drivers.pods import TritonPod, ready_endpoints

pytestmark = pytest.mark.unit

SELECTOR = LabelSelector.from_dict({"matchLabels": {"app.kubernetes.io/component": "triton"}})


def pod_body(
    name: str = "triton-0",
    labels: dict[str, str] | None = None,
    ip: str | None = "10.0.0.7",
    phase: str = "Running",
    ready: str = "True",
    deleting: bool = False,
    ports: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": "ml",
        "labels": {"app.kubernetes.io/component": "triton"} if labels is None else labels,
    }
    if deleting:
        metadata["deletionTimestamp"] = "2026-11-29T18:00:00Z"
    status: dict[str, Any] = {"phase": phase, "conditions": [{"type": "Ready", "status": ready}]}
    if ip is not None:
        status["podIP"] = ip
    return {
        "metadata": metadata,
        "spec": {"containers": [{"name": "triton", "ports": ports or []}]},
        "status": status,
    }


def test_a_ready_selected_pod_is_reached_on_tritons_default_ports() -> None:
    [endpoint] = ready_endpoints([TritonPod.from_body(pod_body())], SELECTOR)
    assert endpoint.name == "triton-0"
    assert endpoint.namespace == "ml"
    assert endpoint.http_url == "10.0.0.7:8000"
    assert endpoint.metrics_url == "http://10.0.0.7:8002/metrics"


def test_container_ports_named_http_and_metrics_win_over_the_defaults() -> None:
    ports = [
        {"name": "http", "containerPort": 18000},
        {"name": "grpc", "containerPort": 18001},
        {"name": "metrics", "containerPort": 18002},
    ]
    [endpoint] = ready_endpoints([TritonPod.from_body(pod_body(ports=ports))], SELECTOR)
    assert endpoint.http_url == "10.0.0.7:18000"
    assert endpoint.metrics_url == "http://10.0.0.7:18002/metrics"


def test_the_drivers_ports_apply_when_the_pod_names_none() -> None:
    [endpoint] = ready_endpoints(
        [TritonPod.from_body(pod_body())], SELECTOR, http_port=9000, metrics_port=9002
    )
    assert endpoint.http_url == "10.0.0.7:9000"
    assert endpoint.metrics_url == "http://10.0.0.7:9002/metrics"


def test_an_ipv6_pod_ip_is_bracketed_in_urls() -> None:
    [endpoint] = ready_endpoints([TritonPod.from_body(pod_body(ip="fd00::7"))], SELECTOR)
    assert endpoint.http_url == "[fd00::7]:8000"
    assert endpoint.metrics_url == "http://[fd00::7]:8002/metrics"


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(pod_body(ready="False"), id="not Ready"),
        pytest.param(pod_body(phase="Pending"), id="still Pending"),
        pytest.param(pod_body(ip=None), id="no IP yet"),
        pytest.param(pod_body(deleting=True), id="being deleted"),
        pytest.param(pod_body(labels={"app.kubernetes.io/component": "locust"}), id="not selected"),
        pytest.param(pod_body(labels={}), id="no labels"),
    ],
)
def test_a_pod_is_left_out_when(body: dict[str, Any]) -> None:
    assert ready_endpoints([TritonPod.from_body(body)], SELECTOR) == []


def test_pods_come_out_sorted_by_name_so_the_actuator_walks_them_in_a_stable_order() -> None:
    pods = [TritonPod.from_body(pod_body(name=n, ip=f"10.0.0.{i}")) for i, n in enumerate("cab")]
    assert [e.name for e in ready_endpoints(pods, SELECTOR)] == ["a", "b", "c"]


def test_match_expressions_select_as_in_kubernetes() -> None:
    selector = LabelSelector.from_dict(
        {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["cpu"]}]}
    )
    gpu = TritonPod.from_body(pod_body(name="gpu", labels={"tier": "gpu"}))
    cpu = TritonPod.from_body(pod_body(name="cpu", labels={"tier": "cpu"}))
    unlabelled = TritonPod.from_body(pod_body(name="bare", labels={}))
    # NotIn also matches a pod without the key, as metav1 selectors do.
    assert [e.name for e in ready_endpoints([gpu, cpu, unlabelled], selector)] == ["bare", "gpu"]
