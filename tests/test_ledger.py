"""The drivers' budget ledger (tritonscale.control.ledger): grants across ticks that run apart.

No server: claims stand for what each tick saw and decided. The kopf driver's ticks run in
worker threads at the same time; a test below runs many of them against one ledger and checks
the sum of what the members hold or were granted after every grant.
"""

from __future__ import annotations

import random
import threading

import pytest

from tritonscale.control.ledger import BudgetLedger
from tritonscale.core.budget import Claim, Limits

pytestmark = pytest.mark.unit

KEY = ("ml", "pods")
LIMITS = Limits(6)


def claim(member: str, current: int, asked: int, queued: float = 0.0, **kw: object) -> Claim:
    return Claim(member, member.replace("-", "_"), current, asked, 1, queued=queued, **kw)  # type: ignore[arg-type]


def test_a_grant_counts_as_held_until_it_is_settled() -> None:
    ledger = BudgetLedger()
    first = ledger.request(KEY, LIMITS, claim("embed", 1, 5))
    assert first.grant.granted == 5
    # rank ticks before embed's load landed: embed's 5 are held already.
    second = ledger.request(KEY, LIMITS, claim("rank", 1, 3))
    assert second.grant.granted == 1
    assert (
        second.grant.message
        == "the budget pods allows 1 instance (6 of 6 instances per pod in use)"
    )
    assert second.budget.exhausted
    assert ledger.held(KEY) == {"embed": 5, "rank": 1}


def test_a_decrease_frees_room_once_it_is_applied() -> None:
    ledger = BudgetLedger()
    ledger.request(KEY, LIMITS, claim("embed", 1, 5))
    ledger.settle(KEY, "embed", 5)
    down = ledger.request(KEY, LIMITS, claim("embed", 5, 2))
    assert down.grant.granted == 2
    # Not applied yet: the pods still run 5.
    assert ledger.request(KEY, LIMITS, claim("rank", 1, 4)).grant.granted == 1
    ledger.settle(KEY, "embed", 2)
    assert ledger.request(KEY, LIMITS, claim("rank", 1, 4)).grant.granted == 4


def test_a_failed_load_gives_its_reservation_back() -> None:
    ledger = BudgetLedger()
    ledger.request(KEY, LIMITS, claim("embed", 1, 5))
    ledger.settle(KEY, "embed", 1)  # the load failed: the pods still run 1
    assert ledger.request(KEY, LIMITS, claim("rank", 1, 5)).grant.granted == 5


def test_a_member_waiting_for_room_keeps_its_place_in_the_order() -> None:
    ledger = BudgetLedger()
    ledger.request(KEY, LIMITS, claim("embed", 3, 3))
    ledger.settle(KEY, "embed", 3)
    # rank waits: 3 + 3 = 6 held, it asks 5 with a long queue.
    waiting = ledger.request(KEY, LIMITS, claim("rank", 3, 5, queued=40.0))
    assert waiting.grant.granted == 3
    ledger.settle(KEY, "rank", 3)
    # embed gives 2 back, then asks nothing more; classify asks 2 with a short queue. The
    # room embed freed goes to rank (queued 40 over 3), not to classify, which ticks first.
    ledger.request(KEY, LIMITS, claim("embed", 3, 1))
    ledger.settle(KEY, "embed", 1)
    late = ledger.request(KEY, Limits(8), claim("classify", 1, 3, queued=1.0))
    assert late.grant.granted == 1
    assert ledger.request(KEY, LIMITS, claim("rank", 3, 5, queued=40.0)).grant.granted == 4


def test_a_satisfied_member_reserves_nothing() -> None:
    ledger = BudgetLedger()
    ledger.request(KEY, LIMITS, claim("embed", 1, 4))  # granted in full, then a dry run:
    ledger.settle(KEY, "embed", 1)  # nothing applied
    assert ledger.request(KEY, LIMITS, claim("rank", 1, 5)).grant.granted == 5


def test_a_round_is_allocated_jointly() -> None:
    # The local driver claims for the whole round, then grants: the first granted does not
    # take everything, the one with the longer queue per instance gets the room first
    # (rank: 20 queued over 1, 2, 3 instances before embed's 2 over 1).
    ledger = BudgetLedger()
    ledger.claim(KEY, LIMITS, claim("embed", 1, 4, queued=2.0))
    ledger.claim(KEY, LIMITS, claim("rank", 1, 4, queued=20.0))
    assert ledger.grant(KEY, "embed").grant.granted == 2
    assert ledger.grant(KEY, "rank").grant.granted == 4


def test_members_that_disagree_on_the_limits_get_the_strictest_and_a_note() -> None:
    ledger = BudgetLedger()
    ledger.request(KEY, Limits(8), claim("embed", 1, 4))
    granted = ledger.request(KEY, Limits(5), claim("rank", 1, 4))
    assert granted.grant.granted == 1
    assert granted.budget.limits == Limits(5)
    assert granted.budget.problem == (
        "the members of budget pods disagree on its limits; the strictest holds (instancesPerPod 5)"
    )


def test_members_seeded_from_status_hold_their_counts() -> None:
    # A restarted operator: embed ticks first, rank and classify hold 2 each (status).
    ledger = BudgetLedger()
    ledger.seed(KEY, LIMITS, [claim("rank", 2, 2), claim("classify", 2, 2), claim("embed", 1, 1)])
    assert ledger.request(KEY, LIMITS, claim("embed", 1, 6)).grant.granted == 2
    # Seeding again never overrides what a tick claimed.
    ledger.seed(KEY, LIMITS, [claim("embed", 1, 1)])
    assert ledger.held(KEY)["embed"] == 2


def test_a_member_moves_between_budgets_and_leaves() -> None:
    ledger = BudgetLedger()
    ledger.request(KEY, LIMITS, claim("embed", 2, 2))
    ledger.request(("ml", "other"), LIMITS, claim("embed", 2, 2))
    assert ledger.held(KEY) == {}
    assert ledger.forget("ml", "embed") == [("ml", "other")]
    assert ledger.statuses() == []


def test_concurrent_ticks_never_hold_more_than_the_budget() -> None:
    ledger = BudgetLedger()
    members = ["embed", "rank", "classify", "pipeline"]
    # Every member runs 1 instance from the start: the ledger knows it (the kopf driver seeds
    # it from the members' status), or the first to tick would count on room they hold.
    ledger.seed(KEY, LIMITS, [claim(member, 1, 1) for member in members])
    over: list[str] = []
    refused: list[str] = []
    stop = threading.Event()

    def ticks(member: str, seed: int) -> None:
        rng = random.Random(seed)
        current = 1
        while not stop.is_set():
            asked = rng.randint(1, 6)
            granted = ledger.request(KEY, LIMITS, claim(member, current, asked, rng.random() * 9))
            total = sum(ledger.held(KEY).values())
            if granted.grant.limited:
                refused.append(member)
            if total > LIMITS.instances:
                over.append(f"{total} held after {member}'s grant")
            # Apply (or fail to) and settle, as a tick does.
            if rng.random() < 0.8:
                current = granted.grant.granted
            ledger.settle(KEY, member, current)

    threads = [threading.Thread(target=ticks, args=(m, i)) for i, m in enumerate(members)]
    for thread in threads:
        thread.start()
    stop.wait(2.0)
    stop.set()
    for thread in threads:
        thread.join(timeout=10)
        assert not thread.is_alive(), "a ticking thread hung"
    assert over == []
    assert sum(ledger.held(KEY).values()) <= LIMITS.instances
    assert len(set(refused)) == len(members)  # the budget was short for every one of them
