"""The controllers the simulator can run, behind one interface, found by name.

A controller sees what a driver sees at each tick of a pod set: every model's spec, the live
counts, one metrics snapshot of the set, and the clock; it returns the count it wants for
each model and keeps its own state between calls. A new controller (an allocator that sizes
the whole set at once, say) is a class with `decide` and an entry in `CONTROLLERS`; then
`python -m loadtests.sim --controller NAME` judges it on every scenario.

`PolicyController` is today's operator: `tritonscale.core.policy.decide` per model, with its
`PolicyState` carried from tick to tick, and the members of a budget claimed and granted
through `tritonscale.control.ledger.BudgetLedger` the way `tritonscale.drivers.tune.Tuner.round`
allocates a round: every member decides and claims, then each is granted and decides again
with its grant, the ones that give instances back first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from tritonscale.control import reconcile
from tritonscale.control.ledger import BudgetLedger
from tritonscale.control.tick import ReconcileState
from tritonscale.core.signals import MetricSnapshot
from tritonscale.core.spec import AutoscalerSpec

NAMESPACE = "sim"  # the namespace of the ledger's budgets
POD = "sim-0"  # the one pod a simulation serves


class Controller(Protocol):
    """Decides every model's count of one pod set at one tick."""

    def decide(
        self,
        specs: Mapping[str, AutoscalerSpec],
        current: Mapping[str, int],
        snapshot: MetricSnapshot,
        now: float,
    ) -> dict[str, int]:
        """model -> desired count; `current` holds the live count of every model."""
        ...


class PolicyController:
    """Today's policy and budget ledger, as the local driver runs them (one round a tick)."""

    def __init__(self) -> None:
        self.states: dict[str, ReconcileState] = {}
        self.ledger = BudgetLedger()
        self.reasons: dict[str, str] = {}  # model -> the reason of its last decision

    def decide(
        self,
        specs: Mapping[str, AutoscalerSpec],
        current: Mapping[str, int],
        snapshot: MetricSnapshot,
        now: float,
    ) -> dict[str, int]:
        plans = {model: self._plan(spec, current, snapshot, now) for model, spec in specs.items()}
        for model, plan in plans.items():
            if plan.spec.budget is not None:
                key = reconcile.budget_key(NAMESPACE, plan.spec)
                self.ledger.claim(key, reconcile.budget_limits(plan.spec), plan.claim(model))
            else:
                self.ledger.forget(NAMESPACE, model)

        def releases_first(model: str) -> int:
            return plans[model].decision.desired_instances - plans[model].current

        desired = {}
        for model in sorted(plans, key=releases_first):
            plan = plans[model]
            decision = plan.decision
            if plan.spec.budget is not None:
                key = reconcile.budget_key(NAMESPACE, plan.spec)
                decision = plan.decide(self.ledger.grant(key, model).grant)
                # The pods run the grant once its load is done (every load succeeds here).
                self.ledger.settle(key, model, decision.desired_instances)
            self.states[model] = ReconcileState(policy=decision.state)
            self.reasons[model] = decision.reason
            desired[model] = decision.desired_instances
        return desired

    def _plan(
        self,
        spec: AutoscalerSpec,
        current: Mapping[str, int],
        snapshot: MetricSnapshot,
        now: float,
    ) -> reconcile.Plan:
        """The first half of a tick as `reconcile.observe` and `planned` build it, from the simulated pod:
        `Plan` is where the driver's claim is made and a grant decided again."""
        state = self.states.get(spec.model, ReconcileState())
        live = current[spec.model]
        return reconcile.Plan(
            spec=spec,
            tick=reconcile._Tick(now=now, state=state, started=0.0),
            endpoints=(),
            live={POD: live},
            current=live,
            children={child: current[child] for child in spec.calls if child in current},
            snapshot=snapshot,
            errors=(),
            notes=(),
            healing=(),
        )


class StaticController:
    """Holds the counts it started with: the baseline every policy must beat."""

    def decide(
        self,
        specs: Mapping[str, AutoscalerSpec],
        current: Mapping[str, int],
        snapshot: MetricSnapshot,
        now: float,
    ) -> dict[str, int]:
        return dict(current)


# Add a controller here: `--controller NAME` makes a fresh one per scenario.
def _allocator() -> Controller:
    # Imported when asked for: the set planner's controller lives in a module of its own.
    from loadtests.sim.allocator_controller import AllocatorController

    return AllocatorController()


CONTROLLERS: dict[str, Callable[[], Controller]] = {
    "policy": PolicyController,
    "static": StaticController,
    "allocator": _allocator,
}


def make(name: str) -> Controller:
    """A fresh controller by its registered name."""
    try:
        return CONTROLLERS[name]()
    except KeyError:
        known = ", ".join(sorted(CONTROLLERS))
        raise ValueError(f"unknown controller {name!r} (known: {known})") from None
