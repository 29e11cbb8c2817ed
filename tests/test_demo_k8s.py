"""make demo-k8s's pure parts: Triton's metrics per phase and the summary table. The demo
itself runs the chart on the local control plane (tests/cluster covers the same path)."""

from __future__ import annotations

import pytest

from hack.demo_k8s import (
    VALUES,
    PhaseRow,
    image_values,
    merged,
    served_lines,
    table,
    target_metrics,
)

pytestmark = pytest.mark.unit

# As Triton writes them (counter without _total, NaN spelled "Nan" when the window is empty).
METRICS = """\
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="pipeline_async",version="1"} 4848
nv_inference_request_success{model="branch_embed",version="1"} 9000
# TYPE nv_inference_request_summary_us summary
nv_inference_request_summary_us_count{model="pipeline_async",version="1"} 4848
nv_inference_request_summary_us_sum{model="pipeline_async",version="1"} 100
nv_inference_request_summary_us{model="pipeline_async",version="1",quantile="0.5"} 40000
nv_inference_request_summary_us{model="pipeline_async",version="1",quantile="0.95"} 89010
nv_inference_request_summary_us{model="branch_embed",version="1",quantile="0.95"} 1
"""


def test_target_metrics_reads_the_pipelines_counter_and_p95() -> None:
    assert target_metrics(METRICS) == (4848.0, 89.01)


def test_an_empty_window_has_no_p95() -> None:
    text = METRICS.replace("} 89010", "} Nan")
    assert target_metrics(text) == (4848.0, None)
    assert target_metrics("") == (0.0, None)


def test_the_table_has_a_row_per_phase_and_a_column_per_pod() -> None:
    counts = {"pipeline_async": 2, "branch_embed": 1, "branch_classify": 3, "branch_rank": None}
    rows = [
        PhaseRow("4 users", 30, requests=2400, p95_ms=61.6, counts={"t-abcde": counts}),
        PhaseRow("after the load", 45, requests=0, p95_ms=None, counts={"t-fghij": counts}),
    ]
    lines = table(rows)
    assert lines[0].split() == ["phase", "req/s", "p95", "ms", "abcde", "fghij"]
    assert lines[2].split() == ["4", "users", "80.0", "62", "2/1/3/?", "-"]
    assert lines[3].split() == ["after", "the", "load", "0.0", "-", "-", "2/1/3/?"]


def test_values_layer_as_helm_layers_files() -> None:
    base = {"triton": {"replicaCount": 2, "image": {"tag": "x"}}, "locust": {"users": 1}}
    top = {"triton": {"image": {"repository": "r"}}, "locust": {"users": 3}}
    assert merged(base, top) == {
        "triton": {"replicaCount": 2, "image": {"tag": "x", "repository": "r"}},
        "locust": {"users": 3},
    }
    assert base["triton"]["image"] == {"tag": "x"}  # the layers are left as they were


def test_every_image_comes_from_the_given_registry() -> None:
    values = merged(VALUES, image_values("127.0.0.1:5000"))
    assert values["global"]["imageRegistry"] == "127.0.0.1:5000"
    assert values["triton"]["image"]["repository"] == "tritonscale/tritonscale-triton-cpu"
    assert values["triton"]["replicaCount"] == 2  # the demo's own values stay


def test_the_served_lines_give_each_pods_share() -> None:
    assert served_lines({"t-b": 300.0, "t-a": 100.0}) == [
        "t-a: 100 pipeline_async requests served (25 %)",
        "t-b: 300 pipeline_async requests served (75 %)",
    ]
    assert served_lines({"t-a": 0.0}) == ["t-a: 0 pipeline_async requests served"]
