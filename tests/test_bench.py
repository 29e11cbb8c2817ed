"""The benchmarks' quick modes run against the real Triton and write their JSON and PNG.

No timing assertions: the numbers of a quick run mean little. Each benchmark runs on the
session's server through its `run()` (counts are put back afterwards); one runs as the
documented command, with its own server.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hack.vegeta import build as vegeta_build
from loadtests import chart, objective
from loadtests.bench import (
    async_vs_sync,
    bls_hop,
    common,
    control_loop_scale,
    count_changes,
    gateway,
    loadgen_headroom,
    model_accuracy,
    operator_vs_static,
    scale_down,
    shifted_mix,
    steady,
    summary,
    trace,
    vegeta,
)
from tests.tooling import missing
from tritonscale.drivers.tune import parse_config
from tritonscale.local.triton_server import LocalTriton
from tritonscale.triton.client import TritonClient
from tritonscale.triton.endpoints import Endpoint

REPO_ROOT = Path(__file__).resolve().parents[1]
PIPELINE_MODELS = (
    "pipeline_async",
    "pipeline_sync",
    "branch_embed",
    "branch_classify",
    "branch_rank",
)


def _written(name: str, result: dict, tmp_path: Path, plot) -> dict:
    path = common.write_result(name, result, tmp_path / f"{name}.json")
    plot(path.with_suffix(".png"))
    assert path.with_suffix(".png").stat().st_size > 1000
    document = json.loads(path.read_text())
    assert document["benchmark"] == name
    assert {"command", "finished", "machine", "settings"} <= document.keys()
    assert document["machine"]["cpus"] >= 1
    # The markdown summary reads it back.
    assert summary.summary(tmp_path).startswith(f"### {name}\n")
    return document


def _counts(triton: LocalTriton) -> dict[str, int]:
    instances = common.Instances(triton)
    return {model: instances.get(model) for model in PIPELINE_MODELS}


def test_async_vs_sync_quick(triton: LocalTriton, tmp_path: Path) -> None:
    before = _counts(triton)
    result = async_vs_sync.run(triton, async_vs_sync.QUICK)
    doc = _written(
        "async_vs_sync", result, tmp_path, lambda p: async_vs_sync.plot(result["grid"], p)
    )
    point = doc["grid"][0]
    for variant in ("async", "sync"):
        assert point[variant]["requests"] > 0 and point[variant]["failures"] == 0, point
    assert point["throughput_ratio"] > 0
    assert doc["fan_out"] == 3 and doc["ideal_ratio_sum_over_max"] == 2.0
    # The lower target is 90 % of sync's best: sync reaches it somewhere in the grid.
    assert doc["fewest_instances_for_target"][0]["sync"] is not None
    assert doc["decoupled"][0]["async"]["requests"] > 0
    assert {"throughput_ratio", "work_ratio"} <= doc["decoupled"][0].keys()
    assert _counts(triton) == before


def test_gateway_quick(triton: LocalTriton, tmp_path: Path) -> None:
    before = {
        **_counts(triton),
        "pipeline_gateway": common.Instances(triton).get("pipeline_gateway"),
    }
    # The benchmark reloads the gateway with other parameters: they must come back as shipped.
    shipped = gateway.live_parameters(triton, "pipeline_gateway")
    result = gateway.run(triton, gateway.QUICK)
    doc = _written("gateway", result, tmp_path, lambda p: gateway.plot(result, p))
    [point] = doc["by_in_flight"]
    assert set(point["variants"]) == {"gateway", "plain_gateway", "async", "sync", "ensemble"}
    for variant, run in point["variants"].items():
        assert run["requests"] > 0 and run["failures"] == 0, (variant, run)
        assert run["server_cpu_ms_per_request"] > 0 and run["rows_per_branch_call"] >= 1
        assert run["ratio_to_sync"] > 0 and 0 < run["fraction_of_ceiling"] <= 1.5
    assert point["ceiling_rps"] == round(2 / 0.015, 1)  # 2 in flight, 15 ms at branch_embed
    assert [b["branch"] for b in doc["branches_alone"]] == list(gateway.BRANCHES)
    assert all(b["rows_per_s"] > 0 and b["failures"] == 0 for b in doc["branches_alone"])
    assert doc["gateway_over_best_other_min"] == point["gateway_over_best_other"]
    # Every variant on each of its users' paths: unary gRPC and HTTP, or a stream per user.
    [users] = doc["users_paths"]
    for variant, paths in gateway.USERS_PATHS.items():
        assert set(users["variants"][variant]) == set(paths), variant
        for path, run in users["variants"][variant].items():
            assert run["requests"] > 0 and run["failures"] == 0, (variant, path, run)
            assert run["rows_per_branch_call"] >= 1, (variant, path, run)
    assert set(users["gateway_over_async"]) == {"grpc", "http"}
    assert all(ratio > 0 for ratio in users["gateway_over_async"].values())
    # The gateway's paths beside async's: the shared stream against unary calls and back.
    [paths] = doc["gateway_paths"]
    for variant, variant_paths in gateway.GATEWAY_PATHS.items():
        assert set(paths["variants"][variant]) == set(variant_paths), variant
        for path, run in paths["variants"][variant].items():
            assert run["requests"] > 0 and run["failures"] == 0, (variant, path, run)
            assert run["rows_per_branch_call"] >= 1, (variant, path, run)
    assert set(paths["gateway_over_async"]) == {"shared_stream", "stream"}
    for mine, ratios in paths["gateway_over_async"].items():
        assert set(ratios) == {"grpc", "http", "shared_stream"}, mine
        assert all(ratio > 0 for ratio in ratios.values()), (mine, ratios)
        # One round in the quick form: its ratio is the means'.
        for theirs, ratio in ratios.items():
            assert paths["gateway_over_async_by_round"][mine][theirs] == [ratio]
    assert "gateway shared_stream / async grpc" in summary.summary(tmp_path)
    after = {
        **_counts(triton),
        "pipeline_gateway": common.Instances(triton).get("pipeline_gateway"),
    }
    assert after == before
    assert gateway.live_parameters(triton, "pipeline_gateway") == shipped


@pytest.mark.unit
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--parts", "sweep,users,grids"], "unknown part(s) grids"),
        (["--rounds", "0"], "--rounds must be at least 1"),
    ],
    ids=["an unknown part is named", "no round at all is refused"],
)
def test_the_gateway_command_line_refuses_before_starting_a_server(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        gateway.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_bls_hop_quick(triton: LocalTriton, tmp_path: Path) -> None:
    result = bls_hop.run(triton, bls_hop.QUICK)
    doc = _written("bls_hop", result, tmp_path, lambda p: bls_hop.plot(result["by_concurrency"], p))
    row = doc["by_concurrency"][0]
    for model in bls_hop.MODELS:
        assert row[model]["requests"] > 0 and row[model]["failures"] == 0, row[model]
    assert {
        "bls_sync_hop_p50_ms",
        "bls_async_hop_p50_ms",
        "bls_async_latency_ratio_p50",
    } <= row.keys()


def test_loadgen_headroom_quick(triton: LocalTriton, tmp_path: Path) -> None:
    result = loadgen_headroom.run(triton, loadgen_headroom.QUICK)
    doc = _written(
        "loadgen_headroom", result, tmp_path, lambda p: loadgen_headroom.plot(result["by_users"], p)
    )
    row = doc["by_users"][0]
    assert row["locust"]["requests"] > 0 and row["asyncio"]["requests"] > 0
    assert row["locust"]["client_cpu_ms_per_request"] > 0
    assert row["locust_over_asyncio"] > 0


def test_vegeta_quick(triton: LocalTriton, tmp_path: Path) -> None:
    try:
        binary = vegeta_build.build()  # found at once once built (make vegeta)
    except vegeta_build.VegetaBuildError as error:
        missing(f"vegeta: {error}")
    result = vegeta.run(triton, vegeta.QUICK, binary)
    doc = _written("vegeta", result, tmp_path, lambda p: vegeta.plot(result, p))
    [model] = doc["by_model"]
    assert model["model"] == "add_sub" and model["capacity_rps"] > 0
    [point] = model["points"]
    assert point["rate_rps"] > 0 and sorted(point["order"]) == sorted(vegeta.GENERATORS)
    assert list(point["generators"]) == list(vegeta.GENERATORS)
    for name, run in point["generators"].items():
        # Every generator, vegeta included, reached the server and was answered.
        assert run["requests"] > 0 and run["served_rps"] > 0 and run["success_ratio"] > 0, (
            name,
            run,
        )
        assert {"offered_rps", "p50_ms", "p95_ms", "p99_ms", "server_cpu_ms_per_request"} <= (
            run.keys()
        )
    assert set(point["ratios"]) == set(vegeta.GENERATORS) - {"vegeta"}
    for ratios in point["ratios"].values():
        assert set(ratios) == {"served", "p50", "p95", "p99"}
        assert ratios["served"] > 0
    assert isinstance(doc["flags"], list) and doc["tolerance"] == 0.1


def _rank_cost(triton: LocalTriton) -> str:
    with TritonClient(Endpoint("local", triton.http_url), triton.repository_key) as client:
        config = client.model_config("branch_rank")
    return config["parameters"][common.COST_PARAMETER]["string_value"]


def test_emulated_costs_hold_inside_and_are_undone_after(triton: LocalTriton) -> None:
    before = _rank_cost(triton)
    with common.emulated_costs(triton, {"branch_rank": 12.5}):
        assert _rank_cost(triton) == "12.5"
        common.Instances(triton).set({"branch_rank": 2})  # a count change keeps the cost
        assert _rank_cost(triton) == "12.5"
        common.Instances(triton).set({"branch_rank": 1})
    assert _rank_cost(triton) == before


@pytest.mark.unit
def test_costs_on_the_command_line_are_model_equals_milliseconds() -> None:
    assert common.parse_costs("branch_embed=5, branch_rank=20.5") == {
        "branch_embed": 5.0,
        "branch_rank": 20.5,
    }
    for bad in ("branch_embed", "branch_embed=-1", "=5", "branch_embed=fast"):
        with pytest.raises(argparse.ArgumentTypeError, match="is not MODEL=MS"):
            common.parse_costs(bad)


def test_operator_vs_static_quick(triton: LocalTriton, tmp_path: Path) -> None:
    before, cost_before = _counts(triton), _rank_cost(triton)
    costs = {"branch_rank": 12.0}
    result = operator_vs_static.run(triton, {**operator_vs_static.QUICK, "costs": costs})
    # The branches' costs given are back to the repository's after the run.
    assert _rank_cost(triton) == cost_before
    log = [json.loads(line) for line in result["operator"].pop("decision_log").splitlines()]
    assert len(log) == result["operator"]["decisions"]
    # The set planner's decisions carry its prediction once a window is measured.
    predicted = [record for record in log if record["prediction"] is not None]
    assert predicted, [record["reason"] for record in log]
    assert all(record["prediction"]["expectedRps"] > 0 for record in predicted)
    doc = _written(
        "operator_vs_static", result, tmp_path, lambda p: operator_vs_static.plot(result, p)
    )
    assert doc["best_static"]["throughput_rps"] > 0
    assert len(doc["static_sweep"]) == 1  # a budget of 4 leaves one configuration
    # The contract other checks read.
    assert doc["budget"] == 4 and doc["best_static_rps"] == doc["best_static"]["throughput_rps"]
    assert doc["operator_rps"] > 0
    assert doc["max_total_instances"] >= 4
    assert "seconds_to_95pct" in doc and isinstance(doc["reached_95pct_within_60s"], bool)
    assert doc["within_budget"] == (doc["max_total_instances"] <= doc["budget"])
    # The budget went into the policy file the driver ran with, and the JSON says whether the
    # driver enforces it.
    operator = doc["operator"]
    assert {
        p["spec"]["budget"]["instancesPerPod"] for p in operator["policy_file"]["policies"]
    } == {4}
    assert doc["budget_enforced"] is operator_vs_static.BUDGET_ENFORCED
    assert doc["budget_note"]
    assert operator["decisions"] > 0, operator["tune_output_tail"]
    assert {
        "throughput_fraction_of_best_static",
        "total_instances_at_end_of_high_load",
        "total_instances_at_end_of_low_load",
        "within_budget",
    } <= operator.keys()
    assert {w["phase"] for w in operator["timeline"]} == {"high load", "low load"}
    # The best static configuration measured again in the operator's windows. A budget of 4
    # leaves every model at 1: the operator holds that configuration from its first window.
    again = doc["best_static_rechecked"]
    assert again["instances"] == doc["best_static"]["instances"] and again["window_rps"]
    assert again["throughput_rps"] > 0 and doc["operator_vs_best_static_rechecked"] > 0
    assert doc["operator_ends_at_best_static"] is True
    assert doc["seconds_to_best_static_configuration"] == operator["timeline"][0]["t_s"]
    # The operator running and stopped in turns on the counts it holds (all at 1: it cannot
    # change them), and the ratio of both sides measured in turns.
    turns = operator["against_its_split"]
    assert turns["running_window_rps"] and turns["stopped_window_rps"], turns
    assert turns["instances"] == again["instances"] and turns["changed"] is False
    assert doc["operator_vs_best_static_interleaved"] > 0
    assert _counts(triton) == before


def test_model_accuracy_quick(triton: LocalTriton, tmp_path: Path) -> None:
    before = _counts(triton)
    _, settings = model_accuracy.arguments(["--quick"])
    result = model_accuracy.run(triton, settings)
    doc = _written("model_accuracy", result, tmp_path, lambda p: model_accuracy.plot(result, p))
    [pipeline] = doc["pipelines"]
    assert pipeline["root"] == "pipeline_async"
    assert pipeline["callees"] == list(model_accuracy.BRANCHES)
    # A budget of 5 over four models: each model in turn gets the fifth instance.
    assert len(pipeline["splits"]) == 4
    for row in pipeline["splits"]:
        assert sum(row["counts"].values()) == 5 and row["failures"] == 0, row
        assert row["predicted_rps"] > 0 and row["measured_rps"] > 0, row
        assert row["predicted_p95_ms"] > 0 and row["measured_p95_ms"] > 0, row
    assert 0 <= pipeline["throughput_within_10pct_share"] <= 1
    assert 0 <= pipeline["p95_within_25pct_share"] <= 1
    # The model was built from windows of the starting split: every model at one instance.
    assert {s["instances"] for s in pipeline["network"].values()} == {1}
    assert pipeline["starting_split_again"]["requests"] > 0
    assert pipeline["starting_split_drift"] > 0
    assert _counts(triton) == before


@pytest.mark.unit
def test_a_root_the_project_does_not_know_needs_its_callees_named(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        model_accuracy.arguments(["--root", "my_bls"])
    assert exit_info.value.code == 2
    assert "--calls my_bls=A,B" in capsys.readouterr().err
    _, settings = model_accuracy.arguments(
        ["--root", "my_bls", "--calls", "my_bls=a,b", "--sequential", "my_bls", "--quick"]
    )
    assert settings["calls"] == {"my_bls": ["a", "b"]} and "my_bls" in settings["sequential"]
    assert model_accuracy.models_of(settings) == ["my_bls", "a", "b"]


def test_trace_quick(triton: LocalTriton, tmp_path: Path) -> None:
    before = _counts(triton)
    result = trace.run(triton, trace.QUICK)
    doc = _written("trace", result, tmp_path, lambda p: trace.plot(result, p))
    # The contract: every arm, each with its four numbers.
    assert set(doc["arms"]) == {"static_at_peak", "hpa_way", "operator", "limit"}
    for arm, row in doc["arms"].items():
        assert set(objective.ARM_KEYS) <= row.keys(), arm
        assert row["instance_seconds"] > 0, arm
        assert 0 <= row["requests_met_share"] <= 1, arm
    for arm in trace.ARMS:
        (run,) = doc["arms"][arm]["runs"]
        assert run["requests_due"] > 0 and len(run["timeline"]) == trace.QUICK["seconds"], arm
    operator = doc["arms"]["operator"]["runs"][0]
    assert operator["decisions"] > 0, operator["tune_output_tail"]
    assert doc["arms"]["hpa_way"]["runs"][0]["controller_error"] is None
    assert doc["peak_rps"] == pytest.approx(trace.PEAK_SHARE * doc["largest_split_rps"], abs=0.01)
    assert doc["objective"]["milliseconds"] > 0 and doc["levels"][0]["rate"] == doc["peak_rps"]
    assert _counts(triton) == before


def test_shifted_mix_quick(triton: LocalTriton, tmp_path: Path) -> None:
    before = _counts(triton)
    result = shifted_mix.run(triton, shifted_mix.QUICK)
    assert result["operator"].pop("decision_log").count("\n") == result["operator"]["decisions"]
    doc = _written("shifted_mix", result, tmp_path, lambda p: shifted_mix.plot(result, p))
    assert len(doc["static_sweep"]) == 1  # a budget of 5 over five models leaves one
    for row in doc["static_sweep"]:
        assert row["first"]["requests"] > 0 and row["second"]["requests"] > 0, row
    operator = doc["operator"]
    assert operator["decisions"] > 0, operator["tune_output_tail"]
    assert {w["phase"] for w in operator["timeline"]} == {"first half", "second half"}
    assert operator["first_rps"] > 0 and operator["second_rps"] > 0
    assert {"first_half", "second_half"} <= doc["operator_vs_best_static"].keys()
    assert "seconds_after_shift_to_95pct_of_second_best" in doc
    # Each half's best measured again in the operator's windows; with every model at 1 (the
    # only configuration of 5) the operator holds it from each half's first window.
    for half in ("first_half", "second_half"):
        again = doc["best_static_rechecked"][half]
        assert again["window_rps"] and again["throughput_rps"] > 0, again
        assert doc["operator_vs_best_static_rechecked"][half] > 0
        assert doc["operator_ends_at_best_static"][half] is True
        turns = operator["against_its_split"][half]
        assert turns["running_window_rps"] and turns["stopped_window_rps"], turns
        assert doc["operator_vs_best_static_interleaved"][half] > 0
        assert (
            0
            < doc["seconds_to_best_static_configuration"][half]
            <= shifted_mix.QUICK["half_seconds"] + 1
        )
    assert _counts(triton) == before


def test_a_server_that_dies_mid_run_stops_the_benchmark_with_one_line_naming_it() -> None:
    # A crash in a backend (seen once: SIGSEGV in the Python backend's execute under a
    # shifted_mix load) is the cause; the benchmark's step that met the closed port is not.
    with pytest.raises(SystemExit) as stopped:
        with common.local_triton(["branch_rank"]) as server:
            assert server.process is not None
            os.kill(server.process.pid, signal.SIGSEGV)
            server.process.wait(timeout=30)
            urllib.request.urlopen(f"{server.http_url}/v2/health/ready", timeout=5)
    said = str(stopped.value)
    assert "tritonserver exited (signal 11) while the benchmark ran" in said, said
    assert "log: " in said and "\n" not in said


def test_count_changes_quick(tmp_path: Path) -> None:
    # Its own two servers (one per --rate-limit): the session's is not changed.
    result = count_changes.run(count_changes.QUICK)
    doc = _written("count_changes", result, tmp_path, lambda p: count_changes.plot(result, p))
    assert doc["arms"].keys() == set(count_changes.ARMS)
    for arm in count_changes.ARMS:
        for load in ("closed_loop", "open_loop"):
            done = doc["arms"][arm][load]
            # pipeline_async 1 -> 2 -> 1 under each load, each one timed or marked stalled.
            assert [(row["from"], row["to"]) for row in done["changes"]] == [(1, 2), (2, 1)]
            assert all((row["seconds"] is None) == row["stalled"] for row in done["changes"])
            assert done["served"] > 0 and done["failed"] == 0, done["first_error"]
    # The setting the chart ships finishes every change, whatever the default does.
    assert doc["arms"]["execution_count"]["closed_loop"]["stalled"] == 0
    (split,) = doc["cost"]
    assert split["execution_count"]["throughput_rps"] > 0 and split["off"]["throughput_rps"] > 0


def test_scale_down_quick(triton: LocalTriton, tmp_path: Path) -> None:
    before = _counts(triton)
    result = scale_down.run(triton, scale_down.QUICK)
    assert result.pop("decision_log").count("\n") == result["decisions"]
    doc = _written("scale_down", result, tmp_path, lambda p: scale_down.plot(result, p))
    assert doc["floor"] == 4 and doc["capacity_rps"] > 0
    assert {w["phase"] for w in doc["timeline"]} == {"high", "low"}
    assert doc["decisions"] > 0
    assert "seconds_to_floor" in doc
    assert 0 <= doc["earliest_possible_s"] <= doc["allowed_s"]
    assert _counts(triton) == before


def test_steady_quick(tmp_path: Path) -> None:
    """The demo's set-up on free ports, one steady phase (its own Triton and Prometheus)."""
    result = steady.run(steady.QUICK, tmp_path / "steady")
    doc = _written("steady", result, tmp_path, lambda p: steady.plot(result, p))
    assert doc["capacity_rps"] > 0 and doc["served_rps"] > 0
    assert doc["decisions"] > 0 and doc["counts"]
    assert set(doc["reversals"]) == {
        "pipeline_async",
        "branch_embed",
        "branch_classify",
        "branch_rank",
    }
    assert set(doc["given_back"]) == set(doc["reversals"])
    assert doc["changes"], "a load above the capacity at one instance each changed no count"
    assert (tmp_path / "steady" / "decisions.jsonl").is_file()


@pytest.mark.unit
def test_the_chart_windows_are_the_chart_values() -> None:
    specs = chart.chart_autoscalers()
    assert set(scale_down.MODELS) <= specs.keys()
    pipeline = specs["pipeline_async"]
    # The chart's defaults, as a user gets them without a values file of their own.
    assert pipeline["intervalSeconds"] == 15 and pipeline["metricsWindowSeconds"] == 60
    assert pipeline["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 300
    assert pipeline["calls"] == ["branch_embed", "branch_classify", "branch_rank"]
    # 7 instances: 300 s of window, then one more step of 60 s for the model at 3; at the
    # latest the 60 s rate window comes first.
    peak = {"pipeline_async": 3, "branch_embed": 2, "branch_classify": 1, "branch_rank": 1}
    assert scale_down.earliest_floor_s(list(specs.values()), peak) == 300 + 60
    assert scale_down.allowed_floor_s(list(specs.values()), peak) == 60 + 300 + 60


def _down_spec(
    interval_s: int = 15,
    rates_s: int = 60,
    window_s: int = 300,
    policies: tuple[tuple[str, int, int], ...] = (("Instances", 1, 60),),
    floor: int = 1,
) -> dict[str, Any]:
    return {
        "model": "m",
        "minInstances": floor,
        "intervalSeconds": interval_s,
        "metricsWindowSeconds": rates_s,
        "behavior": {
            "scaleDown": {
                "stabilizationWindowSeconds": window_s,
                "policies": [
                    {"type": kind, "value": value, "periodSeconds": period}
                    for kind, value, period in policies
                ],
            }
        },
    }


@pytest.mark.unit
@pytest.mark.parametrize(
    ("spec", "peak", "earliest", "allowed"),
    [
        # The chart's windows from 4 to 1: 300 s, then two steps a minute apart; at the latest
        # the rate window holds the peak for 60 s first.
        (_down_spec(), 4, 300 + 2 * 60, 60 + 300 + 2 * 60),
        # One step: the stabilization window alone, and the rate window before it.
        (_down_spec(), 2, 300, 60 + 300),
        # Nothing above the floor: nothing to wait for.
        (_down_spec(floor=2), 2, 0, 0),
        # Windows that end between ticks are over at the next tick: 100 s is 105 s of 15 s
        # ticks, a 50 s period 60 s; the rate window is not rounded (the last tick that reads
        # the high load comes before it ends).
        (_down_spec(window_s=100, policies=(("Instances", 1, 50),)), 3, 105 + 60, 60 + 105 + 60),
        # Two instances a period: 5 above the floor take three steps.
        (_down_spec(policies=(("Instances", 2, 60),)), 6, 300 + 2 * 60, 60 + 300 + 2 * 60),
        # Of two policies the quicker one counts (selectPolicy Max, the chart's).
        (
            _down_spec(policies=(("Instances", 1, 60), ("Instances", 1, 30))),
            4,
            300 + 2 * 30,
            60 + 300 + 2 * 30,
        ),
    ],
    ids=[
        "the chart's windows from 4 to 1",
        "one step",
        "at the floor already",
        "windows between ticks round up to the next tick",
        "two instances a period",
        "the quicker of two policies",
    ],
)
def test_the_windows_bound_the_time_back_at_the_floor(
    spec: dict[str, Any], peak: int, earliest: float, allowed: float
) -> None:
    assert scale_down.earliest_floor_s([spec], {"m": peak}) == earliest
    assert scale_down.allowed_floor_s([spec], {"m": peak}) == allowed


@pytest.mark.unit
def test_the_bound_counts_instances_policies_only() -> None:
    spec = _down_spec(policies=(("Percent", 50, 60),))
    with pytest.raises(ValueError, match="only Instances"):
        scale_down.allowed_floor_s([spec], {"m": 4})


def test_control_loop_scale_quick(tmp_path: Path) -> None:
    settings = control_loop_scale.QUICK
    with control_loop_scale.tritons(2) as pods:
        result = control_loop_scale.run(pods, settings)
    doc = _written(
        "control_loop_scale", result, tmp_path, lambda p: control_loop_scale.plot(result, p)
    )
    layouts = {(row["pods"], row["sets"]): row for row in doc["layouts"]}
    assert set(layouts) == {(1, 1), (2, 1), (2, 2)}
    for row in doc["layouts"]:
        assert row["autoscalers"] == 4 * row["sets"]
        assert row["steady"]["ticks"] >= row["autoscalers"]
        assert row["change"]["loading_tick_ms"]["median"] is not None, row
    # Two pods in one set: one of them hung while the other should get a new count.
    hung = layouts[(2, 1)]["hung"]
    assert hung["own_set"]["ticks"] > 0 and hung["hung_pod"]
    assert doc["pod_memory_mb"] > 0


@pytest.mark.unit
def test_the_budget_goes_into_a_policy_file_the_driver_reads() -> None:
    pod = SimpleNamespace(http_url="127.0.0.1:8000", metrics_url="http://127.0.0.1:8002/metrics")
    settings = {**operator_vs_static.FULL, "budget": 9}
    models = common.pipeline_models("pipeline_async")
    document = operator_vs_static.policies(pod, settings, models, {models[0]: models[1:]})
    config = parse_config(document)
    assert [p.spec.max_instances for p in config.policies] == [6, 6, 6, 6]
    assert config.policies[0].spec.calls == ("branch_embed", "branch_classify", "branch_rank")
    assert {(p.spec.budget.name, p.spec.budget.instances_per_pod) for p in config.policies} == {
        (operator_vs_static.BUDGET_NAME, 9)
    }


@pytest.mark.unit
def test_static_configurations_use_the_whole_budget() -> None:
    configurations = operator_vs_static.static_configurations(6, ("a", "b", "c", "d"))
    assert len(configurations) == 10  # 2 extra instances over 4 models: C(5, 3)
    assert all(sum(c.values()) == 6 and min(c.values()) >= 1 for c in configurations)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("root", "callees"),
    [
        ("pipeline_async", ("branch_embed", "branch_classify", "branch_rank")),
        ("pipeline_sync", ("branch_embed", "branch_classify", "branch_rank")),
        ("chain_async", ("chain_tokenize", "chain_encode", "chain_head")),
        ("fanout_async", ("fanout_detect", "fanout_classify", "fanout_verify")),
    ],
)
def test_a_pipeline_is_its_root_and_what_its_spec_calls(root: str, callees: tuple) -> None:
    assert common.pipeline_models(root) == (root, *callees)
    # Each of them is a model of the repository.
    for model in (root, *callees):
        assert (REPO_ROOT / "models" / model / "config.pbtxt").is_file(), model


@pytest.mark.unit
def test_a_root_without_a_spec_or_without_calls_is_refused_in_one_sentence() -> None:
    with pytest.raises(ValueError, match="no InstanceGroupAutoscaler .* names model 'add_sub'"):
        common.pipeline_models("add_sub")
    with pytest.raises(ValueError, match=r"branch-rank.yaml: branch_rank calls no model"):
        common.pipeline_models("branch_rank")


@pytest.mark.unit
def test_the_root_on_the_command_line_picks_the_pipeline_and_its_budget_floor(
    capsys: pytest.CaptureFixture,
) -> None:
    def arguments(*argv: str) -> dict:
        _, settings = common.budget_arguments(
            "d", "b", None, operator_vs_static.QUICK, operator_vs_static.FULL, list(argv),
            default_root=operator_vs_static.DEFAULT_ROOT,
        )  # fmt: skip
        return settings

    assert arguments()["root"] == "pipeline_async"
    assert arguments("--root", "chain_async", "--quick")["root"] == "chain_async"
    for argv, message in (
        (["--root", "add_sub"], "--root add_sub: no InstanceGroupAutoscaler"),
        (["--root", "fanout_async", "--budget", "3"], "--budget must be at least 4"),
    ):
        with pytest.raises(SystemExit) as exit_:
            arguments(*argv)
        assert exit_.value.code == 2 and message in capsys.readouterr().err, argv


# One other shape is enough for the plumbing (any root and what its spec calls): chain_async's
# stages, one without a batcher. fanout_async's models are checked in test_pipeline_shapes.py.
@pytest.mark.parametrize("root", ["chain_async"])
def test_operator_vs_static_quick_on_another_pipeline(
    triton: LocalTriton, tmp_path: Path, root: str
) -> None:
    models = common.pipeline_models(root)
    instances = common.Instances(triton)
    before = {model: instances.get(model) for model in models}
    result = operator_vs_static.run(triton, {**operator_vs_static.QUICK, "root": root})
    result["operator"].pop("decision_log")
    doc = _written(
        "operator_vs_static", result, tmp_path, lambda p: operator_vs_static.plot(result, p)
    )
    assert doc["root"] == root and doc["models"] == list(models)
    assert doc["best_static_rps"] > 0 and doc["operator_rps"] > 0
    assert [set(row["instances"]) for row in doc["static_sweep"]] == [set(models)]
    # The policy file the driver ran with is this pipeline's: the root calls its callees.
    policies = {p["spec"]["model"]: p["spec"] for p in doc["operator"]["policy_file"]["policies"]}
    assert list(policies) == list(models)
    assert policies[root]["calls"] == list(models[1:])
    assert all("calls" not in policies[model] for model in models[1:])
    assert doc["operator"]["decisions"] > 0, doc["operator"]["tune_output_tail"]
    assert set(doc["best_static_rechecked"]["instances"]) == set(models)
    assert {model: instances.get(model) for model in models} == before


@pytest.mark.parametrize("name", ["bls_hop"])
def test_the_documented_command_runs(name: str, tmp_path: Path) -> None:
    out = tmp_path / f"{name}.json"
    done = subprocess.run(
        [sys.executable, "-m", f"loadtests.bench.{name}", "--quick", "--out", str(out)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "starting tritonserver" in done.stdout and f"wrote {out}" in done.stdout
    assert json.loads(out.read_text())["benchmark"] == name
    assert out.with_suffix(".png").is_file()


@pytest.mark.unit
def test_the_splits_that_serve_as_much_as_the_best_are_those_within_two_percent() -> None:
    a, b, c = ({"root": n, "child": 5 - n} for n in (3, 2, 1))
    rechecked = {
        "instances": a,
        "throughput_rps": 441.4,
        "contenders": [
            {"instances": a, "throughput_rps": 441.4},
            {"instances": b, "throughput_rps": 433.0},  # 0.981 of the best
            {"instances": c, "throughput_rps": 432.0},  # 0.979
        ],
    }
    assert common.best_splits(rechecked) == [a, b]
    timeline = [
        {"phase": "high load", "t_s": 2.0, "instances": c},
        {"phase": "high load", "t_s": 4.0, "instances": b},
        {"phase": "high load", "t_s": 6.0, "instances": a},
    ]
    assert common.first_held(timeline, "high load", common.best_splits(rechecked), 1.0) == 3.0
    assert common.first_held(timeline, "low load", [a], 0.0) is None


class _SplitLoad:
    """A running load whose rate is the split's the counts say (each window 0.01 s long)."""

    def __init__(self, counts: dict[str, int], rates: dict[tuple[int, ...], float]) -> None:
        self.counts, self.rates = counts, rates

    def window(self, seconds: float, **_: Any) -> SimpleNamespace:
        rate = self.rates[tuple(self.counts.values())]
        return SimpleNamespace(throughput_rps=rate, p95_ms=None, failures=0)


class _Counts:
    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts

    def set(self, counts: dict[str, int]) -> None:
        self.counts.update(counts)

    def get(self, model: str) -> int:
        return self.counts[model]


@pytest.mark.unit
def test_the_recheck_measures_the_split_the_tuner_held_where_the_sweep_ranked_it_low() -> None:
    counts = {"root": 1, "child": 1}
    rates = {(4, 1): 400.0, (3, 2): 450.0, (2, 3): 300.0}
    settings = {"window_s": 0.01, "recheck_s": 0.08}
    # The sweep ranked (3, 2) more than 10 % below its best: not a leader of its own.
    sweep = [({"root": 4, "child": 1}, 440.0), ({"root": 3, "child": 2}, 380.0)]
    load, instances = _SplitLoad(counts, rates), _Counts(counts)
    args = (load, instances, settings, sweep, ["root", "child"])
    alone = common.best_static_rechecked(*args)  # type: ignore[arg-type]
    assert [c["instances"] for c in alone["contenders"]] == [{"root": 4, "child": 1}]
    held = {"root": 3, "child": 2}
    again = common.best_static_rechecked(*args, held=held)  # type: ignore[arg-type]
    assert [c["instances"] for c in again["contenders"]] == [{"root": 4, "child": 1}, held]
    assert again["instances"] == held and again["throughput_rps"] == 450.0
    assert again["contenders"][1]["sweep_rps"] == 380.0
