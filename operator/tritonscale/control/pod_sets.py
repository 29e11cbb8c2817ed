"""Pod sets: the autoscalers that select the same pods or share a budget, ticked as one.

The autoscalers of one Deployment of Triton pods (a BLS parent, its children, the other models
beside them) select the same pods and often share one instance budget: they are one system.
So they tick together, as a set: one read of each pod (or one Prometheus query per signal)
serves every member, the budget is granted once, and the loads go out from one tick. The
custom resource and its status stay per autoscaler, as an HPA per Deployment; users never
write a set, it follows from the specs:

    sets = pod_sets("ml", {"pipeline-async": spec_a, "branch-embed": spec_b, "other": spec_c})
    # [PodSet(name="set-4f0c1e2a9b", members=("branch-embed", "pipeline-async"), ...), ...]

Two members are in one set when they have the same selector or name the same budget (and so,
transitively, a chain of them). A member whose spec does not read is a set of its own.

A set's name is a stable hash of what binds it (its selectors and budgets), not of its
members: a member added or removed keeps the set's name, its phase and its owner. Several
operator replicas share the sets as kube-state-metrics shares objects: replica `shard` of
`total` owns the sets whose hash falls in its share (`Shard.owns`), so each knows its own
without a word to the others, and every set has exactly one owner among replicas that agree
on the total. The phase
spreads the sets over the interval (`next_tick`), so that a thousand pods are not all read
in the same second. The set ticks at the shortest interval of its members; each member is
decided on its own interval (`due`).

Pure: no clock (the time is an argument), no I/O.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tritonscale.core.selectors import selector_to_string
from tritonscale.core.spec import AutoscalerSpec


@dataclass(frozen=True)
class PodSet:
    """Autoscalers of one namespace that tick as one."""

    namespace: str
    name: str  # "set-" and ten hex digits of the stable hash
    members: tuple[str, ...]  # autoscaler names, sorted
    intervals_s: tuple[float, ...]  # each member's interval, in `members`' order

    @property
    def interval_s(self) -> float:
        """The set ticks at the shortest interval of its members."""
        return min(self.intervals_s)

    @property
    def leader(self) -> str:
        """The member that runs the set's ticks where every member has its own loop (kopf's
        daemons): the first by name, so that every member agrees without a word."""
        return self.members[0]

    @property
    def phase_s(self) -> float:
        """Where in each interval the set ticks: the stable hash spread over the interval."""
        return stable_fraction(self.name) * self.interval_s

    def interval_of(self, member: str) -> float:
        return self.intervals_s[self.members.index(member)]

    def next_tick(self, now: float) -> float:
        """The first moment after `now` at the set's phase (unix seconds: every process that
        knows the set agrees on it)."""
        interval = self.interval_s
        slots = math.floor((now - self.phase_s) / interval) + 1
        at = self.phase_s + slots * interval
        # At a slot itself, rounding may give the same slot back (29.999999 slots): the next.
        return at if at > now + 1e-6 else at + interval

    def due(self, last: Mapping[str, float], now: float) -> list[str]:
        """The members to decide at a tick at `now`, given when each was last decided.

        A member is due at the tick nearest to one of its intervals after its last one: a
        tick of the set within half the set's interval of that counts. A member never decided
        is due at once (a new set, or one that a restarted operator picks up).
        """
        half = self.interval_s / 2
        return [
            member
            for member, interval in zip(self.members, self.intervals_s, strict=True)
            if member not in last or now >= last[member] + interval - half
        ]

    def to_dict(self) -> dict[str, object]:
        """status.podSet of each member."""
        return {"name": self.name, "members": list(self.members)}


@dataclass(frozen=True)
class Shard:
    """This replica's share of the sets: replica `index` of `total` (0-based)."""

    index: int = 0
    total: int = 1

    def __post_init__(self) -> None:
        if self.total < 1 or not 0 <= self.index < self.total:
            raise ValueError(f"shard {self.index} of {self.total}: want 0 <= shard < total")

    def owns(self, pod_set: PodSet) -> bool:
        return owner(pod_set.name, self.total) == self.index

    def __str__(self) -> str:
        return f"{self.index}/{self.total}"


def owner(name: str, total: int) -> int:
    """The shard (0-based, of `total`) that owns the set named `name`."""
    return int(stable_fraction(f"owner:{name}") * total)


def stable_fraction(text: str) -> float:
    """A number in [0, 1) that depends only on `text` (not on the process: Python's own
    `hash` of a string changes with every start)."""
    digest = hashlib.sha256(text.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def pod_sets(
    namespace: str,
    specs: Mapping[str, AutoscalerSpec | None],
    default_interval_s: float = 15.0,
) -> list[PodSet]:
    """The sets of one namespace's autoscalers (`specs` by name; None for a spec that does not
    read, which is a set of its own ticking every `default_interval_s`), sorted by name."""
    parent = {name: name for name in specs}

    def root(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    bound_by: dict[str, set[str]] = {name: set() for name in specs}
    first_with: dict[str, str] = {}
    for name in sorted(specs):
        spec = specs[name]
        if spec is None:
            bound_by[name].add(f"autoscaler:{name}")
            continue
        for key in _binding_keys(spec):
            bound_by[name].add(key)
            if key in first_with:
                parent[root(name)] = root(first_with[key])
            else:
                first_with[key] = name

    groups: dict[str, list[str]] = {}
    for name in sorted(specs):
        groups.setdefault(root(name), []).append(name)
    sets = []
    for members in groups.values():
        keys = sorted({key for member in members for key in bound_by[member]})
        intervals = tuple(
            float(spec.interval_seconds) if (spec := specs[m]) is not None else default_interval_s
            for m in members
        )
        sets.append(PodSet(namespace, set_name(namespace, keys), tuple(members), intervals))
    return sorted(sets, key=lambda s: s.name)


def set_of(sets: Sequence[PodSet], member: str) -> PodSet | None:
    """The set `member` belongs to, if any."""
    return next((s for s in sets if member in s.members), None)


def set_name(namespace: str, keys: Sequence[str]) -> str:
    """The set's name from what binds it: the same selectors and budgets, the same name."""
    digest = hashlib.sha256("\n".join([namespace, *sorted(keys)]).encode()).hexdigest()
    return f"set-{digest[:10]}"


def _binding_keys(spec: AutoscalerSpec) -> list[str]:
    keys = [f"selector:{selector_to_string(spec.selector)}"]
    if spec.budget is not None:
        keys.append(f"budget:{spec.budget.name}")
    return keys
