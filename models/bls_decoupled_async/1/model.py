"""bls_decoupled_async: SUM = 2 * IN * IN, by two concurrent BLS streams.

The interface of python_backend's decoupled BLS example (async half). execute
is a coroutine: for each request it starts two async_exec(decoupled=True)
calls to square_int32 and awaits both with asyncio.gather. Each call yields
that model's whole response stream; the OUT values of both streams add up to
two times IN squared.

Each finished stream is held until python_backend has let go of it (see
`FinishedStreams`, the same as in bls_decoupled_sync): Triton 2.51 otherwise
frees it on a thread that does not hold the GIL, and the stub dies of a
corrupted heap under bursts.
"""

import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils

STREAMS = 2


class FinishedStreams:
    """Decoupled BLS response streams, kept alive until python_backend has dropped them.

    python_backend (Triton 2.51 and later) keeps its own reference to every decoupled BLS
    response stream and drops it on its stub-to-parent thread, which does not take the
    GIL. When that reference is the last one, the stream's numpy arrays are freed there,
    racing this model's own Python code, and the heap corrupts (a segfault in CPython's
    allocator some time later). Holding each finished stream until a later
    `request.is_cancelled()` has made a round trip through that same thread (its queue is
    first in, first out) makes the model's reference the last one, released with the GIL.
    """

    def __init__(self):
        self._held = []

    def hold(self, stream):
        self._held.append(stream)
        return stream

    def release_after_round_trip(self, request):
        # is_cancelled() only goes to the parent while the request is not cancelled; a
        # cancelled request answers from a cache, so keep the streams for the next call.
        if not request.is_cancelled():
            self._held.clear()


class TritonPythonModel:
    def initialize(self, args):
        self.model_name = args["model_name"]
        self.finished_streams = FinishedStreams()

    async def execute(self, requests):
        responses = await asyncio.gather(*(self.square_twice(request) for request in requests))
        self.finished_streams.release_after_round_trip(requests[-1])
        return list(responses)

    async def square_twice(self, request):
        in_tensor = pb_utils.get_input_tensor_by_name(request, "IN")
        calls = [
            pb_utils.InferenceRequest(
                model_name="square_int32", requested_output_names=["OUT"], inputs=[in_tensor]
            ).async_exec(decoupled=True)
            for _ in range(STREAMS)
        ]
        streams = [self.finished_streams.hold(s) for s in await asyncio.gather(*calls)]

        total = np.zeros(1, dtype=np.int32)
        error = None
        for stream in streams:
            for bls_response in stream:
                if bls_response.has_error():
                    error = error or bls_response.error().message()
                    continue
                # The final response of a stream carries the flag and no outputs.
                out = pb_utils.get_output_tensor_by_name(bls_response, "OUT")
                if out is not None:
                    total += out.as_numpy().reshape(1)

        if error is not None:
            message = f"{self.model_name}: square_int32 failed: {error}"
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("SUM", total)])
