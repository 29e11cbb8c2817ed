"""pipeline_gateway: the decoupled, micro-batched twin of pipeline_async, over gRPC streams."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http

from tests.model_clients import connect, infer, infer_error, stream_concurrently
from tests.test_pipeline import BRANCHES, OUTPUTS, assert_identical, assert_well_formed, features

GATEWAY = "pipeline_gateway"


def branch_requests(triton) -> dict[str, int]:
    """Requests each branch has answered since the server started."""
    with tritonclient.http.InferenceServerClient(triton.http_url) as client:
        return {
            branch: client.get_inference_statistics(branch)["model_stats"][0]["inference_stats"][
                "success"
            ]["count"]
            for branch in BRANCHES
        }


@pytest.mark.parametrize("rows", [1, 5, 32])
def test_the_gateway_gives_pipeline_syncs_outputs_bit_for_bit(triton, rows):
    batch = features(rows, seed=200 + rows)
    [from_gateway] = stream_concurrently(triton, GATEWAY, [{"FEATURES": batch}], OUTPUTS)
    with connect(triton, "grpc") as client:
        from_sync = infer(client, "grpc", "pipeline_sync", {"FEATURES": batch}, OUTPUTS)
    assert not isinstance(from_gateway, str), from_gateway
    assert_well_formed(from_gateway, rows)
    assert_identical(from_gateway, from_sync)


def test_a_burst_is_answered_once_each_in_shared_branch_calls(triton):
    requests = [{"FEATURES": features(1 + index % 3, seed=300 + index)} for index in range(120)]
    with connect(triton, "grpc") as client:
        expected = [
            infer(client, "grpc", "pipeline_sync", request, OUTPUTS) for request in requests
        ]
    before = branch_requests(triton)

    answers = stream_concurrently(triton, GATEWAY, requests, OUTPUTS)

    after = branch_requests(triton)
    for index, answer in enumerate(answers):
        assert not isinstance(answer, str), (index, answer)
        assert_identical(answer, expected[index])
    # The micro-batcher gathered the rows of many requests into each branch call.
    for branch in BRANCHES:
        assert 0 < after[branch] - before[branch] < len(requests) / 2, branch


def test_a_bad_request_in_a_burst_fails_alone(triton):
    requests = [{"FEATURES": features(1, seed=400 + index)} for index in range(40)]
    requests[17]["FEATURES"][0, 3] = np.inf
    answers = stream_concurrently(triton, GATEWAY, requests, OUTPUTS)

    errors = [answer for answer in answers if isinstance(answer, str)]
    assert errors == [f"{GATEWAY}: FEATURES must be finite, got 1 NaN or infinite value(s)"]
    with connect(triton, "grpc") as client:
        for index, answer in enumerate(answers):
            if index != 17:
                expected = infer(client, "grpc", "pipeline_sync", requests[index], OUTPUTS)
                assert_identical(answer, expected)


def test_the_gateway_is_reached_over_a_stream_only(triton):
    with connect(triton, "http") as client:
        message = infer_error(client, "http", GATEWAY, {"FEATURES": features(1, seed=1)})
    assert "decoupled" in message
