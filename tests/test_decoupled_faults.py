"""The decoupled BLS models never hang a client, even when the model they stream from dies.

Triton 2.51 leaves the streams of a dead square_int32 stub open for ever: a BLS call reading
one would wait for ever. bls_decoupled_sync and bls_decoupled_async bound that wait
(`answer_deadline_us`) and answer with an error. The server is the test's own: a dead stub is
never healed here.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.faults import kill_stub
from tests.model_clients import connect, infer, infer_concurrently
from tests.test_pipeline import config_override
from tritonscale.local.triton_server import LocalTriton

MODELS = {"bls_decoupled_sync": 1, "bls_decoupled_async": 2}
DEADLINE_S = 2


@pytest.fixture(scope="module")
def server(make_module_triton) -> LocalTriton:
    return make_module_triton(["square_int32", *MODELS])


def requests(count: int) -> list[dict[str, np.ndarray]]:
    return [{"IN": np.array([3 + index % 4], dtype=np.int32)} for index in range(count)]


def test_a_dead_callee_costs_each_request_an_error_not_a_hang(server):
    deadline = {"answer_deadline_us": str(DEADLINE_S * 1_000_000)}
    with (
        config_override(server, "bls_decoupled_sync", deadline),
        config_override(server, "bls_decoupled_async", deadline),
    ):
        with connect(server, "grpc") as client:
            for model, times in MODELS.items():
                assert infer(client, "grpc", model, requests(1)[0], ["SUM"])["SUM"] == [times * 9]

        kill_stub(server, "square_int32")

        for model in MODELS:
            # Several rounds, so that calls stuck on the dead stub pile up: whatever the
            # number, every request is answered (an error), none waits for ever.
            for _ in range(2):
                answers = infer_concurrently(server, model, requests(6), ["SUM"], timeout_s=60)
                for answer in answers:
                    assert isinstance(answer, str), f"{model} answered {answer} with square dead"
                    assert answer.startswith(f"{model}: ") and "square_int32" in answer, answer
