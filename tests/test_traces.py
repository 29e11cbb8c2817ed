"""The production-shaped trace (loadtests.traces) and the trace benchmark's arithmetic
(loadtests.bench.trace): pure, no server."""

from __future__ import annotations

import math

import pytest

from loadtests import hpa_way, objective, traces
from loadtests.bench import trace as bench
from tritonscale.core.spec import AutoscalerSpec

pytestmark = pytest.mark.unit


class TestTheTrace:
    def test_the_same_seed_gives_the_same_day(self) -> None:
        assert traces.production_trace(600, 300.0, 4) == traces.production_trace(600, 300.0, 4)
        assert traces.production_trace(600, 300.0, 4) != traces.production_trace(600, 300.0, 5)

    def test_its_busiest_second_is_the_peak_asked_for(self) -> None:
        day = traces.production_trace(600, 300.0)
        assert max(day.rates) == pytest.approx(300.0)
        assert day.seconds == 600 and all(rate > 0 for rate in day.rates)

    def test_the_diurnal_swing_is_about_five_from_trough_to_peak(self) -> None:
        day = traces.diurnal(600)
        assert max(day) == pytest.approx(1.0)
        # The ramp lifts the evening: the first second is the lowest, a little under 1/5.
        assert 4.5 <= max(day) / min(day) <= 6.0
        assert min(day) == day[0]
        # It peaks in the middle of the day (the ramp moves the peak a little later).
        assert 300 <= day.index(max(day)) <= 340
        # A slow ramp: the end of the day is busier than its start.
        assert day[-1] > day[0] * (1 + traces.RAMP / 2)

    def test_bursts_are_two_to_three_times_the_rate_for_ten_to_thirty_seconds(self) -> None:
        for seed in range(1, 20):
            day = traces.production_trace(600, 300.0, seed)
            assert 5 <= len(day.bursts) <= 6, seed  # one a slot of 100 s
            for burst in day.bursts:
                assert traces.BURST_SECONDS[0] <= burst.seconds <= traces.BURST_SECONDS[1]
                assert traces.BURST_FACTOR[0] <= burst.factor <= traces.BURST_FACTOR[1]
            starts = [b.start_s for b in day.bursts]
            ends = [b.start_s + b.seconds for b in day.bursts]
            assert all(end <= start for end, start in zip(ends, starts[1:], strict=False))

    def test_a_burst_lifts_the_rate_under_it_but_never_above_the_peak(self) -> None:
        day = traces.production_trace(600, 300.0, 1)
        base = [rate * 300.0 for rate in traces.diurnal(600)]
        first = day.bursts[0]
        inside = first.start_s + first.seconds // 2
        assert day.rates[inside] == pytest.approx(min(300.0, base[inside] * first.factor))
        assert day.rates[first.start_s + first.seconds] == pytest.approx(
            base[first.start_s + first.seconds]
        )
        assert all(rate <= 300.0 + 1e-9 for rate in day.rates)

    def test_a_trace_needs_time_and_a_rate(self) -> None:
        with pytest.raises(ValueError, match="seconds >= 1"):
            traces.production_trace(0, 10.0)
        with pytest.raises(ValueError, match="peak_rps > 0"):
            traces.production_trace(10, 0.0)


class TestAttainment:
    def test_a_request_never_answered_is_slower_than_any(self) -> None:
        # 20 due, 18 answered at 10 ms: p95 is the 19th, one of the two never answered.
        assert objective.quantile_with_misses([0.01] * 18, 20, 0.95) == math.inf
        assert objective.quantile_with_misses([0.01] * 19, 20, 0.95) == 0.01
        assert objective.quantile_with_misses([], 0, 0.95) is None

    def test_windows_and_requests_are_counted_by_when_they_were_due(self) -> None:
        start = 1000.0
        due = [start + i / 10 for i in range(200)]  # 10 a second for 20 s
        # The first 10 s answered in 50 ms; the second 10 s: one in ten failed.
        answered = [(t, 0.05) for t in due[:100]]
        answered += [(t, None if i % 10 == 0 else 0.05) for i, t in enumerate(due[100:])]
        got = objective.attainment(due, answered, start, 20, objective_s=0.1)
        assert (got.due, got.met, got.windows, got.windows_met) == (200, 190, 2, 1)
        assert got.per_second[0] == {"t": 0, "offered": 10, "p95_ms": 50.0}
        assert got.per_second[10]["p95_ms"] is None  # a miss is no latency to plot

    def test_instance_seconds_hold_each_count_until_the_next(self) -> None:
        samples = [(99.0, 4), (102.0, 6), (105.0, 5)]
        # [100, 102) at 4, [102, 105) at 6, [105, 110) at 5.
        assert objective.instance_seconds(samples, 100.0, 110.0) == 8 + 18 + 25


class TestTheHpaWay:
    @staticmethod
    def spec() -> AutoscalerSpec:
        selector = {"matchLabels": {"app": "triton"}}
        return AutoscalerSpec.from_dict({"selector": selector, "model": "m", "maxInstances": 6})

    @pytest.mark.parametrize(
        ("current", "utilization", "desired"),
        [
            (2, 0.7, 2),  # on target
            (2, 0.76, 2),  # within the tolerance of 0.1
            (2, 0.8, 3),  # ceil(2 x 0.8 / 0.7) = ceil(2.29)
            (4, 0.3, 2),  # ceil(4 x 0.3 / 0.7) = ceil(1.71)
            (4, 2.0, 6),  # ceil(11.4), bounded by maxInstances
            (1, 0.0, 1),  # nothing to do: the floor
        ],
        ids=["on target", "within tolerance", "up", "down", "bounded by max", "idle at min"],
    )
    def test_it_is_hpas_formula(self, current: int, utilization: float, desired: int) -> None:
        assert hpa_way.hpa_desired(self.spec(), current, utilization) == desired

    def test_its_specs_are_the_charts(self) -> None:
        specs = bench.hpa_specs("pipeline_async", bench.FULL)
        root = specs["pipeline_async"]
        assert root.calls == bench.BRANCHES
        assert root.targets.utilization == 0.7 and root.interval_seconds == 15
        assert root.behavior.scale_down.stabilization_window_seconds == 300
        assert root.budget is None  # each model by itself


class TestTheArms:
    def test_the_operator_carries_the_objective_on_the_root_and_the_budget_on_all(self) -> None:
        from types import SimpleNamespace

        from tritonscale.drivers.tune import parse_config

        pod = SimpleNamespace(
            http_url="127.0.0.1:8000", metrics_url="http://127.0.0.1:8002/metrics"
        )
        config = parse_config(bench.operator_policies(pod, "pipeline_async", bench.FULL, 120.0))
        by_model = {p.spec.model: p.spec for p in config.policies}
        objective = by_model["pipeline_async"].targets.latency
        assert objective is not None and (objective.quantile, objective.milliseconds) == (
            0.95,
            120.0,
        )
        assert all(by_model[m].targets.latency is None for m in bench.BRANCHES)
        assert {spec.budget.instances_per_pod for spec in by_model.values()} == {7}

    def test_the_limit_pays_each_second_for_the_level_above_its_rate(self) -> None:
        def chosen(total: int, meets: bool = True, share: float = 1.0) -> dict:
            return {"total": total, "meets": meets, "met_share": share}

        levels = [
            {"rate": 100.0, "chosen": chosen(7)},
            {"rate": 50.0, "chosen": chosen(5, share=0.98)},
        ]
        day = traces.Trace(tuple([40.0] * 10 + [90.0] * 10), (), 100.0, 1)
        limit = objective.limit_arm(day, levels)
        assert limit["instance_seconds"] == 10 * 5 + 10 * 7
        assert limit["windows_met_share"] == 1.0
        assert limit["requests_met_share"] == pytest.approx((400 * 0.98 + 900) / 1300, abs=1e-4)
        # A rate above every level takes the highest.
        assert objective.level_for(120.0, levels)["rate"] == 100.0

    def test_splits_cover_every_total_up_to_the_budget(self) -> None:
        found = bench.splits(("a", "b", "c", "d"), 6)
        assert len(found) == 1 + 4 + 10  # totals 4, 5 and 6
        assert all(4 <= sum(s.values()) <= 6 and min(s.values()) >= 1 for s in found)
