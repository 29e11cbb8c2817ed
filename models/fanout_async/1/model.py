"""fanout_async: detect, then per-item and conditional calls that depend on each request.

An async BLS pipeline whose calls are decided by the data, like detection then
per-object classification, retrieval then reranking, or OCR per text box.
Interface (max_batch_size 32; a client may send several rows per request):

    FEATURES      FP32 [n, 64]    raw feature rows; every value must be finite
    ITEM_COUNT    INT32 [n, 1]    the items found for the request, 1 to 4 (the same on its rows)
    ITEM_PROBS    FP32 [n, 4, 8]  class probabilities of each item; zeros past ITEM_COUNT
    REVIEW_SCORE  FP32 [n, 1]     fanout_verify's score in (0, 1) for a doubtful request, else -1

One execute call, for all the requests the dynamic batcher gave it:

1. Admit: each request is checked on its own, with pipeline_async's very
   checks (INVALID_ARG for a bad request, CANCELLED for one whose client gave
   up); the others go on.
2. Detect: the rows of the admitted requests go to fanout_detect in one call,
   which answers 4 candidate ITEMS per row.
3. Per request, from its data (`items_of`, `needs_review`): how many items it
   has, k from 1 to 4, and whether it is doubtful (about one request in four).
   One fanout_classify call per item (the request's rows of that item) and,
   for a doubtful request, one fanout_verify call (all its items). Every call
   of every request goes out at once (async_exec, asyncio.gather), each with a
   timeout (`call_timeout_us`); fanout_classify's batcher joins them again.
4. One response per request. A failed detect call fails the whole batch; a
   failed classify or verify call fails only the request it was for, with a
   message naming the model. CANCELLED for a client that gave up meanwhile.

How many items a request has and whether it is doubtful stand in for what a
real detector reports. They are derived from the request's own FEATURES, so
the same request always makes the same calls, and for the benchmarks'
standard-normal rows k is spread evenly over 1 to 4 and one request in four is
doubtful: 2.5 classify calls and 0.25 verify calls per request on average.
"""

import asyncio
import importlib.util
import json
import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils

# models/fanout_async/1/model.py -> models/pipeline_async/1/model.py. No
# realpath: a repository mounted from ConfigMaps is made of symlinks.
_ASYNC_MODEL = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "pipeline_async",
    "1",
    "model.py",
)
if not os.path.isfile(_ASYNC_MODEL):
    raise pb_utils.TritonModelException(
        f"fanout_async reuses pipeline_async's steps, but {_ASYNC_MODEL} is missing: "
        "keep both models in the same model repository"
    )
_spec = importlib.util.spec_from_file_location("pipeline_async_model", _ASYNC_MODEL)
pipeline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pipeline)

DETECT = "fanout_detect"
CLASSIFY = "fanout_classify"
VERIFY = "fanout_verify"
SLOTS = 4  # items fanout_detect answers per row
CLASSES = 8
# The share of requests found doubtful, for standard-normal FEATURES.
REVIEW_SHARE = 0.25
NOT_REVIEWED = -1.0


class TritonPythonModel:
    def initialize(self, args):
        self.model_name = args["model_name"]
        model_config = json.loads(args["model_config"])
        self.call_timeout_us = int(pipeline.parameter(model_config, "call_timeout_us", "1000000"))
        threads = int(pipeline.parameter(model_config, "bls_threads", "16"))
        self.bls_executor = ThreadPoolExecutor(
            max_workers=max(threads, 1), thread_name_prefix=f"{self.model_name}-bls"
        )
        self.executor_set = False

    async def execute(self, requests):
        if not self.executor_set:
            # async_exec() blocks a thread of the loop's default executor per call.
            asyncio.get_running_loop().set_default_executor(self.bls_executor)
            self.executor_set = True

        responses, admitted = pipeline.admit(self.model_name, requests)
        if not admitted:
            return responses

        try:
            items = await call(
                DETECT, "FEATURES", pipeline.stack(admitted), "ITEMS", self.call_timeout_us
            )
        except pipeline.BranchError as error:
            pipeline.fail(responses, admitted, f"{self.model_name}: {error}")
            return responses

        parts = pipeline.split({"ITEMS": items}, [len(features) for _, features in admitted])
        outcomes = await asyncio.gather(
            *(
                per_request(features, part["ITEMS"], self.call_timeout_us)
                for (_, features), part in zip(admitted, parts, strict=True)
            ),
            return_exceptions=True,
        )
        for (index, _), outcome in zip(admitted, outcomes, strict=True):
            if requests[index].is_cancelled():
                responses[index] = pipeline.cancelled_response(self.model_name)
            elif isinstance(outcome, BaseException):
                responses[index] = pipeline.error_response(f"{self.model_name}: {reason(outcome)}")
            else:
                responses[index] = pipeline.result_response(outcome)
        return responses

    def finalize(self):
        self.bls_executor.shutdown(wait=False)


def reason(error):
    """A failed call's message (BranchError names the model), or an unexpected error's."""
    return str(error) if isinstance(error, pipeline.BranchError) else pipeline.describe(error)


# ---- what a request's data decides -------------------------------------------------


def normal_cdf(z):
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def standard_score(values):
    """The values' sum over the square root of their count: standard normal when they are
    independent standard normals, whatever their count."""
    return float(values.sum(dtype=np.float64)) / math.sqrt(values.size)


def items_of(features):
    """How many items the request has, 1 to SLOTS: evenly spread for standard-normal rows."""
    return min(SLOTS, 1 + int(SLOTS * normal_cdf(standard_score(features))))


def needs_review(features):
    """Whether the request is doubtful: REVIEW_SHARE of standard-normal requests, decided
    by the difference of its two halves of columns (independent of items_of's sum)."""
    half = features.shape[1] // 2
    difference = standard_score(features[:, :half]) - standard_score(features[:, half:])
    return normal_cdf(difference / math.sqrt(2.0)) < REVIEW_SHARE


# ---- the calls -------------------------------------------------------------------------


async def call(model, input_name, value, output_name, timeout_us):
    """One BLS call's output, or BranchError naming the model, whatever went wrong."""
    request = pb_utils.InferenceRequest(
        model_name=model,
        requested_output_names=[output_name],
        inputs=[pb_utils.Tensor(input_name, np.ascontiguousarray(value))],
        # Microseconds; the called model rejects the request if it is still queued then.
        timeout=timeout_us,
    )
    try:
        bls_response = await request.async_exec()
    except Exception as error:  # from the BLS machinery itself (shared memory, a closed stub)
        raise pipeline.BranchError(f"{model} failed: {pipeline.describe(error)}") from error
    return pipeline.branch_result(bls_response, model, output_name, len(value))


async def per_request(features, items, timeout_us):
    """One request's outputs: a classify call per item and, if doubtful, a verify call, all at
    once. Every call is awaited to its end; then the first failure is raised."""
    count = items_of(features)
    review = needs_review(features)
    calls = [
        call(CLASSIFY, "ITEM", items[:, slot, :], "LABEL_PROBS", timeout_us)
        for slot in range(count)
    ]
    if review:
        calls.append(call(VERIFY, "ITEMS", items, "SCORE", timeout_us))
    results = await asyncio.gather(*calls, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    rows = len(features)
    item_probs = np.zeros((rows, SLOTS, CLASSES), dtype=np.float32)
    item_probs[:, :count, :] = np.stack(results[:count], axis=1)
    score = results[count] if review else np.full((rows, 1), NOT_REVIEWED, dtype=np.float32)
    return {
        "ITEM_COUNT": np.full((rows, 1), count, dtype=np.int32),
        "ITEM_PROBS": item_probs,
        "REVIEW_SCORE": score.astype(np.float32),
    }
