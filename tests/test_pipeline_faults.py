"""Faults inside a batch, against a real server: an exception from a BLS call, a branch that
leaves out its output, and clients that cancel while their request waits or works.

The server runs a repository of its own (tests/fault_models.py): the real pipeline models, with
test-only switches that make the next N BLS calls to a branch raise, or branch_rank answer
without RELEVANCE.
"""

from __future__ import annotations

import queue
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc
from prometheus_client.parser import text_string_to_metric_families

from tests.fault_models import (
    PIPELINE_MODELS,
    calls_sent,
    cancelled_responses,
    fault_repository,
    raises_left,
    set_omit_relevance,
    set_raise,
)
from tests.model_clients import (
    connect,
    infer,
    infer_concurrently,
    infer_error,
    make_inputs,
    stream_concurrently,
)
from tests.test_pipeline import OUTPUTS, assert_identical, config_override, features
from tests.tooling import require_local_triton
from tests.waiting import wait_for
from tritonscale.local.triton_server import LocalTriton
from tritonscale.metrics.queries import STREAMS_IN_FLIGHT

GATEWAY = "pipeline_gateway"
INJECTED = "branch_rank failed: RuntimeError: injected fault in the BLS call to branch_rank"


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    return fault_repository(tmp_path_factory.mktemp("faults") / "models")


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[LocalTriton]:
    require_local_triton()
    with LocalTriton(
        repository,
        http_port=0,
        grpc_port=0,
        metrics_port=0,
        models=list(PIPELINE_MODELS),
        exit_timeout_s=3,
        log_path=repository.parent / "tritonserver.log",
    ) as triton:
        yield triton


@pytest.fixture(autouse=True)
def no_fault_left(repository: Path) -> Iterator[None]:
    yield
    set_raise(repository, "branch_rank", 0)
    set_omit_relevance(repository, False)


def burst(count: int, seed: int) -> list[dict[str, np.ndarray]]:
    return [{"FEATURES": features(1, seed=seed + index)} for index in range(count)]


def expected_outputs(server: LocalTriton, requests: list[dict]) -> list[dict[str, np.ndarray]]:
    with connect(server, "grpc") as client:
        return [infer(client, "grpc", "pipeline_sync", request, OUTPUTS) for request in requests]


def split_answers(answers: list, expected: list) -> list[str]:
    """The error messages; every other answer must be its request's correct outputs."""
    errors = []
    for answer, outputs in zip(answers, expected, strict=True):
        if isinstance(answer, str):
            errors.append(answer)
        else:
            assert_identical(answer, outputs)
    return errors


def test_an_exception_from_one_bls_call_fails_only_its_request(server, repository):
    # The plain gateway (no micro-batching): each request makes its own three BLS calls, so
    # the one call that raises belongs to exactly one request.
    requests = burst(24, seed=500)
    expected = expected_outputs(server, requests)
    with config_override(server, GATEWAY, {"max_batch_rows": "1"}):
        set_raise(repository, "branch_rank", 1)
        answers = stream_concurrently(server, GATEWAY, requests, OUTPUTS)
    assert split_answers(answers, expected) == [f"{GATEWAY}: {INJECTED}"]
    assert raises_left(repository, "branch_rank") == 0


@pytest.mark.parametrize("model", ["pipeline_async", GATEWAY])
def test_an_exception_from_a_batched_bls_call_fails_only_that_batch(server, repository, model):
    # Batched: the raising call belonged to every request of one batch (at most 32 rows), and
    # to no other; the model goes on serving.
    requests = burst(64, seed=600)
    expected = expected_outputs(server, requests)
    set_raise(repository, "branch_rank", 1)
    if model == GATEWAY:
        answers = stream_concurrently(server, model, requests, OUTPUTS)
    else:
        answers = infer_concurrently(server, model, requests, OUTPUTS)
    errors = split_answers(answers, expected)
    assert 1 <= len(errors) <= 32, errors
    assert set(errors) == {f"{model}: {INJECTED}"}
    assert raises_left(repository, "branch_rank") == 0
    again = stream_concurrently if model == GATEWAY else infer_concurrently
    assert split_answers(again(server, model, requests[:4], OUTPUTS), expected[:4]) == []


def test_pipeline_sync_turns_an_exception_from_exec_into_an_error(server, repository):
    set_raise(repository, "branch_rank", 1)
    with connect(server, "http") as client:
        message = infer_error(client, "http", "pipeline_sync", {"FEATURES": features(2, seed=7)})
    assert message == f"pipeline_sync: {INJECTED}"


@pytest.mark.parametrize("model", ["pipeline_async", "pipeline_sync", GATEWAY])
def test_a_branch_answer_without_its_output_is_an_error_naming_both(server, repository, model):
    set_omit_relevance(repository, True)
    request = {"FEATURES": features(3, seed=8)}
    if model == GATEWAY:
        [message] = stream_concurrently(server, model, [request], OUTPUTS)
    else:
        with connect(server, "http") as client:
            message = infer_error(client, "http", model, request)
    assert message == f"{model}: branch_rank answered without RELEVANCE"


def branch_calls(server: LocalTriton, model: str) -> int:
    with connect(server, "http") as client:
        stats = client.get_inference_statistics(model)["model_stats"][0]
    return stats["inference_stats"]["success"]["count"]


def streams_held(server: LocalTriton, model: str) -> float:
    """The requests a decoupled pipeline holds, admitted and not yet answered: the gauge it
    exports (models/pipeline_gateway)."""
    with urllib.request.urlopen(server.metrics_url, timeout=5) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == STREAMS_IN_FLIGHT and sample.labels.get("model") == model:
                return sample.value
    return 0.0


class Stream:
    """One request on a gRPC stream of its own, which the test can cancel."""

    def __init__(self, server: LocalTriton, model: str, seed: int) -> None:
        self.answers: queue.Queue = queue.Queue()
        self.client = tritonclient.grpc.InferenceServerClient(server.grpc_url)
        self.client.start_stream(callback=lambda result, error: self.answers.put((result, error)))
        inputs = make_inputs("grpc", {"FEATURES": features(1, seed=seed)})
        self.client.async_stream_infer(model, inputs, request_id=str(seed))

    def cancel(self) -> None:
        self.client.stop_stream(cancel_requests=True)
        self.client.close()

    def result(self, timeout_s: float = 30):
        result, error = self.answers.get(timeout=timeout_s)
        self.client.stop_stream()
        self.client.close()
        return result, error


def test_a_gateway_request_cancelled_while_waiting_for_its_batch_sends_no_branch_work(
    server, repository
):
    # branch_embed holds each batch 1.5 s and the gateway keeps one batch at the branches at
    # a time: the second request waits in the micro-batcher, and its client gives up there.
    slow = {"emulated_compute_ms": "1500"}
    one_batch = {"max_batches_in_flight": "1", "batch_window_us": "0"}
    with config_override(server, "branch_embed", slow), config_override(server, GATEWAY, one_batch):
        before = branch_calls(server, "branch_embed")
        sent = calls_sent(repository, "branch_embed")
        cancelled = cancelled_responses(repository, GATEWAY)
        first = Stream(server, GATEWAY, seed=11)
        wait_for(
            lambda: calls_sent(repository, "branch_embed") == sent + 1,
            "the first request's batch sent to branch_embed",
        )
        second = Stream(server, GATEWAY, seed=12)
        wait_for(
            lambda: streams_held(server, GATEWAY) == 2,
            "the gateway holding the second request beside the first",
        )
        second.cancel()
        result, error = first.result()
        assert error is None, error.message()
        # The second batch goes once the first is answered: it must find its request
        # cancelled and send nothing.
        wait_for(lambda: cancelled_responses(repository, GATEWAY) == cancelled + 1, "CANCELLED")
        assert branch_calls(server, "branch_embed") - before == 1


@pytest.mark.parametrize("model", ["pipeline_async", GATEWAY])
def test_a_request_cancelled_while_its_branches_work_gets_no_result(server, repository, model):
    # branch_embed holds the batch 1.5 s; the client cancels meanwhile. The pipeline must
    # check again before answering, and answer CANCELLED, not a result.
    with config_override(server, "branch_embed", {"emulated_compute_ms": "1500"}):
        cancelled = cancelled_responses(repository, model)
        before = branch_calls(server, "branch_embed")
        sent = calls_sent(repository, "branch_embed")

        def at_the_branches() -> None:
            wait_for(
                lambda: calls_sent(repository, "branch_embed") == sent + 1,
                "the request's call sent to branch_embed",
            )

        if model == GATEWAY:
            stream = Stream(server, model, seed=13)
            at_the_branches()
            stream.cancel()
        else:
            client = tritonclient.grpc.InferenceServerClient(server.grpc_url)
            done = threading.Event()
            inputs = make_inputs("grpc", {"FEATURES": features(1, seed=13)})
            call = client.async_infer(model, inputs, lambda result, error: done.set())
            at_the_branches()
            call.cancel()
            assert done.wait(timeout=30)
            client.close()
        wait_for(lambda: cancelled_responses(repository, model) == cancelled + 1, "CANCELLED")
        assert branch_calls(server, "branch_embed") - before == 1
