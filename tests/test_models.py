"""The python_backend example models, over HTTP and gRPC, against a real tritonserver."""

from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc

from tests.model_clients import (
    PROTOCOLS,
    connect,
    infer,
    infer_concurrently,
    infer_error,
    make_inputs,
)

ADD_SUB_OUTPUTS = ["OUTPUT0", "OUTPUT1"]


def add_sub_inputs(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "INPUT0": rng.random(4, dtype=np.float32),
        "INPUT1": rng.random(4, dtype=np.float32),
    }


def model_name(name: str) -> np.ndarray:
    return np.array([name.encode()], dtype=np.object_)


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("model", ["add_sub", "pytorch", "bls_async"])
def test_sum_and_difference(triton, protocol, model):
    arrays = add_sub_inputs(seed=1)
    with connect(triton, protocol) as client:
        result = infer(client, protocol, model, arrays, ADD_SUB_OUTPUTS)
    assert np.array_equal(result["OUTPUT0"], arrays["INPUT0"] + arrays["INPUT1"])
    assert np.array_equal(result["OUTPUT1"], arrays["INPUT0"] - arrays["INPUT1"])


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("target", ["add_sub", "pytorch", "bls_async"])
def test_bls_sync_forwards_to_the_named_model(triton, protocol, target):
    arrays = add_sub_inputs(seed=2) | {"MODEL_NAME": model_name(target)}
    with connect(triton, protocol) as client:
        result = infer(client, protocol, "bls_sync", arrays, ADD_SUB_OUTPUTS)
    assert np.array_equal(result["OUTPUT0"], arrays["INPUT0"] + arrays["INPUT1"])
    assert np.array_equal(result["OUTPUT1"], arrays["INPUT0"] - arrays["INPUT1"])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bls_sync_names_an_unknown_model_in_its_error(triton, protocol):
    arrays = add_sub_inputs(seed=3) | {"MODEL_NAME": model_name("undefined_model")}
    with connect(triton, protocol) as client:
        message = infer_error(client, protocol, "bls_sync", arrays)
        assert "bls_sync could not run model 'undefined_model'" in message
        assert "not ready" in message
        # The failed forward left the model serving.
        result = infer(
            client,
            protocol,
            "bls_sync",
            arrays | {"MODEL_NAME": model_name("add_sub")},
            ADD_SUB_OUTPUTS,
        )
    assert np.array_equal(result["OUTPUT0"], arrays["INPUT0"] + arrays["INPUT1"])


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bls_sync_refuses_to_forward_to_itself(triton, protocol):
    # With one instance, bls_sync calling bls_sync would wait for itself forever.
    arrays = add_sub_inputs(seed=4) | {"MODEL_NAME": model_name("bls_sync")}
    with connect(triton, protocol) as client:
        message = infer_error(client, protocol, "bls_sync", arrays)
    assert "bls_sync cannot forward to itself" in message


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize(
    ("model", "times"), [("bls_decoupled_sync", 1), ("bls_decoupled_async", 2)]
)
@pytest.mark.parametrize("value", [4, 2, 0, 1, 300])
def test_decoupled_bls_sums_the_stream(triton, protocol, model, times, value):
    arrays = {"IN": np.array([value], dtype=np.int32)}
    with connect(triton, protocol) as client:
        result = infer(client, protocol, model, arrays, ["SUM"])
    assert result["SUM"].dtype == np.int32
    assert result["SUM"].tolist() == [times * value * value]


def stream(triton, requests: list[tuple[str, int]]) -> dict[str, list]:
    """Send (request id, IN) pairs to square_int32 on one gRPC stream.

    Returns, per request id, the responses in arrival order as (OUT or None,
    final flag); errors come back under the key "error" as messages.
    """
    arrived: queue.Queue = queue.Queue()
    client = tritonclient.grpc.InferenceServerClient(triton.grpc_url)
    client.start_stream(callback=lambda result, error: arrived.put((result, error)))
    try:
        for request_id, value in requests:
            client.async_stream_infer(
                "square_int32",
                make_inputs("grpc", {"IN": np.array([value], dtype=np.int32)}),
                request_id=request_id,
                enable_empty_final_response=True,
            )
        responses: dict[str, list] = {}
        finals = 0
        while finals < len(requests):
            result, error = arrived.get(timeout=30)
            if error is not None:
                # An error response is also the final one of its request.
                responses.setdefault("error", []).append(error.message())
                finals += 1
                continue
            response = result.get_response()
            final = response.parameters["triton_final_response"].bool_param
            out = result.as_numpy("OUT")
            responses.setdefault(response.id, []).append(
                (None if out is None else out.tolist(), final)
            )
            finals += final
        return responses
    finally:
        client.stop_stream()
        client.close()


def test_square_int32_streams_in_responses_then_the_final_flag(triton):
    values = {"0": 4, "1": 2, "2": 0, "3": 1}
    responses = stream(triton, list(values.items()))
    for request_id, value in values.items():
        # value responses carrying OUT = value, then one empty final response.
        assert responses[request_id] == [([value], False)] * value + [(None, True)]
    assert "error" not in responses


def test_square_int32_with_in_zero_sends_only_the_final_flag(triton):
    assert stream(triton, [("zero", 0)]) == {"zero": [(None, True)]}


@pytest.mark.parametrize("value", [-1, 32768])
def test_square_int32_rejects_an_out_of_range_in(triton, value):
    responses = stream(triton, [("bad", value), ("good", 2)])
    assert responses["error"] == [f"square_int32: IN must be between 0 and 32767, got {value}"]
    # The neighbour on the same stream is served.
    assert responses["good"] == [([2], False), ([2], False), (None, True)]


@pytest.mark.parametrize("model", ["bls_decoupled_sync", "bls_decoupled_async"])
def test_decoupled_bls_passes_on_the_called_models_error(triton, model):
    with connect(triton, "http") as client:
        message = infer_error(client, "http", model, {"IN": np.array([-5], dtype=np.int32)})
    assert message.startswith(f"{model}: square_int32 failed: ")
    assert "IN must be between 0 and 32767, got -5" in message


def test_bls_async_answers_200_concurrent_requests(triton):
    rng = np.random.default_rng(5)
    requests = [
        {"INPUT0": rng.random(4, dtype=np.float32), "INPUT1": rng.random(4, dtype=np.float32)}
        for _ in range(200)
    ]
    answers = infer_concurrently(triton, "bls_async", requests, ADD_SUB_OUTPUTS)

    assert [answer for answer in answers if isinstance(answer, str)] == []
    for request, answer in zip(requests, answers, strict=True):
        # Each answer belongs to its own request, not to a neighbour's.
        assert np.array_equal(answer["OUTPUT0"], request["INPUT0"] + request["INPUT1"])
        assert np.array_equal(answer["OUTPUT1"], request["INPUT0"] - request["INPUT1"])
