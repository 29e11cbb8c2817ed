"""The operator's set planner as a controller: the decision path of a set tick, without I/O.

At each tick the simulator gives it what a set tick has once it has observed the pods and read
the metrics (tritonscale.control.set_tick): every member's spec, the live counts and one
snapshot of the set. From there it runs what the tick runs:

1. one `Plan` per member (the model's live count, its children's, the snapshot, the
   batching of the live configs, the member's `ReconcileState`);
2. the set's `SetPlanner.planned`, the same planner object across ticks (its windows, the
   verifier's checks and corrections, when each load went live);
3. the budget's `BudgetLedger`: every member claims, then each is granted in the tick's order
   (decreases first, then increases, callees before their callers) and settles what its pods
   then run; `Plan.decide(grant)` cuts the planner's count to the grant, as `finish` does.

What a tick would then load is what this returns; the member's next `ReconcileState` keeps
the decision's behavior state, as `finish` writes it. The runner gives it the pipeline's live
configs (`configure`, as the operator's actuator reads them from Triton) and tells it when each
load ended (`went_live`, as the tick reports a load's end to its planner).
`controllers.CONTROLLERS` names it `allocator`; run it on the scenarios with

    python -m loadtests.sim --controller allocator [--scenarios N] [--family F] [--out PATH]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tritonscale.control.ledger import BudgetLedger
from tritonscale.control.reconcile import Plan, _Tick, budget_key, budget_limits
from tritonscale.control.set_planner import SetPlanner
from tritonscale.control.set_tick import call_depth
from tritonscale.control.tick import ReconcileState
from tritonscale.core.pipeline_model import Batching
from tritonscale.core.signals import MetricSnapshot
from tritonscale.core.spec import AutoscalerSpec
from tritonscale.triton.endpoints import Endpoint

NAMESPACE = "sim"
POD = Endpoint("sim-0", "sim-0:8000")  # the one pod every model of the simulation runs on


class AllocatorController:
    """Every model of the set decided together, as the operator's set tick decides them."""

    def __init__(self) -> None:
        self.planner = SetPlanner(NAMESPACE)
        self.ledger = BudgetLedger()
        self.states: dict[str, ReconcileState] = {}  # member -> what it carries to its next tick
        self.reasons: dict[str, str] = {}  # model -> the reason of its last decision
        self.messages: dict[str, str] = {}  # model -> the message of its last decision
        self.batching: dict[str, Batching] = {}  # model -> its batching, from its config

    def went_live(self, model: str, at: float) -> None:
        """The load of a new count of `model` ended at `at` (the runner's clock)."""
        self.planner.went_live(model, at)

    def configure(self, configs: Mapping[str, Mapping[str, Any]]) -> None:
        """The live configs of the set's models (Triton's JSON); one that cannot be read is
        left out, and its model is taken at today's batch."""
        self.batching = {
            model: batching
            for model, config in configs.items()
            if (batching := Batching.of_config(config)) is not None
        }

    def decide(
        self,
        specs: Mapping[str, AutoscalerSpec],
        current: Mapping[str, int],
        snapshot: MetricSnapshot,
        now: float,
    ) -> dict[str, int]:
        # Members are named after their models, one autoscaler per model as the specs give.
        plans = {model: self._plan(spec, current, snapshot, now) for model, spec in specs.items()}
        plans = self.planner.planned(plans, now)
        decisions = {name: plan.decision for name, plan in plans.items()}
        budgeted = [name for name, plan in plans.items() if plan.spec.budget is not None]
        for name in budgeted:
            plan = plans[name]
            key = budget_key(NAMESPACE, plan.spec)
            self.ledger.claim(key, budget_limits(plan.spec), plan.claim(name))
        depth = call_depth({name: plan.spec for name, plan in plans.items()})

        def order(name: str) -> tuple[bool, int, int, str]:
            # tick_set's order: what decreases release is there for the increases after them.
            change = decisions[name].desired_instances - plans[name].current
            return change > 0, depth[name] if change > 0 else 0, change, name

        for name in sorted(budgeted, key=order):
            plan = plans[name]
            key = budget_key(NAMESPACE, plan.spec)
            decisions[name] = plan.decide(self.ledger.grant(key, name).grant)
            # The tick's load has ended when it settles (the actuator waits for it).
            self.ledger.settle(key, name, decisions[name].desired_instances)
        for name, decision in decisions.items():
            previous = self.states.get(name, ReconcileState())
            self.states[name] = ReconcileState(
                policy=decision.state,
                backoff=previous.backoff,
                last_scale_time=now if decision.changes else previous.last_scale_time,
            )
        self.reasons = {plans[n].spec.model: d.reason for n, d in decisions.items()}
        self.messages = {plans[n].spec.model: d.message for n, d in decisions.items()}
        return {plans[n].spec.model: d.desired_instances for n, d in decisions.items()}

    def _plan(
        self,
        spec: AutoscalerSpec,
        current: Mapping[str, int],
        snapshot: MetricSnapshot,
        now: float,
    ) -> Plan:
        """What `observe` and the metrics read make of one member on the simulated pod."""
        state = self.states.get(spec.model, ReconcileState())
        return Plan(
            spec=spec,
            # The tick's own wall clock times only its report (duration_s): none here.
            tick=_Tick(now=now, state=state, started=0.0),
            endpoints=(POD,),
            live={POD.name: current[spec.model]},
            current=current[spec.model],
            children={child: current[child] for child in spec.calls if child in current},
            snapshot=snapshot,
            errors=(),
            notes=(),
            healing=(),
            batching={
                model: self.batching[model]
                for model in (spec.model, *spec.calls)
                if model in self.batching
            },
        )
