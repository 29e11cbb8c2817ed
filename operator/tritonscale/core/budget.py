"""The joint instance budget of a pod set: who gets the instances when the needs exceed it.

The models on one set of Triton pods share each pod's room: a total instance count per pod,
and, on GPU pods, GPU memory per pod at a known cost per instance. The set planner fits the
counts of the members it decides together to the budget already (tritonscale.core.planner);
`allocate` grants what members decided apart claim (members on other pods, or due at other
ticks), together:

- what a member already holds stays (no instance is taken back: a scale-down is the member's
  own decision, as fast as its `behavior` allows), and every member keeps its minInstances;
- a decrease is granted as asked (it releases room);
- the increases share the room left, one instance at a time, each to the member where it adds
  most: a member whose children (`calls`) still want instances waits for them (a BLS parent
  in front of a saturated child only waits longer), then the member with the most requests
  queued per instance it would have, then the one with the largest unmet share of its ask.

The granted total never exceeds the budget unless what the members already hold (or their
minimums) does; then no member grows. `Allocation.demand_ratio` is what the members' loads
ask, together, over what a pod can hold: above 1 the pods are too few, and more pods, not
more instances, are the answer (the chart's HPA scales on it).

Pure: no clock, no I/O. The drivers keep the members' claims (tritonscale.control.ledger).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

BUDGET_EXHAUSTED = "BudgetExhausted"


@dataclass(frozen=True)
class Limits:
    """What one pod holds for the budget's members."""

    instances: int  # instances of all members together, per pod
    gpu_memory_mib: int = 0  # GPU memory for them per pod; 0: not budgeted


@dataclass(frozen=True)
class Claim:
    """One member's state and ask at its latest tick (counts are per pod)."""

    member: str  # the autoscaler's name (the policy's name locally)
    model: str
    current: int  # what it holds: the live count on its pods (the highest), 0 when unknown
    asked: int  # what its policy decided this tick
    minimum: int  # its minInstances
    wanted: int | None = None  # what its load alone asks (sizing); None: `asked`
    calls: tuple[str, ...] = ()  # the models it calls through BLS
    queued: float = 0.0  # requests waiting for an instance (summed over the pods)
    gpu_memory_mib: int = 0  # GPU memory one instance takes
    pod_full: bool = False  # a pod-level ceiling (the GPU) refused its increase this tick
    # Its ask was already fitted to the budget below what it wants (the set planner's split):
    # refused for want of room before it asked.
    held_back: bool = False

    @property
    def floor(self) -> int:
        """What it keeps whatever the others need: its decrease, or what it holds."""
        return max(self.minimum, min(self.asked, self.current))


@dataclass(frozen=True)
class Grant:
    member: str
    asked: int
    granted: int
    message: str  # why less than asked ("" when all of it)

    @property
    def limited(self) -> bool:
        return self.granted < self.asked


@dataclass(frozen=True)
class Allocation:
    name: str
    limits: Limits
    grants: dict[str, Grant]
    used: int  # instances per pod once granted
    wanted: int  # instances per pod the members' loads ask for, together
    gpu_memory_used_mib: int
    exhausted: bool  # an increase was refused for want of room in the pod
    demand_ratio: float  # wanted over what a pod can hold; above 1: more pods are the answer
    problem: str | None  # the budget cannot hold the members' minimums (one line)


def strictest(limits: Sequence[Limits]) -> Limits:
    """The members' specs should agree on the pod's limits; where they do not, the lowest holds."""
    memory = [limit.gpu_memory_mib for limit in limits if limit.gpu_memory_mib > 0]
    return Limits(min(limit.instances for limit in limits), min(memory, default=0))


def allocate(name: str, limits: Limits, claims: Sequence[Claim]) -> Allocation:
    """Grant the members' asks within `limits` (see the module's docstring for the rule)."""
    granted = {claim.member: claim.floor for claim in claims}
    memory_of = {claim.member: claim.gpu_memory_mib for claim in claims}

    def used() -> int:
        return sum(granted.values())

    def memory_used() -> int:
        return sum(granted[member] * memory_of[member] for member in granted)

    def fits(claim: Claim) -> bool:
        if used() + 1 > limits.instances:
            return False
        budgeted = limits.gpu_memory_mib > 0
        return not budgeted or memory_used() + claim.gpu_memory_mib <= limits.gpu_memory_mib

    while True:
        wanting = [c for c in claims if granted[c.member] < c.asked]
        open_claims = [c for c in wanting if fits(c)]
        if not open_claims:
            break
        waiting_models = {c.model for c in wanting}
        # A parent whose child still wants instances waits for it, unless all would wait.
        ready = [c for c in open_claims if not waiting_models.intersection(c.calls)] or open_claims
        best = min(ready, key=lambda c: _priority(c, granted[c.member]))
        granted[best.member] += 1

    grants = {}
    for claim in claims:
        count = granted[claim.member]
        message = ""
        if count < claim.asked:
            message = _refusal(name, limits, claim, count, used(), memory_used())
        grants[claim.member] = Grant(claim.member, claim.asked, count, message)

    wanted = sum(max(c.minimum, c.asked if c.wanted is None else c.wanted) for c in claims)
    wanted_memory = sum(
        max(c.minimum, c.asked if c.wanted is None else c.wanted) * c.gpu_memory_mib for c in claims
    )
    pod_full = any(c.pod_full for c in claims)
    capacity = min(limits.instances, used()) if pod_full else limits.instances
    ratio = wanted / max(capacity, 1)
    if limits.gpu_memory_mib > 0:
        memory_capacity = min(limits.gpu_memory_mib, memory_used()) if pod_full else None
        ratio = max(ratio, wanted_memory / max(memory_capacity or limits.gpu_memory_mib, 1))
    return Allocation(
        name=name,
        limits=limits,
        grants=grants,
        used=used(),
        wanted=wanted,
        gpu_memory_used_mib=memory_used(),
        exhausted=(
            pod_full
            or any(grant.limited for grant in grants.values())
            or any(c.held_back for c in claims)
        ),
        demand_ratio=ratio,
        problem=_problem(limits, claims),
    )


def _priority(claim: Claim, granted: int) -> tuple[float, float, str]:
    """Smallest first: most queued per instance, then the largest unmet share, then by name."""
    per_instance = claim.queued / max(granted, 1)
    unmet = (claim.asked - granted) / claim.asked
    return (-per_instance, -unmet, claim.member)


def _refusal(
    name: str, limits: Limits, claim: Claim, granted: int, used: int, memory_used: int
) -> str:
    instances = "instance" if granted == 1 else "instances"
    if used + 1 > limits.instances:
        room = f"{used} of {limits.instances} instances per pod in use"
    else:
        room = f"{memory_used} of {limits.gpu_memory_mib} MiB of GPU memory per pod in use"
    return f"the budget {name} allows {granted} {instances} ({room})"


def _problem(limits: Limits, claims: Sequence[Claim]) -> str | None:
    minimums = sum(claim.minimum for claim in claims)
    if minimums > limits.instances:
        return (
            f"the members' minInstances add up to {minimums}, above instancesPerPod "
            f"{limits.instances}: each keeps its minimum and none grows"
        )
    memory = sum(claim.minimum * claim.gpu_memory_mib for claim in claims)
    if limits.gpu_memory_mib > 0 and memory > limits.gpu_memory_mib:
        return (
            f"the members' minInstances take {memory} MiB of GPU memory, above "
            f"gpuMemoryPerPodMiB {limits.gpu_memory_mib}: each keeps its minimum and none grows"
        )
    return None
