"""SilentPods alone: a pod that did not answer is left out until a background call says it is
live again, with one such call at a time.

The background call here is a coroutine the test controls; the real thing, a pod that
stops answering in front of a real Triton, is in tests/test_tune_reconcile.py.
"""

from __future__ import annotations

import asyncio

import pytest

from tritonscale.triton.endpoints import Endpoint
from tritonscale.triton.silent_pods import SilentPods

pytestmark = pytest.mark.unit

WAIT_S = 10.0
POD = Endpoint("pod-1", "http://10.0.0.2:8000")


class Answers:
    """is_live for SilentPods: each call waits for the test's answer, and is counted."""

    def __init__(self) -> None:
        self.calls = 0
        self.running = asyncio.Semaphore(0)
        self.answer = asyncio.Event()
        self.live = False
        self.active = 0

    async def __call__(self, endpoint: Endpoint) -> bool:
        self.calls += 1
        self.active += 1
        self.running.release()
        try:
            await asyncio.wait_for(self.answer.wait(), WAIT_S)
        finally:
            self.active -= 1
        self.answer.clear()
        return self.live

    async def started(self) -> None:
        await asyncio.wait_for(self.running.acquire(), WAIT_S)


async def wait_until(condition, what: str) -> None:
    for _ in range(int(WAIT_S / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def live(endpoint: Endpoint) -> bool:
    return True


async def test_a_pod_never_marked_takes_part() -> None:
    assert SilentPods(live).reason(POD) is None


async def test_a_marked_pod_is_left_out_while_the_background_call_runs() -> None:
    answers = Answers()
    silent = SilentPods(answers, clock=lambda: 100.0)
    silent.mark(POD, "no answer within 5 s")
    await answers.started()
    why = silent.reason(POD)
    assert why is not None and why.startswith("no answer within 5 s; left out for 0 s")
    assert silent.reason(POD) is not None and answers.calls == 1  # one call at a time
    assert len(silent) == 1
    answers.live = True
    answers.answer.set()
    await wait_until(lambda: len(silent) == 0, "the pod's answer")
    assert silent.reason(POD) is None and silent.reason(POD) is None


async def test_a_call_that_gets_no_answer_is_made_again_on_the_next_look() -> None:
    answers = Answers()
    silent = SilentPods(answers)
    silent.mark(POD, "no answer")
    await answers.started()
    answers.answer.set()  # live stays False: still silent
    await wait_until(lambda: answers.active == 0, "the first call's end")
    assert silent.reason(POD) is not None
    await answers.started()  # a second call
    assert answers.calls == 2
    answers.live = True
    answers.answer.set()
    await wait_until(lambda: silent.reason(POD) is None, "the second call's answer")


async def test_a_call_that_raises_counts_as_no_answer() -> None:
    async def broken(endpoint: Endpoint) -> bool:
        raise ConnectionError("refused")

    silent = SilentPods(broken)
    silent.mark(POD, "refused")
    assert silent.reason(POD) is not None


async def test_the_same_name_at_another_address_is_another_pod() -> None:
    answers = Answers()
    silent = SilentPods(answers)
    silent.mark(POD, "no answer")
    await answers.started()
    assert silent.reason(Endpoint("pod-1", "http://10.0.0.3:8000")) is None
    answers.answer.set()
