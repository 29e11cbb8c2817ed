"""Write what is generated from tritonscale.metrics.queries, the one definition of the signals.

    python dashboards/generate.py          # rewrite every output
    python dashboards/generate.py --check  # exit 1 when a committed file differs

(run it with the project's environment, .venv/bin/python, where tritonscale is installed).
The outputs:

- the Grafana dashboards, dashboards/*.json, from the readable description below; Grafana,
  the Helm chart (through links in its files/) and `tritonscale dashboards preview` read them;
- the recording rules of dashboards/rules/tritonscale.rules.yaml, between its
  `generated:start` and `generated:end` lines (the alerts around them are written by hand);
- the prometheus-adapter rule of charts/tritonscale/README.md, between its
  `adapter-rule:start` and `adapter-rule:end` markers.

Every dashboard query selects with `=~"$var"` and every variable offers "All" as `.*`, so the
dashboards work on Kubernetes (series labelled namespace and pod) and on a local
Prometheus (series with job and instance only): in Prometheus `label=~".*"` also matches
a series that lacks the label.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import yaml

from tritonscale.metrics import queries
from tritonscale.metrics.queries import Scope

HERE = Path(__file__).resolve().parent
RULES = HERE / "rules" / "tritonscale.rules.yaml"
CHART_README = HERE.parent / "charts" / "tritonscale" / "README.md"
SCHEMA_VERSION = 41  # Grafana 12's classic dashboard JSON model
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RATE = "[$__rate_interval]"

# Label matchers. Triton's per-model series, Triton's per-pod series (CPU, GPU: no model
# label) and the operator's series (labelled with the autoscaler's namespace and model).
MODEL_SEL = 'namespace=~"$namespace", pod=~"$pod", model=~"$model"'
POD_SEL = 'namespace=~"$namespace", pod=~"$pod"'
OPERATOR_SEL = 'namespace=~"$namespace", model=~"$model"'
DECOUPLED_SEL = 'namespace=~"$namespace", pod=~"$pod", model=~"$decoupled"'


# ---- PromQL: the signals come from tritonscale.metrics.queries ------------------------
PER_MODEL = Scope(MODEL_SEL, "$__rate_interval", ("model",))
ALL_MODELS = Scope(MODEL_SEL, "$__rate_interval", ())
DECOUPLED = Scope(DECOUPLED_SEL, "$__rate_interval", ("model",))


def per_request(metric: str, scope: Scope = PER_MODEL) -> str:
    """Microseconds of a duration counter per successful request: a stage of the latency."""
    return f"{scope.sum(scope.rate(metric))}\n  / {queries.request_rate(scope)}"


def per_execution(rate_of: str, scope: Scope = PER_MODEL) -> str:
    """A rate per model execution (batch): how much one execute call handled."""
    return f"{rate_of}\n  / {queries.execution_rate(scope)}"


# ---- Grafana JSON helpers --------------------------------------------------------------
def target(expr: str, legend: str) -> dict[str, Any]:
    return {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "range": True}


def timeseries(
    title: str,
    description: str,
    unit: str,
    targets: list[dict[str, Any]],
    *,
    width: int = 12,
    min_value: float | None = 0,
) -> dict[str, Any]:
    defaults: dict[str, Any] = {
        "unit": unit,
        "custom": {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": False,
        },
    }
    if min_value is not None:
        defaults["min"] = min_value
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "gridPos": {"w": width, "h": 8},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["mean", "max"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": targets,
    }


def stat(
    title: str,
    description: str,
    unit: str,
    expr: str,
    *,
    thresholds: list[tuple[str, float | None]] = (("green", None),),
) -> dict[str, Any]:
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "gridPos": {"w": 6, "h": 4},
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "thresholds": {
                    "mode": "absolute",
                    "steps": [{"color": color, "value": value} for color, value in thresholds],
                },
            },
            "overrides": [],
        },
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
        },
        "targets": [target(expr, title)],
    }


def row(title: str) -> dict[str, Any]:
    return {
        "type": "row",
        "title": title,
        "collapsed": False,
        "panels": [],
        "gridPos": {"w": 24, "h": 1},
    }


def layout(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Place panels left to right, wrapping at Grafana's 24 columns; ids and refIds in order."""
    x = y = line_height = 0
    for panel_id, panel in enumerate(panels, start=1):
        grid = panel["gridPos"]
        if panel["type"] == "row" or x + grid["w"] > 24:
            x, y, line_height = 0, y + line_height, 0
        grid.update(x=x, y=y)
        x += grid["w"]
        line_height = max(line_height, grid["h"])
        panel["id"] = panel_id
        for index, query in enumerate(panel.get("targets", [])):
            query["refId"] = chr(ord("A") + index)
    return panels


def datasource_variable() -> dict[str, Any]:
    return {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "refresh": 1,
        "regex": "",
    }


def query_variable(
    name: str, label: str, query: str, *, default: list[str] | None = None
) -> dict[str, Any]:
    """A multi-value variable from label_values(); "All" means `.*`, which also matches no label."""
    values = default or ["$__all"]
    texts = default or ["All"]
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": f"{name}-values", "qryType": 1},
        "includeAll": True,
        "allValue": ".*",
        "multi": True,
        "current": {"selected": True, "text": texts, "value": values},
        "refresh": 2,
        "sort": 1,
        "hide": 0,
        "regex": "",
        "options": [],
    }


def custom_variable(name: str, label: str, values: list[str]) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "custom",
        "query": ",".join(values),
        "includeAll": True,
        "allValue": ".*",
        "multi": True,
        "current": {"selected": True, "text": list(values), "value": list(values)},
        "options": [{"selected": True, "text": v, "value": v} for v in values],
        "hide": 0,
    }


def annotations() -> list[dict[str, Any]]:
    """Grafana's own annotations, and a mark wherever the autoscaler changed a count."""
    return [
        {
            "builtIn": 1,
            "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True,
            "hide": True,
            "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts",
            "type": "dashboard",
        },
        {
            "name": "Instance count changes",
            "datasource": DATASOURCE,
            "enable": True,
            "hide": False,
            "iconColor": "orange",
            "expr": (f"changes(tritonscale_current_instances{{{OPERATOR_SEL}}}{RATE}) > 0"),
            "titleFormat": "{{model}}: instance count changed",
            "textFormat": "autoscaler {{namespace}}/{{autoscaler}}",
            "useValueForTime": False,
        },
    ]


def dashboard(
    uid: str,
    title: str,
    description: str,
    variables: list[dict[str, Any]],
    panels: list[dict[str, Any]],
) -> dict[str, Any]:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["tritonscale", "triton"],
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,  # shared crosshair: one moment across every panel
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "weekStart": "",
        "links": [
            {
                "title": "Tritonscale dashboards",
                "type": "dashboards",
                "tags": ["tritonscale"],
                "asDropdown": True,
                "includeVars": True,
                "keepTime": True,
            }
        ],
        "annotations": {"list": annotations()},
        "templating": {"list": [datasource_variable(), *variables]},
        "panels": layout(panels),
    }


def triton_variables(model_default: list[str] | None = None) -> list[dict[str, Any]]:
    return [
        query_variable("namespace", "Namespace", "label_values(nv_inference_count, namespace)"),
        query_variable(
            "pod", "Triton pod", 'label_values(nv_inference_count{namespace=~"$namespace"}, pod)'
        ),
        query_variable(
            "model",
            "Model",
            'label_values(nv_inference_count{namespace=~"$namespace", pod=~"$pod"}, model)',
            default=model_default,
        ),
    ]


# ---- the dashboards -------------------------------------------------------------------
def triton_overview() -> dict[str, Any]:
    panels = [
        row("At a glance"),
        stat(
            "Requests per second",
            "Successful inference requests per second, all selected models and pods.",
            "reqps",
            queries.request_rate(ALL_MODELS),
        ),
        stat(
            "Failed requests",
            "Share of requests Triton counted as failed. Above a few percent, open "
            "'Failed requests by model and reason' below. An error response a Python model "
            "returns for one request counts as a success in Triton 2.51.",
            "percentunit",
            queries.failure_ratio(ALL_MODELS),
            thresholds=[("green", None), ("orange", 0.01), ("red", 0.05)],
        ),
        stat(
            "Worst p99 latency",
            "The highest 99th-percentile request latency of any model on any pod (Triton's "
            "summaries over their recent window; needs --metrics-config summary_latencies=true).",
            "µs",
            "max(nv_inference_request_summary_us{" + MODEL_SEL + ', quantile="0.99"})',
        ),
        stat(
            "Pending requests",
            "Requests waiting in Triton's queues right now, all selected models and pods. "
            "A number that keeps growing means the instances cannot keep up.",
            "short",
            queries.pending_requests(ALL_MODELS),
        ),
        row("Traffic"),
        timeseries(
            "Requests per second by model",
            "Successful inference requests per second, per model, summed over the selected pods.",
            "reqps",
            [target(queries.request_rate(PER_MODEL), "{{model}}")],
        ),
        timeseries(
            "Failed requests by model and reason",
            "Failed requests per second, by Triton's reason. REJECTED: refused by the "
            "scheduler (queue full, or a timeout expired in the queue: a BLS branch that times "
            "out shows here, on the branch); CANCELED: the client gave up; BACKEND: the "
            "backend itself failed; OTHER: anything else. Triton 2.51 counts an error response "
            "that a Python model returns for one request (bad input, a branch failure as the "
            "pipeline reports it) as a success: watch the clients' error rate too.",
            "reqps",
            [target(queries.failure_rate(PER_MODEL, by_reason=True), "{{model}} {{reason}}")],
        ),
        row("Latency"),
        timeseries(
            "Average request latency",
            "Mean end-to-end time of a request inside Triton (queue + compute), from the "
            "cumulative duration counters. A BLS model's time includes waiting for the "
            "models it calls.",
            "s",
            [target(queries.mean_request_seconds(PER_MODEL), "{{model}}")],
        ),
        timeseries(
            "Request latency p50 / p95 / p99",
            "Quantiles of the request latency from Triton's summaries (recent window; the "
            "worst pod per model). Empty unless Triton runs with --metrics-config "
            "summary_latencies=true; a model idle for a while shows gaps.",
            "µs",
            [
                target(
                    f'max by (model) (nv_inference_request_summary_us{{{MODEL_SEL}, quantile="{q}"}})',
                    f"{{{{model}}}} p{label}",
                )
                for q, label in (("0.5", "50"), ("0.95", "95"), ("0.99", "99"))
            ],
        ),
        timeseries(
            "Queue time per request",
            "Mean time a request waited for a free model instance (and the dynamic batcher's "
            "delay). Growing queue time with flat compute time means too few instances.",
            "s",
            [target(queries.mean_queue_seconds(PER_MODEL), "{{model}}")],
        ),
        timeseries(
            "Queue time / compute time",
            "Time spent waiting per unit of time spent computing, per model: the signal the "
            "autoscaler compares with its queueComputeRatio target (0.5 by default). Above 1 "
            "requests wait longer than they run.",
            "none",
            [target(queries.queue_compute_ratio(PER_MODEL), "{{model}}")],
        ),
        row("Queue and batching"),
        timeseries(
            "Pending requests by model",
            "Requests waiting for an instance right now (nv_inference_pending_request_count).",
            "short",
            [target(queries.pending_requests(PER_MODEL), "{{model}}")],
            width=8,
        ),
        timeseries(
            "Batching: inferences and requests per execution",
            "How many inferences (rows) and requests each model execution handled. 1 means no "
            "batching; a higher number means the dynamic batcher is combining requests.",
            "short",
            [
                target(per_execution(queries.inference_rate(PER_MODEL)), "{{model}} inferences"),
                target(per_execution(queries.request_rate(PER_MODEL)), "{{model}} requests"),
            ],
            width=8,
        ),
        timeseries(
            "Busy instances",
            "How many model instances' worth of compute each model used (compute seconds per "
            "second, corrected for batching), summed over pods. Compare with the instance "
            "count: close to it means every instance is busy.",
            "short",
            [target(queries.busy_instances(PER_MODEL), "{{model}}")],
            width=8,
        ),
        row("GPU"),
        timeseries(
            "GPU utilization",
            "Per GPU, from Triton (nv_gpu_utilization) and from the DCGM exporter "
            "(DCGM_FI_DEV_GPU_UTIL). Near 100% the GPU is the limit: more instances will "
            "not help, more pods will. Empty on CPU-only pods.",
            "percentunit",
            [
                target(f"nv_gpu_utilization{{{POD_SEL}}}", "triton {{pod}} {{gpu_uuid}}"),
                target(f"DCGM_FI_DEV_GPU_UTIL{{{POD_SEL}}} / 100", "dcgm {{pod}} gpu {{gpu}}"),
            ],
            width=8,
        ),
        timeseries(
            "GPU memory used",
            "Per GPU: memory in use and the total, from Triton and from the DCGM exporter "
            "(DCGM_FI_DEV_FB_USED is in MiB). Each model instance on the GPU holds its own "
            "copy of the weights.",
            "bytes",
            [
                target(
                    f"nv_gpu_memory_used_bytes{{{POD_SEL}}}", "triton used {{pod}} {{gpu_uuid}}"
                ),
                target(
                    f"nv_gpu_memory_total_bytes{{{POD_SEL}}}", "triton total {{pod}} {{gpu_uuid}}"
                ),
                target(
                    f"DCGM_FI_DEV_FB_USED{{{POD_SEL}}} * 1048576", "dcgm used {{pod}} gpu {{gpu}}"
                ),
            ],
            width=8,
        ),
        timeseries(
            "GPU power",
            "Per GPU: power drawn and the power limit, from Triton (nv_gpu_power_usage, "
            "nv_gpu_power_limit). Sitting at the limit means the GPU is throttling.",
            "watt",
            [
                target(f"nv_gpu_power_usage{{{POD_SEL}}}", "used {{pod}} {{gpu_uuid}}"),
                target(f"nv_gpu_power_limit{{{POD_SEL}}}", "limit {{pod}} {{gpu_uuid}}"),
            ],
            width=8,
        ),
        row("CPU and memory"),
        timeseries(
            "CPU utilization",
            "Triton's nv_cpu_utilization: the CPU use of the machine the pod runs on, as "
            "Triton reads it from /proc/stat (0-1), not the pod's own share. Python models "
            "and BLS run on the CPU even on GPU pods.",
            "percentunit",
            [target(f"nv_cpu_utilization{{{POD_SEL}}}", "{{pod}} {{instance}}")],
        ),
        timeseries(
            "Memory used",
            "Triton's nv_cpu_memory_used_bytes and nv_cpu_memory_total_bytes: RAM of the "
            "machine as Triton sees it.",
            "bytes",
            [
                target(f"nv_cpu_memory_used_bytes{{{POD_SEL}}}", "used {{pod}} {{instance}}"),
                target(f"nv_cpu_memory_total_bytes{{{POD_SEL}}}", "total {{pod}} {{instance}}"),
            ],
        ),
    ]
    return dashboard(
        "tritonscale-triton-overview",
        "Tritonscale / Triton overview",
        "Traffic, failures, latency, queueing, batching and resources of every Triton model.",
        triton_variables(),
        panels,
    )


PIPELINE_MODELS = ["pipeline_async", "branch_embed", "branch_classify", "branch_rank"]
DECOUPLED_MODELS = ["bls_decoupled_async", "bls_decoupled_sync", "square_int32"]


def bls_pipeline() -> dict[str, Any]:
    stage_panels = [
        timeseries(
            f"{name} time per request",
            f"Mean {what} per request, per model, side by side.{why}",
            "µs",
            [target(per_request(metric), "{{model}}")],
            width=6,
        )
        for name, what, metric, why in (
            (
                "Queue",
                "time waiting for a free instance",
                "nv_inference_queue_duration_us",
                " A branch that queues slows every pipeline request.",
            ),
            (
                "Compute input",
                "time copying inputs to the model",
                "nv_inference_compute_input_duration_us",
                "",
            ),
            (
                "Compute infer",
                "time inside the model's execute",
                "nv_inference_compute_infer_duration_us",
                " For pipeline_async it includes waiting for its slowest branch: close to the "
                "slowest branch's latency means the parent only waits.",
            ),
            (
                "Compute output",
                "time copying outputs back",
                "nv_inference_compute_output_duration_us",
                "",
            ),
        )
    ]
    panels = [
        row("The pipeline and its branches, side by side"),
        timeseries(
            "Requests per second",
            "Successful requests per second of the pipeline and of each branch. With batching "
            "a branch sees fewer, larger requests than the pipeline (one per pipeline execution).",
            "reqps",
            [target(queries.request_rate(PER_MODEL), "{{model}}")],
            width=8,
        ),
        timeseries(
            "Average request latency",
            "Mean time a request spends in Triton, per model. The pipeline's latency is its own "
            "work plus the slowest branch (the branches run concurrently).",
            "s",
            [target(queries.mean_request_seconds(PER_MODEL), "{{model}}")],
            width=8,
        ),
        timeseries(
            "Failed requests by model and reason",
            "Failures per second. A branch whose requests time out in its queue shows REJECTED "
            "on the branch. The pipeline answers those requests with error responses, which "
            "Triton 2.51 counts as pipeline successes: the failure shows on the branch only.",
            "reqps",
            [target(queries.failure_rate(PER_MODEL, by_reason=True), "{{model}} {{reason}}")],
            width=8,
        ),
        row("Where the time goes (per request, per stage)"),
        *stage_panels,
        timeseries(
            "Queue time / compute time",
            "Waiting per unit of computing, per model. The branch with the highest ratio is "
            "the one to give instances first.",
            "none",
            [target(queries.queue_compute_ratio(PER_MODEL), "{{model}}")],
            width=8,
        ),
        timeseries(
            "Busy instances",
            "Instances' worth of compute per model (compute seconds per second, corrected for "
            "batching). A BLS parent counts as busy while it waits for its branches.",
            "short",
            [target(queries.busy_instances(PER_MODEL), "{{model}}")],
            width=8,
        ),
        timeseries(
            "Pending requests",
            "Requests waiting for an instance right now, per model.",
            "short",
            [target(queries.pending_requests(PER_MODEL), "{{model}}")],
            width=8,
        ),
        row("Batching"),
        timeseries(
            "Requests and inferences per execution",
            "How many requests (and rows) one execute call handled. pipeline_async stacks the "
            "requests of one execute into one batch per branch call.",
            "short",
            [
                target(per_execution(queries.request_rate(PER_MODEL)), "{{model}} requests"),
                target(per_execution(queries.inference_rate(PER_MODEL)), "{{model}} inferences"),
            ],
            width=24,
        ),
        row("Decoupled BLS (streaming)"),
        timeseries(
            "Decoupled requests per second",
            "Requests (streams) per second of the decoupled models and their BLS callers. "
            "Triton 2.51 counts requests, not the responses of a stream: square_int32 sends "
            "IN responses per request.",
            "reqps",
            [target(queries.request_rate(DECOUPLED), "{{model}}")],
            width=8,
        ),
        timeseries(
            "Decoupled requests in flight",
            "Requests a decoupled model holds now. 'in Triton': the mean number inside Triton "
            "(queued or in execute: request seconds per second), right for a model whose "
            "execute holds each stream (square_int32). A model whose async execute returns at "
            "once is counted done when its stream begins: only the gauge it exports itself "
            f"({queries.STREAMS_IN_FLIGHT}), 'streams', sees its streams.",
            "short",
            [
                target(queries.request_seconds_per_second(DECOUPLED), "{{model}} in Triton"),
                target(queries.streams_in_flight(DECOUPLED), "{{model}} streams"),
            ],
            width=8,
        ),
        timeseries(
            "Decoupled failures by reason",
            "Failed decoupled requests per second (a stream that errors counts once).",
            "reqps",
            [target(queries.failure_rate(DECOUPLED, by_reason=True), "{{model}} {{reason}}")],
            width=8,
        ),
    ]
    variables = [
        *triton_variables(model_default=PIPELINE_MODELS),
        custom_variable("decoupled", "Decoupled models", DECOUPLED_MODELS),
    ]
    return dashboard(
        "tritonscale-bls-pipeline",
        "Tritonscale / BLS pipeline",
        "The async BLS pipeline and its branches side by side: where a request's time goes, "
        "batching, and the decoupled BLS models.",
        variables,
        panels,
    )


def autoscaler() -> dict[str, Any]:
    def signal(name: str) -> str:
        return (
            f"max by (namespace, autoscaler, model) (tritonscale_observed_signal{{{OPERATOR_SEL}, "
            f'signal="{name}"}})'
        )

    panels = [
        row("At a glance"),
        stat(
            "Autoscalers reporting",
            "Autoscalers (one per model and pod set) that finished a reconcile recently.",
            "short",
            f"count(tritonscale_last_reconcile_timestamp_seconds{{{OPERATOR_SEL}}})",
        ),
        stat(
            "Oldest last reconcile",
            "Seconds since the least recent autoscaler finished a tick. It should stay near "
            "intervalSeconds (15 s by default); minutes mean the operator is stuck or down.",
            "s",
            f"max(time() - tritonscale_last_reconcile_timestamp_seconds{{{OPERATOR_SEL}}})",
            thresholds=[("green", None), ("orange", 60), ("red", 180)],
        ),
        stat(
            "Scale decisions per minute",
            "Decisions that changed an instance count (direction up or down), per minute.",
            "short",
            f'60 * sum(rate(tritonscale_decisions_total{{{OPERATOR_SEL}, direction!="none"}}{RATE}))',
        ),
        stat(
            "Model loads per minute",
            "Instance-count changes sent to Triton pods (load with a config override), per minute.",
            "short",
            f"60 * sum(rate(tritonscale_actuations_total{{{OPERATOR_SEL}}}{RATE}))",
        ),
        row("Instances"),
        timeseries(
            "Desired vs current instances",
            "Per autoscaler: the count the last decision asked for and the live count on the "
            "pods. A gap that persists means loads fail or the behavior's rate limits hold.",
            "short",
            [
                target(
                    f"max by (namespace, autoscaler, model) (tritonscale_desired_instances{{{OPERATOR_SEL}}})",
                    "desired {{autoscaler}}",
                ),
                target(
                    f"max by (namespace, autoscaler, model) (tritonscale_current_instances{{{OPERATOR_SEL}}})",
                    "current {{autoscaler}}",
                ),
            ],
        ),
        timeseries(
            "Busy instances (Triton) vs current instances",
            "What the load needs, measured from Triton (compute seconds per second corrected "
            "for batching, summed over pods), against the live instance count per pod.",
            "short",
            [
                target(queries.busy_instances(PER_MODEL), "busy {{model}}"),
                target(
                    f"max by (model) (tritonscale_current_instances{{{OPERATOR_SEL}}})",
                    "current per pod {{model}}",
                ),
            ],
        ),
        row("Decisions"),
        timeseries(
            "Decisions by direction and reason",
            "Decisions per minute by direction (up, down, none) and reason (HighUtilization, "
            "WithinTolerance, TooManyInstances, GpuSaturated, ...; see the contract doc).",
            "short",
            [
                target(
                    f"60 * sum by (model, direction, reason) "
                    f"(rate(tritonscale_decisions_total{{{OPERATOR_SEL}}}{RATE}))",
                    "{{model}} {{direction}} {{reason}}",
                )
            ],
        ),
        timeseries(
            "Model loads by result",
            "Loads sent to Triton pods per minute, by result. Failures back off exponentially "
            "and show as FailedRescale errors.",
            "short",
            [
                target(
                    f"60 * sum by (model, result) "
                    f"(rate(tritonscale_actuations_total{{{OPERATOR_SEL}}}{RATE}))",
                    "{{model}} {{result}}",
                )
            ],
        ),
        row("Signals the policy used"),
        timeseries(
            "Busy per instance",
            "Busy fraction per instance as the policy saw it (target: spec.targets.utilization, "
            "0.7 by default).",
            "percentunit",
            [target(signal("busy_per_instance"), "{{autoscaler}}")],
            width=8,
        ),
        timeseries(
            "Queue / compute ratio",
            "Queue time per unit of compute time as the policy saw it (target: "
            "spec.targets.queueComputeRatio, 0.5 by default).",
            "none",
            [target(signal("queue_compute_ratio"), "{{autoscaler}}")],
            width=8,
        ),
        timeseries(
            "Pending per instance",
            "Pending requests per instance as the policy saw it (target: "
            "spec.targets.pendingPerInstance, 2 by default). For a decoupled model that "
            "exports its streams, the streams in flight (and queued requests) per instance: "
            "the signal that sizes it, against the same target.",
            "short",
            [
                target(signal("pending_per_instance"), "pending {{autoscaler}}"),
                target(signal("streams_in_flight_per_instance"), "streams {{autoscaler}}"),
            ],
            width=8,
        ),
        timeseries(
            "Request rate seen by the policy",
            "Successful requests per second of the model over the policy's window.",
            "reqps",
            [target(signal("request_rate"), "{{autoscaler}}")],
        ),
        timeseries(
            "GPU utilization and memory seen by the policy",
            "The busiest GPU of the pod set. At or above the ceilings (0.9 by default) the "
            "policy adds no instances (GpuSaturated): more pods are the answer. Empty on CPU.",
            "percentunit",
            [
                target(signal("gpu_utilization"), "utilization {{autoscaler}}"),
                target(signal("gpu_memory_fraction"), "memory {{autoscaler}}"),
            ],
        ),
        row("The control loop"),
        timeseries(
            "Reconcile duration",
            "Time of one control tick end to end (metrics query, decision, loads). Loads take "
            "0.2-1.5 s per pod; ticks longer than intervalSeconds delay the next one.",
            "s",
            [
                target(
                    f"histogram_quantile({q}, sum by (le) "
                    f"(rate(tritonscale_reconcile_duration_seconds_bucket{{{OPERATOR_SEL}}}{RATE})))",
                    f"p{label}",
                )
                for q, label in (("0.5", "50"), ("0.95", "95"))
            ]
            + [
                target(
                    f"sum(rate(tritonscale_reconcile_duration_seconds_sum{{{OPERATOR_SEL}}}{RATE}))\n"
                    f"  / sum(rate(tritonscale_reconcile_duration_seconds_count{{{OPERATOR_SEL}}}{RATE}))",
                    "average",
                )
            ],
            width=8,
        ),
        timeseries(
            "Reconcile errors by reason",
            "Failed ticks per minute. FailedGetMetrics: Prometheus or Triton unreachable; "
            "FailedRescale: a load failed; NoReadyPods: the selector matches no ready pod; "
            "InvalidSpec: fix the object.",
            "short",
            [
                target(
                    f"60 * sum by (model, reason) "
                    f"(rate(tritonscale_reconcile_errors_total{{{OPERATOR_SEL}}}{RATE}))",
                    "{{model}} {{reason}}",
                )
            ],
            width=8,
        ),
        timeseries(
            "Time since the last reconcile",
            "Seconds since each autoscaler last finished a tick. A line that climbs means that "
            "autoscaler is no longer reconciled.",
            "s",
            [
                target(
                    f"time() - max by (namespace, autoscaler, model) "
                    f"(tritonscale_last_reconcile_timestamp_seconds{{{OPERATOR_SEL}}})",
                    "{{autoscaler}}",
                )
            ],
            width=8,
        ),
    ]
    variables = [
        query_variable(
            "namespace", "Namespace", "label_values(tritonscale_desired_instances, namespace)"
        ),
        query_variable(
            "pod", "Triton pod", 'label_values(nv_inference_count{namespace=~"$namespace"}, pod)'
        ),
        query_variable(
            "model",
            "Model",
            'label_values(tritonscale_desired_instances{namespace=~"$namespace"}, model)',
        ),
    ]
    return dashboard(
        "tritonscale-autoscaler",
        "Tritonscale / Autoscaler",
        "What the instance-group autoscaler decided, why, on which signals, and whether its "
        "control loop is healthy.",
        variables,
        panels,
    )


DASHBOARDS = {
    "triton-overview": triton_overview,
    "bls-pipeline": bls_pipeline,
    "autoscaler": autoscaler,
}


def render(build: Any) -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


# ---- the recording rules and the prometheus-adapter rule --------------------------------
RULES_START = "  # generated:start"
RULES_END = "  # generated:end"
ADAPTER_START = "<!-- adapter-rule:start -->"
ADAPTER_END = "<!-- adapter-rule:end -->"


class GenerationError(Exception):
    """A file lacks the markers of its generated block; one line naming it."""


def between(text: str, start: str, end: str, block: str, name: str) -> str:
    """`text` with the lines between the `start` and `end` marker lines replaced by `block`."""
    lines = text.splitlines(keepends=True)
    begins = [i for i, line in enumerate(lines) if line.startswith(start)]
    ends = [i for i, line in enumerate(lines) if line.startswith(end)]
    if len(begins) != 1 or len(ends) != 1 or ends[0] < begins[0]:
        raise GenerationError(f"{name}: needs one {start.strip()!r} line, then one {end.strip()!r}")
    return "".join(lines[: begins[0] + 1]) + block + "".join(lines[ends[0] :])


def recording_rules_yaml() -> str:
    """The recording-rule group, as it sits in the rules file (under `groups:`)."""
    out = ["  - name: tritonscale.triton.recording\n", "    rules:\n"]
    for rule in queries.recording_rules():
        for line in textwrap.wrap(rule.description, 90):
            out.append(f"      # {line}\n")
        out.append(f"      - record: {rule.record}\n")
        if "\n" in rule.expr:
            out.append("        expr: |\n")
            out += [f"          {line}\n" for line in rule.expr.splitlines()]
        else:
            out.append(f"        expr: {rule.expr}\n")
    return "".join(out)


class _BlockDumper(yaml.SafeDumper):
    """Writes multi-line strings (PromQL) as literal blocks, the way people write them."""


_BlockDumper.add_representer(
    str,
    lambda dumper, value: dumper.represent_scalar(
        "tag:yaml.org,2002:str", value, style="|" if "\n" in value else None
    ),
)


def adapter_rule_markdown() -> str:
    """The README's prometheus-adapter rule block: a sentence and the values to add."""
    values = yaml.dump(
        {"rules": {"custom": [queries.adapter_rule()]}},
        Dumper=_BlockDumper,
        sort_keys=False,
        width=100,
    )
    return f"{textwrap.fill(queries.ADAPTER_RULE_NOTE, 100)}\n\n```yaml\n{values}```\n"


def outputs() -> dict[Path, str]:
    """Every generated file and the text it must hold."""
    files = {HERE / f"{name}.json": render(build) for name, build in DASHBOARDS.items()}
    files[RULES] = between(
        RULES.read_text(), RULES_START, RULES_END, recording_rules_yaml(), RULES.name
    )
    files[CHART_README] = between(
        CHART_README.read_text(),
        ADAPTER_START,
        ADAPTER_END,
        adapter_rule_markdown(),
        "charts/tritonscale/README.md",
    )
    return files


def _shown(path: Path) -> str:
    return (
        path.relative_to(HERE.parent).as_posix() if path.is_relative_to(HERE.parent) else str(path)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a file differs")
    args = parser.parse_args(argv)
    try:
        files = outputs()
    except GenerationError as error:
        print(f"generate: {error}", file=sys.stderr)
        return 1
    stale = []
    for path, text in files.items():
        if not path.is_file() or path.read_text() != text:
            stale.append(_shown(path))
            if not args.check:
                path.write_text(text)
    if stale and args.check:
        print(f"stale: {', '.join(stale)}; run python dashboards/generate.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
