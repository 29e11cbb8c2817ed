"""Waiting in a test for what it means: a condition, polled until it holds or a deadline
passes, and then an error that names what never happened."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

POLL_S = 0.05


def wait_for(condition: Callable[[], Any], what: str, timeout_s: float = 30.0) -> Any:
    """Poll `condition()` until it is truthy and return its value; after `timeout_s`, fail
    with "timed out ... waiting for WHAT"."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(POLL_S)


async def eventually(condition: Callable[[], Any], what: str, timeout_s: float = 30.0) -> Any:
    """`wait_for` on the test's event loop: the loop runs on between polls, and a condition
    that returns an awaitable is awaited."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(POLL_S)
