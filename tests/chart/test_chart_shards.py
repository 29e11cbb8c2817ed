"""operator.shards: the operator as a StatefulSet of standalone pods, each acting on its share of
the pod sets (Helm 4 renders; test_chart_matrix shows that Helm 3 renders the same objects, and
test_chart_rejects that both refuse shards with peering)."""

from __future__ import annotations

import re

import click
import pytest

from tests.chart.helm import RELEASE, by_kind, container, one, run_helm, template_args
from tritonscale import cli
from tritonscale.control.pod_sets import Shard
from tritonscale.drivers import kopf_operator

SHARDS_VALUES = "operator-shards-values.yaml"
# The default values generate a random repository key on each render.
FIXED_KEY = "repositoryKey.value=fixed-for-comparison"
COMPONENT = "app.kubernetes.io/component"


def operator_objects(objects: list[dict]) -> list[dict]:
    return [o for o in objects if o["metadata"].get("labels", {}).get(COMPONENT) == "operator"]


def pod_labels(workload: dict) -> dict:
    return workload["spec"]["template"]["metadata"]["labels"]


def env_of(operator: dict) -> dict[str, dict]:
    return {e["name"]: e for e in operator["env"]}


@pytest.mark.parametrize("values_file", ["default-values.yaml", "peering-values.yaml"])
def test_one_shard_is_the_operator_as_it_was_before_shards(render, values_file: str) -> None:
    # operator.shards=null is a release whose values predate the key (`--reuse-values`).
    explicit = render(values_file, sets=(FIXED_KEY, "operator.shards=1")).objects
    unset = render(values_file, sets=(FIXED_KEY, "operator.shards=null")).objects
    assert explicit == unset
    assert by_kind(explicit, "StatefulSet") == []
    operator = container(one(explicit, "Deployment", "-operator"), "operator")
    assert "args" not in operator
    assert "POD_NAME" not in env_of(operator)


def test_shards_are_a_statefulset_of_standalone_pods(render) -> None:
    objects = render(SHARDS_VALUES).objects
    assert [
        o for o in by_kind(objects, "Deployment") if o["metadata"]["name"].endswith("-operator")
    ] == []
    shards = one(objects, "StatefulSet", "-operator")
    spec = shards["spec"]
    assert spec["replicas"] == 3
    assert spec["podManagementPolicy"] == "Parallel"
    assert spec["selector"]["matchLabels"].items() <= pod_labels(shards).items()
    # The governing Service exists in the release and selects every shard.
    service = one(objects, "Service", "-operator")
    assert spec["serviceName"] == service["metadata"]["name"]
    assert service["spec"]["selector"].items() <= pod_labels(shards).items()

    operator = container(shards, "operator")
    assert operator["args"] == ["--total-shards=3", "--shard=$(POD_NAME)"]
    assert env_of(operator)["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    # Standalone: no peering option, object or rule.
    assert not [name for name in env_of(operator) if "PEERING" in name]
    assert by_kind(objects, "KopfPeering") == []


def test_shards_have_the_rbac_of_one_replica(render) -> None:
    def roles(objects: list[dict]) -> list[dict]:
        return [(r["metadata"], r["rules"]) for r in by_kind(operator_objects(objects), "Role")]

    assert roles(render(SHARDS_VALUES).objects) == roles(render().objects)


def test_the_shard_flags_and_environment_parse_as_the_cli_reads_them(
    render, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = render(SHARDS_VALUES, sets=("operator.args={--verbose}",)).objects
    shards = one(objects, "StatefulSet", "-operator")
    operator = container(shards, "operator")
    # The kubelet expands $(POD_NAME) to the pod's name: the StatefulSet's name and its ordinal.
    pod_name = f"{shards['metadata']['name']}-2"
    args = [arg.replace("$(POD_NAME)", pod_name) for arg in operator["args"]]
    for name, entry in env_of(operator).items():
        if name.startswith("TRITONSCALE_OPERATOR_") and "value" in entry:
            monkeypatch.setenv(name, entry["value"])
    command = cli.main.commands["operator"]
    parent = click.Context(cli.main, auto_envvar_prefix="TRITONSCALE")
    context = command.make_context("operator", args, parent=parent)
    assert context.params["verbose"] is True  # the user's own args come after the shard's
    share = kopf_operator.shard_of(context.params["shard"], context.params["total_shards"])
    assert share == Shard(2, 3)


def test_shards_get_the_budget_and_the_spread_of_several_replicas(render) -> None:
    objects = render(SHARDS_VALUES).objects
    shards = one(objects, "StatefulSet", "-operator")
    pdb = one(objects, "PodDisruptionBudget", "-operator")
    # A drain stops one shard (its sets wait for its new pod) at a time.
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels(shards).items()
    anti = shards["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    (preferred,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    assert preferred["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    selector = preferred["podAffinityTerm"]["labelSelector"]["matchLabels"]
    assert selector.items() <= pod_labels(shards).items()


@pytest.mark.parametrize("kind", ["ServiceMonitor", "PodMonitor"])
def test_every_shard_is_scraped_once(render, kind: str) -> None:
    objects = render(
        SHARDS_VALUES, sets=("monitoring.monitor.enabled=true", f"monitoring.monitor.kind={kind}")
    ).objects
    shards = one(objects, "StatefulSet", "-operator")
    monitor = one(objects, kind, "-operator")
    selector = monitor["spec"]["selector"]["matchLabels"]
    if kind == "PodMonitor":
        assert selector.items() <= pod_labels(shards).items()
        return
    # One Service only, or Prometheus would scrape each shard once per Service.
    (service,) = [
        s
        for s in by_kind(objects, "Service")
        if selector.items() <= s["metadata"]["labels"].items()
    ]
    assert service["spec"]["selector"].items() <= pod_labels(shards).items()
    ports = {p["name"] for p in service["spec"]["ports"]}
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= ports


def test_the_longest_release_name_leaves_room_for_the_revision_label(helm4: str) -> None:
    release = "r" * 53  # Helm's own limit
    args = list(template_args(SHARDS_VALUES, sets=(FIXED_KEY,)))
    args[args.index(RELEASE)] = release
    result = run_helm(helm4, *args)
    assert result.returncode == 0, result.stderr
    name = one(result.objects, "StatefulSet", "-operator")["metadata"]["name"]
    # The controller labels each pod controller-revision-hash=<name>-<hash of up to 10
    # characters>: a label value of 63 characters at most.
    assert len(name) <= 52, name
    assert re.match(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", name), name


def test_shards_with_replicas_are_refused_in_one_line_naming_both(helm: str) -> None:
    result = run_helm(helm, *template_args(sets=("operator.shards=3", "operator.replicaCount=2")))
    assert result.returncode != 0
    problems = [line for line in result.stderr.splitlines() if line.startswith("tritonscale: ")]
    assert len(problems) == 1, result.stderr
    assert "operator.shards is 3 and operator.replicaCount is 2" in problems[0]
