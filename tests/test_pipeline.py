"""The pipeline: pipeline_async against its sync twin, batching, errors, timeouts, load."""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
import tritonclient.grpc
import tritonclient.http

from tests.model_clients import (
    PROTOCOLS,
    connect,
    infer,
    infer_concurrently,
    infer_error,
    make_inputs,
)
from tests.test_decoupled_burst import pending_requests
from tests.waiting import wait_for

TWINS = ("pipeline_async", "pipeline_sync")
OUTPUTS = ["EMBEDDING", "LABEL_PROBS", "SCORE"]
BRANCHES = ("branch_embed", "branch_classify", "branch_rank")


def features(rows: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((rows, 64)) * 3 + 1).astype(np.float32)


def run(client, protocol: str, model: str, rows: np.ndarray) -> dict[str, np.ndarray]:
    return infer(client, protocol, model, {"FEATURES": rows}, OUTPUTS)


def assert_well_formed(outputs: dict[str, np.ndarray], rows: int) -> None:
    """What holds for any input: shapes, unit embeddings, probabilities, scores in (0, 1)."""
    assert outputs["EMBEDDING"].shape == (rows, 16)
    assert outputs["LABEL_PROBS"].shape == (rows, 8)
    assert outputs["SCORE"].shape == (rows, 1)
    assert all(value.dtype == np.float32 for value in outputs.values())
    np.testing.assert_allclose(np.linalg.norm(outputs["EMBEDDING"], axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(outputs["LABEL_PROBS"].sum(axis=1), 1.0, rtol=1e-5)
    assert np.all(outputs["LABEL_PROBS"] > 0)
    assert np.all((outputs["SCORE"] > 0) & (outputs["SCORE"] < 1))


def assert_identical(left: dict[str, np.ndarray], right: dict[str, np.ndarray]) -> None:
    for name in OUTPUTS:
        assert np.array_equal(left[name], right[name]), f"{name} differs"


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("rows", [1, 5, 32])
def test_the_twins_give_bit_identical_outputs(triton, protocol, rows):
    batch = features(rows, seed=rows)
    with connect(triton, protocol) as client:
        from_async = run(client, protocol, "pipeline_async", batch)
        from_sync = run(client, protocol, "pipeline_sync", batch)
    assert_well_formed(from_async, rows)
    assert_identical(from_async, from_sync)


@pytest.mark.parametrize("model", TWINS)
def test_a_rows_outputs_do_not_depend_on_the_rows_batched_with_it(triton, model):
    batch = features(6, seed=7)
    with connect(triton, "http") as client:
        together = run(client, "http", model, batch)
        for row in range(len(batch)):
            alone = run(client, "http", model, batch[row : row + 1])
            assert_identical(alone, {name: together[name][row : row + 1] for name in OUTPUTS})


def test_different_rows_give_different_outputs(triton):
    with connect(triton, "http") as client:
        outputs = run(client, "http", "pipeline_async", features(2, seed=8))
    assert not np.array_equal(outputs["EMBEDDING"][0], outputs["EMBEDDING"][1])


@pytest.mark.parametrize("model", TWINS)
def test_a_bad_request_in_a_concurrent_burst_fails_alone(triton, model):
    requests = [{"FEATURES": features(1, seed=100 + index)} for index in range(24)]
    requests[12]["FEATURES"][0, 5] = np.nan
    with connect(triton, "http") as client:
        # One request with every good row: what each good request must get back.
        good = np.concatenate([r["FEATURES"] for i, r in enumerate(requests) if i != 12])
        expected = run(client, "http", model, good)

    answers = infer_concurrently(triton, model, requests, OUTPUTS)

    assert answers[12] == f"{model}: FEATURES must be finite, got 1 NaN or infinite value(s)"
    good_answers = answers[:12] + answers[13:]
    for row, answer in enumerate(good_answers):
        assert not isinstance(answer, str), answer
        assert_identical(answer, {name: expected[name][row : row + 1] for name in OUTPUTS})


def statistics(client, model: str) -> tuple[int, int]:
    """(requests that succeeded, execute calls) of a model since the server started."""
    stats = client.get_inference_statistics(model)["model_stats"][0]
    return stats["inference_stats"]["success"]["count"], stats["execution_count"]


def test_pipeline_async_answers_200_concurrent_requests_batching_each_execute(triton):
    requests = [{"FEATURES": features(1, seed=1000 + index)} for index in range(200)]
    with connect(triton, "http") as client:
        expected = [
            run(client, "http", "pipeline_sync", np.concatenate([r["FEATURES"] for r in chunk]))
            for chunk in (requests[start : start + 25] for start in range(0, 200, 25))
        ]
        before = {model: statistics(client, model) for model in ("pipeline_async", *BRANCHES)}
        answers = infer_concurrently(triton, "pipeline_async", requests, OUTPUTS)
        # Triton counts a request once it is released, which can be a moment after its
        # client has the response.
        deadline = time.monotonic() + 10
        while statistics(client, "pipeline_async")[0] - before["pipeline_async"][0] < 200:
            assert time.monotonic() < deadline, "pipeline_async never counted 200 requests"
            time.sleep(0.05)
        after = {model: statistics(client, model) for model in ("pipeline_async", *BRANCHES)}

    assert [answer for answer in answers if isinstance(answer, str)] == []
    for index, answer in enumerate(answers):
        chunk, row = divmod(index, 25)
        assert_identical(answer, {name: expected[chunk][name][row : row + 1] for name in OUTPUTS})

    requests_done = after["pipeline_async"][0] - before["pipeline_async"][0]
    executes = after["pipeline_async"][1] - before["pipeline_async"][1]
    assert requests_done == 200
    # 200 requests in flight against one instance: the dynamic batcher must
    # have handed several requests to one execute...
    assert executes < requests_done
    # ...and each execute sent its whole batch to each branch in one BLS call.
    for branch in BRANCHES:
        assert after[branch][0] - before[branch][0] == executes, branch


@contextmanager
def config_override(triton, model: str, parameters: dict[str, str]) -> Iterator[None]:
    """Reload `model` with changed config parameters, then load its original config again.

    A plain reload would keep the override, so the original goes back as an override too.
    """
    with tritonclient.http.InferenceServerClient(triton.http_url) as client:
        original = client.get_model_config(model)
        changed = copy.deepcopy(original)
        for key, value in parameters.items():
            changed.setdefault("parameters", {})[key] = {"string_value": value}
        client.load_model(model, headers=triton.repository_headers, config=json.dumps(changed))
        try:
            yield
        finally:
            client.load_model(model, headers=triton.repository_headers, config=json.dumps(original))


def test_a_branch_timeout_fails_the_batch_with_a_clear_error(triton):
    # pipeline_sync passes the same timeout through the same helper; one twin
    # is enough, as each reload costs seconds.
    model = "pipeline_async"
    rows = features(2, seed=9)
    # One microsecond: every BLS request expires in the branch's queue.
    with config_override(triton, model, {"branch_timeout_us": "1"}):
        with connect(triton, "http") as client:
            message = infer_error(client, "http", model, {"FEATURES": rows})
    assert message == f"{model}: branch_embed failed: Request timeout expired"

    with connect(triton, "http") as client:
        assert client.is_model_ready(model)
        assert_well_formed(run(client, "http", model, rows), 2)


def test_a_request_cancelled_while_queued_never_reaches_the_branches(triton):
    # branch_embed holds each batch for a second, so the first request keeps
    # pipeline_async's only instance busy while the second waits in its queue
    # and is cancelled there. Triton 2.51 still hands the cancelled request to
    # execute; the pipeline must notice and skip it.
    answered: dict[str, str | None] = {}
    arrived = threading.Event()

    def on_answer(name: str, error) -> None:
        answered[name] = None if error is None else error.message()
        if len(answered) == 2:
            arrived.set()

    with config_override(triton, "branch_embed", {"emulated_compute_ms": "1000"}):
        with connect(triton, "http") as stats_client:
            before = {
                m: statistics(stats_client, m)
                for m in ("pipeline_async", "branch_embed", "branch_rank")
            }
            client = tritonclient.grpc.InferenceServerClient(triton.grpc_url)
            try:
                inputs = make_inputs("grpc", {"FEATURES": features(1, seed=11)})
                client.async_infer(
                    "pipeline_async", inputs, lambda result, error: on_answer("first", error)
                )
                # The first holds the instance once its fan-out has begun: the fast branches
                # answer it while branch_embed holds its batch.
                wait_for(
                    lambda: statistics(stats_client, "branch_rank")[0] > before["branch_rank"][0],
                    "pipeline_async to fan the first request out",
                )
                second = client.async_infer(
                    "pipeline_async", inputs, lambda result, error: on_answer("second", error)
                )
                wait_for(
                    lambda: pending_requests(triton).get("pipeline_async", 0) >= 1,
                    "the second request to wait in pipeline_async's queue",
                )
                second.cancel()
                assert arrived.wait(timeout=30)
            finally:
                client.close()

            # The instance reaches the cancelled request once the first is done.
            deadline = time.monotonic() + 30
            while statistics(stats_client, "pipeline_async")[1] - before["pipeline_async"][1] < 2:
                assert time.monotonic() < deadline, "pipeline_async never ran the second request"
                time.sleep(0.05)
            after = {m: statistics(stats_client, m) for m in ("pipeline_async", "branch_embed")}

    assert answered["first"] is None
    assert "cancel" in answered["second"].lower()
    # Only the first request's batch went to the branch.
    assert after["branch_embed"][0] - before["branch_embed"][0] == 1
