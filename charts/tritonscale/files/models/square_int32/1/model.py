"""square_int32: a decoupled model that answers IN with IN responses.

The interface of python_backend's decoupled "square" example. For a request
with IN = n it sends n responses, each with OUT = n, and then the final flag,
so the responses add up to n squared. IN = 0 sends only the final flag.

A decoupled model answers through each request's response sender instead of
returning responses from execute. Here the responses are sent from execute
itself, in order: simple, and each stream is short.
"""

import numpy as np
import triton_python_backend_utils as pb_utils

# The BLS models that call this one add the responses up in INT32
# (bls_decoupled_async adds two streams: 2 * n * n). 32767 is the largest n
# for which that sum still fits, and it bounds how long one request can hold
# this instance.
MAX_IN = 32767


class TritonPythonModel:
    def initialize(self, args):
        self.model_name = args["model_name"]

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1)[0])

            if not 0 <= n <= MAX_IN:
                message = f"{self.model_name}: IN must be between 0 and {MAX_IN}, got {n}"
                sender.send(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError(message)),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
                continue

            out = pb_utils.Tensor("OUT", np.array([n], dtype=np.int32))
            for _ in range(n):
                # A client that went away needs no more responses.
                if sender.is_cancelled():
                    break
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        # Decoupled models return None: the responses went out through the senders.
        return None
