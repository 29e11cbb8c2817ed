"""status.latency: a root's latency objective beside what the metrics measured.

Triton's duration counters give means: the measured side is the mean time a request spent
queued and computing; the predicted quantile is the planner's (tests/test_latency_sizing.py).
"""

from __future__ import annotations

import pytest

from tritonscale.control.tick import LatencyStatus, mean_latency_ms
from tritonscale.core.signals import ModelSignals
from tritonscale.core.spec import LatencyObjective

pytestmark = pytest.mark.unit

OBJECTIVE = LatencyObjective(quantile=0.95, milliseconds=100.0)


def signals(requests: float, failures: float, queue_s: float, compute_s: float) -> ModelSignals:
    return ModelSignals(
        model="pipeline_async",
        request_rate=requests,
        failure_rate=failures,
        execution_rate=requests,
        compute_seconds_per_second=compute_s,
        queue_seconds_per_second=queue_s,
        pending_requests=0.0,
        pods_reporting=1,
    )


def test_the_mean_is_queue_and_compute_seconds_per_request() -> None:
    # 40 requests/s, 0.4 s of queue and 1.2 s of compute each second: 40 ms a request.
    assert mean_latency_ms(signals(40.0, 0.0, 0.4, 1.2)) == pytest.approx(40.0)
    # A failed request spent its time too: 1.6 s over 32 + 8 requests.
    assert mean_latency_ms(signals(32.0, 8.0, 0.4, 1.2)) == pytest.approx(40.0)


def test_no_requests_no_measurement() -> None:
    assert mean_latency_ms(None) is None
    assert mean_latency_ms(signals(0.0, 0.0, 0.0, 0.0)) is None


def test_the_status_shows_the_objective_the_measurement_and_no_prediction_yet() -> None:
    shown = LatencyStatus.of(OBJECTIVE, signals(40.0, 0.0, 0.4, 1.2)).to_dict()
    assert shown == {
        "quantile": 0.95,
        "objectiveMilliseconds": 100.0,
        "measured": {"meanMilliseconds": 40.0},
    }
    idle = LatencyStatus.of(OBJECTIVE, None).to_dict()
    assert idle["measured"] == {} and "predicted" not in idle


def test_a_prediction_is_shown_once_a_planner_makes_one() -> None:
    shown = LatencyStatus(OBJECTIVE, 40.0, predicted_ms=87.25).to_dict()
    assert shown["predicted"] == {"quantileMilliseconds": 87.2}
