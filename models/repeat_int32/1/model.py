"""repeat_int32: a decoupled model that repeats IN back, one value per response.

The interface of python_backend's decoupled "repeat" example. For a request
with IN = [v0, v1, ...] and DELAY = [d0, d1, ...] (same length) it sends one
response per value: the i-th, after waiting DELAY[i] milliseconds, carries
OUT = [IN[i]] and IDX = [i]; then the final flag. IN of length 0 sends only
the final flag.

The responses go out from a thread of their own, and execute returns after
WAIT milliseconds, whether or not they have all been sent: so one instance
works on several requests at once, and their responses can interleave. A
request that is malformed (IN and DELAY of different lengths, a DELAY or WAIT
above MAX_MS) gets one error response, flagged final, and nothing else.
"""

import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

# The longest DELAY or WAIT accepted, in milliseconds: a request may hold this
# instance (WAIT) or a response thread (the sum of DELAY) only so long.
MAX_MS = 10_000
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        self.model_name = args["model_name"]
        self.senders = set()  # response threads still running
        self.lock = threading.Lock()

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1)
            delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy().reshape(-1)
            wait = int(pb_utils.get_input_tensor_by_name(request, "WAIT").as_numpy().reshape(-1)[0])

            problem = self.problem(values, delays, wait)
            if problem is not None:
                message = f"{self.model_name}: {problem}"
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)), FINAL)
                continue

            thread = threading.Thread(
                target=self.repeat, args=(sender, values.copy(), delays.copy()), daemon=True
            )
            with self.lock:
                self.senders.add(thread)
            thread.start()
            # Give Triton this instance back after WAIT ms, responses sent or not.
            time.sleep(wait / 1000.0)
        # Decoupled: responses go out through the senders.
        return None

    def problem(self, values, delays, wait):
        """Why this request cannot be served, or None."""
        if values.shape != delays.shape:
            return (
                f"IN and DELAY must have the same shape, got {list(values.shape)} "
                f"and {list(delays.shape)}"
            )
        if wait > MAX_MS or (delays.size and int(delays.max()) > MAX_MS):
            return f"DELAY and WAIT must be at most {MAX_MS} ms"
        return None

    def repeat(self, sender, values, delays):
        try:
            for index, (value, delay) in enumerate(zip(values, delays, strict=True)):
                time.sleep(int(delay) / 1000.0)
                if sender.is_cancelled():
                    break  # the client has gone: no more responses
                sender.send(
                    pb_utils.InferenceResponse(
                        output_tensors=[
                            pb_utils.Tensor("OUT", np.array([value], dtype=np.int32)),
                            pb_utils.Tensor("IDX", np.array([index], dtype=np.uint32)),
                        ]
                    )
                )
            sender.send(flags=FINAL)
        finally:
            with self.lock:
                self.senders.discard(threading.current_thread())

    def finalize(self):
        # Let the response threads finish their requests, within a bound: the
        # longest a request can take is len(IN) * MAX_MS, so do not wait for ever.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with self.lock:
                if not self.senders:
                    return
            time.sleep(0.05)
