"""chain_async: tokenize, encode, classify: three BLS stages, each awaited in turn.

A sequential async BLS pipeline. Interface (max_batch_size 32; a client may
send several rows per request):

    FEATURES     FP32 [n, 64]  raw feature rows; every value must be finite
    LABEL_PROBS  FP32 [n, 8]   class probabilities that sum to 1

One execute call, for all the requests the dynamic batcher gave it:

1. Admit: each request is checked on its own, with pipeline_async's very
   checks (an INVALID_ARG response for a bad request, CANCELLED for one whose
   client gave up); the others go on.
2. The chain: the rows of the admitted requests, as one batch, go to
   chain_tokenize (FEATURES -> TOKENS; no batcher), then chain_encode
   (TOKENS -> HIDDEN; the heavy stage), then chain_head (HIDDEN ->
   LABEL_PROBS), each call sent with async_exec() and awaited before the next,
   each with a timeout (`call_timeout_us`). The instance is held for the
   whole chain: a stage's wait is this model's compute time.
3. A stage that answers with an error, raises, or leaves out its output fails
   the requests of this batch with a message naming the stage; nothing
   escapes execute. Otherwise one response per request, CANCELLED for a
   client that gave up while the chain ran.

The per-request checks and the answer come from pipeline_async's model.py
(loaded from the same repository), so every pipeline root checks and answers
its requests the same way.
"""

import importlib.util
import json
import os

import triton_python_backend_utils as pb_utils

# models/chain_async/1/model.py -> models/pipeline_async/1/model.py. No
# realpath: a repository mounted from ConfigMaps is made of symlinks.
_ASYNC_MODEL = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "pipeline_async",
    "1",
    "model.py",
)
if not os.path.isfile(_ASYNC_MODEL):
    raise pb_utils.TritonModelException(
        f"chain_async reuses pipeline_async's steps, but {_ASYNC_MODEL} is missing: "
        "keep both models in the same model repository"
    )
_spec = importlib.util.spec_from_file_location("pipeline_async_model", _ASYNC_MODEL)
pipeline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pipeline)

# The stages in order: (model, the input it takes, the output this pipeline asks for).
STAGES = (
    ("chain_tokenize", "FEATURES", "TOKENS"),
    ("chain_encode", "TOKENS", "HIDDEN"),
    ("chain_head", "HIDDEN", "LABEL_PROBS"),
)


class TritonPythonModel:
    def initialize(self, args):
        self.model_name = args["model_name"]
        model_config = json.loads(args["model_config"])
        self.call_timeout_us = int(pipeline.parameter(model_config, "call_timeout_us", "1000000"))

    async def execute(self, requests):
        responses, admitted = pipeline.admit(self.model_name, requests)
        if not admitted:
            return responses

        value = pipeline.stack(admitted)
        try:
            for stage, input_name, output_name in STAGES:
                value = await call_stage(
                    stage, input_name, output_name, value, self.call_timeout_us
                )
        except pipeline.BranchError as error:
            pipeline.fail(responses, admitted, f"{self.model_name}: {error}")
            return responses
        pipeline.answer(self.model_name, requests, responses, admitted, {"LABEL_PROBS": value})
        return responses


async def call_stage(stage, input_name, output_name, value, timeout_us):
    """One stage's output for the batch, or BranchError naming the stage, whatever went wrong."""
    request = pb_utils.InferenceRequest(
        model_name=stage,
        requested_output_names=[output_name],
        inputs=[pb_utils.Tensor(input_name, value)],
        # Microseconds; a batching stage rejects the request if it is still queued then.
        timeout=timeout_us,
    )
    try:
        bls_response = await request.async_exec()
    except Exception as error:  # from the BLS machinery itself (shared memory, a closed stub)
        raise pipeline.BranchError(f"{stage} failed: {pipeline.describe(error)}") from error
    return pipeline.branch_result(bls_response, stage, output_name, len(value))
