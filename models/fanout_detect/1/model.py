"""fanout_detect: FEATURES [n, 64] -> ITEMS [n, 4, 32], the detector of fanout_async.

A detector's stand-in: each row becomes 4 candidate items (say, the crops of
the objects found in an image), each a vector of 32. One execute call stacks
the rows of all its requests into one batch, does that numpy work, then holds
the batch for `emulated_compute_ms` plus `emulated_compute_ms_per_row` per row
(config.pbtxt): an EMULATION of the accelerator time of a real detector, not
real work. A request with a non-finite value gets an INVALID_ARG error
response; its neighbours in the batch are answered.
"""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils

SLOTS = 4
ITEM_WIDTH = 32

# Fixed weights, the same in every instance.
_weights = np.random.default_rng(21)
W = (_weights.standard_normal((64, SLOTS * ITEM_WIDTH)) / np.sqrt(64)).astype(np.float32)
B = (_weights.standard_normal(SLOTS * ITEM_WIDTH) * 0.1).astype(np.float32)


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
            features = pb_utils.get_input_tensor_by_name(request, "FEATURES").as_numpy()
            if not np.all(np.isfinite(features)):
                message = f"{self.model_name}: FEATURES must be finite"
                error = pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG)
                responses[index] = pb_utils.InferenceResponse(error=error)
            else:
                good.append((index, features))
        if not good:
            return responses

        items = detect(np.concatenate([features for _, features in good]))
        # EMULATION: a real detector would keep an accelerator busy this long for the batch.
        time.sleep((self.per_batch_ms + self.per_row_ms * len(items)) / 1000.0)

        start = 0
        for index, features in good:
            part = items[start : start + len(features)]
            responses[index] = pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("ITEMS", part)]
            )
            start += len(features)
        return responses


def project(rows, weights):
    """rows @ weights, summed in the same order for every row.

    BLAS would pick another kernel for one row than for many, and a row's
    result would then depend in its last bits on the rows batched with it.
    """
    return (rows[:, :, None] * weights[None, :, :]).sum(axis=1)


def detect(features):
    """Standardise each row, project it, and cut the result into SLOTS items."""
    mean = features.mean(axis=1, keepdims=True)
    std = features.std(axis=1, keepdims=True)
    scaled = np.clip((features - mean) / (std + 1e-6), -5.0, 5.0)
    items = np.tanh(project(scaled, W) + B)
    return items.reshape(len(features), SLOTS, ITEM_WIDTH).astype(np.float32)
