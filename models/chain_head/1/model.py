"""chain_head: HIDDEN [n, 32] -> LABEL_PROBS [n, 8], the last stage of chain_async.

A classification head: a softmax over 8 class logits per row. One execute call
stacks the rows of all its requests into one batch, does that numpy work, then
holds the batch for `emulated_compute_ms` plus `emulated_compute_ms_per_row`
per row (config.pbtxt): an EMULATION of the accelerator time of a real head,
not real work.
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils

# Fixed weights, the same in every instance.
_weights = np.random.default_rng(12)
W = (_weights.standard_normal((32, 8)) * 0.5).astype(np.float32)
B = (_weights.standard_normal(8) * 0.1).astype(np.float32)


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.per_batch_ms = float(parameters["emulated_compute_ms"]["string_value"])
        self.per_row_ms = float(parameters["emulated_compute_ms_per_row"]["string_value"])

    def execute(self, requests):
        hidden = [pb_utils.get_input_tensor_by_name(r, "HIDDEN").as_numpy() for r in requests]
        probs = classify(np.concatenate(hidden))
        # EMULATION: a real head would keep an accelerator busy this long for the batch.
        time.sleep((self.per_batch_ms + self.per_row_ms * len(probs)) / 1000.0)

        responses = []
        start = 0
        for rows in hidden:
            part = probs[start : start + len(rows)]
            responses.append(
                pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("LABEL_PROBS", part)])
            )
            start += len(rows)
        return responses


def project(rows, weights):
    """rows @ weights, summed in the same order for every row (see chain_encode)."""
    return (rows[:, :, None] * weights[None, :, :]).sum(axis=1)


def classify(hidden):
    """A softmax over 8 class logits."""
    logits = project(hidden, W) + B
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    return (exp / exp.sum(axis=1, keepdims=True)).astype(np.float32)
