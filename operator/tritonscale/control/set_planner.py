"""The set planner in the control loop: one `decide_set` a set tick, its state kept between.

    planner = SetPlanner(pod_set.name)           # one per pod set, kept by the driver
    plans = planner.planned(plans, now)          # in tritonscale.control.set_tick

A set tick decides its members together (tritonscale.core.planner): the members' plans, each
up to its metrics and the batching of the live configs its tick read, go in; each comes back
with the planner's decision for its model (`Plan.chosen`) and the set's prediction, and the
tick then grants, applies and reports them. The planner's state (the pipeline's windows, the
verifier's pending check and corrections) lives here, in memory: a driver that restarts
starts afresh, which is safe (the behavior history comes back from each member's own state,
kept in its status, and the windows fill again within one metrics window).

The members decided together share one snapshot (the same pods). A set whose members read
different pods (two Deployments bound by one budget) is decided in groups, one per snapshot,
each with its own state, kept by the group's selectors; the budget's ledger then grants across
them. Two members that name the same model are decided as one, by the first member's spec
(by name); each plan says so in a note.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from tritonscale.control.reconcile import Plan
from tritonscale.core.allocator import Prediction
from tritonscale.core.planner import SetDecision, SetState, as_policy_decision, decide_set
from tritonscale.core.selectors import selector_to_string
from tritonscale.core.spec import latency_objectives_off_root


class SetPlanner:
    """One pod set's planner across its ticks."""

    def __init__(self, name: str = "") -> None:
        self.name = name  # the set's (tritonscale.control.pod_sets), for the metrics
        # Per group of members decided together (one unless they read different pods), by
        # their selectors: the last decision, whose state the group's next tick starts from.
        self.decisions: dict[frozenset[str], SetDecision] = {}
        self.last: SetDecision | None = None  # the largest group's last decision, for reports
        self.prediction: Prediction | None = None  # the last prediction made
        # Per model, when the last load that changed its count ended (the ticks' clock): the
        # windows before then mix the old count with the new.
        self.live_since: dict[str, float] = {}
        # Per model, how long its last change took from the tick that decided it until its
        # count was live: what a latency objective's sizing covers (tritonscale.core.latency).
        self.load_s: dict[str, float] = {}
        self._decided_at: float | None = None  # the `now` of the last tick decided

    def went_live(self, model: str, at: float) -> None:
        """A load that changed `model`'s count ended at `at` (the clock of the ticks' `now`),
        after the tick last decided."""
        self.live_since[model] = max(at, self.live_since.get(model, at))
        if self._decided_at is not None and at >= self._decided_at:
            self.load_s[model] = at - self._decided_at

    @property
    def state(self) -> SetState:
        """What the next tick of the largest group starts from."""
        return self.last.state if self.last is not None else SetState()

    def planned(self, plans: Mapping[str, Plan], now: float) -> dict[str, Plan]:
        """`plans` (by member) with the set's decision in each."""
        groups: dict[int, dict[str, Plan]] = {}
        for name in sorted(plans):
            groups.setdefault(id(plans[name].snapshot), {})[name] = plans[name]
        planned: dict[str, Plan] = {}
        largest = 0
        self._decided_at = now
        for group in groups.values():
            decided, notes = self._decided(group, now)
            models = len(decided.models)
            if models > largest or self.last is None:
                largest, self.last = models, decided
            if decided.prediction is not None:
                self.prediction = decided.prediction
            for name, plan in group.items():
                planned[name] = replace(
                    plan,
                    chosen=as_policy_decision(plan.spec, decided, plan.snapshot),
                    prediction=decided.prediction,
                    notes=(*plan.notes, *notes.get(name, ())),
                )
        return {name: planned[name] for name in plans}

    def _decided(
        self, group: Mapping[str, Plan], now: float
    ) -> tuple[SetDecision, dict[str, tuple[str, ...]]]:
        """One `decide_set` for members that share a snapshot; the notes it leaves, by member."""
        deciding: dict[str, Plan] = {}  # by model: the first member (by name) that names it
        notes: dict[str, tuple[str, ...]] = {}
        for name, plan in group.items():
            first = deciding.setdefault(plan.spec.model, plan)
            if first is not plan:
                notes[name] = (
                    f"decided by the spec of another member that names {plan.spec.model} too",
                )
        # One object cannot know its callers (no CEL rule can): the set can.
        off_root = latency_objectives_off_root(plan.spec for plan in deciding.values())
        for name, plan in group.items():
            if plan.spec.model in off_root:
                notes[name] = (
                    *notes.get(name, ()),
                    f"spec.targets.latency is ignored: {plan.spec.model} is called by"
                    f" {off_root[plan.spec.model]}, and a latency objective belongs on the"
                    " pipeline's root",
                )
        key = frozenset(selector_to_string(plan.spec.selector) for plan in group.values())
        previous = self.decisions.get(key)
        state = previous.state if previous is not None else SetState()
        # A model new to the planner starts from the behavior history its member kept (in its
        # status), so that a restarted operator does not lose its stabilization windows.
        policies = {model: plan.tick.state.policy for model, plan in deciding.items()}
        state = replace(state, policies={**policies, **state.policies})
        snapshot = next(iter(group.values())).snapshot
        specs = {model: plan.spec for model, plan in deciding.items()}
        current = {model: plan.current for model, plan in deciding.items()}
        # Each model's batching as its own member's tick read it, else as a caller's did (a
        # caller's tick reads its children's configs too).
        batching = {
            model: batching
            for plan in deciding.values()
            for model, batching in plan.batching.items()
            if model in specs
        }
        for model, plan in deciding.items():
            own = plan.batching.get(model)
            if own is not None:
                batching[model] = own
        live_since = {model: at for model, at in self.live_since.items() if model in specs}
        load_s = {model: s for model, s in self.load_s.items() if model in specs}
        decided = decide_set(specs, current, snapshot, state, now, batching, live_since, load_s)
        self.decisions[key] = decided
        return decided, notes
