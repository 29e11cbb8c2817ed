"""What the model tests share: a Triton client per protocol and numpy in, numpy out."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import tritonclient.grpc
import tritonclient.http
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from tritonscale.local_triton import LocalTriton

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
