"""What the Kubernetes driver writes of a tick: only what changed, the rest as a heartbeat."""

from __future__ import annotations

from typing import Any

import pytest

from tritonscale.drivers.status import HEARTBEAT_S, changed

pytestmark = pytest.mark.unit


def status(at: str, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "currentInstances": 2,
        "desiredInstances": 2,
        "lastTickTime": at,
        "observedMetrics": {"busy": 0.41},
        "policyState": {"recommendations": [[1.0, 2]]},
        "lastDecision": {
            "direction": "none",
            "reason": "DesiredWithinRange",
            "message": "busy 0.41",
        },
        "conditions": [
            {"type": "AbleToScale", "status": "True", "reason": "ReadyForNewScale", "message": "a"}
        ],
    }
    return {**base, **fields}


def test_a_tick_that_only_saw_time_pass_writes_nothing() -> None:
    before = status("2026-12-03T10:00:00Z")
    after = status(
        "2026-12-03T10:00:15Z",
        observedMetrics={"busy": 0.43},
        policyState={"recommendations": [[1.0, 2], [16.0, 2]]},
        lastDecision={"direction": "none", "reason": "DesiredWithinRange", "message": "busy 0.43"},
        conditions=[
            {"type": "AbleToScale", "status": "True", "reason": "ReadyForNewScale", "message": "b"}
        ],
    )
    assert changed(before, after) == {}


def test_the_heartbeat_writes_what_moved_once_a_minute() -> None:
    before = status("2026-12-03T10:00:00Z")
    after = status("2026-12-03T10:01:00Z", observedMetrics={"busy": 0.43})
    assert HEARTBEAT_S == 60
    assert changed(before, after) == {
        "lastTickTime": "2026-12-03T10:01:00Z",
        "observedMetrics": {"busy": 0.43},
    }


@pytest.mark.parametrize(
    "news",
    [
        {"desiredInstances": 3},
        {"lastDecision": {"direction": "up", "reason": "ValidMetricFound", "message": "x"}},
        {
            "conditions": [
                {
                    "type": "AbleToScale",
                    "status": "False",
                    "reason": "FailedRescale",
                    "message": "a",
                }
            ]
        },
        {"podSet": {"name": "set-0123456789", "members": ["a", "b"]}},
    ],
    ids=["a new count", "a new direction", "a condition that flipped", "a new set"],
)
def test_news_is_written_at_once_with_everything_that_moved(news: dict[str, Any]) -> None:
    before = status("2026-12-03T10:00:00Z")
    after = status("2026-12-03T10:00:15Z", observedMetrics={"busy": 0.9}, **news)
    written = changed(before, after)
    assert written["lastTickTime"] == "2026-12-03T10:00:15Z"
    assert written["observedMetrics"] == {"busy": 0.9}
    for key, value in news.items():
        assert written[key] == value


def test_a_status_never_written_is_written_whole() -> None:
    after = status("2026-12-03T10:00:15Z")
    assert changed({}, after) == after


def test_a_null_the_api_server_dropped_is_not_news() -> None:
    # A merge patch deletes a key whose value is null: the stored backoff has no retryAt.
    before = status("2026-12-03T10:00:00Z", backoff={"failures": 0})
    after = status("2026-12-03T10:00:15Z", backoff={"failures": 0, "retryAt": None})
    assert changed(before, after) == {}
    # A null where the stored status has a value is news, and is written to delete it.
    retrying = status("2026-12-03T10:00:00Z", backoff={"failures": 1, "retryAt": 1.0e9})
    assert changed(retrying, after)["backoff"] == {"failures": 0, "retryAt": None}


def test_a_measured_latency_that_moves_is_no_news_of_its_own() -> None:
    objective = {"quantile": 0.95, "objectiveMilliseconds": 100.0}
    before = status(
        "2026-12-03T10:00:00Z", latency={**objective, "measured": {"meanMilliseconds": 12.0}}
    )
    after = status(
        "2026-12-03T10:00:15Z", latency={**objective, "measured": {"meanMilliseconds": 14.5}}
    )
    assert changed(before, after) == {}
