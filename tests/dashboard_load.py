"""A short, real load on the local Triton over gRPC streaming, for the dashboard tests.

One stream per model, all sent at once: pipeline_async (a few requests with a NaN, which
fail alone), bls_async and bls_decoupled_async (which streams from square_int32).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

from tritonscale.local.triton_server import LocalTriton

MODELS = ("pipeline_async", "bls_async", "bls_decoupled_async")


def _inputs(model: str, index: int) -> list[Any]:
    rng = np.random.default_rng(index)
    if model == "pipeline_async":
        features = rng.standard_normal((1 + index % 3, 64)).astype(np.float32)
        if index % 50 == 7:
            features[0, 0] = np.nan  # a bad request: an error response, a failure counted
        arrays = {"FEATURES": features}
    elif model == "bls_async":
        arrays = {
            "INPUT0": rng.random(4, dtype=np.float32),
            "INPUT1": rng.random(4, dtype=np.float32),
        }
    else:
        arrays = {"IN": np.array([1 + index % 4], dtype=np.int32)}
    inputs = []
    for name, array in arrays.items():
        item = grpcclient.InferInput(
            name, list(array.shape), "FP32" if array.dtype == np.float32 else "INT32"
        )
        item.set_data_from_numpy(array)
        inputs.append(item)
    return inputs


def stream_load(
    triton: LocalTriton, requests_per_model: int = 150, timeout_s: float = 60
) -> dict[str, dict[str, int]]:
    """Send `requests_per_model` requests to each of MODELS; return answers and errors per model."""
    counts = {model: {"ok": 0, "error": 0} for model in MODELS}
    done = {model: threading.Event() for model in MODELS}
    lock = threading.Lock()
    clients = []

    def callback_for(model: str):
        def on_response(result: Any, error: Any) -> None:
            with lock:
                counts[model]["error" if error is not None else "ok"] += 1
                if sum(counts[model].values()) >= requests_per_model:
                    done[model].set()

        return on_response

    try:
        for model in MODELS:
            client = grpcclient.InferenceServerClient(triton.grpc_url)
            clients.append(client)
            client.start_stream(callback=callback_for(model))
            for index in range(requests_per_model):
                client.async_stream_infer(model, _inputs(model, index), request_id=str(index))
        for model in MODELS:
            if not done[model].wait(timeout_s):
                raise AssertionError(
                    f"{model}: only {counts[model]} of {requests_per_model} answered "
                    f"in {timeout_s:.0f} s"
                )
    finally:
        for client in clients:
            # Cancel what is still pending: a plain stop_stream() waits for every answer.
            client.stop_stream(cancel_requests=True)
            client.close()
    return counts
