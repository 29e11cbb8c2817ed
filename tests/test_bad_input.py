"""Bad requests get a clear error, and the server and the model stay ready."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
import requests

from tests.model_clients import PROTOCOLS, connect, infer, infer_error

FOUR = np.arange(4, dtype=np.float32)
GOOD = {
    "add_sub": {"INPUT0": FOUR, "INPUT1": FOUR},
    "pipeline_async": {"FEATURES": np.ones((1, 64), dtype=np.float32)},
    "pipeline_sync": {"FEATURES": np.ones((1, 64), dtype=np.float32)},
    "bls_decoupled_async": {"IN": np.array([3], dtype=np.int32)},
}
FIRST_OUTPUT = {
    "add_sub": "OUTPUT0",
    "pipeline_async": "SCORE",
    "pipeline_sync": "SCORE",
    "bls_decoupled_async": "SUM",
}


@dataclass(frozen=True)
class BadRequest:
    model: str
    arrays: Callable[[], dict[str, np.ndarray]]  # built when the test runs
    error: str  # the error message must contain this
    serving: str = ""  # the model that must still answer afterwards, if not `model`


def with_nan() -> dict[str, np.ndarray]:
    rows = np.ones((3, 64), dtype=np.float32)
    rows[1, 7] = np.nan
    return {"FEATURES": rows}


CASES = {
    "wrong dtype": BadRequest(
        "add_sub",
        lambda: {"INPUT0": FOUR.astype(np.int32), "INPUT1": FOUR},
        "inference input 'INPUT0' data-type is 'INT32', but model 'add_sub' expects 'FP32'",
    ),
    "wrong dtype, batched model": BadRequest(
        "pipeline_async",
        lambda: {"FEATURES": np.ones((1, 64), dtype=np.float64)},
        "data-type is 'FP64', but model 'pipeline_async' expects 'FP32'",
    ),
    "wrong shape": BadRequest(
        "add_sub",
        lambda: {"INPUT0": np.zeros(5, dtype=np.float32), "INPUT1": FOUR},
        "unexpected shape for input 'INPUT0' for model 'add_sub'. Expected [4], got [5]",
    ),
    "wrong width": BadRequest(
        "pipeline_sync",
        lambda: {"FEATURES": np.ones((1, 63), dtype=np.float32)},
        "unexpected shape for input 'FEATURES' for model 'pipeline_sync'. Expected [-1,64]",
    ),
    "missing input": BadRequest(
        "add_sub",
        lambda: {"INPUT0": FOUR},
        "missing required input(s) ['INPUT1']",
    ),
    "unknown model": BadRequest(
        "no_such_model",
        lambda: {"INPUT0": FOUR},
        "'no_such_model' is not found",
        serving="add_sub",
    ),
    "huge tensor, batched model": BadRequest(
        "pipeline_async",
        lambda: {"FEATURES": np.ones((250_000, 64), dtype=np.float32)},  # 64 MB
        "inference request batch-size must be <= 32 for 'pipeline_async'",
    ),
    "huge tensor": BadRequest(
        "add_sub",
        lambda: {"INPUT0": np.ones(16_000_000, dtype=np.float32), "INPUT1": FOUR},  # 64 MB
        "Expected [4], got [16000000]",
    ),
    "non-finite values": BadRequest(
        "pipeline_async",
        with_nan,
        "pipeline_async: FEATURES must be finite, got 1 NaN or infinite value(s)",
    ),
    "IN out of range for a decoupled model": BadRequest(
        "bls_decoupled_async",
        lambda: {"IN": np.array([1 << 30], dtype=np.int32)},
        "IN must be between 0 and 32767, got 1073741824",
    ),
}


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_bad_request_gets_a_clear_error_and_nothing_breaks(triton, protocol, case):
    with connect(triton, protocol) as client:
        message = infer_error(client, protocol, case.model, case.arrays())
        assert case.error in message

        serving = case.serving or case.model
        assert client.is_server_ready()
        assert client.is_model_ready(serving)
        output = FIRST_OUTPUT[serving]
        assert infer(client, protocol, serving, GOOD[serving], [output])[output].size > 0


def test_data_that_does_not_match_its_shape_is_refused(triton):
    # JSON input whose data holds 3 values where the shape says 4: tritonclient
    # cannot send this, a hand-written client can.
    body = {
        "inputs": [
            {"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3]},
            {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]},
        ]
    }
    url = f"http://{triton.http_url}/v2/models/add_sub/infer"
    response = requests.post(url, json=body, timeout=30)
    # Triton answers 500 here (it counts a parse failure as internal); either way
    # the client learns what is wrong.
    assert not response.ok
    assert "Shape does not match true shape of 'data' field" in response.json()["error"]

    ready = requests.get(f"http://{triton.http_url}/v2/models/add_sub/ready", timeout=30)
    assert ready.status_code == 200
