"""chain_tokenize: FEATURES [n, 64] -> TOKENS [n, 64], the first stage of chain_async.

A tokenizer-like step: each row is standardised and every value quantised into
one of 256 token ids. The model has no dynamic batcher (`max_batch_size: 0`):
each execute call gets one request, whose leading dimension is its rows. It
holds the call for `emulated_compute_ms` plus `emulated_compute_ms_per_row`
per row (config.pbtxt): an EMULATION of a real tokenizer's time, not real work.
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils

WIDTH = 64
VOCABULARY = 256
# Standardised values are clipped to this many standard deviations, then cut
# into VOCABULARY equal bins.
CLIP = 4.0


class TritonPythonModel:
    def initialize(self, args):
        self.model_name = args["model_name"]
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.per_call_ms = float(parameters["emulated_compute_ms"]["string_value"])
        self.per_row_ms = float(parameters["emulated_compute_ms_per_row"]["string_value"])

    def execute(self, requests):
        responses = []
        for request in requests:
            features = pb_utils.get_input_tensor_by_name(request, "FEATURES").as_numpy()
            problem = validate(features)
            if problem is not None:
                error = pb_utils.TritonError(
                    f"{self.model_name}: {problem}", pb_utils.TritonError.INVALID_ARG
                )
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            tokens = tokenize(features)
            # EMULATION: a real tokenizer would take about this long for these rows.
            time.sleep((self.per_call_ms + self.per_row_ms * len(features)) / 1000.0)
            responses.append(
                pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("TOKENS", tokens)])
            )
        return responses


def validate(features):
    """Why these FEATURES cannot be tokenized, or None. Triton checks the width and the
    type; without a batcher it lets through a call of no rows, which has nothing to do."""
    if features.ndim != 2 or features.shape[0] == 0 or features.shape[1] != WIDTH:
        return f"FEATURES has an unexpected shape {list(features.shape)}: expected [n, {WIDTH}], n >= 1"
    if not np.all(np.isfinite(features)):
        bad = int(np.count_nonzero(~np.isfinite(features)))
        return f"FEATURES must be finite, got {bad} NaN or infinite value(s)"
    return None


def tokenize(features):
    """Each value of each standardised row as a token id in [0, VOCABULARY)."""
    mean = features.mean(axis=1, keepdims=True)
    std = features.std(axis=1, keepdims=True)
    scaled = np.clip((features - mean) / (std + 1e-6), -CLIP, CLIP)
    bins = np.floor((scaled + CLIP) / (2 * CLIP) * VOCABULARY)
    return np.clip(bins, 0, VOCABULARY - 1).astype(np.int32)
