"""The fleet (hack.fleet): its Triton stand-in's arithmetic and metrics, and a small fleet on a
real API server where the operator tunes the pods after a load step.

The fleet test runs `python -m loadtests.bench.fleet` on 20 pods (two Deployments, ten
autoscalers) in a network namespace of its own: root, the control plane's binaries (`make
cluster-build`), and kwok (built here on first use with Go, about 4 minutes cold). No node:
KWOK runs the pods. About 110 s.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from hack import cluster, kubernetes_build
from hack.fleet import build, fleet, triton
from loadtests.bench.fleet import lateness, percentile
from tests.tooling import missing
from tritonscale.local.prometheus_server import prometheus_binary
from tritonscale.metrics.scrape import parse_metrics

ROOT = Path(__file__).resolve().parents[1]
TOOLS_DIR = ROOT / ".tools"


# ---- the Triton stand-in: pure ---------------------------------------------------------


@pytest.mark.unit
def test_below_capacity_every_request_is_served_and_busy_instances_are_rate_times_service() -> None:
    state = triton.ModelState(count=2)
    state.advance(rate=10.0, dt=10.0)  # 0.5 busy instances of 2
    assert state.success == pytest.approx(100)
    assert state.compute_us / 1e6 / 10.0 == pytest.approx(10.0 * triton.SERVICE_S)
    assert state.backlog == 0
    # M/M/1 per instance: rho = 0.25, wait = s * rho / (1 - rho) / 2.
    assert state.queue_us / 1e6 / state.success == pytest.approx(triton.SERVICE_S / 3 / 2)


@pytest.mark.unit
def test_above_capacity_a_backlog_grows_and_instances_are_all_busy() -> None:
    state = triton.ModelState(count=1)
    state.advance(rate=30.0, dt=1.0)  # capacity 20 per second
    assert state.success == pytest.approx(20)
    assert state.backlog == pytest.approx(10)
    assert state.pending == pytest.approx(10)
    assert state.compute_us / 1e6 == pytest.approx(1.0)
    # More instances drain the backlog.
    state.count = 4
    state.advance(rate=30.0, dt=1.0)
    assert state.backlog == 0
    assert state.success == pytest.approx(60)


@pytest.mark.unit
def test_the_metrics_read_as_the_operator_reads_tritons() -> None:
    pod = triton.Pod(name="p", set="s")
    pod.models["model_0"].advance(rate=8.0, dt=5.0)
    registry = triton.CollectorRegistry()
    registry.register(triton.MetricsText(pod))
    text = triton.generate_latest(registry).decode()
    # Counters without a `_total` suffix, as Triton writes them.
    assert 'nv_inference_request_success{model="model_0",version="1"} 40.0' in text
    values = parse_metrics(text)
    success = ("nv_inference_request_success", (("model", "model_0"), ("version", "1")))
    assert values[success] == 40.0
    failures = [name for name, labels in values if name == "nv_inference_request_failure"]
    assert len(failures) == len(triton.MODELS) * len(triton.FAILURE_REASONS)


@pytest.mark.unit
def test_a_config_carries_the_count_in_one_instance_group() -> None:
    config = triton.model_config("model_1", 3)
    assert config["instance_group"][0]["count"] == 3
    assert config["name"] == "model_1"


@pytest.mark.unit
def test_lateness_is_the_gap_between_tick_ends_beyond_the_interval() -> None:
    ticks = {"a": [0.0, 15.2, 30.2, 46.0], "b": [1.0, 16.0]}
    late = lateness(ticks, start=10.0, end=40.0, interval_s=15.0)
    # 15.2 follows a tick from before the window; 46.0 ended after it.
    assert late == pytest.approx([0.2, 0.0, 0.0])
    assert percentile(late, 0.99) == pytest.approx(0.2)
    assert percentile([], 0.99) is None


@pytest.mark.unit
def test_kwok_is_built_from_its_pinned_release() -> None:
    assert build.binary(TOOLS_DIR).parent.name == f"kwok-{build.VERSION}"
    assert build.PACKAGE == "sigs.k8s.io/kwok/cmd/kwok"


# ---- a fleet on a real API server ------------------------------------------------------


def _require_fleet_tools() -> None:
    if os.geteuid() != 0:
        missing("the fleet needs root (a network namespace of its own)")
    if shutil.which("ip") is None:
        missing("ip not found on PATH (iproute2)")
    if not all(path.is_file() for path in kubernetes_build.binaries(TOOLS_DIR).values()):
        if shutil.which("go") is None:
            missing("the control plane is not built and go is not on PATH: make cluster-build")
        # In the whole suite this file runs after the cluster tests, by which time their
        # build is done (tests/cluster/conftest.py); alone, it builds here (minutes cold).
        cluster.build(TOOLS_DIR, progress=lambda line: None)
    if not build.binary(TOOLS_DIR).is_file() and shutil.which("go") is None:
        missing("kwok is not built and go is not on PATH to build it")


@pytest.mark.timeout(600)
# Prometheus alone. The chart's default source, the operator's own scrapes of the pods, runs
# on the real cluster (tests/cluster, with the chart's values), and both sources read the same
# load alike (tests/test_sources.py); a second fleet for it (about 110 s of CI) proves no more.
@pytest.mark.parametrize("source", ["prometheus"])
def test_the_operator_tunes_the_pods_of_a_fleet_after_a_load_step(
    source: str, tmp_path: Path
) -> None:
    _require_fleet_tools()
    if source == "prometheus" and prometheus_binary() is None:
        missing("prometheus not found on PATH (Debian's prometheus package)")
    build.build(TOOLS_DIR, progress=lambda line: None)  # before the timed part: minutes cold
    out = tmp_path / "fleet.json"
    bench = subprocess.Popen(
        [sys.executable, "-m", "loadtests.bench.fleet", "--sizes", "20", "--sources", source]
        + ["--interval", "5", "--window", "15", "--steady-intervals", "1"]
        + ["--no-plot", "--out", str(out)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = bench.communicate(timeout=540)
    finally:
        if bench.poll() is None:
            bench.terminate()  # it stops its fleet and removes its namespace
            bench.communicate(timeout=90)
    assert bench.returncode == 0, output[-5000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert (row["pods"], row["sets"], row["autoscalers"], row["source"]) == (20, 2, 10, source)
    step = row["step"]
    # One set of ten pods, five models each, got six times the load: every count rose from
    # 1, and the other set's counts did not move.
    assert step["sets"] == 1 and step["pod_models"] == 50
    assert step["risen"] == 50, step
    assert min(int(count) for count in step["counts_after"]) >= 2, step
    assert step["unaffected_changed"] == 0, step
    assert row["seconds_to_apply_step"] is not None
    # The operator's requests reach the API server under its own user (the audit log), and
    # the Triton stand-in counted the reads of the pods' metrics: the operator's own scrapes,
    # or Prometheus's. (A steady window may see no other call to a pod at all: the counts and
    # readiness are read again when they may have changed, or after 60 s.)
    # At steady state a status is written only when it changes (or once a minute), so a
    # steady window may see none; the step's new counts are written.
    assert row["apiserver_requests_in_step_by_kind"].get("patch instancegroupautoscalers/status")
    assert row["apiserver_requests_per_interval"] <= row["autoscalers"], row
    by_call = row["triton_http_requests_per_interval_by_call"]
    assert abs(sum(by_call.values()) - row["triton_http_requests_per_interval"]) < 1, row
    if source == "prometheus":
        assert row["prometheus_scrapes_per_interval"] > 0
    else:
        assert row["triton_metrics_requests_per_interval"] > 0
    # Its network namespace is gone (the processes in it died with the run).
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"tritonscale-fleet-{bench.pid}" not in left


@pytest.mark.unit
def test_prometheus_reads_the_pods_from_a_file_labelled_as_kubernetes_labels_them(
    tmp_path: Path,
) -> None:
    prometheus = fleet.FileSdPrometheus(tmp_path / "targets.json", scrape_interval_s=5)
    try:
        (job,) = prometheus.config()["scrape_configs"]
        assert job["file_sd_configs"][0]["files"] == [str(tmp_path / "targets.json")]
        assert job["scrape_interval"] == "5000ms"
        prometheus.write_targets({"127.64.0.2": {"name": "triton-a", "set": "set-000"}})
        (target,) = json.loads((tmp_path / "targets.json").read_text())
        assert target == {
            "targets": ["127.64.0.2:8002"],
            "labels": {"namespace": fleet.NAMESPACE, "pod": "triton-a"},
        }
    finally:
        prometheus.close()  # removes its temporary folder; it never started


@pytest.mark.unit
def test_each_deployment_is_a_set_of_ten_pods_pinned_to_a_fake_node(tmp_path: Path) -> None:
    config = fleet.FleetConfig(pods=300)
    made = fleet.Fleet(config, tmp_path)
    nodes = 3  # 100 pods a node
    deployments = [made._deployment(index, nodes) for index in range(config.sets)]
    assert {d["spec"]["replicas"] for d in deployments} == {fleet.PODS_PER_SET}
    pinned = Counter(d["spec"]["template"]["spec"]["nodeName"] for d in deployments)
    assert pinned == {f"fleet-node-{n:03d}": 10 for n in range(nodes)}
    selector = deployments[7]["spec"]["selector"]["matchLabels"]
    assert selector[fleet.SET_LABEL] == "set-007"
    ports = deployments[0]["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert {p["name"]: p["containerPort"] for p in ports} == {"http": 8000, "metrics": 8002}
