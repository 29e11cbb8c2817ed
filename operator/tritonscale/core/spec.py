"""The InstanceGroupAutoscaler spec: frozen dataclasses, read from and written back to a dict.

`AutoscalerSpec.from_dict(d)` takes the CR's `spec` (or one policy of the local driver's
YAML file), fills in the defaults and checks it. A mistake raises `InvalidSpec`: one line
that names the field by its path and, for a cross-field rule, both values. The defaults
and limits here are the CRD's (charts/tritonscale/crds/instancegroupautoscalers.yaml) and
the chart's values.yaml; tests/test_crd.py checks that they agree.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

INSTANCE_KINDS = ("", "KIND_CPU", "KIND_GPU")
SELECT_POLICIES = ("Max", "Min", "Disabled")
POLICY_TYPES = ("Instances", "Percent")
SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")

# Kubernetes' own limits (HPA validation): a window of at most an hour, a period of at most 30 min.
MAX_STABILIZATION_WINDOW_SECONDS = 3600
MAX_PERIOD_SECONDS = 1800
# List sizes are capped so that the CRD's CEL rules have a bounded cost; same caps here.
MAX_CALLS = 32
MAX_POLICIES = 10
MAX_MATCH_EXPRESSIONS = 32
MAX_SELECTOR_VALUES = 64
MAX_MODEL_NAME_LENGTH = 253
MAX_BUDGET_NAME_LENGTH = 63
# A budget's name is a label value of the operator's metrics and a key of its ledger: a DNS label.
BUDGET_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_BUDGET_NAME = re.compile(BUDGET_NAME_PATTERN)

# metav1 label syntax: an optional DNS-subdomain prefix, then a name of up to 63 characters.
_LABEL_NAME = r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)"
_LABEL_PREFIX = r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)"
LABEL_KEY_PATTERN = rf"^({_LABEL_PREFIX}/)?{_LABEL_NAME}$"
LABEL_VALUE_PATTERN = rf"^({_LABEL_NAME})?$"
_LABEL_KEY = re.compile(LABEL_KEY_PATTERN)
_LABEL_VALUE = re.compile(LABEL_VALUE_PATTERN)


class InvalidSpec(ValueError):
    """The spec breaks a rule; the message is one line naming the field."""


@dataclass(frozen=True)
class ScalingPolicy:
    """At most `value` instances (or percent of them) added or removed per `period_seconds`."""

    type: str  # "Instances" or "Percent"
    value: int
    period_seconds: int


@dataclass(frozen=True)
class ScalingRules:
    """One direction of `behavior`, as in HPA autoscaling/v2."""

    stabilization_window_seconds: int
    select_policy: str  # "Max", "Min" or "Disabled"
    policies: tuple[ScalingPolicy, ...]

    @property
    def longest_period_seconds(self) -> int:
        return max((policy.period_seconds for policy in self.policies), default=0)


def _default_scale_up() -> ScalingRules:
    return ScalingRules(
        stabilization_window_seconds=0,
        select_policy="Max",
        policies=(ScalingPolicy("Instances", 4, 15), ScalingPolicy("Percent", 100, 15)),
    )


def _default_scale_down() -> ScalingRules:
    return ScalingRules(
        stabilization_window_seconds=300,
        select_policy="Max",
        policies=(ScalingPolicy("Instances", 1, 60),),
    )


@dataclass(frozen=True)
class Behavior:
    """Up fast, down slowly: each direction has its stabilization window and rate policies."""

    scale_up: ScalingRules = field(default_factory=_default_scale_up)
    scale_down: ScalingRules = field(default_factory=_default_scale_down)


@dataclass(frozen=True)
class Targets:
    """What the policy steers each instance towards, and the GPU ceilings it never crosses."""

    utilization: float = 0.7  # busy fraction per instance, 0..1
    queue_compute_ratio: float = 0.5  # queue time / compute time per request
    pending_per_instance: float = 2.0  # pending requests per instance
    gpu_utilization_ceiling: float = 0.9  # busiest GPU, 0..1
    gpu_memory_ceiling: float = 0.9  # fraction of the busiest GPU's memory in use


@dataclass(frozen=True)
class BudgetSpec:
    """The joint budget this model's instances share with the other models of its pod set.

    Every autoscaler of one namespace that names the same budget is a member; together their
    instances on one pod stay within `instances_per_pod` and, when `gpu_memory_per_pod_mib`
    is set, within that much GPU memory at `gpu_memory_per_instance_mib` each
    (tritonscale.core.budget allocates it). The pod-set fields should agree across members;
    where they do not, the strictest holds.
    """

    name: str
    instances_per_pod: int
    gpu_memory_per_pod_mib: int = 0  # 0: no GPU memory budget
    gpu_memory_per_instance_mib: int = 0  # what one instance of this model takes

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "instancesPerPod": self.instances_per_pod,
            "gpuMemoryPerPodMiB": self.gpu_memory_per_pod_mib,
            "gpuMemoryPerInstanceMiB": self.gpu_memory_per_instance_mib,
        }


@dataclass(frozen=True)
class AutoscalerSpec:
    """One model on one set of Triton pods: bounds, targets and behaviour."""

    model: str
    # A metav1.LabelSelector as a plain dict (matchLabels / matchExpressions); read-only.
    # See tritonscale.core.selectors for its string form and a matcher.
    selector: Mapping[str, Any] = field(hash=False)
    calls: tuple[str, ...] = ()
    min_instances: int = 1
    max_instances: int = 8
    instance_kind: str = ""
    targets: Targets = field(default_factory=Targets)
    tolerance: float = 0.1
    behavior: Behavior = field(default_factory=Behavior)
    metrics_window_seconds: int = 60
    interval_seconds: int = 15
    paused: bool = False
    dry_run: bool = False
    budget: BudgetSpec | None = None  # None: this model's instances share no budget

    @classmethod
    def from_dict(cls, d: Any, path: str = "spec") -> AutoscalerSpec:
        """Read a CR `spec` (camelCase keys), fill in defaults, and check every rule."""
        return _read_spec(d, path)

    def to_dict(self) -> dict[str, Any]:
        """The full camelCase form, defaults included (what the CRD's defaulting would show)."""
        return {
            "selector": copy.deepcopy(dict(self.selector)),
            "model": self.model,
            "calls": list(self.calls),
            "minInstances": self.min_instances,
            "maxInstances": self.max_instances,
            "instanceKind": self.instance_kind,
            "targets": {
                "utilization": self.targets.utilization,
                "queueComputeRatio": self.targets.queue_compute_ratio,
                "pendingPerInstance": self.targets.pending_per_instance,
                "gpuUtilizationCeiling": self.targets.gpu_utilization_ceiling,
                "gpuMemoryCeiling": self.targets.gpu_memory_ceiling,
            },
            "tolerance": self.tolerance,
            "behavior": {
                "scaleUp": _rules_to_dict(self.behavior.scale_up),
                "scaleDown": _rules_to_dict(self.behavior.scale_down),
            },
            "metricsWindowSeconds": self.metrics_window_seconds,
            "intervalSeconds": self.interval_seconds,
            "paused": self.paused,
            "dryRun": self.dry_run,
            **({"budget": self.budget.to_dict()} if self.budget is not None else {}),
        }


def _rules_to_dict(rules: ScalingRules) -> dict[str, Any]:
    return {
        "stabilizationWindowSeconds": rules.stabilization_window_seconds,
        "selectPolicy": rules.select_policy,
        "policies": [
            {"type": p.type, "value": p.value, "periodSeconds": p.period_seconds}
            for p in rules.policies
        ],
    }


# ---------------------------------------------------------------------------------------
# Reading and checking.

_REQUIRED = object()


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, Sequence):
        return "a list"
    return type(value).__name__


class _Fields:
    """Reads the keys of one mapping, naming each by its path, and rejects the ones left over."""

    def __init__(self, value: Any, path: str) -> None:
        if not isinstance(value, Mapping):
            raise InvalidSpec(f"{path} must be a mapping, got {_type_name(value)}")
        self.value = value
        self.path = path
        self._read: set[str] = set()

    def at(self, key: str) -> str:
        return f"{self.path}.{key}"

    def raw(self, key: str, default: Any = _REQUIRED) -> Any:
        self._read.add(key)
        if key not in self.value:
            if default is _REQUIRED:
                raise InvalidSpec(f"{self.at(key)} is required")
            return default
        return self.value[key]

    def integer(
        self,
        key: str,
        default: Any = _REQUIRED,
        minimum: int | None = None,
        maximum: int | None = None,
    ) -> int:
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidSpec(f"{self.at(key)} must be an integer, got {value!r}")
        _check_range(self.at(key), value, minimum, maximum)
        return value

    def number(
        self,
        key: str,
        default: Any = _REQUIRED,
        minimum: float | None = None,
        maximum: float | None = None,
        above: float | None = None,
        below: float | None = None,
    ) -> float:
        value = self.raw(key, default)
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            raise InvalidSpec(f"{self.at(key)} must be a number, got {value!r}")
        if above is not None and value <= above:
            raise InvalidSpec(f"{self.at(key)} must be > {above}, got {value!r}")
        if below is not None and value >= below:
            raise InvalidSpec(f"{self.at(key)} must be < {below}, got {value!r}")
        _check_range(self.at(key), value, minimum, maximum)
        return float(value)

    def string(
        self,
        key: str,
        default: Any = _REQUIRED,
        choices: Sequence[str] | None = None,
        max_length: int | None = None,
    ) -> str:
        value = self.raw(key, default)
        if not isinstance(value, str):
            raise InvalidSpec(f"{self.at(key)} must be a string, got {_type_name(value)}")
        if choices is not None and value not in choices:
            allowed = ", ".join(repr(c) for c in choices)
            raise InvalidSpec(f"{self.at(key)} must be one of {allowed}, got {value!r}")
        if max_length is not None and len(value) > max_length:
            raise InvalidSpec(f"{self.at(key)} must be at most {max_length} characters long")
        return value

    def boolean(self, key: str, default: Any = _REQUIRED) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise InvalidSpec(f"{self.at(key)} must be true or false, got {value!r}")
        return value

    def sequence(
        self, key: str, default: Any = _REQUIRED, max_items: int | None = None
    ) -> list[Any]:
        value = self.raw(key, default)
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise InvalidSpec(f"{self.at(key)} must be a list, got {_type_name(value)}")
        if max_items is not None and len(value) > max_items:
            raise InvalidSpec(
                f"{self.at(key)} may hold at most {max_items} items, got {len(value)}"
            )
        return list(value)

    def done(self) -> None:
        """Unknown keys are mistakes (a misspelt `maxInstance` would silently do nothing)."""
        for key in self.value:
            if key not in self._read:
                known = ", ".join(sorted(self._read))
                raise InvalidSpec(f"{self.at(str(key))} is not a known field (known: {known})")


def _check_range(path: str, value: float, minimum: float | None, maximum: float | None) -> None:
    if minimum is not None and value < minimum:
        raise InvalidSpec(f"{path} must be >= {minimum}, got {value!r}")
    if maximum is not None and value > maximum:
        raise InvalidSpec(f"{path} must be <= {maximum}, got {value!r}")


def _read_spec(d: Any, path: str) -> AutoscalerSpec:
    fields = _Fields(d, path)
    selector = _read_selector(fields.raw("selector"), fields.at("selector"))
    model = fields.string("model", max_length=MAX_MODEL_NAME_LENGTH)
    if not model:
        raise InvalidSpec(f"{fields.at('model')} must not be empty")
    calls = _read_calls(fields, model)
    min_instances = fields.integer("minInstances", 1, minimum=1)
    max_instances = fields.integer("maxInstances", 8, minimum=1)
    if min_instances > max_instances:
        raise InvalidSpec(
            f"{fields.at('minInstances')} ({min_instances}) must be <= "
            f"{fields.at('maxInstances')} ({max_instances})"
        )
    instance_kind = fields.string("instanceKind", "", choices=INSTANCE_KINDS)
    targets = _read_targets(fields.raw("targets", {}), fields.at("targets"))
    tolerance = fields.number("tolerance", 0.1, minimum=0, below=1)
    behavior = _read_behavior(fields.raw("behavior", {}), fields.at("behavior"))
    metrics_window_seconds = fields.integer("metricsWindowSeconds", 60, minimum=1)
    interval_seconds = fields.integer("intervalSeconds", 15, minimum=1)
    paused = fields.boolean("paused", False)
    dry_run = fields.boolean("dryRun", False)
    budget = None
    if fields.raw("budget", None) is not None:
        budget = _read_budget(fields.raw("budget"), fields.at("budget"))
        _check_budget_fits(budget, min_instances, fields)
    fields.done()
    return AutoscalerSpec(
        model=model,
        selector=selector,
        calls=calls,
        min_instances=min_instances,
        max_instances=max_instances,
        instance_kind=instance_kind,
        targets=targets,
        tolerance=tolerance,
        behavior=behavior,
        metrics_window_seconds=metrics_window_seconds,
        interval_seconds=interval_seconds,
        paused=paused,
        dry_run=dry_run,
        budget=budget,
    )


def _read_budget(d: Any, path: str) -> BudgetSpec:
    fields = _Fields(d, path)
    name = fields.string("name", max_length=MAX_BUDGET_NAME_LENGTH)
    if not _BUDGET_NAME.match(name):
        raise InvalidSpec(
            f"{fields.at('name')} must be a DNS label (lower-case letters, digits and '-'), "
            f"got {name!r}"
        )
    budget = BudgetSpec(
        name=name,
        instances_per_pod=fields.integer("instancesPerPod", minimum=1),
        gpu_memory_per_pod_mib=fields.integer("gpuMemoryPerPodMiB", 0, minimum=0),
        gpu_memory_per_instance_mib=fields.integer("gpuMemoryPerInstanceMiB", 0, minimum=0),
    )
    fields.done()
    return budget


def _check_budget_fits(budget: BudgetSpec, min_instances: int, fields: _Fields) -> None:
    """The model's own minimum must fit in the budget; the members' sum is the ledger's to check."""
    at = fields.at("budget")
    if min_instances > budget.instances_per_pod:
        raise InvalidSpec(
            f"{fields.at('minInstances')} ({min_instances}) must be <= "
            f"{at}.instancesPerPod ({budget.instances_per_pod})"
        )
    memory = min_instances * budget.gpu_memory_per_instance_mib
    if budget.gpu_memory_per_pod_mib and memory > budget.gpu_memory_per_pod_mib:
        raise InvalidSpec(
            f"{fields.at('minInstances')} x {at}.gpuMemoryPerInstanceMiB ({memory}) must be <= "
            f"{at}.gpuMemoryPerPodMiB ({budget.gpu_memory_per_pod_mib})"
        )


def _read_calls(fields: _Fields, model: str) -> tuple[str, ...]:
    calls = fields.sequence("calls", [], max_items=MAX_CALLS)
    seen: set[str] = set()
    for index, child in enumerate(calls):
        at = f"{fields.at('calls')}[{index}]"
        if not isinstance(child, str) or not child:
            raise InvalidSpec(f"{at} must be a model name, got {child!r}")
        if len(child) > MAX_MODEL_NAME_LENGTH:
            raise InvalidSpec(f"{at} must be at most {MAX_MODEL_NAME_LENGTH} characters long")
        if child == model:
            raise InvalidSpec(f"{at} ({child!r}) must differ from {fields.at('model')} ({model!r})")
        if child in seen:
            raise InvalidSpec(f"{at} ({child!r}) is listed twice")
        seen.add(child)
    return tuple(calls)


def _read_targets(d: Any, path: str) -> Targets:
    fields = _Fields(d, path)
    targets = Targets(
        utilization=fields.number("utilization", 0.7, maximum=1, above=0),
        queue_compute_ratio=fields.number("queueComputeRatio", 0.5, minimum=0),
        pending_per_instance=fields.number("pendingPerInstance", 2.0, above=0),
        gpu_utilization_ceiling=fields.number("gpuUtilizationCeiling", 0.9, maximum=1, above=0),
        gpu_memory_ceiling=fields.number("gpuMemoryCeiling", 0.9, maximum=1, above=0),
    )
    fields.done()
    return targets


def _read_behavior(d: Any, path: str) -> Behavior:
    fields = _Fields(d, path)
    defaults = Behavior()
    behavior = Behavior(
        scale_up=_read_rules(fields.raw("scaleUp", {}), fields.at("scaleUp"), defaults.scale_up),
        scale_down=_read_rules(
            fields.raw("scaleDown", {}), fields.at("scaleDown"), defaults.scale_down
        ),
    )
    fields.done()
    return behavior


def _read_rules(d: Any, path: str, defaults: ScalingRules) -> ScalingRules:
    """HPA semantics: each key left out takes its own default, the policies as a whole list."""
    fields = _Fields(d, path)
    window = fields.integer(
        "stabilizationWindowSeconds",
        defaults.stabilization_window_seconds,
        minimum=0,
        maximum=MAX_STABILIZATION_WINDOW_SECONDS,
    )
    select_policy = fields.string("selectPolicy", defaults.select_policy, choices=SELECT_POLICIES)
    default_policies = _rules_to_dict(defaults)["policies"]
    raw_policies = fields.sequence("policies", default_policies, max_items=MAX_POLICIES)
    policies = tuple(
        _read_policy(p, f"{fields.at('policies')}[{i}]") for i, p in enumerate(raw_policies)
    )
    if not policies and select_policy != "Disabled":
        raise InvalidSpec(
            f"{fields.at('policies')} must hold at least one policy unless "
            f"{fields.at('selectPolicy')} is 'Disabled' (it is {select_policy!r})"
        )
    fields.done()
    return ScalingRules(window, select_policy, policies)


def _read_policy(d: Any, path: str) -> ScalingPolicy:
    fields = _Fields(d, path)
    policy = ScalingPolicy(
        type=fields.string("type", choices=POLICY_TYPES),
        value=fields.integer("value", minimum=1),
        period_seconds=fields.integer("periodSeconds", minimum=1, maximum=MAX_PERIOD_SECONDS),
    )
    fields.done()
    return policy


def _read_selector(d: Any, path: str) -> dict[str, Any]:
    """A metav1.LabelSelector; it must select something (an empty one would match every pod)."""
    fields = _Fields(d, path)
    match_labels = fields.raw("matchLabels", {})
    if not isinstance(match_labels, Mapping):
        raise InvalidSpec(
            f"{fields.at('matchLabels')} must be a mapping, got {_type_name(match_labels)}"
        )
    for key, value in match_labels.items():
        at = f"{fields.at('matchLabels')}.{key}"
        _check_label_key(key, at)
        if not isinstance(value, str) or not _LABEL_VALUE.match(value):
            raise InvalidSpec(f"{at} must be a label value, got {value!r}")
    expressions = fields.sequence("matchExpressions", [], max_items=MAX_MATCH_EXPRESSIONS)
    checked = [
        _read_expression(e, f"{fields.at('matchExpressions')}[{i}]")
        for i, e in enumerate(expressions)
    ]
    fields.done()
    if not match_labels and not checked:
        raise InvalidSpec(
            f"{path} must hold matchLabels or matchExpressions (an empty one selects every pod)"
        )
    selector: dict[str, Any] = {}
    if match_labels:
        selector["matchLabels"] = dict(match_labels)
    if checked:
        selector["matchExpressions"] = checked
    return selector


def _read_expression(d: Any, path: str) -> dict[str, Any]:
    fields = _Fields(d, path)
    key = fields.string("key")
    _check_label_key(key, fields.at("key"))
    operator = fields.string("operator", choices=SELECTOR_OPERATORS)
    values = fields.sequence("values", [], max_items=MAX_SELECTOR_VALUES)
    fields.done()
    for index, value in enumerate(values):
        if not isinstance(value, str) or not _LABEL_VALUE.match(value):
            raise InvalidSpec(
                f"{fields.at('values')}[{index}] must be a label value, got {value!r}"
            )
    if operator in ("In", "NotIn") and not values:
        raise InvalidSpec(f"{fields.at('values')} must not be empty when operator is {operator!r}")
    if operator in ("Exists", "DoesNotExist") and values:
        raise InvalidSpec(f"{fields.at('values')} must be empty when operator is {operator!r}")
    expression: dict[str, Any] = {"key": key, "operator": operator}
    if values:
        expression["values"] = list(values)
    return expression


def _check_label_key(key: Any, path: str) -> None:
    prefix = key.rpartition("/")[0] if isinstance(key, str) else ""
    if not isinstance(key, str) or not _LABEL_KEY.match(key) or len(prefix) > 253:
        raise InvalidSpec(f"{path} must be a label key like 'app.kubernetes.io/name', got {key!r}")
