"""The node stand-in's pure parts: images by role, $(VAR) expansion, what a pod requests, the
downward API, and the hosts files that stand in for Services. tests/cluster runs the whole."""

from __future__ import annotations

from decimal import Decimal

import pytest

from tritonscale.local.node import NodeError
from tritonscale.local.node.containers import expand
from tritonscale.local.node.images import repository, role_of
from tritonscale.local.node.kubelet import pod_requests
from tritonscale.local.node.services import hosts_file, routes_from_slices
from tritonscale.local.node.volumes import field_value

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("image", "role"),
    [
        ("nvcr.io/nvidia/tritonserver:24.10-py3", "triton"),
        ("ghcr.io/tritonscale/tritonscale-operator:0.1.0", "operator"),
        ("localhost:5000/tritonscale/tritonscale-locust@sha256:abc", "locust"),
        ("locustio/locust:2.31", "locust"),
        ("python:3.11-slim", "python"),
        ("docker.io/library/python", "python"),
        ("busybox", None),
        ("ghcr.io/someone/tritonserver-fork:1", None),
    ],
)
def test_an_image_is_a_role_by_repository_whatever_registry_and_tag(image: str, role: str) -> None:
    assert role_of(image) == role


def test_repository_drops_registry_tag_and_digest() -> None:
    assert repository("nvcr.io/nvidia/tritonserver:24.10-py3") == "nvidia/tritonserver"
    assert repository("localhost:5000/a/b@sha256:00") == "a/b"
    assert repository("python") == "python"


def test_expand_replaces_known_variables_keeps_unknown_and_unescapes_dollars() -> None:
    env = {"POD": "p-1", "PORT": "8000"}
    assert expand("--id=$(POD):$(PORT)", env) == "--id=p-1:8000"
    assert expand("$(MISSING) $$(POD) $$", env) == "$(MISSING) $(POD) $"


def test_pod_requests_sum_containers_and_take_the_largest_init_container() -> None:
    pod = {
        "spec": {
            "containers": [
                {"resources": {"requests": {"cpu": "250m", "memory": "512Mi"}}},
                # A limit without a request requests the limit.
                {"resources": {"limits": {"cpu": "1", "memory": "1Gi"}}},
            ],
            "initContainers": [{"resources": {"requests": {"cpu": "2"}}}],
        }
    }
    assert pod_requests(pod) == {"cpu": Decimal(2), "memory": Decimal(1536 * 1024**2)}


def test_field_value_reads_the_downward_api_and_refuses_what_it_lacks() -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "labels": {"app": "triton", "a": "b"}},
        "spec": {"nodeName": "n"},
        "status": {"podIP": "10.244.0.2"},
    }
    assert field_value(pod, "status.podIP") == "10.244.0.2"
    assert field_value(pod, "metadata.labels['app']") == "triton"
    assert field_value(pod, "metadata.labels") == 'a="b"\napp="triton"'
    with pytest.raises(NodeError, match="not supported"):
        field_value(pod, "spec.hostname")


def test_hosts_files_route_service_names_to_ready_endpoints_in_a_rotation() -> None:
    slices = [
        {
            "metadata": {"namespace": "ns", "labels": {"kubernetes.io/service-name": "triton"}},
            "endpoints": [
                {"addresses": ["10.244.0.3"], "conditions": {"ready": True}},
                {"addresses": ["10.244.0.2"]},  # unset means ready
                {"addresses": ["10.244.0.9"], "conditions": {"ready": False}},
            ],
        },
        {"metadata": {"namespace": "ns", "labels": {}}, "endpoints": []},
    ]
    routes = routes_from_slices(slices)
    assert routes == {("ns", "triton"): ["10.244.0.2", "10.244.0.3"]}
    first = hosts_file("p", "10.244.0.5", "ns", "10.244.0.1", routes, rotation=0)
    second = hosts_file("q", "10.244.0.6", "other", "10.244.0.1", routes, rotation=1)
    assert "10.244.0.1\tkubernetes.default kubernetes.default.svc" in first
    names = "triton.ns triton.ns.svc triton.ns.svc.cluster.local"
    assert first.index(f"10.244.0.2\ttriton {names}") < first.index("10.244.0.3\ttriton")
    # Another namespace gets no short name, and the other rotation.
    assert second.index(f"10.244.0.3\t{names}") < second.index(f"10.244.0.2\t{names}")
