"""The local Prometheus really scrapes the real Triton, and survives a stop/start."""

from __future__ import annotations

import pytest

from tests.tooling import missing
from tritonscale.local.prometheus_server import (
    LocalPrometheus,
    LocalPrometheusError,
    prometheus_binary,
)
from tritonscale.local.triton_server import LocalTriton


@pytest.fixture(scope="module")
def prometheus(triton: LocalTriton):
    if prometheus_binary() is None:
        missing("prometheus not installed (Debian package 'prometheus')")
    target = triton.metrics_url.removeprefix("http://")
    with LocalPrometheus({"triton": [target]}, scrape_interval_s=0.5) as server:
        yield server


def test_it_scrapes_tritons_metrics(prometheus: LocalPrometheus) -> None:
    result = prometheus.wait_for('nv_inference_count{model="add_sub"}', timeout_s=30)
    assert result[0]["metric"]["job"] == "triton"


def test_a_bad_query_is_a_clear_error(prometheus: LocalPrometheus) -> None:
    with pytest.raises(LocalPrometheusError, match="query failed: .*parse error"):
        prometheus.query("rate(nv_inference_count[")


def test_it_keeps_its_data_across_a_stop_and_start(prometheus: LocalPrometheus) -> None:
    prometheus.wait_for("up", timeout_s=30)
    prometheus.stop()
    prometheus.start()
    assert prometheus.query('count_over_time(up{job="triton"}[10m])')
