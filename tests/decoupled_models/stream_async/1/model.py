"""stream_async: each request is a stream of two responses, MS milliseconds long in all.

A decoupled model with `async def execute`: python_backend runs the coroutine in the
background and hands the model the next requests at once, so many streams overlap in one
instance, and Triton's counters see each request only until execute has been started.
The model exports the streams it holds open as a gauge of its own,
`tritonscale_model_streams_in_flight{model, version}` (python_backend custom metrics): the
signal the operator sizes such a model by.
"""

import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils

RESPONSES = 2


class TritonPythonModel:
    def initialize(self, args):
        # The family must outlive its metrics: keep both on the model.
        self.streams_family = pb_utils.MetricFamily(
            name="tritonscale_model_streams_in_flight",
            description="Decoupled requests whose final response is not sent yet",
            kind=pb_utils.MetricFamily.GAUGE,
        )
        self.streams = self.streams_family.Metric(
            labels={"model": args["model_name"], "version": args["model_version"]}
        )

    async def execute(self, requests):
        await asyncio.gather(*(self.stream(request) for request in requests))
        return None

    async def stream(self, request):
        self.streams.increment(1)
        try:
            sender = request.get_response_sender()
            ms = int(pb_utils.get_input_tensor_by_name(request, "MS").as_numpy().reshape(-1)[0])
            out = pb_utils.Tensor("OUT", np.array([ms], dtype=np.int32))
            for _ in range(RESPONSES):
                await asyncio.sleep(ms / 1000 / RESPONSES)
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        finally:
            self.streams.increment(-1)
