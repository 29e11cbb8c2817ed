"""Instance-count changes finish under loads that never drain, against a real Triton.

Every model of pipeline_async goes 1 -> 2 -> 3 -> 2 -> 1 through the operator's actuator,
first under a closed loop of 32 requests of 8 rows that never pauses, then under open-loop
(Poisson) arrivals at 0.9 of the capacity that loop measured; each change must be answered
by Triton and show in its config. The branches change with the root at 3, so that the model
that changes is the one its pipeline waits on and its queue never empties.

With Triton's default rate limiter (`--rate-limit=off`) the root's changes did not finish
while the loop ran (docs/count-changes.md); this test then fails on the first of them, naming
it (checked by running it against a server started with `rate_limit="off"`). The bound is a
hang's, not a speed: a change here takes about 0.2 to 1.5 s, and a stalled one never ends
while the load runs.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from loadtests.bench import count_changes
from tritonscale.local.triton_server import LocalTriton

# A hang's bound: 20 times the slowest change measured under these loads.
STALL_S = 30.0
SETTINGS = {**count_changes.FULL, "stall_s": STALL_S}


@pytest.fixture(scope="module")
def pipeline(make_module_triton: Callable[[list[str]], LocalTriton]) -> LocalTriton:
    return make_module_triton(list(count_changes.MODELS))


def test_every_model_changes_count_under_loads_that_never_drain(pipeline: LocalTriton) -> None:
    result = count_changes.under_loads(pipeline, SETTINGS, release_stalls=False)
    steps = len(count_changes.STEPS)
    for load in ("closed_loop", "open_loop"):
        done = result[load]
        changes = [(row["model"], row["from"], row["to"]) for row in done["changes"]]
        assert changes == [
            (model, before, after)
            for model in count_changes.MODELS
            for before, after in zip((1, *count_changes.STEPS), count_changes.STEPS, strict=False)
        ], changes
        assert len(changes) == steps * len(count_changes.MODELS)
        assert done["stalled"] == 0 and all(row["seconds"] is not None for row in done["changes"])
        # The load went on through every change, and lost nothing to them.
        assert done["served"] > 0 and done["failed"] == 0, (load, done["first_error"])
    assert result["open_loop"]["dropped"] == 0
