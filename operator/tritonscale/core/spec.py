"""The InstanceGroupAutoscaler spec, defined once: fields, defaults, limits, descriptions and rules.

Everything else follows from these models. In Python, `AutoscalerSpec.from_dict(d)` reads a
CR's `spec` (or one policy of the local driver's YAML file), fills in the defaults and
checks it; a mistake raises `InvalidSpec`, one line naming the field. `make crd`
(charts/tools/crd.py) writes from them the CRD's openAPIV3Schema (with the CEL rules),
the chart's `autoscalers.defaults` with their documentation and schema, and the field
table of docs/instancegroupautoscaler.md; a test fails when those files are stale.

To add a field: declare it here with its default, limits and description, and run `make crd`.
A rule across fields is a `Rule` (CEL) in the model's `rules`, evaluated here and by the
API server alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Literal

from pydantic import Field, StrictBool, StrictFloat, StrictInt, StrictStr

from tritonscale.core.rules import Rule
from tritonscale.core.spec_model import Distinct, InvalidSpec, Matches, SpecModel

__all__ = [
    "AutoscalerSpec",
    "Behavior",
    "BudgetSpec",
    "InvalidSpec",
    "LabelSelector",
    "LabelSelectorRequirement",
    "LatencyObjective",
    "ScaleDownRules",
    "ScaleUpRules",
    "ScalingPolicy",
    "ScalingRules",
    "Targets",
    "latency_objectives_off_root",
]

# Kubernetes' own limits (HPA validation): a window of at most an hour, a period of at most 30 min.
MAX_STABILIZATION_WINDOW_SECONDS = 3600
MAX_PERIOD_SECONDS = 1800
# Every list, map and string has a bound, so that the API server can bound the CEL rules' cost.
MAX_CALLS = 32
MAX_POLICIES = 10
MAX_MATCH_LABELS = 32
MAX_MATCH_EXPRESSIONS = 32
MAX_SELECTOR_VALUES = 64
MAX_MODEL_NAME_LENGTH = 253
# A budget's name is a label value of the operator's metrics and a key of its ledger: a DNS label.
MAX_BUDGET_NAME_LENGTH = 63
BUDGET_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# Bounds that keep a budget's arithmetic (and its CEL rules' integers) small.
MAX_INSTANCES_PER_POD = 1024
MAX_GPU_MEMORY_MIB = 16 * 1024 * 1024

# metav1 label syntax: an optional DNS-subdomain prefix, then a name of up to 63 characters.
_LABEL_NAME = r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)"
_LABEL_PREFIX = r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)"
LABEL_KEY_PATTERN = rf"^({_LABEL_PREFIX}/)?{_LABEL_NAME}$"
LABEL_VALUE_PATTERN = rf"^({_LABEL_NAME})?$"

LabelKey = Annotated[
    StrictStr,
    Field(max_length=253 + 1 + 63),
    Matches(LABEL_KEY_PATTERN, "a label key like 'app.kubernetes.io/name'"),
]
LabelValue = Annotated[
    StrictStr, Field(max_length=63), Matches(LABEL_VALUE_PATTERN, "a label value")
]
ModelName = Annotated[StrictStr, Field(min_length=1, max_length=MAX_MODEL_NAME_LENGTH)]
PositiveFraction = Annotated[StrictFloat, Field(gt=0, le=1)]


class LabelSelectorRequirement(SpecModel):
    """One requirement of a label selector."""

    rules = (
        Rule(
            "self.operator in ['In', 'NotIn'] ? size(self.values) > 0 : size(self.values) == 0",
            message_expression=(
                "'values must ' + (self.operator in ['In', 'NotIn'] ? 'not be empty' : 'be empty')"
                " + ' when operator is ' + self.operator"
            ),
        ),
    )

    key: LabelKey = Field(description="The label's key (Kubernetes label syntax).")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="In, NotIn (a pod without the key is not in the set), Exists, DoesNotExist."
    )
    values: tuple[LabelValue, ...] = Field(
        (),
        max_length=MAX_SELECTOR_VALUES,
        description="The values for In and NotIn (at least one); empty for Exists and DoesNotExist.",
    )


class LabelSelector(SpecModel):
    """A metav1.LabelSelector: every requirement must hold."""

    match_labels: dict[LabelKey, LabelValue] = Field(
        {},
        max_length=MAX_MATCH_LABELS,
        description="Labels the pods must carry, with these values (Kubernetes label syntax).",
    )
    match_expressions: tuple[LabelSelectorRequirement, ...] = Field(
        (), max_length=MAX_MATCH_EXPRESSIONS, description="Requirements on the pods' labels."
    )


class LatencyObjective(SpecModel):
    """A latency objective for the pipeline's requests: `quantile` of them within `milliseconds`.

    The bounds are CEL rules rather than schema limits so that the API server and `from_dict`
    give the same one-line message for them. Whether the model is a root (called by no other
    model of its set) is not something one object can know: the drivers check it against the
    set's `calls` (docs/instancegroupautoscaler.md, "A latency objective").
    """

    rules = (
        Rule(
            "self.quantile > 0.0 && self.quantile < 1.0",
            message="must be above 0 and below 1",
            field_path=".quantile",
            shows=("quantile",),
        ),
        Rule(
            "self.milliseconds > 0.0",
            message="must be above 0",
            field_path=".milliseconds",
            shows=("milliseconds",),
        ),
    )

    quantile: StrictFloat = Field(
        0.95,
        description="The share of requests the bound applies to, above 0 and below 1 (0.95: p95).",
    )
    milliseconds: StrictFloat = Field(
        description="The bound on that quantile of the latency, in milliseconds (above 0)."
    )


class Targets(SpecModel):
    """What the policy steers each instance towards, and the GPU ceilings it never crosses."""

    utilization: PositiveFraction = Field(
        0.7, description="Busy fraction per instance (compute seconds per second / instances)."
    )
    queue_compute_ratio: StrictFloat = Field(
        0.5,
        ge=0,
        description="Queue time / compute time per request; it only ever asks for more instances.",
    )
    pending_per_instance: StrictFloat = Field(
        2.0,
        gt=0,
        description=(
            "Pending requests (nv_inference_pending_request_count) per instance; for a decoupled"
            " model that reports its streams, the streams in flight (and queued requests) per"
            " instance."
        ),
    )
    gpu_utilization_ceiling: PositiveFraction = Field(
        0.9,
        description="At or above this GPU utilization no instance is added (more pods are the answer).",
    )
    gpu_memory_ceiling: PositiveFraction = Field(
        0.9, description="At or above this fraction of GPU memory in use no instance is added."
    )
    latency: LatencyObjective | None = Field(
        None,
        description=(
            "A latency objective for the requests of a pipeline's root (a model no other model"
            " of its set calls): the planner gives the pipeline the fewest instances whose"
            " predicted latency meets it, and status.latency shows it beside the prediction"
            " and the measured mean (unset: none)."
        ),
    )


class ScalingPolicy(SpecModel):
    """At most `value` instances (or percent of them) added or removed per `period_seconds`."""

    type: Literal["Instances", "Percent"] = Field(
        description="Instances: a number of instances; Percent: a percentage of the current count."
    )
    value: StrictInt = Field(ge=1, description="How many instances, or what percentage.")
    period_seconds: StrictInt = Field(
        ge=1, le=MAX_PERIOD_SECONDS, description="The period the value applies to, in seconds."
    )


StabilizationWindow = Annotated[
    StrictInt,
    Field(
        ge=0,
        le=MAX_STABILIZATION_WINDOW_SECONDS,
        description="Seconds of past recommendations the decision looks back on.",
    ),
]
SelectPolicy = Annotated[
    Literal["Max", "Min", "Disabled"],
    Field(description="Which policy wins: Max (the largest change), Min, or Disabled (none)."),
]
Policies = Annotated[
    tuple[ScalingPolicy, ...],
    Field(
        max_length=MAX_POLICIES,
        description="Rate limits; at least one unless selectPolicy is Disabled.",
    ),
]


class ScalingRules(SpecModel):
    """One direction of `behavior`, as in HPA autoscaling/v2; each key has its own default."""

    rules = (
        Rule(
            "self.selectPolicy == 'Disabled' || size(self.policies) > 0",
            message_expression=(
                "'policies must hold at least one policy unless selectPolicy is Disabled (it is '"
                " + self.selectPolicy + ')'"
            ),
        ),
    )

    stabilization_window_seconds: StabilizationWindow
    select_policy: SelectPolicy = "Max"
    policies: Policies

    @property
    def longest_period_seconds(self) -> int:
        return max((policy.period_seconds for policy in self.policies), default=0)


class ScaleUpRules(ScalingRules):
    """Up fast: at once, by 4 instances or 100 % per 15 s, whichever adds more."""

    stabilization_window_seconds: StabilizationWindow = 0
    policies: Policies = (
        ScalingPolicy(type="Instances", value=4, periodSeconds=15),
        ScalingPolicy(type="Percent", value=100, periodSeconds=15),
    )


class ScaleDownRules(ScalingRules):
    """Down slowly: after 5 minutes of lower recommendations, one instance per minute."""

    stabilization_window_seconds: StabilizationWindow = 300
    policies: Policies = (ScalingPolicy(type="Instances", value=1, periodSeconds=60),)


class Behavior(SpecModel):
    """Up fast, down slowly: each direction has its stabilization window and rate policies."""

    scale_up: ScaleUpRules = Field(ScaleUpRules(), description="Rules for adding instances.")
    scale_down: ScaleDownRules = Field(
        ScaleDownRules(), description="Rules for removing instances."
    )


class BudgetSpec(SpecModel):
    """The joint budget this model's instances share with the other models of its pod set.

    Every autoscaler of one namespace that names the same budget is a member; together their
    instances on one pod stay within `instances_per_pod` and, when `gpu_memory_per_pod_mib`
    is set, within that much GPU memory at `gpu_memory_per_instance_mib` each
    (tritonscale.core.budget allocates it). The pod-set fields should agree across members;
    where they do not, the strictest holds.
    """

    name: Annotated[
        StrictStr,
        Field(min_length=1, max_length=MAX_BUDGET_NAME_LENGTH),
        Matches(BUDGET_NAME_PATTERN, "a DNS label (lower-case letters, digits and '-')"),
    ] = Field(
        description=(
            "The budget's name; the autoscalers of one namespace that give the same name share it."
        )
    )
    instances_per_pod: StrictInt = Field(
        ge=1,
        le=MAX_INSTANCES_PER_POD,
        description="Most instances of all the members together on one pod.",
    )
    gpu_memory_per_pod_mib: StrictInt = Field(
        0,
        ge=0,
        le=MAX_GPU_MEMORY_MIB,
        alias="gpuMemoryPerPodMiB",
        description="GPU memory (MiB) the members' instances may take on one pod; 0: no memory budget.",
    )
    gpu_memory_per_instance_mib: StrictInt = Field(
        0,
        ge=0,
        le=MAX_GPU_MEMORY_MIB,
        alias="gpuMemoryPerInstanceMiB",
        description="GPU memory (MiB) one instance of this model takes.",
    )


class AutoscalerSpec(SpecModel):
    """One model on one set of Triton pods: bounds, targets and behaviour."""

    rules = (
        Rule(
            "size(self.selector.matchLabels) > 0 || size(self.selector.matchExpressions) > 0",
            message="must hold matchLabels or matchExpressions (an empty selector selects every pod)",
            field_path=".selector",
        ),
        Rule(
            "!(self.model in self.calls)",
            message_expression="'must not name the model itself (' + self.model + ')'",
            field_path=".calls",
        ),
        Rule(
            "self.minInstances <= self.maxInstances",
            message="minInstances must be <= maxInstances",
            shows=("minInstances", "maxInstances"),
        ),
        # The model's own minimum must fit in its budget; the members' sum is the ledger's to check.
        Rule(
            "!has(self.budget) || self.minInstances <= self.budget.instancesPerPod",
            message="minInstances must be <= budget.instancesPerPod",
            field_path=".budget.instancesPerPod",
            shows=("minInstances", "budget.instancesPerPod"),
        ),
        Rule(
            # A division, not a product: the product of two large integers would overflow.
            "!has(self.budget) || self.budget.gpuMemoryPerPodMiB == 0"
            " || self.budget.gpuMemoryPerInstanceMiB == 0"
            " || self.minInstances"
            " <= self.budget.gpuMemoryPerPodMiB / self.budget.gpuMemoryPerInstanceMiB",
            message=(
                "minInstances x budget.gpuMemoryPerInstanceMiB must be <= budget.gpuMemoryPerPodMiB"
            ),
            field_path=".budget.gpuMemoryPerPodMiB",
            shows=("minInstances", "budget.gpuMemoryPerInstanceMiB", "budget.gpuMemoryPerPodMiB"),
        ),
    )

    selector: LabelSelector = Field(
        description="The Triton pods; it must select something (an empty one matches every pod)."
    )
    model: ModelName = Field(description="The model's name in the Triton model repository.")
    calls: Annotated[tuple[ModelName, ...], Distinct()] = Field(
        (),
        max_length=MAX_CALLS,
        description=(
            "Models this one calls through BLS: the planner carries this model's requests down"
            " to them (calls per request, measured) and sizes them together."
        ),
    )
    min_instances: StrictInt = Field(1, ge=1, description="Fewest instances per pod.")
    max_instances: StrictInt = Field(
        8, ge=1, description="Most instances per pod (at least minInstances)."
    )
    instance_kind: Literal["", "KIND_CPU", "KIND_GPU"] = Field(
        "", description='Instance kind written to the config; "" keeps the live config\'s kind.'
    )
    targets: Targets = Field(Targets(), description="What each instance is steered towards.")
    tolerance: StrictFloat = Field(
        0.1, ge=0, lt=1, description="Deadband: |1 - ratio| <= tolerance keeps the count."
    )
    behavior: Behavior = Field(
        Behavior(),
        description=(
            "Scale up fast, down slowly: the shape and meaning of HPA autoscaling/v2 behavior,"
            " with type Instances instead of Pods."
        ),
    )
    metrics_window_seconds: StrictInt = Field(
        60,
        ge=1,
        description="Rate window of the metrics; a restarted operator holds until one full window exists.",
    )
    interval_seconds: StrictInt = Field(15, ge=1, description="Control period, in seconds.")
    paused: StrictBool = Field(False, description="Observe and report, never act.")
    dry_run: StrictBool = Field(
        False, description="Decide and report the decision, never apply it."
    )
    budget: BudgetSpec | None = Field(
        None,
        description=(
            "The joint instance budget this model shares with the other models of its pods"
            " (unset: none)."
        ),
    )


def latency_objectives_off_root(specs: Iterable[AutoscalerSpec]) -> dict[str, str]:
    """The models of one set that carry a latency objective but are called by another, each
    with its first caller (by name). A latency objective is the pipeline's, counted from its
    root; one object cannot know its callers, so the drivers check this across the set."""
    specs = list(specs)
    callers: dict[str, str] = {}
    for spec in sorted(specs, key=lambda spec: spec.model):
        for called in spec.calls:
            callers.setdefault(called, spec.model)
    return {
        spec.model: callers[spec.model]
        for spec in specs
        if spec.targets.latency is not None and spec.model in callers
    }
