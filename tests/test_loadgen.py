"""The open-loop load generator against the real Triton: it keeps its schedule whatever the
server does, counts every request once, and bounds what it holds."""

from __future__ import annotations

import time

import pytest

from tritonscale.local.loadgen import HISTORY_COLUMNS, OpenLoopLoad, measure
from tritonscale.local.triton_server import LocalTriton
from tritonscale.reports.report import RunData, read_load_history


def _run(load: OpenLoopLoad, rate: float, seconds: float) -> tuple[float, float, int]:
    """(start, end, the most requests seen in flight) of `seconds` at `rate`."""
    start = time.time()
    load.set_rate(rate)
    most = 0
    while time.time() < start + seconds:
        most = max(most, load.in_flight)
        time.sleep(0.01)
    load.set_rate(0)
    return start, time.time(), most


def test_below_capacity_every_request_due_is_sent_and_answered(triton: LocalTriton) -> None:
    with OpenLoopLoad(triton.grpc_url, "add_sub", seed=1) as load:
        start, end, _ = _run(load, 40, 3)
        assert load.drain(timeout_s=30), f"{load.in_flight} requests never ended"
        stats = load.stats(start - 1, time.time())
    # Poisson arrivals at 40/s over 3 s: 120 expected, far outside these bounds by chance.
    assert 60 <= stats.offered <= 200, stats
    assert stats.failed == 0 and stats.dropped == 0, load.last_error
    assert stats.served == stats.offered and stats.in_flight == 0
    assert stats.p95_ms is not None and stats.p50_ms is not None
    assert 0 < stats.p50_ms <= stats.p95_ms


def test_over_http_every_request_due_is_sent_and_answered(triton: LocalTriton) -> None:
    with OpenLoopLoad(triton.http_url, "add_sub", seed=3, protocol="http") as load:
        start, end, _ = _run(load, 40, 2)
        assert load.drain(timeout_s=30), f"{load.in_flight} requests never ended"
        stats = load.stats(start - 1, time.time())
    assert stats.offered > 0 and stats.failed == 0 and stats.dropped == 0, load.last_error
    assert stats.served == stats.offered and stats.in_flight == 0


def test_paced_arrivals_send_exactly_the_rate(triton: LocalTriton) -> None:
    with OpenLoopLoad(triton.grpc_url, "add_sub", arrivals="paced") as load:
        start, end, _ = _run(load, 50, 2)
        assert load.drain(timeout_s=30), f"{load.in_flight} requests never ended"
        stats = load.stats(start, time.time())
    # One every 20 ms from 20 ms after the start: 100 in 2 s whatever the seed (a few fewer
    # if a busy machine stalls the generator as the rate drops to 0); Poisson arrivals
    # would stray by about 10.
    assert 95 <= stats.offered <= 101, stats
    assert stats.served == stats.offered, load.last_error


def test_an_unknown_protocol_or_arrival_process_is_refused() -> None:
    with pytest.raises(ValueError, match="protocol must be one of grpc, http"):
        OpenLoopLoad("127.0.0.1:1", protocol="rest")
    with pytest.raises(ValueError, match="arrivals must be one of poisson, paced"):
        OpenLoopLoad("127.0.0.1:1", arrivals="uniform")


def test_above_capacity_the_backlog_grows_and_the_schedule_holds(triton: LocalTriton) -> None:
    # 8-row pipeline requests: one instance each serves a few hundred per second at most.
    with OpenLoopLoad(triton.grpc_url, "pipeline_async", rows=8, seed=2) as load:
        start, end, _ = _run(load, 1000, 2)
        behind = load.stats(start, end)
        assert load.drain(timeout_s=120), f"{load.in_flight} requests never ended"
        after = load.stats(start, time.time())
    assert behind.offered > 2 * behind.served, behind
    assert behind.in_flight > 0
    # Every request due was answered in the end, none twice.
    assert after.served + after.failed == after.offered, (after, load.last_error)


def test_the_backlog_is_bounded_and_what_is_not_sent_is_counted(triton: LocalTriton) -> None:
    with OpenLoopLoad(triton.grpc_url, "pipeline_async", rows=8, max_in_flight=20) as load:
        start, end, peak = _run(load, 1000, 2)
        assert load.drain(timeout_s=60)
        stats = load.stats(start, time.time())
    assert peak <= 20
    assert stats.dropped > 0
    assert stats.served + stats.failed + stats.dropped == stats.offered


def test_the_history_is_what_the_report_reads(triton: LocalTriton, tmp_path) -> None:
    with OpenLoopLoad(triton.grpc_url, "add_sub") as load:
        start, end, _ = _run(load, 30, 3)
        load.drain(timeout_s=30)
        path = tmp_path / "load.csv"
        load.write_history(path, start, end)
    assert path.read_text().splitlines()[0] == ",".join(HISTORY_COLUMNS)
    data = RunData()
    read_load_history(path, data)
    offered = data.throughput["offered requests/s"]
    assert len(offered) == 3 and sum(v for _, v in offered) > 0
    assert data.latency_ms and data.summary["requests offered"] != "0"


def test_a_negative_rate_is_refused() -> None:
    with pytest.raises(ValueError, match="rate must be >= 0"):
        OpenLoopLoad("127.0.0.1:1").set_rate(-1)


def test_the_closed_loop_measures_a_configuration(triton: LocalTriton) -> None:
    result = measure(triton.grpc_url, "add_sub", concurrency=4, seconds=1, warmup_s=0.2)
    assert result.requests > 0 and result.failures == 0, result.first_error
    assert result.throughput_rps == result.requests / result.seconds
    assert result.p50_ms is not None and result.p95_ms is not None and result.p99_ms is not None
    assert result.p50_ms <= result.p95_ms <= result.p99_ms
