"""bls_decoupled_sync: SUM = IN * IN, by a blocking BLS call to a decoupled model.

The interface of python_backend's decoupled BLS example (sync half). For each
request it calls square_int32 with exec(decoupled=True), which returns an
iterator over that model's response stream; the OUT values of the stream add
up to IN squared. The last response of the stream carries only the final
flag and no outputs.

Each finished stream is held until python_backend has let go of it (see
`FinishedStreams`): Triton 2.51 otherwise frees it on a thread that does not
hold the GIL, and the stub dies of a corrupted heap under bursts.

A bounded wait: the call runs on a small thread pool and execute waits for it
at most `answer_deadline_us` (config.pbtxt). A stream that never ends (Triton
2.51 leaves the requests of a dead square_int32 stub pending for ever) then
costs that request an error response, not its client a hang.
"""

import json
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as CallTimeout

import numpy as np
import triton_python_backend_utils as pb_utils

# Threads that make the BLS calls. A call that outlives the deadline keeps its
# thread; while one does, requests fail at once instead of each waiting out the
# deadline behind it (a dead callee would otherwise hold a queue of requests,
# and any reload of this model, for a deadline each).
CALLERS = 4


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
        self.deadline_s = answer_deadline_s(json.loads(args["model_config"]))
        self.finished_streams = FinishedStreams()
        self.callers = ThreadPoolExecutor(CALLERS, thread_name_prefix=f"{self.model_name}-bls")
        self.overdue = set()  # calls that outlived the deadline and have not returned

    def execute(self, requests):
        # One call at a time, as before; each waited for at most the deadline.
        responses = []
        for request in requests:
            if self.overdue:
                message = (
                    f"{self.model_name}: a call to square_int32 has not finished its stream "
                    f"{self.deadline_s:g} s after it started; not sending more until it does"
                )
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)))
                continue
            call = self.callers.submit(self.square, request)
            try:
                responses.append(call.result(timeout=self.deadline_s))
            except CallTimeout:
                self.overdue.add(call)
                call.add_done_callback(self.overdue.discard)
                message = (
                    f"{self.model_name}: square_int32 did not finish its stream within "
                    f"{self.deadline_s:g} s"
                )
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)))
        self.finished_streams.release_after_round_trip(requests[-1])
        return responses

    def finalize(self):
        # Threads stuck in a call that never ends must not hold the unload.
        self.callers.shutdown(wait=False, cancel_futures=True)

    def square(self, request):
        bls_request = pb_utils.InferenceRequest(
            model_name="square_int32",
            requested_output_names=["OUT"],
            inputs=[pb_utils.get_input_tensor_by_name(request, "IN")],
        )

        total = np.zeros(1, dtype=np.int32)
        error = None
        # Read the stream to its end even after an error, so that the called
        # model's responses are all consumed.
        stream = self.finished_streams.hold(bls_request.exec(decoupled=True))
        for bls_response in stream:
            if bls_response.has_error():
                error = error or bls_response.error().message()
                continue
            out = pb_utils.get_output_tensor_by_name(bls_response, "OUT")
            if out is not None:
                total += out.as_numpy().reshape(1)

        if error is not None:
            message = f"{self.model_name}: square_int32 failed: {error}"
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("SUM", total)])


def answer_deadline_s(model_config):
    """`answer_deadline_us` of config.pbtxt, in seconds (30 s when absent)."""
    parameters = model_config.get("parameters", {})
    return int(parameters.get("answer_deadline_us", {}).get("string_value", "30000000")) / 1e6
