"""Self-healing against a real Triton: a killed stub is noticed and reloaded, never in a loop.

Measured here (Triton 2.51): after kill -9 of a model's stub the server and the model stay
READY and every request fails in about 1 s with "Stub process '<model>_0_0' is not healthy."
(HTTP 500), counted as a BACKEND failure; Triton does not restart the stub by itself.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.faults import PIPELINE_MODELS, add_sub_once, kill_stub, pipeline_once, stub_pids
from tests.tooling import missing
from tritonscale.local.triton_server import DEFAULT_MODEL_REPOSITORY, LocalTriton, LocalTritonError
from tritonscale.triton import healing
from tritonscale.triton.actuator import Actuator
from tritonscale.triton.endpoints import Endpoint
from tritonscale.triton.healing import Healer
from tritonscale.triton.loads import LoadsInFlight


def start(repository: Path = DEFAULT_MODEL_REPOSITORY, models: list[str] | None = None):
    try:
        return LocalTriton(
            repository, models=models, http_port=0, grpc_port=0, metrics_port=0, exit_timeout_s=3
        ).start()
    except LocalTritonError as error:
        if "not found: install" in str(error):
            missing(str(error))
        raise


@pytest.fixture(scope="module")
def server() -> Iterator[LocalTriton]:
    """A private server (the tests kill its stubs): add_sub and the pipeline."""
    triton = start(models=["add_sub", *PIPELINE_MODELS])
    yield triton
    triton.stop()


@contextmanager
def http_client(server: LocalTriton) -> Iterator[httpclient.InferenceServerClient]:
    """A client closed on this thread (gevent refuses to close it from the collector's)."""
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=30)
    try:
        yield client
    finally:
        client.close()


def endpoint(server: LocalTriton) -> Endpoint:
    return Endpoint("pod-0", server.http_url, server.metrics_url)


def healer(server: LocalTriton, **options) -> Healer:
    return Healer(repository_key=server.repository_key, **options)


def fail_requests(server: LocalTriton, model_once, count: int = 3) -> list[str]:
    """Send `count` requests that must fail; their error messages."""
    rng = np.random.default_rng(0)
    errors = []
    with http_client(server) as client:
        for _ in range(count):
            with pytest.raises(InferenceServerException) as raised:
                model_once(client, rng)
            errors.append(raised.value.message())
    return errors


def serve_correctly(server: LocalTriton, model_once, count: int = 5) -> None:
    rng = np.random.default_rng(1)
    with http_client(server) as client:
        for _ in range(count):
            model_once(client, rng)


class TestAKilledStubIsHealed:
    async def test_it_is_seen_by_backend_failures_and_reloaded_with_the_same_instances(
        self, server: LocalTriton
    ) -> None:
        doctor = healer(server)
        baseline = await doctor.check(endpoint(server), "add_sub")
        assert baseline.reason == healing.HEALTHY, baseline.message
        config_before = requests.get(f"http://{server.http_url}/v2/models/add_sub/config").json()
        killed = kill_stub(server, "add_sub")

        errors = fail_requests(server, add_sub_once)
        assert all("Stub process 'add_sub_0_0' is not healthy" in e for e in errors), errors
        # What Triton reports meanwhile: still READY, which is why healing cannot rely on it.
        base = f"http://{server.http_url}"
        assert requests.get(f"{base}/v2/models/add_sub/ready").status_code == 200
        assert requests.get(f"{base}/v2/health/ready").status_code == 200

        result = await doctor.check(endpoint(server), "add_sub")
        assert (result.action, result.reason) == (healing.RELOADED, healing.HEALED), result
        assert result.cause == healing.STUB_UNHEALTHY
        assert "backend failures" in result.message and "not healthy" in result.message
        assert result.event_type == "Normal" and result.condition()["status"] == "True"
        print(f"healed add_sub in {result.reload_s:.2f} s")

        serve_correctly(server, add_sub_once)
        assert stub_pids(server, "add_sub") and killed not in stub_pids(server, "add_sub")
        config_after = requests.get(f"{base}/v2/models/add_sub/config").json()
        assert config_after["instance_group"] == config_before["instance_group"]
        assert (await doctor.check(endpoint(server), "add_sub")).reason == healing.HEALTHY

    async def test_a_probe_finds_a_dead_stub_with_no_traffic_at_all(
        self, server: LocalTriton
    ) -> None:
        doctor = healer(server, probe=healing.PROBE_ALWAYS)
        assert (await doctor.check(endpoint(server), "branch_rank")).reason == healing.HEALTHY
        kill_stub(server, "branch_rank")
        result = await doctor.check(endpoint(server), "branch_rank")
        assert result.action == healing.RELOADED, result
        assert "Stub process 'branch_rank_0_0' is not healthy" in result.message
        serve_correctly(server, pipeline_once)

    async def test_a_hung_stub_is_found_by_a_probe_and_replaced(self, server: LocalTriton) -> None:
        """SIGSTOP: the stub is alive but answers nothing; Triton calls it unhealthy in ~1 s."""
        doctor = healer(server, probe=healing.PROBE_ALWAYS)
        at = endpoint(server)
        assert (await doctor.check(at, "branch_classify")).reason == healing.HEALTHY
        (hung,) = stub_pids(server, "branch_classify")
        os.kill(hung, signal.SIGSTOP)
        result = await doctor.check(at, "branch_classify")
        assert result.action == healing.RELOADED, result
        assert "Stub process 'branch_classify_0_0' is not healthy" in result.message
        serve_correctly(server, pipeline_once)
        assert set(stub_pids(server, "branch_classify")) - {hung}  # a fresh stub serves

    async def test_a_dead_branch_is_healed_and_its_parent_is_left_alone(
        self, server: LocalTriton
    ) -> None:
        doctor = healer(server)
        for model in ("pipeline_async", "branch_embed"):
            assert (await doctor.check(endpoint(server), model)).reason == healing.HEALTHY
        parent_stubs = stub_pids(server, "pipeline_async")
        kill_stub(server, "branch_embed")

        errors = fail_requests(server, pipeline_once)
        assert all("branch_embed" in e and "not healthy" in e for e in errors), errors
        # The parent fails everything too, but its own stub answers the probe: no reload.
        parent = await doctor.check(endpoint(server), "pipeline_async")
        assert (parent.action, parent.reason) == (healing.NONE, healing.HEALTHY), parent
        child = await doctor.check(endpoint(server), "branch_embed")
        assert child.action == healing.RELOADED, child

        serve_correctly(server, pipeline_once)
        assert stub_pids(server, "pipeline_async") == parent_stubs

    async def test_bad_requests_alone_never_cause_a_reload(self, server: LocalTriton) -> None:
        """A burst of requests the model itself refuses (NaN) is the requests' fault."""
        doctor = healer(server)
        assert (await doctor.check(endpoint(server), "pipeline_async")).reason == healing.HEALTHY
        bad = httpclient.InferInput("FEATURES", [1, 64], "FP32")
        bad.set_data_from_numpy(np.full((1, 64), np.nan, dtype=np.float32))
        with http_client(server) as client:
            for _ in range(3):
                with pytest.raises(InferenceServerException, match="must be finite"):
                    client.infer("pipeline_async", [bad])
        stubs = stub_pids(server, "pipeline_async")
        result = await doctor.check(endpoint(server), "pipeline_async")
        assert (result.action, result.reason) == (healing.NONE, healing.HEALTHY), result
        assert stub_pids(server, "pipeline_async") == stubs


async def test_one_dead_instance_among_two_is_found_and_all_are_replaced(
    server: LocalTriton,
) -> None:
    """With two instances only every other request fails; probes reach both instances."""
    at = endpoint(server)
    assert all(r.ok for r in await Actuator(server.repository_key).apply([at], "add_sub", 2))
    doctor = healer(server)
    assert (await doctor.check(at, "add_sub")).reason == healing.HEALTHY
    survivors = stub_pids(server, "add_sub")
    assert len(survivors) == 2
    killed = survivors[0]
    os.kill(killed, signal.SIGKILL)

    rng = np.random.default_rng(2)
    outcomes = []
    with http_client(server) as client:
        for _ in range(6):
            try:
                add_sub_once(client, rng)
                outcomes.append("ok")
            except InferenceServerException as error:
                assert "is not healthy" in error.message()
                outcomes.append("failed")
    assert "ok" in outcomes and "failed" in outcomes, outcomes  # a share fails

    result = await doctor.check(at, "add_sub")
    assert result.action == healing.RELOADED, result
    serve_correctly(server, add_sub_once, count=8)
    assert await Actuator(server.repository_key).live_count(at, "add_sub") == 2
    new = set(stub_pids(server, "add_sub")) - set(survivors)
    assert len(new) == 2 and killed not in new
    # Triton 2.51 never finishes unloading the replaced version once its dead stub has been
    # sent requests: the old version's live stub stays until the server stops (measured;
    # docs/reliability.md). Printed, not asserted, so that a fixed Triton is noticed.
    await asyncio.sleep(3)
    left = set(stub_pids(server, "add_sub")) & set(survivors)
    print(f"{len(left)} stub(s) of the replaced version still running 3 s after the heal")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CountingLoads(LoadsInFlight):
    """The real loads, counted as they are sent."""

    def __init__(self) -> None:
        super().__init__()
        self.loads = 0

    def run(self, pod, model, what, send):  # type: ignore[override]
        self.loads += 1
        return super().run(pod, model, what, send)


async def test_a_model_that_cannot_be_healed_is_reloaded_at_most_n_times_with_backoff(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its model.py breaks after startup: each reload fails, then healing asks for a person."""
    shutil.copytree(DEFAULT_MODEL_REPOSITORY / "add_sub", tmp_path / "add_sub")
    triton = start(tmp_path)
    try:
        clock, counted = FakeClock(), CountingLoads()
        doctor = Healer(
            repository_key=triton.repository_key,
            clock=clock,
            loads=counted,
            backoff_initial_s=10,
            backoff_max_s=40,
            max_attempts=3,
            window_s=600,
            probe=healing.PROBE_ALWAYS,
        )
        at = endpoint(triton)
        kill_stub(triton, "add_sub")
        (tmp_path / "add_sub" / "1" / "model.py").write_text("raise RuntimeError('broken')\n")

        seen = []
        for _ in range(8):  # 8 checks, 10 s apart, of a model that stays broken
            seen.append((await doctor.check(at, "add_sub")).action)
            clock.now += 10
        # Attempts at t=0, t=10 (after 10 s) and t=30 (after 20 s); then only "ask a person".
        failed, waiting, exhausted = healing.RELOAD_FAILED, healing.WAITING, healing.EXHAUSTED
        assert seen == [failed, failed, waiting, failed, exhausted, exhausted, exhausted, exhausted]
        assert counted.loads == 3
        final = await doctor.check(at, "add_sub")
        assert final.reason == healing.HEALING_EXHAUSTED and final.needs_person
        assert caplog.text.count("a person must look") == 1  # logged once, not at every check
        assert final.condition() == {
            "type": "ModelHealthy",
            "status": "False",
            "reason": "HealingExhausted",
            "message": final.message,
        }
        assert "3 reloads in the last 600 s" in final.message and "\n" not in final.message
        assert counted.loads == 3

        # Once the window has passed, one more attempt is allowed (and fails again).
        clock.now += 600
        assert (await doctor.check(at, "add_sub")).action == healing.RELOAD_FAILED
        assert counted.loads == 4
    finally:
        triton.stop()


async def test_a_reload_behind_the_actuator_s_load_says_that_it_was_not_sent() -> None:
    """While the actuator's load of the model holds the pod, the heal sends nothing and says
    so (not that its own reload outlived a deadline)."""
    triton = start(models=["add_sub"])
    try:
        loads = LoadsInFlight()
        doctor = healer(triton, loads=loads, probe=healing.PROBE_ALWAYS)
        at = endpoint(triton)
        kill_stub(triton, "add_sub")
        release = asyncio.Event()
        actuator_load = asyncio.ensure_future(
            loads.run(at.name, "add_sub", "2 instances", release.wait)
        )
        await asyncio.sleep(0)  # the actuator's load is under way
        result = await doctor.check(at, "add_sub")
        assert result.action == healing.RELOAD_FAILED, result
        assert "a load of 2 instances is still in flight on the pod" in result.message, result
        assert "deadline" not in result.message, result
        release.set()
        await actuator_load
        fresh = Healer(repository_key=triton.repository_key, probe=healing.PROBE_ALWAYS)
        assert (await fresh.check(at, "add_sub")).action == healing.RELOADED
    finally:
        triton.stop()


@pytest.mark.unit
def test_backoff_doubles_up_to_its_cap() -> None:
    doctor = Healer(repository_key="k", backoff_initial_s=10, backoff_max_s=60)
    assert [doctor.backoff_s(n) for n in (1, 2, 3, 4, 5)] == [10, 20, 40, 60, 60]


@pytest.mark.unit
async def test_an_unreachable_pod_is_not_healing_s_business() -> None:
    from tritonscale.local.ports import free_port

    doctor = Healer(repository_key="k")
    result = await doctor.check(Endpoint("gone", f"127.0.0.1:{free_port()}"), "add_sub")
    assert (result.action, result.reason) == (healing.NONE, healing.POD_UNREACHABLE)
    assert result.event_type == "Warning"


@pytest.mark.unit
@pytest.mark.parametrize("probe", ["sometimes", ""])
def test_an_unknown_probe_mode_is_refused(probe: str) -> None:
    with pytest.raises(ValueError, match="probe must be off, on-suspicion or always"):
        Healer(probe=probe)


async def test_a_healthy_server_is_never_reloaded_whatever_the_model(triton: LocalTriton) -> None:
    """Probes at every check, twice, on every model of the shared server: no false alarm."""
    index = requests.post(
        f"http://{triton.http_url}/v2/repository/index",
        json={"ready": True},
        headers=triton.repository_headers,
        timeout=10,
    ).json()
    models = sorted(row["name"] for row in index)
    assert len(models) >= 12
    counted = CountingLoads()
    doctor = Healer(repository_key=triton.repository_key, probe=healing.PROBE_ALWAYS, loads=counted)
    at = endpoint(triton)
    for _ in range(2):
        results = {model: await doctor.check(at, model) for model in models}
        assert {m: r.reason for m, r in results.items()} == dict.fromkeys(models, healing.HEALTHY)
    assert counted.loads == 0
