"""bls_decoupled_sync: SUM = IN * IN, by a blocking BLS call to a decoupled model.

The interface of python_backend's decoupled BLS example (sync half). For each
request it calls square_int32 with exec(decoupled=True), which returns an
iterator over that model's response stream; the OUT values of the stream add
up to IN squared. The last response of the stream carries only the final
flag and no outputs.
"""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_name = args["model_name"]

    def execute(self, requests):
        return [self.square(request) for request in requests]

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
        for bls_response in bls_request.exec(decoupled=True):
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
