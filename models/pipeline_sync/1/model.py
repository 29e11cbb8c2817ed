"""pipeline_sync: the sync twin of pipeline_async.

The same interface, and the very same admit, pre-process, merge and split
steps: this file loads pipeline_async's model.py from the same model
repository and reuses them, so the two give bit-identical outputs for the same
inputs. Only the fan-out differs: execute is a plain function that calls
branch_embed, branch_classify and branch_rank one after another, each with the
blocking exec(), and pre-processes on the calling thread. Load both models
from one repository (pipeline_async need not be loaded, only present).
"""

import importlib.util
import os

import triton_python_backend_utils as pb_utils

# models/pipeline_sync/1/model.py -> models/pipeline_async/1/model.py. No
# realpath: a repository mounted from ConfigMaps is made of symlinks.
_ASYNC_MODEL = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "pipeline_async",
    "1",
    "model.py",
)
if not os.path.isfile(_ASYNC_MODEL):
    raise pb_utils.TritonModelException(
        f"pipeline_sync reuses pipeline_async's steps, but {_ASYNC_MODEL} is missing: "
        "keep both models in the same model repository"
    )
_spec = importlib.util.spec_from_file_location("pipeline_async_model", _ASYNC_MODEL)
pipeline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pipeline)


class TritonPythonModel(pipeline.TritonPythonModel):
    # initialize and finalize are pipeline_async's (parameters; no pool unless asked).

    def execute(self, requests):
        responses, admitted = pipeline.admit(self.model_name, requests)
        if not admitted:
            return responses

        hidden = pipeline.preprocess(pipeline.stack(admitted))

        # One branch after the other: each exec() blocks until that branch answers.
        try:
            results = [
                call_branch(branch, output, hidden, self.branch_timeout_us)
                for branch, output in pipeline.BRANCHES
            ]
        except pipeline.BranchError as error:
            pipeline.fail(responses, admitted, f"{self.model_name}: {error}")
            return responses
        pipeline.answer(self.model_name, requests, responses, admitted, pipeline.merge(*results))
        return responses


def call_branch(branch, output, hidden, timeout_us):
    """pipeline_async's call_branch with the blocking exec(): the output, or BranchError."""
    try:
        bls_response = pipeline.branch_request(branch, output, hidden, timeout_us).exec()
    except Exception as error:  # from the BLS machinery itself (shared memory, a closed stub)
        raise pipeline.BranchError(f"{branch} failed: {pipeline.describe(error)}") from error
    return pipeline.branch_result(bls_response, branch, output, len(hidden))
