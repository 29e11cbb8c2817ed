"""hang_on_reload: add_sub's answers, and an initialize() that hangs on demand.

Asked for more instances than the `hang_above_instances` parameter, each new instance waits
in initialize() until a file named `release` appears in the model's folder (at most 10
minutes): the load that asked for them does not finish, while the instances already there
keep serving. A test drops the file to let the load end.
"""

import json
import os
import time

import triton_python_backend_utils as pb_utils

HANG_AT_MOST_S = 600


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        parameters = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        instances = sum(int(g.get("count", 1)) for g in config.get("instance_group", []))
        if instances <= int(parameters.get("hang_above_instances", "1")):
            return
        release = os.path.join(args["model_repository"], "release")
        pb_utils.Logger.log_info(f"{args['model_instance_name']}: waiting for {release}")
        give_up_at = time.monotonic() + HANG_AT_MOST_S
        while not os.path.exists(release) and time.monotonic() < give_up_at:
            time.sleep(0.1)

    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            outputs = [
                pb_utils.Tensor("OUTPUT0", in_0 + in_1),
                pb_utils.Tensor("OUTPUT1", in_0 - in_1),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
