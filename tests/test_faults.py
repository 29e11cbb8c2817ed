"""Faults under load, against a real Triton: what the user sees, and what brings it back.

Each test runs its own Triton (it breaks it) on free ports, sends load from threads that
check every answer (a wrong answer is never acceptable; a failed request is counted), breaks
something, and asserts: no wrong answers, failures bounded and confined to the fault, and
service back afterwards. Recovery times are printed, never asserted (2 shared cores).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator

import pytest
import requests

from tests.faults import (
    PIPELINE_MODELS,
    Load,
    add_sub_once,
    kill_stub,
    pipeline_once,
    stub_pids,
)
from tests.tooling import missing
from tritonscale.control.set_tick import reconcile
from tritonscale.control.tick import FAILED_GET_METRICS, ReconcileState
from tritonscale.local.prometheus_server import LocalPrometheus, prometheus_binary
from tritonscale.local.triton_server import LocalTriton, LocalTritonError
from tritonscale.metrics.prometheus import PrometheusSource
from tritonscale.triton import healing
from tritonscale.triton.actuator import Actuator
from tritonscale.triton.endpoints import Endpoint
from tritonscale.triton.healing import Healer


def private_triton(models: list[str]) -> LocalTriton:
    try:
        return LocalTriton(
            models=models, http_port=0, grpc_port=0, metrics_port=0, exit_timeout_s=3
        ).start()
    except LocalTritonError as error:
        if "not found: install" in str(error):
            missing(str(error))
        raise


@pytest.fixture
def pipeline_triton() -> Iterator[LocalTriton]:
    server = private_triton(PIPELINE_MODELS)
    yield server
    server.stop()


@pytest.fixture
def add_sub_triton() -> Iterator[LocalTriton]:
    server = private_triton(["add_sub"])
    yield server
    server.stop()


def group_gone(group: int, timeout_s: float = 10.0) -> bool:
    """No live process is left in the process group (killed stubs may take a moment to be reaped)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive = [
            pid
            for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
            if _group_of(pid) == group and _state_of(pid) not in ("Z", None)
        ]
        if not alive:
            return True
        time.sleep(0.2)
    return False


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _state_of(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def report_line(fault: str, load: Load, recovery_s: float | None) -> str:
    recovered = "n/a" if recovery_s is None else f"{recovery_s:.2f} s"
    failures = "; ".join(f"{n} x {why}" for why, n in load.report.failures.most_common(3))
    return (
        f"FAULT {fault}: {load.report.successes} ok, {load.report.failed} failed, "
        f"{len(load.report.wrong_answers)} wrong; recovered in {recovered}; {failures}"
    )


async def test_a_killed_branch_stub_is_healed_under_load(pipeline_triton: LocalTriton) -> None:
    """kill -9 branch_embed's stub while pipeline_async serves; healing checks every second."""
    at = Endpoint("pod-0", pipeline_triton.http_url, pipeline_triton.metrics_url)
    doctor = Healer(repository_key=pipeline_triton.repository_key)
    results: list[healing.HealingResult] = []
    with Load(pipeline_triton, pipeline_once, threads=4) as load:
        load.wait_for_successes(20, after=0)
        for model in PIPELINE_MODELS:  # the baseline of the failure counters
            await doctor.check(at, model)
        killed_at = time.monotonic()
        kill_stub(pipeline_triton, "branch_embed")
        healed_at = None
        for _ in range(30):  # one control tick a second
            await asyncio.sleep(1.0)
            for model in PIPELINE_MODELS:
                result = await doctor.check(at, model)
                if result.action != healing.NONE:
                    results.append(result)
                    if result.action == healing.RELOADED:
                        healed_at = time.monotonic()
            if healed_at is not None:
                break
        assert healed_at is not None, [r.message for r in results]
        first_ok = load.wait_for_successes(20, after=healed_at)
    print(report_line("kill -9 branch_embed stub", load, first_ok - killed_at))

    assert load.report.wrong_answers == []
    # Only branch_embed was reloaded, once; the parent was left alone.
    assert [(r.model, r.action) for r in results] == [("branch_embed", healing.RELOADED)]
    # Each failure names the branch: its dead stub, or the BLS timeout of requests queued
    # behind it (branch_timeout_us).
    assert all(
        why.startswith("[500] pipeline_async: branch_embed failed: ")
        and ("is not healthy" in why or "Request timeout expired" in why)
        for why in load.report.failures
    ), load.report.failures
    # Failures stop with the reload: nothing fails once it is done.
    assert load.report.last_failure_at() is None or load.report.last_failure_at() < healed_at
    assert load.report.successes_after(healed_at) >= 20


async def test_one_of_two_branch_instances_killed_under_load_is_healed(
    pipeline_triton: LocalTriton,
) -> None:
    """Under load the probes may miss the dead instance; failures at every check give it away."""
    at = Endpoint("pod-0", pipeline_triton.http_url, pipeline_triton.metrics_url)
    assert all(
        r.ok for r in await Actuator(pipeline_triton.repository_key).apply([at], "branch_embed", 2)
    )
    doctor = Healer(repository_key=pipeline_triton.repository_key)
    results: list[healing.HealingResult] = []
    with Load(pipeline_triton, pipeline_once, threads=6, pause_s=0) as load:
        load.wait_for_successes(20, after=0)
        for model in PIPELINE_MODELS:
            await doctor.check(at, model)
        killed_at = time.monotonic()
        kill_stub(pipeline_triton, "branch_embed")
        healed_at = None
        for _ in range(30):
            await asyncio.sleep(1.0)
            for model in PIPELINE_MODELS:
                result = await doctor.check(at, model)
                if result.action != healing.NONE:
                    results.append(result)
                    if result.model == "branch_embed" and result.action == healing.RELOADED:
                        healed_at = time.monotonic()
            if healed_at is not None:
                break
        assert healed_at is not None, [r.message for r in results]
        first_ok = load.wait_for_successes(20, after=healed_at)
    print(report_line("kill -9 one of two branch_embed stubs", load, first_ok - killed_at))
    print(f"  healed by: {[(r.model, r.cause) for r in results]}")
    assert load.report.wrong_answers == []
    assert load.report.last_failure_at() is None or load.report.last_failure_at() < healed_at
    assert await Actuator(pipeline_triton.repository_key).live_count(at, "branch_embed") == 2


async def test_stopping_and_restarting_triton_on_the_same_ports(
    add_sub_triton: LocalTriton,
) -> None:
    """A Triton restart (a pod's container restart): requests fail while it is down, then
    succeed; the instance count falls back to the repository's and the actuator restores it."""
    server = add_sub_triton
    at = Endpoint("pod-0", server.http_url, server.metrics_url)
    actuator = Actuator(server.repository_key)
    assert (await actuator.apply([at], "add_sub", 3))[0].ok
    ports = (server.http_port, server.grpc_port, server.metrics_port)
    group = os.getpgid(server.process.pid)
    with Load(server, add_sub_once, threads=4) as load:
        load.wait_for_successes(20, after=0)
        stopped_at = time.monotonic()
        server.stop()
        assert group_gone(group), "a process of the stopped server is still running"
        await asyncio.sleep(1.0)
        server.start()
        restarted_at = time.monotonic()
        first_ok = load.wait_for_successes(20, after=restarted_at)
    print(report_line("Triton stop + start", load, first_ok - stopped_at))
    print(f"  Triton restart itself took {restarted_at - stopped_at:.2f} s")

    assert (server.http_port, server.grpc_port, server.metrics_port) == ports
    assert load.report.wrong_answers == []
    assert load.report.failed > 0  # the outage was seen...
    assert load.report.first_failure_at() >= stopped_at  # ...only during it
    assert load.report.last_failure_at() < first_ok
    # The restarted server has the repository's count; the next tick brings the decision back.
    assert await actuator.live_count(at, "add_sub") == 1
    assert (await actuator.apply([at], "add_sub", 3))[0].ok
    assert await actuator.live_count(at, "add_sub") == 3


async def test_a_config_triton_refuses_leaves_the_last_good_one_serving(
    add_sub_triton: LocalTriton,
) -> None:
    """The actuator asks for KIND_GPU on a machine without GPUs: refused, nothing lost."""
    server = add_sub_triton
    at = Endpoint("pod-0", server.http_url, server.metrics_url)
    actuator = Actuator(server.repository_key)
    with Load(server, add_sub_once, threads=4) as load:
        load.wait_for_successes(20, after=0)
        (result,) = await actuator.apply([at], "add_sub", 2, "KIND_GPU")
        after = time.monotonic()
        load.wait_for_successes(20, after=after)
    print(report_line("refused config (KIND_GPU, no GPU)", load, None))
    assert not result.ok
    assert "has kind KIND_GPU but no GPUs are available" in result.reason
    assert "\n" not in result.reason
    assert (result.before, result.after) == (1, 1)
    assert load.report.failed == 0 and load.report.wrong_answers == []
    assert (await actuator.live_config(at, "add_sub"))["instance_group"][0]["kind"] == "KIND_CPU"


def test_a_config_whose_model_fails_to_initialize_leaves_the_last_good_one_serving(
    pipeline_triton: LocalTriton,
) -> None:
    """Triton accepts the config, the model's initialize() raises: the old version serves on."""
    server = pipeline_triton
    base = f"http://{server.http_url}"
    config = requests.get(f"{base}/v2/models/pipeline_async/config", timeout=10).json()
    broken = {**config, "parameters": {**config["parameters"]}}
    broken["parameters"]["preprocess_threads"] = {"string_value": "many"}
    stubs = stub_pids(server, "pipeline_async")
    with Load(server, pipeline_once, threads=4) as load:
        load.wait_for_successes(20, after=0)
        started = time.monotonic()
        refused = requests.post(
            f"{base}/v2/repository/models/pipeline_async/load",
            json={"parameters": {"config": json.dumps(broken)}},
            headers=server.repository_headers,
            timeout=120,
        )
        load_s = time.monotonic() - started
        load.wait_for_successes(20, after=time.monotonic())
    print(report_line("config whose initialize() fails", load, None))
    print(f"  the failed load took {load_s:.2f} s")
    assert refused.status_code == 400, refused.text
    assert "invalid literal for int()" in refused.json()["error"]
    assert load.report.failed == 0 and load.report.wrong_answers == []
    live = requests.get(f"{base}/v2/models/pipeline_async/config", timeout=10).json()
    assert live["parameters"]["preprocess_threads"] == config["parameters"]["preprocess_threads"]
    assert requests.get(f"{base}/v2/models/pipeline_async/ready").status_code == 200
    assert stub_pids(server, "pipeline_async") == stubs


async def test_a_prometheus_outage_holds_the_count_and_says_so_in_one_line(
    add_sub_triton: LocalTriton,
) -> None:
    """Prometheus stops for a while: the tick reports FailedGetMetrics and never scales down;
    once it is back, the same lightly loaded model is scaled down (the counterfactual). The
    load is enough requests to measure (the planner keeps the count of a model with fewer
    than 20 in a window: LowTraffic), about 20 a second, a few percent of one instance."""
    if prometheus_binary() is None:
        missing("prometheus not installed (apt-get install prometheus)")
    server = add_sub_triton
    at = Endpoint("pod-0", server.http_url, server.metrics_url)
    actuator = Actuator(server.repository_key)
    assert (await actuator.apply([at], "add_sub", 3))[0].ok
    spec = {
        "selector": {"matchLabels": {"app": "triton"}},
        "model": "add_sub",
        "minInstances": 1,
        "maxInstances": 4,
        "metricsWindowSeconds": 4,
        "intervalSeconds": 1,
        "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}},
    }
    with (
        LocalPrometheus({"triton": [f"127.0.0.1:{server.metrics_port}"]}) as prometheus,
        Load(server, add_sub_once, threads=1, pause_s=0.05) as load,
    ):
        source = PrometheusSource(prometheus.url)
        prometheus.wait_for('nv_inference_request_success{model="add_sub"}', timeout_s=30)
        prometheus.stop()
        state = ReconcileState()
        outage = []
        for _ in range(3):
            tick = await reconcile(spec, [at], source, actuator, state, now=time.time())
            state = tick.state
            outage.append(tick)
            await asyncio.sleep(1.0)
        stopped_count = await actuator.live_count(at, "add_sub")

        prometheus.start()
        recovered = None
        back: list[str] = []
        for _ in range(20):
            await asyncio.sleep(1.0)
            tick = await reconcile(spec, [at], source, actuator, state, now=time.time())
            state = tick.state
            back.append(tick.line())
            if tick.applied:
                recovered = tick
                break
    print(report_line("Prometheus outage", load, None))
    for tick in outage:
        assert [e.reason for e in tick.errors] == [FAILED_GET_METRICS]
        (error,) = tick.errors
        assert error.message == f"Prometheus at {prometheus.url} is unreachable (ConnectionError)"
        assert tick.desired_instances == 3 and tick.applied == []
        active = next(c for c in tick.conditions if c["type"] == "ScalingActive")
        assert (active["status"], active["reason"]) == ("False", FAILED_GET_METRICS)
    assert stopped_count == 3
    # Back: the idle model is scaled down, which the outage had held.
    assert recovered is not None, "\n".join(back[-5:])
    assert recovered.errors == [] and recovered.decision.direction == "down"
    assert load.report.failed == 0 and load.report.wrong_answers == []
