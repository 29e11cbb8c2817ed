"""PrometheusSource's cost per snapshot: two queries for a whole pod set, whatever its size.

The answers come from a stand-in for Prometheus's query API (the real Prometheus answers the
same queries in tests/test_sources.py); here it counts the queries and answers each signal per
pod and model, as PromQL's `sum by (pod, model)` would.
"""

from __future__ import annotations

import re

import pytest

from tritonscale.core.signals import MetricsUnavailable
from tritonscale.metrics.prometheus import GPU_KEYS, MODEL_KEYS, PrometheusSource, QueryFailed
from tritonscale.triton.endpoints import Endpoint

pytestmark = pytest.mark.unit

MODELS = ["pipeline_async", "branch_embed", "branch_classify", "branch_rank", "other"]
PODS = [f"triton-{i}" for i in range(10)]
NOW = 1_800_000_000.0


def answer(promql: str) -> list[dict]:
    """Each signal the query names (by its `signal` label), for every pod and model: a rate of
    1 per pod, totals of 100 successes and 2 backend failures, the window's first sample 60 s
    old; no GPU (CPU pods)."""
    rows = []
    # The pods the query's matcher names (`pod=~"triton\\-0|..."`, escaped as the source
    # escapes them).
    asked = [
        pod
        for pod in PODS
        if f'"{escaped(pod)}"' in promql
        or f"{escaped(pod)}|" in promql
        or f'|{escaped(pod)}"' in promql
    ]
    for key in re.findall(r'"signal", "(\w+)"', promql):
        if key in GPU_KEYS:
            continue
        for model in MODELS:
            for pod in asked:
                value = {
                    "first_sample": NOW - 60,
                    "successes_total": 100.0,
                    "backend_failures_total": 2.0,
                }.get(key, 1.0)
                metric = {"signal": key, "pod": pod, "model": model}
                rows.append({"metric": metric, "value": [NOW, str(value)]})
    return rows


def escaped(pod: str) -> str:
    return re.escape(pod).replace("\\", "\\\\")


@pytest.fixture
def source() -> tuple[PrometheusSource, list[str]]:
    asked: list[str] = []
    prometheus = PrometheusSource("http://prometheus:9090")

    async def query(promql: str, session=None) -> list[dict]:
        asked.append(promql)
        return answer(promql)

    prometheus.query = query  # type: ignore[method-assign]
    return prometheus, asked


def endpoints() -> list[Endpoint]:
    return [Endpoint(pod, f"{pod}:8000", f"http://{pod}:8002/metrics", "ml") for pod in PODS]


async def test_a_set_of_five_models_on_ten_pods_costs_two_queries(source) -> None:
    prometheus, asked = source
    snapshot = await prometheus.snapshot(MODELS, endpoints(), 30)
    assert len(asked) == 2
    # One query per kind of signal: every model signal in one, the GPU in the other.
    assert all(f'"{key}"' in asked[0] for key in MODEL_KEYS)
    assert all(f'"{key}"' in asked[1] for key in GPU_KEYS)
    assert 'model=~"branch_classify|branch_embed|branch_rank|other|pipeline_async"' in asked[0]
    assert sorted(snapshot.models) == sorted(MODELS)
    signals = snapshot.model("branch_embed")
    assert signals is not None
    # Summed over the ten pods; each pod that exports the model counted once.
    assert signals.request_rate == pytest.approx(10.0)
    assert signals.pods_reporting == 10
    assert snapshot.complete and snapshot.gpu is None


async def test_the_rows_a_request_carries_come_with_the_other_signals(source) -> None:
    # The inference count (rows) per second, summed over the pods as the requests are: over
    # the request rate, the rows a request carries.
    prometheus, _ = source
    snapshot = await prometheus.snapshot(MODELS, endpoints(), 30)
    signals = snapshot.model("branch_rank")
    assert signals is not None
    assert signals.inference_rate == pytest.approx(10.0)


async def test_the_healer_reads_the_snapshots_totals_without_a_query(source) -> None:
    prometheus, asked = source
    await prometheus.snapshot(MODELS, endpoints(), 30)
    counters = [await prometheus.request_counters(pod, "branch_rank") for pod in endpoints()]
    assert counters == [(2.0, 100.0)] * 10
    assert len(asked) == 2  # the snapshot's two, nothing more


async def test_a_pod_the_snapshot_did_not_see_is_asked_for(source) -> None:
    prometheus, asked = source
    await prometheus.snapshot(MODELS, endpoints(), 30)
    stranger = Endpoint("triton-new", "x:8000", "http://x:8002/metrics", "ml")
    assert await prometheus.request_counters(stranger, "branch_rank") is None
    assert len(asked) == 4  # the two of the snapshot, then its own pair


async def test_a_refused_query_is_named_by_its_key() -> None:
    prometheus = PrometheusSource(
        "http://prometheus:9090", queries={"queue_seconds_per_second": "sum(rate(broken["}
    )

    async def query(promql: str, session=None) -> list[dict]:
        if "broken" in promql:
            raise QueryFailed(f"Prometheus query failed: parse error (query: {promql})")
        return []

    prometheus.query = query  # type: ignore[method-assign]
    with pytest.raises(MetricsUnavailable, match=r"^the queue_seconds_per_second query: "):
        await prometheus.snapshot(MODELS, endpoints(), 30)


async def test_the_sets_of_one_namespace_keep_each_others_totals(source) -> None:
    # Two sets of one namespace and the same models, each snapshot with its own pods: the
    # second must not push the first one's pods out of what the healer reads.
    prometheus, asked = source
    pods = endpoints()
    await prometheus.snapshot(MODELS, pods[:5], 30)
    await prometheus.snapshot(MODELS, pods[5:], 30)
    counters = [await prometheus.request_counters(pod, "branch_rank") for pod in pods]
    assert counters == [(2.0, 100.0)] * 10
    assert len(asked) == 4  # the two snapshots' two each, nothing more
