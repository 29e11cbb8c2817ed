"""Bursts of streamed requests to the decoupled BLS models: every request is answered, every time.

Triton 2.51's python_backend frees a finished decoupled BLS stream on a thread that does not
hold the GIL when python_backend holds the last reference to it; under bursts that corrupted
the stub's heap and the stub died, leaving its requests (and those of every model streaming
from it) pending for ever. The models now keep each finished stream until python_backend has
let go of it (models/README.md). This test sends the burst that used to kill a stub, after a
few hundred malformed requests as in the original report, round after round, on a server of
its own: a dead stub must never leave the session's shared server hung.
"""

from __future__ import annotations

import queue
import re
import time

import numpy as np
import pytest
import requests
import tritonclient.grpc
from tritonclient.utils import InferenceServerException

from tests.faults import stub_pids
from tests.model_clients import connect, make_inputs
from tritonscale.local.triton_server import LocalTriton

MODELS = {"bls_decoupled_sync": 1, "bls_decoupled_async": 2}  # SUM = times * IN * IN
BURST = 300
ROUNDS = 8
ROUND_DEADLINE_S = 30.0  # a burst answers in about a second; this is a hang


@pytest.fixture(scope="module")
def server(make_module_triton) -> LocalTriton:
    return make_module_triton(["square_int32", *MODELS])


def pending_requests(server: LocalTriton) -> dict[str, int]:
    """Triton's nv_inference_pending_request_count per model (0s omitted)."""
    text = requests.get(server.metrics_url, timeout=10).text
    pending = {}
    for model, value in re.findall(
        r'^nv_inference_pending_request_count\{model="([^"]+)".*\} (\S+)$', text, re.MULTILINE
    ):
        if float(value):
            pending[model] = int(float(value))
    return pending


def burst(server: LocalTriton, model: str, values: list[int]) -> dict[str, int]:
    """Send every value at once on one gRPC stream; per request id, its SUM.

    Fails, naming the model, what arrived and what Triton still holds, when the burst is not
    answered within ROUND_DEADLINE_S: a hang fails fast, it never waits out the suite.
    """
    arrived: queue.Queue = queue.Queue()
    client = tritonclient.grpc.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: arrived.put((result, error)))
    sums: dict[str, int] = {}
    errors: list[str] = []
    try:
        for index, value in enumerate(values):
            client.async_stream_infer(
                model,
                make_inputs("grpc", {"IN": np.array([value], np.int32)}),
                request_id=str(index),
            )
        deadline = time.monotonic() + ROUND_DEADLINE_S
        while len(sums) + len(errors) < len(values):
            try:
                result, error = arrived.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if error is not None:
                errors.append(error.message())
            else:
                sums[result.get_response().id] = int(result.as_numpy("SUM")[0])
    finally:
        # A server that holds the stream would keep a plain stop_stream() waiting for ever.
        client.stop_stream(cancel_requests=len(sums) < len(values))
        client.close()
    if len(sums) < len(values):
        died = [line for line in server.log_path.read_text().splitlines() if "not healthy" in line]
        pytest.fail(
            f"{model}: {len(sums)} of {len(values)} answered in {ROUND_DEADLINE_S:.0f} s, "
            f"{len(errors)} errors (first: {errors[:1]}); pending in Triton: "
            f"{pending_requests(server)}; stub deaths logged: {died[:1]}",
            pytrace=False,
        )
    return sums


def malformed_requests(server: LocalTriton, count: int) -> None:
    """Requests every model must refuse (wrong dtype, shape, missing or extra input)."""
    shapes = [
        {"IN": np.array([2], np.float32)},
        {"IN": np.array([[2, 3]], np.int32)},
        {},
        {"IN": np.array([2], np.int32), "EXTRA": np.array([1], np.int32)},
        {"IN": np.zeros([0], np.int32)},
    ]
    with connect(server, "http") as client:
        for index in range(count):
            model = list(MODELS)[index % len(MODELS)]
            with pytest.raises(InferenceServerException):
                client.infer(model, make_inputs("http", shapes[index % len(shapes)]))


def test_bursts_after_malformed_requests_are_answered_every_round(server):
    stubs_before = {model: stub_pids(server, model) for model in MODELS}
    malformed_requests(server, count=300)
    values = [1 + index % 8 for index in range(BURST)]
    for round_number in range(ROUNDS):
        for model, times in MODELS.items():
            sums = burst(server, model, values)
            wrong = {
                index: total
                for index, total in sums.items()
                if total != times * values[int(index)] ** 2
            }
            assert wrong == {}, f"{model} round {round_number + 1}: wrong sums {wrong}"
    # No stub died and was replaced along the way, and nothing is left pending.
    assert {model: stub_pids(server, model) for model in MODELS} == stubs_before
    assert pending_requests(server) == {}
