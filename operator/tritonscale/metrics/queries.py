"""The one definition of each signal's PromQL.

The operator's Prometheus source, the recording rules, the Grafana dashboards and the
prometheus-adapter rule behind the chart's HPA are all written from these functions
(`dashboards/generate.py` writes the files; tests fail when a committed copy differs).

A signal is a function of a `Scope`, the place a query runs, and returns PromQL:

    request_rate(Scope('namespace="ml"', "1m", ("namespace", "model")))
    -> 'sum by (namespace, model) (rate(nv_inference_request_success{namespace="ml"}[1m]))'

The scopes of this project: `SOURCE_SCOPE` (PrometheusSource: `string.Template`s over
`$selector`, `$window` and `$pod`, the label that names a pod: one series per pod and model),
`RULES_SCOPE` (recording rules: every series, 1m, by namespace
and model), the dashboards' scope (their variables and `$__rate_interval`, in generate.py)
and `ADAPTER_SCOPE` (prometheus-adapter's `<<.LabelMatchers>>` and `<<.GroupBy>>`).
The budgets' signals (`budget_*`) read the operator's own gauges, one series per namespace
and budget.

Durations are Triton's cumulative microseconds: a rate of them is microseconds per second,
so `/ 1e6` gives seconds of work per second of wall time, which by Little's law is the
mean number of requests in that stage.
"""

from __future__ import annotations

from dataclasses import dataclass

# ---- Triton's metrics (port 8002) ----------------------------------------------------
# The request counters (the failures with a label `reason`) are named beside their reader
# of Triton's own text, which the healer uses too.
from tritonscale.triton.metrics_text import REQUEST_FAILURE, REQUEST_SUCCESS

INFERENCE_COUNT = "nv_inference_count"  # inferences (batch rows), not requests
EXECUTION_COUNT = "nv_inference_exec_count"  # model executions (batches)
REQUEST_DURATION = "nv_inference_request_duration_us"
QUEUE_DURATION = "nv_inference_queue_duration_us"
COMPUTE_DURATIONS = (
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
)
PENDING_REQUESTS = "nv_inference_pending_request_count"  # gauge: requests queued, not executing
GPU_UTILIZATION = "nv_gpu_utilization"  # 0..1
GPU_MEMORY_USED = "nv_gpu_memory_used_bytes"
GPU_MEMORY_TOTAL = "nv_gpu_memory_total_bytes"
# The DCGM exporter's names, where Triton runs without its own GPU metrics.
DCGM_GPU_UTILIZATION = "DCGM_FI_DEV_GPU_UTIL"  # percent
DCGM_MEMORY_USED = "DCGM_FI_DEV_FB_USED"  # MiB
DCGM_MEMORY_FREE = "DCGM_FI_DEV_FB_FREE"  # MiB

# ---- exported by a model itself ------------------------------------------------------
# A decoupled model whose `async def execute` returns before its streams end is invisible
# to Triton's counters while it streams (docs/instancegroupautoscaler.md, "Signals"). It
# exports this gauge through python_backend's custom metrics (`pb_utils.MetricFamily`),
# labelled `model` and `version`: requests whose final response is not sent yet.
STREAMS_IN_FLIGHT = "tritonscale_model_streams_in_flight"

# ---- the operator's metrics ----------------------------------------------------------
CURRENT_INSTANCES = "tritonscale_current_instances"
# Per (namespace, budget): tritonscale.control.operator_metrics exports them.
BUDGET_LIMIT = "tritonscale_budget_instances_limit"
BUDGET_USED = "tritonscale_budget_instances_used"
BUDGET_WANTED = "tritonscale_budget_instances_wanted"
BUDGET_EXHAUSTED = "tritonscale_budget_exhausted"
BUDGET_DEMAND_RATIO = "tritonscale_budget_demand_ratio"
BUDGET_GPU_MEMORY_LIMIT = "tritonscale_budget_gpu_memory_limit_bytes"
BUDGET_GPU_MEMORY_USED = "tritonscale_budget_gpu_memory_used_bytes"
# Per (namespace, set), with the set planner: what it predicted its counts serve, and what the
# set's roots served.
SET_PREDICTED_RPS = "tritonscale_set_predicted_rps"
SET_SERVED_RPS = "tritonscale_set_served_rps"
# Per autoscaler of a root with a latency objective (spec.targets.latency): the bound, the
# planner's prediction of its quantile at the counts it chose, and the measured mean.
LATENCY_OBJECTIVE_SECONDS = "tritonscale_latency_objective_seconds"
LATENCY_PREDICTED_SECONDS = "tritonscale_latency_predicted_seconds"
LATENCY_MEASURED_MEAN_SECONDS = "tritonscale_latency_measured_mean_seconds"


@dataclass(frozen=True)
class Scope:
    """Where a query runs: the label matchers, the rate window and the labels kept."""

    selector: str = ""  # matchers without braces: 'namespace="ml",pod=~"a|b"'; "" for all
    window: str = "1m"  # the range of rate(): "1m", "$window", "$__rate_interval"
    by: tuple[str, ...] = ("model",)  # labels an aggregation keeps; () for one number

    def series(self, metric: str) -> str:
        return f"{metric}{{{self.selector}}}" if self.selector else metric

    def rate(self, metric: str) -> str:
        return f"rate({self.series(metric)}[{self.window}])"

    def aggregate(self, operator: str, expr: str, extra: tuple[str, ...] = ()) -> str:
        labels = ", ".join((*self.by, *extra))
        return f"{operator} by ({labels}) ({expr})" if labels else f"{operator}({expr})"

    def sum(self, expr: str, extra: tuple[str, ...] = ()) -> str:
        return self.aggregate("sum", expr, extra)

    def on(self) -> str:
        """The `on (...)` of a binary operation between two of this scope's results."""
        return f" on ({', '.join(self.by)})" if self.by else ""


SOURCE_SCOPE = Scope("$selector", "$window", ("$pod", "model"))
SOURCE_POD_SCOPE = Scope("$pods", "$window", ("$pod",))  # per-pod series (GPU): no model label
RULES_SCOPE = Scope("", "1m", ("namespace", "model"))
ADAPTER_SCOPE = Scope("<<.LabelMatchers>>", "2m", ("<<.GroupBy>>",))


# ---- the signals ---------------------------------------------------------------------
def request_rate(scope: Scope) -> str:
    """Successful requests per second (a decoupled model's request is one stream)."""
    return scope.sum(scope.rate(REQUEST_SUCCESS))


def failure_rate(scope: Scope, *, by_reason: bool = False) -> str:
    """Failed requests per second (Triton's reasons: BACKEND, REJECTED, CANCELED, OTHER)."""
    return scope.sum(scope.rate(REQUEST_FAILURE), ("reason",) if by_reason else ())


def failure_ratio(scope: Scope) -> str:
    """The share of requests that failed; no value while a model is idle."""
    return (
        f"{failure_rate(scope)}\n  / (\n    {request_rate(scope)}\n    + {failure_rate(scope)}\n  )"
    )


def execution_rate(scope: Scope) -> str:
    """Model executions (batches) per second."""
    return scope.sum(scope.rate(EXECUTION_COUNT))


def inference_rate(scope: Scope) -> str:
    """Inferences (batch rows) per second."""
    return scope.sum(scope.rate(INFERENCE_COUNT))


def _compute_microseconds(scope: Scope) -> str:
    stages = "\n    + ".join(scope.rate(metric) for metric in COMPUTE_DURATIONS)
    return scope.sum(f"\n      {stages}\n  ")


def compute_seconds_per_second(scope: Scope) -> str:
    """Seconds of compute (input + infer + output) per second, summed over requests."""
    return f"{_compute_microseconds(scope)} / 1e6"


def queue_seconds_per_second(scope: Scope) -> str:
    """Seconds spent queueing per second, summed over requests."""
    return f"{scope.sum(scope.rate(QUEUE_DURATION))} / 1e6"


def request_seconds_per_second(scope: Scope) -> str:
    """Seconds requests spend inside Triton per second: the mean number of requests there."""
    return f"{scope.sum(scope.rate(REQUEST_DURATION))} / 1e6"


def queue_compute_ratio(scope: Scope, *, idle_as_zero: bool = False) -> str:
    """Queue time per unit of compute time. While a model is idle it has no value, or 0
    with `idle_as_zero` (compute clamped to 1 microsecond per second)."""
    queue = scope.sum(scope.rate(QUEUE_DURATION))
    compute = _compute_microseconds(scope)
    return f"{queue}\n  / clamp_min({compute}, 1)" if idle_as_zero else f"{queue}\n  / {compute}"


def mean_request_seconds(scope: Scope) -> str:
    """Mean time of a request inside Triton (queue + compute)."""
    return f"{request_seconds_per_second(scope)}\n  / {request_rate(scope)}"


def mean_queue_seconds(scope: Scope) -> str:
    """Mean time a request waited for an instance."""
    return f"{queue_seconds_per_second(scope)}\n  / {request_rate(scope)}"


def busy_instances(scope: Scope) -> str:
    """Instances' worth of compute. Triton charges a batch's whole compute time to each
    request in it; executions / requests (1 / the mean batch) undoes the charge."""
    return (
        f"{compute_seconds_per_second(scope)}\n  * {execution_rate(scope)}\n"
        f"  / {request_rate(scope)}"
    )


def pending_requests(scope: Scope) -> str:
    """Requests queued for an instance right now (not those executing)."""
    return scope.sum(scope.series(PENDING_REQUESTS))


def streams_in_flight(scope: Scope) -> str:
    """Decoupled requests whose final response is not sent yet, from the model's own gauge."""
    return scope.sum(scope.series(STREAMS_IN_FLIGHT))


def exported(scope: Scope) -> str:
    """1 for each group of the scope (a pod and model, say) whose series exist."""
    return scope.aggregate("group", scope.series(REQUEST_SUCCESS))


def first_sample(scope: Scope) -> str:
    """The time of the earliest sample of the window: the window is complete when it is about
    as old as the window (a subquery at `$step` resolution)."""
    return scope.aggregate(
        "min", f"min_over_time(timestamp({scope.series(REQUEST_SUCCESS)})[$window:$step])"
    )


def pods_reporting(scope: Scope) -> str:
    """Pods (scrape targets) that export the model."""
    each = scope.aggregate("group", scope.series(REQUEST_SUCCESS), ("instance", "pod"))
    return scope.aggregate("count", each)


def backend_failures_total(scope: Scope) -> str:
    """Requests that failed in the model's backend since the counters started (not a rate:
    the operator's healer takes the increase between its own checks)."""
    failed = Scope(",".join(p for p in (scope.selector, 'reason="BACKEND"') if p))
    return scope.sum(failed.series(REQUEST_FAILURE))


def successes_total(scope: Scope) -> str:
    """Successful requests since the counters started (not a rate)."""
    return scope.sum(scope.series(REQUEST_SUCCESS))


def busy_fraction(scope: Scope) -> str:
    """Busy per instance as the policy computes it: busy instances over pods x the
    operator's live instance count (Triton exports no instance count)."""
    instances = scope.aggregate("max", scope.series(CURRENT_INSTANCES))
    return (
        f"(\n  {busy_instances(scope)}\n)\n  /{scope.on()}\n"
        f"(\n  {pods_reporting(scope)}\n    *{scope.on()} {instances}\n)"
    )


def gpu_utilization(scope: Scope) -> str:
    """The busiest GPU, 0..1, from Triton's own metric."""
    return scope.aggregate("max", scope.series(GPU_UTILIZATION))


def gpu_utilization_dcgm(scope: Scope) -> str:
    """The busiest GPU, 0..1, from the DCGM exporter (which reports percent)."""
    return f"{scope.aggregate('max', scope.series(DCGM_GPU_UTILIZATION))} / 100"


def gpu_memory_fraction(scope: Scope) -> str:
    """The fullest GPU's memory, used / total, from Triton's metrics."""
    used, total = scope.series(GPU_MEMORY_USED), scope.series(GPU_MEMORY_TOTAL)
    return scope.aggregate("max", f"{used} / {total}")


def gpu_memory_fraction_dcgm(scope: Scope) -> str:
    """The fullest GPU's memory from the DCGM exporter: used / (used + free)."""
    used, free = scope.series(DCGM_MEMORY_USED), scope.series(DCGM_MEMORY_FREE)
    return scope.aggregate("max", f"{used} / ({used} + {free})")


def budget_demand_ratio(scope: Scope) -> str:
    """What a budget's members' loads ask for over what a pod holds (above 1: more pods)."""
    return scope.aggregate("max", scope.series(BUDGET_DEMAND_RATIO))


def budget_exhausted(scope: Scope) -> str:
    """1 while a budget refuses its members instances (or a full GPU does)."""
    return scope.aggregate("max", scope.series(BUDGET_EXHAUSTED))


# ---- the recording rules -------------------------------------------------------------
@dataclass(frozen=True)
class RecordingRule:
    record: str
    description: str  # the comment above the rule
    expr: str


def recording_rules(scope: Scope = RULES_SCOPE) -> list[RecordingRule]:
    """The recording rules of dashboards/rules/tritonscale.rules.yaml, in file order."""
    pods = Scope(scope.selector, scope.window, ("namespace", "pod"))
    return [
        RecordingRule(
            "triton:model_request:rate1m", "Successful requests per second.", request_rate(scope)
        ),
        RecordingRule(
            "triton:model_failure:rate1m",
            "Failed requests per second, by Triton's reason (BACKEND, REJECTED, CANCELED, OTHER).",
            failure_rate(scope, by_reason=True),
        ),
        RecordingRule(
            "triton:model_failure:ratio1m",
            "Share of requests that failed; no value (no alert) while a model is idle.",
            failure_ratio(scope),
        ),
        RecordingRule(
            "triton:model_execution:rate1m",
            "Model executions (batches) per second.",
            execution_rate(scope),
        ),
        RecordingRule(
            "triton:model_queue_seconds:rate1m",
            "Seconds spent queueing per second of wall time, summed over requests and pods.",
            queue_seconds_per_second(scope),
        ),
        RecordingRule(
            "triton:model_compute_seconds:rate1m",
            "Seconds spent computing (input + infer + output) per second, summed over "
            "requests and pods.",
            compute_seconds_per_second(scope),
        ),
        RecordingRule(
            "triton:queue_compute:ratio",
            "Queue time per unit of compute time: the policy's queueComputeRatio signal.",
            queue_compute_ratio(scope),
        ),
        RecordingRule(
            "triton:model_queue_seconds_per_request:avg1m",
            "Mean queue time of one request, in seconds.",
            mean_queue_seconds(scope),
        ),
        RecordingRule(
            "triton:model_latency_seconds:avg1m",
            "Mean request latency inside Triton, in seconds.",
            mean_request_seconds(scope),
        ),
        RecordingRule(
            "triton:model_busy_instances:rate1m",
            "Instances' worth of compute: Triton charges a batch's whole compute time to each "
            "request in it, so executions / requests undoes the charge (as the policy does).",
            busy_instances(scope),
        ),
        RecordingRule(
            "triton:model_pending_requests:sum",
            "Requests queued for an instance right now, summed over pods.",
            pending_requests(scope),
        ),
        RecordingRule(
            "triton:model_streams_in_flight:sum",
            "Decoupled requests still streaming, summed over pods, from the gauge a decoupled "
            f"model with an async execute exports ({STREAMS_IN_FLIGHT}).",
            streams_in_flight(scope),
        ),
        RecordingRule(
            "triton:model_pods:count",
            "Pods (scrape targets) that export the model.",
            pods_reporting(scope),
        ),
        RecordingRule(
            "triton:model_busy:fraction",
            "Busy fraction per instance (the policy's busyPerInstance): busy instances over "
            "pods x the operator's live instance count. Triton exports no instance count, so "
            "this needs the operator, and Triton's series need the namespace label of the "
            "autoscaler's.",
            busy_fraction(scope),
        ),
        RecordingRule(
            "triton:pod_gpu_utilization:max",
            "The busiest GPU of each pod, 0..1: Triton's own metric, else the DCGM exporter's.",
            f"{gpu_utilization(pods)}\nor\n{gpu_utilization_dcgm(pods)}",
        ),
    ]


# ---- the prometheus-adapter rule (the chart's HPA) ------------------------------------
ADAPTER_METRIC = BUDGET_DEMAND_RATIO
# Why the rule is what it is; the README prints it above the rule.
ADAPTER_RULE_NOTE = (
    "The HPA adds pods only when instances cannot help: when what the models' loads ask for is "
    "more than a pod's instance budget (or its full GPU) holds. The operator exports that "
    "ratio per namespace and budget; the rule serves it as an External metric, the highest "
    "series of a budget (a standby operator may still hold an older one)."
)


def adapter_rule(scope: Scope = ADAPTER_SCOPE) -> dict[str, object]:
    """The prometheus-adapter external rule that serves `tritonscale_budget_demand_ratio`
    (ADAPTER_RULE_NOTE says why)."""
    return {
        "seriesQuery": f'{BUDGET_DEMAND_RATIO}{{namespace!="",budget!=""}}',
        "resources": {"overrides": {"namespace": {"resource": "namespace"}}},
        "name": {"matches": f"^{BUDGET_DEMAND_RATIO}$", "as": ADAPTER_METRIC},
        "metricsQuery": budget_demand_ratio(scope),
    }
