"""pipeline_preprocess: FEATURES [n, 64] -> HIDDEN [n, 32], the first step of pipeline_ensemble.

pipeline_async's admit and pre-process steps, as a model of their own so that
Triton's ensemble scheduler, not Python, moves the tensors between steps. Each
request is checked alone: a bad one (a non-finite value) gets an INVALID_ARG
error response, which the ensemble returns for that request, and the others
go on. The rows of the good requests are stacked, pre-processed as one batch
and split back, row by row as pipeline_async does, so the outputs are
bit-identical to pipeline_async's and pipeline_sync's.
"""

import importlib.util
import os

import triton_python_backend_utils as pb_utils

# models/pipeline_preprocess/1/model.py -> models/pipeline_async/1/model.py. No
# realpath: a repository mounted from ConfigMaps is made of symlinks.
_ASYNC_MODEL = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "pipeline_async",
    "1",
    "model.py",
)
if not os.path.isfile(_ASYNC_MODEL):
    raise pb_utils.TritonModelException(
        f"pipeline_preprocess reuses pipeline_async's steps, but {_ASYNC_MODEL} is missing: "
        "keep both models in the same model repository"
    )
_spec = importlib.util.spec_from_file_location("pipeline_async_model", _ASYNC_MODEL)
pipeline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pipeline)


class TritonPythonModel:
    def initialize(self, args):
        self.model_name = args["model_name"]

    def execute(self, requests):
        responses, admitted = pipeline.admit(self.model_name, requests)
        if not admitted:
            return responses
        hidden = pipeline.preprocess(pipeline.stack(admitted))
        parts = pipeline.split({"HIDDEN": hidden}, [len(rows) for _, rows in admitted])
        for (index, _), part in zip(admitted, parts, strict=True):
            responses[index] = pipeline.result_response(part)
        return responses
