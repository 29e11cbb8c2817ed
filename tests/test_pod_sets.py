"""Pod sets: which autoscalers tick as one, where in the interval, and who is due."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tritonscale.control.loop import Stop, run_set
from tritonscale.control.pod_sets import PodSet, Shard, owner, pod_sets, set_of, stable_fraction
from tritonscale.control.set_tick import call_depth
from tritonscale.core.spec import AutoscalerSpec

pytestmark = pytest.mark.unit


def spec(
    model: str, app: str = "triton", budget: str | None = None, **fields: Any
) -> AutoscalerSpec:
    raw: dict[str, Any] = {"selector": {"matchLabels": {"app": app}}, "model": model, **fields}
    if budget is not None:
        raw["budget"] = {"name": budget, "instancesPerPod": 8}
    return AutoscalerSpec.from_dict(raw)


def names(sets: list[PodSet]) -> list[tuple[str, ...]]:
    return sorted(s.members for s in sets)


def test_autoscalers_selecting_the_same_pods_are_one_set() -> None:
    sets = pod_sets("ml", {"a": spec("a"), "b": spec("b"), "c": spec("c", app="other")})
    assert names(sets) == [("a", "b"), ("c",)]


def test_a_shared_budget_joins_sets_of_different_pods() -> None:
    # b and c select different pods but share a budget; a selects b's pods: one chain.
    sets = pod_sets(
        "ml",
        {"a": spec("a"), "b": spec("b", budget="room"), "c": spec("c", app="x", budget="room")},
    )
    assert names(sets) == [("a", "b", "c")]


def test_a_spec_that_does_not_read_is_a_set_of_its_own() -> None:
    sets = pod_sets("ml", {"a": spec("a"), "broken": None}, default_interval_s=7)
    assert names(sets) == [("a",), ("broken",)]
    broken = set_of(sets, "broken")
    assert broken is not None and broken.interval_s == 7


def test_the_name_follows_what_binds_the_set_not_its_members() -> None:
    # A member added keeps the set's name (its phase and owner); another selector changes it.
    before = pod_sets("ml", {"a": spec("a")})[0]
    after = set_of(pod_sets("ml", {"a": spec("a"), "b": spec("b")}), "a")
    elsewhere = pod_sets("ml", {"a": spec("a", app="other")})[0]
    other_namespace = pod_sets("prod", {"a": spec("a")})[0]
    assert after is not None and after.name == before.name
    assert elsewhere.name != before.name and other_namespace.name != before.name


def test_the_leader_is_the_first_member_by_name() -> None:
    sets = pod_sets("ml", {"zeta": spec("z"), "alpha": spec("a")})
    assert sets[0].leader == "alpha"


def test_the_set_ticks_at_the_shortest_interval_of_its_members() -> None:
    sets = pod_sets("ml", {"a": spec("a", intervalSeconds=30), "b": spec("b", intervalSeconds=10)})
    assert sets[0].interval_s == 10


def test_the_phase_is_stable_and_spreads_the_sets() -> None:
    assert stable_fraction("set-1") == stable_fraction("set-1")
    fractions = [stable_fraction(f"set-{i}") for i in range(1000)]
    # A thousand sets over ten slices of the interval: none is empty, none holds a fifth.
    slices = [sum(1 for f in fractions if i / 10 <= f < (i + 1) / 10) for i in range(10)]
    assert min(slices) > 50 and max(slices) < 200


def test_next_tick_is_at_the_phase_one_interval_apart() -> None:
    pod_set = PodSet("ml", "set-x", ("a",), (15.0,))
    phase = pod_set.phase_s
    first = pod_set.next_tick(1000.0)
    assert 1000.0 < first <= 1015.0
    assert (first - phase) % 15 == pytest.approx(0) or (first - phase) % 15 == pytest.approx(15)
    assert pod_set.next_tick(first) == pytest.approx(first + 15)


def test_each_member_is_due_on_its_own_interval() -> None:
    pod_set = PodSet("ml", "set-x", ("fast", "slow"), (10.0, 30.0))
    last = {"fast": 100.0, "slow": 100.0}
    assert pod_set.due(last, 110.0) == ["fast"]
    assert pod_set.due(last, 120.0) == ["fast"]
    # The set's tick nearest to 30 s after: within half the set's interval counts.
    assert pod_set.due(last, 126.0) == ["fast", "slow"]
    assert pod_set.due(last, 104.0) == []
    # Never decided: due at once.
    assert pod_set.due({"fast": 100.0}, 101.0) == ["slow"]


async def within(loop: Awaitable[None]) -> None:
    """The loop under test, failing in seconds (not at the suite's timeout) if it never ends."""
    try:
        await asyncio.wait_for(loop, 10)
    except asyncio.TimeoutError:
        pytest.fail("run_set did not end within 10 s of virtual ticks: it never reached the stop")


class FakeClock(Stop):
    """A stop signal whose waits advance a virtual clock instead of sleeping."""

    def __init__(self, start: float) -> None:
        super().__init__()
        self.now = start

    def clock(self) -> float:
        return self.now

    async def wait(self, timeout: float | None = None) -> bool:
        self.now += timeout or 0.0
        await asyncio.sleep(0)  # the ticks, tasks of their own, run meanwhile
        return self.is_set()


async def test_run_set_ticks_at_the_phase_and_decides_the_due_members() -> None:
    pod_set = PodSet("ml", "set-x", ("fast", "slow"), (10.0, 20.0))
    stop = FakeClock(1000.0)
    ticks: list[tuple[float, list[str]]] = []

    async def tick(due: list[str], now: float, finished: Callable[[str], None]) -> None:
        ticks.append((now, due))
        if len(ticks) == 5:
            stop.set()

    await within(run_set(stop, lambda: pod_set, tick, clock=stop.clock))
    assert ticks[0] == (1000.0, ["fast", "slow"])  # the first tick decides every member
    later = ticks[1:]
    for (at, _), (after, _) in zip(later, later[1:], strict=False):
        assert after - at == pytest.approx(10.0)
    for at, _ in later:
        assert (at - pod_set.phase_s) % 10 == pytest.approx(0, abs=1e-6) or (
            at - pod_set.phase_s
        ) % 10 == pytest.approx(10, abs=1e-6)
    assert [due for _, due in later].count(["fast", "slow"]) == 2  # slow every other tick


async def test_a_loop_that_does_not_lead_waits_and_then_decides_every_member() -> None:
    pod_set = PodSet("ml", "set-x", ("a", "b"), (10.0, 10.0))
    stop = FakeClock(0.0)
    leading = iter([None, None, pod_set, pod_set])
    ticks: list[tuple[float, list[str]]] = []

    def current() -> PodSet | None:
        found = next(leading, None)
        if found is None and len(ticks) >= 1:
            stop.set()
        return found

    async def tick(due: list[str], now: float, finished: Callable[[str], None]) -> None:
        ticks.append((now, due))

    await within(run_set(stop, current, tick, idle_s=5.0, clock=stop.clock))
    assert ticks[0] == (10.0, ["a", "b"])


async def test_a_tick_that_hangs_holds_back_its_own_members_only() -> None:
    pod_set = PodSet("ml", "set-x", ("hangs", "other"), (10.0, 10.0))
    stop = FakeClock(0.0)
    release = asyncio.Event()
    ticks: list[tuple[float, list[str]]] = []

    async def tick(due: list[str], now: float, finished: Callable[[str], None]) -> None:
        ticks.append((now, due))
        if "hangs" in due and len(ticks) == 2:
            finished("other")  # its result is out; its tick's other member waits on
            await release.wait()  # a load waiting for its deadline
        if len(ticks) == 5:
            release.set()
            stop.set()

    await within(run_set(stop, lambda: pod_set, tick, clock=stop.clock))
    assert [due for _, due in ticks] == [
        ["hangs", "other"],
        ["hangs", "other"],  # this one hangs
        ["other"],
        ["other"],
        ["other"],
    ]


async def test_a_tick_that_raises_ends_the_loop_with_its_error() -> None:
    pod_set = PodSet("ml", "set-x", ("a",), (10.0,))
    stop = FakeClock(0.0)

    async def tick(due: list[str], now: float, finished: Callable[[str], None]) -> None:
        raise RuntimeError("a bug in the tick")

    with pytest.raises(RuntimeError, match="a bug in the tick"):
        await asyncio.wait_for(run_set(stop, lambda: pod_set, tick, clock=stop.clock), 5)


def test_next_tick_always_moves_on_whatever_the_rounding() -> None:
    # At a slot itself the float arithmetic may land a hair before it (29.999999 slots);
    # the next tick must still be one interval on, or the loop would spin without sleeping.
    pod_set = PodSet("ml", "set-y", ("a",), (10.0,))
    at = pod_set.next_tick(0.0)
    for _ in range(10_000):
        following = pod_set.next_tick(at)
        assert following - at == pytest.approx(10.0)
        at = following


def test_every_set_has_exactly_one_owner_among_the_shards() -> None:
    sets = [PodSet("ml", f"set-{i:04d}", ("a",), (15.0,)) for i in range(1000)]
    shards = [Shard(i, 3) for i in range(3)]
    owners = [[shard for shard in shards if shard.owns(s)] for s in sets]
    assert all(len(found) == 1 for found in owners)
    # The shares are even: each of three replicas owns about a third.
    shares = [sum(1 for found in owners if found[0] == shard) for shard in shards]
    assert min(shares) > 280 and max(shares) < 390
    # One replica owns everything.
    assert all(Shard().owns(s) for s in sets)
    assert owner("set-0001", 3) == owner("set-0001", 3)


@pytest.mark.parametrize(("index", "total"), [(2, 2), (-1, 2), (0, 0)])
def test_a_shard_outside_its_total_is_refused(index: int, total: int) -> None:
    with pytest.raises(ValueError, match="want 0 <= shard < total"):
        Shard(index, total)


def test_a_tick_loads_callees_before_their_callers() -> None:
    # Under overload a BLS caller's reload waits for its old queue, which drains only as
    # fast as its callees serve: a callee goes first (set_tick.call_depth).
    specs = {
        "pipeline": spec("pipeline_async", calls=["branch_embed", "branch_rank"]),
        "embed": spec("branch_embed", calls=["tokenize"]),
        "tokenize": spec("tokenize"),
        "rank": spec("branch_rank"),
        "elsewhere": spec("other", calls=["not_in_the_set"]),
    }
    assert call_depth(specs) == {
        "pipeline": 2,
        "embed": 1,
        "tokenize": 0,
        "rank": 0,
        "elsewhere": 0,
    }
    # A cycle is cut where it closes: every member still gets a depth.
    cycle = {"a": spec("a", calls=["b"]), "b": spec("b", calls=["a"])}
    assert sorted(call_depth(cycle).values()) == [0, 1]
