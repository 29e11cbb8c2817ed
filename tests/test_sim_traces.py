"""The trace arms in the simulator (loadtests.sim.trace_*): per-request latency, arrivals after
a trace, the sweep's static split, the arms' bookkeeping against the limit, the HPA way's
tick, determinism, and a small run of the whole path."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from loadtests import hpa_way, objective, traces
from loadtests.sim import trace_arms, trace_cases, trace_main, trace_sweep
from loadtests.sim.controllers import CONTROLLERS, HpaWayController
from loadtests.sim.pipeline import ModelShape, Pipeline, fan_out
from loadtests.sim.queueing import Simulation
from loadtests.sim.static import StaticSearch
from tritonscale.core.behavior import PolicyState
from tritonscale.core.signals import ModelSignals
from tritonscale.core.spec import AutoscalerSpec

pytestmark = pytest.mark.unit

# A parent that calls one leaf three times at once, each 20 ms: small enough that the sweep
# simulates every split of a budget of 4 in a moment.
TINY = fan_out(branch_ms=20.0, calls=3)


def tiny_case(seed: int = 3, seconds: int = 90, peak_share: float = 0.8) -> trace_cases.TraceCase:
    return trace_cases.TraceCase(f"tiny-{seed}", "ours", TINY, 4, peak_share, seed, seconds)


class TestLatencyInTheSimulation:
    def test_each_request_of_the_entry_is_recorded_with_its_latency(self) -> None:
        shape = ModelShape("m", 10.0)  # 10 ms an execution, one request each
        sim = Simulation(Pipeline("one", {"m": shape}, ("m",)), {"m": 1}, rows_per_request=1)
        answered = sim.record("m")
        # Two at once: the second waits for the first. One a second later: no wait.
        sim.offer("m", [0.0, 0.0, 1.0])
        sim.run_until(2.0)
        assert answered == [
            (0.0, pytest.approx(0.010)),
            (0.0, pytest.approx(0.020)),
            (1.0, pytest.approx(0.010)),
        ]

    def test_a_request_dropped_at_the_clients_deadline_is_recorded_without_latency(self) -> None:
        shape = ModelShape("m", 1000.0)  # a second an execution
        pipeline = Pipeline("slow", {"m": shape}, ("m",))
        sim = Simulation(pipeline, {"m": 1}, rows_per_request=1, client_timeout_s=1.5)
        answered = sim.record("m")
        sim.offer("m", [0.0, 0.1, 0.2])
        sim.run_until(5.0)
        # The first runs [0, 1], the second [1, 2]; the third, 2 s old at 2.0, is dropped.
        assert answered == [
            (0.0, pytest.approx(1.0)),
            (0.1, pytest.approx(1.9)),
            (0.2, None),
        ]

    def test_only_an_entry_model_records(self) -> None:
        with pytest.raises(ValueError, match="not an entry"):
            Simulation(TINY, {"bls": 1, "leaf": 1}).record("leaf")


def test_arrivals_follow_the_trace_poisson_within_each_second() -> None:
    day = traces.Trace(tuple([50.0] * 100 + [200.0] * 100), (), 200.0, 1)
    times = trace_arms.arrivals(day, np.random.default_rng(1))
    assert times == sorted(times)
    per_second = np.bincount(np.floor(times).astype(int), minlength=200)
    assert per_second[:100].mean() == pytest.approx(50.0, rel=0.05)
    assert per_second[100:].mean() == pytest.approx(200.0, rel=0.05)
    # Poisson: the count of a second varies about as much as its mean.
    assert per_second[100:].var() == pytest.approx(200.0, rel=0.3)


class TestTheSweep:
    def test_static_at_peak_meets_the_objective_at_the_peak(self) -> None:
        search = StaticSearch(trace_sweep.ROWS_PER_REQUEST)
        for seed in (1, 2):
            found = trace_sweep.sweep(TINY, "bls", 4, 0.8, seed, search)
            assert found.static["meets"], seed
            again = trace_sweep.measure(
                TINY, "bls", found.static["instances"], found.peak_rps,
                found.objective_ms / 1000, seed,
            )  # fmt: skip
            assert again["p95_ms"] <= found.objective_ms, seed

    def test_the_objective_is_twice_the_best_splits_p95_at_the_peak_rounded_up(self) -> None:
        found = trace_sweep.sweep(TINY, "bls", 4, 0.8, 1, StaticSearch())
        assert found.objective_ms == 5 * math.ceil(2 * found.probe["p95_ms"] / 5)
        assert found.peak_rps == pytest.approx(0.8 * found.largest_split_rps)

    def test_lower_levels_never_take_more_instances(self) -> None:
        found = trace_sweep.sweep(TINY, "bls", 4, 0.8, 1, StaticSearch())
        totals = [level["chosen"]["total"] for level in found.levels]
        assert totals == sorted(totals, reverse=True)
        assert [level["rate"] for level in found.levels] == sorted(
            (level["rate"] for level in found.levels), reverse=True
        )


def spec(**fields: object) -> AutoscalerSpec:
    return AutoscalerSpec.from_dict(
        {"selector": {"matchLabels": {"app": "triton"}}, "model": "m", "maxInstances": 8, **fields}
    )


def busy(utilization: float, instances: int) -> ModelSignals:
    # Busy per instance is compute seconds a second over the instances (one pod).
    return ModelSignals(
        model="m",
        request_rate=10.0,
        failure_rate=0.0,
        execution_rate=10.0,
        compute_seconds_per_second=utilization * instances,
        queue_seconds_per_second=0.0,
        pending_requests=0.0,
        pods_reporting=1,
    )


class TestTheHpaWay:
    def test_without_metrics_the_count_holds(self) -> None:
        count, _ = hpa_way.hpa_tick(spec(), PolicyState(), 3, None, 0.0)
        assert count == 3

    def test_up_by_the_formula_within_the_rate_policy(self) -> None:
        rules = {"scaleUp": {"policies": [{"type": "Instances", "value": 1, "periodSeconds": 60}]}}
        # ceil(2 x 1.4 / 0.7) = 4, but one instance a minute: 3, then nothing more in that minute.
        count, state = hpa_way.hpa_tick(spec(behavior=rules), PolicyState(), 2, busy(1.4, 2), 0.0)
        assert count == 3
        count, _ = hpa_way.hpa_tick(spec(behavior=rules), state, 3, busy(1.4, 3), 15.0)
        assert count == 3

    def test_down_only_after_the_stabilization_window(self) -> None:
        rules = {"scaleDown": {"stabilizationWindowSeconds": 60}}
        state, count = PolicyState(), 4
        seen = []
        for now in range(0, 91, 15):
            count, state = hpa_way.hpa_tick(
                spec(behavior=rules), state, count, busy(0.1, count), now
            )
            seen.append(count)
        # The first recommendation (4, seeded from the live count) holds the count for 60 s.
        assert seen[:4] == [4, 4, 4, 4] and seen[-1] < 4

    def test_the_simulators_controller_is_that_tick_per_model(self) -> None:
        assert CONTROLLERS["hpa_way"] is HpaWayController
        specs = trace_arms.arm_specs(TINY, None, None)
        assert all(s.budget is None for s in specs.values())  # each model by itself
        assert specs["bls"].interval_seconds == 15  # the chart's windows


class TestTheArms:
    def test_the_operator_carries_the_objective_on_the_root_and_the_budget_on_all(self) -> None:
        specs = trace_arms.arm_specs(TINY, 4, 60.0)
        latency = specs["bls"].targets.latency
        assert latency is not None and (latency.quantile, latency.milliseconds) == (0.95, 60.0)
        assert specs["leaf"].targets.latency is None
        assert {s.budget.instances_per_pod for s in specs.values()} == {4}
        assert specs["bls"].calls == ("leaf",)

    def test_instance_seconds_are_the_counts_held_each_second(self) -> None:
        counts = [{"a": 1, "b": 1}] * 5 + [{"a": 2, "b": 3}] * 5
        judged = trace_arms.judge([(0.5, 0.01)], [0.5], counts, 10, 50.0)
        assert judged["instance_seconds"] == 5 * 2 + 5 * 5
        assert judged["max_total_instances"] == 5
        assert judged["goodput_per_instance_second"] == round(1 / 35, 3)

    @pytest.fixture(scope="class")
    @classmethod
    def row(cls) -> dict:
        return trace_arms.run_case(tiny_case(), StaticSearch(trace_sweep.ROWS_PER_REQUEST))

    def test_a_tick_gives_back_before_it_takes(self) -> None:
        class Swap:
            """At its first tick, one instance moves from the leaf to the parent."""

            def __init__(self) -> None:
                self.live: list[tuple[str, float]] = []

            def decide(self, specs: object, current: dict, snapshot: object, now: float) -> dict:
                return {"bls": 2, "leaf": 1} if now == 0 else dict(current)

            def went_live(self, model: str, at: float) -> None:
                self.live.append((model, at))

        swap = Swap()
        specs = trace_arms.arm_specs(TINY, 3, None)
        trace_arms.replay(TINY, {"bls": 1, "leaf": 2}, [], 5, swap, specs, seed=1)
        (first, given_back_at), (second, taken_at) = swap.live
        assert (first, second) == ("leaf", "bls") and 0.2 <= given_back_at < taken_at <= 2.8

    @pytest.mark.parametrize("seed", [1, 2, 3])
    def test_static_at_peak_never_pays_less_than_the_limit(self, seed: int) -> None:
        # It holds the peak level's split, and no lower level takes more instances.
        row = trace_arms.run_case(tiny_case(seed), StaticSearch(trace_sweep.ROWS_PER_REQUEST))
        static = row["arms"]["static_at_peak"]["instance_seconds"]
        assert row["arms"]["limit"]["instance_seconds"] <= static
        assert static == sum(row["static_at_peak"]["instances"].values()) * 90

    def test_an_arm_that_pays_less_than_the_limit_misses_the_objective(self, row: dict) -> None:
        # The limit is the least that meets every second's level: a controller may pay less
        # (these start at one instance each, before their first full metrics window), but
        # then some window misses.
        limit = row["arms"]["limit"]["instance_seconds"]
        cheaper = [arm for arm in trace_arms.ARMS if row["arms"][arm]["instance_seconds"] < limit]
        assert cheaper, "the tiny day's controllers start below the limit"
        for arm in cheaper:
            assert row["arms"][arm]["windows_met_share"] < 1.0, arm

    def test_every_arm_is_offered_the_same_requests(self, row: dict) -> None:
        due = {row["arms"][arm]["requests_due"] for arm in trace_arms.ARMS}
        assert len(due) == 1 and due.pop() > 0
        assert set(objective.ARM_KEYS) <= row["arms"]["limit"].keys()

    def test_the_same_case_gives_the_same_row(self, row: dict) -> None:
        assert trace_arms.run_case(tiny_case(), StaticSearch(trace_sweep.ROWS_PER_REQUEST)) == row
        other = trace_arms.run_case(tiny_case(seed=4), StaticSearch(trace_sweep.ROWS_PER_REQUEST))
        assert other["arms"] != row["arms"]


def test_the_cases_hold_over_a_hundred_traces_of_both_kinds() -> None:
    cases = trace_cases.generate()
    assert len(cases) >= 100 and len({case.name for case in cases}) == len(cases)
    assert {case.family for case in cases[:5]} == {"ours", "generated"}
    assert all(trace_cases.PEAK_SHARES[0] <= c.peak_share <= trace_cases.PEAK_SHARES[1]
               for c in cases)  # fmt: skip
    assert trace_cases.generate(7) == cases[:7]


def test_a_small_run_of_the_whole_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cases = [tiny_case(seed=1), tiny_case(seed=2, peak_share=0.6)]
    monkeypatch.setattr(trace_cases, "generate", lambda limit=None: cases[:limit])
    out = tmp_path / "traces.json"
    assert trace_main.main(["--jobs", "1", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["traces"] == 2 and [row["case"] for row in doc["rows"]] == ["tiny-1", "tiny-2"]
    for arm in ("static_at_peak", "hpa_way", "operator", "limit"):
        assert doc["arms"][arm]["traces_at_098_of_windows"] is not None, arm
    assert doc["arms"]["limit"]["median_instance_seconds_over_limit"] == 1.0
    assert doc["arms"]["static_at_peak"]["median_goodput_over_static_at_peak"] == 1.0
    assert set(doc["goals"]) >= {"operator_traces_at_098_of_windows", "met"}
    assert out.with_suffix(".png").stat().st_size > 0
