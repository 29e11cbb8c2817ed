"""The control loop end to end: a real Triton, real Prometheus (when installed), short windows.

- The demo (`run_demo`, on free ports, short phases, an open-loop load above one instance
  each's capacity): with the operator paused the backlog grows; with it running a count
  rises and the pipeline serves more than it did paused; after the load drops the counts
  come back down.
- A Triton restarted on the same ports comes back with the repository's counts; the loop
  puts the desired count back on the next tick.
- Prometheus stopped: the loop holds (FailedGetMetrics) and resumes when it is back.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from tests.tooling import in_ci, missing, require_local_triton
from tritonscale.control.tick import FAILED_GET_METRICS, TickResult
from tritonscale.core.verifier import STEP_FELL_SHORT
from tritonscale.drivers.tune import Tuner, parse_config
from tritonscale.local.demo import (
    DemoError,
    DemoResult,
    EarlyScaleDown,
    Phase,
    PhaseRow,
    _reversals,
    _scale_downs_before,
    run_demo,
    summary_lines,
)
from tritonscale.local.ports import free_ports
from tritonscale.local.prometheus_server import LocalPrometheus, prometheus_binary
from tritonscale.local.triton_server import LocalTriton
from tritonscale.triton.actuator import Actuator
from tritonscale.triton.endpoints import local_endpoints

SHORT = {
    # At light load a few requests that meet a busy branch make the queue/compute ratio jump
    # (seen: 0.7 at 0.09 busy), which asks for an instance the next window takes back; a
    # looser queue target keeps these tests on the utilization signal they are about.
    "targets": {"queueComputeRatio": 2.0},
    "metricsWindowSeconds": 4,
    "intervalSeconds": 2,
    "behavior": {
        "scaleUp": {"policies": [{"type": "Instances", "value": 2, "periodSeconds": 2}]},
        "scaleDown": {
            "stabilizationWindowSeconds": 10,
            "policies": [{"type": "Instances", "value": 1, "periodSeconds": 2}],
        },
    },
}
PAUSED, HIGH, LOW = "high, operator paused", "high", "low"


def _require_triton() -> None:
    require_local_triton()


def _policies(models: dict[str, dict]) -> list[dict]:
    return [
        {"name": model.replace("_", "-"), "spec": {**SHORT, "model": model, **extra}}
        for model, extra in models.items()
    ]


# ---- the demo: an open-loop load above the starting capacity, paused, running, dropped ----

DEMO_POLICIES = {
    "triton": {"http": ["127.0.0.1:1"], "metrics": ["http://127.0.0.1:1/metrics"]},
    "policies": _policies(
        {
            "pipeline_async": {"calls": ["branch_embed"], "maxInstances": 4},
            "branch_embed": {"maxInstances": 4},
        }
    ),
}
# Each model's floor (spec.minInstances), as the operator reads the demo's policies.
FLOOR = {p.spec.model: p.spec.min_instances for p in parse_config(DEMO_POLICIES).policies}


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoResult:
    _require_triton()
    if prometheus_binary() is None and in_ci():
        missing("prometheus not installed (Debian package 'prometheus')")
    out = tmp_path_factory.mktemp("demo")
    policies = out / "policies.yaml"
    policies.write_text(yaml.safe_dump(DEMO_POLICIES))
    lines: list[str] = []
    result = run_demo(
        out,
        phases=(
            Phase(PAUSED, 1.6, 8, operator=False),
            Phase(HIGH, 1.6, 40),
            Phase(LOW, 0.1, 36),
        ),
        ports=tuple(free_ports(3)),
        metrics_port=0,
        prometheus_port=0,
        policies=policies,
        capacity_seconds=3,
        echo=lines.append,
    )
    print("\n".join(lines))
    return result


def test_paused_the_backlog_grows_and_no_count_changes(demo: DemoResult) -> None:
    paused = demo.row(PAUSED)
    assert paused.load is not None and paused.end_load is not None
    # 1.6 times what one instance each serves: the server falls behind and stays behind.
    assert paused.load.served < paused.load.offered
    assert paused.end_load.in_flight > 0
    assert set(paused.instances_max.values()) == {1}, paused.instances_max


def test_running_a_count_rises_and_the_pipeline_serves_more(demo: DemoResult) -> None:
    paused, high = demo.row(PAUSED), demo.row(HIGH)
    grown = [model for model, count in high.instances_max.items() if count > 1]
    assert grown, f"no count rose under load: {high.instances_max}"
    assert any(model in demo.step_to_applied_s for model in grown)
    assert high.load is not None and paused.load is not None
    assert high.load.served_rps > paused.load.served_rps


def test_after_the_load_the_counts_come_back_down(demo: DemoResult) -> None:
    # Inside the high phase a count may rise in the reaction and come back before the drop
    # (the backlog drained, a verifier's give-back): the demo promises where each count ends and
    # that whatever was still up when the load dropped came down after it, not when.
    high, low = demo.row(HIGH), demo.row(LOW)
    risen = {model: peak for model, peak in high.instances_max.items() if peak > FLOOR[model]}
    assert risen, f"no count rose under the high load: {high.instances_max}"
    for model, peak in risen.items():
        assert low.instances_end[model] < peak, f"{model} stayed at its peak {peak}"
        at_drop = high.instances_end[model]
        if at_drop > FLOOR[model]:
            assert model in demo.scale_down_after_s, (
                f"{model} was at {at_drop} (floor {FLOOR[model]}) when the load dropped and "
                f"never came down after it: {demo.scale_down_after_s}"
            )
        else:
            # Back at the floor before the drop: the summary names when and which signal.
            early = demo.scaled_down_before_drop.get(model)
            assert early is not None, f"{model} rose to {peak}, was at {at_drop} at the drop"
            assert early.phase == HIGH and early.reason, early
    text = "\n".join(summary_lines(demo))
    for model, early in demo.scaled_down_before_drop.items():
        assert f"{model} {early.seconds_into_phase:.0f} s into '{early.phase}'" in text, text


def test_the_demo_reports_its_run(demo: DemoResult) -> None:
    records = demo.decision_log.read_text().splitlines()
    assert len(records) > 10
    assert any('"reason": "Paused"' in record for record in records)
    text = "\n".join(summary_lines(demo))
    for phrase in (
        PAUSED,
        "offered",
        "served",
        "p95 back under",
        "came down before the load dropped",
        "first scale-up applied",
        "reversed the previous one",
        "given back once",
    ):
        assert phrase in text
    assert demo.metrics == ("prometheus" if prometheus_binary() else "scrape")
    assert demo.capacity_rps > 0
    history = demo.load_history.read_text().splitlines()
    assert history[0].startswith("t,offered_rps,served_rps")
    assert len(history) > 60
    assert demo.report is not None and demo.report.is_file()
    for plot in ("throughput.png", "latency.png", "instances.png"):
        assert (demo.report.parent / plot).stat().st_size > 1000


def _tick(model: str, at: float, before: int, after: int, reason: str) -> SimpleNamespace:
    """What `_reversals` reads of a TickResult: one applied change on one pod."""
    pod = SimpleNamespace(ok=True, before=before, after=after)
    return SimpleNamespace(
        model=model, at=at, applied=[pod], decision=SimpleNamespace(reason=reason)
    )


@pytest.mark.unit
def test_reversals_count_flaps_and_the_verifiers_give_backs_apart() -> None:
    row = PhaseRow(Phase("high", 1.4, 100), start=0.0, end=100.0, rate=100.0)
    ticks = [
        # up in the reaction, down after it: a reversal, whatever the first change's time
        ("a", _tick("a", 20, 1, 2, "HighUtilization")),
        ("a", _tick("a", 40, 2, 1, "LowUtilization")),
        # up, then given back once by the verifier: counted apart
        ("b", _tick("b", 25, 1, 2, "HighUtilization")),
        ("b", _tick("b", 45, 2, 1, STEP_FELL_SHORT)),
        # two ups: no reversal
        ("c", _tick("c", 35, 1, 2, "HighUtilization")),
        ("c", _tick("c", 50, 2, 3, "HighUtilization")),
        # down within the reaction after an up within it: the reaction's own business
        ("d", _tick("d", 5, 1, 2, "HighUtilization")),
        ("d", _tick("d", 10, 2, 1, "LowUtilization")),
        # given back by the verifier within the reaction, then up again after it: the
        # give-back counts whenever it came, and the rise after it is a reversal
        ("e", _tick("e", 8, 1, 4, "HighUtilization")),
        ("e", _tick("e", 20, 4, 1, STEP_FELL_SHORT)),
        ("e", _tick("e", 32, 1, 4, "HighUtilization")),
        # the set planner's verifier undoing a step that fell short: counted apart too
        ("f", _tick("f", 30, 2, 4, "MaxThroughput")),
        ("f", _tick("f", 50, 4, 2, STEP_FELL_SHORT)),
    ]
    assert _reversals(ticks, [row]) == ({"a": 1, "e": 1}, {"b": 1, "e": 1, "f": 1})


@pytest.mark.unit
def test_a_decrease_before_the_drop_is_reported_with_its_phase_time_and_signal() -> None:
    paused = PhaseRow(Phase("paused", 1.4, 10, operator=False), start=0.0, end=10.0, rate=100.0)
    high = PhaseRow(Phase("high", 1.4, 100), start=10.0, end=110.0, rate=100.0)
    low = PhaseRow(Phase("low", 0.2, 60), start=110.0, end=170.0, rate=10.0)
    ticks = [
        ("a", _tick("a", 30, 1, 3, "HighUtilization")),
        ("a", _tick("a", 70, 3, 2, "LowUtilization")),  # within the high phase: reported
        ("a", _tick("a", 80, 2, 1, "LowUtilization")),  # a later one: the first is kept
        ("b", _tick("b", 40, 1, 2, "HighUtilization")),
        ("b", _tick("b", 120, 2, 1, "LowUtilization")),  # after the drop: not early
        ("c", _tick("c", 5, 2, 1, "LowUtilization")),  # paused phase: not the operator's
    ]
    early = _scale_downs_before(ticks, [paused, high, low], low)
    assert early == {"a": EarlyScaleDown("high", 60.0, "LowUtilization")}


# ---- faults: a restarted Triton, a Prometheus outage ------------------------------------


@pytest.fixture(scope="module")
def branch_triton() -> Iterator[LocalTriton]:
    _require_triton()
    with LocalTriton(http_port=0, grpc_port=0, metrics_port=0, models=["branch_rank"]) as server:
        yield server


class _Loop:
    """A Tuner in a thread, collecting its ticks."""

    def __init__(self, server: LocalTriton, config: dict) -> None:
        self.ticks: list[TickResult] = []
        self.stop = threading.Event()
        self.tuner = Tuner(
            parse_config(config),
            actuator=Actuator(server.repository_key),
            echo=print,
            on_tick=lambda _, result: self.ticks.append(result),
        )
        self.thread = threading.Thread(target=self.tuner.run, kwargs={"stop": self.stop})

    def __enter__(self) -> _Loop:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=60)

    def wait_for(
        self, check: Callable[[TickResult], bool], timeout_s: float, since: float = 0
    ) -> TickResult:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            for tick in list(self.ticks):
                if tick.at >= since and check(tick):
                    return tick
            time.sleep(0.2)
        raise AssertionError(
            f"no tick matched in {timeout_s:.0f} s; last: {self.ticks[-1].line() if self.ticks else None}"
        )


def _config(server: LocalTriton, models: dict[str, dict], prometheus: str | None = None) -> dict:
    config: dict = {
        "triton": {"http": [server.http_url], "metrics": [server.metrics_url]},
        "policies": _policies(models),
    }
    if prometheus:
        config["metrics"] = {"source": "prometheus", "prometheusUrl": prometheus}
    return config


async def test_a_restarted_triton_gets_its_count_back(branch_triton: LocalTriton) -> None:
    endpoint = local_endpoints([branch_triton.http_url])[0]
    actuator = Actuator(branch_triton.repository_key)
    with _Loop(branch_triton, _config(branch_triton, {"branch_rank": {"minInstances": 2}})) as loop:
        loop.wait_for(lambda t: t.live_counts.get(endpoint.name) == 2, timeout_s=20)
        branch_triton.stop()
        # From the stop on: on busy cores the loop may restore the count before start()
        # returns (the server answers before its last readiness check has).
        back = time.time()
        branch_triton.start()  # the same ports; the repository says 1 instance
        restored = loop.wait_for(
            lambda t: bool(t.applied) and t.applied[0].ok and t.applied[0].after == 2,
            timeout_s=30,
            since=back,
        )
        print(f"count restored {restored.at + restored.duration_s - back:.1f} s after the restart")
    assert restored.applied[0].before == 1
    assert await actuator.live_count(endpoint, "branch_rank") == 2


async def test_the_loop_holds_while_prometheus_is_down(branch_triton: LocalTriton) -> None:
    if prometheus_binary() is None:
        missing("prometheus not installed (Debian package 'prometheus')")
    endpoint = local_endpoints([branch_triton.http_url])[0]
    await Actuator(branch_triton.repository_key).apply([endpoint], "branch_rank", 2)
    target = branch_triton.metrics_url.removeprefix("http://").removesuffix("/metrics")
    with LocalPrometheus({"triton": [target]}, scrape_interval_s=0.5) as prometheus:
        prometheus.wait_for("nv_inference_request_success", timeout_s=30)
        config = _config(branch_triton, {"branch_rank": {"maxInstances": 4}}, prometheus.url)
        with _Loop(branch_triton, config) as loop:
            # Idle at 2 instances, the policy wants fewer once the window is complete.
            loop.wait_for(lambda t: t.reason not in ("WarmingUp", FAILED_GET_METRICS), timeout_s=30)
            prometheus.stop()
            down = time.time()
            held = loop.wait_for(lambda t: t.reason == FAILED_GET_METRICS, timeout_s=20, since=down)
            assert "unreachable" in held.message
            during = [t for t in loop.ticks if t.at >= down]
            assert all(t.applied == [] for t in during), "no load while the metrics are down"
            assert all(t.desired_instances == t.current_instances for t in during)
            prometheus.start()
            up = time.time()
            resumed = loop.wait_for(
                lambda t: t.reason != FAILED_GET_METRICS, timeout_s=30, since=up
            )
    assert resumed.decision is not None and resumed.snapshot is not None


def test_a_taken_port_is_one_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        http_port, metrics_port = free_ports(2)
        with pytest.raises(DemoError, match=f"port {port} is in use"):
            run_demo(tmp_path, ports=(http_port, port, metrics_port), echo=lambda line: None)
