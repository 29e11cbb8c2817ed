"""SilentPods alone: a pod that did not answer is left out until a background call says it is
live again, with one such call at a time.

The background call here is a plain callable the test controls; the real thing, a pod that
stops answering in front of a real Triton, is in tests/test_tune_reconcile.py.
"""

from __future__ import annotations

import threading

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
        self.running = threading.Semaphore(0)
        self.answer = threading.Event()
        self.live = False

    def __call__(self, endpoint: Endpoint) -> bool:
        self.calls += 1
        self.running.release()
        assert self.answer.wait(WAIT_S), "the test never answered the background call"
        self.answer.clear()
        return self.live

    def started(self) -> None:
        assert self.running.acquire(timeout=WAIT_S), "no background call started"


def wait_until(condition, what: str) -> None:
    event = threading.Event()
    for _ in range(int(WAIT_S / 0.01)):
        if condition():
            return
        event.wait(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def no_call_running() -> bool:
    return not any(t.name.startswith("silent-pod-") for t in threading.enumerate())


def test_a_pod_never_marked_takes_part() -> None:
    assert SilentPods(lambda endpoint: True).reason(POD) is None


def test_a_marked_pod_is_left_out_while_the_background_call_runs() -> None:
    answers = Answers()
    silent = SilentPods(answers, clock=lambda: 100.0)
    silent.mark(POD, "no answer within 5 s")
    answers.started()
    why = silent.reason(POD)
    assert why is not None and why.startswith("no answer within 5 s; left out for 0 s")
    assert silent.reason(POD) is not None and answers.calls == 1  # one call at a time
    assert len(silent) == 1
    answers.live = True
    answers.answer.set()
    wait_until(lambda: len(silent) == 0, "the pod's answer")
    assert silent.reason(POD) is None and silent.reason(POD) is None


def test_a_call_that_gets_no_answer_is_made_again_on_the_next_look() -> None:
    answers = Answers()
    silent = SilentPods(answers)
    silent.mark(POD, "no answer")
    answers.started()
    answers.answer.set()  # live stays False: still silent
    wait_until(no_call_running, "the first call's end")
    assert silent.reason(POD) is not None
    answers.started()  # a second call
    assert answers.calls == 2
    answers.live = True
    answers.answer.set()
    wait_until(lambda: silent.reason(POD) is None, "the second call's answer")


def test_a_call_that_raises_counts_as_no_answer() -> None:
    def broken(endpoint: Endpoint) -> bool:
        raise ConnectionError("refused")

    silent = SilentPods(broken)
    silent.mark(POD, "refused")
    assert silent.reason(POD) is not None


def test_the_same_name_at_another_address_is_another_pod() -> None:
    answers = Answers()
    silent = SilentPods(answers)
    silent.mark(POD, "no answer")
    answers.started()
    assert silent.reason(Endpoint("pod-1", "http://10.0.0.3:8000")) is None
    answers.answer.set()
