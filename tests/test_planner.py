"""The set planner (tritonscale.core.planner.decide_set) and its verifier
(tritonscale.core.verifier), tick after tick on the closed-form pipeline of
tests/pipeline_load.py: each tick's snapshot is the steady load at the counts the last tick
decided (every load lands at once).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.pipeline_load import (
    CHILDREN,
    PARENT,
    WINDOW_S,
    Load,
    counts,
    make_spec,
    pipeline_specs,
)
from tritonscale.core import verifier
from tritonscale.core.allocator import Room
from tritonscale.core.budget import BUDGET_EXHAUSTED
from tritonscale.core.planner import (
    LOAD_STEP_IN_WINDOW,
    SetDecision,
    SetState,
    as_policy_decision,
    decide_set,
)
from tritonscale.core.policy import (
    GPU_SATURATED,
    METRICS_MISSING,
    METRICS_STALE,
    PAUSED,
    WARMING_UP,
)
from tritonscale.core.signals import GpuSignals, MetricSnapshot, ModelSignals
from tritonscale.core.sizing import HIGH_STREAMS_IN_FLIGHT
from tritonscale.core.spec import AutoscalerSpec

pytestmark = pytest.mark.unit

START = 1_000_000.0
TICK_S = 15.0
PROFILE = settings(
    max_examples=25, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)


@dataclass
class Run:
    """A pod set ticking: the decisions, and the counts each tick ran at."""

    decisions: list[SetDecision]
    ran: list[dict[str, int]]

    @property
    def last(self) -> SetDecision:
        return self.decisions[-1]


def run(
    specs: Mapping[str, AutoscalerSpec],
    start: Mapping[str, int],
    load: Callable[[float, Mapping[str, int]], MetricSnapshot],
    ticks: int,
    state: SetState | None = None,
    first_tick: int = 0,
) -> Run:
    at, state = dict(start), state or SetState()
    decisions, ran = [], []
    for tick in range(first_tick, first_tick + ticks):
        now = START + tick * TICK_S
        decision = decide_set(specs, at, load(now, at), state, now)
        decisions.append(decision)
        ran.append(at)
        # The state is stored in a CR's status between ticks: it must survive JSON.
        state = SetState.from_dict(json.loads(json.dumps(decision.state.to_dict())))
        at = decision.targets
    return Run(decisions, ran)


def steady(
    offered_rps: float, **fields: object
) -> Callable[[float, Mapping[str, int]], MetricSnapshot]:
    def snapshot(now: float, at: Mapping[str, int]) -> MetricSnapshot:
        return Load(offered_rps, **fields).snapshot(now, at)  # type: ignore[arg-type]

    return snapshot


def contended(offered_rps: float) -> Callable[[float, Mapping[str, int]], MetricSnapshot]:
    """branch_embed's instances take one lock: each added instance only waits (20 ms per
    request per instance), so the model serves 50 req/s at any count."""

    def snapshot(now: float, at: Mapping[str, int]) -> MetricSnapshot:
        service = {
            "branch_embed": 0.020 * at["branch_embed"],
            "branch_classify": 0.005,
            "branch_rank": 0.005,
        }
        return Load(offered_rps, service_s=service).snapshot(now, at)

    return snapshot


class TestTicks:
    def test_the_child_bottleneck_gets_the_parents_instances(self) -> None:
        # The measured fault: 4/1/1/1 on a budget of 7 while branch_embed is the bottleneck.
        # 1/4/1/1 serves 166.7 req/s of the 200 offered, the most any split of 7 serves.
        specs = pipeline_specs(7)
        ticks = run(specs, counts(4, 1), steady(200.0), 40)
        assert ticks.last.targets == counts(1, 4)
        assert ticks.last.prediction is not None
        assert ticks.last.prediction.capacity_rps == pytest.approx(4 / 0.024)
        room = Room.of(specs)
        assert all(room.fits(at) for at in ticks.ran)

    def test_an_increase_waits_for_the_room_another_model_gives_back(self) -> None:
        # branch_embed, steered to 0.3, asks for 4 at once; the parent gives back one instance
        # a minute (its scaleDown policy): branch_embed takes the room as it comes free.
        specs = pipeline_specs(7, branch_embed={"targets": {"utilization": 0.3}})
        ticks = run(specs, counts(4, 1), steady(200.0), 30)
        embed = [d.models["branch_embed"] for d in ticks.decisions]
        assert embed[0].reason == BUDGET_EXHAUSTED
        assert embed[0].allocated_instances == 4 and embed[0].desired_instances == 2
        assert "waits for room" in embed[0].message
        assert ticks.last.targets == counts(1, 4)
        room = Room.of(specs)
        assert all(room.fits(at) for at in ticks.ran)

    def test_a_count_just_lowered_is_not_raised_on_the_windows_it_was_lowered_by(self) -> None:
        # branch_embed went from 3 to 2 at the last tick (two roots trading an instance, the
        # old one's queue draining, say) while the load stayed: the windows still time it at
        # 3, and they do not take it back up. Once a window lies wholly after the change, its
        # estimates are its own again and the budget's best split (1/4/1/1) is taken.
        specs, load = pipeline_specs(7), steady(300.0)
        state, before = SetState(), counts(1, 3)
        for tick in range(4):
            now = START + tick * TICK_S
            state = decide_set(specs, before, load(now, before), state, now).state
        after = counts(1, 2)
        lowered = run(specs, after, load, 8, state, first_tick=4)
        embed = [d.models["branch_embed"].desired_instances for d in lowered.decisions]
        assert embed[:3] == [2, 2, 2]  # the windows (60 s) still hold the change
        assert embed[3] > 2
        assert lowered.last.targets == counts(1, 4)

    def test_the_first_window_across_a_load_step_is_not_decided_on(self) -> None:
        # 100 req/s, then 300 from a moment 15 s before a tick: that tick's window (60 s)
        # holds a quarter of the new load and reads 150 req/s. Every model holds at that
        # tick, whatever the mix asks for; the next tick, on a window half at the new load,
        # decides (one tick only: a load that keeps moving is decided on).
        specs = pipeline_specs(None)
        step_at = START + 8 * TICK_S - 15.0

        def stepped(now: float, at: Mapping[str, int]) -> MetricSnapshot:
            high = min(1.0, max(0.0, (now - step_at) / WINDOW_S))
            return Load(100.0 + 200.0 * high).snapshot(now, at)

        ticks = run(specs, counts(1, 3), stepped, 12)
        before, first, second = (ticks.decisions[i] for i in (7, 8, 9))
        assert not any(d.changes for d in before.models.values())
        assert {d.reason for d in first.models.values()} == {LOAD_STEP_IN_WINDOW}
        assert "from 100.0 to 150.0 req/s" in first.models[PARENT].message
        assert not any(d.changes for d in first.models.values())
        assert second.models["branch_embed"].desired_instances > 3
        # A steady load never waits.
        calm = run(specs, counts(1, 3), steady(100.0), 12)
        assert all(
            d.reason != LOAD_STEP_IN_WINDOW for tick in calm.decisions for d in tick.models.values()
        )

    def test_the_state_round_trips_through_a_dict(self) -> None:
        ticks = run(pipeline_specs(7), counts(2, 2), steady(100.0), 10)
        state = ticks.last.state
        assert SetState.from_dict(json.loads(json.dumps(state.to_dict()))) == state

    @pytest.mark.parametrize(
        "malformed", [{"history": {"windows": [1]}}, {"policies": {"m": {"recommendations": [{}]}}}]
    )
    def test_a_malformed_state_is_refused_in_one_line(self, malformed: dict) -> None:
        with pytest.raises(ValueError, match="malformed"):
            SetState.from_dict(malformed)

    def test_a_model_without_a_live_count_is_refused(self) -> None:
        at = counts(1, 1)
        del at["branch_rank"]
        with pytest.raises(ValueError, match="branch_rank"):
            decide_set(pipeline_specs(7), at, None, SetState(), START)


@dataclass(frozen=True)
class Unusable:
    name: str
    snapshot: Callable[[Mapping[str, int]], MetricSnapshot | None]
    reason: str


UNUSABLE = [
    Unusable("no snapshot holds every count", lambda at: None, METRICS_MISSING),
    Unusable(
        "a stale snapshot holds every count",
        lambda at: Load(200.0).snapshot(START - 600.0, at),
        METRICS_STALE,
    ),
    Unusable(
        "an incomplete window holds every count",
        lambda at: MetricSnapshot(START, 20.0, Load(200.0).signals(at), complete=False),
        WARMING_UP,
    ),
]


@pytest.mark.parametrize("case", UNUSABLE, ids=lambda case: case.name)
def test_unusable_metrics(case: Unusable) -> None:
    at = counts(4, 1)
    decision = decide_set(pipeline_specs(7), at, case.snapshot(at), SetState(), START)
    assert decision.targets == at
    assert {d.reason for d in decision.models.values()} == {case.reason}
    assert decision.prediction is None


def test_a_paused_model_holds_and_keeps_its_room() -> None:
    specs = pipeline_specs(7, pipeline_async={"paused": True})
    at = counts(4, 1)
    decision = decide_set(specs, at, Load(200.0).snapshot(START, at), SetState(), START)
    assert decision.models[PARENT].reason == PAUSED
    assert decision.targets[PARENT] == 4
    assert sum(decision.targets.values()) <= 7


def test_a_count_above_its_maximum_goes_to_it_at_once() -> None:
    specs = pipeline_specs(7, branch_rank={"maxInstances": 1})
    at = counts(1, 1, rank=3)
    decision = decide_set(specs, at, Load(50.0).snapshot(START, at), SetState(), START)
    assert decision.targets["branch_rank"] == 1


def on_pods(
    load: Callable[[float, Mapping[str, int]], MetricSnapshot], pods: int
) -> Callable[[float, Mapping[str, int]], MetricSnapshot]:
    """The same load on each of `pods` pods: every rate and gauge summed over them."""

    def snapshot(now: float, at: Mapping[str, int]) -> MetricSnapshot:
        one = load(now, at)
        models = {
            model: replace(
                s,
                request_rate=s.request_rate * pods,
                failure_rate=s.failure_rate * pods,
                execution_rate=s.execution_rate * pods,
                compute_seconds_per_second=s.compute_seconds_per_second * pods,
                queue_seconds_per_second=s.queue_seconds_per_second * pods,
                pending_requests=s.pending_requests * pods,
                pods_reporting=pods,
            )
            for model, s in one.models.items()
        }
        return replace(one, models=models)

    return snapshot


def test_counts_are_per_pod_whatever_the_number_of_pods() -> None:
    # Ten pods that each see what one pod sees report ten times its rates; the counts are
    # per pod, so they go where one pod's go, tick after tick (at a load that holds every
    # model under its target, and at one the budget cannot).
    for offered, budget in ((60.0, None), (200.0, 7)):
        specs = pipeline_specs(budget)
        one = run(specs, counts(1, 1), steady(offered), 12)
        ten = run(specs, counts(1, 1), on_pods(steady(offered), 10), 12)
        assert ten.ran == one.ran
        assert ten.last.prediction is not None and one.last.prediction is not None
        assert ten.last.prediction.capacity_rps == pytest.approx(
            10 * one.last.prediction.capacity_rps
        )


STREAMS = "stream_tokens"  # a decoupled model beside the pipeline, sized by its streams


def with_streams(
    offered_rps: float, streams: float, **gpu: float
) -> Callable[[float, Mapping[str, int]], MetricSnapshot]:
    """The pipeline's steady load, with a decoupled model whose `execute` returns at once
    (Triton counts no busy time) holding `streams` open, and the pods' GPU when given."""

    def snapshot(now: float, at: Mapping[str, int]) -> MetricSnapshot:
        models = Load(offered_rps).signals(at)
        if STREAMS in at:
            models[STREAMS] = ModelSignals(
                STREAMS, 40.0, 0.0, 40.0, 0.0, 0.0, 0.0, 1, decoupled=True,
                streams_in_flight=streams,
            )  # fmt: skip
        return MetricSnapshot(now, WINDOW_S, models, gpu=GpuSignals(**gpu) if gpu else None)

    return snapshot


def test_a_model_the_pipeline_cannot_time_is_sized_on_its_own_streams() -> None:
    # Its timings miss its work, so the pipeline model leaves it out; its streams (8 open on
    # one instance, against 2 per instance) ask for 4, as they would for the model alone, and
    # its instances count in the budget.
    specs = {**pipeline_specs(None), STREAMS: make_spec(STREAMS)}
    at = {**counts(1, 2), STREAMS: 1}
    decision = decide_set(specs, at, with_streams(40.0, 8.0)(START, at), SetState(), START)
    stream = decision.models[STREAMS]
    assert (stream.desired_instances, stream.reason) == (4, HIGH_STREAMS_IN_FLIGHT)
    assert "streams in flight per instance" in stream.message
    # Few streams: it comes down, once its scaleDown window has passed.
    quiet = run(specs, {**at, STREAMS: 4}, with_streams(40.0, 0.5), 30)
    assert quiet.last.targets[STREAMS] == 1
    # No usable signals: it keeps its count.
    no_signals = steady(40.0)
    kept = decide_set(specs, at, no_signals(START, at), SetState(), START)
    assert kept.targets[STREAMS] == 1


def test_a_short_budget_reports_what_each_model_would_take_were_there_room() -> None:
    # 300 req/s on a budget of 4: the split fits the budget, and each model's recommendation
    # is what would hold it under its target. Their sum over the budget is the budget's
    # demand ratio above 1: the HPA's signal that the pods are too few.
    specs, at = pipeline_specs(4), counts(1, 1)
    snapshot = Load(300.0).snapshot(START, at)
    decided = decide_set(specs, at, snapshot, SetState(), START)
    assert sum(decided.targets.values()) <= 4
    wanted = {m: d.wanted_instances for m, d in decided.models.items()}
    assert all(w is not None and w >= decided.targets[m] for m, w in wanted.items()), wanted
    assert sum(w or 0 for w in wanted.values()) > 4, wanted
    recommended = as_policy_decision(specs["branch_embed"], decided, snapshot)
    assert recommended.recommended_instances == wanted["branch_embed"]
    # Those held below it say so: ScalingLimited, BudgetExhausted (the Warning's reason).
    held = [m for m, d in decided.models.items() if (d.wanted_instances or 0) > decided.targets[m]]
    assert held
    for model in held:
        limited = as_policy_decision(specs[model], decided, snapshot).scaling_limited
        assert (limited.status, limited.reason) == (True, BUDGET_EXHAUSTED)
        assert "the budget triton allows" in limited.message
    # With room, the recommendation is the count chosen.
    roomy = decide_set(pipeline_specs(None), at, snapshot, SetState(), START)
    assert {m: d.wanted_instances for m, d in roomy.models.items()} == roomy.targets


def test_a_full_gpu_takes_no_more_instances() -> None:
    # 300 req/s on 1/1/1/1 asks for more instances; at the GPU's utilization ceiling (0.9 by
    # default) no model goes above today's count, and each one refused says why.
    specs, at = pipeline_specs(None), counts(1, 1)

    def on_gpu(utilization: float, memory_fraction: float) -> SetDecision:
        gpu = with_streams(300.0, 0.0, utilization=utilization, memory_fraction=memory_fraction)
        return decide_set(specs, at, gpu(START, at), SetState(), START)

    free = on_gpu(0.5, 0.2)
    raised = {m for m, d in free.models.items() if d.desired_instances > at[m]}
    assert raised
    full = on_gpu(0.95, 0.2)
    assert all(full.targets[m] <= at[m] for m in specs)
    for model in raised:
        assert full.models[model].reason == GPU_SATURATED
        assert "GPU utilization 0.95 is at or above its ceiling 0.90" in full.models[model].message
    memory = on_gpu(0.5, 0.95)
    assert all(memory.targets[m] <= at[m] for m in specs)
    assert {memory.models[m].reason for m in raised} == {GPU_SATURATED}


class TestVerifier:
    def test_a_step_that_bought_nothing_is_reverted_and_not_tried_again(self) -> None:
        specs = pipeline_specs(7)
        ticks = run(specs, counts(1, 1), contended(200.0), 30)
        embed = [d.models["branch_embed"] for d in ticks.decisions]
        stepped = next(i for i, d in enumerate(embed) if d.desired_instances > 1)
        reverted = next(
            i for i, d in enumerate(embed) if d.reason == verifier.STEP_FELL_SHORT and d.changes
        )
        assert stepped < reverted
        assert embed[reverted].desired_instances == 1
        assert "fell short" in embed[reverted].message
        # The correction holds: no second try within its time.
        assert all(at["branch_embed"] == 1 for at in ticks.ran[reverted + 1 :])
        assert ticks.last.state.verifier.ceilings(START + 30 * TICK_S) == {"branch_embed": 1}

    def test_a_step_whose_instances_share_the_cpu_and_still_serve_more_is_kept(self) -> None:
        # branch_embed's instances share the cores: each added one makes every request 40 %
        # longer (1 -> 2 instances: each holds 28 ms, not 20), and two still serve 1.43 times
        # what one does. A step that bought that much stands.
        def shared_cores(now: float, at: Mapping[str, int]) -> MetricSnapshot:
            embed_s = 0.020 * (1 + 0.4 * (at["branch_embed"] - 1))
            service = {"branch_embed": embed_s, "branch_classify": 0.005, "branch_rank": 0.005}
            return Load(70.0, service_s=service).snapshot(now, at)

        ticks = run(pipeline_specs(7), counts(1, 1), shared_cores, 20)
        assert any(at["branch_embed"] > 1 for at in ticks.ran)
        reasons = {d.reason for decision in ticks.decisions for d in decision.models.values()}
        assert verifier.STEP_FELL_SHORT not in reasons
        assert ticks.ran[-1]["branch_embed"] > 1

    def test_failures_that_come_with_more_load_are_no_shortfall(self) -> None:
        # The offered load doubles with the step: failures are the load's, not the step's.
        def busier_later(now: float, at: Mapping[str, int]) -> MetricSnapshot:
            later = at["branch_embed"] > 1
            return Load(80.0 if later else 40.0, failure_rate=5.0 if later else 0.0).snapshot(
                now, at
            )

        ticks = run(pipeline_specs(None), counts(1, 1), busier_later, 12)
        reasons = {d.reason for decision in ticks.decisions for d in decision.models.values()}
        assert verifier.STEP_FELL_SHORT not in reasons

    def test_batches_that_shrink_after_a_step_are_no_shortfall(self) -> None:
        # One parent instance batches 4 requests, two batch 2: each request holds an instance
        # twice as long, each execution as long as before.
        def batching(now: float, at: Mapping[str, int]) -> MetricSnapshot:
            batch = 4.0 if at[PARENT] == 1 else 2.0
            return Load(150.0, parent_batch=batch).snapshot(now, at)

        ticks = run(pipeline_specs(None), counts(1, 5, 2, 2), batching, 12)
        assert any(at[PARENT] == 2 for at in ticks.ran)
        reasons = {d.reason for decision in ticks.decisions for d in decision.models.values()}
        assert verifier.STEP_FELL_SHORT not in reasons

    def test_a_step_that_delivered_is_kept(self) -> None:
        ticks = run(pipeline_specs(7), counts(1, 1), steady(200.0), 30)
        reasons = {d.reason for decision in ticks.decisions for d in decision.models.values()}
        assert verifier.STEP_FELL_SHORT not in reasons
        assert ticks.last.state.verifier.corrections == ()

    def test_a_load_that_halves_after_a_step_is_no_shortfall(self) -> None:
        # Throughput halves after the step, but each request costs an instance what it did.
        def halved_later(now: float, at: Mapping[str, int]) -> MetricSnapshot:
            return Load(200.0 if now < START + 2 * TICK_S else 25.0).snapshot(now, at)

        ticks = run(pipeline_specs(None), counts(1, 1), halved_later, 12)
        assert all(
            d.reason != verifier.STEP_FELL_SHORT for x in ticks.decisions for d in x.models.values()
        )

    def test_a_step_after_which_more_requests_fail_is_reverted(self) -> None:
        # 40 req/s keep one branch_embed 0.8 busy: it steps to 2, and then 5 of the 40 fail.
        def failing_later(now: float, at: Mapping[str, int]) -> MetricSnapshot:
            failures = 5.0 if at["branch_embed"] > 1 else 0.0
            return Load(40.0 - failures, failure_rate=failures).snapshot(now, at)

        ticks = run(pipeline_specs(7), counts(1, 1), failing_later, 12)
        fell = [
            d
            for x in ticks.decisions
            for d in x.models.values()
            if d.reason == verifier.STEP_FELL_SHORT and d.changes
        ]
        assert fell and "served fraction" in fell[0].message


@st.composite
def steady_sets(draw: st.DrawFn) -> tuple[dict[str, AutoscalerSpec], dict[str, int], Load]:
    budget = draw(st.sampled_from([None, 5, 7, 12]))
    specs = BUDGETS[budget]
    at = {m: draw(st.integers(1, 4)) for m in specs}
    if budget is not None:
        while sum(at.values()) > budget:
            biggest = max(at, key=lambda m: at[m])
            at[biggest] -= 1
    service = {child: draw(st.floats(0.002, 0.04)) for child in CHILDREN}
    load = Load(
        draw(st.floats(5.0, 400.0)),
        service_s=service,
        parent_batch=draw(st.sampled_from([1.0, 4.0])),
    )
    return specs, at, load


# Down within a minute, all at once: the counts settle sooner, and the property is the
# planner's, not the pace HPA behavior sets.
QUICK_DOWN = {
    "behavior": {
        "scaleDown": {
            "stabilizationWindowSeconds": 60,
            "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}],
        }
    }
}
BUDGETS = {
    budget: pipeline_specs(budget, **{m: QUICK_DOWN for m in (PARENT, *CHILDREN)})
    for budget in (None, 5, 7, 12)
}


@PROFILE
@given(steady_sets())
def test_a_steady_load_settles_and_then_stays(problem: tuple) -> None:
    specs, at, load = problem
    ticks = run(specs, at, lambda now, counts_now: load.snapshot(now, counts_now), 36)
    # Each step waits for its verdict (a window and a tick after it), the scale-down for its
    # window: settled within 20 ticks (5 min), and then it stays.
    settled = ticks.ran[20:]
    assert all(at == settled[0] for at in settled), [ticks.last.message]
    room = Room.of(specs)
    assert all(room.fits(at) for at in ticks.ran[1:])
