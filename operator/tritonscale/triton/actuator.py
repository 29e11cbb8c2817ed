"""The actuator: set a model's instance count on every ready Triton pod.

For each pod it reads the live config (`GET v2/models/{m}/config`) and, where the instance
count differs from the desired one, loads the model again with the live config as a JSON
override in which only `instance_group` changed (`POST v2/repository/models/{m}/load`).
Triton swaps the instances in place and keeps serving meanwhile. A rejected load leaves
Triton serving the old config; the pod's result says why.

The rollout: the first pod that needs the change goes alone, and must be READY with the
new count before any other pod is touched, so that a config Triton refuses, or a model that
does not come back, stops at one pod. Once one pod has taken the change, the config is known
good and the others go together, at most `parallel_pods` (4) at a time, each on its own (an
asyncio task): a slow or hung pod does not hold back the others' counts.

Each load is a bounded wait (`load_deadline_s`, see tritonscale.triton.loads): past its
deadline the pod's result is `pending`, the larger of the two counts is taken for what runs
until Triton answers (`running`: Triton serves on a new instance before it confirms it, and on
a removed one until it exits), and no other load of the model goes to that pod while the
first one is in flight (`in_flight`: Triton would queue it behind the first).

Note: after a load with a config override, a later plain load keeps the override; to go
back to the repository's config, send that config as an override.

The repository-API key (tritonscale.REPOSITORY_KEY_HEADER) unlocks a door to remote code
execution: it is sent as a header and never appears in a log line, message or exception.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from tritonscale import REPOSITORY_KEY_ENV
from tritonscale.triton.client import AsyncTritonClient, TritonError
from tritonscale.triton.connections import Connections
from tritonscale.triton.endpoints import Endpoint
from tritonscale.triton.loads import (
    DEFAULT_LOAD_DEADLINE_S,
    DEFAULT_LOAD_TIMEOUT_S,
    LoadInFlight,
    LoadsInFlight,
    PodRead,
)
from tritonscale.triton.silent_pods import SilentPods

log = logging.getLogger(__name__)

# The actuator's error: one line naming the pod and the reason (`.pod`, `.reason`).
ActuationError = TritonError

# Pods loaded at the same time once the first pod has taken a change.
PARALLEL_PODS = 4
# How long the ticks trust a pod's config read before (pods whose containers' start is known):
# the slow verification of counts changed behind the operator's back.
CONFIG_MAX_AGE_S = 60.0
T = TypeVar("T")


@dataclass(frozen=True)
class _KeptConfig:
    """A pod's live config as one read found it."""

    read: PodRead  # when the read began, and the pod's containers' start then
    config: dict[str, Any]


@dataclass(frozen=True)
class PodResult:
    """What happened on one pod."""

    pod: str
    before: int | None  # live count before the load (None: unreadable)
    after: int | None  # live count after it (None: unreadable)
    ok: bool
    reason: str  # "" when ok, else one line
    seconds: float  # load + wait for READY
    # The load had not finished at its deadline (sent now, or on an earlier tick and still
    # in flight): Triton may still finish it; `after` is then the larger count (`running`).
    pending: bool = False


def instance_count(config: Mapping[str, Any]) -> int:
    """The instances a config asks for: the sum of `count` over its instance groups.

    On KIND_GPU each group's count is per listed GPU; the count here is what the
    operator sets, the per-GPU number.
    """
    groups = config.get("instance_group") or []
    return sum(int(group.get("count", 1)) for group in groups)


def is_decoupled(config: Mapping[str, Any]) -> bool:
    """Whether a config answers through response senders (`model_transaction_policy`)."""
    policy = config.get("model_transaction_policy") or {}
    return bool(policy.get("decoupled", False))


def with_instances(config: Mapping[str, Any], count: int, kind: str = "") -> dict[str, Any]:
    """The live config with only `instance_group` changed: one group of `count`.

    The group keeps the live kind (and GPUs) unless `kind` names another one.
    """
    new = copy.deepcopy(dict(config))
    groups = new.get("instance_group") or [{"kind": "KIND_CPU"}]
    group = {key: value for key, value in groups[0].items() if key != "name"}
    group["count"] = count
    if kind and kind != group.get("kind"):
        group["kind"] = kind
        group.pop("gpus", None)  # the live GPU list belongs to the old kind
    new["instance_group"] = [group]
    return new


def repository_key_from_env() -> str | None:
    return os.environ.get(REPOSITORY_KEY_ENV) or None


# What serves while Triton has not confirmed a count change, and what to do about it: Triton
# 2.51 serves on a new instance before it confirms it and on a removed one until it exits,
# and in its default rate-limiter mode both wait for the model's queue to empty.
UNCONFIRMED = (
    "up to {may_serve} instances serve meanwhile (a new instance serves before Triton confirms "
    "it, a removed one until it exits); a model whose queue never empties holds its change "
    "until it does unless tritonserver runs with --rate-limit=execution_count"
)


def still_in_flight(load: LoadInFlight, age_s: float) -> str:
    """The one line for a pod whose load of a model, sent `age_s` ago, has not finished yet."""
    serving = UNCONFIRMED.format(may_serve=load.may_serve) if load.may_serve else ""
    return (
        f"Triton has not confirmed the load of {load.model} with {load.what} on {load.pod} "
        f"sent {age_s:.0f} s ago (deadline {load.deadline_s:g} s); "
        + (f"{serving}; " if serving else "")
        + "no other load of that model goes to that pod until it ends (it would wait behind it)"
    )


class Actuator:
    """Reads and sets instance counts through Triton's HTTP API.

    `repository_key` unlocks the model-repository API; None reads TRITONSCALE_REPOSITORY_KEY.
    `load_deadline_s` bounds the wait for one load (and READY after it); `load_timeout_s`
    how long its request stays open past that. `loads` may be shared with a Healer,
    `connections` (kept-open clients of the pods) with every reader of the driver.
    The ticks' reads of a pod's config (`live_configs`) are kept for pods whose containers'
    start is known (`Endpoint.started_at`, Kubernetes) and read again after a restart, a load
    of the model to the pod, or `config_max_age_s`; a change itself always reads afresh.
    `clock`/`sleep` are injectable for tests.
    """

    def __init__(
        self,
        repository_key: str | None = None,
        *,
        timeout_s: float = 5.0,
        load_deadline_s: float = DEFAULT_LOAD_DEADLINE_S,
        load_timeout_s: float = DEFAULT_LOAD_TIMEOUT_S,
        parallel_pods: int = PARALLEL_PODS,
        loads: LoadsInFlight | None = None,
        connections: Connections | None = None,
        config_max_age_s: float = CONFIG_MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if parallel_pods < 1:
            raise ValueError(f"parallel_pods must be >= 1, not {parallel_pods}")
        self._key = repository_key if repository_key is not None else repository_key_from_env()
        self.timeout_s = timeout_s
        self.load_timeout_s = load_timeout_s
        self.parallel_pods = parallel_pods
        self.loads = loads or LoadsInFlight(deadline_s=load_deadline_s, clock=clock)
        # The driver's kept-open connections to the pods (a client per call without them).
        self.connections = connections
        self._clock = clock
        self._sleep = sleep
        self.config_max_age_s = config_max_age_s
        self._configs: dict[tuple[str, str, str], _KeptConfig] = {}
        self._configs_pruned_at = clock()
        # Pods that did not answer; shared by the ticks of every autoscaler on this actuator.
        self.silent_pods = SilentPods(self._is_live, clock=clock)

    def __repr__(self) -> str:  # never show the key
        return f"Actuator(repository_key={'set' if self._key else 'unset'})"

    @property
    def repository_key(self) -> str:
        """The key this actuator sends (for a Healer on the same pods); never log it."""
        return self._key or ""

    @property
    def load_deadline_s(self) -> float:
        return self.loads.deadline_s

    def client(self, endpoint: Endpoint) -> AsyncTritonClient:
        """A client for one pod, with this actuator's key and timeout; close it after use."""
        return AsyncTritonClient(
            endpoint, self._key, timeout_s=self.timeout_s, connections=self.connections
        )

    # ---- reading -------------------------------------------------------------------
    async def live_config(self, endpoint: Endpoint, model: str) -> dict[str, Any]:
        async with self.client(endpoint) as triton:
            return await triton.model_config(model)

    async def live_count(self, endpoint: Endpoint, model: str) -> int:
        return instance_count(await self.live_config(endpoint, model))

    async def live_configs(
        self, endpoints: Sequence[Endpoint], model: str
    ) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
        """({pod: live config} for the pods that answered, {pod: reason} for those that did not).

        The pods are read at the same time, `parallel_pods` at once: a pod that does not
        answer costs the tick one timeout, not one for itself and a wait for every pod after it.
        """
        answers = await self.each(endpoints, lambda endpoint: self._read(endpoint, model))
        configs: dict[str, dict[str, Any]] = {}
        failures: dict[str, str] = {}
        for endpoint, (config, reason) in zip(endpoints, answers, strict=True):
            if config is None:
                failures[endpoint.name] = reason
            else:
                configs[endpoint.name] = config
        return configs, failures

    async def live_counts(
        self, endpoints: Sequence[Endpoint], model: str
    ) -> tuple[dict[str, int], dict[str, str]]:
        """`live_configs`, each as the instances that run (`running`)."""
        configs, failures = await self.live_configs(endpoints, model)
        return {pod: self.running(pod, model, config) for pod, config in configs.items()}, failures

    def running(self, pod: str, model: str, config: Mapping[str, Any]) -> int:
        """The instances of `model` that run on `pod`, given its live config: the config's
        count, or while a count change sent there is unconfirmed, the larger of its two
        counts. Triton's config lags what serves then, in either direction (it shows the old
        count until an increase is confirmed, the new one from the start of a decrease), and
        Triton reports nothing else of it; the larger is what runs while Triton's rate limiter
        holds the change (measured, docs/count-changes.md), and never less than what runs: the
        budget counts it."""
        count = instance_count(config)
        load = self.loads.in_flight(pod, model)
        return max(count, load.may_serve) if load is not None and load.may_serve else count

    async def each(
        self, endpoints: Sequence[Endpoint], call: Callable[[Endpoint], Awaitable[T]]
    ) -> list[T]:
        """`call` on every pod, `parallel_pods` at a time, as tasks; results in the pods' order."""
        if len(endpoints) <= 1:
            return [await call(endpoint) for endpoint in endpoints]
        room = asyncio.Semaphore(self.parallel_pods)

        async def bounded(endpoint: Endpoint) -> T:
            async with room:
                return await call(endpoint)

        return list(await asyncio.gather(*(bounded(endpoint) for endpoint in endpoints)))

    async def _read(self, endpoint: Endpoint, model: str) -> tuple[dict[str, Any] | None, str]:
        """A pod's live config for the ticks: the one read before, while it holds."""
        kept = self._kept_config(endpoint, model)
        if kept is not None:
            return copy.deepcopy(kept), ""
        read = self.loads.read_began(endpoint.started_at)
        try:
            config = await self.live_config(endpoint, model)
        except TritonError as error:
            return None, error.reason
        if endpoint.started_at is not None:
            self._keep_config(endpoint, model, config, read)
        return config, ""

    def _kept_config(self, endpoint: Endpoint, model: str) -> dict[str, Any] | None:
        """The config read of this pod before, unless it may have changed since
        (`LoadsInFlight.may_have_changed`, with `config_max_age_s`)."""
        kept = self._configs.get((endpoint.name, endpoint.http_url, model))
        if kept is None or self.loads.may_have_changed(
            endpoint.name, model, kept.read, endpoint.started_at, self.config_max_age_s
        ):
            return None
        return kept.config

    def forget_configs(self) -> None:
        """Drop every config kept from the ticks' reads: another writer (an operator that
        acted while this one was paused) may have changed the counts."""
        self._configs.clear()

    def _keep_config(
        self, endpoint: Endpoint, model: str, config: dict[str, Any], read: PodRead
    ) -> None:
        now = self._clock()
        if now - self._configs_pruned_at >= self.config_max_age_s:
            self._configs_pruned_at = now  # the pods gone: their reads are past their age
            for key in [
                k for k, v in self._configs.items() if now - v.read.at > self.config_max_age_s
            ]:
                del self._configs[key]
        key = (endpoint.name, endpoint.http_url, model)
        self._configs[key] = _KeptConfig(read, copy.deepcopy(config))

    async def _is_live(self, endpoint: Endpoint) -> bool:
        """SilentPods' background call."""
        try:
            async with self.client(endpoint) as triton:
                return await triton.is_live()
        except TritonError:
            return False

    async def is_ready(self, endpoint: Endpoint, model: str) -> bool:
        async with self.client(endpoint) as triton:
            try:
                return await triton.is_model_ready(model)
            except TritonError:
                return False

    def in_flight(self, endpoint: Endpoint, model: str) -> LoadInFlight | None:
        """A load of `model` on this pod that outlived its deadline and is still in flight."""
        return self.loads.in_flight(endpoint.name, model)

    def in_flight_reason(self, load: LoadInFlight) -> str:
        """The one line that says a load is still in flight, and since when."""
        return still_in_flight(load, self._clock() - load.started)

    # ---- acting --------------------------------------------------------------------
    async def apply(
        self, endpoints: Sequence[Endpoint], model: str, desired: int, kind: str = ""
    ) -> list[PodResult]:
        """Bring every pod to `desired` instances: the first pod that needs it alone, then
        the others, `parallel_pods` at a time. Results are in the pods' order.

        Pods already at the count are skipped (no result). A failure (or a load past its
        deadline) on the first pod ends the rollout: the pods after it keep their count
        until the next tick.
        """
        if desired < 1:
            raise ValueError(f"desired instances must be >= 1, got {desired}")
        results: list[PodResult] = []
        rest = list(endpoints)
        while rest:
            first = await self.apply_one(rest.pop(0), model, desired, kind)
            if first is None:
                continue
            results.append(first)
            if not first.ok:
                return results
            break
        others = await self.each(rest, lambda pod: self.apply_one(pod, model, desired, kind))
        results += [result for result in others if result is not None]
        return results

    async def apply_one(
        self, endpoint: Endpoint, model: str, desired: int, kind: str = ""
    ) -> PodResult | None:
        """Load `model` on one pod with `desired` instances; None when it already has them."""
        started = self._clock()
        try:
            config = await self.live_config(endpoint, model)
        except TritonError as error:
            return PodResult(endpoint.name, None, None, False, error.reason, 0.0)
        before = instance_count(config)
        live_kind = (config.get("instance_group") or [{}])[0].get("kind", "")
        if before == desired and (not kind or kind == live_kind):
            return None
        earlier = self.in_flight(endpoint, model)
        if earlier is not None:
            reason = still_in_flight(earlier, started - earlier.started)
            return PodResult(endpoint.name, before, before, False, reason, 0.0, pending=True)
        override = with_instances(config, desired, kind)
        what = f"{desired} instance{'' if desired == 1 else 's'}" + (f" of {kind}" if kind else "")
        try:
            late = await self.loads.run(
                endpoint.name,
                model,
                what,
                lambda: self._load(endpoint, model, override),
                may_serve=max(before, desired),
            )
            if late is None:
                await self._wait_ready(
                    endpoint, model, desired, until=started + self.load_deadline_s
                )
        except TritonError as error:
            after = await self._count_or_none(endpoint, model)
            seconds = self._clock() - started
            log.warning(
                "%s: %s %d -> %d failed: %s", endpoint.name, model, before, desired, error.reason
            )
            return PodResult(endpoint.name, before, after, False, error.reason, seconds)
        seconds = self._clock() - started
        if late is not None:
            # `late` may be a load of the model the healer sent (no count change): then the
            # count before is what runs.
            serving = late.may_serve or before
            reason = (
                f"Triton has not confirmed the load of {model} with {late.what} on "
                f"{endpoint.name} within its deadline of {self.load_deadline_s:g} s; "
                + UNCONFIRMED.format(may_serve=serving)
            )
            log.warning("%s: %s %d -> %d: %s", endpoint.name, model, before, desired, reason)
            return PodResult(endpoint.name, before, serving, False, reason, seconds, pending=True)
        log.info(
            "%s: %s %d -> %d instances in %.2f s", endpoint.name, model, before, desired, seconds
        )
        return PodResult(endpoint.name, before, desired, True, "", seconds)

    async def _load(self, endpoint: Endpoint, model: str, config: Mapping[str, Any]) -> None:
        """One load request (the load's own task, see LoadsInFlight.run)."""
        async with self.client(endpoint) as triton:
            await triton.load(model, config, timeout_s=self.load_timeout_s)

    async def _wait_ready(self, endpoint: Endpoint, model: str, desired: int, until: float) -> None:
        """Triton answers a load once the model is READY; this checks it, until `until`."""
        async with self.client(endpoint) as triton:
            while True:
                try:
                    ready = await triton.is_model_ready(model)
                    if ready and instance_count(await triton.model_config(model)) == desired:
                        return
                except TritonError:
                    pass  # not readable yet: looked at again until the deadline
                if self._clock() >= until:
                    raise TritonError(
                        endpoint.name,
                        f"{model} not READY with {desired} instances within the load's "
                        f"deadline of {self.load_deadline_s:g} s",
                    )
                await self._sleep(0.1)

    async def _count_or_none(self, endpoint: Endpoint, model: str) -> int | None:
        try:
            return await self.live_count(endpoint, model)
        except TritonError:
            return None
