"""AutoscalerSpec.from_dict / to_dict, and the label-selector helpers the drivers use.

The CRD is generated from the same models (tests/test_crd.py holds what the API server
would say); here: Python's defaults and its one-line messages.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import pytest

from tritonscale.core.selectors import selector_matches, selector_to_string
from tritonscale.core.spec import (
    AutoscalerSpec,
    BudgetSpec,
    InvalidSpec,
    LabelSelector,
    LatencyObjective,
    ScalingPolicy,
    latency_objectives_off_root,
)

pytestmark = pytest.mark.unit

SELECTOR = {"matchLabels": {"app.kubernetes.io/component": "triton"}}


def policy(kind: str, value: int, period_seconds: int) -> ScalingPolicy:
    return ScalingPolicy(type=kind, value=value, periodSeconds=period_seconds)


def minimal(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"selector": copy.deepcopy(SELECTOR), "model": "pipeline_async"}
    spec.update(overrides)
    return spec


class TestDefaults:
    def test_a_minimal_spec_takes_the_contract_defaults(self) -> None:
        spec = AutoscalerSpec.from_dict(minimal())
        assert (spec.min_instances, spec.max_instances) == (1, 8)
        assert spec.calls == ()
        assert spec.instance_kind == ""
        assert spec.targets.utilization == 0.7
        assert spec.targets.queue_compute_ratio == 0.5
        assert spec.targets.pending_per_instance == 2.0
        assert spec.targets.gpu_utilization_ceiling == 0.9
        assert spec.targets.gpu_memory_ceiling == 0.9
        assert spec.tolerance == 0.1
        up, down = spec.behavior.scale_up, spec.behavior.scale_down
        assert (up.stabilization_window_seconds, up.select_policy) == (0, "Max")
        assert up.policies == (policy("Instances", 4, 15), policy("Percent", 100, 15))
        assert (down.stabilization_window_seconds, down.select_policy) == (300, "Max")
        assert down.policies == (policy("Instances", 1, 60),)
        assert (spec.metrics_window_seconds, spec.interval_seconds) == (60, 15)
        assert (spec.paused, spec.dry_run) == (False, False)

    def test_a_partial_behavior_keeps_the_other_defaults_as_the_hpa_does(self) -> None:
        spec = AutoscalerSpec.from_dict(
            minimal(
                behavior={
                    "scaleDown": {
                        "policies": [{"type": "Percent", "value": 50, "periodSeconds": 30}]
                    }
                }
            )
        )
        # Had the policies replaced the whole block, the window would have become 0.
        assert spec.behavior.scale_down.stabilization_window_seconds == 300
        assert spec.behavior.scale_down.policies == (policy("Percent", 50, 30),)
        assert spec.behavior.scale_up == AutoscalerSpec.from_dict(minimal()).behavior.scale_up

    def test_to_dict_reads_back_to_the_same_spec(self) -> None:
        spec = AutoscalerSpec.from_dict(
            minimal(
                calls=["branch_embed"],
                minInstances=2,
                maxInstances=5,
                dryRun=True,
                targets={"utilization": 0.5},
            )
        )
        assert AutoscalerSpec.from_dict(spec.to_dict()) == spec
        assert spec.to_dict()["targets"]["utilization"] == 0.5

    def test_the_spec_does_not_share_the_callers_selector(self) -> None:
        given = minimal()
        spec = AutoscalerSpec.from_dict(given)
        given["selector"]["matchLabels"]["extra"] = "x"
        assert "extra" not in spec.selector.match_labels
        assert spec == AutoscalerSpec.from_dict(minimal())

    def test_a_null_is_left_out_as_the_api_server_prunes_it(self) -> None:
        # Kubernetes drops null values of non-nullable fields before it applies defaults.
        spec = AutoscalerSpec.from_dict(minimal(maxInstances=None, targets={"utilization": None}))
        assert spec == AutoscalerSpec.from_dict(minimal())
        with pytest.raises(InvalidSpec, match=r"^spec\.model is required$"):
            AutoscalerSpec.from_dict(minimal(model=None))

    def test_the_spec_is_frozen(self) -> None:
        spec = AutoscalerSpec.from_dict(minimal())
        with pytest.raises(ValueError, match="frozen"):
            spec.max_instances = 3  # type: ignore[misc]


def known_keys(*path: str) -> str:
    """The keys of the full spec at `path`, sorted, as the message lists them."""
    # With its optional fields set, so that the full spec shows them.
    node = AutoscalerSpec.from_dict(
        minimal(
            budget={"name": "pods", "instancesPerPod": 1},
            targets={"latency": {"milliseconds": 100}},
        )
    ).to_dict()
    for key in path:
        node = node[key]
    return ", ".join(sorted(node))


@dataclass(frozen=True)
class Invalid:
    name: str
    spec: dict[str, Any]
    message: str  # the whole message, one line


INVALID = [
    Invalid(
        "a latency quantile of 1 is no quantile",
        minimal(targets={"latency": {"quantile": 1.0, "milliseconds": 100}}),
        "spec.targets.latency.quantile: must be above 0 and below 1 (quantile is 1.0)",
    ),
    Invalid(
        "a latency quantile of 0 is no quantile",
        minimal(targets={"latency": {"quantile": 0.0, "milliseconds": 100}}),
        "spec.targets.latency.quantile: must be above 0 and below 1 (quantile is 0.0)",
    ),
    Invalid(
        "a latency bound of 0 ms cannot be met",
        minimal(targets={"latency": {"milliseconds": 0.0}}),
        "spec.targets.latency.milliseconds: must be above 0 (milliseconds is 0.0)",
    ),
    Invalid(
        "a negative latency bound",
        minimal(targets={"latency": {"quantile": 0.99, "milliseconds": -5.0}}),
        "spec.targets.latency.milliseconds: must be above 0 (milliseconds is -5.0)",
    ),
    Invalid(
        "a latency objective needs its bound",
        minimal(targets={"latency": {"quantile": 0.99}}),
        "spec.targets.latency.milliseconds is required",
    ),
    Invalid(
        "a latency bound is a number",
        minimal(targets={"latency": {"milliseconds": "100ms"}}),
        "spec.targets.latency.milliseconds must be a number, got '100ms'",
    ),
    Invalid(
        "min above max names both values",
        minimal(minInstances=5, maxInstances=2),
        "spec: minInstances must be <= maxInstances (minInstances is 5, maxInstances is 2)",
    ),
    Invalid(
        "min above the default max names the default",
        minimal(minInstances=9),
        "spec: minInstances must be <= maxInstances (minInstances is 9, maxInstances is 8)",
    ),
    Invalid(
        "an unknown key is named",
        minimal(maxInstance=3),
        f"spec.maxInstance is not a known field (known: {known_keys()})",
    ),
    Invalid(
        "an unknown nested key is named by its path",
        minimal(targets={"utilisation": 0.5}),
        f"spec.targets.utilisation is not a known field (known: {known_keys('targets')})",
    ),
    Invalid("the model is required", {"selector": SELECTOR}, "spec.model is required"),
    Invalid("the selector is required", {"model": "m"}, "spec.selector is required"),
    Invalid(
        "an empty selector would select every pod",
        minimal(selector={}),
        "spec.selector: must hold matchLabels or matchExpressions (an empty selector selects every pod)",
    ),
    Invalid(
        "zero instances is below the minimum",
        minimal(minInstances=0),
        "spec.minInstances must be >= 1, got 0",
    ),
    Invalid(
        "a boolean is not an integer",
        minimal(maxInstances=True),
        "spec.maxInstances must be an integer, got True",
    ),
    Invalid(
        "a string is not a number",
        minimal(tolerance="0.1"),
        "spec.tolerance must be a number, got '0.1'",
    ),
    Invalid(
        "a tolerance of 1 would never scale down",
        minimal(tolerance=1.0),
        "spec.tolerance must be < 1, got 1.0",
    ),
    Invalid(
        "a utilization target above 1 cannot be reached",
        minimal(targets={"utilization": 1.5}),
        "spec.targets.utilization must be <= 1, got 1.5",
    ),
    Invalid(
        "a zero pending target would divide by zero",
        minimal(targets={"pendingPerInstance": 0}),
        "spec.targets.pendingPerInstance must be > 0, got 0",
    ),
    Invalid(
        "the instance kind is an enum",
        minimal(instanceKind="GPU"),
        "spec.instanceKind must be one of '', 'KIND_CPU' or 'KIND_GPU', got 'GPU'",
    ),
    Invalid(
        "a model cannot call itself",
        minimal(calls=["pipeline_async"]),
        "spec.calls: must not name the model itself (pipeline_async)",
    ),
    Invalid("a child is listed once", minimal(calls=["a", "a"]), "spec.calls lists 'a' twice"),
    Invalid(
        "an empty model name is no name",
        minimal(model=""),
        "spec.model must not be empty",
    ),
    Invalid(
        "a list is bounded (the CEL rules' cost is)",
        minimal(calls=[f"branch_{i}" for i in range(33)]),
        "spec.calls may hold at most 32 items, got 33",
    ),
    Invalid(
        "infinity is not a number here",
        minimal(targets={"pendingPerInstance": float("inf")}),
        "spec.targets.pendingPerInstance must be a number, got inf",
    ),
    Invalid(
        "calls is a list, not one name",
        minimal(calls="branch_embed"),
        "spec.calls must be a list, got a string",
    ),
    Invalid(
        "selectPolicy is an enum",
        minimal(behavior={"scaleUp": {"selectPolicy": "Maximum"}}),
        "spec.behavior.scaleUp.selectPolicy must be one of 'Max', 'Min' or 'Disabled', got 'Maximum'",
    ),
    Invalid(
        "a policy type is an enum",
        minimal(
            behavior={"scaleUp": {"policies": [{"type": "Pods", "value": 1, "periodSeconds": 15}]}}
        ),
        "spec.behavior.scaleUp.policies[0].type must be one of 'Instances' or 'Percent', got 'Pods'",
    ),
    Invalid(
        "a policy needs a period",
        minimal(behavior={"scaleDown": {"policies": [{"type": "Instances", "value": 1}]}}),
        "spec.behavior.scaleDown.policies[0].periodSeconds is required",
    ),
    Invalid(
        "a period is at most 30 minutes, as in the HPA",
        minimal(
            behavior={
                "scaleDown": {
                    "policies": [{"type": "Instances", "value": 1, "periodSeconds": 1801}]
                }
            }
        ),
        "spec.behavior.scaleDown.policies[0].periodSeconds must be <= 1800, got 1801",
    ),
    Invalid(
        "a window is at most an hour, as in the HPA",
        minimal(behavior={"scaleDown": {"stabilizationWindowSeconds": 3601}}),
        "spec.behavior.scaleDown.stabilizationWindowSeconds must be <= 3600, got 3601",
    ),
    Invalid(
        "no policies needs selectPolicy Disabled",
        minimal(behavior={"scaleUp": {"policies": []}}),
        "spec.behavior.scaleUp: policies must hold at least one policy unless selectPolicy is "
        "Disabled (it is Max)",
    ),
    Invalid(
        "In needs values",
        minimal(selector={"matchExpressions": [{"key": "tier", "operator": "In"}]}),
        "spec.selector.matchExpressions[0]: values must not be empty when operator is In",
    ),
    Invalid(
        "Exists takes no values",
        minimal(
            selector={"matchExpressions": [{"key": "tier", "operator": "Exists", "values": ["a"]}]}
        ),
        "spec.selector.matchExpressions[0]: values must be empty when operator is Exists",
    ),
    Invalid(
        "a label key has Kubernetes' syntax",
        minimal(selector={"matchLabels": {"bad key": "x"}}),
        "spec.selector.matchLabels.bad key must be a label key like 'app.kubernetes.io/name', got 'bad key'",
    ),
    Invalid(
        "a label value has Kubernetes' syntax",
        minimal(selector={"matchLabels": {"app": "-x"}}),
        "spec.selector.matchLabels.app must be a label value, got '-x'",
    ),
    Invalid("the spec is a mapping", ["model"], "spec must be a mapping, got a list"),
    Invalid(
        "a budget names itself",
        minimal(budget={"instancesPerPod": 4}),
        "spec.budget.name is required",
    ),
    Invalid(
        "a budget's name is a DNS label",
        minimal(budget={"name": "Triton_Pods", "instancesPerPod": 4}),
        "spec.budget.name must be a DNS label (lower-case letters, digits and '-'), "
        "got 'Triton_Pods'",
    ),
    Invalid(
        "a budget holds at least one instance",
        minimal(budget={"name": "pods", "instancesPerPod": 0}),
        "spec.budget.instancesPerPod must be >= 1, got 0",
    ),
    Invalid(
        "a budget too small for the model's minimum names both values",
        minimal(minInstances=3, budget={"name": "pods", "instancesPerPod": 2}),
        "spec.budget.instancesPerPod: minInstances must be <= budget.instancesPerPod "
        "(minInstances is 3, budget.instancesPerPod is 2)",
    ),
    Invalid(
        "a GPU memory budget too small for the model's minimum names both values",
        minimal(
            minInstances=3,
            budget={
                "name": "pods",
                "instancesPerPod": 8,
                "gpuMemoryPerPodMiB": 5000,
                "gpuMemoryPerInstanceMiB": 2000,
            },
        ),
        "spec.budget.gpuMemoryPerPodMiB: minInstances x budget.gpuMemoryPerInstanceMiB must be <= "
        "budget.gpuMemoryPerPodMiB (minInstances is 3, budget.gpuMemoryPerInstanceMiB is 2000, "
        "budget.gpuMemoryPerPodMiB is 5000)",
    ),
    Invalid(
        "an unknown budget key is named by its path",
        minimal(budget={"name": "pods", "instancesPerPod": 4, "instances": 4}),
        "spec.budget.instances is not a known field (known: gpuMemoryPerInstanceMiB, "
        "gpuMemoryPerPodMiB, instancesPerPod, name)",
    ),
]


class TestLatencyObjective:
    def test_none_by_default_and_absent_from_the_full_form(self) -> None:
        # Existing specs read and write back exactly as before.
        spec = AutoscalerSpec.from_dict(minimal())
        assert spec.targets.latency is None
        assert "latency" not in spec.to_dict()["targets"]

    def test_the_quantile_defaults_to_p95_and_an_integer_bound_reads_as_a_number(self) -> None:
        spec = AutoscalerSpec.from_dict(minimal(targets={"latency": {"milliseconds": 100}}))
        assert spec.targets.latency == LatencyObjective(quantile=0.95, milliseconds=100.0)
        assert spec.targets.utilization == 0.7  # the other targets keep their defaults
        assert spec.to_dict()["targets"]["latency"] == {"quantile": 0.95, "milliseconds": 100.0}
        assert AutoscalerSpec.from_dict(spec.to_dict()) == spec

    def test_only_a_root_may_carry_one(self) -> None:
        root = AutoscalerSpec.from_dict(
            minimal(calls=["branch_rank"], targets={"latency": {"milliseconds": 100}})
        )
        child = AutoscalerSpec.from_dict(minimal(model="branch_rank"))
        assert latency_objectives_off_root([root, child]) == {}
        # A single model calls nothing and is called by nothing: its own root.
        assert latency_objectives_off_root([root.model_copy(update={"calls": ()})]) == {}
        on_child = AutoscalerSpec.from_dict(
            minimal(model="branch_rank", targets={"latency": {"milliseconds": 10}})
        )
        assert latency_objectives_off_root([root, on_child]) == {"branch_rank": "pipeline_async"}


class TestBudget:
    def test_no_budget_by_default(self) -> None:
        spec = AutoscalerSpec.from_dict(minimal())
        assert spec.budget is None
        assert "budget" not in spec.to_dict()

    def test_a_budget_reads_with_its_defaults_and_back(self) -> None:
        spec = AutoscalerSpec.from_dict(minimal(budget={"name": "pods", "instancesPerPod": 7}))
        assert spec.budget == BudgetSpec(name="pods", instancesPerPod=7)
        assert spec.to_dict()["budget"] == {
            "name": "pods",
            "instancesPerPod": 7,
            "gpuMemoryPerPodMiB": 0,
            "gpuMemoryPerInstanceMiB": 0,
        }
        assert AutoscalerSpec.from_dict(spec.to_dict()) == spec

    def test_a_model_without_gpu_memory_fits_any_gpu_budget(self) -> None:
        budget = {"name": "pods", "instancesPerPod": 4, "gpuMemoryPerPodMiB": 100}
        assert AutoscalerSpec.from_dict(minimal(minInstances=4, budget=budget)).budget


@pytest.mark.parametrize("case", INVALID, ids=[case.name for case in INVALID])
def test_an_invalid_spec_is_one_clear_line(case: Invalid) -> None:
    with pytest.raises(InvalidSpec) as raised:
        AutoscalerSpec.from_dict(case.spec)
    assert str(raised.value) == case.message
    assert "\n" not in str(raised.value)
    assert isinstance(raised.value, ValueError)


def test_a_key_that_would_break_the_line_is_quoted() -> None:
    with pytest.raises(InvalidSpec) as raised:
        AutoscalerSpec.from_dict(minimal(**{"max\nInstances": 3}))
    assert str(raised.value).startswith("spec.'max\\nInstances' is not a known field")


def test_the_path_prefix_names_where_the_spec_came_from() -> None:
    # The local driver reads a list of policies from a file and names them so.
    with pytest.raises(
        InvalidSpec,
        match=r"^policies\[2\]: minInstances must be <= maxInstances \(minInstances is 3, ",
    ):
        AutoscalerSpec.from_dict(minimal(minInstances=3, maxInstances=2), path="policies[2]")


class TestLabelSelector:
    @dataclass(frozen=True)
    class Case:
        name: str
        selector: dict[str, Any]
        labels: dict[str, str]
        matches: bool

    LABELS = {"app": "triton", "tier": "gpu"}
    CASES = [
        Case("matchLabels equal", {"matchLabels": {"app": "triton"}}, LABELS, True),
        Case("matchLabels differ", {"matchLabels": {"app": "locust"}}, LABELS, False),
        Case("matchLabels key absent", {"matchLabels": {"zone": "a"}}, LABELS, False),
        Case(
            "In a listed value",
            {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["cpu", "gpu"]}]},
            LABELS,
            True,
        ),
        Case(
            "In an unlisted value",
            {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["cpu"]}]},
            LABELS,
            False,
        ),
        Case(
            "In with the key absent",
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
            LABELS,
            False,
        ),
        Case(
            "NotIn a listed value",
            {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gpu"]}]},
            LABELS,
            False,
        ),
        Case(
            "NotIn an unlisted value",
            {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["cpu"]}]},
            LABELS,
            True,
        ),
        # Kubernetes' semantics: a pod without the key is not in the excluded set.
        Case(
            "NotIn with the key absent",
            {"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["a"]}]},
            LABELS,
            True,
        ),
        Case(
            "Exists present",
            {"matchExpressions": [{"key": "tier", "operator": "Exists"}]},
            LABELS,
            True,
        ),
        Case(
            "Exists absent",
            {"matchExpressions": [{"key": "zone", "operator": "Exists"}]},
            LABELS,
            False,
        ),
        Case(
            "DoesNotExist absent",
            {"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]},
            LABELS,
            True,
        ),
        Case(
            "DoesNotExist present",
            {"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]},
            LABELS,
            False,
        ),
        Case(
            "all requirements are ANDed",
            {
                "matchLabels": {"app": "triton"},
                "matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}],
            },
            LABELS,
            False,
        ),
        Case("an empty selector selects every pod", {}, {}, True),
    ]

    @pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
    def test_selector_matches(self, case: Case) -> None:
        selector = LabelSelector.from_dict(case.selector, path="selector")
        assert selector_matches(selector, case.labels) is case.matches

    def test_the_string_form_is_the_kubernetes_query_syntax_sorted_by_key(self) -> None:
        selector = {
            "matchLabels": {
                "app.kubernetes.io/name": "tritonscale",
                "app.kubernetes.io/component": "triton",
            },
            "matchExpressions": [
                {"key": "tier", "operator": "NotIn", "values": ["gpu", "canary"]},
                {"key": "zone", "operator": "In", "values": ["b", "a"]},
                {"key": "gpu", "operator": "Exists"},
                {"key": "draining", "operator": "DoesNotExist"},
            ],
        }
        assert selector_to_string(LabelSelector.from_dict(selector, path="selector")) == (
            "app.kubernetes.io/component=triton,app.kubernetes.io/name=tritonscale,"
            "!draining,gpu,tier notin (canary,gpu),zone in (a,b)"
        )

    def test_a_checked_selector_keeps_its_meaning(self) -> None:
        selector = {"matchExpressions": [{"key": "tier", "operator": "Exists"}]}
        spec = AutoscalerSpec.from_dict(minimal(selector=selector))
        assert spec.selector.to_dict() == {
            "matchLabels": {},
            "matchExpressions": [{"key": "tier", "operator": "Exists", "values": []}],
        }
        assert selector_to_string(spec.selector) == "tier"
