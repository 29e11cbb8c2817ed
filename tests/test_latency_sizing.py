"""A pipeline sized to its latency objective (tritonscale.core.latency): the fewest instances
that meet it at a rate, against every split; more rate never fewer instances; an objective no
split within the budget meets falls back to the split that serves the most; the prediction
travels from the plan to the status, the metrics and the events."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.pipeline_load import CHILDREN, PARENT, Load, counts, pipeline_specs
from tests.test_set_planner import START, TICK_S, plans
from tritonscale.control.operator_metrics import OperatorMetrics
from tritonscale.control.reconcile import _latency
from tritonscale.control.set_planner import SetPlanner
from tritonscale.control.tick import LatencyStatus, ReconcileState, TickResult
from tritonscale.core import lqn, policy
from tritonscale.core.allocator import LATENCY_OBJECTIVE, MAX_THROUGHPUT
from tritonscale.core.budget import BUDGET_EXHAUSTED
from tritonscale.core.latency import (
    LatencyPrediction,
    LatencySearch,
    RootObjective,
    horizon_s,
    search_of,
    sizing_rate,
)
from tritonscale.core.lqn import BatchPolicy, Call, Network, ServiceTime, Station
from tritonscale.core.pipeline_model import (
    NOISE_SIGMAS,
    Batching,
    PipelineHistory,
    Reading,
    Window,
    measure,
)
from tritonscale.core.planner import SetState, decide_set
from tritonscale.core.policy import WARMING_UP
from tritonscale.core.signals import MetricSnapshot, ModelSignals
from tritonscale.core.spec import AutoscalerSpec, LatencyObjective
from tritonscale.core.verifier import SETTLE_S
from tritonscale.drivers import status

pytestmark = pytest.mark.unit

P95_60_MS = LatencyObjective(quantile=0.95, milliseconds=60.0)


def fan_out(counts: tuple[int, int] = (1, 1)) -> Network:
    """A parent (2 ms of its own, batching up to 8 requests) calling one child of 10 ms
    that batches nothing."""
    parent = Station(
        "parent",
        counts[0],
        ServiceTime(0.002),
        BatchPolicy(8, True),
        calls=(Call("child"),),
    )
    child = Station("child", counts[1], ServiceTime(0.010))
    return Network({"parent": parent, "child": child}, "parent")


def search(rate_rps: float, objective: LatencyObjective = P95_60_MS) -> LatencySearch:
    return LatencySearch((RootObjective("parent", objective, fan_out(), rate_rps, rate_rps),))


def every_split(most: int, budget: int) -> list[dict[str, int]]:
    return [
        {"parent": p, "child": c}
        for p, c in itertools.product(range(1, most + 1), repeat=2)
        if p + c <= budget
    ]


LOWER = {"parent": 1, "child": 1}
UPPER = {"parent": 6, "child": 6}


def within(budget: int):  # noqa: ANN201 - a predicate
    return lambda split: sum(split.values()) <= budget


@pytest.mark.parametrize("rate_rps", [20.0, 450.0, 900.0, 1500.0])
def test_the_fewest_instances_that_meet_the_objective_at_a_rate(rate_rps: float) -> None:
    chosen = search(rate_rps).choose(LOWER, UPPER, within(10))
    assert chosen.counts is not None
    # Against every split of the budget: none with fewer instances meets the objective, and
    # none with as many meets it by a larger margin.
    judge = search(rate_rps)
    meeting = [s for s in every_split(6, 10) if judge.margin(s) >= 0]
    fewest = min(sum(s.values()) for s in meeting)
    assert sum(chosen.counts.values()) == fewest
    best = max(judge.margin(s) for s in meeting if sum(s.values()) == fewest)
    assert chosen.margin == pytest.approx(best)
    predicted = judge.predictions(chosen.counts)[0]
    assert predicted.met and predicted.predicted_ms <= 60.0


def test_a_parent_instance_more_may_lengthen_the_latency_and_the_search_finds_the_fewest() -> None:
    # A second parent in front of one child that batches nothing sends it more calls at
    # once: the model predicts a longer p95, so no model's count is bounded alone.
    judge = search(150.0)
    one, two = {"parent": 1, "child": 1}, {"parent": 2, "child": 1}
    assert judge.margin(two) < judge.margin(one)
    assert judge.choose(LOWER, UPPER, within(10)).counts == one


def test_a_split_one_instance_smaller_misses_the_objective() -> None:
    judge = search(1500.0)
    chosen = judge.choose(LOWER, UPPER, within(10)).counts
    assert chosen is not None
    for model, count in chosen.items():
        if count > 1:
            smaller = {**chosen, model: count - 1}
            assert judge.margin(smaller) < 0, f"{smaller} meets it with fewer than {chosen}"


@settings(
    max_examples=25, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    low=st.floats(min_value=5.0, max_value=1500.0),
    more=st.floats(min_value=0.0, max_value=800.0),
    bound_ms=st.floats(min_value=20.0, max_value=120.0),
)
def test_more_rate_never_fewer_instances(low: float, more: float, bound_ms: float) -> None:
    objective = LatencyObjective(quantile=0.95, milliseconds=bound_ms)
    before = search(low, objective).choose(LOWER, UPPER, within(12))
    after = search(low + more, objective).choose(LOWER, UPPER, within(12))
    if after.counts is None:
        return  # the higher rate cannot be met: the caller serves the most
    assert before.counts is not None, "a rate that can be met, and a lower one that cannot"
    assert sum(after.counts.values()) >= sum(before.counts.values())


def test_an_objective_no_split_meets_asks_for_what_it_would_take() -> None:
    # 1,500 req/s within 60 ms takes more than 4 instances; within 1 ms, nothing does.
    short = search(1500.0).choose(LOWER, UPPER, within(4))
    assert short.counts is None
    assert sum(short.wanted.values()) > 4
    assert search(1500.0).margin(short.wanted) >= 0
    never = search(1500.0, LatencyObjective(quantile=0.95, milliseconds=1.0))
    assert never.choose(LOWER, UPPER, within(12)).wanted == UPPER


def test_a_quantile_comes_from_the_predicted_mean_and_variance() -> None:
    prediction = lqn.open_loop(fan_out((2, 3)), 200.0)
    assert prediction.latency_quantile_s(0.95) == pytest.approx(prediction.p95_latency_s)
    assert prediction.latency_quantile_s(0.5) < prediction.latency_quantile_s(0.99)
    assert lqn.open_loop(fan_out(), 10_000.0).latency_quantile_s(0.95) == math.inf


# ---- the rate it is sized for --------------------------------------------------------


def history(rates: list[float], window_s: float = 30.0) -> PipelineHistory:
    """Windows of the root back to back, one rate each."""
    windows = tuple(
        Window(
            (i + 1) * window_s,
            window_s,
            {"parent": 1},
            {"parent": Reading(rate, 0.0, rate, 0.1, 0.0, 1)},
        )
        for i, rate in enumerate(rates)
    )
    return PipelineHistory(windows)


def test_a_steady_rate_gets_two_standard_deviations_of_a_poisson_window() -> None:
    # 100 req/s over 30 s windows: a window's rate spreads sqrt(100 / 30) = 1.83 req/s.
    rate = sizing_rate(history([100.0, 100.0, 100.0]), "parent", 100.0, horizon_s=17.0)
    assert rate == pytest.approx(100.0 + NOISE_SIGMAS * math.sqrt(2) * math.sqrt(100.0 / 30.0))


def test_a_rising_rate_is_carried_over_the_horizon() -> None:
    # +10 req/s a 30 s window: 1/3 req/s per second, from the latest window's middle (15 s
    # before it ended) over a 17 s horizon: 32 s, +10.7 req/s; the residuals are 0.
    rate = sizing_rate(history([80.0, 90.0, 100.0]), "parent", 100.0, horizon_s=17.0)
    poisson = NOISE_SIGMAS * math.sqrt(2) * math.sqrt(100.0 / 30.0)
    assert rate == pytest.approx(100.0 + 32.0 / 3.0 + poisson)
    falling = sizing_rate(history([120.0, 110.0, 100.0]), "parent", 100.0, horizon_s=17.0)
    assert falling == pytest.approx(100.0 + poisson), "a falling rate is not counted on"


def test_a_spread_beyond_chance_widens_the_headroom() -> None:
    noisy = sizing_rate(history([100.0, 130.0, 70.0, 100.0]), "parent", 100.0, horizon_s=17.0)
    steady = sizing_rate(history([100.0, 100.0, 100.0, 100.0]), "parent", 100.0, horizon_s=17.0)
    assert noisy > steady + 30.0


def test_the_horizon_is_an_interval_and_the_measured_load_time() -> None:
    specs = pipeline_specs(7)
    interval = specs[PARENT].interval_seconds
    assert horizon_s(specs, {}) == interval + SETTLE_S
    assert horizon_s(specs, {"branch_embed": 4.5, PARENT: 1.0}) == interval + 4.5


# ---- through the set planner -----------------------------------------------------------

BATCHING = {
    PARENT: Batching(32, dynamic=True),
    **{child: Batching(0, dynamic=False) for child in CHILDREN},
}


def with_objective(
    specs: Mapping[str, AutoscalerSpec], milliseconds: float
) -> dict[str, AutoscalerSpec]:
    root = specs[PARENT].to_dict()
    root["targets"] = {"latency": {"quantile": 0.95, "milliseconds": milliseconds}}
    return {**specs, PARENT: AutoscalerSpec.from_dict(root)}


def planned(specs: Mapping[str, AutoscalerSpec], load: Load, at: Mapping[str, int], ticks: int):  # noqa: ANN201
    """The set planner over `ticks` ticks of a steady load, the counts applied each tick."""
    planner = SetPlanner()
    decided = {}
    for tick in range(ticks):
        now = START + tick * TICK_S
        members = plans(specs, at, load.snapshot(now, at), now)
        members = {name: replace(plan, batching=BATCHING) for name, plan in members.items()}
        decided = planner.planned(members, now)
        at = {plan.spec.model: plan.decision.desired_instances for plan in decided.values()}
    return decided, at


def test_the_planner_sizes_the_pipeline_to_its_objective() -> None:
    decided, at = planned(with_objective(pipeline_specs(10), 200.0), Load(150.0), counts(1, 1), 3)
    root = decided["pipeline-async"].decision
    assert root.reason == LATENCY_OBJECTIVE
    assert root.latency is not None and root.latency.met
    assert root.latency.predicted_ms is not None and root.latency.predicted_ms <= 200.0
    # What the last window served (the counts before it held the set to less than 150).
    assert root.latency.rate_rps > root.latency.offered_rps > 0
    assert all(plan.decision.reason == LATENCY_OBJECTIVE for plan in decided.values())
    assert sum(at.values()) <= 10


def steps_judged(specs: Mapping[str, AutoscalerSpec], load: Load, ticks: int) -> set[str]:
    """The models whose steps up the verifier was handed over `ticks` ticks from one instance
    each (failing where no step up was taken at all: nothing would have been handed)."""
    planner, at, judged = SetPlanner(), counts(1, 1), set()
    stepped = False
    for tick in range(ticks):
        now = START + tick * TICK_S
        members = plans(specs, at, load.snapshot(now, at), now)
        members = {name: replace(plan, batching=BATCHING) for name, plan in members.items()}
        decided = planner.planned(members, now)
        check = planner.state.verifier.check
        judged |= {e.model for e in check.expectations} if check is not None else set()
        new = {plan.spec.model: plan.decision.desired_instances for plan in decided.values()}
        stepped = stepped or any(new[m] > at[m] for m in at)
        at = new
    assert stepped, "the load never asked for a step up"
    return judged


def test_a_step_the_latency_search_chose_is_judged_by_the_search_not_the_verifier() -> None:
    # The verifier reads a parent that holds longer per execution after a step (its child now
    # kept busier) as a step that bought nothing; the search predicts again every tick.
    assert steps_judged(with_objective(pipeline_specs(10), 100.0), Load(300.0), 3) == set()
    # Sized for throughput, the same steps are the verifier's to judge.
    assert steps_judged(pipeline_specs(10), Load(400.0), 3)


def test_an_objective_is_sized_on_part_of_a_window_up_and_never_down() -> None:
    # 20 s of a window (a set's start): 200 req/s keeps branch_embed (20 ms a request) busy
    # beyond one instance, so the objective steps it up at once; the parent's four instances
    # are more than it needs, but no count goes down on part of a window. Without an
    # objective the same snapshot holds every count until the window is whole.
    at = counts(4, 1)
    partial = MetricSnapshot(START, 20.0, Load(200.0).signals(at), complete=False)
    at_once = {"behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}}}
    specs = with_objective(pipeline_specs(10, pipeline_async=at_once), 100.0)
    decided = decide_set(specs, at, partial, SetState(), START, batching=BATCHING)
    assert decided.targets["branch_embed"] > 1
    assert decided.targets[PARENT] == 4
    assert decided.models[PARENT].reason == WARMING_UP
    assert "no scale-down" in decided.models[PARENT].message
    whole = decide_set(
        specs, at, replace(partial, complete=True), SetState(), START, batching=BATCHING
    )
    assert whole.targets[PARENT] < 4  # the same window, whole, takes it down
    held = decide_set(pipeline_specs(10), at, partial, SetState(), START, batching=BATCHING)
    assert held.targets == at
    assert {d.reason for d in held.models.values()} == {WARMING_UP}


def test_an_objective_no_split_meets_serves_the_most_and_says_budget_exhausted() -> None:
    decided, _ = planned(with_objective(pipeline_specs(5), 1.0), Load(150.0), counts(1, 1), 2)
    root = decided["pipeline-async"].decision
    assert root.latency is not None and not root.latency.met
    assert {plan.decision.reason for plan in decided.values()} <= {MAX_THROUGHPUT, "Reallocated"}
    assert "no split within the budget meets the latency objective" in root.message
    limited = [p for p in decided.values() if p.decision.scaling_limited.reason == BUDGET_EXHAUSTED]
    assert limited, "no member says the budget holds it below what the objective takes"
    for plan in limited:
        assert plan.decision.recommended_instances > plan.decision.desired_instances


def test_without_an_objective_the_decisions_are_todays() -> None:
    specs = pipeline_specs(7)
    decided, _ = planned(specs, Load(150.0), counts(1, 1), 2)
    assert all(plan.decision.latency is None for plan in decided.values())
    assert not any(plan.decision.reason == LATENCY_OBJECTIVE for plan in decided.values())


@pytest.mark.parametrize("in_turn", [True, False])
def test_a_parent_that_calls_in_turn_is_modelled_so(in_turn: bool) -> None:
    # A root calling its leaf three times an execution with 4 ms of its own: in turn, its
    # execution holds the three calls' times summed (one leaf instance, 5 ms of queue); at
    # once (async), the longest (three leaf instances, one call each, no queue).
    rate, leaf_s = 20.0, 0.010
    queue_s = 0.005 if in_turn else 0.0
    waited = 3 * (queue_s + leaf_s) if in_turn else leaf_s
    signals = {
        "root": ModelSignals("root", rate, 0.0, rate, rate * (0.004 + waited), 0.0, 0.0, 1),
        "leaf": ModelSignals(
            "leaf", 3 * rate, 0.0, 3 * rate, 3 * rate * leaf_s, 3 * rate * queue_s, 0.0, 1
        ),
    }
    specs = {
        "root": AutoscalerSpec.from_dict(
            {
                "selector": {"matchLabels": {"app": "triton"}},
                "model": "root",
                "calls": ["leaf"],
                "targets": {"latency": {"quantile": 0.95, "milliseconds": 500}},
            }
        ),
        "leaf": AutoscalerSpec.from_dict(
            {"selector": {"matchLabels": {"app": "triton"}}, "model": "leaf"}
        ),
    }
    at = {"root": 1, "leaf": 1 if in_turn else 3}
    history = PipelineHistory().observed(MetricSnapshot(START, 60.0, signals), at)
    model = measure(specs, at, history)
    assert model.stages["root"].calls_in_turn is in_turn
    batching = dict.fromkeys(at, Batching(0, dynamic=False))
    found, left = search_of(specs, model, history, batching)
    assert found is not None, left
    station = found.roots[0].network.stations["root"]
    assert station.sequential is in_turn
    assert station.service.at(1) == pytest.approx(0.004)


# ---- the status, the metrics and the events ----------------------------------------------

UNMET = LatencyPrediction(PARENT, 0.95, 60.0, None, 420.0, 400.0, met=False)
MET = LatencyPrediction(PARENT, 0.95, 60.0, 41.26, 420.0, 400.0, met=True)


def test_the_status_carries_the_prediction_its_rate_and_whether_it_meets() -> None:
    shown = LatencyStatus(P95_60_MS, 30.0, 41.26, 420.0, True).to_dict()
    assert shown["predicted"] == {"quantileMilliseconds": 41.3, "atRps": 420.0, "met": True}
    unmet = LatencyStatus(P95_60_MS, 30.0, None, 420.0, False).to_dict()
    assert unmet["predicted"] == {"atRps": 420.0, "met": False}


def tick_result(decision: policy.Decision, latency: LatencyStatus | None) -> TickResult:
    return TickResult(
        model=PARENT,
        at=START,
        decision=decision,
        current_instances=decision.current_instances,
        live_counts={"pod-0": decision.current_instances},
        child_instances={},
        applied=[],
        errors=[],
        conditions=[],
        state=ReconcileState(),
        snapshot=None,
        notes=[],
        dry_run=False,
        duration_s=0.0,
        finished_at=START,
        latency=latency,
    )


def test_a_tick_reports_the_planners_prediction_in_status_and_metrics() -> None:
    decided, _ = planned(with_objective(pipeline_specs(10), 200.0), Load(150.0), counts(1, 1), 2)
    plan = decided["pipeline-async"]
    shown = _latency(plan.spec, plan.snapshot, plan.decision)
    assert shown is not None and shown.met is True
    assert shown.predicted_ms == plan.decision.latency.predicted_ms
    assert tick_result(plan.decision, shown).status()["latency"]["predicted"]["met"] is True
    metrics = OperatorMetrics()
    metrics.record(tick_result(plan.decision, shown), "ml", "pipeline-async")
    labels = {"namespace": "ml", "autoscaler": "pipeline-async", "model": PARENT}
    sample = metrics.registry.get_sample_value
    assert sample("tritonscale_latency_objective_seconds", labels) == pytest.approx(0.2)
    assert sample("tritonscale_latency_predicted_seconds", labels) == pytest.approx(
        shown.predicted_ms / 1000
    )
    assert sample("tritonscale_latency_measured_mean_seconds", labels) == pytest.approx(
        shown.measured_mean_ms / 1000
    )
    # A prediction not made this tick leaves no series with an old value.
    unmade = replace(shown, predicted_ms=None)
    metrics.record(tick_result(plan.decision, unmade), "ml", "pipeline-async")
    assert sample("tritonscale_latency_predicted_seconds", labels) is None
    metrics.forget("ml", "pipeline-async", PARENT)
    assert sample("tritonscale_latency_objective_seconds", labels) is None


class _Logger:
    def debug(self, *_: object) -> None:
        pass

    def info(self, *_: object) -> None:
        pass

    def warning(self, *_: object) -> None:
        pass


def test_an_objective_that_cannot_be_met_is_a_warning_when_it_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    warned: list[tuple[str, str]] = []
    monkeypatch.setattr(
        status.kopf, "warn", lambda obj, reason, message: warned.append((reason, message))
    )
    decided, _ = planned(with_objective(pipeline_specs(10), 200.0), Load(150.0), counts(1, 1), 2)
    decision = decided["pipeline-async"].decision
    reported = status.Reported()
    for latency in (UNMET, UNMET, MET, UNMET):
        result = tick_result(replace(decision, latency=latency), None)
        status.post_events({}, result, reported, _Logger())
    assert [reason for reason, _ in warned] == [status.LATENCY_OBJECTIVE_UNMET] * 2
    assert warned[0][1] == (
        "no split within the budget meets the latency objective (pipeline_async's objective"
        " p95 <= 60 ms: the split cannot serve 420.0 req/s (400.0 offered, with headroom));"
        " the split that serves the most is chosen instead"
    )
