"""The InstanceGroupAutoscaler CRD, generated from tritonscale.core.spec, does what the models do.

No API server runs here, so the test does what one would do with an object, in its order:
apply the structural schema's defaults, validate against the openAPIV3Schema (with
jsonschema, after a minimal translation), then evaluate every `x-kubernetes-validations`
rule with a real CEL interpreter (cel-python). The same objects go through
`AutoscalerSpec.from_dict`, and the two must agree: this checks the generator's translation
(charts/tools/crd.py), and that the generated file is current is checked in
tests/chart/test_chart_generated.py.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.chart.helm import load_tool
from tests.test_spec import INVALID, minimal
from tritonscale.core.spec import AutoscalerSpec, InvalidSpec

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
CRD_PATH = ROOT / "charts" / "tritonscale" / "crds" / "instancegroupautoscalers.yaml"
EXAMPLES = sorted((ROOT / "operator" / "examples").glob("*.yaml"))

CRD = yaml.safe_load(CRD_PATH.read_text())
VERSION = CRD["spec"]["versions"][0]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]
CEL = celpy.Environment()


# ---------------------------------------------------------------------------------------
# What the API server would do, done here.


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Structural defaulting, as apiextensions does it: fill absent fields, then descend.

    Descending into a default just filled in is what makes `default: {}` on an object
    bring its fields' defaults with it.
    """
    if isinstance(value, dict):
        for key, sub in schema.get("properties", {}).items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
        for key, item in value.items():
            if key in schema.get("properties", {}):
                apply_defaults(schema["properties"][key], item)
            elif isinstance(schema.get("additionalProperties"), dict):
                apply_defaults(schema["additionalProperties"], item)
    elif isinstance(value, list) and "items" in schema:
        for item in value:
            apply_defaults(schema["items"], item)
    return value


def to_json_schema(schema: Any) -> Any:
    """The few translations jsonschema needs; it ignores the x-kubernetes-* keys by itself.

    - OpenAPI 3.0's boolean exclusiveMinimum/Maximum become JSON Schema's numbers;
    - a `set` list has unique items;
    - an object with properties rejects unknown fields, as `kubectl apply` does with the
      server's strict field validation (the default since Kubernetes 1.27), unless it
      preserves unknown fields.
    """
    if isinstance(schema, list):
        return [to_json_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: to_json_schema(value) for key, value in schema.items()}
    for bound in ("Minimum", "Maximum"):
        if out.get(f"exclusive{bound}") is True:
            out[f"exclusive{bound}"] = out.pop(bound.lower())
    if out.get("x-kubernetes-list-type") == "set":
        out["uniqueItems"] = True
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def as_declared_numbers(schema: dict[str, Any], value: Any) -> Any:
    """The value as CEL sees it on the API server: a `type: number` field is a double even
    where its JSON is an integer (`milliseconds: 100`), so `self.milliseconds > 0.0` holds."""
    if schema.get("type") == "number" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, dict):
        children = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        return {
            key: as_declared_numbers(
                children.get(key, extra if isinstance(extra, dict) else {}), item
            )
            for key, item in value.items()
        }
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [as_declared_numbers(schema["items"], item) for item in value]
    return value


def rules_at(schema: dict[str, Any], value: Any, path: str = "") -> Iterator[tuple[str, dict, Any]]:
    """Every (path, rule, self) that the API server would evaluate on this value."""
    for rule in schema.get("x-kubernetes-validations", []):
        yield path + rule.get("fieldPath", ""), rule, value
    if isinstance(value, dict):
        for key, item in value.items():
            if key in schema.get("properties", {}):
                yield from rules_at(schema["properties"][key], item, f"{path}.{key}")
            elif isinstance(schema.get("additionalProperties"), dict):
                yield from rules_at(schema["additionalProperties"], item, f"{path}.{key}")
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            yield from rules_at(schema["items"], item, f"{path}[{index}]")


def cel_format(template: Any, arguments: Any) -> Any:
    """Kubernetes' CEL strings extension `'...%d...'.format([...])` (%d and %s), which
    cel-python lacks; the CRD's messages use it (a concatenated string(int) is too costly)."""
    values = iter(arguments)
    text = re.sub(r"%[ds]", lambda _match: str(next(values)), str(template))
    return celpy.celtypes.StringType(text)


def evaluate(expression: str, self_value: Any) -> Any:
    program = CEL.program(CEL.compile(expression), functions={"format": cel_format})
    result = program.evaluate({"self": celpy.json_to_cel(self_value)})
    if isinstance(result, celpy.CELEvalError):
        raise result
    return result


def schema_errors(obj: dict[str, Any]) -> list[str]:
    """What the openAPIV3Schema says about this (defaulted) object."""
    validator = jsonschema.Draft202012Validator(to_json_schema(SCHEMA))
    return [
        f"{'.'.join(str(p) for p in error.absolute_path)}: {error.message}"
        for error in validator.iter_errors(obj)
    ]


def crd_errors(obj: dict[str, Any]) -> list[str]:
    """What the API server would say about this object (empty: it is accepted)."""
    obj = apply_defaults(SCHEMA, copy.deepcopy(obj))
    errors = schema_errors(obj)
    if errors:
        return errors  # CEL rules assume the schema's types; the server stops here too
    for path, rule, value in rules_at(SCHEMA, as_declared_numbers(SCHEMA, obj)):
        if not evaluate(rule["rule"], value):
            if "messageExpression" in rule:
                errors.append(f"{path}: {evaluate(rule['messageExpression'], value)}")
            else:
                errors.append(f"{path}: {rule['message']}")
    return errors


def an_object(spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "tritonscale.io/v1alpha1",
        "kind": "InstanceGroupAutoscaler",
        "metadata": {"name": "x", "namespace": "default"},
        "spec": spec,
    }


# ---------------------------------------------------------------------------------------
# The resource's identity.


def test_the_crd_names_the_resource_of_the_contract() -> None:
    assert CRD["apiVersion"] == "apiextensions.k8s.io/v1"
    assert CRD["metadata"]["name"] == "instancegroupautoscalers.tritonscale.io"
    spec = CRD["spec"]
    assert spec["group"] == "tritonscale.io"
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == "InstanceGroupAutoscaler"
    assert spec["names"]["plural"] == "instancegroupautoscalers"
    assert spec["names"]["shortNames"] == ["iga"]
    assert [v["name"] for v in spec["versions"]] == ["v1alpha1"]
    assert VERSION["served"] and VERSION["storage"]
    assert VERSION["subresources"] == {"status": {}}


@pytest.mark.parametrize("kubernetes_version", ["1.29.0", "1.32.0"])
def test_the_crd_is_a_valid_object_for_the_supported_kubernetes(kubernetes_version: str) -> None:
    # Strict: a misspelt key (say `x-kubernetes-validation`) fails instead of being dropped.
    kubernetes_validate.validate(CRD, kubernetes_version, strict=True)


def test_the_printer_columns_show_model_bounds_counts_and_age_from_real_fields() -> None:
    columns = {c["name"]: c for c in VERSION["additionalPrinterColumns"]}
    for name in ("Model", "Min", "Max", "Current", "Desired", "Age"):
        assert name in columns
    for column in columns.values():
        node = SCHEMA
        for part in column["jsonPath"].strip(".").split("."):
            if part == "creationTimestamp":
                break  # metadata is the API server's, not in this schema
            node = node["properties"][part]
        if "type" in node and column["type"] in ("integer", "string"):
            assert node["type"] == column["type"], column["name"]


def test_every_cel_rule_and_message_compiles() -> None:
    count = 0
    stack = [SCHEMA]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for rule in node.get("x-kubernetes-validations", []):
                CEL.compile(rule["rule"])
                if "messageExpression" in rule:
                    CEL.compile(rule["messageExpression"])
                else:
                    assert rule["message"]
                count += 1
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    assert count >= 5


def test_the_spec_schema_is_structural_and_bounds_every_list_map_and_string() -> None:
    # The API server refuses a CRD that is not structural, and a CEL rule whose cost it
    # cannot bound: every list needs maxItems, every map maxProperties, every string maxLength.
    assert load_tool("crd").problems(SCHEMA["properties"]["spec"]) == []


def test_the_bound_check_finds_an_unbounded_list() -> None:
    unbounded = {"type": "object", "properties": {"calls": {"type": "array", "items": {}}}}
    assert load_tool("crd").problems(unbounded) == [
        "spec.calls: a list needs maxItems (CEL cost)",
        "spec.calls[]: no type",
    ]


# ---------------------------------------------------------------------------------------
# Defaults: the API server's structural defaulting and pydantic's give the same spec.


def test_the_crd_and_the_models_default_a_minimal_spec_alike() -> None:
    given = minimal()
    defaulted = apply_defaults(SCHEMA["properties"]["spec"], copy.deepcopy(given))
    assert AutoscalerSpec.from_dict(given).to_dict() == defaulted


def test_the_crd_and_the_models_default_a_partial_behavior_alike() -> None:
    # HPA semantics: a scaleDown with only policies keeps its window and selectPolicy.
    given = minimal(
        behavior={
            "scaleDown": {"policies": [{"type": "Percent", "value": 50, "periodSeconds": 60}]}
        },
        targets={"utilization": 0.5},
    )
    defaulted = apply_defaults(SCHEMA["properties"]["spec"], copy.deepcopy(given))
    assert defaulted["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 300
    assert AutoscalerSpec.from_dict(given).to_dict() == defaulted


# ---------------------------------------------------------------------------------------
# The examples.


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_each_example_is_accepted_by_the_crd_and_by_from_dict_alike(path: Path) -> None:
    obj = yaml.safe_load(path.read_text())
    assert obj["apiVersion"] == "tritonscale.io/v1alpha1"
    assert obj["kind"] == "InstanceGroupAutoscaler"
    assert crd_errors(obj) == []
    defaulted = apply_defaults(SCHEMA["properties"]["spec"], copy.deepcopy(obj["spec"]))
    assert AutoscalerSpec.from_dict(obj["spec"]).to_dict() == defaulted


def test_there_is_an_example_for_each_model_of_the_pipeline() -> None:
    models = {yaml.safe_load(p.read_text())["spec"]["model"] for p in EXAMPLES}
    assert models >= {
        "pipeline_async",
        "pipeline_sync",
        "branch_embed",
        "branch_classify",
        "branch_rank",
    }
    pipeline = next(
        yaml.safe_load(p.read_text())["spec"] for p in EXAMPLES if "pipeline-async" in p.name
    )
    assert pipeline["calls"] == ["branch_embed", "branch_classify", "branch_rank"]


# ---------------------------------------------------------------------------------------
# Invalid objects: both gates refuse them.

# Mistakes that only the operator's from_dict catches, and why; it reports them as the
# condition InvalidSpec. A test below fails when the CRD starts catching one of them.
CRD_GAPS = {
    # Structural schemas cannot constrain map keys, and a CEL `matches` over keys of
    # unbounded length risks the API server's rule-cost limit.
    "a label key has Kubernetes' syntax",
    # JSON has no infinity: the API server never receives one (a YAML policy file can hold it).
    "infinity is not a number here",
}


@pytest.mark.parametrize("case", INVALID, ids=[case.name for case in INVALID])
def test_an_object_from_dict_refuses_is_refused_by_the_crd_too(case: Any) -> None:
    with pytest.raises(InvalidSpec):
        AutoscalerSpec.from_dict(case.spec)
    errors = crd_errors(an_object(case.spec))
    if case.name in CRD_GAPS:
        assert errors == [], "the CRD catches this now: drop it from CRD_GAPS"
    else:
        assert errors, f"the CRD accepts: {case.spec}"


def test_the_crds_min_max_message_is_the_specs() -> None:
    errors = crd_errors(an_object(minimal(minInstances=5, maxInstances=2)))
    # The API server cannot afford to name the numbers (string(int) has no bounded cost);
    # from_dict adds them: spec: minInstances must be <= maxInstances (minInstances is 5, ...).
    assert errors == [".spec: minInstances must be <= maxInstances"]


# The invalid specs that pass the schema and meet a CEL rule: the same rule text runs in
# from_dict (tritonscale.core.rules), so the message is the same too (from_dict may add the
# values of the fields a rule `shows`).
REFUSED_BY_A_RULE = [
    case
    for case in INVALID
    if isinstance(case.spec, dict)
    and case.name not in CRD_GAPS
    and not schema_errors(apply_defaults(SCHEMA, an_object(copy.deepcopy(case.spec))))
]


def test_the_rules_are_met_by_several_invalid_specs() -> None:
    assert len(REFUSED_BY_A_RULE) >= 6, [case.name for case in REFUSED_BY_A_RULE]


@pytest.mark.parametrize("case", REFUSED_BY_A_RULE, ids=[case.name for case in REFUSED_BY_A_RULE])
def test_where_a_cel_rule_refuses_the_api_server_and_from_dict_say_the_same(case: Any) -> None:
    errors = crd_errors(an_object(case.spec))
    assert any(("." + case.message).startswith(error) for error in errors), errors


@pytest.mark.parametrize(
    "spec",
    [
        minimal(),
        minimal(minInstances=8, maxInstances=8),
        minimal(behavior={"scaleUp": {"selectPolicy": "Disabled", "policies": []}}),
        minimal(selector={"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}),
        minimal(tolerance=0, targets={"queueComputeRatio": 0, "utilization": 1}),
        minimal(calls=["branch_rank"], targets={"latency": {"milliseconds": 100}}),
        minimal(targets={"latency": {"quantile": 0.999, "milliseconds": 0.5}}),
        minimal(minInstances=2, budget={"name": "pods", "instancesPerPod": 2}),
        minimal(
            minInstances=3,
            budget={
                "name": "pods",
                "instancesPerPod": 8,
                "gpuMemoryPerPodMiB": 6000,
                "gpuMemoryPerInstanceMiB": 2000,
            },
        ),
    ],
    ids=[
        "minimal",
        "min equal to max",
        "a disabled direction without policies",
        "a selector of expressions only",
        "the edges of the ranges",
        "a latency objective with an integer bound",
        "a latency objective near the edges",
        "a budget of exactly the minimum",
        "a GPU memory budget of exactly the minimum",
    ],
)
def test_edge_cases_that_are_valid_pass_both_gates(spec: dict[str, Any]) -> None:
    AutoscalerSpec.from_dict(spec)
    assert crd_errors(an_object(spec)) == []


def test_status_keeps_the_operators_fields_and_unknown_ones() -> None:
    obj = an_object(minimal())
    obj["status"] = {
        "currentInstances": 2,
        "desiredInstances": 3,
        "observedMetrics": {"busyPerInstance": 0.93},
        "lastDecision": {"direction": "up", "reason": "HighUtilization", "message": "m"},
        "conditions": [{"type": "AbleToScale", "status": "True", "reason": "SucceededRescale"}],
        "policyState": {"recommendations": [{"at": 1.0, "instances": 3}]},
        "kopf": {"progress": {}},
    }
    assert crd_errors(obj) == []
    obj["status"]["lastDecision"]["direction"] = "sideways"
    assert crd_errors(obj)


def test_the_crd_and_the_dataclasses_default_a_budget_alike() -> None:
    given = minimal(budget={"name": "pods", "instancesPerPod": 6})
    defaulted = apply_defaults(SCHEMA["properties"]["spec"], copy.deepcopy(given))
    assert AutoscalerSpec.from_dict(given).to_dict() == defaulted
