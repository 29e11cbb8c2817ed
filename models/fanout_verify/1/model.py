"""fanout_verify: ITEMS [n, 4, 32] -> SCORE [n, 1], the conditional second opinion of fanout_async.

A verifier: each row's four items are pooled and scored, sigmoid of one logit.
One execute call stacks the rows of all its requests into one batch, does that
numpy work, then holds the batch for `emulated_compute_ms` plus
`emulated_compute_ms_per_row` per row (config.pbtxt): an EMULATION of the
accelerator time of a real verifier, not real work.
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils

# Fixed weights, the same in every instance.
_weights = np.random.default_rng(23)
W = (_weights.standard_normal((4 * 32, 1)) / np.sqrt(4 * 32)).astype(np.float32)


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.per_batch_ms = float(parameters["emulated_compute_ms"]["string_value"])
        self.per_row_ms = float(parameters["emulated_compute_ms_per_row"]["string_value"])

    def execute(self, requests):
        items = [pb_utils.get_input_tensor_by_name(r, "ITEMS").as_numpy() for r in requests]
        scores = verify(np.concatenate(items))
        # EMULATION: a real verifier would keep an accelerator busy this long for the batch.
        time.sleep((self.per_batch_ms + self.per_row_ms * len(scores)) / 1000.0)

        responses = []
        start = 0
        for rows in items:
            part = scores[start : start + len(rows)]
            responses.append(
                pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("SCORE", part)])
            )
            start += len(rows)
        return responses


def project(rows, weights):
    """rows @ weights, summed in the same order for every row (see fanout_detect)."""
    return (rows[:, :, None] * weights[None, :, :]).sum(axis=1)


def verify(items):
    """sigmoid of a linear score of each row's four items, side by side."""
    logit = project(items.reshape(len(items), -1), W)
    return (1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
