"""bls_decoupled_async: SUM = 2 * IN * IN, by two concurrent BLS streams.

The interface of python_backend's decoupled BLS example (async half). execute
is a coroutine: for each request it starts two async_exec(decoupled=True)
calls to square_int32 and awaits both with asyncio.gather. Each call yields
that model's whole response stream; the OUT values of both streams add up to
two times IN squared.
"""

import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils

STREAMS = 2


class TritonPythonModel:
    def initialize(self, args):
        self.model_name = args["model_name"]

    async def execute(self, requests):
        return list(await asyncio.gather(*(self.square_twice(request) for request in requests)))

    async def square_twice(self, request):
        in_tensor = pb_utils.get_input_tensor_by_name(request, "IN")
        calls = [
            pb_utils.InferenceRequest(
                model_name="square_int32", requested_output_names=["OUT"], inputs=[in_tensor]
            ).async_exec(decoupled=True)
            for _ in range(STREAMS)
        ]
        streams = await asyncio.gather(*calls)

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
