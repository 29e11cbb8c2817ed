"""A latency objective in the simulator (loadtests.sim.latency_objective): the operator's set
planner sizes pipeline_async to p95 <= 50 ms under Poisson arrivals at a steady 250 req/s, in
virtual time; once its counts hold, every 10 s window meets the objective, at the split it
predicted would."""

from __future__ import annotations

from loadtests.sim import latency_objective
from tritonscale.core.spec import LatencyObjective


def test_the_objective_holds_at_a_steady_rate_with_the_predicted_instances() -> None:
    objective = LatencyObjective(quantile=0.95, milliseconds=50.0)
    outcome = latency_objective.run(250.0, objective, seconds=180.0, seed=0)
    judged = outcome.window_quantiles_ms
    assert len(judged) >= 4, f"the counts held for {len(judged)} windows only: {outcome}"
    assert outcome.windows_met_share == 1.0, f"p95 per window: {judged}"
    assert outcome.met is True and outcome.reason == "LatencyObjective"
    assert outcome.predicted_ms is not None and outcome.predicted_ms <= objective.milliseconds
    # What the pod ran is the split the planner chose and predicted.
    assert outcome.counts == outcome.chosen
    # One instance each does not meet it (the windows before the counts held did not), and
    # the split stays within the budget.
    assert sum(outcome.counts.values()) > len(outcome.counts)
    assert sum(outcome.counts.values()) <= latency_objective.BUDGET
