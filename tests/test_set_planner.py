"""The set planner in the control loop (tritonscale.control.set_planner): the members' plans
of one set tick decided together, and a budget's grant that cuts a planned increase
(tritonscale.core.policy.granted). The planner itself is tests/test_planner.py's."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace

import pytest

from tests.pipeline_load import CHILDREN, PARENT, Load, counts, pipeline_specs
from tritonscale.control import set_planner
from tritonscale.control.reconcile import Plan, _batching, _Tick
from tritonscale.control.set_planner import SetPlanner
from tritonscale.control.tick import ReconcileState
from tritonscale.core import policy
from tritonscale.core.behavior import PolicyState
from tritonscale.core.budget import BUDGET_EXHAUSTED, Grant
from tritonscale.core.pipeline_model import Batching
from tritonscale.core.signals import MetricSnapshot
from tritonscale.core.spec import AutoscalerSpec, LabelSelector
from tritonscale.triton.endpoints import Endpoint

pytestmark = pytest.mark.unit

START = 1_000_000.0
TICK_S = 15.0
POD = Endpoint("pod-0", "http://127.0.0.1:1")


def plans(
    specs: Mapping[str, AutoscalerSpec],
    at: Mapping[str, int],
    snapshot: MetricSnapshot | None,
    now: float,
    states: Mapping[str, ReconcileState] | None = None,
) -> dict[str, Plan]:
    """One plan a member (named after its model with dashes), as a set tick has them once the
    snapshot is read."""
    states = states or {}
    return {
        model.replace("_", "-"): Plan(
            spec=spec,
            tick=_Tick(now, states.get(model, ReconcileState()), time.monotonic()),
            endpoints=(POD,),
            live={POD.name: at[model]},
            current=at[model],
            children={child: at[child] for child in spec.calls},
            snapshot=snapshot,
            errors=(),
            notes=(),
            healing=(),
        )
        for model, spec in specs.items()
    }


def test_a_set_under_load_ends_on_its_best_split_within_the_budget() -> None:
    specs = pipeline_specs(7)
    planner, at = SetPlanner(), counts(1, 1)
    load = Load(400.0)
    moved: list[dict[str, int]] = []
    for tick in range(6):
        now = START + tick * TICK_S
        decided = planner.planned(plans(specs, at, load.snapshot(now, at), now), now)
        for name, plan in decided.items():
            assert plan.chosen is not None, f"{name} was not decided by the set's planner"
            assert plan.decision is plan.chosen
        at = {plan.spec.model: plan.decision.desired_instances for plan in decided.values()}
        moved.append(at)
        assert sum(at.values()) <= 7, f"tick {tick} went over the budget: {at}"
    final = moved[-1]
    served = load.served_rps(final)
    best = max(
        load.served_rps(counts(p, e, c, r))
        for p in range(1, 5)
        for e in range(1, 5)
        for c in range(1, 5)
        for r in range(1, 5)
        if p + e + c + r <= 7
    )
    assert served >= 0.98 * best, f"ended on {final}: {served:.0f} of the best {best:.0f} req/s"
    assert planner.prediction is not None and planner.prediction.bottleneck in {PARENT, *CHILDREN}
    for plan in decided.values():
        assert plan.decision.scaling_active.status
        assert plan.decision.state is planner.state.policies[plan.spec.model]
        assert plan.prediction is planner.last.prediction


def test_the_live_configs_batching_reaches_the_planner(monkeypatch) -> None:
    # A tick reads its model's live config and its children's: how each batches goes to the
    # planner, a member's own reading first. A config that could not be read is left out.
    configs_of = {
        PARENT: {POD.name: {"max_batch_size": 32, "dynamic_batching": {}}},
        "branch_embed": {POD.name: {"max_batch_size": 64, "dynamic_batching": {}}},
        "branch_rank": {},  # the pod did not answer
    }
    assert _batching(configs_of, POD) == {
        PARENT: Batching(32, dynamic=True),
        "branch_embed": Batching(64, dynamic=True),
    }
    specs = pipeline_specs(7)
    at = counts(2, 2)
    members = plans(specs, at, Load(100.0).snapshot(START, at), START)
    members["pipeline-async"] = replace(
        members["pipeline-async"], batching=_batching(configs_of, POD)
    )
    members["branch-embed"] = replace(
        members["branch-embed"], batching={"branch_embed": Batching(64, dynamic=False)}
    )
    told: dict[str, Mapping[str, Batching]] = {}
    decide = set_planner.decide_set

    def spy(*args, **kwargs):
        told.update(args[5] if len(args) > 5 else kwargs["batching"])
        return decide(*args, **kwargs)

    monkeypatch.setattr(set_planner, "decide_set", spy)
    SetPlanner().planned(members, START)
    assert told == {
        PARENT: Batching(32, dynamic=True),
        "branch_embed": Batching(64, dynamic=False),
    }


def test_the_end_of_a_load_reaches_the_planners_windows() -> None:
    # A tick decides 1 -> 2 for branch_embed; its load ends 6 s later (the set tick reports
    # it). The planner's windows date the new count from the load's end, not from the tick
    # (tests/test_pipeline_model.py: which windows that leaves out).
    specs, planner = pipeline_specs(7), SetPlanner()
    before, after = counts(2, 1), counts(2, 2)
    load = Load(100.0)
    for tick in range(3):
        now = START + tick * TICK_S
        planner.planned(plans(specs, before, load.snapshot(now, before), now), now)
    decided_at = START + 2 * TICK_S
    planner.went_live("branch_embed", decided_at + 6.0)
    planner.went_live("branch_embed", decided_at + 1.0)  # an older report does not move it back
    now = decided_at + TICK_S
    planner.planned(plans(specs, after, load.snapshot(now, after), now), now)
    history = planner.state.history
    assert history.live_since["branch_embed"] == decided_at + 6.0
    assert history.changed_at(["branch_embed"], after) == decided_at + 6.0


def test_members_that_read_different_pods_are_decided_in_groups_each_on_its_own_snapshot() -> None:
    # Two Deployments bound by one budget: one set, two snapshots. Each group is decided from
    # its own pods' window, as a planner of that group alone decides it, and keeps its own
    # state from tick to tick.
    specs = pipeline_specs(7)
    other = {
        model: spec.model_copy(update={"selector": LabelSelector(matchLabels={"app": "b"})})
        for model, spec in specs.items()
    }
    busy, quiet = Load(400.0), Load(30.0)
    planner, alone_a, alone_b = SetPlanner(), SetPlanner(), SetPlanner()
    at_a, at_b = counts(1, 1), counts(2, 2)
    for tick in range(3):
        now = START + tick * TICK_S
        group_a = plans(specs, at_a, busy.snapshot(now, at_a), now)
        group_b = {
            f"b-{name}": plan
            for name, plan in plans(other, at_b, quiet.snapshot(now, at_b), now).items()
        }
        decided = planner.planned({**group_a, **group_b}, now)
        expect_a = alone_a.planned(group_a, now)
        expect_b = alone_b.planned({name[2:]: plan for name, plan in group_b.items()}, now)
        for name, plan in expect_a.items():
            assert decided[name].decision.desired_instances == plan.decision.desired_instances
            assert decided[name].decision.reason == plan.decision.reason
        for name, plan in expect_b.items():
            assert decided[f"b-{name}"].decision.desired_instances == (
                plan.decision.desired_instances
            )
        at_a = {p.spec.model: p.decision.desired_instances for p in expect_a.values()}
        at_b = {p.spec.model: p.decision.desired_instances for p in expect_b.values()}
    assert len(planner.decisions) == 2
    assert sum(at_a.values()) > sum(counts(1, 1).values()), "the busy group was not scaled up"


def test_two_members_naming_one_model_get_one_decision_and_say_so() -> None:
    specs = pipeline_specs(7)
    at, now = counts(1, 1), START
    members = plans(specs, at, Load(400.0).snapshot(now, at), now)
    members["embed-again"] = replace(members["branch-embed"])
    decided = SetPlanner().planned(members, now)
    first, again = decided["branch-embed"], decided["embed-again"]
    assert again.decision.desired_instances == first.decision.desired_instances
    assert not any("another member" in note for note in first.notes)
    assert any("another member that names branch_embed" in note for note in again.notes)


def test_a_restarted_planner_keeps_the_members_stabilization_windows() -> None:
    # The behavior history lives in each member's state (its status): a fresh planner, as
    # after a restart, holds a scale-down that the window still holds, and lets one go that
    # the window no longer holds.
    specs = {
        model: spec.model_copy(
            update={
                "behavior": spec.behavior.model_copy(
                    update={
                        "scale_down": spec.behavior.scale_down.model_copy(
                            update={"stabilization_window_seconds": 60}
                        )
                    }
                )
            }
        )
        for model, spec in pipeline_specs(12).items()
    }
    at, now = counts(4, 4), START
    quiet = Load(20.0).snapshot(now, at)
    recent = {model: PolicyState().recommend(4, now - 30, specs[model]) for model in specs}
    old = {model: PolicyState().recommend(4, now - 90, specs[model]) for model in specs}
    held = SetPlanner().planned(
        plans(specs, at, quiet, now, {m: ReconcileState(policy=s) for m, s in recent.items()}),
        now,
    )
    let_go = SetPlanner().planned(
        plans(specs, at, quiet, now, {m: ReconcileState(policy=s) for m, s in old.items()}),
        now,
    )
    assert held["branch-embed"].decision.desired_instances == 4
    assert let_go["branch-embed"].decision.desired_instances < 4


def test_without_metrics_every_member_holds_and_says_why() -> None:
    specs = pipeline_specs(7)
    at = counts(2, 2)
    decided = SetPlanner().planned(plans(specs, at, None, START), START)
    for plan in decided.values():
        assert plan.decision.desired_instances == at[plan.spec.model]
        assert plan.decision.reason == policy.METRICS_MISSING
        assert not plan.decision.scaling_active.status


def test_a_grant_cuts_a_planned_increase_but_never_below_the_current_count() -> None:
    specs = pipeline_specs(7)
    at = counts(1, 1)
    now = START + 10 * TICK_S
    planner = SetPlanner()
    decided = {}
    for tick in range(3):
        now = START + tick * TICK_S
        decided = planner.planned(plans(specs, at, Load(400.0).snapshot(now, at), now), now)
        rising = [p for p in decided.values() if p.decision.desired_instances > p.current]
        if rising:
            break
    assert rising, "no model was planned up under a load the set cannot serve at 1 each"
    plan = rising[0]
    asked = plan.decision.desired_instances
    cut = plan.decide(Grant(plan.spec.model, asked, plan.current, "the pod is full"))
    assert cut.desired_instances == plan.current
    assert cut.reason == BUDGET_EXHAUSTED and cut.scaling_limited.status
    assert "the pod is full" in cut.message and str(asked) in cut.message
    whole = plan.decide(Grant(plan.spec.model, asked, asked, ""))
    assert whole is plan.chosen
    below = plan.decide(Grant(plan.spec.model, asked, 0, "nothing left"))
    assert below.desired_instances == plan.current


def test_a_latency_objective_without_its_pipelines_batching_changes_no_count_and_says_why() -> None:
    # The layered queueing model needs each model's batching (from its live config): where
    # the tick read none, the set decides as one without the objective, and the root says so.
    specs = pipeline_specs(7)
    with_objective = {
        **specs,
        PARENT: AutoscalerSpec.from_dict(
            {**specs[PARENT].to_dict(), "targets": {"latency": {"milliseconds": 100}}}
        ),
    }
    at, now = counts(1, 1), START
    snapshot = Load(400.0).snapshot(now, at)
    plain = SetPlanner().planned(plans(specs, at, snapshot, now), now)
    objective = SetPlanner().planned(plans(with_objective, at, snapshot, now), now)
    for name, plan in plain.items():
        assert objective[name].decision.desired_instances == plan.decision.desired_instances
        assert objective[name].decision.reason == plan.decision.reason
        assert objective[name].notes == plan.notes
    said = objective["pipeline-async"].decision.message
    assert said.endswith(
        "pipeline_async is not sized to its latency objective: the batching of branch_classify,"
        " branch_embed, branch_rank, pipeline_async is not known (no config was read)"
    )
    assert objective["pipeline-async"].decision.latency is None


def test_a_latency_objective_on_a_child_is_ignored_and_says_why() -> None:
    specs = pipeline_specs(7)
    child = "branch_rank"
    specs[child] = AutoscalerSpec.from_dict(
        {**specs[child].to_dict(), "targets": {"latency": {"milliseconds": 100}}}
    )
    at, now = counts(1, 1), START
    decided = SetPlanner().planned(plans(specs, at, Load(400.0).snapshot(now, at), now), now)
    (note,) = [n for n in decided["branch-rank"].notes if "latency" in n]
    assert note == (
        "spec.targets.latency is ignored: branch_rank is called by pipeline_async, and a latency"
        " objective belongs on the pipeline's root"
    )
    assert not any("latency" in n for n in decided["pipeline-async"].notes)
