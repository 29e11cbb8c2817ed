"""The actuator: set a model's instance count on every ready Triton pod, one pod at a time.

For each pod it reads the live config (`GET v2/models/{m}/config`) and, where the instance
count differs from the desired one, loads the model again with the live config as a JSON
override in which only `instance_group` changed (`POST v2/repository/models/{m}/load`).
Triton swaps the instances in place and keeps serving meanwhile. It waits until the model
is READY with the new count before it touches the next pod, so a bad config stops at the
first pod. A rejected load leaves Triton serving the old config; the pod's result says why.

Note: after a load with a config override, a later plain load keeps the override; to go
back to the repository's config, send that config as an override.

The repository-API key (tritonscale.REPOSITORY_KEY_HEADER) unlocks a door to remote code
execution: it is sent as a header and never appears in a log line, message or exception.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import requests

from tritonscale import REPOSITORY_KEY_ENV, REPOSITORY_KEY_HEADER
from tritonscale.triton.endpoints import Endpoint

log = logging.getLogger(__name__)


class ActuationError(Exception):
    """Triton could not be read or refused a load; one line naming the pod and the reason."""

    def __init__(self, pod: str, reason: str) -> None:
        super().__init__(f"{pod}: {reason}")
        self.pod = pod
        self.reason = reason


@dataclass(frozen=True)
class PodResult:
    """What happened on one pod."""

    pod: str
    before: int | None  # live count before the load (None: unreadable)
    after: int | None  # live count after it (None: unreadable)
    ok: bool
    reason: str  # "" when ok, else one line
    seconds: float  # load + wait for READY


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


def _one_line(text: str, limit: int = 300) -> str:
    first = " ".join(text.strip().split("\n")[0].split())
    return first[:limit] if first else "no reason given"


class Actuator:
    """Reads and sets instance counts through Triton's HTTP API.

    `repository_key` unlocks the model-repository API; None reads TRITONSCALE_REPOSITORY_KEY.
    `clock`/`sleep` are injectable for tests.
    """

    def __init__(
        self,
        repository_key: str | None = None,
        *,
        timeout_s: float = 5.0,
        load_timeout_s: float = 120.0,
        ready_timeout_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._key = repository_key if repository_key is not None else repository_key_from_env()
        self.timeout_s = timeout_s
        self.load_timeout_s = load_timeout_s
        self.ready_timeout_s = ready_timeout_s
        self._clock = clock
        self._sleep = sleep
        self._session = requests.Session()

    def __repr__(self) -> str:  # never show the key
        return f"Actuator(repository_key={'set' if self._key else 'unset'})"

    @property
    def repository_key(self) -> str:
        """The key this actuator sends (for a Healer on the same pods); never log it."""
        return self._key

    # ---- reading -------------------------------------------------------------------
    def live_config(self, endpoint: Endpoint, model: str) -> dict[str, Any]:
        url = f"{endpoint.base_url}/v2/models/{model}/config"
        try:
            response = self._session.get(url, timeout=self.timeout_s)
        except requests.RequestException as error:
            raise ActuationError(
                endpoint.name, f"cannot reach Triton at {endpoint.base_url}: {type(error).__name__}"
            ) from None
        if response.status_code != 200:
            raise ActuationError(
                endpoint.name,
                f"reading {model}'s config: HTTP {response.status_code}: {_error_text(response)}",
            )
        return response.json()

    def live_count(self, endpoint: Endpoint, model: str) -> int:
        return instance_count(self.live_config(endpoint, model))

    def live_counts(
        self, endpoints: Sequence[Endpoint], model: str
    ) -> tuple[dict[str, int], dict[str, str]]:
        """({pod: count} for the pods that answered, {pod: reason} for those that did not)."""
        counts: dict[str, int] = {}
        failures: dict[str, str] = {}
        for endpoint in endpoints:
            try:
                counts[endpoint.name] = self.live_count(endpoint, model)
            except ActuationError as error:
                failures[endpoint.name] = error.reason
        return counts, failures

    def is_ready(self, endpoint: Endpoint, model: str) -> bool:
        try:
            response = self._session.get(
                f"{endpoint.base_url}/v2/models/{model}/ready", timeout=self.timeout_s
            )
        except requests.RequestException:
            return False
        return response.status_code == 200

    # ---- acting --------------------------------------------------------------------
    def apply(
        self, endpoints: Sequence[Endpoint], model: str, desired: int, kind: str = ""
    ) -> list[PodResult]:
        """Bring every pod to `desired` instances, one pod at a time; stop at the first failure.

        Pods already at the count are skipped (no result). A failure ends the rollout: the
        pods after it keep their count until the next tick.
        """
        if desired < 1:
            raise ValueError(f"desired instances must be >= 1, got {desired}")
        results = []
        for endpoint in endpoints:
            result = self.apply_one(endpoint, model, desired, kind)
            if result is None:
                continue
            results.append(result)
            if not result.ok:
                break
        return results

    def apply_one(
        self, endpoint: Endpoint, model: str, desired: int, kind: str = ""
    ) -> PodResult | None:
        """Load `model` on one pod with `desired` instances; None when it already has them."""
        started = self._clock()
        try:
            config = self.live_config(endpoint, model)
        except ActuationError as error:
            return PodResult(endpoint.name, None, None, False, error.reason, 0.0)
        before = instance_count(config)
        live_kind = (config.get("instance_group") or [{}])[0].get("kind", "")
        if before == desired and (not kind or kind == live_kind):
            return None
        override = with_instances(config, desired, kind)
        try:
            self._load(endpoint, model, override)
            self._wait_ready(endpoint, model, desired)
        except ActuationError as error:
            after = self._count_or_none(endpoint, model)
            seconds = self._clock() - started
            log.warning(
                "%s: %s %d -> %d failed: %s", endpoint.name, model, before, desired, error.reason
            )
            return PodResult(endpoint.name, before, after, False, error.reason, seconds)
        seconds = self._clock() - started
        log.info(
            "%s: %s %d -> %d instances in %.2f s", endpoint.name, model, before, desired, seconds
        )
        return PodResult(endpoint.name, before, desired, True, "", seconds)

    def _load(self, endpoint: Endpoint, model: str, config: Mapping[str, Any]) -> None:
        headers = {REPOSITORY_KEY_HEADER: self._key} if self._key else {}
        body = {"parameters": {"config": json.dumps(config)}}
        try:
            response = self._session.post(
                f"{endpoint.base_url}/v2/repository/models/{model}/load",
                json=body,
                headers=headers,
                timeout=self.load_timeout_s,
            )
        except requests.RequestException as error:
            raise ActuationError(
                endpoint.name, f"loading {model}: cannot reach Triton: {type(error).__name__}"
            ) from None
        if response.status_code != 200:
            raise ActuationError(
                endpoint.name, f"Triton refused to load {model}: {_error_text(response)}"
            )

    def _wait_ready(self, endpoint: Endpoint, model: str, desired: int) -> None:
        deadline = self._clock() + self.ready_timeout_s
        while True:
            if self.is_ready(endpoint, model):
                count = self._count_or_none(endpoint, model)
                if count == desired:
                    return
            if self._clock() > deadline:
                raise ActuationError(
                    endpoint.name,
                    f"{model} not READY with {desired} instances after {self.ready_timeout_s:.0f} s",
                )
            self._sleep(0.1)

    def _count_or_none(self, endpoint: Endpoint, model: str) -> int | None:
        try:
            return self.live_count(endpoint, model)
        except ActuationError:
            return None


def _error_text(response: requests.Response) -> str:
    try:
        body = response.json()
        text = body.get("error", "") if isinstance(body, dict) else ""
    except ValueError:
        text = response.text
    return _one_line(text or f"HTTP {response.status_code}")
