"""One control tick (tritonscale.control.reconcile) against a real Triton, with a fake clock for `now`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.faults import FreezableRelay
from tests.tooling import require_local_triton
from tests.waiting import eventually
from tritonscale.control.operator_metrics import OperatorMetrics
from tritonscale.control.set_tick import reconcile
from tritonscale.control.tick import (
    FAILED_GET_METRICS,
    FAILED_RESCALE,
    INVALID_SPEC,
    NO_READY_PODS,
    ReconcileState,
)
from tritonscale.local.ports import free_port
from tritonscale.local.triton_server import LocalTriton
from tritonscale.metrics.scrape import ScrapeSource
from tritonscale.triton.actuator import Actuator
from tritonscale.triton.endpoints import Endpoint

SELECTOR = {"matchLabels": {"app.kubernetes.io/component": "triton"}}


def spec(**overrides: object) -> dict:
    return {"selector": SELECTOR, "model": "add_sub", "metricsWindowSeconds": 2, **overrides}


@pytest.fixture(scope="module")
def server() -> Iterator[LocalTriton]:
    require_local_triton()
    with LocalTriton(http_port=0, grpc_port=0, metrics_port=0, models=["add_sub"]) as triton:
        yield triton


@pytest.fixture
async def pods(server: LocalTriton) -> list[Endpoint]:
    """The Triton as one pod, add_sub back at one instance."""
    endpoints = [Endpoint("pod-0", server.http_url, server.metrics_url)]
    assert all(r.ok for r in await Actuator(server.repository_key).apply(endpoints, "add_sub", 1))
    return endpoints


@pytest.fixture
def actuator(server: LocalTriton) -> Actuator:
    return Actuator(server.repository_key)


async def _live(actuator: Actuator, pods: list[Endpoint]) -> int:
    return await actuator.live_count(pods[0], "add_sub")


def _sample(metrics: OperatorMetrics, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return None


def _condition(result, kind: str) -> dict:
    return next(c for c in result.conditions if c["type"] == kind)


async def test_no_ready_pod_is_an_error_result(actuator: Actuator) -> None:
    metrics = OperatorMetrics()
    result = await reconcile(
        spec(), [], ScrapeSource(), actuator, ReconcileState(), 1000.0, metrics=metrics
    )
    assert result.decision is None and result.reason == NO_READY_PODS
    assert _condition(result, "ScalingActive")["status"] == "False"
    text = generate_latest(metrics.registry).decode()
    assert (
        'tritonscale_reconcile_errors_total{autoscaler="add_sub",model="add_sub",namespace="local",reason="NoReadyPods"} 1.0'
        in text
    )


async def test_an_invalid_spec_is_an_error_result_naming_the_field(actuator, pods) -> None:
    bad = spec(minInstances=5, maxInstances=2)
    result = await reconcile(bad, pods, ScrapeSource(), actuator, ReconcileState(), 1000.0)
    assert result.reason == INVALID_SPEC
    assert (
        "spec: minInstances must be <= maxInstances (minInstances is 5, maxInstances is 2)"
        in result.message
    )
    assert await _live(actuator, pods) == 1


async def test_a_count_below_min_is_raised_at_once_and_exported(actuator, pods) -> None:
    metrics = OperatorMetrics()
    now = time.time()
    result = await reconcile(
        spec(minInstances=2),
        pods,
        ScrapeSource(),
        actuator,
        ReconcileState(),
        now,
        metrics=metrics,
        namespace="ns",
        autoscaler="adder",
    )
    assert (result.current_instances, result.desired_instances) == (1, 2)
    assert result.reason == "TooFewInstances"
    assert [(p.pod, p.before, p.after, p.ok) for p in result.applied] == [("pod-0", 1, 2, True)]
    assert await _live(actuator, pods) == 2
    able = _condition(result, "AbleToScale")
    assert (able["status"], able["reason"]) == ("True", "SucceededRescale")
    assert result.state.last_scale_time == now
    assert result.status()["lastScaleTime"]
    labels = {"namespace": "ns", "autoscaler": "adder", "model": "add_sub"}
    assert _sample(metrics, "tritonscale_desired_instances", **labels) == 2
    assert _sample(metrics, "tritonscale_current_instances", **labels) == 1
    assert _sample(metrics, "tritonscale_actuations_total", **labels, result="success") == 1
    assert (
        _sample(
            metrics,
            "tritonscale_decisions_total",
            **labels,
            direction="up",
            reason="TooFewInstances",
        )
        == 1
    )
    assert _sample(metrics, "tritonscale_last_reconcile_timestamp_seconds", **labels) > now - 60
    assert _sample(metrics, "tritonscale_reconcile_duration_seconds_count", namespace="ns") == 1
    # No creation timestamps: a fleet's operator renders few series per autoscaler.
    assert "_created" not in generate_latest(metrics.registry).decode()
    metrics.forget("ns", "adder", "add_sub")
    assert 'autoscaler="adder"' not in generate_latest(metrics.registry).decode()


async def test_a_dry_run_decides_and_applies_nothing(actuator, pods) -> None:
    result = await reconcile(
        spec(minInstances=3, dryRun=True), pods, ScrapeSource(), actuator, ReconcileState(), 1000.0
    )
    assert result.desired_instances == 3 and result.applied == []
    assert result.reason == "DryRun"
    assert _condition(result, "AbleToScale")["reason"] == "DryRun"
    assert await _live(actuator, pods) == 1


async def test_a_paused_autoscaler_acts_on_nothing(actuator, pods) -> None:
    result = await reconcile(
        spec(minInstances=3, paused=True), pods, ScrapeSource(), actuator, ReconcileState(), 1000.0
    )
    assert result.applied == [] and result.reason == "Paused"
    assert await _live(actuator, pods) == 1


async def test_metrics_that_cannot_be_read_hold_the_count(actuator, pods) -> None:
    gone = [Endpoint("pod-0", pods[0].http_url, f"http://127.0.0.1:{free_port()}/metrics")]
    result = await reconcile(
        spec(), gone, ScrapeSource(timeout_s=1), actuator, ReconcileState(), 1000.0
    )
    assert result.reason == FAILED_GET_METRICS
    assert result.decision is not None and result.decision.reason == "MetricsMissing"
    assert result.desired_instances == result.current_instances == 1
    active = _condition(result, "ScalingActive")
    assert (active["status"], active["reason"]) == ("False", FAILED_GET_METRICS)
    assert "cannot read Triton metrics" in active["message"]


async def test_failed_loads_back_off_exponentially_then_recover(server, pods) -> None:
    refused = Actuator("not-the-key")
    source = ScrapeSource()
    wanted = spec(minInstances=2)
    first = await reconcile(
        wanted, pods, source, refused, ReconcileState(), 1000.0, backoff_base_s=10
    )
    assert first.reason == FAILED_RESCALE and "refused" in first.message
    assert [p.ok for p in first.applied] == [False]
    assert first.state.backoff.failures == 1 and first.state.backoff.retry_at == 1010.0
    assert _condition(first, "AbleToScale")["status"] == "False"

    waiting = await reconcile(wanted, pods, source, refused, first.state, 1005.0, backoff_base_s=10)
    assert waiting.applied == [], "no load may be tried while backing off"
    assert "backing off after 1 failed load" in waiting.message

    second = await reconcile(
        wanted, pods, source, refused, waiting.state, 1011.0, backoff_base_s=10
    )
    assert second.state.backoff.failures == 2 and second.state.backoff.retry_at == 1031.0

    capped = second.state.backoff.failed(1031.0, base_s=10, cap_s=25)
    assert capped.retry_at == 1031.0 + 25

    good = Actuator(server.repository_key)
    healed = await reconcile(wanted, pods, source, good, second.state, 1032.0, backoff_base_s=10)
    assert healed.errors == [] and healed.applied[0].ok
    assert healed.state.backoff.failures == 0
    assert await _live(good, pods) == 2


async def test_conditions_keep_their_transition_time_while_unchanged(actuator, pods) -> None:
    source = ScrapeSource()
    first = await reconcile(spec(), pods, source, actuator, ReconcileState(), 1000.0)
    later = await reconcile(spec(), pods, source, actuator, first.state, 1100.0)
    for before, after in zip(first.conditions, later.conditions, strict=True):
        if before["status"] == after["status"]:
            assert after["lastTransitionTime"] == before["lastTransitionTime"]


async def test_the_state_survives_a_round_trip_through_status(actuator, pods) -> None:
    now = float(int(time.time()))
    result = await reconcile(
        spec(minInstances=2), pods, ScrapeSource(), actuator, ReconcileState(), now
    )
    back = ReconcileState.from_status(result.status())
    assert back.policy == result.state.policy
    assert back.backoff == result.state.backoff
    assert back.last_scale_time == now
    assert back.load_in_flight is result.state.load_in_flight is False
    assert ReconcileState.from_status({"loadInFlight": True}).load_in_flight
    assert (
        ReconcileState.from_status({"policyState": {"recommendations": "junk"}}) == ReconcileState()
    )


async def test_a_latency_objective_shows_in_the_status_with_the_measured_mean(
    server, actuator, pods
) -> None:
    source = ScrapeSource()
    wanted = spec(targets={"latency": {"quantile": 0.9, "milliseconds": 250}})
    ticks = [await reconcile(wanted, pods, source, actuator, ReconcileState(), 1000.0)]
    client = tritonclient.http.InferenceServerClient(server.http_url)
    inputs = [tritonclient.http.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
    for item in inputs:
        item.set_data_from_numpy(np.ones(4, dtype=np.float32))

    async def measured() -> dict | None:
        # Requests between two ticks; the rates need the counters read twice around them.
        for _ in range(5):
            client.infer("add_sub", inputs)
        last = ticks[-1]
        ticks.append(await reconcile(wanted, pods, source, actuator, last.state, last.at + 2))
        latency = ticks[-1].status()["latency"]
        return latency if latency["measured"] else None

    try:
        latency = await eventually(measured, "a measured mean latency in the status")
    finally:
        client.close()
    assert (latency["quantile"], latency["objectiveMilliseconds"]) == (0.9, 250.0)
    assert latency["measured"]["meanMilliseconds"] > 0, latency
    # A tick whose window held enough requests sized the set to the objective (on part of a
    # window too, as a set with an objective does): its prediction shows beside the mean.
    predicted = latency.get("predicted")
    assert predicted is None or {"atRps", "met"} <= predicted.keys(), latency
    assert ticks[-1].to_dict()["latency"] == latency
    # Without the objective the status is what it always was.
    plain = await reconcile(spec(), pods, source, actuator, ticks[-1].state, ticks[-1].at + 2)
    assert "latency" not in plain.status() and "latency" not in plain.to_dict()


async def test_children_counts_are_read_from_the_pods(actuator, pods) -> None:
    # add_sub "calls" itself is refused by the spec; a model absent from the pods is left out.
    result = await reconcile(
        spec(calls=["not_loaded_here"]), pods, ScrapeSource(), actuator, ReconcileState(), 1000.0
    )
    assert result.child_instances == {}
    assert result.decision is not None


async def test_the_decision_log_record_is_plain_json(actuator, pods) -> None:
    import json

    result = await reconcile(
        spec(minInstances=2), pods, ScrapeSource(), actuator, ReconcileState(), 1000.0
    )
    record = json.loads(json.dumps(result.to_dict()))
    assert record["model"] == "add_sub" and record["desired"] == 2 and record["current"] == 1
    assert record["applied"][0]["ok"] is True
    assert result.line().split()[1:4] == ["add_sub", "1", "->"]


async def test_a_restarted_pod_is_brought_up_to_its_peers_not_the_peers_down_to_it(
    server: LocalTriton, actuator: Actuator
) -> None:
    """Two pods disagree: one serves 3 instances, the other restarted with the default 1.

    Counterfactual: were `current` the lowest count, the tick would read the restart as a
    scale-down already made and load the healthy pod down to 1 at once, past the
    scale-down window.
    """
    with LocalTriton(
        http_port=0,
        grpc_port=0,
        metrics_port=0,
        models=["add_sub"],
        repository_key=server.repository_key,
    ) as restarted:
        pods = [
            Endpoint("pod-0", server.http_url, server.metrics_url),
            Endpoint("pod-1", restarted.http_url, restarted.metrics_url),
        ]
        assert (await actuator.apply(pods[:1], "add_sub", 3))[0].ok
        result = await reconcile(
            spec(maxInstances=4), pods, ScrapeSource(), actuator, ReconcileState(), time.time()
        )
        assert result.current_instances == 3
        assert any("disagree" in note for note in result.notes)
        assert [await actuator.live_count(pod, "add_sub") for pod in pods] == [3, 3]
    assert (await actuator.apply(pods[:1], "add_sub", 1))[0].ok


async def test_a_pod_that_stops_answering_is_left_out_until_it_answers_again(
    server: LocalTriton, pods: list[Endpoint]
) -> None:
    """A pod that accepts connections and never answers costs the tick that meets it one
    timeout; the ticks after it leave the pod out at once (a note says so) and still scale
    the pods that answer; once it answers again it is back in the tick.

    Counterfactual: without the memory of silent pods, every tick would ask the hung pod
    again and wait out the timeout before deciding for the others.
    """
    actuator = Actuator(server.repository_key, timeout_s=1.0)
    with FreezableRelay(server.http_url) as relay:
        hung = Endpoint("pod-1", relay.url)
        both = [*pods, hung]
        relay.freeze()
        state = ReconcileState()
        first = await reconcile(
            spec(minInstances=2), both, ScrapeSource(), actuator, state, time.time()
        )
        assert first.live_counts == {"pod-0": 2}, first.message
        assert any(note.startswith("pod-1 did not answer") for note in first.notes), first.notes
        assert len(actuator.silent_pods) == 1

        second = await reconcile(
            spec(minInstances=3, maxInstances=3),
            both,
            ScrapeSource(),
            actuator,
            first.state,
            time.time(),
        )
        assert second.live_counts == {"pod-0": 3}, second.message
        left_out = [note for note in second.notes if "left out" in note]
        assert left_out and left_out[0].startswith("pod-1 did not answer"), second.notes

        relay.thaw()
        state, back = second.state, None
        for _ in range(20):
            result = await reconcile(
                spec(minInstances=3, maxInstances=3),
                both,
                ScrapeSource(),
                actuator,
                state,
                time.time(),
            )
            state = result.state
            if "pod-1" in result.live_counts:
                back = result
                break
            await asyncio.sleep(0.5)
        assert back is not None, "pod-1 answers again but was not taken back within 20 ticks"
        assert back.live_counts == {"pod-0": 3, "pod-1": 3}  # the relay's pod is the same server
        assert not any("left out" in note for note in back.notes)
        assert len(actuator.silent_pods) == 0
    assert (await Actuator(server.repository_key).apply(pods, "add_sub", 1))[0].ok
