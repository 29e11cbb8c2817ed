"""How a drill with a stated bound judges its failed requests (hack.drills): only failures
inside the window Kubernetes cannot avoid are allowed, and the count outside is reported."""

from __future__ import annotations

import pytest

from hack.drills import Record, _outside_window

pytestmark = pytest.mark.unit


def failed_at(*starts: float) -> list[dict[str, float]]:
    return [{"start": start} for start in starts]


def test_failures_inside_the_window_are_allowed_and_counted_as_none_outside() -> None:
    record = Record("apiserver", detail={"failure_window": [100.0, 108.0]})
    assert _outside_window(record, failed_at(100.5, 104.0, 108.0)) == []
    assert record.detail == {"failed_outside_window": 0}


def test_a_failure_before_or_after_the_window_is_outside() -> None:
    record = Record("oom", detail={"failure_window": [100.0, 108.0]})
    # A second of slack before the window: the request began just before the sample that
    # saw the endpoints go.
    outside = _outside_window(record, failed_at(98.5, 99.5, 108.5))
    assert outside == failed_at(98.5, 108.5)
    assert record.detail["failed_outside_window"] == 2
