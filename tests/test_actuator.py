"""The actuator against real tritonservers: counts change live, failures leave the model serving."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient

from tests.tooling import require_local_triton
from tritonscale.local.ports import free_port
from tritonscale.local.triton_server import LocalTriton
from tritonscale.triton.actuator import ActuationError, Actuator, instance_count, with_instances
from tritonscale.triton.endpoints import Endpoint


def _server() -> LocalTriton:
    require_local_triton()
    return LocalTriton(http_port=0, grpc_port=0, metrics_port=0, models=["add_sub"])


@pytest.fixture(scope="module")
def two_pods() -> Iterator[list[tuple[Endpoint, LocalTriton]]]:
    """Two Tritons serving add_sub, with the same repository key: two pods of one set."""
    with _server() as first:
        second = _server()
        second.repository_key = first.repository_key
        with second:
            yield [
                (Endpoint("pod-a", first.http_url, first.metrics_url), first),
                (Endpoint("pod-b", f"http://{second.http_url}/", second.metrics_url), second),
            ]


@pytest.fixture
async def pods(two_pods: list[tuple[Endpoint, LocalTriton]]) -> list[Endpoint]:
    """The two pods, each back at one instance of add_sub."""
    actuator = Actuator(two_pods[0][1].repository_key)
    endpoints = [endpoint for endpoint, _ in two_pods]
    assert all(result.ok for result in await actuator.apply(endpoints, "add_sub", 1))
    return endpoints


def _infer_add_sub(endpoint: Endpoint) -> None:
    client = httpclient.InferenceServerClient(endpoint.base_url.removeprefix("http://"))
    a = np.array([[1, 2, 3, 4]], dtype=np.float32).reshape(4)
    b = np.array([4, 3, 2, 1], dtype=np.float32)
    inputs = [
        httpclient.InferInput("INPUT0", [4], "FP32"),
        httpclient.InferInput("INPUT1", [4], "FP32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("add_sub", inputs)
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b)


async def test_it_sets_the_count_on_every_pod_one_at_a_time(pods: list[Endpoint], two_pods) -> None:
    actuator = Actuator(two_pods[0][1].repository_key)
    results = await actuator.apply(pods, "add_sub", 3)
    assert [(r.pod, r.before, r.after, r.ok) for r in results] == [
        ("pod-a", 1, 3, True),
        ("pod-b", 1, 3, True),
    ]
    counts, failures = await actuator.live_counts(pods, "add_sub")
    assert counts == {"pod-a": 3, "pod-b": 3} and failures == {}
    for endpoint in pods:
        assert await actuator.is_ready(endpoint, "add_sub")
        _infer_add_sub(endpoint)


async def test_pods_already_at_the_count_are_left_alone(pods: list[Endpoint], two_pods) -> None:
    actuator = Actuator(two_pods[0][1].repository_key)
    await actuator.apply(pods[:1], "add_sub", 2)
    results = await actuator.apply(pods, "add_sub", 2)
    # pod-a had 2 already: only pod-b was loaded.
    assert [r.pod for r in results] == ["pod-b"]


async def test_the_override_changes_only_the_instance_group(pods: list[Endpoint], two_pods) -> None:
    actuator = Actuator(two_pods[0][1].repository_key)
    before = await actuator.live_config(pods[0], "add_sub")
    await actuator.apply(pods[:1], "add_sub", 2)
    after = await actuator.live_config(pods[0], "add_sub")
    assert {k: v for k, v in after.items() if k != "instance_group"} == {
        k: v for k, v in before.items() if k != "instance_group"
    }
    assert after["instance_group"][0]["kind"] == before["instance_group"][0]["kind"]
    assert instance_count(after) == 2


async def test_a_rejected_load_is_reported_and_the_model_keeps_serving(
    pods: list[Endpoint], two_pods
) -> None:
    actuator = Actuator(two_pods[0][1].repository_key)
    await actuator.apply(pods, "add_sub", 2)
    # An instance kind Triton does not know: it refuses the config.
    results = await actuator.apply(pods, "add_sub", 3, kind="KIND_NOT_A_KIND")
    assert len(results) == 1, "the rollout must stop at the first failed pod"
    failed = results[0]
    assert (failed.pod, failed.ok, failed.before, failed.after) == ("pod-a", False, 2, 2)
    assert "add_sub" in failed.reason and "\n" not in failed.reason
    assert (await actuator.live_counts(pods, "add_sub"))[0] == {"pod-a": 2, "pod-b": 2}
    assert await actuator.is_ready(pods[0], "add_sub")
    _infer_add_sub(pods[0])


async def test_an_unreachable_pod_is_a_failed_result_not_an_exception(two_pods) -> None:
    actuator = Actuator(two_pods[0][1].repository_key, timeout_s=1)
    gone = Endpoint("pod-gone", f"127.0.0.1:{free_port()}")
    results = await actuator.apply([gone, two_pods[0][0]], "add_sub", 2)
    assert [(r.pod, r.ok) for r in results] == [("pod-gone", False)]
    assert "cannot reach Triton" in results[0].reason
    with pytest.raises(ActuationError, match="pod-gone: cannot reach Triton"):
        await actuator.live_count(gone, "add_sub")


async def test_an_unknown_model_is_a_clear_failure(pods: list[Endpoint], two_pods) -> None:
    actuator = Actuator(two_pods[0][1].repository_key)
    counts, failures = await actuator.live_counts(pods, "no_such_model")
    assert counts == {}
    assert "no_such_model" in failures["pod-a"]


async def test_the_repository_key_never_appears_in_logs_messages_or_errors(
    pods: list[Endpoint], two_pods, caplog: pytest.LogCaptureFixture
) -> None:
    key = two_pods[0][1].repository_key
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    good = Actuator(key)
    seen += [repr(good)]
    seen += [repr(r) for r in await good.apply(pods, "add_sub", 2)]
    seen += [repr(r) for r in await good.apply(pods, "add_sub", 3, kind="KIND_NOT_A_KIND")]
    wrong = Actuator("not-" + key)
    refused = await wrong.apply(pods, "add_sub", 1)
    assert not refused[0].ok and "refused" in refused[0].reason
    seen += [repr(r) for r in refused]
    try:
        await wrong.live_count(Endpoint("gone", f"127.0.0.1:{free_port()}"), "add_sub")
    except ActuationError as error:
        seen.append(repr(error))
    text = "\n".join(seen + [record.getMessage() for record in caplog.records])
    assert "refused" in text
    assert key not in text


async def test_the_key_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, pods, two_pods
) -> None:
    monkeypatch.setenv("TRITONSCALE_REPOSITORY_KEY", two_pods[0][1].repository_key)
    assert (await Actuator().apply(pods[:1], "add_sub", 2))[0].ok
    monkeypatch.delenv("TRITONSCALE_REPOSITORY_KEY")
    result = (await Actuator().apply(pods[:1], "add_sub", 3))[0]
    assert not result.ok and "refused" in result.reason


def test_with_instances_keeps_the_kind_and_drops_the_generated_name() -> None:
    live = {
        "name": "m",
        "max_batch_size": 8,
        "instance_group": [
            {"name": "m_0", "kind": "KIND_GPU", "count": 1, "gpus": [0, 1]},
            {"name": "m_1", "kind": "KIND_GPU", "count": 2, "gpus": [2]},
        ],
    }
    assert instance_count(live) == 3
    same_kind = with_instances(live, 4)
    assert same_kind["instance_group"] == [{"kind": "KIND_GPU", "count": 4, "gpus": [0, 1]}]
    assert same_kind["max_batch_size"] == 8
    assert live["instance_group"][0]["count"] == 1, "the live config must not be modified"
    to_cpu = with_instances(live, 2, kind="KIND_CPU")
    assert to_cpu["instance_group"] == [{"kind": "KIND_CPU", "count": 2}]


def test_the_repository_api_refuses_a_load_without_the_key(pods: list[Endpoint]) -> None:
    # The counterfactual of the key tests: without the header Triton must refuse.
    response = requests.post(f"{pods[0].base_url}/v2/repository/models/add_sub/load", timeout=10)
    assert response.status_code != 200
