"""pipeline_score: LABEL_PROBS [n, 8], RELEVANCE [n, 1] -> SCORE [n, 1], the last step of
pipeline_ensemble: pipeline_async's `score`, sigmoid(relevance) times the top class
probability, row by row, so the ensemble's SCORE is bit-identical to the BLS pipelines'.
"""

import importlib.util
import os

import numpy as np
import triton_python_backend_utils as pb_utils

# models/pipeline_score/1/model.py -> models/pipeline_async/1/model.py (no realpath:
# a repository mounted from ConfigMaps is made of symlinks).
_ASYNC_MODEL = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "pipeline_async",
    "1",
    "model.py",
)
if not os.path.isfile(_ASYNC_MODEL):
    raise pb_utils.TritonModelException(
        f"pipeline_score reuses pipeline_async's score, but {_ASYNC_MODEL} is missing: "
        "keep both models in the same model repository"
    )
_spec = importlib.util.spec_from_file_location("pipeline_async_model", _ASYNC_MODEL)
pipeline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pipeline)


class TritonPythonModel:
    def execute(self, requests):
        def rows(name):
            return [pb_utils.get_input_tensor_by_name(r, name).as_numpy() for r in requests]

        label_probs, relevance = rows("LABEL_PROBS"), rows("RELEVANCE")
        score = pipeline.score(np.concatenate(label_probs), np.concatenate(relevance))
        parts = pipeline.split({"SCORE": score}, [len(part) for part in label_probs])
        return [pipeline.result_response(part) for part in parts]
