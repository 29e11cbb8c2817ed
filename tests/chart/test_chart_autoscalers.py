"""The InstanceGroupAutoscaler objects the chart renders, checked against our own CRD.

kubernetes-validate knows only Kubernetes' kinds, so the chart's IGA objects (and the
examples under operator/examples/) are validated here with jsonschema against the CRD's
openAPIV3Schema, and checked for fields the API server would silently prune.
"""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.chart.helm import CHART, REPO_ROOT, by_kind, one

CRD_PATH = CHART / "crds" / "instancegroupautoscalers.yaml"
EXAMPLES = sorted((REPO_ROOT / "operator" / "examples").glob("*.yaml"))


@pytest.fixture(scope="module")
def crd_schema() -> dict:
    crd = yaml.safe_load(CRD_PATH.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    return version["schema"]["openAPIV3Schema"]


def pruned_fields(obj: object, schema: dict, path: str = "") -> list[str]:
    """Fields the API server would drop because the structural schema does not declare them."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    found = []
    if isinstance(obj, dict) and schema.get("type") == "object":
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, value in obj.items():
            if key in properties:
                found += pruned_fields(value, properties[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                found += pruned_fields(value, extra, f"{path}.{key}")
            elif path != ".metadata" and not extra:
                found.append(f"{path}.{key}")
    elif isinstance(obj, list) and "items" in schema:
        for index, item in enumerate(obj):
            found += pruned_fields(item, schema["items"], f"{path}[{index}]")
    return found


def check_against_crd(obj: dict, schema: dict) -> None:
    assert (obj["apiVersion"], obj["kind"]) == (
        "tritonscale.io/v1alpha1",
        "InstanceGroupAutoscaler",
    )
    # OpenAPI v3.0 schemas follow draft 4 (exclusiveMinimum is a boolean there).
    jsonschema.Draft4Validator(schema).validate(obj)
    assert pruned_fields(obj, schema) == []


@pytest.mark.parametrize(
    "values_file",
    ["default-values.yaml", "peering-values.yaml", "cpu-only-values.yaml", "budget-values.yaml"],
)
def test_rendered_autoscalers_are_valid_for_the_crd(
    render, crd_schema: dict, values_file: str
) -> None:
    autoscalers = by_kind(render(values_file).objects, "InstanceGroupAutoscaler")
    assert autoscalers
    for obj in autoscalers:
        check_against_crd(obj, crd_schema)


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_operator_examples_are_valid_for_the_crd(crd_schema: dict, example: Path) -> None:
    for obj in yaml.safe_load_all(example.read_text()):
        if obj:
            check_against_crd(obj, crd_schema)


def test_the_crd_rejects_what_the_chart_must_never_render(crd_schema: dict) -> None:
    """A counterfactual: the CRD check above can fail."""
    bad = {
        "apiVersion": "tritonscale.io/v1alpha1",
        "kind": "InstanceGroupAutoscaler",
        "metadata": {"name": "x"},
        "spec": {"model": "m", "selector": {}, "minInstances": 0},
    }
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(crd_schema).validate(bad)
    assert pruned_fields({"spec": {"model": "m", "minInstance": 1}}, crd_schema) == [
        ".spec.minInstance"
    ]


def test_default_autoscalers_tune_the_pipeline_and_its_branches(render) -> None:
    objects = render().objects
    specs = {o["spec"]["model"]: o["spec"] for o in by_kind(objects, "InstanceGroupAutoscaler")}
    assert sorted(specs) == ["branch_classify", "branch_embed", "branch_rank", "pipeline_async"]
    assert specs["pipeline_async"]["calls"] == ["branch_embed", "branch_classify", "branch_rank"]
    assert specs["pipeline_async"]["maxInstances"] == 4
    assert specs["branch_embed"]["maxInstances"] == 8
    pod_labels = one(objects, "Deployment", "-triton")["spec"]["template"]["metadata"]["labels"]
    for spec in specs.values():
        assert spec["selector"]["matchLabels"].items() <= pod_labels.items()
        assert spec["selector"]["matchLabels"]["app.kubernetes.io/component"] == "triton"


def test_per_model_values_override_the_defaults_key_by_key(render) -> None:
    specs = {
        o["spec"]["model"]: o["spec"]
        for o in by_kind(render("peering-values.yaml").objects, "InstanceGroupAutoscaler")
    }
    assert "branch_rank" not in specs  # enabled: false
    assert specs["branch_embed"]["maxInstances"] == 12 and specs["branch_embed"]["dryRun"] is True
    assert specs["branch_embed"]["targets"]["utilization"] == 0.7  # untouched defaults stay
    deep = {
        o["spec"]["model"]: o["spec"]
        for o in by_kind(
            render(
                extra=("--set-json", 'autoscalers.models.branch_embed.targets={"utilization": 0.5}')
            ).objects,
            "InstanceGroupAutoscaler",
        )
    }
    assert deep["branch_embed"]["targets"]["utilization"] == 0.5
    assert deep["branch_embed"]["targets"]["queueComputeRatio"] == 0.5


def test_a_latency_objective_goes_on_the_root_alone(render, crd_schema: dict) -> None:
    objective = '{"quantile": 0.99, "milliseconds": 150}'
    objects = by_kind(
        render(
            extra=("--set-json", f"autoscalers.models.pipeline_async.targets.latency={objective}")
        ).objects,
        "InstanceGroupAutoscaler",
    )
    specs = {o["spec"]["model"]: o["spec"] for o in objects}
    assert specs["pipeline_async"]["targets"]["latency"] == {"quantile": 0.99, "milliseconds": 150}
    assert specs["pipeline_async"]["targets"]["utilization"] == 0.7  # the defaults stay
    for model in ("branch_embed", "branch_classify", "branch_rank"):
        assert "latency" not in specs[model]["targets"]
    for obj in objects:
        check_against_crd(obj, crd_schema)


def test_autoscalers_can_be_left_out(render) -> None:
    assert (
        by_kind(render(sets=("autoscalers.enabled=false",)).objects, "InstanceGroupAutoscaler")
        == []
    )


def test_no_budget_is_rendered_by_default(render) -> None:
    for obj in by_kind(render().objects, "InstanceGroupAutoscaler"):
        assert "budget" not in obj["spec"]


def test_a_budget_joins_every_autoscaler_with_its_models_gpu_memory(render) -> None:
    specs = {
        o["spec"]["model"]: o["spec"]
        for o in by_kind(render("budget-values.yaml").objects, "InstanceGroupAutoscaler")
    }
    assert {model: spec["budget"] for model, spec in specs.items()} == {
        model: {
            "name": "triton-gpu",
            "instancesPerPod": 10,
            "gpuMemoryPerPodMiB": 30000,
            "gpuMemoryPerInstanceMiB": memory,
        }
        for model, memory in [
            ("pipeline_async", 0),
            ("branch_embed", 4000),
            ("branch_classify", 0),
            ("branch_rank", 2000),
        ]
    }
