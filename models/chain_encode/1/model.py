"""chain_encode: TOKENS [n, 64] -> HIDDEN [n, 32], the middle stage of chain_async.

An encoder: each token id looks up a learned vector, the row's vectors are
averaged with a position weighting, projected and squashed. One execute call
stacks the rows of all its requests into one batch, does that numpy work, then
holds the batch for `emulated_compute_ms` plus `emulated_compute_ms_per_row`
per row (config.pbtxt): an EMULATION of the accelerator time of a real
encoder, not real work. A request with a token id outside [0, 256) gets an
INVALID_ARG error response; its neighbours in the batch are answered.
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils

VOCABULARY = 256
LENGTH = 64

# Fixed weights, the same in every instance.
_weights = np.random.default_rng(11)
EMBEDDINGS = (_weights.standard_normal((VOCABULARY, 32)) / np.sqrt(32)).astype(np.float32)
POSITIONS = np.linspace(1.0, 0.5, LENGTH, dtype=np.float32)
W = (_weights.standard_normal((32, 32)) / np.sqrt(32)).astype(np.float32)
B = (_weights.standard_normal(32) * 0.1).astype(np.float32)


class TritonPythonModel:
    def initialize(self, args):
        self.model_name = args["model_name"]
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.per_batch_ms = float(parameters["emulated_compute_ms"]["string_value"])
        self.per_row_ms = float(parameters["emulated_compute_ms_per_row"]["string_value"])

    def execute(self, requests):
        responses = [None] * len(requests)
        good = []
        for index, request in enumerate(requests):
            tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS").as_numpy()
            if np.any((tokens < 0) | (tokens >= VOCABULARY)):
                message = f"{self.model_name}: TOKENS must lie in [0, {VOCABULARY})"
                error = pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG)
                responses[index] = pb_utils.InferenceResponse(error=error)
            else:
                good.append((index, tokens))
        if not good:
            return responses

        hidden = encode(np.concatenate([tokens for _, tokens in good]))
        # EMULATION: a real encoder would keep an accelerator busy this long for the batch.
        time.sleep((self.per_batch_ms + self.per_row_ms * len(hidden)) / 1000.0)

        start = 0
        for index, tokens in good:
            part = hidden[start : start + len(tokens)]
            responses[index] = pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("HIDDEN", part)]
            )
            start += len(tokens)
        return responses


def project(rows, weights):
    """rows @ weights, summed in the same order for every row.

    BLAS would pick another kernel for one row than for many, and a row's
    result would then depend in its last bits on the rows batched with it.
    """
    return (rows[:, :, None] * weights[None, :, :]).sum(axis=1)


def encode(tokens):
    """The position-weighted mean of the tokens' vectors, projected, through tanh."""
    pooled = (EMBEDDINGS[tokens] * POSITIONS[None, :, None]).sum(axis=1) / POSITIONS.sum()
    return np.tanh(project(pooled, W) + B).astype(np.float32)
