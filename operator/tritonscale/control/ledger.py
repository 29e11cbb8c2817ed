"""The drivers' memory of every budget: what each member holds and asks, across ticks.

A budget's members are one pod set (tritonscale.control.pod_sets): each tick of the set
claims for every due member first (`claim`), then grants each (`grant`), the ones that give
instances back first, and settles what the pods then run (`settle`), so a tick is allocated
jointly. A member's grant must still leave room for what the members not due at this tick
hold, and for the instances already granted and not yet applied. So one `BudgetLedger` per
operator process (a set is ticked by one replica: its shard's) keeps, per budget
(namespace, name), each member's latest `Claim`:

    ledger.claim(key, limits, claim)               # every due member's state and ask
    granted = ledger.grant(key, member)            # each, in order
    ... apply granted.grant.granted ...
    ledger.settle(key, member, live_count)         # what the pods now run

(`request` claims and grants in one call, for a tick of one member.) `grant` runs the pure
allocation (tritonscale.core.budget.allocate) over every member: the others at what they
hold (a grant counts as held from the moment it is made until `settle` reports the live
count, so a decrease frees room only once it is applied), and with what they ask only while
they ask: claimed and not granted yet, or refused by the budget (a member waiting for room
keeps its place in the order; a satisfied one reserves nothing). Members that are unknown yet
(an operator just started) are seeded from what the cluster says they hold (`seed`). A lock
guards it all: the ticks of different sets run concurrently on one event loop, and a
caller's threads may share it too.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, replace

from tritonscale.core.budget import Claim, Grant, Limits, allocate, strictest

BudgetKey = tuple[str, str]  # (namespace, budget name)


@dataclass(frozen=True)
class BudgetStatus:
    """One budget as the last grant left it: what the operator exports and writes to status."""

    namespace: str
    name: str
    limits: Limits  # the strictest of the members'
    used: int  # instances per pod the members hold or were granted
    wanted: int  # instances per pod their loads ask for
    gpu_memory_used_mib: int
    exhausted: bool  # a member is refused instances for want of room in the pod
    demand_ratio: float  # wanted over what a pod can hold (core.budget)
    members: int
    problem: str | None  # an impossible budget, or members that disagree on its limits

    def to_dict(self) -> dict[str, object]:
        """status.budget of each member."""
        d: dict[str, object] = {
            "name": self.name,
            "instancesPerPod": self.limits.instances,
            "usedInstances": self.used,
            "wantedInstances": self.wanted,
            "demandRatio": round(self.demand_ratio, 4),
            "exhausted": self.exhausted,
            "members": self.members,
        }
        if self.limits.gpu_memory_mib:
            d["gpuMemoryPerPodMiB"] = self.limits.gpu_memory_mib
            d["usedGpuMemoryMiB"] = self.gpu_memory_used_mib
        return d


@dataclass(frozen=True)
class Granted:
    grant: Grant
    budget: BudgetStatus


@dataclass(frozen=True)
class _Member:
    claim: Claim
    limits: Limits  # the pod's limits as this member's spec gives them
    held: int  # instances it holds or was granted, per pod
    asking: bool  # claimed and not granted yet, or the budget refused part of its last ask


class BudgetLedger:
    """Per budget, each member's latest claim; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._budgets: dict[BudgetKey, dict[str, _Member]] = {}
        self._latest: dict[BudgetKey, BudgetStatus] = {}

    def claim(self, key: BudgetKey, limits: Limits, claim: Claim) -> None:
        """Record a member's state and ask (it leaves any other budget it was in)."""
        with self._lock:
            self._claim(key, limits, claim)

    def grant(self, key: BudgetKey, member: str) -> Granted:
        """Allocate the budget over its members now and reserve this member's grant."""
        with self._lock:
            return self._grant(key, member)

    def request(self, key: BudgetKey, limits: Limits, claim: Claim) -> Granted:
        """`claim` then `grant`, with no other tick in between."""
        with self._lock:
            self._claim(key, limits, claim)
            return self._grant(key, claim.member)

    def settle(self, key: BudgetKey, member: str, live: int) -> None:
        """The member's pods now run `live` instances (after its tick applied its grant)."""
        with self._lock:
            entry = self._budgets.get(key, {}).get(member)
            if entry is not None:
                claim = replace(entry.claim, current=live)
                self._budgets[key][member] = replace(entry, claim=claim, held=live)

    def seed(self, key: BudgetKey, limits: Limits, claims: Iterable[Claim]) -> None:
        """Members not known yet hold what `claims` say (their last status), asking nothing."""
        with self._lock:
            members = self._budgets.setdefault(key, {})
            for claim in claims:
                if claim.member not in members and not self._elsewhere(key, claim.member):
                    held = max(claim.current, claim.minimum)
                    holding = replace(claim, current=held, asked=held, wanted=held)
                    members[claim.member] = _Member(holding, limits, held, asking=False)

    def forget(self, namespace: str, member: str) -> list[BudgetKey]:
        """The member is gone (deleted, or no longer in a budget); returns the budgets that
        lost their last member (their metrics should go too)."""
        emptied = []
        with self._lock:
            for key in [k for k in self._budgets if k[0] == namespace]:
                self._budgets[key].pop(member, None)
                if not self._budgets[key]:
                    del self._budgets[key]
                    self._latest.pop(key, None)
                    emptied.append(key)
        return emptied

    def statuses(self) -> list[BudgetStatus]:
        """Each budget as its last grant left it."""
        with self._lock:
            return list(self._latest.values())

    def held(self, key: BudgetKey) -> dict[str, int]:
        """What each member holds or was granted now, per pod."""
        with self._lock:
            return {name: entry.held for name, entry in self._budgets.get(key, {}).items()}

    # -- under the lock ----------------------------------------------------------------

    def _elsewhere(self, key: BudgetKey, member: str) -> bool:
        return any(k[0] == key[0] and k != key and member in m for k, m in self._budgets.items())

    def _claim(self, key: BudgetKey, limits: Limits, claim: Claim) -> None:
        for other in [k for k in self._budgets if k[0] == key[0] and k != key]:
            self._budgets[other].pop(claim.member, None)
            if not self._budgets[other]:
                del self._budgets[other]
                self._latest.pop(other, None)
        # Its live count is what it holds: its last grant was settled by the tick that made it.
        members = self._budgets.setdefault(key, {})
        members[claim.member] = _Member(claim, limits, claim.current, asking=True)

    def _grant(self, key: BudgetKey, member: str) -> Granted:
        members = self._budgets[key]
        claims = []
        for name, entry in members.items():
            if name == member:
                claims.append(entry.claim)
                continue
            # The others keep what they hold; they compete for more only while they ask.
            asked = max(entry.claim.asked, entry.held) if entry.asking else entry.held
            claims.append(replace(entry.claim, current=entry.held, asked=asked))
        each = [entry.limits for entry in members.values()]
        limits = strictest(each)
        allocation = allocate(key[1], limits, claims)
        grant = allocation.grants[member]
        entry = members[member]
        members[member] = replace(
            entry, held=max(entry.claim.current, grant.granted), asking=grant.limited
        )
        problems = [allocation.problem] if allocation.problem else []
        if len(set(each)) > 1:
            memory = (
                f", gpuMemoryPerPodMiB {limits.gpu_memory_mib}" if limits.gpu_memory_mib else ""
            )
            problems.append(
                f"the members of budget {key[1]} disagree on its limits; the strictest holds "
                f"(instancesPerPod {limits.instances}{memory})"
            )
        held = {name: entry.held for name, entry in members.items()}
        status = BudgetStatus(
            namespace=key[0],
            name=key[1],
            limits=limits,
            used=sum(held.values()),
            wanted=allocation.wanted,
            gpu_memory_used_mib=sum(
                held[name] * entry.claim.gpu_memory_mib for name, entry in members.items()
            ),
            exhausted=allocation.exhausted,
            demand_ratio=allocation.demand_ratio,
            members=len(members),
            problem="; ".join(problems) or None,
        )
        self._latest[key] = status
        return Granted(grant, status)
