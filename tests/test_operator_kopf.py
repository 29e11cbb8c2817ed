"""The Kubernetes driver against kmock (kopf's mock API server) and, end to end, a real Triton.

kopf runs in its own thread and event loop (`running_operator`), exactly as
`tritonscale operator` runs it, with a pre-filled credentials vault pointing at kmock.
Everything else is real: the policy, the actuator, the metrics source, the operator's
metrics and liveness servers, and a tritonserver whose address a kmock Pod carries.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.operator_harness import (
    CONTRACT_METRICS,
    IGA,
    NAMESPACE,
    PODS,
    TRITON_LABELS,
    Emulator,
    autoscaler,
    condition,
    delete_object,
    error_count,
    events_for,
    eventually,
    eventually_async,
    http_get,
    patch_object,
    register_resources,
    running_operator,
    status_of,
    ticks,
    triton_pod,
)
from tests.tooling import require_local_triton
from tritonscale.core.spec import InvalidSpec
from tritonscale.drivers import kopf_operator as kopf_driver
from tritonscale.local.triton_server import LocalTriton

pytestmark = pytest.mark.kmock(cls=Emulator)


@pytest.fixture
def api(kmock: Emulator) -> Emulator:
    return register_resources(kmock)


# ---------------------------------------------------------------------------------------


@pytest.mark.unit
async def test_an_autoscaler_without_ready_pods_gets_status_conditions_and_one_warning(
    api: Emulator,
) -> None:
    spec = {"selector": {"matchLabels": TRITON_LABELS}, "model": "add_sub", "intervalSeconds": 1}
    api.objects[IGA, NAMESPACE, "lonely"] = autoscaler("lonely", spec, generation=3)

    async with running_operator(api) as operator:
        status = await eventually(
            lambda: status_of(api, "lonely").get("conditions") and status_of(api, "lonely"),
            "the operator's first status",
        )
        assert status["pods"] == 0
        assert status["observedGeneration"] == 3
        active = condition(status, "ScalingActive")
        assert active["status"] == "False"
        assert active["reason"] == "NoReadyPods"
        assert "selector" in active["message"]
        assert condition(status, "AbleToScale")["status"] == "False"
        assert condition(status, "ScalingLimited")["status"] == "False"
        assert "lastTransitionTime" in active
        # kopf ran its handlers, so its indexes are full: the readinessProbe passes.
        code, body = await http_get(operator.readiness_url)
        assert (code, json.loads(body)) == (200, {"ready": True, "reason": "synced"})

        # The failure persists over several ticks (intervalSeconds 1): its condition keeps its
        # transition time, and it was announced by one Warning, not one per tick.
        first_transition = active["lastTransitionTime"]
        await eventually_async(lambda: ticks(operator, "lonely"), lambda n: n >= 3, "three ticks")
        later = status_of(api, "lonely")
        assert condition(later, "ScalingActive")["lastTransitionTime"] == first_transition
        warnings = [e for e in events_for(api, "lonely") if e["type"] == "Warning"]
        assert [e["reason"] for e in warnings] == ["NoReadyPods"]
        assert warnings[0]["involvedObject"]["kind"] == "InstanceGroupAutoscaler"

        # Deleting the object stops its timer, releases kopf's finalizer and drops its series
        # from the operator's metrics (a stale timestamp would fire a "not reconciling" alert).
        await delete_object(api, "lonely")
        await eventually(
            lambda: (
                (IGA, NAMESPACE, "lonely") not in api.objects
                or api.objects[IGA, NAMESPACE, "lonely"].deleted
            ),
            "the object to be gone",
        )
        await eventually_async(
            lambda: http_get(operator.metrics_url),
            lambda got: 'autoscaler="lonely"' not in got[1],
            "the deleted autoscaler's series to go",
        )


@pytest.mark.unit
async def test_an_invalid_spec_is_a_condition_and_one_warning_not_a_crash(api: Emulator) -> None:
    spec = {
        "selector": {"matchLabels": TRITON_LABELS},
        "model": "add_sub",
        "minInstances": 5,
        "maxInstances": 2,
    }
    api.objects[IGA, NAMESPACE, "broken"] = autoscaler("broken", spec, generation=1)
    config = kopf_driver.DriverConfig(invalid_spec_recheck_s=0.5)

    async with running_operator(api, config) as operator:
        status = await eventually(
            lambda: status_of(api, "broken").get("conditions") and status_of(api, "broken"),
            "a status for the broken object",
        )
        active = condition(status, "ScalingActive")
        assert (active["status"], active["reason"]) == ("False", "InvalidSpec")
        assert (
            active["message"]
            == "spec: minInstances must be <= maxInstances (minInstances is 5, maxInstances is 2)"
        )
        assert status["observedGeneration"] == 1

        # Looked at again and again (every 0.5 s here), it stays one condition and one event.
        await eventually_async(
            lambda: error_count(operator, "broken", "InvalidSpec"), lambda n: n >= 3, "rechecks"
        )
        warnings = [e for e in events_for(api, "broken") if e["type"] == "Warning"]
        assert [(e["reason"], e["message"]) for e in warnings] == [
            (
                "InvalidSpec",
                "spec: minInstances must be <= maxInstances (minInstances is 5, maxInstances is 2)",
            )
        ]
        assert operator.thread.is_alive()

        # Fixed by the user, the spec is read on the next tick: the InvalidSpec goes away.
        # (Its interval is 1 s: the default, 15 s, would make the next tick 15 s away.)
        await patch_object(
            api,
            "broken",
            {"metadata": {"generation": 2}, "spec": {"minInstances": 1, "intervalSeconds": 1}},
        )
        fixed = await eventually(
            lambda: (
                status_of(api, "broken").get("observedGeneration") == 2 and status_of(api, "broken")
            ),
            "the fixed spec to be observed",
        )
        assert condition(fixed, "ScalingActive")["reason"] == "NoReadyPods"


@pytest.fixture
def add_sub_triton() -> Any:
    """A real tritonserver serving add_sub alone (its instance count is ours to change)."""
    require_local_triton()
    with LocalTriton(
        http_port=0, grpc_port=0, metrics_port=0, models=["add_sub"], exit_timeout_s=2
    ) as server:
        yield server


def live_instances(triton: LocalTriton, model: str) -> int:
    config = requests.get(f"http://{triton.http_url}/v2/models/{model}/config", timeout=5)
    config.raise_for_status()
    return sum(group.get("count", 1) for group in config.json()["instance_group"])


async def test_the_operator_changes_a_live_instance_count_on_a_real_triton(
    api: Emulator, add_sub_triton: LocalTriton
) -> None:
    triton = add_sub_triton
    assert await asyncio.to_thread(live_instances, triton, "add_sub") == 1
    api.objects[PODS, NAMESPACE, "triton-0"] = triton_pod(
        "triton-0", "127.0.0.1", triton.http_port, triton.metrics_port
    )
    # The live count (1) is below minInstances (2): the policy goes to the bound whatever
    # the load, as the HPA does. First as a dry run: decided and reported, not applied.
    spec = {
        "selector": {"matchLabels": TRITON_LABELS},
        "model": "add_sub",
        "minInstances": 2,
        "maxInstances": 3,
        "intervalSeconds": 1,
        "metricsWindowSeconds": 5,
        "dryRun": True,
    }
    api.objects[IGA, NAMESPACE, "add-sub"] = autoscaler("add-sub", spec, generation=1)
    config = kopf_driver.DriverConfig(repository_key=triton.repository_key)

    async with running_operator(api, config) as operator:
        dry = await eventually(
            lambda: status_of(api, "add-sub").get("lastDecision") and status_of(api, "add-sub"),
            "the dry run's decision",
        )
        assert dry["lastDecision"]["reason"] == "DryRun"
        assert (dry["currentInstances"], dry["desiredInstances"], dry["pods"]) == (1, 2, 1)
        assert await asyncio.to_thread(live_instances, triton, "add_sub") == 1

        await patch_object(
            api, "add-sub", {"metadata": {"generation": 2}, "spec": {"dryRun": False}}
        )
        scaled = await eventually(
            lambda: (
                status_of(api, "add-sub").get("currentInstances") == 2 and status_of(api, "add-sub")
            ),
            "the live count of 2 in status",
        )
        assert await asyncio.to_thread(live_instances, triton, "add_sub") == 2
        assert scaled["desiredInstances"] == 2
        assert scaled["observedGeneration"] == 2
        assert "lastScaleTime" in scaled
        assert scaled["policyState"], "the policy's history must be kept in status"
        assert condition(scaled, "AbleToScale")["status"] == "True"

        normal = [e for e in events_for(api, "add-sub") if e["type"] == "Normal"]
        assert [e["reason"] for e in normal] == ["SucceededRescale"]
        assert "add_sub 1 -> 2 instances" in normal[0]["message"]

        # The operator's own metrics, as the contract names them, for this autoscaler.
        _, text = await http_get(operator.metrics_url)
        families = {family.name: family for family in text_string_to_metric_families(text)}
        for name in CONTRACT_METRICS:
            family = families.get(name.removesuffix("_total"))
            assert family is not None, f"{name} is not served"
        labelled = {
            sample.name
            for family in families.values()
            for sample in family.samples
            if sample.labels.get("autoscaler") == "add-sub"
            and sample.labels.get("namespace") == NAMESPACE
            and sample.labels.get("model") == "add_sub"
        }
        assert {
            "tritonscale_desired_instances",
            "tritonscale_current_instances",
            "tritonscale_decisions_total",
            "tritonscale_actuations_total",
            "tritonscale_last_reconcile_timestamp_seconds",
        } <= labelled
        # The ticks' duration is the namespace's, over its autoscalers.
        assert any(
            sample.name == "tritonscale_reconcile_duration_seconds_count"
            and sample.labels == {"namespace": NAMESPACE}
            and sample.value >= 1
            for family in families.values()
            for sample in family.samples
        )

        # Paused, the autoscaler observes and reports, and never acts, not even on its bounds.
        await patch_object(
            api,
            "add-sub",
            {"metadata": {"generation": 3}, "spec": {"paused": True, "minInstances": 3}},
        )
        paused = await eventually(
            lambda: (
                status_of(api, "add-sub").get("observedGeneration") == 3
                and status_of(api, "add-sub")
            ),
            "the paused spec to be observed",
        )
        assert paused["lastDecision"]["reason"] == "Paused"
        assert paused["currentInstances"] == 2
        assert await asyncio.to_thread(live_instances, triton, "add_sub") == 2

        # kopf's liveness endpoint answers, with this operator's probes.
        code, body = await http_get(operator.liveness_url)
        assert code == 200
        assert json.loads(body)["ticks"]["count"] >= 2


@pytest.mark.unit
def test_a_spec_is_checked_once_however_often_it_is_read() -> None:
    spec = {"model": "add_sub", "selector": {"matchLabels": {"app": "triton"}}, "maxInstances": 3}
    first = kopf_driver.parse_spec(spec)
    # The same spec, its keys in another order (as another watch event may carry it).
    assert kopf_driver.parse_spec(dict(reversed(list(spec.items())))) is first
    assert kopf_driver.parse_spec({**spec, "maxInstances": 4}).max_instances == 4
    for _ in range(2):  # an invalid spec raises every time, with its one line
        with pytest.raises(InvalidSpec, match="maxInstance is not a known field"):
            kopf_driver.parse_spec({**spec, "maxInstance": 3})
