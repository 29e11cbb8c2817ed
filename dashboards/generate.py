"""Write what is generated from tritonscale.metrics.queries, the one definition of the signals.

    python dashboards/generate.py          # rewrite every output
    python dashboards/generate.py --check  # exit 1 when a committed file differs

(run it with the project's environment, .venv/bin/python, where tritonscale and the reports
extra are installed). The outputs:

- the Grafana dashboards, dashboards/*.json, built with Grafana's own dashboards-as-code
  library, grafana-foundation-sdk, from the readable description below; Grafana, the Helm
  chart (through links in its files/) and `tritonscale dashboards preview` read them;
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

try:
    from grafana_foundation_sdk.builders import common as sdk_common
    from grafana_foundation_sdk.builders import dashboard as sdk
    from grafana_foundation_sdk.builders import prometheus as sdk_prometheus
    from grafana_foundation_sdk.builders import stat as sdk_stat
    from grafana_foundation_sdk.builders import timeseries as sdk_timeseries
    from grafana_foundation_sdk.cog.builder import Builder
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models import common as viz
    from grafana_foundation_sdk.models import dashboard as model
except ImportError:
    # pyproject.toml installs the SDK only where it runs (Python 3.11+, the reports extra).
    sys.exit(
        "generate: grafana-foundation-sdk needs Python 3.11+, this is "
        f"{'.'.join(map(str, sys.version_info[:2]))}; run it with a newer Python"
        if sys.version_info < (3, 11)
        else "generate: grafana-foundation-sdk is not installed: pip install -e '.[reports]'"
    )

HERE = Path(__file__).resolve().parent
RULES = HERE / "rules" / "tritonscale.rules.yaml"
CHART_README = HERE.parent / "charts" / "tritonscale" / "README.md"
DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
GRID_COLUMNS = 24
RATE = "[$__rate_interval]"

# Label matchers. Triton's per-model series, Triton's per-pod series (CPU, GPU: no model
# label) and the operator's series (labelled with the autoscaler's namespace and model).
MODEL_SEL = 'namespace=~"$namespace", pod=~"$pod", model=~"$model"'
POD_SEL = 'namespace=~"$namespace", pod=~"$pod"'
OPERATOR_SEL = 'namespace=~"$namespace", model=~"$model"'
# The ticks' duration is per namespace (tritonscale.control.operator_metrics): no model label.
NAMESPACE_SEL = 'namespace=~"$namespace"'
DECOUPLED_SEL = 'namespace=~"$namespace", pod=~"$pod", model=~"$decoupled"'
BUDGET_SEL = 'namespace=~"$namespace"'


# ---- PromQL: the signals come from tritonscale.metrics.queries ------------------------
PER_MODEL = Scope(MODEL_SEL, "$__rate_interval", ("model",))
ALL_MODELS = Scope(MODEL_SEL, "$__rate_interval", ())
DECOUPLED = Scope(DECOUPLED_SEL, "$__rate_interval", ("model",))
BUDGETS = Scope(BUDGET_SEL, "$__rate_interval", ("namespace", "budget"))


def per_request(metric: str, scope: Scope = PER_MODEL) -> str:
    """Microseconds of a duration counter per successful request: a stage of the latency."""
    return f"{scope.sum(scope.rate(metric))}\n  / {queries.request_rate(scope)}"


def per_execution(rate_of: str, scope: Scope = PER_MODEL) -> str:
    """A rate per model execution (batch): how much one execute call handled."""
    return f"{rate_of}\n  / {queries.execution_rate(scope)}"


# ---- Grafana panels, variables and annotations, through the SDK's builders ------------
PanelBuilder = Builder[model.Panel] | Builder[model.RowPanel]


def target(expr: str, legend: str) -> sdk_prometheus.Dataquery:
    """A range query; its refId is set by the panel, in the order of its queries."""
    return (
        sdk_prometheus.Dataquery().datasource(DATASOURCE).expr(expr).legend_format(legend).range()
    )


def _queries_in_order(targets: list[sdk_prometheus.Dataquery]) -> list[sdk_prometheus.Dataquery]:
    return [query.ref_id(chr(ord("A") + index)) for index, query in enumerate(targets)]


def timeseries(
    title: str,
    description: str,
    unit: str,
    targets: list[sdk_prometheus.Dataquery],
    *,
    width: int = 12,
    min_value: float | None = 0,
) -> sdk_timeseries.Panel:
    panel = (
        sdk_timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .span(width)
        .height(8)
        .unit(unit)
        .draw_style(viz.GraphDrawStyle.LINE)
        .line_width(1)
        .fill_opacity(10)
        .show_points(viz.VisibilityMode.NEVER)
        .span_nulls(False)
        .legend(
            sdk_common.VizLegendOptions()
            # The SDK writes showLegend false unless told: the legend tables are the point.
            .show_legend(True)
            .display_mode(viz.LegendDisplayMode.TABLE)
            .placement(viz.LegendPlacement.BOTTOM)
            .calcs(["mean", "max"])
        )
        .tooltip(
            sdk_common.VizTooltipOptions()
            .mode(viz.TooltipDisplayMode.MULTI)
            .sort(viz.SortOrder.DESCENDING)
        )
        .targets(_queries_in_order(targets))
    )
    return panel if min_value is None else panel.min(min_value)


def stat(
    title: str,
    description: str,
    unit: str,
    expr: str,
    *,
    thresholds: list[tuple[str, float | None]] = (("green", None),),
) -> sdk_stat.Panel:
    return (
        sdk_stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .span(6)
        .height(4)
        .unit(unit)
        .thresholds(
            sdk.ThresholdsConfig()
            .mode(model.ThresholdsMode.ABSOLUTE)
            .steps([model.Threshold(color=color, value=value) for color, value in thresholds])
        )
        .reduce_options(
            sdk_common.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False)
        )
        .color_mode(viz.BigValueColorMode.VALUE)
        .graph_mode(viz.BigValueGraphMode.AREA)
        .targets(_queries_in_order([target(expr, title)]))
    )


def row(title: str) -> sdk.Row:
    return sdk.Row(title).collapsed(False)


def datasource_variable() -> sdk.DatasourceVariable:
    return (
        sdk.DatasourceVariable("datasource")
        .label("Data source")
        .type("prometheus")
        .hide(model.VariableHide.DONT_HIDE)
        .regex("")
    )


def query_variable(
    name: str, label: str, query: str, *, default: list[str] | None = None
) -> sdk.QueryVariable:
    """A multi-value variable from label_values(); "All" means `.*`, which also matches no label."""
    return (
        sdk.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query({"query": query, "refId": f"{name}-values", "qryType": 1})
        .include_all(True)
        .all_value(".*")
        .multi(True)
        .current(
            model.VariableOption(
                selected=True, text=default or ["All"], value=default or ["$__all"]
            )
        )
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(model.VariableSort.ALPHABETICAL_ASC)
        .hide(model.VariableHide.DONT_HIDE)
        .regex("")
        .options([])
    )


def custom_variable(name: str, label: str, values: list[str]) -> sdk.CustomVariable:
    return (
        sdk.CustomVariable(name)
        .label(label)
        .values(",".join(values))
        .include_all(True)
        .all_value(".*")
        .multi(True)
        .current(model.VariableOption(selected=True, text=list(values), value=list(values)))
        .options([model.VariableOption(selected=True, text=v, value=v) for v in values])
        .hide(model.VariableHide.DONT_HIDE)
    )


COUNT_CHANGES = "Instance count changes"


def annotations() -> list[sdk.AnnotationQuery]:
    """Grafana's own annotations, and a mark wherever the autoscaler changed a count."""
    return [
        sdk.AnnotationQuery()
        .built_in(1)
        .datasource(model.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
        .enable(True)
        .hide(True)
        .icon_color("rgba(0, 211, 255, 1)")
        .name("Annotations & Alerts")
        .type("dashboard"),
        sdk.AnnotationQuery()
        .name(COUNT_CHANGES)
        .datasource(DATASOURCE)
        .enable(True)
        .hide(False)
        .icon_color("orange")
        .expr(f"changes(tritonscale_current_instances{{{OPERATOR_SEL}}}{RATE}) > 0"),
    ]


# What Grafana reads that the SDK's types (Grafana 11.6's schema) cannot hold, added to the
# JSON they write: the Prometheus annotation's title and text (fields of that data source's
# annotation support, not of the generic AnnotationQuery), and a query variable's
# `definition`, the query text Grafana lists on the dashboard's variables page.
ANNOTATION_TEXTS = {
    COUNT_CHANGES: {
        "titleFormat": "{{model}}: instance count changed",
        "textFormat": "autoscaler {{namespace}}/{{autoscaler}}",
    }
}


def add_what_the_sdk_cannot_express(board: dict[str, Any]) -> dict[str, Any]:
    for annotation in board["annotations"]["list"]:
        annotation.update(ANNOTATION_TEXTS.get(annotation["name"], {}))
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            variable["definition"] = variable["query"]["query"]
    return board


def check_the_grid(board: model.Dashboard) -> None:
    """The SDK places panels left to right but lets one run past the grid's right edge."""
    for panel in board.panels or []:
        if panel.grid_pos.x + panel.grid_pos.w > GRID_COLUMNS:
            raise GenerationError(
                f"{board.uid}: panel {panel.title!r} runs past column {GRID_COLUMNS} "
                "(its line of panels is wider than the grid)"
            )


def dashboard(
    uid: str,
    title: str,
    description: str,
    variables: list[Builder[model.VariableModel]],
    panels: list[PanelBuilder],
) -> dict[str, Any]:
    builder = (
        sdk.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["tritonscale", "triton"])
        .version(1)
        .editable()
        .tooltip(model.DashboardCursorSync.CROSSHAIR)  # one moment across every panel
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .fiscal_year_start_month(0)
        .live_now(False)
        .week_start("")
        .link(
            sdk.DashboardLink("Tritonscale dashboards")
            .type(model.DashboardLinkType.DASHBOARDS)
            .tags(["tritonscale"])
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
        )
        .annotations(annotations())
        .variables([datasource_variable(), *variables])
    )
    # Ids in order, rows included: the SDK leaves them unset, and Grafana keys panels by id.
    for panel_id, panel in enumerate(panels, start=1):
        if isinstance(panel, sdk.Row):
            builder.with_row(panel.id(panel_id))
        else:
            builder.with_panel(panel.id(panel_id))
    board = builder.build()
    check_the_grid(board)
    return add_what_the_sdk_cannot_express(json.loads(json.dumps(board, cls=JSONEncoder)))


def triton_variables(model_default: list[str] | None = None) -> list[sdk.QueryVariable]:
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
        row("Budgets"),
        timeseries(
            "Budget: instances used, wanted and allowed per pod",
            "Per budget (spec.budget): the instances per pod its members hold or were granted, "
            "what their loads ask for, and instancesPerPod. Wanted above the limit: the "
            "members get what fits (BudgetExhausted) and more pods are the answer.",
            "short",
            [
                target(
                    f"max by (namespace, budget) ({queries.BUDGET_USED}{{{BUDGET_SEL}}})",
                    "used {{budget}}",
                ),
                target(
                    f"max by (namespace, budget) ({queries.BUDGET_WANTED}{{{BUDGET_SEL}}})",
                    "wanted {{budget}}",
                ),
                target(
                    f"max by (namespace, budget) ({queries.BUDGET_LIMIT}{{{BUDGET_SEL}}})",
                    "limit {{budget}}",
                ),
            ],
            width=8,
        ),
        timeseries(
            "Budget demand ratio (the HPA's metric)",
            "What the members' loads ask for over what a pod holds (its budget, or fewer "
            "instances when its GPU is full). The chart's HPA adds pods above 1 and removes "
            "them below it.",
            "none",
            [target(queries.budget_demand_ratio(BUDGETS), "{{budget}}")],
            width=8,
        ),
        timeseries(
            "Budget exhausted",
            "1 while the budget refuses a member instances it asks for (the condition "
            "ScalingLimited with reason BudgetExhausted, and a Warning event on that autoscaler).",
            "short",
            [target(queries.budget_exhausted(BUDGETS), "{{budget}}")],
            width=8,
            min_value=0,
        ),
        row("Latency objectives"),
        timeseries(
            "Latency: objective, predicted and measured",
            "Per root with a latency objective (spec.targets.latency): the bound on its "
            "quantile, the quantile the set planner predicts at the counts it chose (at the "
            "offered rate with headroom; a gap means it could not be met within the budget), "
            "and the mean time a request spent in Triton over the metrics window (Triton's "
            "counters give means, not quantiles).",
            "s",
            [
                target(
                    f"max by (namespace, autoscaler, model) "
                    f"({queries.LATENCY_OBJECTIVE_SECONDS}{{{OPERATOR_SEL}}})",
                    "objective {{autoscaler}}",
                ),
                target(
                    f"max by (namespace, autoscaler, model) "
                    f"({queries.LATENCY_PREDICTED_SECONDS}{{{OPERATOR_SEL}}})",
                    "predicted {{autoscaler}}",
                ),
                target(
                    f"max by (namespace, autoscaler, model) "
                    f"({queries.LATENCY_MEASURED_MEAN_SECONDS}{{{OPERATOR_SEL}}})",
                    "measured mean {{autoscaler}}",
                ),
            ],
            width=24,
        ),
        row("Decisions"),
        timeseries(
            "Decisions by direction and reason",
            "Decisions per minute by direction (up, down, none) and reason (HighUtilization, "
            "WithinTolerance, TooManyInstances, GpuSaturated, BudgetExhausted, NoGain, ...; "
            "see the contract doc).",
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
            "Time of one control tick end to end (metrics query, decision, loads), over the "
            "namespace's autoscalers (whatever model is chosen above). Loads take "
            "0.2-1.5 s per pod; ticks longer than intervalSeconds delay the next one.",
            "s",
            [
                target(
                    f"histogram_quantile({q}, sum by (le) "
                    f"(rate(tritonscale_reconcile_duration_seconds_bucket{{{NAMESPACE_SEL}}}{RATE})))",
                    f"p{label}",
                )
                for q, label in (("0.5", "50"), ("0.95", "95"))
            ]
            + [
                target(
                    f"sum(rate(tritonscale_reconcile_duration_seconds_sum{{{NAMESPACE_SEL}}}{RATE}))\n"
                    f"  / sum(rate(tritonscale_reconcile_duration_seconds_count{{{NAMESPACE_SEL}}}{RATE}))",
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
        {"rules": {"external": [queries.adapter_rule()]}},
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
