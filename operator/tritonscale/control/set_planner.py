"""The set planner in the control loop: one `decide_set` a set tick, its state kept between.

    planner = SetPlanner(pod_set.name)           # one per pod set, kept by the driver
    plans = planner.planned(plans, now)          # in tritonscale.control.set_tick

With `planner: set`, the default (the local driver's file, the operator's `--planner`), a set
tick decides its members together (tritonscale.core.planner): the members' plans, each up to its
metrics and the batching of the live configs its tick read, go in; each comes back with the
planner's decision for its model (`Plan.chosen`) and the set's prediction, and the tick then
grants, applies and reports them as it does the policy's. The planner's state (the
pipeline's windows, the verifier's pending check and corrections) lives here, in memory: a
driver that restarts starts afresh, which is safe (a fresh behavior history holds scale-downs
back, and the windows fill again within one metrics window).

The members a set tick decides together share one snapshot (the same pods and window); where
the members read different pods or windows, or two name the same model, the policy decides
each on its own this tick and the plans say why in a note.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from tritonscale.control.reconcile import Plan
from tritonscale.core.allocator import Prediction
from tritonscale.core.planner import SetDecision, SetState, as_policy_decision, decide_set

MODEL = "model"  # each model decided on its own (tritonscale.core.policy)
SET = "set"  # the set's models decided together (tritonscale.core.planner)
PLANNERS = (MODEL, SET)
DEFAULT = SET


class SetPlanner:
    """One pod set's planner across its ticks."""

    def __init__(self, name: str = "") -> None:
        self.name = name  # the set's (tritonscale.control.pod_sets), for the metrics
        self.last: SetDecision | None = None  # the last tick's decision, for reports
        self.prediction: Prediction | None = None  # the last prediction made

    @property
    def state(self) -> SetState:
        """What the next tick starts from: the last decision's state, or a fresh one."""
        return self.last.state if self.last is not None else SetState()

    def planned(self, plans: Mapping[str, Plan], now: float) -> dict[str, Plan]:
        """`plans` (by member) with the set's decision in each; unchanged where the members
        cannot be decided together (see the module's docstring)."""
        if not plans:
            return dict(plans)
        why = _not_together(plans)
        if why is not None:
            return {
                name: replace(plan, notes=(*plan.notes, f"decided on its own: {why}"))
                for name, plan in plans.items()
            }
        snapshot = next(iter(plans.values())).snapshot
        specs = {plan.spec.model: plan.spec for plan in plans.values()}
        current = {plan.spec.model: plan.current for plan in plans.values()}
        # Each model's batching as its own member's tick read it, else as a caller's did (a
        # caller's tick reads its children's configs too).
        batching = {
            model: batching
            for plan in plans.values()
            for model, batching in plan.batching.items()
            if model in specs
        }
        for plan in plans.values():
            own = plan.batching.get(plan.spec.model)
            if own is not None:
                batching[plan.spec.model] = own
        decided = decide_set(specs, current, snapshot, self.state, now, batching)
        self.last = decided
        if decided.prediction is not None:
            self.prediction = decided.prediction
        return {
            name: replace(
                plan,
                chosen=as_policy_decision(plan.spec, decided, snapshot),
                prediction=decided.prediction,
            )
            for name, plan in plans.items()
        }


def _not_together(plans: Mapping[str, Plan]) -> str | None:
    models = [plan.spec.model for plan in plans.values()]
    if len(set(models)) < len(models):
        return "two members of the set name the same model"
    first = next(iter(plans.values()))
    for plan in plans.values():
        if plan.snapshot is not first.snapshot:
            return "the set's members read different pods or metrics windows"
    return None
