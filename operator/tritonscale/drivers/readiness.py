"""When the operator is Ready: what its readinessProbe asks (`--readiness URL`).

A replica is Ready when it can do its part:

- acting (standalone, a shard, or the active replica of a peering): once kopf has listed what
  it watches and filled its indexes. kopf holds every handler back until then, so the first
  handler call after start proves it (`Readiness.note_synced`); where the watched namespaces
  hold no pods and no autoscalers there is nothing to list and no handler ever runs, so an
  empty list from the API server counts too;
- a standby of a peering: while its own heartbeat and a live peer of a higher priority are in
  the namespace's KopfPeering object. A standby watches nothing (kopf pauses it), so it has no
  index to sync; it must still be Ready, or a Deployment's rollout and a PodDisruptionBudget
  would wait on it for ever.

A replica that cannot reach the API server, or whose heartbeat is missing, is not Ready: a
rollout of a broken operator then stops at its first new replica while the old ones carry on.
Once synced a replica stays so (kopf never holds its handlers back again); the peering roles
are read at every probe.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import urllib.parse
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import aiohttp.web

from tritonscale.drivers.kube_api import KubeApi
from tritonscale.drivers.status import GROUP, PLURAL, VERSION

PEERING_GROUP, PEERING_VERSION = "kopf.dev", "v1"
NAMESPACED_PEERINGS, CLUSTER_PEERINGS = "kopfpeerings", "clusterkopfpeerings"
# kopf's default for a heartbeat that names no lifetime.
DEFAULT_LIFETIME_S = 60


class Role(Enum):
    """This replica's part in one peering object."""

    ACTIVE = "active"  # no live peer of a higher priority: it acts
    STANDBY = "standby"  # a live peer of a higher priority acts
    CONFLICT = "conflict"  # a live peer of the same priority: kopf pauses both
    UNSEEN = "unseen"  # its own heartbeat is not (or no longer) there


def role(peers: Mapping[str, Any], identity: str, priority: int, now: datetime.datetime) -> Role:
    """This replica's role among `peers` (a peering object's status: identity -> heartbeat
    with `priority`, `lastseen`, `lifetime`), as kopf decides it."""
    live = {
        name: heartbeat
        for name, heartbeat in peers.items()
        if isinstance(heartbeat, Mapping) and _alive(heartbeat, now)
    }
    if identity not in live:
        return Role.UNSEEN
    others = [int(h.get("priority", 0)) for name, h in live.items() if name != identity]
    if any(p > priority for p in others):
        return Role.STANDBY
    if priority in others:
        return Role.CONFLICT
    return Role.ACTIVE


def _alive(heartbeat: Mapping[str, Any], now: datetime.datetime) -> bool:
    lastseen = heartbeat.get("lastseen")
    if not isinstance(lastseen, str):
        return False
    try:
        seen = datetime.datetime.fromisoformat(lastseen)
    except ValueError:
        return False
    if seen.tzinfo is None:
        seen = seen.replace(tzinfo=datetime.timezone.utc)
    lifetime = datetime.timedelta(seconds=int(heartbeat.get("lifetime", DEFAULT_LIFETIME_S)))
    return seen + lifetime > now


@dataclass(frozen=True)
class Verdict:
    """The probe's answer: Ready or not, and why, in words a person reads."""

    ready: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"ready": self.ready, "reason": self.reason}


def judge(synced: bool, roles: Mapping[str, Role | str], nothing_to_index: bool = False) -> Verdict:
    """Whether the replica is Ready, from whether its indexes have synced, its role in each
    peering object by namespace (none when it runs without peering; a string where the object
    could not be read), and whether the API server lists nothing for it to index."""
    for where, found in roles.items():
        if isinstance(found, str):
            return Verdict(False, f"peering in {where} unread: {found}")
        if found is Role.UNSEEN:
            return Verdict(False, f"its heartbeat is not in the peering of {where} yet")
        if found is Role.CONFLICT:
            return Verdict(False, f"a peer in {where} has its priority: kopf pauses both")
    acting = [where for where, found in roles.items() if found is Role.ACTIVE]
    if roles and not acting:
        return Verdict(True, "standby: a live peer of a higher priority acts")
    if synced:
        return Verdict(True, "active: its indexes have synced" if roles else "synced")
    if nothing_to_index:
        return Verdict(True, "nothing to index: no pods and no autoscalers")
    return Verdict(False, "its indexes have not synced yet")


Lister = Callable[[], Awaitable[bool]]  # whether the watched namespaces hold nothing to index
PeeringReader = Callable[[str], Awaitable[Mapping[str, Any]]]  # namespace -> the object's status


@dataclass
class Readiness:
    """What the probe knows of this replica; `check` answers it."""

    peering: str | None = None  # the KopfPeering objects' name; None: no peering
    identity: str = ""
    priority: int = 0
    # The namespaces whose peering objects count ("" for the cluster-wide one).
    namespaces: Collection[str] = ()
    synced: bool = False
    # How the API server is asked; set by the driver (tritonscale.drivers.kopf_operator).
    nothing_to_index: Lister | None = None
    read_peering: PeeringReader | None = None
    clock: Callable[[], datetime.datetime] = field(
        default=lambda: datetime.datetime.now(datetime.timezone.utc)
    )

    def note_synced(self) -> None:
        """kopf ran a handler: its indexes are full."""
        self.synced = True

    async def check(self) -> Verdict:
        roles: dict[str, Role | str] = {}
        if self.peering is not None and self.read_peering is not None:
            for namespace in self.namespaces:
                where = namespace or "the cluster"
                try:
                    peers = await self.read_peering(namespace)
                except Exception as error:  # noqa: BLE001 - any failure to read is the answer
                    roles[where] = _one_line(error)
                    continue
                roles[where] = role(peers, self.identity, self.priority, self.clock())
        verdict = judge(self.synced, roles)
        if verdict.ready or self.synced or self.nothing_to_index is None:
            return verdict
        if any(found is not Role.ACTIVE for found in roles.values()):
            return verdict
        try:
            empty = await self.nothing_to_index()
        except Exception as error:  # noqa: BLE001 - an API server out of reach is not Ready
            return Verdict(False, f"its indexes have not synced yet ({_one_line(error)})")
        return judge(self.synced, roles, nothing_to_index=empty)


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text[:200]


class ApiReads:
    """The probe's questions to the API server (tritonscale.drivers.kube_api): only `list`,
    which the operator's Role grants (docs/rbac.md)."""

    # Below the chart's probe timeout (5 s), so that a slow API server gets an answer that
    # says so rather than a probe that times out.
    TIMEOUT_S = 3.0

    def __init__(self, api: KubeApi, namespaces: Collection[str], peering: str | None) -> None:
        self._api = api
        self._namespaces = list(namespaces)  # empty: every namespace
        self._peering = peering

    async def _listed(self, path: str, params: Mapping[str, str]) -> list[Any]:
        found = await self._api.get(path, params, timeout_s=self.TIMEOUT_S)
        return list(found.get("items") or [])

    async def nothing_to_index(self) -> bool:
        one = {"limit": "1"}
        custom = f"/apis/{GROUP}/{VERSION}"
        if not self._namespaces:
            for path in ("/api/v1/pods", f"{custom}/{PLURAL}"):
                if await self._listed(path, one):
                    return False
            return True
        for namespace in self._namespaces:
            for path in (
                f"/api/v1/namespaces/{namespace}/pods",
                f"{custom}/namespaces/{namespace}/{PLURAL}",
            ):
                if await self._listed(path, one):
                    return False
        return True

    async def peering_status(self, namespace: str) -> Mapping[str, Any]:
        base = f"/apis/{PEERING_GROUP}/{PEERING_VERSION}"
        if namespace:
            path = f"{base}/namespaces/{namespace}/{NAMESPACED_PEERINGS}"
        else:
            path = f"{base}/{CLUSTER_PEERINGS}"
        items = await self._listed(path, {"fieldSelector": f"metadata.name={self._peering}"})
        for item in items:
            if (item.get("metadata") or {}).get("name") == self._peering:
                return item.get("status") or {}
        raise LookupError(f"no KopfPeering {self._peering!r}")


class ProbeServer:
    """GET on the URL's path: 200 and the verdict as JSON when Ready, 503 when not."""

    def __init__(self, url: str, readiness: Readiness) -> None:
        parts = urllib.parse.urlsplit(url)
        self.host = parts.hostname or "0.0.0.0"
        self.port = parts.port or 80
        self.path = parts.path or "/"
        self.readiness = readiness
        self._runner: aiohttp.web.AppRunner | None = None
        # kubelet asks every few seconds; one check at a time answers them all.
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        app = aiohttp.web.Application()
        app.add_routes([aiohttp.web.get(self.path, self._answer)])
        self._runner = aiohttp.web.AppRunner(app, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        await aiohttp.web.TCPSite(self._runner, self.host, self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _answer(self, _request: aiohttp.web.Request) -> aiohttp.web.Response:
        async with self._lock:
            verdict = await self.readiness.check()
        return aiohttp.web.Response(
            status=200 if verdict.ready else 503,
            text=json.dumps(verdict.to_dict()),
            content_type="application/json",
        )
