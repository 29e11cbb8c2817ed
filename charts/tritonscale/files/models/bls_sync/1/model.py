"""bls_sync: forward INPUT0 and INPUT1 to the model named in MODEL_NAME.

The interface of python_backend's sync BLS example. For every request the
model builds a BLS request to the named model and waits for it with the
blocking exec(), then returns that model's OUTPUT0 and OUTPUT1 as its own.
A model that does not exist, or fails, gives this request a clear error
response; the other requests of the same batch are not affected.
"""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_name = args["model_name"]

    def execute(self, requests):
        return [self.forward(request) for request in requests]

    def forward(self, request):
        target = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()
        target = target.reshape(-1)[0]
        target = target.decode("utf-8", "replace") if isinstance(target, bytes) else str(target)

        # Calling ourselves would wait for the instance that is doing the
        # calling: with one instance that is a deadlock, so refuse it.
        if target == self.model_name:
            return error_response(f"{self.model_name} cannot forward to itself")

        bls_request = pb_utils.InferenceRequest(
            model_name=target,
            requested_output_names=["OUTPUT0", "OUTPUT1"],
            inputs=[
                pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                pb_utils.get_input_tensor_by_name(request, "INPUT1"),
            ],
        )
        # exec() blocks this model instance until the called model answers.
        bls_response = bls_request.exec()

        if bls_response.has_error():
            return error_response(
                f"{self.model_name} could not run model '{target}': "
                f"{bls_response.error().message()}"
            )
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.get_output_tensor_by_name(bls_response, "OUTPUT0"),
                pb_utils.get_output_tensor_by_name(bls_response, "OUTPUT1"),
            ]
        )


def error_response(message):
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))
