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
   (standardise each row, a two-layer projection 64 -> 128 -> 32), on the
   calling thread unless `preprocess_threads` asks for a pool (see
   models/README.md for why no pool is the default).
3. Fan out: one BLS request per branch, all three sent with async_exec() and
   awaited together with asyncio.gather, each with a timeout
   (`branch_timeout_us` in config.pbtxt). A branch that answers with an
   error, raises, or leaves out its output fails the requests of this batch
   with a message naming the branch; nothing escapes execute.
4. Merge the three answers and split them back into one response per request;
   a request whose client cancelled while the branches worked gets a
   CANCELLED response instead.

pipeline_sync (the sync twin), pipeline_gateway (the decoupled gateway) and
the ensemble's Python steps (pipeline_preprocess, pipeline_score) import this
file and reuse its steps, so all four give bit-identical outputs.
Every computation here works row by row (see `project`), so a request's
outputs never depend on which requests it was batched with.
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
    """A branch model failed this batch: an error response, an exception, or a missing output."""


class TritonPythonModel:
    def initialize(self, args):
        self.model_name = args["model_name"]
        model_config = json.loads(args["model_config"])
        self.branch_timeout_us = int(parameter(model_config, "branch_timeout_us", "1000000"))
        self.pool = preprocess_pool(model_config, self.model_name)

    async def execute(self, requests):
        responses, admitted = admit(self.model_name, requests)
        if not admitted:
            return responses

        hidden = await preprocess_on(self.pool, stack(admitted))
        try:
            results = await fan_out(hidden, self.branch_timeout_us)
        except BranchError as error:
            fail(responses, admitted, f"{self.model_name}: {error}")
            return responses
        answer(self.model_name, requests, responses, admitted, merge(*results))
        return responses

    def finalize(self):
        if self.pool is not None:
            self.pool.shutdown(wait=True)


# ---- the steps, shared with pipeline_sync and pipeline_gateway ----------------------


def parameter(model_config, key, default):
    """A string parameter of config.pbtxt (`parameters { key: ... }`)."""
    return model_config.get("parameters", {}).get(key, {}).get("string_value", default)


def preprocess_pool(model_config, model_name):
    """The pre-processing thread pool `preprocess_threads` asks for; None for 0 (no pool)."""
    threads = int(parameter(model_config, "preprocess_threads", "0"))
    if threads < 0:
        raise pb_utils.TritonModelException(
            f"{model_name}: preprocess_threads must be 0 or more, got {threads}"
        )
    if threads == 0:
        return None
    return ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"{model_name}-preprocess")


async def preprocess_on(pool, rows):
    """preprocess(rows), on `pool` when there is one, else right here on the event loop."""
    if pool is None:
        return preprocess(rows)
    return await asyncio.get_running_loop().run_in_executor(pool, preprocess, rows)


def cancelled_response(model_name):
    return error_response(f"{model_name}: request cancelled", pb_utils.TritonError.CANCELLED)


def check(model_name, request):
    """(error response, None) for a request turned away, else (None, its FEATURES)."""
    if request.is_cancelled():
        return cancelled_response(model_name), None
    return checked_features(model_name, request)


def checked_features(model_name, request):
    """check() without the cancellation check: (INVALID_ARG response, None) or (None, FEATURES)."""
    features = pb_utils.get_input_tensor_by_name(request, "FEATURES").as_numpy()
    problem = validate(features)
    if problem is not None:
        return error_response(f"{model_name}: {problem}", pb_utils.TritonError.INVALID_ARG), None
    return None, features


def admit(model_name, requests):
    """Check each request alone; returns (responses, admitted).

    `responses` has one slot per request, filled with an error response for
    each request turned away and None for the others; `admitted` lists
    (index, features) of the requests that go on to the branches.
    """
    responses = [None] * len(requests)
    admitted = []
    for index, request in enumerate(requests):
        responses[index], features = check(model_name, request)
        if features is not None:
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


async def call_branch(branch, output, hidden, timeout_us):
    """One branch's output for the batch, or BranchError, whatever went wrong."""
    try:
        bls_response = await branch_request(branch, output, hidden, timeout_us).async_exec()
    except Exception as error:  # from the BLS machinery itself (shared memory, a closed stub)
        raise BranchError(f"{branch} failed: {describe(error)}") from error
    return branch_result(bls_response, branch, output, len(hidden))


async def fan_out(hidden, timeout_us):
    """The three branches' outputs for one batch, computed at the same time.

    Every call is awaited to its end, even after another has failed, so no BLS
    request outlives the batch; then the first failure, in branch order, is
    raised as BranchError.
    """
    outcomes = await asyncio.gather(
        *(call_branch(branch, output, hidden, timeout_us) for branch, output in BRANCHES),
        return_exceptions=True,
    )
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome if isinstance(outcome, BranchError) else BranchError(describe(outcome))
    return outcomes


def branch_result(bls_response, branch, output, rows):
    """The branch's output as numpy, or BranchError naming the branch and what is wrong."""
    if bls_response.has_error():
        raise BranchError(f"{branch} failed: {bls_response.error().message()}")
    tensor = pb_utils.get_output_tensor_by_name(bls_response, output)
    if tensor is None:
        raise BranchError(f"{branch} answered without {output}")
    value = tensor.as_numpy()
    if value.ndim < 1 or len(value) != rows:
        raise BranchError(
            f"{branch} answered {output} with shape {list(value.shape)} for {rows} row(s)"
        )
    return value


def describe(error):
    """An exception as one line: its type and message."""
    message = " ".join(str(error).split())
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def merge(embedding, label_probs, relevance):
    """The pipeline's outputs for the whole batch."""
    return {
        "EMBEDDING": embedding.astype(np.float32),
        "LABEL_PROBS": label_probs.astype(np.float32),
        "SCORE": score(label_probs, relevance),
    }


def score(label_probs, relevance):
    """sigmoid(relevance) times the top class probability, row by row."""
    confidence = label_probs.max(axis=1, keepdims=True)
    return (confidence / (1.0 + np.exp(-relevance))).astype(np.float32)


def split(outputs, sizes):
    """The batch's outputs cut back into one dict per request, `sizes` rows each."""
    parts = []
    start = 0
    for size in sizes:
        parts.append({name: value[start : start + size] for name, value in outputs.items()})
        start += size
    return parts


def result_response(outputs):
    return pb_utils.InferenceResponse(
        output_tensors=[pb_utils.Tensor(name, value) for name, value in outputs.items()]
    )


def answer(model_name, requests, responses, admitted, outputs):
    """One response per admitted request: its rows of the outputs, or CANCELLED if its
    client gave up while the branches worked."""
    parts = split(outputs, [len(features) for _, features in admitted])
    for (index, _), part in zip(admitted, parts, strict=True):
        if requests[index].is_cancelled():
            responses[index] = cancelled_response(model_name)
        else:
            responses[index] = result_response(part)


def fail(responses, admitted, message):
    """Answer every admitted request with the same error."""
    for index, _ in admitted:
        responses[index] = error_response(message)


def error_response(message, code=None):
    error = pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)
    return pb_utils.InferenceResponse(error=error)
