"""ScrapeSource keeps only as much history per target as its snapshots ask for."""

from __future__ import annotations

import asyncio

import pytest

from tritonscale.metrics import scrape
from tritonscale.metrics.scrape import ScrapeSource
from tritonscale.triton.endpoints import Endpoint

pytestmark = pytest.mark.unit

TEXT = 'nv_inference_request_success{model="m",version="1"} %d\n'


def counting_reads(monkeypatch) -> list[int]:
    """Every pod's /metrics, served from memory: its counter goes up by 10 a read; the number
    of reads so far is the returned list's one item."""
    reads = [0]

    async def fetch(session, pod, url, timeout_s) -> str:
        reads[0] += 1
        return TEXT % (10 * reads[0])

    monkeypatch.setattr(scrape, "fetch_metrics_text", fetch)
    return reads


async def test_the_history_follows_the_longest_window_asked(monkeypatch) -> None:
    now = [1000.0]
    counting_reads(monkeypatch)
    source = ScrapeSource(max_window_s=600, min_scrape_interval_s=0, clock=lambda: now[0])
    pod = Endpoint("p", "p:8000", "http://p:8002/metrics")
    assert source.kept_s == 600  # nothing asked yet: the most it may keep
    for _ in range(100):  # a snapshot every 15 s for 25 minutes, over a 30 s window
        await source.snapshot(["m"], [pod], 30)
        now[0] += 15
    kept = list(source._history[pod.metrics_url])
    # 30 s asked, plus a minute of slack: 7 samples at most, not 600 s worth (41).
    assert source.kept_s == 30
    assert len(kept) <= 7
    snapshot = await source.snapshot(["m"], [pod], 30)
    signals = snapshot.model("m")
    assert snapshot.complete and signals is not None
    assert signals.request_rate == pytest.approx(10 / 15, rel=0.01)


async def test_a_target_forgotten_while_its_read_is_in_flight_keeps_the_sample(
    monkeypatch,
) -> None:
    # A slow pod's last sample is older than the history kept; while its next read is in
    # flight another pod's scrape forgets it. The read must still land where the tick's
    # readers look, not in a history nobody holds (that was a KeyError in the healer's
    # request_counters and an IndexError in the snapshot, and each ended a set's tick).
    now = [1000.0]
    slow_read = asyncio.Event()
    slow = Endpoint("slow", "slow:8000", "http://slow:8002/metrics")
    fast = Endpoint("fast", "fast:8000", "http://fast:8002/metrics")

    async def fetch(session, pod, url, timeout_s) -> str:
        if url == slow.metrics_url and now[0] > 1000.0:
            await slow_read.wait()
        return TEXT % int(now[0])

    monkeypatch.setattr(scrape, "fetch_metrics_text", fetch)
    source = ScrapeSource(max_window_s=30, min_scrape_interval_s=0, clock=lambda: now[0])
    await source.scrape([slow.metrics_url, fast.metrics_url])
    now[0] += 300  # the slow pod's sample is now older than kept_s + 60
    reading = asyncio.ensure_future(source.request_counters(slow, "m"))
    await asyncio.sleep(0)  # one turn of the loop: its read starts and waits
    await source.scrape([fast.metrics_url])  # forgets the slow pod's old history
    slow_read.set()
    failures, successes = await reading
    assert successes == 1300
    snapshot = await source.snapshot(["m"], [slow, fast], 30)
    assert snapshot.model("m") is not None


async def test_a_read_made_earlier_in_the_tick_serves_its_snapshot(monkeypatch) -> None:
    # The healer reads a pod's counters while the set tick observes its members; on a busy
    # operator the snapshot comes seconds later. It must not read the pod a second time.
    now = [1000.0]
    reads = counting_reads(monkeypatch)
    source = ScrapeSource(clock=lambda: now[0])
    pod = Endpoint("p", "p:8000", "http://p:8002/metrics")
    await source.request_counters(pod, "m")  # the healer, at the tick's start
    now[0] += 2.0  # the rest of the observation, longer than min_scrape_interval_s
    await source.snapshot(["m"], [pod], 30, reuse_within_s=2.5)
    assert reads[0] == 1
    # Without the tick's reuse (or past it), a sample older than the minimum is read again.
    await source.snapshot(["m"], [pod], 30)
    assert reads[0] == 2


async def test_the_samples_of_every_pod_share_one_copy_of_each_series_key(monkeypatch) -> None:
    # A fleet holds a few samples of a thousand pods; Triton's text names no pod, so their
    # series keys are the same few dozen, and must be held once, not once a sample.
    now = [1000.0]

    async def fetch(session, pod, url, timeout_s) -> str:
        return TEXT % int(now[0])

    monkeypatch.setattr(scrape, "fetch_metrics_text", fetch)
    source = ScrapeSource(min_scrape_interval_s=0, clock=lambda: now[0])
    urls = [f"http://p{i}:8002/metrics" for i in range(3)]
    await source.scrape(urls)
    now[0] += 15
    await source.scrape(urls)
    keys = [next(iter(sample.values)) for url in urls for sample in source._history[url]]
    assert len(keys) == 6
    assert all(key is keys[0] for key in keys)


async def test_the_rows_a_request_carries_are_read_from_the_inference_count(monkeypatch) -> None:
    # Each request carries eight rows: nv_inference_count grows eight times as fast as the
    # successes. A model whose pods export no inference count reads None, not 0.
    now = [1000.0]

    async def fetch(session, pod, url, timeout_s) -> str:
        requests = 10 * int(now[0] - 1000.0)
        return (
            TEXT % requests
            + f'nv_inference_count{{model="m",version="1"}} {8 * requests}\n'
            + f'nv_inference_request_success{{model="n",version="1"}} {requests}\n'
        )

    monkeypatch.setattr(scrape, "fetch_metrics_text", fetch)
    source = ScrapeSource(min_scrape_interval_s=0, clock=lambda: now[0])
    pod = Endpoint("p", "p:8000", "http://p:8002/metrics")
    for _ in range(3):
        snapshot = await source.snapshot(["m", "n"], [pod], 30)
        now[0] += 15
    m, n = snapshot.model("m"), snapshot.model("n")
    assert m is not None and n is not None
    assert m.request_rate == pytest.approx(10.0)
    assert m.inference_rate == pytest.approx(80.0)
    assert n.inference_rate is None
