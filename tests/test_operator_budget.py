"""The Kubernetes driver's budget ledger against kmock and a real Triton.

Two InstanceGroupAutoscalers on two copies of tests/contention_models/shared_lock share a
budget of 5 instances per pod; each model's load asks for 4. The operator (its default, the set
planner) keeps the pods within the budget, an autoscaler held below its need says
BudgetExhausted (condition, one Warning event, status.budget), and the budget's metrics are
served.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from tests.contention import ClosedLoop, contention_triton
from tests.operator_harness import (
    IGA,
    NAMESPACE,
    PODS,
    TRITON_LABELS,
    Emulator,
    autoscaler,
    condition,
    events_for,
    eventually_async,
    http_get,
    register_resources,
    running_operator,
    status_of,
    ticks,
    triton_pod,
)
from tritonscale.drivers import kopf_operator as kopf_driver
from tritonscale.local.triton_server import LocalTriton

pytestmark = pytest.mark.kmock(cls=Emulator)

BUSY, LIGHT = "busy", "light"
BUDGET = 5
# Ticks of each autoscaler watched after the budget is used (one a second: intervalSeconds 1).
MORE_TICKS = 5


@pytest.fixture(scope="module")
def triton(tmp_path_factory) -> Iterator[LocalTriton]:
    with contention_triton(
        tmp_path_factory.mktemp("budget"), {BUSY: False, LIGHT: False}
    ) as server:
        yield server


@pytest.fixture
def api(kmock: Emulator) -> Emulator:
    return register_resources(kmock)


def live_counts(triton: LocalTriton) -> dict[str, int]:
    counts = {}
    for model in (BUSY, LIGHT):
        config = requests.get(f"http://{triton.http_url}/v2/models/{model}/config", timeout=5)
        config.raise_for_status()
        counts[model] = sum(group.get("count", 1) for group in config.json()["instance_group"])
    return counts


async def test_autoscalers_ticking_apart_share_one_budget(
    api: Emulator, triton: LocalTriton
) -> None:
    api.objects[PODS, NAMESPACE, "triton-0"] = triton_pod(
        "triton-0", "127.0.0.1", triton.http_port, triton.metrics_port
    )
    for model in (BUSY, LIGHT):
        spec: dict[str, Any] = {
            "selector": {"matchLabels": TRITON_LABELS},
            "model": model,
            "maxInstances": 4,
            "intervalSeconds": 1,
            "metricsWindowSeconds": 3,
            "budget": {"name": "pods", "instancesPerPod": BUDGET},
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 120}},
        }
        api.objects[IGA, NAMESPACE, model] = autoscaler(model, spec, generation=1)
    config = kopf_driver.DriverConfig(repository_key=triton.repository_key)

    totals: list[int] = []

    async def refused_status() -> dict[str, Any] | None:
        """The status of an autoscaler the budget refused, once the budget is all used."""
        totals.append(sum((await asyncio.to_thread(live_counts, triton)).values()))
        for model in (BUSY, LIGHT):
            status = status_of(api, model)
            limited = [c for c in status.get("conditions", []) if c["type"] == "ScalingLimited"]
            if (
                limited
                and (limited[0]["status"], limited[0]["reason"]) == ("True", "BudgetExhausted")
                and totals[-1] == BUDGET
            ):
                return status
        return None

    with ClosedLoop(triton, {BUSY: 8, LIGHT: 3}) as load:
        async with running_operator(api, config) as operator:
            refused = await eventually_async(
                refused_status,
                lambda status: status is not None,
                "an autoscaler refused by the budget, with the budget used",
                timeout_s=90,
            )

            async def ticks_of_both() -> tuple[float, ...]:
                """Each autoscaler's ticks so far, the live total sampled on the way."""
                totals.append(sum((await asyncio.to_thread(live_counts, triton)).values()))
                return tuple([await ticks(operator, model) for model in (BUSY, LIGHT)])

            # A few more ticks of both, still within the budget.
            before = await ticks_of_both()
            await eventually_async(
                ticks_of_both,
                lambda now: all(n >= b + MORE_TICKS for n, b in zip(now, before, strict=True)),
                f"{MORE_TICKS} more ticks of both autoscalers",
                timeout_s=60,
            )
            _, text = await http_get(operator.metrics_url)
    assert not load.errors, load.errors[:3]

    assert max(totals) <= BUDGET, totals
    limited = condition(refused, "ScalingLimited")
    assert (limited["status"], limited["reason"]) == ("True", "BudgetExhausted")
    assert "the budget pods allows" in limited["message"]
    assert refused["budget"]["instancesPerPod"] == BUDGET
    assert refused["budget"]["usedInstances"] <= BUDGET
    assert refused["budget"]["exhausted"] is True
    warned = [
        e
        for model in (BUSY, LIGHT)
        for e in events_for(api, model)
        if e["type"] == "Warning" and e["reason"] == "BudgetExhausted"
    ]
    assert warned, "no BudgetExhausted event"
    assert 'tritonscale_budget_exhausted{budget="pods",namespace="ml"} 1.0' in text
    assert 'tritonscale_budget_instances_limit{budget="pods",namespace="ml"} 5.0' in text
