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


def repeat_stream(triton, requests: dict[str, tuple[list[int], list[int], int]]) -> list[tuple]:
    """Send (IN, DELAY, WAIT) per request id to repeat_int32 on one gRPC stream.

    Returns every response in arrival order as (request id, OUT, IDX, final); an error
    response as ("error", message, None, True).
    """
    arrived: queue.Queue = queue.Queue()
    client = tritonclient.grpc.InferenceServerClient(triton.grpc_url)
    client.start_stream(callback=lambda result, error: arrived.put((result, error)))
    try:
        for request_id, (values, delays, wait) in requests.items():
            arrays = {
                "IN": np.array(values, dtype=np.int32),
                "DELAY": np.array(delays, dtype=np.uint32),
                "WAIT": np.array([wait], dtype=np.uint32),
            }
            client.async_stream_infer(
                "repeat_int32",
                make_inputs("grpc", arrays),
                request_id=request_id,
                enable_empty_final_response=True,
            )
        responses: list[tuple] = []
        finals = 0
        while finals < len(requests):
            result, error = arrived.get(timeout=30)
            if error is not None:
                responses.append(("error", error.message(), None, True))
                finals += 1
                continue
            response = result.get_response()
            final = response.parameters["triton_final_response"].bool_param
            out, idx = result.as_numpy("OUT"), result.as_numpy("IDX")
            responses.append(
                (
                    response.id,
                    None if out is None else out.tolist(),
                    None if idx is None else idx.tolist(),
                    final,
                )
            )
            finals += final
        return responses
    finally:
        client.stop_stream()
        client.close()


def test_repeat_int32_passes_upstreams_repeat_client_check(triton):
    # examples/decoupled/repeat_client.py: IN [4, 2, 0, 1], DELAY [1, 2, 3, 4], WAIT 5, then
    # len(IN) responses for its request id whose OUT, in arrival order, is IN.
    responses = repeat_stream(triton, {"0": ([4, 2, 0, 1], [1, 2, 3, 4], 5)})
    results = [r for r in responses if r[1] is not None]
    assert [r[0] for r in results] == ["0"] * 4
    assert [r[1] for r in results] == [[4], [2], [0], [1]]
    assert [r[2] for r in results] == [[0], [1], [2], [3]]
    assert responses[-1] == ("0", None, None, True)


def test_repeat_int32_interleaves_the_responses_of_two_requests(triton):
    # WAIT 0: execute returns at once and takes the second request while the first one's
    # responses are still being sent, 150 ms apart.
    responses = repeat_stream(
        triton, {"a": ([10, 11, 12], [0, 150, 150], 0), "b": ([20, 21], [75, 150], 0)}
    )
    results = [r for r in responses if r[1] is not None]
    for request_id, values in (("a", [10, 11, 12]), ("b", [20, 21])):
        mine = [r for r in results if r[0] == request_id]
        assert [r[1] for r in mine] == [[v] for v in values]
        assert [r[2] for r in mine] == [[i] for i in range(len(values))]
    order = [r[0] for r in results]
    assert order.index("b") < len(order) - 1 - order[::-1].index("a"), order  # interleaved


def test_repeat_int32_with_no_values_sends_only_the_final_flag(triton):
    assert repeat_stream(triton, {"empty": ([], [], 0)}) == [("empty", None, None, True)]


def test_repeat_int32_refuses_in_and_delay_of_different_lengths(triton):
    responses = repeat_stream(triton, {"bad": ([1, 2], [1], 0), "good": ([7], [0], 0)})
    assert (
        "error",
        "repeat_int32: IN and DELAY must have the same shape, got [2] and [1]",
        None,
        True,
    ) in responses
    assert [r for r in responses if r[0] == "good"] == [
        ("good", [7], [0], False),
        ("good", None, None, True),
    ]
