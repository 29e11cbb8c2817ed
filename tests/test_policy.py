"""The policy's rules, one table row each: sizing, guards, holds and bounds on a single tick.

Every row starts from the same pod set (one pod, two instances of pipeline_async, 100
requests/s, 1.4 compute seconds per second: busy per instance 0.70, on target) and changes
what it needs. The spec of the table turns HPA behavior off (no windows, no rate limits),
so that a row shows one rule; tests/test_policy_behavior.py runs the behavior over ticks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pytest

from tritonscale.core.policy import Decision, PolicyState, decide, max_snapshot_age_s
from tritonscale.core.signals import GpuSignals, MetricSnapshot, ModelSignals
from tritonscale.core.spec import AutoscalerSpec

pytestmark = pytest.mark.unit

MODEL = "pipeline_async"
CHILDREN = ("branch_embed", "branch_classify", "branch_rank")
NOW = 1_000_000.0

# No stabilization and no rate limit worth the name: one tick shows one rule.
NO_BEHAVIOR = {
    "scaleUp": {
        "stabilizationWindowSeconds": 0,
        "policies": [{"type": "Instances", "value": 1000, "periodSeconds": 1}],
    },
    "scaleDown": {
        "stabilizationWindowSeconds": 0,
        "policies": [{"type": "Percent", "value": 100, "periodSeconds": 1}],
    },
}


def make_spec(**overrides: Any) -> AutoscalerSpec:
    d: dict[str, Any] = {
        "selector": {"matchLabels": {"app.kubernetes.io/component": "triton"}},
        "model": MODEL,
        "calls": list(CHILDREN),
        "minInstances": 1,
        "maxInstances": 16,
        "behavior": NO_BEHAVIOR,
    }
    d.update(overrides)
    return AutoscalerSpec.from_dict(d)


def signals(
    model: str = MODEL,
    compute: float = 1.4,
    queue: float = 0.0,
    pending: float = 0.0,
    pods: int = 1,
    requests: float = 100.0,
    executions: float | None = None,
    decoupled: bool = False,
    streams: float | None = None,
) -> ModelSignals:
    return ModelSignals(
        model=model,
        request_rate=requests,
        failure_rate=0.0,
        execution_rate=requests if executions is None else executions,
        compute_seconds_per_second=compute,
        queue_seconds_per_second=queue,
        pending_requests=pending,
        pods_reporting=pods,
        decoupled=decoupled,
        streams_in_flight=streams,
    )


def streaming(
    model: str = MODEL, *, compute: float = 0.02, streams: float = 4.0, **kwargs: Any
) -> ModelSignals:
    """A decoupled model with an async execute: Triton times only the hand-off (0.2 ms per
    request at 100 requests/s here), the model's own gauge counts its open streams."""
    return signals(model, compute=compute, decoupled=True, streams=streams, **kwargs)


def snapshot(
    *models: ModelSignals,
    taken_at: float = NOW,
    gpu: GpuSignals | None = None,
    complete: bool = True,
) -> MetricSnapshot:
    return MetricSnapshot(
        taken_at=taken_at,
        window_s=60.0,
        models={m.model: m for m in models},
        gpu=gpu,
        complete=complete,
    )


@dataclass(frozen=True)
class Case:
    name: str
    desired: int
    reason: str
    current: int = 2
    model: ModelSignals = field(default_factory=signals)
    children: tuple[ModelSignals, ...] = ()
    child_instances: dict[str, int] = field(default_factory=dict)
    gpu: GpuSignals | None = None
    spec: dict[str, Any] = field(default_factory=dict)
    recommended: int | None = None  # checked when set
    in_message: tuple[str, ...] = ()


SIZING = [
    Case("load on target keeps the count", 2, "WithinTolerance"),
    # 0.95 / 0.70 * 2 = 2.71: the HPA's ceil gives 3, not a step of one "because it is high".
    Case(
        "busy above target sizes by the HPA ratio",
        3,
        "HighUtilization",
        model=signals(compute=1.9),
        in_message=("busy per instance 0.95", "target 0.70", "2 -> 3"),
    ),
    # 7.0 / 0.70 = 10: one decision, not eight steps of one.
    Case(
        "a large load jumps straight to its size", 10, "HighUtilization", model=signals(compute=7.0)
    ),
    # (1 + 1.4) / (1 + 0.5) = 1.6, * 2 = 3.2 -> 4, with busy on target.
    Case(
        "a long queue sizes by (1 + ratio) / (1 + target)",
        4,
        "HighQueueTime",
        model=signals(compute=1.4, queue=1.96),
        in_message=("queue/compute ratio 1.40",),
    ),
    # busy 0.09 / 0.70 is under half its target: the queue in front of idle instances is
    # batching delay, so it has no say. Without that floor it would ask for (1 + 0.7) / 1.5
    # * 2 = 2.27 -> 3, and low utilization would take the instance back a window later.
    Case(
        "a queue in front of idle instances adds nothing",
        1,
        "LowUtilization",
        model=signals(compute=0.18, queue=0.126),
    ),
    # The same queue ratio with busy at 0.40 (above half the 0.70 target) does count.
    Case(
        "a queue in front of busy instances asks for more",
        3,
        "HighQueueTime",
        model=signals(compute=0.8, queue=0.56),
    ),
    # 8 pending / 2 instances = 4 per instance, twice the target of 2.
    Case(
        "many pending requests size by pending per instance",
        4,
        "HighPending",
        model=signals(pending=8.0),
    ),
    # busy asks for 3, pending for 4: the larger need wins and names the reason.
    Case("the largest need wins", 4, "HighPending", model=signals(compute=1.9, pending=8.0)),
    # 0.2 / 0.7 * 4 = 1.14 -> 2. Had a short queue voted ceil(4 / 1.5) = 3, it would have
    # slowed every scale-down of an idle model.
    Case(
        "a short queue does not slow a scale-down",
        2,
        "LowUtilization",
        current=4,
        model=signals(compute=0.8, queue=0.0),
    ),
    Case(
        "an idle model goes to minInstances",
        2,
        "TooFewInstances",
        current=5,
        model=signals(compute=0.0, requests=0.0),
        spec={"minInstances": 2},
        recommended=0,
    ),
    # Batches of four: the counters say 5.6 s/s, the instances are busy 1.4 s/s in all.
    Case(
        "batching is corrected by executions per request",
        2,
        "WithinTolerance",
        model=signals(compute=5.6, executions=25.0),
    ),
    # Without the correction busy would be 1.4 and the count 4.
    Case(
        "a model with batches of four that looks busy is not",
        1,
        "LowUtilization",
        model=signals(compute=1.4, executions=25.0),
    ),
    # 2.8 s/s over 2 pods x 2 instances = 0.7 each.
    Case(
        "rates are shared by the pods reporting",
        2,
        "WithinTolerance",
        model=signals(compute=2.8, pods=2),
    ),
    Case(
        "a need above maxInstances is held to it",
        16,
        "TooManyInstances",
        model=signals(compute=70.0),
        recommended=100,
        in_message=("maxInstances is 16",),
    ),
]


# Decoupled models. Streams in flight (+ queued requests) per instance against the
# pendingPerInstance target (2) size one that reports its streams; Triton's timings of it
# (the hand-off) have no say.
DECOUPLED = [
    # 4 streams over 2 instances: 2 each, on target.
    Case("a streaming model on target keeps the count", 2, "WithinTolerance", model=streaming()),
    # 12 streams / 2 instances = 6 per instance, 3 x the target: 2 x 3 = 6. Busy per
    # instance reads 0.01 and would have asked for 1.
    Case(
        "a streaming model sizes by its streams, not its idle-looking compute",
        6,
        "HighStreamsInFlight",
        model=streaming(streams=12.0),
        in_message=("streams in flight per instance 6.00", "target 2.00"),
    ),
    # Requests still queued for the model count as held too: (4 + 4) / 2 = 4 per instance.
    Case(
        "queued requests count with the streams",
        4,
        "HighStreamsInFlight",
        model=streaming(streams=4.0, pending=4.0),
    ),
    # 1 stream over 4 instances: 0.25 per instance -> ceil(4 x 0.125) = 1.
    Case(
        "few streams give instances back",
        1,
        "LowUtilization",
        current=4,
        model=streaming(streams=1.0),
    ),
    # Streams are shared by the pods reporting: 8 / (2 pods x 2 instances) = 2.
    Case(
        "streams are shared by the pods reporting",
        2,
        "WithinTolerance",
        model=streaming(streams=8.0, pods=2),
    ),
    # Its queue ratio (queue time over a tiny hand-off) is meaningless, and has no say.
    Case(
        "a streaming model's queue ratio has no say",
        2,
        "WithinTolerance",
        model=streaming(compute=0.02, queue=0.2),
    ),
    # square_int32's kind: execute holds the stream, Triton times it as compute, no gauge:
    # the usual signals (busy 0.95 asks for 3).
    Case(
        "a decoupled model without a streams gauge keeps Triton's signals",
        3,
        "HighUtilization",
        model=signals(compute=1.9, decoupled=True),
    ),
    # A gauge on a model whose config is not decoupled is not the operator's business.
    Case(
        "a gauge on a model that is not decoupled is ignored",
        2,
        "WithinTolerance",
        model=signals(streams=40.0),
    ),
    Case(
        "a streaming child saturated by its streams holds its parent",
        2,
        "ChildSaturated",
        model=signals(compute=1.9),
        children=(streaming("branch_embed", streams=12.0),),
        child_instances={"branch_embed": 2},
        in_message=("branch_embed is saturated", "streams in flight per instance 6.00"),
    ),
    # Its queue ratio would say saturated (0.5 / 0.02), its streams say it has room.
    Case(
        "a streaming child with room lets its parent grow",
        3,
        "HighUtilization",
        model=signals(compute=1.9),
        children=(streaming("branch_embed", streams=2.0, queue=0.5),),
        child_instances={"branch_embed": 2},
    ),
]


def _tolerance_cases() -> list[Case]:
    """Both sides of both edges of the deadband, back-computed from the tolerance.

    At 10 instances a ratio of 0.89 is one instance fewer (ceil(8.9) = 9); at 2 it would
    round back to 2 and hide the edge.
    """
    cases = []
    for factor, desired, reason, side in [
        (1.1 - 0.01, 10, "WithinTolerance", "just inside the upper edge keeps the count"),
        (1.1 + 0.01, 12, "HighUtilization", "just outside the upper edge scales up"),
        (0.9 + 0.01, 10, "WithinTolerance", "just inside the lower edge keeps the count"),
        (0.9 - 0.01, 9, "LowUtilization", "just outside the lower edge scales down"),
    ]:
        cases.append(
            Case(
                f"tolerance: {side}",
                desired,
                reason,
                current=10,
                model=signals(compute=0.7 * factor * 10),
            )
        )
    return cases


GUARDS = [
    Case(
        "a GPU at its utilization ceiling adds no instance",
        2,
        "GpuSaturated",
        model=signals(compute=1.9),
        gpu=GpuSignals(utilization=0.9, memory_fraction=0.2),
        recommended=3,
        in_message=("GPU utilization 0.90", "more pods (the HPA)"),
    ),
    # The counterfactual of the row above: just under the ceiling, the load decides.
    Case(
        "a GPU just under its ceiling lets the load decide",
        3,
        "HighUtilization",
        model=signals(compute=1.9),
        gpu=GpuSignals(utilization=0.89, memory_fraction=0.2),
    ),
    Case(
        "a GPU at its memory ceiling adds no instance",
        2,
        "GpuSaturated",
        model=signals(compute=1.9),
        gpu=GpuSignals(utilization=0.3, memory_fraction=0.95),
        in_message=("GPU memory 0.95",),
    ),
    Case(
        "a full GPU still lets a model give instances back",
        1,
        "LowUtilization",
        current=4,
        model=signals(compute=0.4),
        gpu=GpuSignals(utilization=1.0, memory_fraction=1.0),
    ),
    # branch_embed: 3.8 s/s over 4 instances = 0.95 busy, beyond 0.70 * 1.1.
    Case(
        "a saturated child holds its parent",
        2,
        "ChildSaturated",
        model=signals(compute=1.9),
        children=(signals("branch_embed", compute=3.8),),
        child_instances={"branch_embed": 4},
        recommended=3,
        in_message=("branch_embed is saturated", "scale branch_embed, not pipeline_async"),
    ),
    Case(
        "a child queueing beyond its target holds its parent",
        2,
        "ChildSaturated",
        model=signals(compute=1.9),
        children=(signals("branch_rank", compute=2.0, queue=3.0),),
        child_instances={"branch_rank": 4},
        in_message=("branch_rank",),
    ),
    Case(
        "two saturated children are both named, the worst first",
        2,
        "ChildSaturated",
        model=signals(compute=1.9),
        children=(signals("branch_embed", compute=3.2), signals("branch_rank", compute=3.8)),
        child_instances={"branch_embed": 4, "branch_rank": 4},
        in_message=("branch_rank and branch_embed are saturated",),
    ),
    Case(
        "children with room let the parent grow",
        3,
        "HighUtilization",
        model=signals(compute=1.9),
        children=(signals("branch_embed", compute=2.0),),
        child_instances={"branch_embed": 4},
    ),
    # Without its count the child cannot be judged, and the policy does not guess.
    Case(
        "a child of unknown count is not judged",
        3,
        "HighUtilization",
        model=signals(compute=1.9),
        children=(signals("branch_embed", compute=3.8),),
    ),
    Case(
        "a model that calls nothing ignores the others' load",
        3,
        "HighUtilization",
        model=signals(compute=1.9),
        children=(signals("branch_embed", compute=3.8),),
        child_instances={"branch_embed": 4},
        spec={"calls": []},
    ),
    Case(
        "a saturated child does not stop its parent shrinking",
        1,
        "LowUtilization",
        current=4,
        model=signals(compute=0.4),
        children=(signals("branch_embed", compute=3.8),),
        child_instances={"branch_embed": 4},
    ),
]

BOUNDS = [
    Case(
        "a count above maxInstances goes to it at once",
        4,
        "TooManyInstances",
        current=7,
        spec={"maxInstances": 4},
        in_message=("7 -> 4", "above maxInstances 4"),
    ),
    Case(
        "a count below minInstances goes to it at once",
        3,
        "TooFewInstances",
        current=1,
        spec={"minInstances": 3},
    ),
    Case(
        "paused holds even outside the bounds",
        7,
        "Paused",
        current=7,
        spec={"maxInstances": 4, "paused": True},
    ),
    Case("paused holds under load", 2, "Paused", model=signals(compute=7.0), spec={"paused": True}),
    # dryRun is the driver's business: the decision is the same as without it.
    Case(
        "dry run still decides",
        10,
        "HighUtilization",
        model=signals(compute=7.0),
        spec={"dryRun": True},
    ),
]


def run(case: Case) -> Decision:
    spec = make_spec(**case.spec)
    snap = snapshot(case.model, *case.children, gpu=case.gpu)
    return decide(spec, case.current, snap, PolicyState(), NOW, case.child_instances)


ALL = SIZING + DECOUPLED + _tolerance_cases() + GUARDS + BOUNDS


@pytest.mark.parametrize("case", ALL, ids=[case.name for case in ALL])
def test_one_rule(case: Case) -> None:
    decision = run(case)
    assert (decision.desired_instances, decision.reason) == (case.desired, case.reason), (
        decision.message
    )
    if case.recommended is not None:
        assert decision.recommended_instances == case.recommended
    for text in case.in_message:
        assert text in decision.message
    assert "\n" not in decision.message
    expected_direction = (
        "up" if case.desired > case.current else "down" if case.desired < case.current else "none"
    )
    assert decision.direction == expected_direction
    assert decision.scaling_limited.status is (
        case.reason in {"GpuSaturated", "ChildSaturated", "TooManyInstances", "TooFewInstances"}
    )


class TestHolds:
    """Without trustworthy metrics the policy holds, whatever the load would have said."""

    HIGH = signals(compute=7.0)  # would scale 2 -> 10
    LOW = signals(compute=0.1)  # would scale 2 -> 1

    @pytest.mark.parametrize("load", [HIGH, LOW], ids=["under high load", "under low load"])
    @pytest.mark.parametrize(
        "snap, reason",
        [
            (None, "MetricsMissing"),
            (snapshot(signals("branch_embed")), "MetricsMissing"),
            ("stale", "MetricsStale"),
            ("incomplete", "WarmingUp"),
            ("nan", "MetricsMissing"),
            ("no pods", "MetricsMissing"),
        ],
        ids=[
            "no snapshot",
            "model missing",
            "stale",
            "incomplete window",
            "a NaN counter",
            "no pod reporting",
        ],
    )
    def test_holds(self, load: ModelSignals, snap: Any, reason: str) -> None:
        spec = make_spec()
        if snap == "stale":
            snap = snapshot(load, taken_at=NOW - max_snapshot_age_s(spec) - 1)
        elif snap == "incomplete":
            snap = snapshot(load, complete=False)
        elif snap == "nan":
            snap = snapshot(ModelSignals(**{**load.__dict__, "queue_seconds_per_second": math.nan}))
        elif snap == "no pods":
            snap = snapshot(ModelSignals(**{**load.__dict__, "pods_reporting": 0}))
        decision = decide(spec, 2, snap, PolicyState(), NOW)
        assert (decision.desired_instances, decision.reason) == (2, reason)
        assert decision.scaling_active.status is False
        assert decision.scaling_active.reason == reason
        assert decision.recommended_instances is None

    def test_a_snapshot_just_young_enough_is_used(self) -> None:
        # The counterfactual of "stale": one second younger, the load decides.
        spec = make_spec()
        snap = snapshot(self.HIGH, taken_at=NOW - max_snapshot_age_s(spec) + 1)
        assert decide(spec, 2, snap, PolicyState(), NOW).reason == "HighUtilization"

    def test_stale_is_two_intervals_and_a_grace(self) -> None:
        assert max_snapshot_age_s(make_spec(intervalSeconds=15)) == 2 * 15 + 15
        assert max_snapshot_age_s(make_spec(intervalSeconds=60)) == 2 * 60 + 15

    def test_a_stale_snapshot_still_reports_what_it_saw(self) -> None:
        spec = make_spec()
        snap = snapshot(self.HIGH, taken_at=NOW - 3600)
        decision = decide(spec, 2, snap, PolicyState(), NOW)
        assert decision.observed["busyPerInstance"] == 3.5
        assert "3600 s old" in decision.message


class TestTheDecision:
    def test_the_observed_signals_use_the_status_names(self) -> None:
        snap = snapshot(
            signals(compute=1.9, queue=0.95, pending=3.0),
            gpu=GpuSignals(utilization=0.41, memory_fraction=0.22),
        )
        decision = decide(make_spec(), 2, snap, PolicyState(), NOW)
        assert dict(decision.observed) == {
            "requestRate": 100.0,
            "busyPerInstance": 0.95,
            "queueComputeRatio": 0.5,
            "pendingPerInstance": 1.5,
            "gpuUtilization": 0.41,
            "gpuMemoryFraction": 0.22,
        }

    def test_a_streaming_model_reports_its_streams_per_instance(self) -> None:
        decision = decide(make_spec(), 2, snapshot(streaming(streams=5.0)), PolicyState(), NOW)
        assert decision.observed["streamsInFlightPerInstance"] == 2.5
        assert decision.observed["busyPerInstance"] == 0.01
        plain = decide(make_spec(), 2, snapshot(signals(streams=5.0)), PolicyState(), NOW)
        assert "streamsInFlightPerInstance" not in plain.observed

    def test_the_message_is_one_readable_sentence_with_the_numbers(self) -> None:
        decision = run(Case("", 3, "HighUtilization", model=signals(compute=1.9)))
        assert decision.message == (
            "pipeline_async 2 -> 3 instances: busy per instance 0.95 is above the target 0.70 "
            "and asks for 3 instances"
        )

    def test_conditions_say_active_and_not_limited_on_a_plain_scale_up(self) -> None:
        decision = run(Case("", 3, "HighUtilization", model=signals(compute=1.9)))
        assert (
            decision.scaling_active.status and decision.scaling_active.reason == "ValidMetricFound"
        )
        assert not decision.scaling_limited.status
        assert decision.scaling_limited.reason == "DesiredWithinRange"
        assert decision.able_to_scale.reason == "ReadyForNewScale"

    @pytest.mark.parametrize("current", [0, -1])
    def test_no_live_count_is_an_error_not_a_division_by_zero(self, current: int) -> None:
        with pytest.raises(
            ValueError, match=r"current_instances must be >= 1, got -?\d.*NoReadyPods"
        ):
            decide(make_spec(), current, snapshot(signals()), PolicyState(), NOW)

    def test_the_decision_does_not_change_its_inputs(self) -> None:
        state = PolicyState()
        spec = make_spec()
        decide(spec, 2, snapshot(signals(compute=7.0)), state, NOW)
        assert state == PolicyState()
