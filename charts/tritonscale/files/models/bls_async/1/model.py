"""bls_async: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, by async BLS.

The interface of python_backend's async BLS example. execute is a coroutine:
for each request it sends the inputs to two models at once with async_exec()
and awaits both with asyncio.gather, then takes OUTPUT0 from "pytorch" and
OUTPUT1 from "add_sub" (as upstream does). All requests of one execute call
fan out together, so their BLS calls overlap too.

A failed call gives that request an error response; its neighbours still get
their results.
"""

import asyncio

import triton_python_backend_utils as pb_utils

# (model, the output this model takes from it)
FAN_OUT = (("pytorch", "OUTPUT0"), ("add_sub", "OUTPUT1"))


class TritonPythonModel:
    def initialize(self, args):
        self.model_name = args["model_name"]

    async def execute(self, requests):
        return list(await asyncio.gather(*(self.forward(request) for request in requests)))

    async def forward(self, request):
        inputs = [
            pb_utils.get_input_tensor_by_name(request, "INPUT0"),
            pb_utils.get_input_tensor_by_name(request, "INPUT1"),
        ]
        # async_exec() returns an awaitable at once; gather waits for both, so
        # the two models work on this request at the same time.
        calls = [
            pb_utils.InferenceRequest(
                model_name=model, requested_output_names=[output], inputs=inputs
            ).async_exec()
            for model, output in FAN_OUT
        ]
        bls_responses = await asyncio.gather(*calls)

        outputs = []
        for (model, output), bls_response in zip(FAN_OUT, bls_responses, strict=True):
            if bls_response.has_error():
                message = (
                    f"{self.model_name}: model '{model}' failed: {bls_response.error().message()}"
                )
                return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))
            outputs.append(pb_utils.get_output_tensor_by_name(bls_response, output))
        return pb_utils.InferenceResponse(output_tensors=outputs)
