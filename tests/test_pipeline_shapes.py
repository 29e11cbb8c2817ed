"""The pipelines of other shapes: chain_async (stages in turn) and fanout_async (calls decided
by each request's data), on the session's real Triton."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tests.model_clients import PROTOCOLS, connect, infer, infer_concurrently, infer_error

CHAIN_OUTPUTS = ["LABEL_PROBS"]
FANOUT_OUTPUTS = ["ITEM_COUNT", "ITEM_PROBS", "REVIEW_SCORE"]
FANOUT_CALLEES = ("fanout_detect", "fanout_classify", "fanout_verify")


def features(rows: int, seed: int) -> np.ndarray:
    """Standard-normal rows, as the benchmarks send: fanout_async's items spread over 1 to 4."""
    return np.random.default_rng(seed).standard_normal((rows, 64)).astype(np.float32)


def requests_done(client, model: str) -> int:
    """The requests of `model` that succeeded since the server started (BLS calls included)."""
    return client.get_inference_statistics(model)["model_stats"][0]["inference_stats"]["success"][
        "count"
    ]


# ---- chain_async --------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("rows", [1, 5, 32])
def test_the_chain_answers_class_probabilities_per_row(triton, protocol, rows):
    with connect(triton, protocol) as client:
        out = infer(
            client, protocol, "chain_async", {"FEATURES": features(rows, rows)}, ["LABEL_PROBS"]
        )
    probs = out["LABEL_PROBS"]
    assert probs.shape == (rows, 8) and probs.dtype == np.float32
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
    assert np.all(probs > 0)


def test_a_rows_chain_output_does_not_depend_on_the_rows_batched_with_it(triton):
    batch = features(6, seed=7)
    with connect(triton, "http") as client:
        together = infer(client, "http", "chain_async", {"FEATURES": batch}, CHAIN_OUTPUTS)
        for row in range(len(batch)):
            alone = infer(
                client, "http", "chain_async", {"FEATURES": batch[row : row + 1]}, CHAIN_OUTPUTS
            )
            assert np.array_equal(alone["LABEL_PROBS"], together["LABEL_PROBS"][row : row + 1])


def test_each_chain_execute_calls_each_stage_once_in_turn(triton):
    """20 concurrent requests: the stages see one call per execute of chain_async, not one
    per request (the root batches, then sends the batch down the chain)."""
    requests = [{"FEATURES": features(1, seed=300 + index)} for index in range(20)]
    stages = ("chain_tokenize", "chain_encode", "chain_head")
    with connect(triton, "http") as client:
        before = {m: requests_done(client, m) for m in ("chain_async", *stages)}
        executes_before = client.get_inference_statistics("chain_async")["model_stats"][0][
            "execution_count"
        ]
        answers = infer_concurrently(triton, "chain_async", requests, CHAIN_OUTPUTS)
        deadline = time.monotonic() + 10  # a request is counted a moment after its answer
        while requests_done(client, "chain_async") - before["chain_async"] < 20:
            assert time.monotonic() < deadline, "chain_async never counted 20 requests"
            time.sleep(0.05)
        executes = (
            client.get_inference_statistics("chain_async")["model_stats"][0]["execution_count"]
            - executes_before
        )
        calls = {m: requests_done(client, m) - before[m] for m in stages}
    assert [a for a in answers if isinstance(a, str)] == []
    assert calls == dict.fromkeys(stages, executes)


def test_a_bad_request_to_the_chain_fails_alone(triton):
    requests = [{"FEATURES": features(1, seed=200 + index)} for index in range(12)]
    requests[5]["FEATURES"][0, 3] = np.inf
    answers = infer_concurrently(triton, "chain_async", requests, CHAIN_OUTPUTS)
    assert answers[5] == "chain_async: FEATURES must be finite, got 1 NaN or infinite value(s)"
    assert all(not isinstance(a, str) for i, a in enumerate(answers) if i != 5)


def test_the_unbatched_tokenizer_refuses_a_call_of_no_rows(triton):
    """Without a batcher Triton lets a call of no rows through ([-1, 64]); the stage answers it
    with an error, in the words Triton uses for a wrong shape."""
    with connect(triton, "http") as client:
        message = infer_error(
            client, "http", "chain_tokenize", {"FEATURES": np.zeros((0, 64), np.float32)}
        )
        tokens = infer(client, "http", "chain_tokenize", {"FEATURES": features(3, 1)}, ["TOKENS"])
    assert message.startswith("chain_tokenize: FEATURES has an unexpected shape [0, 64]")
    assert tokens["TOKENS"].shape == (3, 64) and tokens["TOKENS"].dtype == np.int32
    assert 0 <= tokens["TOKENS"].min() and tokens["TOKENS"].max() < 256


# ---- fanout_async -------------------------------------------------------------------------


def test_the_fanout_calls_classify_once_per_item_and_verify_only_when_doubtful(triton):
    """60 requests one after another: fanout_classify answers as many calls as the requests
    had items (ITEM_COUNT), fanout_verify as many as there were doubtful requests (a
    REVIEW_SCORE), fanout_detect one per request (one execute each)."""
    counts, reviewed = [], 0
    with connect(triton, "http") as client:
        before = {m: requests_done(client, m) for m in FANOUT_CALLEES}
        for index in range(60):
            rows = 1 + index % 3
            out = infer(
                client,
                "http",
                "fanout_async",
                {"FEATURES": features(rows, 500 + index)},
                FANOUT_OUTPUTS,
            )
            count = int(out["ITEM_COUNT"][0, 0])
            assert out["ITEM_COUNT"].shape == (rows, 1) and np.all(out["ITEM_COUNT"] == count)
            assert out["ITEM_PROBS"].shape == (rows, 4, 8)
            np.testing.assert_allclose(out["ITEM_PROBS"][:, :count].sum(axis=2), 1.0, rtol=1e-5)
            assert np.all(out["ITEM_PROBS"][:, count:] == 0)
            score = out["REVIEW_SCORE"]
            assert score.shape == (rows, 1)
            if not np.all(score == -1):  # -1: not reviewed
                assert np.all((score > 0) & (score < 1)), score
                reviewed += 1
            counts.append(count)
        expected = {"fanout_detect": 60, "fanout_classify": sum(counts), "fanout_verify": reviewed}
        deadline = time.monotonic() + 10  # a call is counted a moment after its answer
        while (calls := {m: requests_done(client, m) - before[m] for m in FANOUT_CALLEES}) != (
            expected
        ) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert set(counts) == {1, 2, 3, 4}
    # A quarter of standard-normal requests are doubtful: about 15 of 60.
    assert 5 <= reviewed <= 25
    assert calls == expected


def test_the_same_request_makes_the_same_calls_and_gets_the_same_answer(triton):
    batch = features(4, seed=42)
    with connect(triton, "http") as client:
        first = infer(client, "http", "fanout_async", {"FEATURES": batch}, FANOUT_OUTPUTS)
        second = infer(client, "http", "fanout_async", {"FEATURES": batch}, FANOUT_OUTPUTS)
    for name in FANOUT_OUTPUTS:
        assert np.array_equal(first[name], second[name]), name


def test_a_bad_request_to_the_fanout_fails_alone(triton):
    requests = [{"FEATURES": features(2, seed=700 + index)} for index in range(12)]
    requests[7]["FEATURES"][1, 0] = np.nan
    answers = infer_concurrently(triton, "fanout_async", requests, FANOUT_OUTPUTS)
    assert answers[7] == "fanout_async: FEATURES must be finite, got 1 NaN or infinite value(s)"
    assert all(not isinstance(a, str) for i, a in enumerate(answers) if i != 7)
