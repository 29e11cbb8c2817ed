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

A bounded wait: the streams are read on the event loop's executor, not on the
loop, and each request waits for its two streams at most `answer_deadline_us`
(config.pbtxt). A stream that never ends (Triton 2.51 leaves the requests of
a dead square_int32 stub pending for ever) then costs that request an error
response, not its client a hang.
"""

import asyncio
import json

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
        parameters = json.loads(args["model_config"]).get("parameters", {})
        deadline_us = parameters.get("answer_deadline_us", {}).get("string_value", "30000000")
        self.deadline_s = int(deadline_us) / 1e6
        self.finished_streams = FinishedStreams()
        # Stream reads that outlived the deadline and have not returned: while one
        # does, requests fail at once instead of each waiting out the deadline.
        self.overdue = set()

    async def execute(self, requests):
        responses = await asyncio.gather(*(self.bounded(request) for request in requests))
        self.finished_streams.release_after_round_trip(requests[-1])
        return list(responses)

    async def bounded(self, request):
        if self.overdue:
            message = (
                f"{self.model_name}: square_int32 has not finished a stream "
                f"{self.deadline_s:g} s after it started; not sending more until it does"
            )
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))
        reads = set()
        try:
            return await asyncio.wait_for(self.square_twice(request, reads), self.deadline_s)
        except asyncio.TimeoutError:
            for read in reads:
                if not read.done():
                    self.overdue.add(read)
                    read.add_done_callback(self.overdue.discard)
            message = (
                f"{self.model_name}: square_int32 did not finish its streams within "
                f"{self.deadline_s:g} s"
            )
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))

    async def square_twice(self, request, reads):
        in_tensor = pb_utils.get_input_tensor_by_name(request, "IN")
        calls = [
            pb_utils.InferenceRequest(
                model_name="square_int32", requested_output_names=["OUT"], inputs=[in_tensor]
            ).async_exec(decoupled=True)
            for _ in range(STREAMS)
        ]
        streams = [self.finished_streams.hold(s) for s in await asyncio.gather(*calls)]

        # Reading a stream blocks until its next response: off the loop, so that
        # the deadline above can fire.
        read = asyncio.get_running_loop().run_in_executor(None, add_up, streams)
        reads.add(read)
        # Shielded: on the deadline the read goes on (its thread cannot be stopped), and
        # `bounded` keeps it in `overdue` until it returns.
        total, error = await asyncio.shield(read)

        if error is not None:
            message = f"{self.model_name}: square_int32 failed: {error}"
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("SUM", total)])


def add_up(streams):
    """(the sum of OUT over every response, the first error message or None)."""
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
    return total, error
