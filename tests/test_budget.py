"""The joint budget's allocation (tritonscale.core.budget): one table row per rule, then properties.

Every row is one pod set whose members share a budget: the pipeline (pipeline_async, which
calls the three branches) or a part of it. Counts are per pod.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tritonscale.core.budget import Allocation, Claim, Limits, allocate, strictest

pytestmark = pytest.mark.unit

PIPELINE = ("branch_embed", "branch_classify", "branch_rank")
PROFILE = settings(
    max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)


def claim(
    model: str,
    current: int,
    asked: int,
    *,
    minimum: int = 1,
    queued: float = 0.0,
    wanted: int | None = None,
    memory: int = 0,
    pod_full: bool = False,
) -> Claim:
    calls = PIPELINE if model == "pipeline_async" else ()
    return Claim(
        member=model.replace("_", "-"),
        model=model,
        current=current,
        asked=asked,
        minimum=minimum,
        wanted=wanted,
        calls=calls,
        queued=queued,
        gpu_memory_mib=memory,
        pod_full=pod_full,
    )


@dataclass(frozen=True)
class Case:
    name: str
    limits: Limits
    claims: tuple[Claim, ...]
    granted: dict[str, int]  # model -> granted count
    exhausted: bool = False
    in_messages: tuple[str, ...] = ()
    problem: str | None = None
    demand_ratio: float | None = None
    extra: dict[str, object] = field(default_factory=dict)


CASES = [
    Case(
        "asks within the budget are granted as asked",
        Limits(8),
        (claim("branch_embed", 1, 3), claim("branch_rank", 2, 2), claim("branch_classify", 2, 1)),
        {"branch_embed": 3, "branch_rank": 2, "branch_classify": 1},
        demand_ratio=6 / 8,
    ),
    # 4 held, 2 free; embed queues 12 requests at 1 instance, rank 8 at 2. The first goes
    # to embed (12 per instance against 4), the second too (12 / 2 = 6 against 4).
    Case(
        "the most queued per instance goes first",
        Limits(6),
        (
            claim("branch_embed", 1, 4, queued=12.0),
            claim("branch_rank", 2, 4, queued=8.0),
            claim("branch_classify", 1, 1),
        ),
        {"branch_embed": 3, "branch_rank": 2, "branch_classify": 1},
        exhausted=True,
        in_messages=("the budget pods allows 3 instances (6 of 6 instances per pod in use)",),
    ),
    # The parent queues far more per instance, but its child still wants instances: the
    # child's instance comes first (a parent in front of a saturated child only waits longer).
    Case(
        "a saturated child goes before its waiting parent",
        Limits(4),
        (claim("pipeline_async", 1, 3, queued=50.0), claim("branch_embed", 1, 3, queued=2.0)),
        {"pipeline_async": 1, "branch_embed": 3},
        exhausted=True,
    ),
    # Once the child has all it asked for, the parent gets the rest.
    Case(
        "the parent gets what the child leaves",
        Limits(5),
        (claim("pipeline_async", 1, 3, queued=50.0), claim("branch_embed", 1, 3, queued=2.0)),
        {"pipeline_async": 2, "branch_embed": 3},
        exhausted=True,
    ),
    Case(
        "a decrease is granted and its room goes to another member",
        Limits(4),
        (claim("branch_embed", 3, 1), claim("branch_rank", 1, 3, queued=5.0)),
        {"branch_embed": 1, "branch_rank": 3},
    ),
    # The budget never takes an instance back: over it (the budget was lowered), nobody grows.
    Case(
        "a member over the budget keeps what it holds and nobody grows",
        Limits(4),
        (claim("branch_embed", 4, 4), claim("branch_rank", 2, 3, queued=9.0)),
        {"branch_embed": 4, "branch_rank": 2},
        exhausted=True,
        in_messages=("6 of 4 instances per pod in use",),
    ),
    Case(
        "a member below its minimum is raised to it whatever the room",
        Limits(3),
        (claim("branch_embed", 3, 3), claim("branch_rank", 1, 2, minimum=2)),
        {"branch_embed": 3, "branch_rank": 2},
    ),
    Case(
        "minimums above the budget are a problem of one line, and each keeps its minimum",
        Limits(3),
        (claim("branch_embed", 2, 3, minimum=2), claim("branch_rank", 2, 2, minimum=2)),
        {"branch_embed": 2, "branch_rank": 2},
        exhausted=True,
        problem="the members' minInstances add up to 4, above instancesPerPod 3",
    ),
    # GPU memory: 10 instances allowed, 6000 MiB; embed takes 2000 per instance, rank 500.
    # Embed holds 2 (4000), rank 1 (500): 1500 left: no room for embed, three for rank.
    Case(
        "GPU memory per instance bounds the members that cost it",
        Limits(10, gpu_memory_mib=6000),
        (
            claim("branch_embed", 2, 4, memory=2000, queued=20.0),
            claim("branch_rank", 1, 5, memory=500),
        ),
        {"branch_embed": 2, "branch_rank": 4},
        exhausted=True,
        in_messages=("6000 of 6000 MiB of GPU memory per pod in use",),
    ),
    # What the loads want (wanted) can exceed what the policies asked this tick (their rate
    # limits): 5 + 4 = 9 wanted of 6 is a demand of 1.5 pods' worth.
    Case(
        "the demand ratio is what the loads want over the budget",
        Limits(6),
        (claim("branch_embed", 2, 3, wanted=5), claim("branch_rank", 2, 3, wanted=4)),
        {"branch_embed": 3, "branch_rank": 3},
        demand_ratio=1.5,
    ),
    # A full GPU refused an increase: a pod holds no more than it has, whatever the budget.
    Case(
        "a full GPU makes the pod's capacity what is in use",
        Limits(10),
        (claim("branch_embed", 2, 2, wanted=4, pod_full=True), claim("branch_rank", 2, 2)),
        {"branch_embed": 2, "branch_rank": 2},
        exhausted=True,
        demand_ratio=6 / 4,
    ),
]


def _by_model(case: Case, allocation: Allocation) -> dict[str, int]:
    return {c.model: allocation.grants[c.member].granted for c in case.claims}


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_one_rule(case: Case) -> None:
    allocation = allocate("pods", case.limits, case.claims)
    assert _by_model(case, allocation) == case.granted
    assert allocation.exhausted is case.exhausted
    messages = [grant.message for grant in allocation.grants.values() if grant.limited]
    for text in case.in_messages:
        assert any(text in message for message in messages), messages
    for grant in allocation.grants.values():
        assert bool(grant.message) is grant.limited
    if case.problem is None:
        assert allocation.problem is None
    else:
        assert allocation.problem is not None and case.problem in allocation.problem
        assert "\n" not in allocation.problem
    if case.demand_ratio is not None:
        assert allocation.demand_ratio == pytest.approx(case.demand_ratio)
    assert allocation.used == sum(case.granted.values())


def test_the_strictest_limits_hold_where_members_disagree() -> None:
    assert strictest([Limits(8, 0), Limits(6, 4000), Limits(7, 3000)]) == Limits(6, 3000)


# ---------------------------------------------------------------------------------------
# Properties.


@st.composite
def budgets(draw: st.DrawFn) -> tuple[Limits, list[Claim]]:
    """A budget and members whose holdings fit in it (as earlier grants leave them)."""
    models = draw(
        st.lists(
            st.sampled_from(("pipeline_async", *PIPELINE)), min_size=1, max_size=4, unique=True
        )
    )
    with_memory = draw(st.booleans())
    claims = []
    for model in models:
        minimum = draw(st.integers(1, 2))
        current = draw(st.integers(minimum, 6))
        claims.append(
            claim(
                model,
                current,
                draw(st.integers(minimum, 10)),
                minimum=minimum,
                queued=draw(st.floats(0, 50)),
                memory=draw(st.integers(0, 3)) * 500 if with_memory else 0,
            )
        )
    held = sum(c.current for c in claims)
    memory_held = sum(c.current * c.gpu_memory_mib for c in claims)
    limits = Limits(
        held + draw(st.integers(0, 8)),
        memory_held + draw(st.integers(0, 4000)) if with_memory else 0,
    )
    return limits, claims


@PROFILE
@given(budget=budgets())
def test_the_granted_sum_never_exceeds_the_budget(budget: tuple[Limits, list[Claim]]) -> None:
    limits, claims = budget
    allocation = allocate("pods", limits, claims)
    assert allocation.used <= limits.instances
    if limits.gpu_memory_mib:
        assert allocation.gpu_memory_used_mib <= limits.gpu_memory_mib


@PROFILE
@given(budget=budgets())
def test_grants_lie_between_what_a_member_keeps_and_what_it_asked(
    budget: tuple[Limits, list[Claim]],
) -> None:
    limits, claims = budget
    allocation = allocate("pods", limits, claims)
    for c in claims:
        granted = allocation.grants[c.member].granted
        assert granted >= c.minimum  # every member keeps its minimum
        assert granted >= min(c.asked, c.current)  # no instance is taken back
        assert granted <= max(c.asked, c.current)


@PROFILE
@given(budget=budgets(), data=st.data())
def test_more_load_never_lowers_the_total_while_below_the_budget(
    budget: tuple[Limits, list[Claim]], data: st.DataObject
) -> None:
    limits, claims = budget
    limits = Limits(limits.instances)  # the instance count alone: memory trades one for another
    index = data.draw(st.integers(0, len(claims) - 1))
    more = data.draw(st.integers(1, 5))
    heavier = list(claims)
    c = claims[index]
    heavier[index] = claim(
        c.model,
        c.current,
        c.asked + more,
        minimum=c.minimum,
        queued=c.queued + data.draw(st.floats(0, 50)),
    )
    before = allocate("pods", limits, claims).used
    after = allocate("pods", limits, heavier).used
    assert after >= before
    if before < limits.instances:
        assert after >= min(limits.instances, before + 1)  # the room left is used


@PROFILE
@given(budget=budgets())
def test_minimums_above_the_budget_are_reported_and_never_broken(
    budget: tuple[Limits, list[Claim]],
) -> None:
    limits, claims = budget
    tight = Limits(max(1, sum(c.minimum for c in claims) - 1))
    allocation = allocate("pods", tight, claims)
    if len(claims) > 1 or claims[0].minimum > 1:
        assert allocation.problem is not None
    for c in claims:
        assert allocation.grants[c.member].granted >= c.minimum


def test_a_member_held_back_by_the_set_planners_split_exhausts_the_budget() -> None:
    # The split was fitted to the budget before the ask: nothing is refused at the grant, and
    # the budget is exhausted all the same (its wanted sum over the pod is the HPA's signal).
    fitted = [
        Claim("a", "a", current=2, asked=3, minimum=1, wanted=5, held_back=True),
        Claim("b", "b", current=2, asked=2, minimum=1, wanted=2),
    ]
    allocation = allocate("pods", Limits(5, 0), fitted)
    assert not any(grant.limited for grant in allocation.grants.values())
    assert allocation.exhausted
    assert allocation.demand_ratio == pytest.approx(7 / 5)
    unfitted = [Claim("a", "a", current=2, asked=3, minimum=1, wanted=3), fitted[1]]
    assert not allocate("pods", Limits(5, 0), unfitted).exhausted
