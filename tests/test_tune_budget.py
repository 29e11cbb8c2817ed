"""A joint budget on the real server, through `tritonscale tune`'s rounds.

Two copies of the test-only model tests/contention_models/shared_lock (20 ms a request, one
request per instance at a time) share a budget of 5 instances per pod. Each wants 4 under its
load: `busy` has 8 requests in flight, `light` 3. The pods never run more than 5 instances of
the two together, a model held below its need says BudgetExhausted, and the budget's demand
ratio (the HPA's signal) is above 1. (The set planner serves both closed loops' clients in
proportion to what each was served, so its split of the 5 may go either way: 2/3 and 3/2
serve the same 250 req/s here.) No timing assertions: counts, reasons and conditions,
checked on the live server after every round.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.contention import ClosedLoop, contention_triton
from tritonscale.control.operator_metrics import OperatorMetrics
from tritonscale.control.tick import TickResult
from tritonscale.drivers.tune import Tuner, parse_config
from tritonscale.local.triton_server import LocalTriton
from tritonscale.triton.actuator import Actuator

BUSY, LIGHT = "busy", "light"
BUDGET = 5
INTERVAL_S = 2
ROUNDS = 14

SPEC = {
    "minInstances": 1,
    "maxInstances": 4,
    "metricsWindowSeconds": 4,
    "intervalSeconds": INTERVAL_S,
    "budget": {"name": "pods", "instancesPerPod": BUDGET},
    "behavior": {
        "scaleUp": {
            "stabilizationWindowSeconds": 0,
            "policies": [{"type": "Instances", "value": 2, "periodSeconds": INTERVAL_S}],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": 60,
            "policies": [{"type": "Instances", "value": 1, "periodSeconds": 10}],
        },
    },
}


@pytest.fixture(scope="module")
def triton(tmp_path_factory) -> Iterator[LocalTriton]:
    with contention_triton(
        tmp_path_factory.mktemp("budget"), {BUSY: False, LIGHT: False}
    ) as server:
        yield server


async def test_tune_keeps_the_pods_within_the_budget_and_says_what_it_holds_back(
    triton: LocalTriton, tmp_path: Path
) -> None:
    config = parse_config(
        {
            "triton": {"http": [triton.http_url], "metrics": [triton.metrics_url]},
            "policies": [
                {"name": BUSY, "spec": {"model": BUSY, **SPEC}},
                {"name": LIGHT, "spec": {"model": LIGHT, **SPEC}},
            ],
        }
    )
    actuator = Actuator(triton.repository_key)
    endpoint = config.endpoints[0]
    results: dict[str, list[TickResult]] = {BUSY: [], LIGHT: []}
    metrics = OperatorMetrics()
    log_path = tmp_path / "decisions.jsonl"
    live_totals = []
    with log_path.open("w") as log:
        tuner = Tuner(
            config,
            actuator=actuator,
            metrics=metrics,
            decision_log=log,
            echo=lambda line: None,
            heal=False,
            on_tick=lambda name, result: results[name].append(result),
        )
        with ClosedLoop(triton, {BUSY: 8, LIGHT: 3}) as load:
            for _ in range(ROUNDS):
                await tuner.round(config.policies, time.time())
                live = {m: await actuator.live_count(endpoint, m) for m in (BUSY, LIGHT)}
                live_totals.append(sum(live.values()))
                await asyncio.sleep(INTERVAL_S)
        assert not load.errors, load.errors[:3]

    # Never more than the budget on the pod, and all of it used.
    assert max(live_totals) == BUDGET, live_totals
    assert all(r.budget is not None and r.budget.used <= BUDGET for r in results[BUSY]), [
        r.line() for r in results[BUSY] if r.budget is None or r.budget.used > BUDGET
    ]
    final = {name: results[name][-1].current_instances for name in (BUSY, LIGHT)}
    assert min(final.values()) >= 1, final
    # Whoever the budget held below its need says so.
    refused = [
        (r, c)
        for name in (BUSY, LIGHT)
        for r in results[name]
        for c in r.conditions
        if c["type"] == "ScalingLimited"
        and (c["status"], c["reason"]) == ("True", "BudgetExhausted")
    ]
    assert refused, "no tick said BudgetExhausted"
    assert "the budget pods allows" in refused[-1][1]["message"]
    last = results[LIGHT][-1].budget
    assert last is not None and last.exhausted and last.wanted > BUDGET
    assert last.demand_ratio > 1  # the pods are too few: the HPA's signal

    # The decision log and the operator's metrics say it too.
    records = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert any((record.get("budget") or {}).get("exhausted") for record in records)
    assert records[-1]["budget"]["instancesPerPod"] == BUDGET
    labels = {"namespace": "local", "budget": "pods"}
    assert metrics.registry.get_sample_value("tritonscale_budget_exhausted", labels) == 1
    assert metrics.registry.get_sample_value("tritonscale_budget_instances_limit", labels) == 5
    assert metrics.registry.get_sample_value("tritonscale_budget_instances_used", labels) == 5
