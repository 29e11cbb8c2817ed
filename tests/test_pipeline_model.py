"""The pipeline model (tritonscale.core.pipeline_model): rates, service times, calls, demand,
and their noise, from a pod set's windows.

Most rows are the pipeline of tests/pipeline_load.py: pipeline_async fans out to three
branches at once; branch_embed takes 20 ms of an instance per request, the others 5 ms; the
parent works 4 ms per execution, in batches of four.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import replace

import pytest

from tests.pipeline_load import (
    CHILDREN,
    PARENT,
    WINDOW_S,
    Load,
    counts,
    make_spec,
    pipeline_specs,
)
from tritonscale.core.pipeline_model import (
    HISTORY_S,
    MAX_WINDOWS,
    MIN_REQUESTS_PER_WINDOW,
    NOISE_FLOOR,
    UNKNOWN_NOISE,
    Batching,
    PipelineHistory,
    PipelineModel,
    Stage,
    measure,
)
from tritonscale.core.signals import MetricSnapshot, ModelSignals

pytestmark = pytest.mark.unit

START = 1_000_000.0


def measured(
    snapshots: list[MetricSnapshot], at: Mapping[str, int], specs: dict | None = None
) -> tuple[PipelineModel, PipelineHistory]:
    history = PipelineHistory()
    for snapshot in snapshots:
        history = history.observed(snapshot, at)
    return measure(specs or pipeline_specs(), at, history), history


def apart(load: Load, at: Mapping[str, int], windows: int) -> list[MetricSnapshot]:
    """`windows` snapshots one window apart (no overlap)."""
    return [load.snapshot(START + i * WINDOW_S, at) for i in range(windows)]


class TestOneWindow:
    def test_a_leaf_reads_its_arrival_busy_time_and_utilization(self) -> None:
        at = counts(2, 2)
        model, _ = measured([Load(50.0).snapshot(START, at)], at)
        embed = model.stages["branch_embed"]
        assert embed.arrival_rps.value == pytest.approx(50.0)
        assert embed.execution_s.value == pytest.approx(0.020)
        assert embed.busy_per_request_s.value == pytest.approx(0.020)
        # 50 req/s x 20 ms over 2 instances
        assert embed.utilization == pytest.approx(0.5)
        assert embed.capacity_per_instance_rps == pytest.approx(50.0)

    def test_batching_shows_as_less_busy_time_per_request_than_per_execution(self) -> None:
        at = counts(2, 4, 2, 2)
        model, _ = measured([Load(100.0, parent_batch=4.0).snapshot(START, at)], at)
        parent = model.stages[PARENT]
        assert parent.mean_batch == pytest.approx(4.0)
        assert parent.busy_per_request_s.value == pytest.approx(parent.execution_s.value / 4)
        # One instance serves four requests per execution.
        assert parent.utilization == pytest.approx(100.0 * parent.execution_s.value / 4 / 2)

    def test_a_parents_calls_per_request_come_from_the_request_rates(self) -> None:
        at = counts(2, 2)
        snapshot = Load(30.0).snapshot(START, at)
        # The parent calls branch_rank three times per request (a fan-out to one model).
        rank = snapshot.models["branch_rank"]
        tripled = ModelSignals(
            "branch_rank",
            3 * rank.request_rate,
            0.0,
            3 * rank.execution_rate,
            3 * rank.compute_seconds_per_second,
            3 * rank.queue_seconds_per_second,
            0.0,
            1,
        )
        snapshot = MetricSnapshot(START, WINDOW_S, {**snapshot.models, "branch_rank": tripled})
        model, _ = measured([snapshot], at)
        assert model.stages[PARENT].calls["branch_rank"].value == pytest.approx(3.0)
        assert model.stages[PARENT].calls["branch_embed"].value == pytest.approx(1.0)
        assert model.stages["branch_rank"].demand_rps == pytest.approx(90.0)
        assert model.roots == (PARENT,)

    def test_a_parent_waiting_on_a_saturated_child_is_sized_net_of_the_wait(self) -> None:
        # branch_embed at one instance serves 50 req/s and queues; the parent's execution is
        # mostly that wait, yet its hold per request is its own work plus the child's
        # execution, the same as when the child has room.
        saturated, roomy = counts(3, 1), counts(3, 4)
        short, _ = measured([Load(200.0).snapshot(START, saturated)], saturated)
        room, _ = measured([Load(50.0).snapshot(START, roomy)], roomy)
        assert short.stages["branch_embed"].saturated
        assert short.stages[PARENT].execution_s.value > 4 * room.stages[PARENT].execution_s.value
        for model in (short, room):
            parent = model.stages[PARENT]
            assert parent.own_execution_s.value == pytest.approx(0.004)
            assert parent.hold_per_request_s.value == pytest.approx((0.004 + 0.020) / 4)

    @pytest.mark.parametrize("leaf_queue_s", [0.0, 0.030, 0.120])
    def test_a_sync_parent_is_sized_net_of_every_call_and_a_chain_net_of_its_depth(
        self, leaf_queue_s: float
    ) -> None:
        # One request an execution everywhere. `sync` calls `leaf` three times one after
        # another: it waits for each call's queue and execution (4 ms of its own). `chain` calls
        # `middle` once, which calls `deep` once: middle's execution holds deep's queue, and so
        # does chain's wait for middle. However long the leaves queue, each holds the same with
        # the queue taken out: its own work and its calls answered at once.
        rate, leaf_s = 10.0, 0.010
        answered_s = leaf_queue_s + leaf_s
        middle_s = 0.003 + answered_s
        timings = {  # model: (requests a second, seconds an execution, queue seconds a request)
            "sync": (rate, 0.004 + 3 * answered_s, 0.0),
            "chain": (rate, 0.002 + middle_s, 0.0),
            "middle": (rate, middle_s, 0.0),
            "leaf": (3 * rate, leaf_s, leaf_queue_s),
            "deep": (rate, leaf_s, leaf_queue_s),
        }
        signals = {
            model: ModelSignals(
                model, requests, 0.0, requests, requests * execution, requests * queue, 0.0, 1
            )
            for model, (requests, execution, queue) in timings.items()
        }
        calls = {"sync": ["leaf"], "chain": ["middle"], "middle": ["deep"], "leaf": [], "deep": []}
        specs = {model: make_spec(model, calls=called) for model, called in calls.items()}
        at = dict.fromkeys(calls, 1)
        model, _ = measured([MetricSnapshot(START, WINDOW_S, signals)], at, specs)
        assert model.stages["sync"].own_execution_s.value == pytest.approx(0.004)
        assert model.stages["sync"].hold_per_execution_s.value == pytest.approx(0.004 + 0.030)
        assert model.stages["middle"].hold_per_execution_s.value == pytest.approx(0.013)
        assert model.stages["chain"].own_execution_s.value == pytest.approx(0.002)
        assert model.stages["chain"].hold_per_execution_s.value == pytest.approx(0.015)

    def test_a_saturated_model_is_offered_what_it_serves_and_what_queues(self) -> None:
        # One parent instance waits on branch_embed, which serves 50 req/s: both are busy all
        # the time, and the parent's queue grows by 300 requests a window: 5 req/s more are
        # offered than served, and its children are asked for as much.
        at = counts(1, 1)
        load = Load(200.0)
        snapshots = []
        for i, pending in enumerate((100.0, 400.0)):
            snapshot = load.snapshot(START + i * WINDOW_S, at)
            models = dict(snapshot.models)
            models[PARENT] = replace(models[PARENT], pending_requests=pending)
            snapshots.append(MetricSnapshot(snapshot.taken_at, WINDOW_S, models))
        model, _ = measured(snapshots, at)
        parent = model.stages[PARENT]
        assert parent.saturated
        assert parent.arrival_rps.value == pytest.approx(50.0)
        assert parent.offered_rps == pytest.approx(55.0)
        assert model.stages["branch_embed"].demand_rps == pytest.approx(55.0)
        assert parent.overloaded and not parent.closed_loop  # an open load: its demand is read

    def test_a_root_whose_queue_stands_is_overloaded_and_a_child_whose_queue_stands_is_not(
        self,
    ) -> None:
        # A closed loop of clients keeps a queue in front of the set that does not grow:
        # what the clients would send with more capacity shows in no rate, only there.
        at = counts(1, 1)
        load = Load(200.0)
        snapshots = []
        for i in range(2):
            snapshot = load.snapshot(START + i * WINDOW_S, at)
            models = dict(snapshot.models)
            for model in (PARENT, "branch_embed"):
                signals = models[model]
                # More requests wait than run, the same in both windows.
                models[model] = replace(
                    signals,
                    queue_seconds_per_second=2 * signals.compute_seconds_per_second,
                    pending_requests=40.0,
                )
            snapshots.append(MetricSnapshot(snapshot.taken_at, WINDOW_S, models))
        model, _ = measured(snapshots, at)
        parent, embed = model.stages[PARENT], model.stages["branch_embed"]
        assert parent.saturated and embed.saturated
        assert parent.offered_rps == pytest.approx(parent.arrival_rps.value)  # not a rate
        assert parent.overloaded and parent.closed_loop
        assert not embed.overloaded and not embed.closed_loop
        # Below saturation the same queue says nothing of a closed loop (a batcher's delay,
        # a burst).
        roomy = counts(4, 4)
        snapshot = Load(20.0).snapshot(START, roomy)
        signals = snapshot.models[PARENT]
        queued = replace(signals, queue_seconds_per_second=2 * signals.compute_seconds_per_second)
        light, _ = measured(
            [MetricSnapshot(START, WINDOW_S, {**snapshot.models, PARENT: queued})], roomy
        )
        assert not light.stages[PARENT].saturated
        assert not light.stages[PARENT].overloaded

    @pytest.mark.parametrize("mean_queue", [38.0, 20.0])
    def test_a_first_window_reads_a_waiting_queue_as_a_floor_and_the_next_tells(
        self, mean_queue: float
    ) -> None:
        # No window before it, so whether the queue grew is unknown: one that stood through
        # the window (a closed loop's 40 clients waiting, mean about its end) and one that
        # grew from empty (mean about half: a closed loop that started within the window,
        # or an open load above what the set serves) both say the root is offered at least
        # what it serves. The window after tells them apart by the gauge.
        at = counts(1, 1)
        first = Load(200.0).snapshot(START, at)
        parent = replace(
            first.models[PARENT], queue_seconds_per_second=mean_queue, pending_requests=40.0
        )
        window = MetricSnapshot(START, WINDOW_S, {**first.models, PARENT: parent})
        model, _ = measured([window], at)
        assert model.stages[PARENT].saturated
        assert model.stages[PARENT].overloaded  # either way, requests pile up in front of it
        assert model.stages[PARENT].closed_loop

        def then(pending: float) -> Stage:
            later = Load(200.0).snapshot(START + WINDOW_S, at)
            models = {**later.models, PARENT: replace(parent, pending_requests=pending)}
            return measured([window, MetricSnapshot(later.taken_at, WINDOW_S, models)], at)[
                0
            ].stages[PARENT]

        assert then(40.0).closed_loop  # it stood
        grown = then(40.0 + 30.0 * WINDOW_S)  # 30 requests a second more than it serves
        assert not grown.closed_loop and grown.queue_grows
        assert grown.offered_rps == pytest.approx(grown.arrival_rps.value + 30.0)

    def test_a_queue_that_grows_beyond_the_noise_is_seen_below_saturation(self) -> None:
        # A load that just rose: branch_embed's four instances are not yet busy all the time,
        # and its queue grew by 30 requests a second (15 % of what arrives). A queue that
        # moves by less than NOISE_FLOOR of the arrivals is a queue's usual wobble.
        at = counts(1, 4)
        load = Load(200.0)

        def with_pending(step: float) -> PipelineModel:
            snapshots = []
            for i in range(2):
                snapshot = load.snapshot(START + i * WINDOW_S, at)
                models = dict(snapshot.models)
                models["branch_embed"] = replace(
                    models["branch_embed"], pending_requests=step * WINDOW_S * i
                )
                snapshots.append(MetricSnapshot(snapshot.taken_at, WINDOW_S, models))
            return measured(snapshots, at)[0]

        growing = with_pending(30.0).stages["branch_embed"]
        assert not growing.saturated and not growing.overloaded
        assert growing.queue_grows
        assert growing.offered_rps == pytest.approx(growing.arrival_rps.value)  # not demand
        wobbling = with_pending(0.5 * NOISE_FLOOR * 200.0).stages["branch_embed"]
        assert not wobbling.queue_grows

    def test_a_model_with_too_little_traffic_is_quiet(self) -> None:
        at = counts(1, 1)
        rate = 0.9 * MIN_REQUESTS_PER_WINDOW / WINDOW_S
        model, _ = measured([Load(rate).snapshot(START, at)], at)
        assert all(stage.quiet for stage in model.stages.values())
        assert model.active == {}

    def test_a_model_without_metrics_is_unmeasured(self) -> None:
        at = counts(1, 1)
        snapshot = Load(50.0).snapshot(START, at)
        models = {m: s for m, s in snapshot.models.items() if m != "branch_rank"}
        model, _ = measured([MetricSnapshot(START, WINDOW_S, models)], at)
        assert "branch_rank" in model.unmeasured
        assert "branch_rank" not in model.stages

    def test_requests_without_busy_time_are_unmeasured(self) -> None:
        # A decoupled model whose execute returns at once: Triton times the hand-off.
        at = counts(1, 1)
        snapshot = Load(50.0).snapshot(START, at)
        streaming = ModelSignals("branch_rank", 50.0, 0.0, 50.0, 0.0, 0.0, 0.0, 1, decoupled=True)
        models = {**snapshot.models, "branch_rank": streaming}
        model, _ = measured([MetricSnapshot(START, WINDOW_S, models)], at)
        assert "busy time" in model.unmeasured["branch_rank"]

    def test_a_child_of_two_parents_is_called_at_their_shared_rate(self) -> None:
        # Two parents call branch_rank: 30 and 10 req/s, 80 calls/s in all (2 per request).
        specs = {
            "parent_a": make_spec("parent_a", calls=["branch_rank"]),
            "parent_b": make_spec("parent_b", calls=["branch_rank"]),
            "branch_rank": make_spec("branch_rank"),
        }
        at = {"parent_a": 1, "parent_b": 1, "branch_rank": 2}
        models = {
            "parent_a": ModelSignals("parent_a", 30.0, 0.0, 30.0, 30 * 0.02, 0.0, 0.0, 1),
            "parent_b": ModelSignals("parent_b", 10.0, 0.0, 10.0, 10 * 0.02, 0.0, 0.0, 1),
            "branch_rank": ModelSignals("branch_rank", 80.0, 0.0, 80.0, 80 * 0.005, 0.0, 0.0, 1),
        }
        model, _ = measured([MetricSnapshot(START, WINDOW_S, models)], at, specs)
        assert model.stages["parent_a"].calls["branch_rank"].value == pytest.approx(2.0)
        assert model.stages["branch_rank"].demand_rps == pytest.approx(80.0)
        assert set(model.roots) == {"parent_a", "parent_b"}

    def test_a_shared_child_whose_other_caller_went_idle_is_called_at_todays_rate(
        self,
    ) -> None:
        # Both parents called branch_rank once per request; then the load moved to parent_b,
        # which calls it three times. Today parent_a serves nothing and calls nothing: the
        # calls per request are today's (3), not those of the windows before the move (1),
        # and the demand on branch_rank is what it is sent (90 calls/s), not a third of it.
        specs = {
            "parent_a": make_spec("parent_a", calls=["branch_rank"]),
            "parent_b": make_spec("parent_b", calls=["branch_rank"]),
            "branch_rank": make_spec("branch_rank"),
        }
        at = {"parent_a": 1, "parent_b": 1, "branch_rank": 2}

        def window(a_rps: float, b_rps: float, calls_per_request: float) -> dict:
            called = (a_rps + b_rps) * calls_per_request
            return {
                "parent_a": ModelSignals("parent_a", a_rps, 0.0, a_rps, a_rps * 0.02, 0.0, 0, 1),
                "parent_b": ModelSignals("parent_b", b_rps, 0.0, b_rps, b_rps * 0.02, 0.0, 0, 1),
                "branch_rank": ModelSignals(
                    "branch_rank", called, 0.0, called, called * 0.005, 0.0, 0.0, 1
                ),
            }

        snapshots = [
            MetricSnapshot(START, WINDOW_S, window(20.0, 20.0, 1.0)),
            MetricSnapshot(START + WINDOW_S, WINDOW_S, window(0.0, 30.0, 3.0)),
        ]
        model, _ = measured(snapshots, at, specs)
        assert model.stages["parent_b"].calls["branch_rank"].value == pytest.approx(3.0)
        assert model.stages["branch_rank"].demand_rps == pytest.approx(90.0)

    def test_a_decoupled_model_sized_by_its_streams_is_unmeasured(self) -> None:
        at = counts(1, 1)
        snapshot = Load(50.0).snapshot(START, at)
        streaming = replace(snapshot.models["branch_rank"], decoupled=True, streams_in_flight=3.0)
        models = {**snapshot.models, "branch_rank": streaming}
        model, _ = measured([MetricSnapshot(START, WINDOW_S, models)], at)
        assert "branch_rank" in model.unmeasured


class TestEstimates:
    def test_one_window_has_an_unknown_noise(self) -> None:
        at = counts(2, 2)
        model, _ = measured([Load(50.0).snapshot(START, at)], at)
        hold = model.stages["branch_embed"].hold_per_request_s
        assert (hold.windows, hold.noise) == (1, UNKNOWN_NOISE)

    def test_windows_that_do_not_overlap_give_the_spread(self) -> None:
        at = counts(2, 2)
        loads = [
            Load(
                50.0, service_s={"branch_embed": s, "branch_classify": 0.005, "branch_rank": 0.005}
            )
            for s in (0.019, 0.021, 0.020)
        ]
        snapshots = [load.snapshot(START + i * WINDOW_S, at) for i, load in enumerate(loads)]
        model, _ = measured(snapshots, at)
        hold = model.stages["branch_embed"].hold_per_request_s
        assert hold.windows == 3
        assert hold.value == pytest.approx(0.020)
        assert hold.spread == pytest.approx(0.001)
        assert hold.span_s == pytest.approx(3 * WINDOW_S)
        assert hold.noise == pytest.approx(max(NOISE_FLOOR, 2 * 0.001 / 0.020))

    def test_overlapping_windows_count_once(self) -> None:
        # Ticks every 15 s over 60 s windows: four of five windows overlap the one after.
        at = counts(2, 2)
        snapshots = [Load(50.0).snapshot(START + 15.0 * i, at) for i in range(9)]
        model, history = measured(snapshots, at)
        assert model.stages["branch_embed"].hold_per_request_s.windows == 3
        assert len(history.windows) < 9

    def test_a_change_of_counts_starts_the_service_estimates_afresh(self) -> None:
        before, after = counts(2, 1), counts(2, 3)
        history = PipelineHistory()
        for i in range(3):
            history = history.observed(Load(50.0).snapshot(START + i * WINDOW_S, before), before)
        # The first window after the change began before it: not yet at the new counts.
        history = history.observed(Load(50.0).snapshot(START + 2 * WINDOW_S + 15, after), after)
        assert (
            not measure(pipeline_specs(), after, history).stages["branch_embed"].measured_at_counts
        )
        history = history.observed(Load(50.0).snapshot(START + 4 * WINDOW_S, after), after)
        embed = measure(pipeline_specs(), after, history).stages["branch_embed"]
        assert embed.measured_at_counts
        assert embed.hold_per_request_s.windows == 1

    def test_a_window_that_began_before_the_load_ended_is_not_at_the_new_counts(self) -> None:
        # The tick at START + 2 windows decided 1 -> 3; the load took 6 s (a busy node), and
        # the old instance served until it ended. The next window, one window after that
        # tick, began before the load ended: it mixes both counts.
        before, after = counts(2, 1), counts(2, 3)
        decided_at = START + 2 * WINDOW_S
        history = PipelineHistory()
        for i in range(3):
            history = history.observed(Load(50.0).snapshot(START + i * WINDOW_S, before), before)
        loaded = {"branch_embed": decided_at + 6.0}
        mixed = Load(50.0).snapshot(decided_at + WINDOW_S, after)
        history = history.observed(mixed, after, loaded)
        assert history.changed_at(["branch_embed"], after) == decided_at + 6.0
        embed = measure(pipeline_specs(), after, history).stages["branch_embed"]
        assert not embed.measured_at_counts
        # Without the load's end the window would have counted: the tick stood for the change.
        assert (
            measure(pipeline_specs(), after, replace(history, live_since={}))
            .stages["branch_embed"]
            .measured_at_counts
        )
        # The next window lies wholly after the load; the end is kept across ticks.
        history = history.observed(Load(50.0).snapshot(decided_at + 2 * WINDOW_S, after), after)
        assert measure(pipeline_specs(), after, history).stages["branch_embed"].measured_at_counts
        assert PipelineHistory.from_dict(json.loads(json.dumps(history.to_dict()))) == history

    def test_demand_follows_the_calls_down_the_pipeline(self) -> None:
        at = counts(2, 3)
        model, _ = measured(apart(Load(80.0), at, 3), at)
        for child in CHILDREN:
            assert model.stages[child].demand_rps == pytest.approx(model.stages[PARENT].demand_rps)


def with_rows(snapshot: MetricSnapshot, rows: float) -> MetricSnapshot:
    """The snapshot with every model's inferences at `rows` rows a request."""
    models = {
        model: replace(signals, inference_rate=rows * signals.request_rate)
        for model, signals in snapshot.models.items()
    }
    return replace(snapshot, models=models)


def batched(
    load: Load,
    at: Mapping[str, int],
    batching: Mapping[str, Batching],
    rows: float | None = 1.0,
) -> PipelineModel:
    """Three windows of `load` at `at`, each request `rows` rows (None: no inference
    count read), with the configs' batching."""
    history = PipelineHistory()
    for snapshot in apart(load, at, 3):
        history = history.observed(snapshot if rows is None else with_rows(snapshot, rows), at)
    return measure(pipeline_specs(), at, history, batching)


BATCHER = Batching(max_batch_size=8, dynamic=True)


class TestBatching:
    def test_a_child_serves_at_the_batch_its_callers_calls_in_flight_reach(self) -> None:
        # Two parent instances, each execution four requests with a call each to
        # branch_classify: eight calls out at most. Two rows a request and max_batch_size 8:
        # four calls a batch. At 25 % busy classify runs batches of one today; at two
        # instances it would batch four, at four instances two.
        at = counts(2, 4, classify=2, rank=2)
        classify = batched(Load(100.0), at, {"branch_classify": BATCHER}, rows=2.0).stages[
            "branch_classify"
        ]
        assert not classify.saturated
        assert classify.max_batch == 4
        assert classify.calls_in_flight() == pytest.approx(8.0)
        assert classify.capacity_per_instance_rps == pytest.approx(200.0)
        assert classify.capacity_rps(2) == pytest.approx(2 * 4 / 0.005)
        assert classify.capacity_rps(4) == pytest.approx(4 * 2 / 0.005)
        # Below today's count, today's batch: no instance is taken on a batch not yet seen.
        assert classify.capacity_rps(1) == pytest.approx(200.0)

    def test_a_childs_batch_grows_with_its_callers_counts(self) -> None:
        # One parent instance has four calls out to branch_classify at once (an execution of
        # four requests); at three instances twelve. At two classify instances that is
        # batches of two today, and of four (its largest) with the parent at three.
        at = counts(1, 4, classify=2, rank=2)
        classify = batched(Load(50.0), at, {"branch_classify": BATCHER}, rows=2.0).stages[
            "branch_classify"
        ]
        assert classify.calls_in_flight() == pytest.approx(4.0)
        assert classify.calls_in_flight({PARENT: 3}) == pytest.approx(12.0)
        assert classify.capacity_rps(2) == pytest.approx(2 * 2 / 0.005)
        assert classify.capacity_rps(2, {PARENT: 3}) == pytest.approx(2 * 4 / 0.005)
        # Fewer callers than today: never below today's batch.
        assert classify.capacity_rps(2, {PARENT: 0}) == pytest.approx(2 * 200.0)

    @pytest.mark.parametrize(
        ("batching", "rows"),
        [
            ({}, 1.0),  # the config could not be read
            ({"branch_classify": Batching(8, dynamic=False)}, 1.0),  # no dynamic batcher
            ({"branch_classify": Batching(0, dynamic=True)}, 1.0),  # max_batch_size 0
            ({"branch_classify": BATCHER}, None),  # rows per request unknown
        ],
    )
    def test_a_child_that_will_not_batch_more_keeps_todays_batch(
        self, batching: Mapping[str, Batching], rows: float | None
    ) -> None:
        at = counts(2, 4, classify=2, rank=2)
        classify = batched(Load(100.0), at, batching, rows).stages["branch_classify"]
        assert classify.max_batch is None
        assert classify.capacity_rps(2) == pytest.approx(2 * 200.0)

    def test_a_saturated_child_runs_the_batches_measured_at_its_limit(self) -> None:
        # branch_embed at one instance is busy all the time: its batch is measured, not told.
        at = counts(2, 1)
        embed = batched(Load(200.0), at, {"branch_embed": BATCHER}).stages["branch_embed"]
        assert embed.saturated
        assert embed.capacity_rps(1) == pytest.approx(50.0)
        assert embed.capacity_rps(2) == pytest.approx(100.0)

    def test_a_root_is_told_its_largest_batch_not_its_calls_in_flight(self) -> None:
        at = counts(2, 4)
        parent = batched(Load(100.0), at, {PARENT: Batching(32, dynamic=True)}, rows=8.0).stages[
            PARENT
        ]
        assert parent.max_batch == 4
        assert parent.calls_in_flight() is None
        assert parent.batch_full
        assert parent.capacity_rps(3) == pytest.approx(3 * parent.capacity_per_instance_rps)

    @pytest.mark.parametrize(
        ("config", "batching"),
        [
            ({"max_batch_size": 64, "dynamic_batching": {}}, Batching(64, dynamic=True)),
            ({"max_batch_size": "64", "dynamic_batching": {"x": 1}}, Batching(64, dynamic=True)),
            ({"max_batch_size": 8}, Batching(8, dynamic=False)),
            ({"name": "m"}, Batching(0, dynamic=False)),
            ({"max_batch_size": "many"}, None),
            ({"max_batch_size": -1}, None),
        ],
    )
    def test_the_batching_of_a_config_as_triton_serves_it(
        self, config: dict, batching: Batching | None
    ) -> None:
        assert Batching.of_config(config) == batching


class TestHistory:
    def test_the_history_round_trips_through_a_dict(self) -> None:
        at = counts(2, 2)
        _, history = measured(apart(Load(50.0, failure_rate=1.0), at, 4), at)
        again = PipelineHistory.from_dict(json.loads(json.dumps(history.to_dict())))
        assert again == history

    def test_the_rows_a_request_carries_round_trip_with_the_history(self) -> None:
        at = counts(2, 2)
        history = PipelineHistory().observed(with_rows(Load(50.0).snapshot(START, at), 8.0), at)
        again = PipelineHistory.from_dict(json.loads(json.dumps(history.to_dict())))
        assert again == history
        assert again.windows[-1].readings[PARENT].rows_per_request == pytest.approx(8.0)

    def test_an_older_or_repeated_snapshot_is_not_added_twice(self) -> None:
        at = counts(2, 2)
        _, history = measured(apart(Load(50.0), at, 2), at)
        assert history.observed(Load(50.0).snapshot(START, at), at) == history

    def test_the_history_keeps_its_reach_and_size(self) -> None:
        at = counts(2, 2)
        _, history = measured(apart(Load(50.0), at, 3 * MAX_WINDOWS), at)
        assert len(history.windows) <= MAX_WINDOWS
        newest = history.windows[-1].taken_at
        assert all(w.taken_at > newest - HISTORY_S for w in history.windows)

    @pytest.mark.parametrize("malformed", [{"windows": [{"takenAt": "x"}]}, {"windows": [1]}])
    def test_a_malformed_history_is_refused_in_one_line(self, malformed: dict) -> None:
        with pytest.raises(ValueError, match="malformed pipeline history"):
            PipelineHistory.from_dict(malformed)

    def test_no_history_measures_nothing(self) -> None:
        model = measure(pipeline_specs(), counts(1, 1), PipelineHistory())
        assert set(model.unmeasured) == {PARENT, *CHILDREN}
        assert not math.isnan(model.taken_at)
