"""The stop signal of the control loops outside kopf (the loops themselves: test_pod_sets)."""

from __future__ import annotations

import asyncio

import pytest

from tritonscale.control.loop import Stop

pytestmark = pytest.mark.unit


async def test_a_stop_wakes_a_sleeping_loop_at_once() -> None:
    stop = Stop()
    woke = asyncio.ensure_future(stop.wait(60.0))
    await asyncio.sleep(0)
    stop.set()
    assert await asyncio.wait_for(woke, 5.0) is True
    assert await Stop().wait(0.01) is False
