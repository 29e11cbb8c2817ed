"""Properties of the set planner deciding one model, over generated specs, loads, histories
and clocks (hypothesis).

- the bounds always hold (unless paused, which never acts);
- more load never means fewer instances, one signal at a time, other things equal (from a
  load that is measured, on a fresh history);
- a constant load never flaps: the count moves one way, then stays (one that reads as a
  closed loop may step up and give back what the step did not buy, once);
- missing, stale, incomplete or broken metrics never move the count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.model_signals import MODEL, signals, snapshot
from tritonscale.core.pipeline_model import MIN_REQUESTS_PER_WINDOW, SATURATED_UTILIZATION
from tritonscale.core.planner import SetState, as_policy_decision, decide_set
from tritonscale.core.policy import Decision, max_snapshot_age_s
from tritonscale.core.signals import GpuSignals, MetricSnapshot, ModelSignals
from tritonscale.core.spec import AutoscalerSpec

pytestmark = pytest.mark.unit

START = 1_000_000.0
# database=None: no .hypothesis/ folder in the tree; a failure prints its reproducing example.
PROFILE = settings(
    max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
REQUEST_COST_S = 0.014  # an instance's seconds per request: more busy seconds, more requests
WINDOW_S = 60.0  # tests.model_signals.snapshot's


def decide(
    spec: AutoscalerSpec,
    current: int,
    snap: MetricSnapshot | None,
    state: SetState,
    now: float,
    child_instances: dict[str, int] | None = None,
) -> tuple[Decision, SetState]:
    """The planner's decision for a set of `spec`'s model (and the child it calls, when its
    count is given: a set of two), and the state for the next tick."""
    specs = {spec.model: spec}
    counts = {spec.model: current}
    for child, count in (child_instances or {}).items():
        specs[child] = spec.model_copy(
            update={"model": child, "calls": (), "min_instances": 1, "max_instances": 16}
        )
        counts[child] = count
    decided = decide_set(specs, counts, snap, state, now)
    return as_policy_decision(spec, decided, snap), decided.state


@st.composite
def rules(draw: st.DrawFn, direction: str) -> dict[str, Any]:
    policies = draw(
        st.lists(
            st.fixed_dictionaries(
                {
                    "type": st.sampled_from(["Instances", "Percent"]),
                    "value": st.integers(1, 200),
                    "periodSeconds": st.integers(1, 600),
                }
            ),
            min_size=1,
            max_size=3,
        )
    )
    return {
        "stabilizationWindowSeconds": draw(st.sampled_from([0, 15, 60, 300])),
        "selectPolicy": draw(st.sampled_from(["Max", "Min", "Disabled"])),
        "policies": policies,
    }


@st.composite
def specs(draw: st.DrawFn, paused: bool | None = False) -> AutoscalerSpec:
    low = draw(st.integers(1, 6))
    high = draw(st.integers(low, 16))
    return AutoscalerSpec.from_dict(
        {
            "selector": {"matchLabels": {"app": "triton"}},
            "model": MODEL,
            "calls": ["branch_embed"],
            "minInstances": low,
            "maxInstances": high,
            "targets": {
                "utilization": draw(st.floats(0.1, 1.0)),
                "queueComputeRatio": draw(st.floats(0.0, 3.0)),
                "pendingPerInstance": draw(st.floats(0.1, 10.0)),
            },
            "tolerance": draw(st.sampled_from([0.0, 0.05, 0.1, 0.3])),
            "behavior": {"scaleUp": draw(rules("up")), "scaleDown": draw(rules("down"))},
            "intervalSeconds": draw(st.sampled_from([5, 15, 30])),
            "paused": draw(st.booleans()) if paused is None else paused,
        }
    )


@dataclass(frozen=True)
class Load:
    """The load in independent terms: more of any one is more load."""

    busy_seconds: float  # compute seconds per second, all pods
    queue_ratio: float  # queue time per compute time
    pending: float  # pending requests, all pods
    pods: int

    def signals(self) -> ModelSignals:
        return signals(
            compute=self.busy_seconds,
            queue=self.queue_ratio * self.busy_seconds,
            pending=self.pending,
            pods=self.pods,
            requests=self.busy_seconds / REQUEST_COST_S,
        )


@st.composite
def loads(draw: st.DrawFn, spec: AutoscalerSpec) -> Load:
    """A load scaled to the spec, so that most loads need a count between its bounds."""
    targets, pods = spec.targets, draw(st.integers(1, 4))
    room = 1.3 * spec.max_instances * pods  # up to 30% more than maxInstances can serve
    return Load(
        busy_seconds=draw(st.floats(0.0, 1.0)) * room * targets.utilization,
        queue_ratio=draw(st.floats(0.0, 2.0)) * (1 + targets.queue_compute_ratio),
        pending=draw(st.floats(0.0, 1.0)) * room * targets.pending_per_instance,
        pods=pods,
    )


gpus = st.none() | st.builds(GpuSignals, st.floats(0.0, 1.0), st.none() | st.floats(0.0, 1.0))
children = st.none() | st.builds(
    lambda busy, count: (signals("branch_embed", compute=busy), count),
    st.floats(0.0, 20.0),
    st.integers(1, 16),
)


@st.composite
def histories(draw: st.DrawFn, spec: AutoscalerSpec, current: int) -> tuple[SetState, float]:
    """A state reached by some earlier ticks of varied load; returns it and the clock."""
    state, now, count = SetState(), START, current
    for load in draw(st.lists(loads(spec), max_size=8)):
        decision, state = decide(spec, count, snapshot(load.signals(), taken_at=now), state, now)
        if draw(st.booleans()):  # applied, or not (a dry run, a failed load)
            count = decision.desired_instances
        now += draw(st.sampled_from([1.0, 15.0, 60.0]))
    return state, now


def one_tick(
    spec: AutoscalerSpec,
    current: int,
    load: Load,
    state: SetState,
    now: float,
    gpu: GpuSignals | None = None,
    child: Any = None,
) -> int:
    models = [load.signals()]
    child_instances = {}
    if child is not None:
        models.append(child[0])
        child_instances = {"branch_embed": child[1]}
    snap = snapshot(*models, taken_at=now, gpu=gpu)
    return decide(spec, current, snap, state, now, child_instances)[0].desired_instances


@PROFILE
@given(data=st.data(), spec=specs(), gpu=gpus, child=children)
def test_the_bounds_always_hold(
    data: st.DataObject, spec: AutoscalerSpec, gpu: GpuSignals | None, child: Any
) -> None:
    # The live count may start outside the bounds (a pod restarted with its default).
    current = data.draw(st.integers(max(1, spec.min_instances - 2), spec.max_instances + 2))
    start = min(max(current, spec.min_instances), spec.max_instances)
    state, now = data.draw(histories(spec, start))
    desired = one_tick(spec, current, data.draw(loads(spec)), state, now, gpu, child)
    assert spec.min_instances <= desired <= spec.max_instances


@PROFILE
@given(data=st.data(), spec=specs(paused=True), current=st.integers(1, 20))
def test_paused_never_acts_not_even_to_clamp(
    data: st.DataObject, spec: AutoscalerSpec, current: int
) -> None:
    desired = one_tick(spec, current, data.draw(loads(spec)), SetState(), START)
    assert desired == current


@PROFILE
@given(
    data=st.data(),
    spec=specs(),
    gpu=gpus,
    child=children,
    which=st.sampled_from(["busy_seconds", "queue_ratio", "pending"]),
    more=st.floats(0.0, 1.0),
)
def test_more_load_never_means_fewer_instances(
    data: st.DataObject,
    spec: AutoscalerSpec,
    gpu: GpuSignals | None,
    child: Any,
    which: str,
    more: float,
) -> None:
    load = data.draw(loads(spec))
    # A model with too few requests to measure keeps its count, whatever it is: the
    # property holds from a load that is measured.
    assume(load.busy_seconds / REQUEST_COST_S * WINDOW_S >= MIN_REQUESTS_PER_WINDOW)
    more *= 1 + getattr(load, which)  # from a little more to about twice as much
    current = data.draw(st.integers(spec.min_instances, spec.max_instances))
    # From a fresh history: after earlier windows, a load unlike theirs is not decided on for
    # one tick (LoadStepInWindow, tests/test_planner.py), where the lighter one would be.
    state, now = SetState(), START
    heavier = Load(**{**load.__dict__, which: getattr(load, which) + more})
    before = one_tick(spec, current, load, state, now, gpu, child)
    after = one_tick(spec, current, heavier, state, now, gpu, child)
    assert after >= before


@PROFILE
@given(
    data=st.data(),
    spec=specs(),
    gpu=gpus,
    child=children,
    interval=st.sampled_from([1.0, 5.0, 15.0, 60.0]),
)
def test_a_constant_load_never_flaps(
    data: st.DataObject, spec: AutoscalerSpec, gpu: GpuSignals | None, child: Any, interval: float
) -> None:
    load = data.draw(loads(spec))
    current = data.draw(st.integers(spec.min_instances, spec.max_instances))
    state, now = SetState(), START
    counts = [current]
    for _ in range(60):
        models = [load.signals()] + ([child[0]] if child else [])
        snap = snapshot(*models, taken_at=now, gpu=gpu)
        decision, state = decide(
            spec, current, snap, state, now, {"branch_embed": child[1]} if child else {}
        )
        current = decision.desired_instances
        counts.append(current)
        now += interval
    steps = [b - a for a, b in zip(counts, counts[1:], strict=False) if b != a]
    # A load that saturates the model's instances at some count in its range, with more
    # waiting than running, reads there as a closed loop (clients that send more as they are
    # served more): the planner steps up to the split that serves the most. A snapshot held
    # constant across that step says it bought nothing, and the planner gives back what the
    # measured demand does not need: up, then down, once. Any other turn is a flap.
    closed = (
        load.queue_ratio > 1
        and load.busy_seconds >= SATURATED_UTILIZATION * spec.min_instances * load.pods
    )
    turns = sum(1 for a, b in zip(steps, steps[1:], strict=False) if (a > 0) != (b > 0))
    if closed and steps and steps[0] > 0:
        assert turns <= 1, counts
    else:
        assert turns == 0, counts


def _broken(load: Load, how: str, spec: AutoscalerSpec, now: float) -> MetricSnapshot | None:
    if how == "none":
        return None
    if how == "model missing":
        return snapshot(signals("branch_embed"), taken_at=now)
    if how == "stale":
        return snapshot(load.signals(), taken_at=now - max_snapshot_age_s(spec) - 0.5)
    if how == "incomplete":
        return snapshot(load.signals(), taken_at=now, complete=False)
    broken = {"nan": math.nan, "inf": math.inf, "negative": -1.0}[how]
    fields = {**load.signals().__dict__, "compute_seconds_per_second": broken}
    return snapshot(ModelSignals(**fields), taken_at=now)


@PROFILE
@given(
    data=st.data(),
    spec=specs(),
    how=st.sampled_from(["none", "model missing", "stale", "incomplete", "nan", "inf", "negative"]),
)
def test_missing_stale_or_incomplete_metrics_never_move_the_count(
    data: st.DataObject, spec: AutoscalerSpec, how: str
) -> None:
    load = data.draw(loads(spec))
    current = data.draw(st.integers(spec.min_instances, spec.max_instances))
    state, now = data.draw(histories(spec, current))
    decision, _ = decide(spec, current, _broken(load, how, spec, now), state, now)
    assert decision.desired_instances == current
    assert decision.scaling_active.status is False
    assert decision.reason in {"MetricsMissing", "MetricsStale", "WarmingUp", "Unmeasured"}
