"""A reload that does not finish, against a real Triton: the tick ends at its deadline, the old
instances keep serving, and another autoscaler keeps deciding and applying meanwhile.

Triton 2.51 can leave a reload hanging (seen: bls_decoupled_sync to 2 instances while
requests were stuck). The test model `hang_on_reload` (tests/models/) does it on demand: a
new instance's initialize() waits until the test drops a `release` file beside its config.
Measured with it: the load call does not return, the model stays READY with the old count,
the repository index says READY, and a second load waits behind the first.

Both drivers are driven into it, each with two autoscalers on one Triton: one on the model
that hangs, one on add_sub. No timing is asserted beyond the bound itself: the stuck tick
must end while its load is still hung (it cannot finish before the release), the other
autoscaler must tick several times within that one tick and apply a change while the load
hangs, and nothing piles a second load.

add_sub starts at the count its autoscaler wants, and is moved off it once the reload hangs:
a load of add_sub that reached the same Triton within milliseconds of the hung one was seen
(once in six runs) to wait until the hung one ended. That is Triton's doing; the operator's
part, a tick bounded by the deadline, held then too (add_sub's tick ended with ReloadTimeout).
"""

from __future__ import annotations

import asyncio
import inspect
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.faults import add_sub_inputs
from tests.operator_harness import (
    IGA,
    NAMESPACE,
    PODS,
    TRITON_LABELS,
    Emulator,
    autoscaler,
    condition,
    events_for,
    eventually,
    eventually_async,
    register_resources,
    running_operator,
    status_of,
    ticks,
    triton_pod,
)
from tests.tooling import missing
from tritonscale.control.tick import RELOAD_TIMEOUT, TickResult
from tritonscale.drivers import kopf_operator as kopf_driver
from tritonscale.drivers.tune import Tuner, parse_config
from tritonscale.local.triton_server import DEFAULT_MODEL_REPOSITORY, LocalTriton, LocalTritonError
from tritonscale.triton.actuator import Actuator
from tritonscale.triton.client import AsyncTritonClient
from tritonscale.triton.connections import Connections
from tritonscale.triton.endpoints import Endpoint

TEST_MODELS = Path(__file__).resolve().parent / "models"
HANGS = "hang_on_reload"
# Shorter than the default (30 s), so that the test is; still long enough for the loads
# that must finish (a normal reload took 0.4-3.5 s, and once 6.5 s with the machine busy).
DEADLINE_S = 20.0
WAIT_S = 90.0


class HangingTriton:
    """A Triton serving hang_on_reload and add_sub; `release()` lets a hung reload finish."""

    def __init__(self, repository: Path) -> None:
        shutil.copytree(TEST_MODELS / HANGS, repository / HANGS)
        shutil.copytree(DEFAULT_MODEL_REPOSITORY / "add_sub", repository / "add_sub")
        self.release_file = repository / HANGS / "release"
        self.server = LocalTriton(
            repository, http_port=0, grpc_port=0, metrics_port=0, exit_timeout_s=3
        )

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(self.server.http_url, self.server.http_url, self.server.metrics_url)

    def released(self) -> bool:
        return self.release_file.exists()

    def release(self) -> None:
        self.release_file.touch()

    async def live_count(self, model: str) -> int:
        return await Actuator(self.server.repository_key).live_count(self.endpoint, model)

    async def set_count(self, model: str, count: int) -> None:
        """What a person (or a restarted pod) might do behind the autoscaler's back."""
        result = await Actuator(self.server.repository_key).apply_one(self.endpoint, model, count)
        assert result is None or result.ok, result

    def answers(self, model: str, count: int = 5) -> None:
        """`count` requests to `model`, every answer checked (add_sub's interface)."""
        rng = np.random.default_rng(0)
        with httpclient.InferenceServerClient(self.server.http_url, network_timeout=30) as client:
            for _ in range(count):
                a, b = rng.random(4, dtype=np.float32), rng.random(4, dtype=np.float32)
                result = client.infer(model, add_sub_inputs(a, b))
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


@pytest.fixture
async def hanging(tmp_path: Path) -> Iterator[HangingTriton]:
    triton = HangingTriton(tmp_path / "models")
    try:
        triton.server.start()
    except LocalTritonError as error:
        if "not found: install" in str(error):
            missing(str(error))
        raise
    try:
        await triton.set_count("add_sub", 2)  # where its autoscaler wants it (see the docstring)
        yield triton
    finally:
        # Let a hung load end, so that its connection closes and Triton stops at once.
        triton.release()
        triton.server.stop()


def spec(model: str) -> dict[str, Any]:
    """A spec that must bring `model` from 1 instance to 2 at once, whatever the load."""
    return {
        "model": model,
        "minInstances": 2,
        "maxInstances": 2,
        "intervalSeconds": 1,
        "metricsWindowSeconds": 2,
    }


async def is_count(triton: HangingTriton, model: str, count: int) -> bool:
    return await triton.live_count(model) == count


async def wait_for(check: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    """`check()` until it is true (awaited when it is a coroutine), on the test's event loop."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


# ---- the actuator's rollout -------------------------------------------------------------------


async def test_a_pod_whose_reload_hangs_holds_back_no_other_pod(
    hanging: HangingTriton, tmp_path: Path
) -> None:
    """The first pod takes the change alone; then the others go together: one that hangs
    ends pending at the deadline, the one after it has its new count all the same (one at a
    time, the rollout would have stopped at the hung pod)."""
    calm_repository = tmp_path / "calm"
    shutil.copytree(TEST_MODELS / HANGS, calm_repository / HANGS)
    config = calm_repository / HANGS / "config.pbtxt"
    config.write_text(config.read_text().replace('string_value: "1"', 'string_value: "100"'))
    key = hanging.server.repository_key
    calm = [
        LocalTriton(
            calm_repository,
            http_port=0,
            grpc_port=0,
            metrics_port=0,
            exit_timeout_s=3,
            repository_key=key,
        )
        for _ in range(2)
    ]
    try:
        for server in calm:
            server.start()
        pods = [
            Endpoint("pod-a", calm[0].http_url),
            Endpoint("pod-b", hanging.server.http_url),
            Endpoint("pod-c", calm[1].http_url),
        ]
        actuator = Actuator(key, load_deadline_s=DEADLINE_S)
        results = await actuator.apply(pods, HANGS, 2)
        assert not hanging.released()
        assert [(r.pod, r.ok, r.pending) for r in results] == [
            ("pod-a", True, False),
            ("pod-b", False, True),
            ("pod-c", True, False),
        ]
        # pod-b's config still says 1. Triton's API cannot tell a new instance that serves
        # before Triton confirms it (a change its rate limiter holds under load) from one
        # whose initialize() hangs (this model), so the operator counts the larger of the
        # two counts until Triton answers: never less than what runs.
        assert await hanging.live_count(HANGS) == 1
        assert (await actuator.live_counts(pods, HANGS))[0] == {"pod-a": 2, "pod-b": 2, "pod-c": 2}
        # While pod-b's load is in flight, nothing more is sent there.
        assert actuator.in_flight(pods[1], HANGS) is not None
        (again,) = await actuator.apply(pods, HANGS, 2)
        assert (again.pod, again.pending, again.seconds) == ("pod-b", True, 0.0)
        assert "has not confirmed" in again.reason and "up to 2 instances" in again.reason
        print(f"pod-a {results[0].seconds:.2f} s, pod-c {results[2].seconds:.2f} s")
    finally:
        for server in calm:
            server.stop()


# ---- the local driver ------------------------------------------------------------------------


async def test_tune_a_hung_reload_ends_its_tick_at_the_deadline_and_delays_no_other_policy(
    hanging: HangingTriton,
) -> None:
    config = parse_config(
        {
            "triton": {"http": [hanging.server.http_url], "metrics": [hanging.server.metrics_url]},
            "metrics": {"source": "scrape"},
            "policies": [
                {"name": "hangs", "spec": spec(HANGS)},
                {"name": "adds", "spec": spec("add_sub")},
            ],
        }
    )
    seen: list[tuple[str, TickResult]] = []
    printed: list[str] = []
    tuner = Tuner(
        config,
        actuator=Actuator(hanging.server.repository_key, load_deadline_s=DEADLINE_S),
        echo=printed.append,
        on_tick=lambda name, result: seen.append((name, result)),
    )

    def of(name: str) -> list[TickResult]:
        return [result for policy, result in list(seen) if policy == name]

    stop = threading.Event()
    loop = threading.Thread(target=tuner.run, kwargs={"stop": stop}, name="tune under test")
    loop.start()
    try:
        stuck: TickResult = await wait_for(lambda: next(iter(of("hangs")), None), "the first tick")
        # The run's calls go over its kept-open connections (new ones while the load hangs).
        assert tuner.actuator.connections is not None
        # The load cannot finish before the release: the tick ended without it.
        assert not hanging.released()
        assert stuck.reason == RELOAD_TIMEOUT, stuck.line()
        (load,) = stuck.applied
        # `after`: the count taken for what runs until Triton answers (the larger one).
        assert load.pending and not load.ok and (load.before, load.after) == (1, 2)
        message = stuck.errors[0].message
        assert HANGS in message and hanging.endpoint.name in message, message
        assert f"deadline of {DEADLINE_S:g} s" in message and "\n" not in message
        able = next(c for c in stuck.conditions if c["type"] == "AbleToScale")
        assert (able["status"], able["reason"]) == ("False", RELOAD_TIMEOUT)
        assert any("ReloadTimeout" in line and HANGS in line for line in printed)
        # A bound, not a speed: the load itself would have waited up to 10 minutes.
        assert stuck.duration_s < DEADLINE_S + 30, stuck.duration_s

        # Meanwhile the other policy kept its schedule...
        during = [
            tick
            for tick in of("adds")
            if tick.at >= stuck.at and tick.finished_at <= stuck.finished_at
        ]
        assert len(during) >= 3, [tick.line() for tick in of("adds")]
        assert all(tick.errors == [] for tick in during), [tick.line() for tick in during]
        # ...and applies a change while the load hangs.
        await hanging.set_count("add_sub", 3)
        fixed = await wait_for(
            lambda: next((t for t in of("adds") if t.applied_ok), None), "add_sub back to 2"
        )
        assert [(p.before, p.after) for p in fixed.applied] == [(3, 2)]
        assert await hanging.live_count("add_sub") == 2 and not hanging.released()

        # The old instance answers while the reload hangs.
        hanging.answers(HANGS)
        assert await hanging.live_count(HANGS) == 1

        # Later ticks say the load is still in flight, and send nothing more.
        later = await wait_for(
            lambda: of("hangs")[1:4] if len(of("hangs")) >= 4 else None, "3 ticks"
        )
        assert not hanging.released()
        for tick in later:
            assert tick.reason == RELOAD_TIMEOUT and tick.applied == [], tick.line()
            assert "has not confirmed" in tick.errors[0].message
        assert sum(len(tick.applied) for tick in of("hangs")) == 1

        # Released, Triton finishes the load: a tick that begins after it finds the count in
        # place (the ticks while it was in flight counted 2 already: the larger count).
        hanging.release()
        await wait_for(
            lambda: tuner.actuator.in_flight(hanging.endpoint, HANGS) is None,
            "Triton to answer the released load",
        )
        after = len(of("hangs")) + 1  # the tick under way may have begun before the answer
        settled = await wait_for(
            lambda: of("hangs")[after] if len(of("hangs")) > after else None,
            "a tick after the load's answer",
        )
        assert settled.live_counts == {hanging.endpoint.name: 2}, settled.line()
        assert RELOAD_TIMEOUT not in [error.reason for error in settled.errors], settled.line()
        hanging.answers(HANGS)
    finally:
        stop.set()
        loop.join(timeout=WAIT_S)
    assert not loop.is_alive(), "the tune loop did not stop"
    assert tuner.actuator.connections is None  # closed with the run
    assert not loop.is_alive(), "tune did not stop"
    print(
        f"stuck tick {stuck.duration_s:.2f} s (deadline {DEADLINE_S:g} s); "
        f"the other policy ticked {len(during)} times meanwhile, each in "
        f"{min(t.duration_s for t in during):.2f}-{max(t.duration_s for t in during):.2f} s"
    )


async def test_a_hung_load_holds_up_no_call_on_the_kept_connections(
    hanging: HangingTriton,
) -> None:
    """Triton's HTTP server runs a load on the thread of the load's connection, and keeps each
    connection on one thread: while a load to a pod is in flight, the pod's other calls go
    over new connections (tritonscale.triton.connections), never a kept one that may wait on
    that thread."""
    connections = Connections()
    key = hanging.server.repository_key
    triton = AsyncTritonClient(hanging.endpoint, key, timeout_s=3, connections=connections)
    connections_kept = 32
    try:
        # Kept-open connections, more than Triton has threads: some share the load's thread.
        await asyncio.gather(*(triton.is_model_ready("add_sub") for _ in range(connections_kept)))
        config = await triton.model_config(HANGS)
        config["instance_group"][0]["count"] = 2
        load = asyncio.ensure_future(triton.load(HANGS, config, timeout_s=WAIT_S))
        await asyncio.sleep(1)
        assert not load.done(), "the reload did not hang"
        for _ in range(3):  # each within its 3 s, or TritonUnreachable fails the test
            ready = [triton.is_model_ready("add_sub") for _ in range(connections_kept)]
            assert all(await asyncio.gather(*ready))
        assert not load.done()
        hanging.release()
        await asyncio.wait_for(load, WAIT_S)
        assert await triton.is_model_ready(HANGS)
    finally:
        hanging.release()
        await connections.close()


# ---- the Kubernetes driver -------------------------------------------------------------------


@pytest.mark.kmock(cls=Emulator)
async def test_operator_a_hung_reload_is_a_warning_and_delays_no_other_autoscaler(
    kmock: Emulator, hanging: HangingTriton
) -> None:
    api = register_resources(kmock)
    server = hanging.server
    api.objects[PODS, NAMESPACE, "triton-0"] = triton_pod(
        "triton-0", "127.0.0.1", server.http_port, server.metrics_port
    )
    selector = {"selector": {"matchLabels": TRITON_LABELS}}
    api.objects[IGA, NAMESPACE, "hangs"] = autoscaler("hangs", {**spec(HANGS), **selector})
    api.objects[IGA, NAMESPACE, "adds"] = autoscaler("adds", {**spec("add_sub"), **selector})
    config = kopf_driver.DriverConfig(
        repository_key=server.repository_key, load_deadline_s=DEADLINE_S
    )

    def warnings(name: str) -> list[dict[str, Any]]:
        return [e for e in events_for(api, name) if e["type"] == "Warning"]

    async with running_operator(api, config) as operator:
        (warning,) = await eventually(
            lambda: warnings("hangs"), "the ReloadTimeout warning", WAIT_S
        )
        assert not hanging.released()
        assert warning["reason"] == RELOAD_TIMEOUT
        assert HANGS in warning["message"] and f"deadline of {DEADLINE_S:g} s" in warning["message"]

        def able_to_scale() -> dict[str, Any] | None:
            status = status_of(api, "hangs")
            return condition(status, "AbleToScale") if status.get("conditions") else None

        able = await eventually(
            lambda: (found := able_to_scale()) and found["reason"] == RELOAD_TIMEOUT and found,
            "the ReloadTimeout condition",
        )
        assert able["status"] == "False" and HANGS in able["message"]

        # The other autoscaler applies a change and keeps ticking while the load hangs.
        await hanging.set_count("add_sub", 3)
        (rescaled,) = await eventually(
            lambda: [e for e in events_for(api, "adds") if e["reason"] == "SucceededRescale"],
            "add_sub back to 2",
            WAIT_S,
        )
        assert "add_sub 3 -> 2 instances" in rescaled["message"]
        assert await hanging.live_count("add_sub") == 2
        before = await ticks(operator, "adds")
        hung_ticks = await ticks(operator, "hangs")
        await eventually_async(
            lambda: ticks(operator, "adds"), lambda n: n >= before + 3, "3 more ticks", WAIT_S
        )
        await eventually_async(
            lambda: ticks(operator, "hangs"), lambda n: n >= hung_ticks + 2, "2 more", WAIT_S
        )
        assert not hanging.released()
        assert await hanging.live_count(HANGS) == 1
        await asyncio.to_thread(hanging.answers, HANGS)
        # One Warning for the load, not one per tick while it hangs.
        assert [e["reason"] for e in warnings("hangs")] == [RELOAD_TIMEOUT]
        assert warnings("adds") == []

        hanging.release()
        await eventually(
            lambda: status_of(api, "hangs").get("currentInstances") == 2,
            "the finished load in status",
            WAIT_S,
        )
