"""branch_rank: HIDDEN [n, 32] -> RELEVANCE [n, 1], one relevance logit per row.

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

OUTPUT = "RELEVANCE"

# Fixed weights, the same in every instance.
_weights = np.random.default_rng(4)
W = (_weights.standard_normal((32, 1)) / np.sqrt(32)).astype(np.float32)
B = np.float32(0.1)


class TritonPythonModel:
    def initialize(self, args):
        model_config = json.loads(args["model_config"])
        parameters = model_config.get("parameters", {})
        emulated_ms = parameters.get("emulated_compute_ms", {}).get("string_value", "0")
        self.emulated_compute_s = float(emulated_ms) / 1000.0

    def execute(self, requests):
        hidden = [pb_utils.get_input_tensor_by_name(r, "HIDDEN").as_numpy() for r in requests]
        result = rank(np.concatenate(hidden))

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


def rank(hidden):
    """A linear relevance logit; the pipeline squashes it into (0, 1)."""
    return (project(hidden, W) + B).astype(np.float32)
