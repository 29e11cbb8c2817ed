"""Instances that do not help are given back, on the real server, by `tritonscale tune`: the
set planner's verifier judges each step up.

Two copies of a test-only model (tests/contention_models/shared_lock) on a server of this
module's own, each under the same closed-loop load (6 requests in flight, 20 ms each):

- `free`: each instance serves its requests on its own: more instances, more throughput;
- `locked`: every instance takes one fair lock around its 20 ms, so the instances run one
  at a time: more instances add nothing, and each waits inside `execute`, busy in Triton's eyes.

Both look the same to the busy and queue signals at one instance (busy 1.0, 5 queued), so the
planner adds instances to both. The verifier (tritonscale.core.verifier) keeps the free
model's step and reverts the locked model's, once, and holds it there. The driver runs in rounds called by the test (no timing assertions:
counts and reasons).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from tests.contention import ClosedLoop, contention_triton
from tritonscale.control.tick import TickResult
from tritonscale.core.verifier import STEP_FELL_SHORT
from tritonscale.drivers.tune import Tuner, parse_config
from tritonscale.local.triton_server import LocalTriton
from tritonscale.triton.actuator import Actuator

LOCKED, FREE = "locked", "free"
IN_FLIGHT = 6
INTERVAL_S = 2
MAX_ROUNDS = 60  # a hang guard: about two minutes
ROUNDS_HELD = 8  # rounds watched after the verdict

SPEC = {
    "minInstances": 1,
    "maxInstances": 4,
    "metricsWindowSeconds": 4,
    "intervalSeconds": INTERVAL_S,
    "behavior": {
        "scaleUp": {
            "stabilizationWindowSeconds": 0,
            "policies": [{"type": "Instances", "value": 2, "periodSeconds": INTERVAL_S}],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": 30,
            "policies": [{"type": "Instances", "value": 1, "periodSeconds": 10}],
        },
    },
}


@pytest.fixture(scope="module")
def triton(tmp_path_factory) -> Iterator[LocalTriton]:
    with contention_triton(
        tmp_path_factory.mktemp("contention"), {LOCKED: True, FREE: False}
    ) as server:
        yield server


async def until_given_back(
    triton: LocalTriton, reason: str
) -> tuple[dict[str, list[TickResult]], int]:
    """`tritonscale tune` under both loads, round after round, until the
    locked model's first decrease for `reason` and ROUNDS_HELD rounds after it: every round's
    results, and the index of that decrease among the locked model's."""
    config = parse_config(
        {
            "triton": {"http": [triton.http_url], "metrics": [triton.metrics_url]},
            "policies": [
                {"name": LOCKED, "spec": {"model": LOCKED, **SPEC}},
                {"name": FREE, "spec": {"model": FREE, **SPEC}},
            ],
        }
    )
    results: dict[str, list[TickResult]] = {LOCKED: [], FREE: []}
    lines: list[str] = []
    tuner = Tuner(
        config,
        actuator=Actuator(triton.repository_key),
        echo=lines.append,
        heal=False,
        on_tick=lambda name, result: results[name].append(result),
    )

    def verdict() -> int | None:
        return next(
            (
                i
                for i, r in enumerate(results[LOCKED])
                if r.reason == reason and r.decision and r.decision.direction == "down"
            ),
            None,
        )

    with ClosedLoop(triton, {LOCKED: IN_FLIGHT, FREE: IN_FLIGHT}) as load:
        for _ in range(MAX_ROUNDS):
            await tuner.round(config.policies, time.time())
            found = verdict()
            if found is not None and len(results[LOCKED]) - found > ROUNDS_HELD:
                break
            await asyncio.sleep(INTERVAL_S)
        else:
            pytest.fail(
                f"no {reason} verdict on {LOCKED} within {MAX_ROUNDS} rounds:\n"
                + "\n".join(line for line in lines if f" {LOCKED} " in line)
            )
    assert not load.errors, load.errors[:3]
    assert found is not None
    return results, found


async def test_the_set_planners_verifier_gives_back_a_step_that_bought_nothing(
    triton: LocalTriton,
) -> None:
    results, first = await until_given_back(triton, STEP_FELL_SHORT)
    locked = results[LOCKED]
    revert = locked[first]
    # The step was real (the pods ran more than one instance), then undone to 1, once.
    assert max(r.current_instances or 0 for r in locked[: first + 1]) > 1
    assert revert.desired_instances == 1
    assert "fell short" in revert.message
    reverts = [r for r in locked if r.reason == STEP_FELL_SHORT and r.decision.direction == "down"]
    assert len(reverts) == 1, [r.line() for r in reverts]
    # Held there by the correction the verdict left.
    held = locked[first + 1 :]
    assert len(held) >= ROUNDS_HELD
    assert {r.current_instances for r in held} == {1}, [r.line() for r in held]
    assert {r.desired_instances for r in held} == {1}, [r.line() for r in held]

    # The model that benefits was scaled, and kept what it got.
    free = results[FREE]
    assert max(r.current_instances or 0 for r in free) >= 2
    # (It holds, reason StepFellShort, while the locked model's step is undone.)
    undone = [r for r in free if r.reason == STEP_FELL_SHORT and r.decision.direction == "down"]
    assert not undone, [r.line() for r in undone]
    assert free[-1].current_instances >= 2
