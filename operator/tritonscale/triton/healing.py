"""Self-healing: notice a model whose Python stub died or hangs, and reload it, without looping.

What Triton 2.51 does when a model's stub process dies (kill -9) or stops answering
(SIGSTOP), measured here: `/v2/health/ready` and `/v2/models/{m}/ready` stay 200, the
repository index says READY, every request to the model fails after about 1 s with
"Stub process '<model>_<n>_<i>' is not healthy." (HTTP 500, gRPC INTERNAL), counted as
`nv_inference_request_failure{reason="BACKEND"}`, and Triton never restarts the stub by
itself. A BLS parent of that model fails its requests too, naming the child's stub.

So readiness alone says nothing; the signals here are, per (pod, model):

- readiness not 200 (the model unloaded or failed a load);
- BACKEND failures rising between two checks, confirmed by probes; where no probe can be
  sent (decoupled models), only when not one request succeeded meanwhile (requests the
  model refuses count as BACKEND failures too);
- probe inferences (zeros built from the live config; on suspicion by default, or at
  every check): instances + 1 of them in a row, since Triton hands consecutive requests to
  the instances in turn and one dead instance among several fails only its share. An
  error naming one of the model's *own* stubs as not healthy, or no answer within the
  timeout while no request succeeds either (with successes, a slow probe means a queue), is
  the verdict.
- BACKEND failures at `persistent_checks` checks in a row (3) that probes could not explain:
  under load the probes may all land on live instances while a dead one keeps failing its
  share. Requests the model refuses at every check look the same; the reload they cause is
  harmless (the replace keeps serving) and bounded like any other. Any other answer, even an error, means the stub is alive: a
  parent whose child is dead is not reloaded for it.

The cure is a reload of that model on that pod through the load API. Loading the live
config unchanged is a no-op in Triton (it answers 200 at once and keeps the dead stub), so
the override is the live config with one parameter, `tritonscale_heal_generation`, bumped:
Triton then loads a fresh set of instances (about 1.4 s here) with the same instance count.
Triton 2.51 never finishes unloading the replaced version once its dead stub was sent
requests: stubs of it that were still alive linger until the server stops (an unload before
the load does not help: it never completes). Healing is bounded, so is that leak; see
docs/reliability.md.

Readiness is asked only when it may have changed: a pod's model is asked when the healer first
sees the pair, after the pod's containers restarted, after a load of the model to the pod (the
actuator's or a heal), when its counters went back (Triton drops an unloaded model's series)
or show BACKEND failures, and otherwise once every `readiness_max_age_s` (60 s); a quiet
serving model costs no call to the pod. Where the pod's start is unknown (local runs, no
Kubernetes) or it has no metrics, it is asked at every check, as the actuator reads configs.

It never reloads in a loop: per (pod, model) an exponential back-off between attempts and at
most `max_attempts` within `window_s`; then every check answers `HealingExhausted` (a
person must look) until the window has passed. A reload is a load with a deadline, like the
actuator's (tritonscale.triton.loads, shared with the actuator): one that does not finish in
time is a failed attempt, and while it is in flight the model is not touched on that pod
(`ModelLoading`). The repository key is sent as a header and never appears in a log line, a
message or a result. The clock is injectable.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import triton_to_np_dtype

from tritonscale import REPOSITORY_KEY_ENV
from tritonscale.core.signals import MetricsUnavailable
from tritonscale.triton.client import AsyncTritonClient, TritonError, TritonUnreachable
from tritonscale.triton.connections import Connections
from tritonscale.triton.endpoints import Endpoint
from tritonscale.triton.loads import DEFAULT_LOAD_TIMEOUT_S, LoadsInFlight, PodRead
from tritonscale.triton.metrics_text import (
    REQUEST_COUNTERS,
    label_matcher,
    parse_metrics,
    request_counters,
)

logger = logging.getLogger(__name__)

# What a heal's load asks for (LoadInFlight.what): any other is the actuator's.
FRESH_INSTANCES = "a fresh set of instances"

# Result actions.
NONE = "none"  # healthy, or nothing to do
RELOADED = "reloaded"  # a reload was sent and the model is ready again
RELOAD_FAILED = "reload-failed"  # a reload was sent and Triton refused or failed it
WAITING = "waiting"  # unhealthy, but the back-off has not elapsed
EXHAUSTED = "exhausted"  # unhealthy, and the attempts of the window are spent: a person must look

# Reasons (CamelCase, for conditions and events).
HEALTHY = "ModelHealthy"
MODEL_NOT_READY = "ModelNotReady"
STUB_UNHEALTHY = "StubUnhealthy"
PROBE_TIMEOUT = "ProbeTimeout"
PERSISTENT_FAILURES = "PersistentBackendFailures"
HEALED = "Healed"
HEALING_FAILED = "HealingFailed"
HEALING_BACKOFF = "HealingBackoff"
HEALING_EXHAUSTED = "HealingExhausted"
POD_UNREACHABLE = "PodUnreachable"
MODEL_LOADING = "ModelLoading"

HEAL_PARAMETER = "tritonscale_heal_generation"
CONDITION_TYPE = "ModelHealthy"

PROBE_OFF, PROBE_ON_SUSPICION, PROBE_ALWAYS = "off", "on-suspicion", "always"

# How long a model's readiness on a pod is trusted while nothing says it changed (the slow
# verification of an unload made behind the operator's back; the actuator's configs alike).
READINESS_MAX_AGE_S = 60.0

# The config's data types (TYPE_*) that a probe can send, as the inference API names them.
_PROBE_DATATYPES = {
    "TYPE_BOOL": "BOOL",
    "TYPE_UINT8": "UINT8",
    "TYPE_UINT16": "UINT16",
    "TYPE_UINT32": "UINT32",
    "TYPE_UINT64": "UINT64",
    "TYPE_INT8": "INT8",
    "TYPE_INT16": "INT16",
    "TYPE_INT32": "INT32",
    "TYPE_INT64": "INT64",
    "TYPE_FP16": "FP16",
    "TYPE_FP32": "FP32",
    "TYPE_FP64": "FP64",
    "TYPE_STRING": "BYTES",
}


@dataclass(frozen=True)
class HealingResult:
    """What one check found and did; the driver turns it into an event and a condition."""

    pod: str
    model: str
    action: str  # NONE, RELOADED, RELOAD_FAILED, WAITING, EXHAUSTED
    reason: str  # CamelCase
    message: str  # one line, with the numbers; never the repository key
    attempts_in_window: int = 0
    reload_s: float | None = None  # how long the reload took, when one was sent
    # What was wrong: StubUnhealthy, ProbeTimeout, PersistentBackendFailures, ModelNotReady.
    cause: str = ""

    @property
    def healthy(self) -> bool:
        return self.reason in (HEALTHY, HEALED)

    @property
    def needs_person(self) -> bool:
        return self.action == EXHAUSTED

    @property
    def event_type(self) -> str | None:
        """Normal or Warning for an event worth posting; None for a quiet healthy check."""
        if self.action == NONE:
            return None if self.reason in (HEALTHY, MODEL_LOADING) else "Warning"
        return "Normal" if self.action == RELOADED else "Warning"

    def condition(self) -> dict[str, str]:
        """An HPA-style condition (the driver adds lastTransitionTime)."""
        return {
            "type": CONDITION_TYPE,
            "status": "True" if self.healthy else "False",
            "reason": self.reason,
            "message": self.message,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "pod": self.pod,
            "model": self.model,
            "action": self.action,
            "reason": self.reason,
            "message": self.message,
            "attemptsInWindow": self.attempts_in_window,
            "cause": self.cause,
        }


@dataclass
class _History:
    """Per (pod, model): the last counters seen and the reload attempts."""

    failures: float | None = None
    successes: float | None = None
    attempts: list[float] = field(default_factory=list)  # clock times of reloads sent
    generation: int = 0
    rising: int = 0  # checks in a row that saw BACKEND failures
    exhausted: bool = False  # HealingExhausted has been logged
    # When the read that last found the model ready began, with the pod's containers' start.
    ready: PodRead | None = None


# (pod, model) -> (BACKEND failures, successes): the totals of the model's request counters;
# None (or MetricsUnavailable) where the reader cannot tell, and the pod's /metrics is read.
RequestCounters = Callable[[Endpoint, str], Awaitable[tuple[float, float] | None]]


class Healer:
    """Checks (pod, model) pairs and reloads a model whose stub died or hangs.

    One instance serves every pod and model of a driver; its state lives in memory (a
    restarted operator starts with a fresh budget, which is bounded by `max_attempts` too).
    `loads` is the actuator's (`Actuator.loads`), so that neither piles a load on one the
    other left in flight; without it the healer keeps its own.
    """

    def __init__(
        self,
        *,
        repository_key: str | None = None,
        probe: str = PROBE_ON_SUSPICION,
        probe_timeout_s: float = 10.0,
        backoff_initial_s: float = 30.0,
        backoff_max_s: float = 600.0,
        max_attempts: int = 3,
        window_s: float = 1800.0,
        persistent_checks: int = 3,
        readiness_max_age_s: float = READINESS_MAX_AGE_S,
        timeout_s: float = 10.0,
        load_timeout_s: float = DEFAULT_LOAD_TIMEOUT_S,
        loads: LoadsInFlight | None = None,
        request_counters: RequestCounters | None = None,
        connections: Connections | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if probe not in (PROBE_OFF, PROBE_ON_SUSPICION, PROBE_ALWAYS):
            raise ValueError(f"probe must be off, on-suspicion or always, not {probe!r}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, not {max_attempts}")
        self._key = repository_key or os.environ.get(REPOSITORY_KEY_ENV) or ""
        self.probe = probe
        self.probe_timeout_s = probe_timeout_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.max_attempts = max_attempts
        self.window_s = window_s
        self.persistent_checks = persistent_checks
        self.readiness_max_age_s = readiness_max_age_s
        self.timeout_s = timeout_s
        self.load_timeout_s = load_timeout_s
        self.loads = loads or LoadsInFlight(clock=clock)
        # The metrics source's reader: scraping, its read of the pod's /metrics (the tick then
        # reads each pod's /metrics once for both); with Prometheus, Prometheus's copy.
        self.request_counters = request_counters
        self.connections = connections  # the driver's kept-open clients of the pods
        self.clock = clock
        self._history: dict[tuple[str, str], _History] = {}

    def __repr__(self) -> str:  # the key stays out of reprs, hence out of tracebacks' locals
        return f"Healer(probe={self.probe!r}, max_attempts={self.max_attempts})"

    # ---- the one public move -----------------------------------------------------------
    async def check(self, endpoint: Endpoint, model: str) -> HealingResult:
        """Check one model on one pod; reload it there if its stub is dead or hung.

        Without `endpoint.metrics_url` only readiness and probes (`probe="always"`) are seen.
        """
        pod = endpoint.name
        history = self._history.setdefault((pod, model), _History())
        in_flight = self.loads.in_flight(pod, model)
        if in_flight is not None:
            why = f"a load of {model} on {pod} ({in_flight.what}) is in flight; not touched"
            return HealingResult(pod, model, NONE, MODEL_LOADING, why)
        try:
            async with self._client(endpoint) as triton:
                problem = await self._diagnose(triton, endpoint, model, history)
        except TritonError as error:
            return HealingResult(
                pod,
                model,
                NONE,
                POD_UNREACHABLE,
                f"{model} on {pod}: {error.reason}; left to the pod's probes",
            )
        if problem is None:
            return HealingResult(
                pod,
                model,
                NONE,
                HEALTHY,
                f"{model} on {pod} is serving",
                self._attempts_in_window(history),
            )
        reason, why = problem
        if reason == MODEL_LOADING:
            return HealingResult(pod, model, NONE, MODEL_LOADING, why)
        return await self._heal(endpoint, model, reason, why, history)

    # ---- diagnosis ---------------------------------------------------------------------
    async def _diagnose(
        self, triton: AsyncTritonClient, endpoint: Endpoint, model: str, history: _History
    ) -> tuple[str, str] | None:
        pod = endpoint.name
        failed = succeeded = 0.0
        baseline = True  # no increase known: the first look, no metrics, or counters reset
        if endpoint.metrics_url:
            totals = await self._request_totals(triton, endpoint, model)
            increase = self._counter_increase(totals, history)
            if increase is not None:
                (failed, succeeded), baseline = increase, False
        if (
            baseline
            or failed
            or self.loads.may_have_changed(
                pod, model, history.ready, endpoint.started_at, self.readiness_max_age_s
            )
        ):
            read = self.loads.read_began(endpoint.started_at)
            if not await triton.is_model_ready(model):
                history.ready = None
                state = await self._repository_state(triton, model)
                if state in ("LOADING", "UNLOADING"):
                    return MODEL_LOADING, f"{model} on {pod} is {state.lower()}; not touched"
                return MODEL_NOT_READY, f"{model} on {pod} is not ready ({state or 'absent'})"
            history.ready = read

        history.rising = history.rising + 1 if failed else 0
        suspicion = f"{failed:.0f} backend failures since the last check" if failed else None
        probed = blamed = False
        if self.probe == PROBE_ALWAYS or (suspicion and self.probe == PROBE_ON_SUSPICION):
            probed, verdict, blamed = await self._probe(triton, pod, model)
            if blamed:
                history.rising = 0  # a model it calls is broken: that one is healed instead
            if verdict is not None and verdict[0] == PROBE_TIMEOUT and succeeded:
                # Requests still succeed: a slow probe means a long queue, not a hang.
                verdict = None
            if verdict is not None:
                reason, why = verdict
                return reason, f"{why} ({suspicion})" if suspicion else why
        if suspicion and history.rising >= self.persistent_checks:
            # Under load the probes may all land on live instances while a dead one keeps
            # failing its share (seen in the soak): failures at every check are the tell.
            return PERSISTENT_FAILURES, (
                f"{model} on {pod}: backend failures at {history.rising} checks in a row "
                f"({suspicion}) that probes could not explain"
            )
        if probed:
            return None  # every instance answered: the failures were the requests' own
        # Without a probe, only "everything failed" is evidence enough: requests the model
        # refuses (bad input) also count as BACKEND failures.
        if suspicion and not succeeded:
            return STUB_UNHEALTHY, f"{model} on {pod}: {suspicion} and no success"
        return None

    async def _request_totals(
        self, triton: AsyncTritonClient, endpoint: Endpoint, model: str
    ) -> tuple[float, float]:
        if self.request_counters is not None:
            try:
                totals = await self.request_counters(endpoint, model)
            except MetricsUnavailable as error:
                logger.debug("request counters of %s on %s: %s", model, endpoint.name, error)
                totals = None
            if totals is not None:
                return totals
        # No reader, or Prometheus cannot tell (down, or the pod not scraped yet): the pod's
        # own /metrics.
        return _request_counters(await triton.metrics_text(), model)

    async def _repository_state(self, triton: AsyncTritonClient, model: str) -> str | None:
        try:
            return await triton.model_state(model)
        except TritonUnreachable:
            raise
        except TritonError:
            return None  # the index refused us (a wrong key): the state is unknown

    def _counter_increase(
        self, totals: tuple[float, float], history: _History
    ) -> tuple[float, float] | None:
        """(BACKEND failures, successes) since the last check, from their totals now; None the
        first time and after the counters went back (both are a baseline)."""
        failures, successes = totals
        before_failures, before_successes = history.failures, history.successes
        history.failures, history.successes = failures, successes
        if before_failures is None or before_successes is None:
            return None  # the first look is a baseline
        failed = failures - before_failures
        succeeded = successes - before_successes
        if failed < 0 or succeeded < 0:
            return None  # counters reset: the model was reloaded or unloaded since
        return failed, succeeded

    async def _probe(
        self, triton: AsyncTritonClient, pod: str, model: str
    ) -> tuple[bool, tuple[str, str] | None, bool]:
        """Inferences of zeros: (whether any was sent, a verdict if one of our stubs is broken,
        whether an answer blamed the broken stub of another model, one this one calls).

        Triton hands consecutive requests to the instances in turn (seen here with 2
        instances and one dead stub: fail, ok, fail, ok...), so instances + 1 probes in a row
        reach every instance, dead ones included.
        """
        config = await triton.model_config(model)
        inputs = _probe_inputs(config)
        if inputs is None:
            return False, None, False  # decoupled models cannot be asked over plain HTTP
        instances = sum(int(g.get("count", 1)) for g in config.get("instance_group") or [{}])
        blamed = False
        for _ in range(max(1, instances) + 1):
            try:
                await triton.infer(model, inputs, timeout_s=self.probe_timeout_s)
                continue
            except TritonUnreachable as unanswered:
                if not unanswered.timed_out:
                    raise  # the pod is gone, not the model
                timeout = (
                    PROBE_TIMEOUT,
                    f"{model} on {pod}: a probe inference got no answer in "
                    f"{self.probe_timeout_s:g} s",
                )
                return True, timeout, blamed
            except TritonError as refusal:
                error = refusal.answer or refusal.reason
            # A parent's error names its child's stub: only our own stubs are our business.
            if "Stub process '" in error and "is not healthy" in error:
                if f"Stub process '{model}_" in error:
                    return True, (STUB_UNHEALTHY, f"{model} on {pod}: {error}"), blamed
                blamed = True
        return True, None, blamed

    # ---- the cure ------------------------------------------------------------------------
    async def _heal(
        self, endpoint: Endpoint, model: str, reason: str, why: str, history: _History
    ) -> HealingResult:
        pod = endpoint.name
        now = self.clock()
        history.attempts = [t for t in history.attempts if now - t < self.window_s]
        attempts = len(history.attempts)
        if attempts >= self.max_attempts:
            message = (
                f"{why}; {attempts} reloads in the last {self.window_s:g} s did not cure it: "
                "a person must look (the Triton log of this pod says why)"
            )
            if not history.exhausted:  # said once, not at every tick
                logger.error("%s", message)
                history.exhausted = True
            return HealingResult(
                pod, model, EXHAUSTED, HEALING_EXHAUSTED, message, attempts, cause=reason
            )
        if attempts:
            wait_until = history.attempts[-1] + self.backoff_s(attempts)
            if now < wait_until:
                message = (
                    f"{why}; next reload in {math.ceil(wait_until - now)} s "
                    f"(attempt {attempts + 1} of {self.max_attempts})"
                )
                return HealingResult(
                    pod, model, WAITING, HEALING_BACKOFF, message, attempts, cause=reason
                )
        history.attempts.append(now)
        history.exhausted = False
        history.generation += 1
        history.failures = history.successes = None  # a reload resets the counters
        history.rising = 0
        started = time.monotonic()
        failure = await self._reload(endpoint, model, history.generation)
        reload_s = time.monotonic() - started
        attempts += 1
        if failure is None:
            message = (
                f"{why}; reloaded in {reload_s:.1f} s (attempt {attempts} of "
                f"{self.max_attempts} in {self.window_s:g} s)"
            )
            logger.warning("%s", message)
            return HealingResult(
                pod, model, RELOADED, HEALED, message, attempts, reload_s, cause=reason
            )
        message = f"{why}; reload failed: {failure} (attempt {attempts} of {self.max_attempts})"
        logger.error("%s", message)
        return HealingResult(
            pod, model, RELOAD_FAILED, HEALING_FAILED, message, attempts, reload_s, cause=reason
        )

    async def _reload(self, endpoint: Endpoint, model: str, generation: int) -> str | None:
        """Load the live config with the heal parameter bumped; None on success, else why."""

        async def send() -> None:
            # The config is read in the load's own slot: a load of the actuator that ended
            # just before (a new count) is reloaded as it is now, never undone.
            config: dict[str, Any] | None
            async with self._client(endpoint) as triton:
                try:
                    config = _bumped(await triton.model_config(model), generation)
                except TritonUnreachable:
                    raise
                except TritonError:
                    config = None  # not loaded: the repository's config (the actuator resizes it)
                await triton.load(model, config, timeout_s=self.load_timeout_s)

        try:
            late = await self.loads.run(endpoint.name, model, FRESH_INSTANCES, send)
        except TritonError as error:
            return self._scrub(error.reason)
        if late is not None and late.what != FRESH_INSTANCES:
            # `run` sent nothing: the actuator's load of the model holds the pod.
            return f"a load of {late.what} is still in flight on the pod; no reload was sent"
        if late is not None:
            return (
                f"the reload did not finish within its deadline of {late.deadline_s:g} s "
                "(the old instances keep serving meanwhile)"
            )
        async with self._client(endpoint) as triton:
            try:
                ready = await triton.is_model_ready(model)
            except TritonError:
                ready = False
        if not ready:
            return f"{model} is not ready after the reload"
        return None

    # ---- helpers ------------------------------------------------------------------------
    def backoff_s(self, attempts: int) -> float:
        """The wait after `attempts` reloads: initial x 2^(attempts-1), capped."""
        return min(self.backoff_max_s, self.backoff_initial_s * 2 ** max(0, attempts - 1))

    def _attempts_in_window(self, history: _History) -> int:
        now = self.clock()
        return sum(1 for t in history.attempts if now - t < self.window_s)

    def _client(self, endpoint: Endpoint) -> AsyncTritonClient:
        return AsyncTritonClient(
            endpoint, self._key, timeout_s=self.timeout_s, connections=self.connections
        )

    def _scrub(self, text: str) -> str:
        """Whatever a server or library says, the key never leaves in a message."""
        return text.replace(self._key, "***") if self._key else text


def _bumped(config: dict[str, Any], generation: int) -> dict[str, Any]:
    """The config with the heal parameter raised, so that Triton really reloads the model."""
    parameters = dict(config.get("parameters") or {})
    previous = parameters.get(HEAL_PARAMETER, {}).get("string_value", "0")
    bumped = max(generation, int(previous) + 1 if previous.isdigit() else generation)
    parameters[HEAL_PARAMETER] = {"string_value": str(bumped)}
    return {**config, "parameters": parameters}


def _probe_inputs(config: Mapping[str, Any]) -> list[httpclient.InferInput] | None:
    """An inference request of zeros shaped by the config; None where none can be sent."""
    if (config.get("model_transaction_policy") or {}).get("decoupled"):
        return None
    batched = int(config.get("max_batch_size") or 0) > 0
    inputs = []
    for spec in config.get("input", []):
        if spec.get("optional"):
            continue
        datatype = _PROBE_DATATYPES.get(spec.get("data_type", ""))
        if datatype is None:
            return None
        shape = [1 if int(d) < 0 else int(d) for d in spec.get("dims", [])]
        if batched:
            shape = [1, *shape]
        if math.prod(shape) > 1_000_000:
            return None  # a probe must stay small
        zeros = (
            np.full(shape, b"", dtype=np.object_)
            if datatype == "BYTES"
            else np.zeros(shape, dtype=triton_to_np_dtype(datatype))
        )
        tensor = httpclient.InferInput(spec["name"], shape, datatype)
        tensor.set_data_from_numpy(zeros)
        inputs.append(tensor)
    return inputs


def _request_counters(text: str, model: str) -> tuple[float, float]:
    """(BACKEND failures, successes) of `model` in Triton's /metrics text: their totals."""
    samples = parse_metrics(text, REQUEST_COUNTERS, label_matcher("model", model))
    return request_counters(samples, model)
