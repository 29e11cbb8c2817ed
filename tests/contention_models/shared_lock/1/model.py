"""shared_lock: IN [1] -> OUT [1] (OUT = IN), holding each request `hold_ms`.

With `shared_lock` "true" the hold happens under an OS file lock (fcntl.flock on a file in
the model's folder) that every instance of the model takes: the instances run one at a
time, whatever their count, as instances behind one shared resource do (a GPU, a lock, a
connection pool). Each waiting instance is still inside `execute`, busy in Triton's eyes.
"""

import fcntl
import json
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.hold_s = float(parameters["hold_ms"]["string_value"]) / 1000.0
        self.locked = parameters["shared_lock"]["string_value"] == "true"
        self.lock_path = os.path.join(args["model_repository"], "shared.lock")

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if self.locked:
                with open(self.lock_path, "a") as lock:
                    fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
                    time.sleep(self.hold_s)
            else:
                time.sleep(self.hold_s)
            responses.append(
                pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUT", value)])
            )
        return responses
