"""branch_classify: HIDDEN [n, 32] -> LABEL_PROBS [n, 8], class probabilities per row.

A branch of pipeline_async and pipeline_sync. One execute call stacks the
rows of all its requests into one batch, does a little real numpy work on it,
then holds the batch for `emulated_compute_ms` (config.pbtxt): an EMULATION
of the accelerator time of a real model, not real work. Then it splits the
batch back into one response per request.
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils

OUTPUT = "LABEL_PROBS"

# Fixed weights, the same in every instance.
_weights = np.random.default_rng(3)
W = (_weights.standard_normal((32, 8)) / np.sqrt(32)).astype(np.float32)
B = (_weights.standard_normal(8) * 0.1).astype(np.float32)


class TritonPythonModel:
    def initialize(self, args):
        model_config = json.loads(args["model_config"])
        parameters = model_config.get("parameters", {})
        emulated_ms = parameters.get("emulated_compute_ms", {}).get("string_value", "0")
        self.emulated_compute_s = float(emulated_ms) / 1000.0

    def execute(self, requests):
        hidden = [pb_utils.get_input_tensor_by_name(r, "HIDDEN").as_numpy() for r in requests]
        result = classify(np.concatenate(hidden))

        # EMULATION: a real model would keep an accelerator busy this long per batch.
        time.sleep(self.emulated_compute_s)

        responses = []
        start = 0
        for rows in hidden:
            part = result[start : start + len(rows)]
            responses.append(
                pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(OUTPUT, part)])
            )
            start += len(rows)
        return responses


def project(rows, weights):
    """rows @ weights, summed in the same order for every row.

    BLAS would pick another kernel for one row than for many, and a row's
    result would then depend in its last bits on the rows batched with it.
    """
    return (rows[:, :, None] * weights[None, :, :]).sum(axis=1)


def classify(hidden):
    """A softmax over 8 class logits."""
    logits = project(hidden, W) + B
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    return (exp / exp.sum(axis=1, keepdims=True)).astype(np.float32)
