"""pipeline_async: pre-process, fan out to three branch models at once, merge.

A realistic async BLS pipeline. Interface (max_batch_size 32, so every tensor
has a leading batch dimension; a client may send several rows per request):

    FEATURES     FP32 [n, 64]  raw feature rows; every value must be finite
    EMBEDDING    FP32 [n, 16]  a unit-length embedding              (branch_embed)
    LABEL_PROBS  FP32 [n, 8]   class probabilities that sum to 1    (branch_classify)
    SCORE        FP32 [n, 1]   relevance (branch_rank) times the classifier's
                               confidence (the top class probability), in (0, 1)

One execute call, for all the requests the dynamic batcher gave it:

1. Admit: each request is checked on its own. A bad one (a non-finite value, a
   wrong width) gets an INVALID_ARG error response; one whose client has
   cancelled gets a CANCELLED response and is never sent to the branches. The
   other requests go on: one bad request never fails its neighbours.
2. Stack the rows of all admitted requests into one batch and pre-process it
   (standardise each row, a two-layer projection 64 -> 128 -> 32) on a thread
   pool, so the numpy work keeps the event loop free.
3. Fan out: one BLS request per branch, all three sent with async_exec() and
   awaited together with asyncio.gather, each with a timeout
   (`branch_timeout_us` in config.pbtxt).
4. Merge the three answers and split them back into one response per request.

pipeline_sync is the sync twin: it imports this file and runs the same steps
with blocking exec() calls, one branch after the other, so the two give
bit-identical outputs. Every computation here works row by row (see
`project`), so a request's outputs never depend on which requests it was
batched with.
"""

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils

FEATURES_WIDTH = 64

# The branch models, and the output this pipeline takes from each.
BRANCHES = (
    ("branch_embed", "EMBEDDING"),
    ("branch_classify", "LABEL_PROBS"),
    ("branch_rank", "RELEVANCE"),
)

# Fixed pre-processing weights: every instance, and the sync twin, build the
# same ones from the same seed.
_weights = np.random.default_rng(1)
W1 = (_weights.standard_normal((FEATURES_WIDTH, 128)) / np.sqrt(FEATURES_WIDTH)).astype(np.float32)
B1 = (_weights.standard_normal(128) * 0.1).astype(np.float32)
W2 = (_weights.standard_normal((128, 32)) / np.sqrt(128)).astype(np.float32)
B2 = (_weights.standard_normal(32) * 0.1).astype(np.float32)

# Standardised features are clipped to this many standard deviations.
CLIP = 5.0


class BranchError(Exception):
    """A branch model answered with an error (or timed out)."""


class TritonPythonModel:
    def initialize(self, args):
        self.model_name = args["model_name"]
        model_config = json.loads(args["model_config"])
        self.branch_timeout_us = int(parameter(model_config, "branch_timeout_us", "1000000"))
        # Threads start on first use, so a model that never submits work
        # (pipeline_sync inherits this method) costs nothing.
        self.pool = ThreadPoolExecutor(
            max_workers=int(parameter(model_config, "preprocess_threads", "2")),
            thread_name_prefix=f"{self.model_name}-preprocess",
        )

    async def execute(self, requests):
        responses, admitted = admit(self.model_name, requests)
        if not admitted:
            return responses

        # Pre-processing is blocking numpy work: run it on the pool.
        loop = asyncio.get_running_loop()
        hidden = await loop.run_in_executor(self.pool, preprocess, stack(admitted))

        # The three branches work on this batch at the same time.
        calls = [
            branch_request(branch, output, hidden, self.branch_timeout_us).async_exec()
            for branch, output in BRANCHES
        ]
        bls_responses = await asyncio.gather(*calls)

        try:
            results = [
                branch_result(bls_response, branch, output)
                for (branch, output), bls_response in zip(BRANCHES, bls_responses, strict=True)
            ]
        except BranchError as error:
            fail(responses, admitted, f"{self.model_name}: {error}")
            return responses
        answer(responses, admitted, merge(*results))
        return responses

    def finalize(self):
        self.pool.shutdown(wait=True)


# ---- the steps, shared with pipeline_sync -------------------------------------------


def parameter(model_config, key, default):
    """A string parameter of config.pbtxt (`parameters { key: ... }`)."""
    return model_config.get("parameters", {}).get(key, {}).get("string_value", default)


def admit(model_name, requests):
    """Check each request alone; returns (responses, admitted).

    `responses` has one slot per request, filled with an error response for
    each request turned away and None for the others; `admitted` lists
    (index, features) of the requests that go on to the branches.
    """
    responses = [None] * len(requests)
    admitted = []
    for index, request in enumerate(requests):
        if request.is_cancelled():
            responses[index] = error_response(
                f"{model_name}: request cancelled", pb_utils.TritonError.CANCELLED
            )
            continue
        features = pb_utils.get_input_tensor_by_name(request, "FEATURES").as_numpy()
        problem = validate(features)
        if problem is not None:
            responses[index] = error_response(
                f"{model_name}: {problem}", pb_utils.TritonError.INVALID_ARG
            )
            continue
        admitted.append((index, features))
    return responses, admitted


def validate(features):
    """Why these FEATURES cannot be used, or None when they can."""
    if features.ndim != 2 or features.shape[1] != FEATURES_WIDTH:
        return f"FEATURES must have shape [n, {FEATURES_WIDTH}], got {list(features.shape)}"
    if not np.all(np.isfinite(features)):
        bad = int(np.count_nonzero(~np.isfinite(features)))
        return f"FEATURES must be finite, got {bad} NaN or infinite value(s)"
    return None


def stack(admitted):
    """The rows of all admitted requests, as one batch."""
    return np.concatenate([features for _, features in admitted]).astype(np.float32)


def project(rows, weights):
    """rows @ weights, summed in a fixed order for every row.

    Not `rows @ weights`: BLAS picks another kernel, with another summation
    order, for one row than for many, so a row's result would change in the
    last bits with the number of rows it was batched with.
    """
    return (rows[:, :, None] * weights[None, :, :]).sum(axis=1)


def preprocess(rows):
    """Standardise each row, clip, then project 64 -> 128 -> 32 with ReLUs."""
    mean = rows.mean(axis=1, keepdims=True)
    std = rows.std(axis=1, keepdims=True)
    scaled = np.clip((rows - mean) / (std + 1e-6), -CLIP, CLIP)
    hidden = np.maximum(project(scaled, W1) + B1, 0.0)
    return np.maximum(project(hidden, W2) + B2, 0.0).astype(np.float32)


def branch_request(branch, output, hidden, timeout_us):
    """The BLS request that sends the pre-processed batch to one branch."""
    return pb_utils.InferenceRequest(
        model_name=branch,
        requested_output_names=[output],
        inputs=[pb_utils.Tensor("HIDDEN", hidden)],
        # Microseconds; the branch rejects the request if it is still queued then.
        timeout=timeout_us,
    )


def branch_result(bls_response, branch, output):
    """The branch's output as numpy, or BranchError with the branch's message."""
    if bls_response.has_error():
        raise BranchError(f"{branch} failed: {bls_response.error().message()}")
    return pb_utils.get_output_tensor_by_name(bls_response, output).as_numpy()


def merge(embedding, label_probs, relevance):
    """The pipeline's outputs for the whole batch."""
    confidence = label_probs.max(axis=1, keepdims=True)
    score = confidence / (1.0 + np.exp(-relevance))
    return {
        "EMBEDDING": embedding.astype(np.float32),
        "LABEL_PROBS": label_probs.astype(np.float32),
        "SCORE": score.astype(np.float32),
    }


def answer(responses, admitted, outputs):
    """Split the batch's outputs back into one response per admitted request."""
    start = 0
    for index, features in admitted:
        rows = slice(start, start + len(features))
        responses[index] = pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor(name, value[rows]) for name, value in outputs.items()]
        )
        start += len(features)


def fail(responses, admitted, message):
    """Answer every admitted request with the same error."""
    for index, _ in admitted:
        responses[index] = error_response(message)


def error_response(message, code=None):
    error = pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)
    return pb_utils.InferenceResponse(error=error)
