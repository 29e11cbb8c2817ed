"""The Grafana dashboards: generated from dashboards/generate.py, linted, and every query
proven against a real Prometheus that scraped the real Triton under load and the real
operator metrics (real control ticks of `tritonscale.control.reconcile`), plus the preview command.
"""

from __future__ import annotations

import asyncio
import copy
import importlib.util
import json
import math
import re
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.http
import yaml
from tritonclient.utils import InferenceServerException

from tests.dashboard_load import stream_load
from tests.tooling import missing, require_local_triton
from tritonscale.local.ports import free_port
from tritonscale.local.prometheus_server import (
    LocalPrometheus,
    LocalPrometheusError,
    prometheus_binary,
)
from tritonscale.local.triton_server import LocalTriton
from tritonscale.metrics import queries
from tritonscale.reports import dashboards as boards

REPO = Path(__file__).resolve().parents[1]
RULES = REPO / "dashboards" / "rules" / "tritonscale.rules.yaml"
CHART_README = REPO / "charts" / "tritonscale" / "README.md"
DASHBOARDS = boards.load_dashboards()
QUERIES = [q for name, board in DASHBOARDS.items() for q in boards.queries(board, name)]
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

# Queries that can only return data where a GPU (and for DCGM_*, the DCGM exporter) is:
# on a CPU-only machine they must still parse and run. (dashboard, panel title, refId).
GPU_ONLY = {
    ("triton-overview", "GPU utilization", "A"),
    ("triton-overview", "GPU utilization", "B"),
    ("triton-overview", "GPU memory used", "A"),
    ("triton-overview", "GPU memory used", "B"),
    ("triton-overview", "GPU memory used", "C"),
    ("triton-overview", "GPU power", "A"),
    ("triton-overview", "GPU power", "B"),
    ("autoscaler", "GPU utilization and memory seen by the policy", "A"),
    ("autoscaler", "GPU utilization and memory seen by the policy", "B"),
}
# Queries on the gauge a decoupled model with an async execute exports itself: no model of
# the repository the tests serve exports it (tests/test_decoupled_signals.py serves one that does), so
# here they must still parse and run.
MODEL_GAUGE_ONLY = {
    ("bls-pipeline", "Decoupled requests in flight", "B"),
    ("autoscaler", "Pending per instance", "B"),
}
# What Triton (2.51, with GPUs) and the DCGM exporter export that a CPU-only Triton does not.
GPU_METRIC_NAMES = {
    "nv_gpu_utilization",
    "nv_gpu_memory_used_bytes",
    "nv_gpu_memory_total_bytes",
    "nv_gpu_power_usage",
    "nv_gpu_power_limit",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
}
METRIC_NAME = re.compile(r"\b(nv_[a-z_]+|DCGM_[A-Z_]+|tritonscale_[a-z_]+)\b")


def key(query: boards.Query) -> tuple[str, str, str]:
    return (query.dashboard, query.panel, query.ref_id)


def query_id(query: boards.Query) -> str:
    return f"{query.dashboard}/{query.panel}/{query.ref_id}"


# ---- generated and linted ---------------------------------------------------------------
# The generator builds with grafana-foundation-sdk, which needs Python 3.11+ (pyproject.toml
# installs it there only); on 3.10 the generator says so in one line and these tests skip.
SDK_PYTHON = sys.version_info >= (3, 11)
needs_sdk = pytest.mark.skipif(not SDK_PYTHON, reason="grafana-foundation-sdk needs Python 3.11+")


def _generator():
    spec = importlib.util.spec_from_file_location("generate", REPO / "dashboards" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GENERATED = (
    {path.relative_to(REPO).as_posix(): text for path, text in _generator().outputs().items()}
    if SDK_PYTHON
    else {}
)


@needs_sdk
def test_the_generator_writes_the_dashboards_the_rules_and_the_adapter_rule() -> None:
    assert set(GENERATED) == {
        "dashboards/triton-overview.json",
        "dashboards/bls-pipeline.json",
        "dashboards/autoscaler.json",
        "dashboards/rules/tritonscale.rules.yaml",
        "charts/tritonscale/README.md",
    }


@needs_sdk
@pytest.mark.parametrize("path", sorted(GENERATED))
def test_the_committed_file_is_what_the_generator_writes(path: str) -> None:
    assert (REPO / path).read_text() == GENERATED[path], (
        f"{path} differs from what dashboards/generate.py writes: run it"
    )


@needs_sdk
def test_the_generator_check_exits_1_naming_a_stale_file(tmp_path: Path, capsys) -> None:
    run = subprocess.run(
        [sys.executable, str(REPO / "dashboards" / "generate.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    generator = _generator()
    stale = tmp_path / "README.md"
    stale.write_text(CHART_README.read_text().replace("<<.LabelMatchers>>", "<<.Matchers>>"))
    generator.CHART_README = stale
    assert generator.main(["--check"]) == 1
    assert capsys.readouterr().err == (f"stale: {stale}; run python dashboards/generate.py\n")
    assert "<<.Matchers>>" in stale.read_text(), "--check must not write"


@needs_sdk
def test_a_file_without_its_markers_is_one_line_naming_it(tmp_path: Path, capsys) -> None:
    generator = _generator()
    generator.RULES = tmp_path / "tritonscale.rules.yaml"
    generator.RULES.write_text("groups: []\n")
    assert generator.main([]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (
        "generate: tritonscale.rules.yaml: needs one '# generated:start' line, "
        "then one '# generated:end'"
    )


@pytest.mark.unit
def test_on_python_3_10_the_generator_says_in_one_line_what_it_needs(monkeypatch) -> None:
    # pyproject.toml's environment marker leaves the SDK out below 3.11.
    monkeypatch.setattr(sys, "version_info", (3, 10, 14, "final", 0))
    for name in [name for name in sys.modules if name.startswith("grafana_foundation_sdk")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "grafana_foundation_sdk", None)
    with pytest.raises(SystemExit) as stopped:
        _generator()
    assert stopped.value.code == (
        "generate: grafana-foundation-sdk needs Python 3.11+, this is 3.10; "
        "run it with a newer Python"
    )


# What dashboards/generate.py adds to the SDK's JSON by hand, because the SDK's types lack it.
ADDED_BY_HAND = {"annotations": {"titleFormat", "textFormat"}, "templating": {"definition"}}


@needs_sdk
@pytest.mark.unit
@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_each_dashboard_reads_back_through_the_sdks_types(name: str) -> None:
    # Every key and value the SDK's Dashboard model knows survives its reading and writing;
    # anything outside its schema (a misspelt option, a wrong type) would be dropped.
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models.dashboard import Dashboard

    register_default_plugins()  # the panels' options and the queries as their own types
    board = DASHBOARDS[name]
    typed = json.loads(json.dumps(Dashboard.from_json(board), cls=JSONEncoder))
    expected = copy.deepcopy(board)
    for section, keys in ADDED_BY_HAND.items():
        for item in expected[section]["list"]:
            for key in keys:
                item.pop(key, None)
    assert expected != board, "nothing is added by hand any more: drop ADDED_BY_HAND"
    assert typed == expected


@needs_sdk
@pytest.mark.unit
def test_a_line_of_panels_wider_than_the_grid_is_refused_naming_the_panel() -> None:
    # The SDK would place 'third' at column 20, running 4 columns past the grid.
    generator = _generator()
    panels = [
        generator.timeseries(title, "A panel of the test.", "short", [], width=width)
        for title, width in (("first", 12), ("second", 8), ("third", 8))
    ]
    with pytest.raises(generator.GenerationError) as refused:
        generator.dashboard("tritonscale-test", "Test", "A dashboard of the test.", [], panels)
    assert str(refused.value) == (
        "tritonscale-test: panel 'third' runs past column 24 (its line of panels is wider "
        "than the grid)"
    )


def test_the_readme_shows_the_adapter_rule_of_the_signals_module() -> None:
    text = CHART_README.read_text()
    block = text.split("<!-- adapter-rule:start -->")[1].split("<!-- adapter-rule:end -->")[0]
    values = yaml.safe_load(block.split("```yaml")[1].split("```")[0])
    assert values["rules"]["external"] == [queries.adapter_rule()]
    rule = values["rules"]["external"][0]
    # The budget's demand ratio, not a queue: the operator answers queues with instances.
    assert rule["name"]["as"] == "tritonscale_budget_demand_ratio"
    assert "nv_inference" not in rule["metricsQuery"]


@pytest.mark.unit
@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_each_dashboard_has_its_identity_and_variables(name: str) -> None:
    board = DASHBOARDS[name]
    assert board["uid"].startswith("tritonscale-") and len(board["uid"]) <= 40
    assert "tritonscale" in board["tags"]
    assert board["schemaVersion"] >= 39
    assert board["title"] and board["description"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for label in ("namespace", "pod", "model"):
        variable = variables[label]
        assert variable["includeAll"] and variable["allValue"] == ".*", label
        assert variable["datasource"] == DATASOURCE
    ids = [panel["id"] for panel in boards.panels(board)]
    assert len(ids) == len(set(ids))


def _cells(panel: dict) -> set[tuple[int, int]]:
    pos = panel["gridPos"]
    return {
        (x, y)
        for x in range(pos["x"], pos["x"] + pos["w"])
        for y in range(pos["y"], pos["y"] + pos["h"])
    }


@pytest.mark.unit
@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_panels_fit_the_grid_without_overlapping(name: str) -> None:
    taken: set[tuple[int, int]] = set()
    for panel in boards.panels(DASHBOARDS[name]):
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
        cells = _cells(panel)
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells


@pytest.mark.unit
@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_panel_has_a_title_description_unit_datasource_and_a_query(name: str) -> None:
    for panel in boards.panels(DASHBOARDS[name]):
        if panel["type"] == "row":
            assert panel["title"]
            continue
        where = f"{name}: {panel.get('title')!r}"
        assert panel.get("title"), where
        assert len(panel.get("description", "")) >= 30, f"{where} needs a description"
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{where} has no unit"
        assert panel["datasource"] == DATASOURCE, where
        assert panel.get("targets"), f"{where} has no query"
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, where
            assert target["expr"].strip(), where
            assert target["refId"], where


@pytest.mark.unit
@pytest.mark.parametrize("query", QUERIES, ids=query_id)
def test_every_query_uses_the_variables_and_rate_interval(query: boards.Query) -> None:
    # Every range is Grafana's $__rate_interval (no fixed window that breaks at another
    # scrape interval), and every selector filters on the dashboard's namespace.
    assert re.findall(r"\[[^\]]*\]", query.expr) == ["[$__rate_interval]"] * len(
        re.findall(r"\[[^\]]*\]", query.expr)
    ), query.expr
    if re.search(r"\b(rate|irate|increase)\(", query.expr):
        assert "[$__rate_interval]" in query.expr
    selectors = re.findall(r"\b[A-Za-z_:][A-Za-z0-9_:]*\{[^}]*\}", query.expr)
    assert selectors, f"no label selector in {query.expr}"
    for selector in selectors:
        assert 'namespace=~"$namespace"' in selector, selector
        if selector.startswith("nv_inference"):
            assert 'pod=~"$pod"' in selector and "model=~" in selector, selector


@pytest.mark.unit
def test_the_gpu_only_list_names_exactly_the_queries_on_gpu_metrics() -> None:
    on_gpu = {key(q) for q in QUERIES if re.search(r"nv_gpu_|DCGM_|\"gpu_", q.expr)}
    assert on_gpu == GPU_ONLY


@pytest.mark.unit
def test_substitution_fills_variables_and_builtins_like_grafana() -> None:
    expr = 'rate(x{namespace=~"$namespace", model=~"${model}", pod=~"[[pod]]"}[$__rate_interval])'
    assert (
        boards.substitute(
            expr, {"namespace": ".*", "model": "a|b", "pod": ".*"}, rate_interval="1m"
        )
        == 'rate(x{namespace=~".*", model=~"a|b", pod=~".*"}[1m])'
    )
    # Grafana's rule: max(step + scrape interval, 4 x scrape interval).
    assert boards.rate_interval_s(step_s=5, scrape_interval_s=15) == 60
    assert boards.rate_interval_s(step_s=60, scrape_interval_s=15) == 75
    assert boards.duration(0.5) == "500ms" and boards.duration(60) == "60s"
    assert boards.parse_duration("1h30m") == 5400
    with pytest.raises(ValueError, match="not a duration"):
        boards.parse_duration("15 minutes")


@pytest.mark.unit
def test_variable_defaults_are_all_or_the_chosen_models() -> None:
    overview = boards.variable_defaults(DASHBOARDS["triton-overview"])
    assert overview == {"namespace": ".*", "pod": ".*", "model": ".*"}
    pipeline = boards.variable_defaults(DASHBOARDS["bls-pipeline"])
    assert pipeline["model"] == "pipeline_async|branch_embed|branch_classify|branch_rank"


# ---- proven against real data ---------------------------------------------------------
@dataclass
class Live:
    prometheus: LocalPrometheus
    triton_names: set[str]
    operator_names: set[str]
    has_gpu: bool


def _sample_names(text: str) -> set[str]:
    """Sample names exactly as exposed (prometheus_client's parser would add _total to
    Triton's counters, which Triton does not)."""
    return {
        re.split(r"[{\s]", line, maxsplit=1)[0]
        for line in text.splitlines()
        if line.strip() and not line.startswith("#")
    }


async def _ticks(
    triton: LocalTriton, prometheus_url: str, metrics, rounds: int
) -> AsyncIterator[None]:
    """Real control ticks, one round per call: a model sized from Prometheus (to a latency
    objective, with its prediction), a model forced
    to 2 instances and back to 1 (real loads), and a source that cannot be reached. The first
    two share a budget (its series feed the budget panels and the adapter rule)."""
    from tritonscale.control.ledger import BudgetLedger
    from tritonscale.control.set_tick import reconcile
    from tritonscale.control.tick import ReconcileState
    from tritonscale.metrics.prometheus import PrometheusSource
    from tritonscale.triton.actuator import Actuator
    from tritonscale.triton.endpoints import local_endpoints

    endpoints = local_endpoints([triton.http_url], [triton.metrics_url])
    actuator = Actuator(triton.repository_key)
    selector = {"matchLabels": {"app.kubernetes.io/component": "triton"}}
    states: dict[str, ReconcileState] = {}
    ledger = BudgetLedger()
    budget = {"name": "pods", "instancesPerPod": 6}

    async def tick(autoscaler: str, spec: dict, source) -> None:
        result = await reconcile(
            {"selector": selector, "metricsWindowSeconds": 5, "intervalSeconds": 1, **spec},
            endpoints,
            source,
            actuator,
            states.get(autoscaler, ReconcileState()),
            time.time(),
            metrics=metrics,
            autoscaler=autoscaler,
            ledger=ledger,
        )
        states[autoscaler] = result.state

    live_source = PrometheusSource(prometheus_url)
    dead_source = PrometheusSource(f"http://127.0.0.1:{free_port()}", timeout_s=1)
    for index in range(rounds):
        # dryRun: decides (and may ask for more) but leaves the session's Triton as it is.
        # With a latency objective: the latency panel's objective, prediction and measurement.
        await tick(
            "pipeline-async",
            {
                "model": "pipeline_async",
                "maxInstances": 4,
                "dryRun": True,
                "budget": budget,
                "targets": {"latency": {"milliseconds": 250}},
            },
            live_source,
        )
        await tick("unreachable-prometheus", {"model": "bls_async"}, dead_source)
        # branch_rank: 1 -> 2 on the first round, back to 1 on the last (the session's count).
        size = 2 if index < rounds - 1 else 1
        await tick(
            "branch-rank",
            {"model": "branch_rank", "minInstances": size, "maxInstances": size, "budget": budget},
            live_source,
        )
        yield


def _branch_timeouts(triton: LocalTriton, count: int) -> None:
    """Requests whose BLS calls expire in the branches' queues (branch_timeout_us = 1):
    Triton counts them REJECTED on the branches; the pipeline answers with errors."""
    with tritonclient.http.InferenceServerClient(triton.http_url) as client:
        original = client.get_model_config("pipeline_async")
        changed = copy.deepcopy(original)
        changed.setdefault("parameters", {})["branch_timeout_us"] = {"string_value": "1"}
        client.load_model(
            "pipeline_async", headers=triton.repository_headers, config=json.dumps(changed)
        )
        try:
            features = tritonclient.http.InferInput("FEATURES", [1, 64], "FP32")
            features.set_data_from_numpy(np.ones((1, 64), dtype=np.float32))
            for _ in range(count):
                with pytest.raises(InferenceServerException, match="Request timeout expired"):
                    client.infer("pipeline_async", [features])
        finally:
            client.load_model(
                "pipeline_async", headers=triton.repository_headers, config=json.dumps(original)
            )


def _wait_until(
    prometheus: LocalPrometheus, promql: str, what: str, timeout_s: float = 30
) -> float:
    """Wait until `promql` returns a sample; its value. `what` names what it waits for."""
    try:
        return float(prometheus.wait_for(promql, timeout_s=timeout_s)[0]["value"][1])
    except LocalPrometheusError:
        raise AssertionError(f"waited {timeout_s:.0f} s for {what} in vain: {promql}") from None


def _rfc3339_s(text: str) -> float:
    """Seconds of a time as Prometheus writes it (nanoseconds: Python reads microseconds)."""
    text = re.sub(r"(\.\d{6})\d+", r"\1", text).replace("Z", "+00:00")
    return datetime.fromisoformat(text).timestamp()


def _wait_for_scrapes_and_rules_after(
    prometheus: LocalPrometheus, since: float, timeout_s: float = 30
) -> None:
    """Both targets scraped after `since` (the load's last increments in), then every rule
    group evaluated after those scrapes ended (the rules computed from them)."""
    targets = 'job=~"triton|tritonscale"'
    _wait_until(
        prometheus,
        f"min(timestamp(up{{{targets}}})) > {since}",
        "scrapes of Triton and the operator after the load",
    )
    scraped_by = _wait_until(
        prometheus,
        f"max(timestamp(up{{{targets}}}) + scrape_duration_seconds{{{targets}}})",
        "the scrapes' durations",
    )
    deadline = time.monotonic() + timeout_s
    while True:
        groups = requests.get(f"{prometheus.url}/api/v1/rules", timeout=10).json()["data"]
        behind = [
            group["name"]
            for group in groups["groups"]
            if _rfc3339_s(group["lastEvaluation"]) <= scraped_by
        ]
        if not behind:
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"rule groups {behind} not evaluated after the last scrape in {timeout_s:.0f} s"
            )
        time.sleep(prometheus.scrape_interval_s)  # the next evaluation is an interval away


@pytest.fixture(scope="module")
def triton() -> Iterator[LocalTriton]:
    """A server of this module's own: its streamed load may not leave the shared one hung."""
    require_local_triton()
    with LocalTriton(http_port=0, grpc_port=0, metrics_port=0, exit_timeout_s=3) as server:
        yield server


@pytest.fixture(scope="module")
def live(triton: LocalTriton, tmp_path_factory) -> Iterator[Live]:
    if prometheus_binary() is None:
        missing("prometheus not installed (Debian package 'prometheus')")
    from tritonscale.control.operator_metrics import OperatorMetrics

    metrics = OperatorMetrics()
    operator_port = free_port()
    server = metrics.serve(operator_port, addr="127.0.0.1")
    targets = {
        "triton": [triton.metrics_url.removeprefix("http://").removesuffix("/metrics")],
        "tritonscale": [f"127.0.0.1:{operator_port}"],
    }
    try:
        # Triton's series in the local driver's namespace, as a Kubernetes scrape would label
        # them with the pods' (the busy-fraction rule joins them to the operator's).
        labels = {"triton": {"namespace": "local"}}
        with LocalPrometheus(
            targets, scrape_interval_s=0.5, rule_files=[RULES], labels=labels
        ) as prometheus:
            prometheus.wait_for('up{job="triton"} == 1', timeout_s=30)
            prometheus.wait_for('up{job="tritonscale"} == 1', timeout_s=30)
            # rate() counts an increase from a counter's first sample on: the failure
            # counters the branch timeouts move must have one before them.
            _wait_until(
                prometheus,
                'nv_inference_request_failure{job="triton", model="branch_embed", '
                'reason="REJECTED"} == 0',
                "a sample of branch_embed's REJECTED counter before the load",
            )
            _branch_timeouts(triton, count=5)

            async def rounds() -> None:
                async for _ in _ticks(triton, prometheus.url, metrics, rounds=4):
                    stream_load(triton, requests_per_model=100)
                    await asyncio.sleep(1.5)

            asyncio.run(rounds())
            _wait_for_scrapes_and_rules_after(prometheus, time.time())
            config = requests.get(
                f"http://{triton.http_url}/v2/models/branch_rank/config", timeout=10
            ).json()
            assert config["instance_group"][0]["count"] == 1, "branch_rank was not restored"
            triton_text = requests.get(triton.metrics_url, timeout=10).text
            operator_text = requests.get(
                f"http://127.0.0.1:{operator_port}/metrics", timeout=10
            ).text
            yield Live(
                prometheus,
                _sample_names(triton_text),
                _sample_names(operator_text),
                has_gpu="nv_gpu_utilization" in _sample_names(triton_text),
            )
    finally:
        server.shutdown()


def _finite(result: list[dict]) -> list[float]:
    return [float(item["value"][1]) for item in result if math.isfinite(float(item["value"][1]))]


@pytest.mark.parametrize("query", QUERIES, ids=query_id)
def test_every_query_runs_and_returns_data(live: Live, query: boards.Query) -> None:
    board = DASHBOARDS[query.dashboard]
    # 30 s covers the whole load (Grafana would pick 2 s at this scrape interval).
    expr = boards.substitute(query.expr, boards.variable_defaults(board), rate_interval="30s")
    result = live.prometheus.query(expr)  # a parse error raises with Prometheus' message
    if key(query) in MODEL_GAUGE_ONLY:
        assert not _finite(result), "a model of the repository exports the gauge: test its data"
        return
    if key(query) in GPU_ONLY and ("DCGM_" in query.expr or not live.has_gpu):
        # No DCGM exporter runs in tests; without a GPU Triton exports no nv_gpu_*.
        assert live.has_gpu or not _finite(result), "GPU data on a machine without a GPU?"
        return
    assert _finite(result), f"no data for {query_id(query)}: {expr}"


def test_a_branch_timeout_shows_as_rejected_on_the_branch_not_the_pipeline(live: Live) -> None:
    # What the failure panels and alerts rely on (Triton 2.51, measured): the branch's
    # queue rejects the BLS request, and the pipeline's error response counts as a success.
    query = next(
        q for q in QUERIES if key(q) == ("bls-pipeline", "Failed requests by model and reason", "A")
    )
    board = DASHBOARDS["bls-pipeline"]
    expr = boards.substitute(query.expr, boards.variable_defaults(board), rate_interval="1m")
    rates = {
        (item["metric"]["model"], item["metric"]["reason"]): float(item["value"][1])
        for item in live.prometheus.query(expr)
    }
    assert rates[("branch_embed", "REJECTED")] > 0
    pipeline = [rate for (model, _), rate in rates.items() if model == "pipeline_async"]
    assert pipeline and all(rate == 0 for rate in pipeline)


def test_metric_names_are_ones_triton_and_the_operator_really_export(live: Live) -> None:
    used = {name for q in QUERIES for name in METRIC_NAME.findall(q.expr)}
    exported = live.triton_names | live.operator_names
    unknown = sorted(used - exported - GPU_METRIC_NAMES - {queries.STREAMS_IN_FLIGHT})
    assert not unknown, f"not exported by Triton or the operator: {unknown}"
    # The contract's operator metrics are all served, under their contract names.
    contract = {
        "tritonscale_desired_instances",
        "tritonscale_current_instances",
        "tritonscale_decisions_total",
        "tritonscale_actuations_total",
        "tritonscale_reconcile_duration_seconds_bucket",
        "tritonscale_reconcile_errors_total",
        "tritonscale_observed_signal",
        "tritonscale_last_reconcile_timestamp_seconds",
        "tritonscale_budget_instances_limit",
        "tritonscale_budget_instances_used",
        "tritonscale_budget_instances_wanted",
        "tritonscale_budget_exhausted",
        "tritonscale_budget_demand_ratio",
    }
    assert contract <= live.operator_names


def test_variables_list_the_real_models(live: Live) -> None:
    # label_values(nv_inference_count{...}, model) with "All" namespace and pod.
    result = live.prometheus.query('nv_inference_count{namespace=~".*", pod=~".*"}')
    models = {item["metric"]["model"] for item in result}
    assert {"pipeline_async", "branch_embed", "bls_decoupled_async", "square_int32"} <= models
    result = live.prometheus.query('tritonscale_desired_instances{namespace=~".*"}')
    assert {item["metric"]["model"] for item in result} >= {"pipeline_async", "branch_rank"}


def test_the_recording_rules_produce_the_shared_signals(live: Live) -> None:
    for record in (
        "triton:model_request:rate1m",
        "triton:model_failure:ratio1m",
        "triton:queue_compute:ratio",
        "triton:model_busy_instances:rate1m",
        "triton:model_latency_seconds:avg1m",
        "triton:model_pending_requests:sum",
        "triton:model_pods:count",
        # Joins Triton's series (no namespace here) with the operator's namespace="local".
        "triton:model_busy:fraction",
    ):
        result = live.prometheus.query(f'{record}{{model="pipeline_async"}}')
        assert _finite(result), f"{record} has no data"


def test_the_adapter_rule_answers_per_budget_from_real_series(live: Live) -> None:
    # As prometheus-adapter fills it in for the HPA's External metric: the namespace and the
    # HPA's selector (budget=pods) as matchers, grouped by namespace.
    query = queries.adapter_rule()["metricsQuery"]
    expr = query.replace("<<.LabelMatchers>>", 'namespace="local",budget="pods"').replace(
        "<<.GroupBy>>", "namespace"
    )
    result = live.prometheus.query(expr)
    assert len(result) == 1 and result[0]["metric"] == {"namespace": "local"}
    ratio = float(result[0]["value"][1])
    # Two members in a budget of 6, each wanting at least its minimum of 1.
    assert math.isfinite(ratio) and ratio >= 2 / 6


def test_the_rules_load_and_evaluate_without_errors(live: Live) -> None:
    response = requests.get(f"{live.prometheus.url}/api/v1/rules", timeout=10).json()
    rules = [rule for group in response["data"]["groups"] for rule in group["rules"]]
    assert len(rules) >= 20
    broken = {rule["name"]: rule.get("lastError") for rule in rules if rule["health"] != "ok"}
    assert not broken


# ---- the preview command ----------------------------------------------------------------
def _tritonscale() -> list[str]:
    script = shutil.which("tritonscale", path=str(Path(sys.executable).parent))
    return [script] if script else [sys.executable, "-m", "tritonscale.cli"]


def test_preview_draws_every_dashboard_from_real_data(live: Live, tmp_path: Path) -> None:
    from matplotlib.image import imread

    run = subprocess.run(
        [
            *_tritonscale(),
            "dashboards",
            "preview",
            "--prometheus",
            live.prometheus.url,
            "--out",
            str(tmp_path),
            "--range",
            "2m",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stderr
    for name in DASHBOARDS:
        path = tmp_path / f"{name}.png"
        assert str(path) in run.stdout
        image = imread(path)
        assert image.shape[1] >= 1500 and image.shape[0] >= 1000
        assert image.std() > 0.05  # drawn panels, not a blank page


def test_preview_of_one_dashboard_by_uid_with_a_variable_set(live: Live, tmp_path: Path) -> None:
    paths = boards.preview(
        live.prometheus.url,
        tmp_path,
        names=["tritonscale-autoscaler"],
        range_text="1m",
        overrides={"model": "pipeline_async"},
    )
    assert paths == [tmp_path / "autoscaler.png"]


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--prometheus", "http://127.0.0.1:{port}"],
            "Prometheus at http://127.0.0.1:{port} is unreachable",
        ),
        (
            ["--prometheus", "http://127.0.0.1:{port}", "--dashboard", "nope"],
            "unknown dashboard 'nope'; choose from: autoscaler, bls-pipeline, triton-overview",
        ),
        (["--prometheus", "http://127.0.0.1:{port}", "--range", "soon"], "not a duration: 'soon'"),
        (
            ["--prometheus", "http://127.0.0.1:{port}", "--var", "nope=x"],
            "unknown variable 'nope'; these dashboards have: decoupled, model, namespace, pod",
        ),
    ],
    ids=["unreachable", "unknown-dashboard", "bad-range", "unknown-variable"],
)
def test_preview_mistakes_are_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    port = free_port()
    run = subprocess.run(
        [
            *_tritonscale(),
            "dashboards",
            "preview",
            "--out",
            str(tmp_path),
            *[a.format(port=port) for a in args],
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {message.format(port=port)}"), lines
    assert not list(tmp_path.glob("*.png"))
