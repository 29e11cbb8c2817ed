"""What the model tests share: a Triton client per protocol and numpy in, numpy out."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import tritonclient.grpc
import tritonclient.http
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from tritonscale.local.triton_server import LocalTriton

PROTOCOLS = ("http", "grpc")
_MODULES = {"http": tritonclient.http, "grpc": tritonclient.grpc}


@contextmanager
def connect(triton: LocalTriton, protocol: str) -> Iterator[Any]:
    """A client of the local server over `protocol` ("http" or "grpc")."""
    url = triton.http_url if protocol == "http" else triton.grpc_url
    client = _MODULES[protocol].InferenceServerClient(url)
    try:
        yield client
    finally:
        client.close()


def make_inputs(protocol: str, arrays: dict[str, np.ndarray]) -> list[Any]:
    """InferInputs for `protocol`, one per named array (object arrays become BYTES)."""
    inputs = []
    for name, array in arrays.items():
        infer_input = _MODULES[protocol].InferInput(
            name, list(array.shape), np_to_triton_dtype(array.dtype)
        )
        infer_input.set_data_from_numpy(array)
        inputs.append(infer_input)
    return inputs


def infer(
    client: Any, protocol: str, model: str, arrays: dict[str, np.ndarray], outputs: list[str]
) -> dict[str, np.ndarray]:
    """Run one request and return the named outputs as numpy arrays."""
    requested = [_MODULES[protocol].InferRequestedOutput(name) for name in outputs]
    result = client.infer(model, make_inputs(protocol, arrays), outputs=requested)
    return {name: result.as_numpy(name) for name in outputs}


def infer_error(client: Any, protocol: str, model: str, arrays: dict[str, np.ndarray]) -> str:
    """Run one request that must fail, and return the server's error message."""
    try:
        client.infer(model, make_inputs(protocol, arrays))
    except InferenceServerException as error:
        return error.message()
    raise AssertionError(f"{model} answered a request that should have failed")


def infer_concurrently(
    triton: LocalTriton,
    model: str,
    requests: list[dict[str, np.ndarray]],
    outputs: list[str],
    timeout_s: float = 120,
) -> list[dict[str, np.ndarray] | str]:
    """Send all requests at once over gRPC; per request, its outputs or its error message."""
    answers: dict[int, dict[str, np.ndarray] | str] = {}
    all_answered = threading.Event()
    lock = threading.Lock()

    def on_answer(index: int, result: Any, error: Any) -> None:
        with lock:
            if error is not None:
                answers[index] = error.message()
            else:
                answers[index] = {name: result.as_numpy(name) for name in outputs}
            if len(answers) == len(requests):
                all_answered.set()

    client = tritonclient.grpc.InferenceServerClient(triton.grpc_url)
    try:
        requested = [tritonclient.grpc.InferRequestedOutput(name) for name in outputs]
        for index, arrays in enumerate(requests):
            client.async_infer(
                model,
                make_inputs("grpc", arrays),
                outputs=requested,
                callback=lambda result, error, index=index: on_answer(index, result, error),
            )
        if not all_answered.wait(timeout=timeout_s):
            raise AssertionError(f"{model}: {len(answers)} of {len(requests)} requests answered")
    finally:
        client.close()
    return [answers[index] for index in range(len(requests))]


def stream_concurrently(
    triton: LocalTriton,
    model: str,
    requests: list[dict[str, np.ndarray]],
    outputs: list[str],
    timeout_s: float = 60,
) -> list[dict[str, np.ndarray] | str]:
    """Send all requests at once on one gRPC stream (the way to a decoupled model); per
    request, its outputs or its error message. Each request must get exactly one response."""
    arrived: queue.Queue = queue.Queue()
    client = tritonclient.grpc.InferenceServerClient(triton.grpc_url)
    client.start_stream(callback=lambda result, error: arrived.put((result, error)))
    answers: dict[int, dict[str, np.ndarray] | str] = {}
    unnamed_errors: list[str] = []
    try:
        requested = [tritonclient.grpc.InferRequestedOutput(name) for name in outputs]
        for index, arrays in enumerate(requests):
            client.async_stream_infer(
                model, make_inputs("grpc", arrays), request_id=str(index), outputs=requested
            )
        deadline = time.monotonic() + timeout_s
        while len(answers) + len(unnamed_errors) < len(requests):
            try:
                result, error = arrived.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"{model}: {len(answers)} of {len(requests)} requests answered "
                    f"in {timeout_s:.0f} s"
                ) from None
            if error is not None:
                unnamed_errors.append(error.message())
                continue
            index = int(result.get_response().id)
            assert index not in answers, f"{model}: request {index} answered twice"
            answers[index] = {name: result.as_numpy(name) for name in outputs}
    finally:
        client.stop_stream(cancel_requests=len(answers) + len(unnamed_errors) < len(requests))
        client.close()
    # tritonclient hands a stream's error responses over without their request id: give them
    # to the requests that got no result, in order (a test that needs to know which request
    # failed sends one failing request at a time, or checks the messages).
    missing = [index for index in range(len(requests)) if index not in answers]
    for index, message in zip(missing, unnamed_errors, strict=True):
        answers[index] = message
    return [answers[index] for index in range(len(requests))]
