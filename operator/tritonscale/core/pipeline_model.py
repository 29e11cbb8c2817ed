"""The pipeline model of a pod set: each model's load and service time, measured live.

From the metric snapshots of one pod set (the latest, and a short history the caller keeps in
`PipelineHistory` and passes back), per model of the set:

- arrival rate: requests finished per second, successes and failures, over the window;
- busy seconds per execution and per request. Triton adds a batch's whole compute time to
  each request in it, so compute seconds per request is the time of the batch a request ran
  in (per execution); dividing by the mean batch (requests per execution) gives the instance
  seconds one request costs. The gap between the two is what batching buys;
- utilization per instance: instance seconds per second over pods x instances;
- for a BLS parent (its spec's `calls`), the calls it makes to each child per request: the
  child's request rate over its callers' (one value shared by a child's callers), today's:
  calls go out per execution, so per request they fall as the parent's batches grow;
- demand propagated down the pipeline: a root's demand is what is offered to it (its arrival
  rate, and where it is saturated the growth of its queue, the pending gauge), a child's is
  its callers' demand times their calls per request;
- the hold per request: the instance seconds one request will cost at the allocator's counts.
  A BLS parent's busy time includes its wait for its children (a parent in front of a
  saturated child reads 99 % busy), and that wait shrinks when the children get instances.
  So its own work is its execution time less its wait (its calls per execution times each
  call's time in its child, queue and compute, summed for a parent that calls one after
  another; the longest call for one whose calls run together, an async parent: which one
  it is shows in its execution, `_own_and_hold_s`), and it holds an instance for its own work
  plus its calls answered without a queue, each in its child's hold (a child's own work and
  its calls, one level down: a chain's middle holds its own children's queue). A leaf holds
  an instance for its busy time per request. Both per
  execution (averaged over the windows) and per request (that over today's mean batch:
  batches grow with the load, so the capacity this gives is what an instance serves at least).
- the batch a stage reaches once it is the set's limit (`Stage.batch_at`): a child whose
  config has a dynamic batcher (`Batching`, from the config Triton serves) runs, when its
  callers wait on it, as many of their calls at once as they have out to it (their instances
  times their calls per execution, at the callers' counts asked about: a split that gives a
  caller instances makes its children's batches grow) spread over its instances, at most its
  max_batch_size in rows over the rows a request carries (Triton's inference count over its
  requests). Its capacity at a count is that batch over its hold per execution; where nothing
  says it batches more (no batcher, max_batch_size 0, a root, a config or rows unknown) it is
  today's;
- a closed loop (`Stage.closed_loop`): a root saturated with more requests waiting than
  running, its queue standing rather than growing. Its clients wait on the set and send more
  as soon as it serves more, so what it is offered is a floor, not its demand.

Each estimate carries its windows and spread (`Estimate`): service times are averaged over
the windows that do not overlap, at the counts the model (and its children) run now; the
arrival rate is the latest window's, its spread that of the same windows. A model with fewer
than `MIN_REQUESTS_PER_WINDOW` requests in the latest window is `quiet`: its estimates are
noise, and it keeps its count; one with none at all, and none queued, is `idle`.

Pure: no clock (the snapshot carries its time), no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from tritonscale.core import sizing
from tritonscale.core.signals import MetricSnapshot, ModelSignals
from tritonscale.core.spec import AutoscalerSpec

# Fewer requests than this in a window and a model's rates and times are noise: it holds.
MIN_REQUESTS_PER_WINDOW = 20.0
# How far back the history reaches, and how many windows it keeps at most.
HISTORY_S = 600.0
# A tick runs a varying few milliseconds after it is due (0 to 114 ms measured on a busy
# machine), and its window ends when it runs: the window one metrics window after a change
# may start a few milliseconds before it. It counts as after the change: the change itself
# lands up to seconds after its tick (a load), which every window after it already spans.
TICK_LATENESS_S = 0.5
MAX_WINDOWS = 16
# An estimate's relative noise: NOISE_SIGMAS standard deviations of its windows, at least
# NOISE_FLOOR; with one window its spread is unknown and UNKNOWN_NOISE stands for it (what a
# window's noise makes of a steady load: windows within +-11 % of their mean make ratios up
# to 1.25).
NOISE_SIGMAS = 2.0
NOISE_FLOOR = 0.03
UNKNOWN_NOISE = 0.25
# At or above this busy fraction per instance a model is saturated: what it serves is what it
# can, and its arrival rate understates what is offered to it.
SATURATED_UTILIZATION = 0.95


@dataclass(frozen=True)
class Batching:
    """How a model batches, from the config Triton serves (`max_batch_size`,
    `dynamic_batching`)."""

    max_batch_size: int  # rows in one batch; 0: the model does not batch
    dynamic: bool  # a dynamic batcher joins queued requests into one execution
    # The batcher's max_queue_delay_microseconds (in seconds) and preferred_batch_size (rows),
    # for the layered queueing model (tritonscale.core.lqn); the allocator does not use them.
    queue_delay_s: float = 0.0
    preferred_sizes: tuple[int, ...] = ()

    @classmethod
    def of_config(cls, config: Mapping[str, Any]) -> Batching | None:
        """The batching of a model config as Triton returns it (JSON); None when it cannot be
        told (a field of another type)."""
        size = config.get("max_batch_size", 0)
        if isinstance(size, str) and size.strip().isdigit():
            size = int(size)  # Triton's JSON gives some integers as strings
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            return None
        batcher = config.get("dynamic_batching")
        if not isinstance(batcher, Mapping):
            return cls(size, False)
        try:
            delay_s = int(batcher.get("max_queue_delay_microseconds", 0) or 0) / 1e6
            preferred = tuple(sorted(int(n) for n in batcher.get("preferred_batch_size", ()) or ()))
        except (TypeError, ValueError):
            delay_s, preferred = 0.0, ()  # told wrong: the batcher taken as joining at once
        return cls(size, True, delay_s, preferred)

    @property
    def batches(self) -> bool:
        """Whether queued requests are joined into one execution."""
        return self.dynamic and self.max_batch_size > 0


@dataclass(frozen=True)
class Reading:
    """One model's counters over one window (the fields of ModelSignals the model uses)."""

    request_rate: float
    failure_rate: float
    execution_rate: float
    compute_seconds_per_second: float
    queue_seconds_per_second: float
    pods: int
    pending_requests: float = 0.0  # the gauge at the window's end
    inference_rate: float | None = None  # rows (Triton's inferences) per second; None: unknown

    @classmethod
    def of(cls, signals: ModelSignals) -> Reading:
        return cls(
            signals.request_rate,
            signals.failure_rate,
            signals.execution_rate,
            signals.compute_seconds_per_second,
            signals.queue_seconds_per_second,
            signals.pods_reporting,
            signals.pending_requests,
            signals.inference_rate,
        )

    @property
    def rows_per_request(self) -> float | None:
        """Rows a successful request carries (None: unknown, or nothing served)."""
        if self.inference_rate is None or self.request_rate <= 0 or self.inference_rate <= 0:
            return None
        return max(1.0, self.inference_rate / self.request_rate)

    @property
    def arrival_rate(self) -> float:
        return self.request_rate + self.failure_rate

    @property
    def served_fraction(self) -> float:
        """Successes over all requests finished (1 when none finished)."""
        return self.request_rate / self.arrival_rate if self.arrival_rate > 0 else 1.0

    @property
    def execution_s(self) -> float:
        """Busy seconds per execution (the batch a request ran in), request-weighted."""
        return self.compute_seconds_per_second / self.request_rate

    @property
    def mean_batch(self) -> float:
        if self.execution_rate <= 0:
            return 1.0  # no executions reported: no batching correction (as core.sizing)
        return max(1.0, self.request_rate / self.execution_rate)

    @property
    def time_in_model_s(self) -> float:
        """What a caller waits per request: queue plus the execution it ran in."""
        return (self.queue_seconds_per_second + self.compute_seconds_per_second) / (
            self.request_rate
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "requestRate": self.request_rate,
            "failureRate": self.failure_rate,
            "executionRate": self.execution_rate,
            "computeSecondsPerSecond": self.compute_seconds_per_second,
            "queueSecondsPerSecond": self.queue_seconds_per_second,
            "pods": self.pods,
            "pendingRequests": self.pending_requests,
            **({} if self.inference_rate is None else {"inferenceRate": self.inference_rate}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Reading:
        return cls(
            float(d["requestRate"]),
            float(d["failureRate"]),
            float(d["executionRate"]),
            float(d["computeSecondsPerSecond"]),
            float(d["queueSecondsPerSecond"]),
            int(d["pods"]),
            float(d.get("pendingRequests", 0.0)),
            None if d.get("inferenceRate") is None else float(d["inferenceRate"]),
        )


@dataclass(frozen=True)
class Window:
    """One snapshot as the history keeps it: its window, the counts then, each model's reading."""

    taken_at: float
    window_s: float
    counts: Mapping[str, int] = field(hash=False)
    readings: Mapping[str, Reading] = field(hash=False)

    @property
    def starts_at(self) -> float:
        return self.taken_at - self.window_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "takenAt": self.taken_at,
            "windowS": self.window_s,
            "counts": dict(self.counts),
            "readings": {model: r.to_dict() for model, r in self.readings.items()},
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Window:
        return cls(
            float(d["takenAt"]),
            float(d["windowS"]),
            {str(model): int(count) for model, count in d["counts"].items()},
            {str(model): Reading.from_dict(r) for model, r in d["readings"].items()},
        )


@dataclass(frozen=True)
class PipelineHistory:
    """The recent windows of a pod set, oldest first; the caller stores it between ticks.

    `live_since`: per model, when its count went live where the driver knows it (the end of
    the load that set it). A load takes time (seconds for a Python backend on a busy node),
    and the old instances serve until it ends: a window that begins after the tick that
    decided the change but before the load ended mixes both counts.
    """

    windows: tuple[Window, ...] = ()
    live_since: Mapping[str, float] = field(default_factory=dict, hash=False)

    def observed(
        self,
        snapshot: MetricSnapshot,
        counts: Mapping[str, int],
        live_since: Mapping[str, float] | None = None,
    ) -> PipelineHistory:
        """Add the snapshot (unless the history holds it or a later one already) and prune;
        `live_since` adds to what the history knows of when counts went live."""
        if self.windows and snapshot.taken_at <= self.windows[-1].taken_at:
            return self
        since = {
            model: at
            for model, at in {**self.live_since, **(live_since or {})}.items()
            if model in counts and at > snapshot.taken_at - HISTORY_S
        }
        # A decoupled model sized by its streams is left out: Triton's timings of it measure
        # the hand-off, not the work (tritonscale.core.sizing), and it keeps its count.
        readings = {
            model: Reading.of(signals)
            for model, signals in snapshot.models.items()
            if model in counts
            and sizing.unusable_field(signals) is None
            and not sizing.sized_by_streams(signals)
        }
        window = Window(snapshot.taken_at, snapshot.window_s, dict(counts), readings)
        kept = [w for w in self.windows if w.taken_at > snapshot.taken_at - HISTORY_S]
        if len(kept) >= 2 and _overlaps(kept[-1], kept[-2]):
            if kept[-2].counts == kept[-1].counts == window.counts:
                # Windows that overlap share their requests and add nothing to the spread: keep
                # the chain of those that do not, and the newest (where the counts changed,
                # every window, for the time of the change).
                kept.pop()
        return PipelineHistory((*kept, window)[-MAX_WINDOWS:], since)

    def changed_at(self, models: Sequence[str], counts: Mapping[str, int]) -> float:
        """When today's `counts` of `models` went live, as far as the history knows: the end
        of the newest window that ran other counts, or the end of a later load (-inf: they
        ran these counts in every window)."""
        return max(
            [w.taken_at for w in self.windows if not _at_counts(w, models, counts)]
            + [self.live_since[model] for model in models if model in self.live_since],
            default=-math.inf,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "windows": [window.to_dict() for window in self.windows],
            "liveSince": dict(self.live_since),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> PipelineHistory:
        """Read `to_dict()`'s form back; None or {} is an empty history.

        Raises ValueError on a malformed dict (a fresh history is then safe: it only makes the
        first estimates noisier).
        """
        if not d:
            return cls()
        try:
            return cls(
                tuple(Window.from_dict(w) for w in d.get("windows", [])),
                {str(model): float(at) for model, at in d.get("liveSince", {}).items()},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise ValueError(f"malformed pipeline history: {error!r}") from None


@dataclass(frozen=True)
class Estimate:
    """A value measured over `windows` windows that together span `span_s` seconds."""

    value: float
    spread: float  # standard deviation over the windows; 0 with one window
    windows: int
    span_s: float

    @property
    def noise(self) -> float:
        """Relative noise: how far a new reading may stray from `value` by chance alone."""
        if self.windows < 2 or self.value <= 0:
            return UNKNOWN_NOISE
        return max(NOISE_FLOOR, NOISE_SIGMAS * self.spread / self.value)


@dataclass(frozen=True)
class Stage:
    """One model of the set as the latest windows show it."""

    model: str
    instances: int
    pods: int
    arrival_rps: Estimate  # requests finished per second, successes and failures
    # What is offered: the arrival rate, plus the growth of the queue where the stage is
    # saturated (what it finishes is then what it can, not what it is asked).
    offered_rps: float
    served_fraction: Estimate  # successes over all requests finished, today's
    demand_rps: float  # what the roots are offered, carried down by the calls per request
    utilization: float  # busy fraction per instance, latest window (batching undone)
    execution_s: Estimate  # busy seconds per execution
    busy_per_request_s: Estimate  # instance seconds per request (per execution / today's batch)
    mean_batch: float
    time_in_model_s: float  # queue + compute per request: what a caller waits, latest window
    own_execution_s: Estimate  # per execution, net of the wait for its children
    # Instance seconds per execution and per request at the allocator's counts: its own work
    # plus its calls answered without a queue below it.
    hold_per_execution_s: Estimate
    hold_per_request_s: Estimate
    calls: Mapping[str, Estimate] = field(hash=False)  # child -> calls per request, today's
    # The service times come from windows at today's counts (False: from earlier ones, until
    # a window wholly after the last change exists).
    measured_at_counts: bool
    quiet: bool  # too few requests to measure: it keeps its count
    idle: bool  # quiet with nothing finished and nothing queued: it needs no more than its minimum
    saturated: bool  # busy at or above SATURATED_UTILIZATION
    # Saturated with its queue growing, or a root saturated with more requests waiting than
    # running (a closed loop's standing queue): more is offered, or would be sent, than it
    # serves; a limit measured.
    overloaded: bool
    # Its queue (the pending gauge) grew since the window before by more than NOISE_FLOOR of
    # its arrival rate, saturated or not: more is sent to it than it serves.
    queue_grows: bool = False
    # The most requests one batch holds: a dynamic batcher's max_batch_size over the rows a
    # request carries; None where it does not batch, or its config or rows are unknown.
    max_batch: float | None = None
    # Per caller: its instances today and the calls one of them has out to it at once (its
    # calls per execution). None for a root, or where a caller's calls are unknown.
    callers_in_flight: Mapping[str, tuple[int, float]] | None = field(default=None, hash=False)
    # A root saturated with a queue that stands and does not grow: its clients wait on the set
    # (a closed loop) and send more as soon as it serves more. What it is offered is a floor,
    # and no count holds it under its target.
    closed_loop: bool = False
    # A BLS parent whose calls read as made one after another (a sync parent) in the newest
    # window that timed it: its execution holds their times summed (`_own_and_hold_s`).
    calls_in_turn: bool = False

    @property
    def batch_full(self) -> bool:
        """Whether today's batches are (within the noise) the largest its batcher forms: its
        capacity per instance is then no lower bound, batching will not raise it."""
        return self.max_batch is not None and self.mean_batch >= self.max_batch * (1 - NOISE_FLOOR)

    @property
    def capacity_per_instance_rps(self) -> float:
        """Requests per second one instance serves when it is busy all the time, at today's
        batch."""
        return 1.0 / self.hold_per_request_s.value

    def calls_in_flight(self, callers: Mapping[str, int] | None = None) -> float | None:
        """Per pod, the most calls its callers' instances have out to it at once (their
        instances times their calls per execution), the callers at their counts in
        `callers` (today's where left out); None for a root, or where a caller's calls are
        unknown."""
        if self.callers_in_flight is None:
            return None
        callers = callers or {}
        return sum(
            callers.get(caller, instances) * per_instance
            for caller, (instances, per_instance) in self.callers_in_flight.items()
        )

    def batch_at(self, count: int, callers: Mapping[str, int] | None = None) -> float:
        """The batch the stage runs at `count` instances once its callers (at their counts
        in `callers`, today's where left out) wait on it: the calls they have out to it
        spread over its instances, at most `max_batch`, at least today's. Today's where it
        is saturated (busy all the time, it runs the batches of its limit, measured) and
        below today's count (an instance is not taken from a stage on batches it would run
        only once it is the set's limit)."""
        in_flight = self.calls_in_flight(callers)
        if (
            self.max_batch is None
            or in_flight is None
            or self.saturated
            or count < max(1, self.instances)
        ):
            return self.mean_batch
        return max(self.mean_batch, min(self.max_batch, in_flight / count))

    def capacity_rps(self, count: int, callers: Mapping[str, int] | None = None) -> float:
        """Requests per second the set's pods serve with `count` instances each, busy all the
        time, at the batch they would reach (`batch_at`, the callers at their counts in
        `callers`): a batch takes the instance time measured per execution, so a child held
        to small batches by its callers serves more once they send it more, up to all the
        calls they can have out to it. Counts are per pod, and every pod runs them."""
        if count <= 0:
            return 0.0
        instances = count * max(1, self.pods)
        batch = self.batch_at(count, callers)
        if batch <= self.mean_batch:
            return instances * self.capacity_per_instance_rps
        return instances * batch / self.hold_per_execution_s.value


@dataclass(frozen=True)
class PipelineModel:
    """The pod set's stages, and the models that could not be measured (model -> why)."""

    taken_at: float
    stages: Mapping[str, Stage] = field(hash=False)
    unmeasured: Mapping[str, str] = field(hash=False)
    roots: tuple[str, ...] = ()  # measured models no other measured model of the set calls

    @property
    def active(self) -> dict[str, Stage]:
        """The stages with enough traffic to size."""
        return {model: stage for model, stage in self.stages.items() if not stage.quiet}


def measure(
    specs: Mapping[str, AutoscalerSpec],
    counts: Mapping[str, int],
    history: PipelineHistory,
    batching: Mapping[str, Batching] | None = None,
) -> PipelineModel:
    """The pipeline model from `history` (its last window is the latest snapshot).

    `specs` is keyed by model; `counts` holds each model's live instance count per pod;
    `batching` each model's batching from its live config (a model left out: unknown, its
    capacity is taken at today's batch).
    """
    if not history.windows:
        return PipelineModel(0.0, {}, {model: "no metrics yet" for model in specs})
    latest = history.windows[-1]
    unmeasured: dict[str, str] = {}
    readings: dict[str, Reading] = {}
    for model in specs:
        reading = latest.readings.get(model)
        if reading is None:
            unmeasured[model] = f"the metrics hold nothing usable for {model}"
        elif reading.request_rate > 0 and reading.compute_seconds_per_second <= 0:
            # A decoupled model whose execute returns at once: Triton's timings miss its work.
            unmeasured[model] = f"{model} reports requests but no busy time"
        else:
            readings[model] = reading
    callers = _callers(specs, readings)
    stages = {
        model: _stage(model, counts, history, callers) for model in readings if model in counts
    }
    demand = _demand(stages, callers)
    stages = {model: _with_demand(stage, demand[model]) for model, stage in stages.items()}
    batching = batching or {}
    stages = {
        model: _with_batching(stage, batching.get(model), readings[model], stages, callers)
        for model, stage in stages.items()
    }
    roots = tuple(model for model in stages if not callers.get(model))
    return PipelineModel(latest.taken_at, stages, unmeasured, roots)


def _callers(
    specs: Mapping[str, AutoscalerSpec], readings: Mapping[str, Reading]
) -> dict[str, tuple[str, ...]]:
    """Each measured model's measured callers in the set."""
    return {
        model: tuple(
            parent for parent, spec in specs.items() if model in spec.calls and parent in readings
        )
        for model in readings
    }


def _stage(
    model: str,
    counts: Mapping[str, int],
    history: PipelineHistory,
    callers: Mapping[str, tuple[str, ...]],
) -> Stage:
    latest = history.windows[-1]
    reading = latest.readings[model]
    instances = counts[model]
    children = _children(model, callers)
    serving, at_counts = _service_windows(history, model, (model, *children), counts)
    apart = windows_apart(serving)

    # Per execution, the windows agree at one count; per request, the time depends on the
    # batch, and the batch on the load: today's batch divides them.
    batch = reading.mean_batch
    execution = _estimate([(w, w.readings[model].execution_s) for w in apart])
    held = [(w, _own_and_hold_s(w, model, callers)) for w in apart]
    own = _estimate([(w, h.own_s) for w, h in held])
    hold_per_execution = _estimate([(w, h.hold_s) for w, h in held])
    arrivals = windows_apart([w for w in history.windows if model in w.readings])
    arrival = _now(
        _estimate([(w, w.readings[model].arrival_rate) for w in arrivals]), reading.arrival_rate
    )
    calls = {child: _calls(arrivals, latest, child, callers[child]) for child in children}
    busy_now = 0.0
    if reading.request_rate > 0:
        busy_now = reading.execution_s / reading.mean_batch * reading.request_rate
    utilization = busy_now / (reading.pods * instances) if reading.pods > 0 else 0.0
    saturated = utilization >= SATURATED_UTILIZATION
    queue_growth = _backlog_growth(history, model)
    backlog_growth = queue_growth if saturated else 0.0
    offered = reading.arrival_rate + backlog_growth
    queue_grows = queue_growth > NOISE_FLOOR * reading.arrival_rate
    # A root that queues more requests than it runs: the clients wait on the set, and a
    # closed loop of them sends more as soon as the set serves more (its queue stands, it
    # does not grow). A child's queue says only that it is today's bottleneck. In the first
    # window no gauge reading before it tells whether the queue grew (queue_grows is False):
    # a closed loop that started within the window fills its queue from empty just as an
    # open load above what the set serves does, and either is offered at least what it
    # serves, so the first window reads as a floor; the window after tells them apart. A
    # growth taken as none would size an open overload to what it serves, fewer instances
    # than the same root with a shorter queue gets as a closed loop.
    clients_wait = saturated and not callers.get(model) and _queue_stands(reading)
    closed_loop = clients_wait and not queue_grows
    return Stage(
        model=model,
        instances=instances,
        pods=reading.pods,
        arrival_rps=arrival,
        offered_rps=offered,
        served_fraction=_now(
            _estimate([(w, w.readings[model].served_fraction) for w in arrivals]),
            reading.served_fraction,
        ),
        demand_rps=offered,
        utilization=utilization,
        execution_s=execution,
        busy_per_request_s=_per_request(execution, batch),
        mean_batch=batch,
        time_in_model_s=reading.time_in_model_s if reading.request_rate > 0 else 0.0,
        own_execution_s=own,
        hold_per_execution_s=hold_per_execution,
        hold_per_request_s=_per_request(hold_per_execution, batch),
        calls=calls,
        measured_at_counts=at_counts,
        quiet=(
            reading.request_rate * latest.window_s < MIN_REQUESTS_PER_WINDOW
            or hold_per_execution.value <= 0
        ),
        saturated=saturated,
        overloaded=backlog_growth > 0 or clients_wait,
        closed_loop=closed_loop,
        idle=reading.arrival_rate <= 0 and reading.pending_requests <= 0,
        queue_grows=queue_grows,
        calls_in_turn=bool(held) and held[0][1].calls_in_turn,
    )


def _overlaps(later: Window, earlier: Window) -> bool:
    return later.starts_at < earlier.taken_at


def _service_windows(
    history: PipelineHistory, model: str, models: Sequence[str], counts: Mapping[str, int]
) -> tuple[list[Window], bool]:
    """The windows that time `model` at today's counts of `models` (it and its children), and
    whether they are at today's counts.

    At today's counts: the windows wholly after the last one that ran other counts (a window
    that saw the change may have started before it). Until one exists, windows that ended
    before the change stand for them (those at today's counts first, from before a step that
    was undone): the hold per request does not depend on the counts where the model's
    assumption holds, and the verifier tests it.
    """
    changed_at = history.changed_at(models, counts)
    serving = [
        w
        for w in history.windows
        if _at_counts(w, models, counts) and starts_after(w, changed_at) and _served(w, model)
    ]
    if serving:
        return serving, True
    before = [w for w in history.windows if w.taken_at <= changed_at and _served(w, model)]
    return [w for w in before if _at_counts(w, models, counts)] or before, False


def _calls(
    windows: Sequence[Window], latest: Window, child: str, parents: Sequence[str]
) -> Estimate:
    """Calls per request to `child`. Calls go out per execution: per request they fall as
    the parents' batches grow with the load, so today's window gives the value, the others
    its spread. A window counts where every parent is measured and one of them served: a
    parent that served nothing called nothing (a shared child whose other caller went idle
    is measured today, not by the windows from before the mix moved)."""
    known = [
        (w, ratio)
        for w in windows
        if _served(w, child)
        and all(parent in w.readings for parent in parents)
        and any(_served(w, parent) for parent in parents)
        for ratio in [_calls_per_request(w, child, parents)]
        if ratio is not None
    ]
    today = next((ratio for w, ratio in known if w is latest), None)
    return _now(_estimate(known), today)


def _served(window: Window, model: str) -> bool:
    reading = window.readings.get(model)
    return reading is not None and reading.request_rate > 0


def _at_counts(window: Window, models: Sequence[str], counts: Mapping[str, int]) -> bool:
    return all(window.counts.get(model) == counts.get(model) for model in models)


def windows_apart(windows: Sequence[Window]) -> list[Window]:
    """The newest window, then each older one that ends before the last one kept begins:
    overlapping windows share their requests, and their spread would understate the noise."""
    kept: list[Window] = []
    for window in reversed(windows):
        if not kept or not _overlaps(kept[-1], window):
            kept.append(window)
    return kept[::-1]


def _estimate(values: Sequence[tuple[Window, float]]) -> Estimate:
    if not values:
        return Estimate(0.0, 0.0, 0, 0.0)
    numbers = [value for _, value in values]
    mean = math.fsum(numbers) / len(numbers)
    spread = 0.0
    if len(numbers) > 1:
        # In floats: statistics.stdev works in exact fractions, a hundred times slower.
        spread = math.sqrt(math.fsum((x - mean) ** 2 for x in numbers) / (len(numbers) - 1))
    span = values[-1][0].taken_at - min(w.starts_at for w, _ in values)
    return Estimate(mean, spread, len(numbers), span)


def _backlog_growth(history: PipelineHistory, model: str) -> float:
    """Requests per second by which the model's queue grew since the window before (0 when
    it shrank, or nothing is known)."""
    windows = [w for w in history.windows if model in w.readings]
    if len(windows) < 2 or windows[-1].taken_at <= windows[-2].taken_at:
        return 0.0
    grown = (
        windows[-1].readings[model].pending_requests - windows[-2].readings[model].pending_requests
    )
    return max(0.0, grown / (windows[-1].taken_at - windows[-2].taken_at))


def _queue_stands(reading: Reading) -> bool:
    """More requests wait for the model than run in it: a queue that stands (a closed loop of
    clients keeps one in front of its bottleneck without growing it)."""
    return reading.queue_seconds_per_second > reading.compute_seconds_per_second > 0


def _now(estimate: Estimate, value: float | None) -> Estimate:
    """The estimate with today's value (where there is one) and the windows' spread."""
    if value is None:
        return estimate
    return replace(estimate, value=value, windows=max(estimate.windows, 1))


def _per_request(per_execution: Estimate, batch: float) -> Estimate:
    return replace(
        per_execution, value=per_execution.value / batch, spread=per_execution.spread / batch
    )


def _children(model: str, callers: Mapping[str, tuple[str, ...]]) -> tuple[str, ...]:
    return tuple(child for child, parents in callers.items() if model in parents)


class _Held(NamedTuple):
    """An execution's own work and its hold with no queue below it (seconds), and whether its
    calls read as made one after another."""

    own_s: float
    hold_s: float
    calls_in_turn: bool


def _own_and_hold_s(
    window: Window,
    model: str,
    callers: Mapping[str, tuple[str, ...]],
    below: frozenset[str] = frozenset(),
) -> _Held:
    """An execution's own work in `window` (its execution less its wait for its calls, at
    least 0) and what it holds with nothing queued below it: its own work and its calls
    answered at once, each in its child's own hold (this, one level down: a child's
    execution holds its own children's queue).

    Calls per execution: the child's arrivals over its callers' executions. The calls of an
    async parent go out together: it waits for the longest (a call's time in the child, queue
    and execution). A sync parent waits for each in turn: its calls' times summed. Which one a
    parent is shows in its execution: a sync one takes at least the sum (its own work besides),
    an async one less where it calls more than once. Within NOISE_FLOOR of the sum it reads
    as sync; an async parent whose own work exceeds its calls' sum less the longest reads so
    too, and then takes out every call's queue where the longest's was the wait: the error is
    the other calls' queues, none where the children have room.
    """
    reading = window.readings[model]
    calls = []
    for child in _children(model, callers):
        if child in below or not _served(window, child):
            continue
        executions = sum(
            window.readings[p].execution_rate for p in callers[child] if p in window.readings
        )
        if executions <= 0:
            continue
        per_execution = window.readings[child].arrival_rate / executions
        held = _own_and_hold_s(window, child, callers, below | {model}).hold_s
        calls.append((per_execution, window.readings[child].time_in_model_s, held))
    if not calls:
        return _Held(reading.execution_s, reading.execution_s, False)
    summed = math.fsum(n * waited for n, waited, _ in calls)
    in_turn = reading.execution_s >= summed * (1 - NOISE_FLOOR)
    if in_turn:
        waited, answered = summed, math.fsum(n * held for n, _, held in calls)
    else:
        waited = max(waited for _, waited, _ in calls)
        answered = max(held for _, _, held in calls)
    own = max(0.0, reading.execution_s - waited)
    return _Held(own, own + answered, in_turn)


def starts_after(window: Window, changed_at: float) -> bool:
    """Whether `window` lies wholly after a change of counts at `changed_at` (a tick's time),
    within the lateness of ticks (TICK_LATENESS_S)."""
    return window.starts_at >= changed_at - TICK_LATENESS_S


def _calls_per_request(window: Window, child: str, parents: Sequence[str]) -> float | None:
    """None where the parents took less than one request in the window: no measure (and a
    ratio over a rate of almost nothing, 1e-300 req/s, would overflow the estimate)."""
    called = sum(window.readings[parent].arrival_rate for parent in parents)
    if called * window.window_s < 1:
        return None
    return window.readings[child].arrival_rate / called


def _demand(
    stages: Mapping[str, Stage], callers: Mapping[str, tuple[str, ...]]
) -> dict[str, float]:
    """Roots' arrival rates, carried down by the calls per request. A model whose callers are
    not all measured with calls to it, or that sits on a cycle, keeps its own arrival rate."""
    demand: dict[str, float] = {}

    def of(model: str, visiting: frozenset[str]) -> float:
        if model in demand:
            return demand[model]
        own = stages[model].offered_rps
        parents = callers.get(model, ())
        calls = [stages[p].calls.get(model) if p in stages else None for p in parents]
        if (
            not parents
            or visiting.intersection(parents)
            or any(c is None or c.windows == 0 for c in calls)
        ):
            value = own
        else:
            value = sum(
                of(parent, visiting | {model}) * call.value
                for parent, call in zip(parents, calls, strict=True)
                if call is not None
            )
        demand[model] = value
        return value

    for model in stages:
        of(model, frozenset({model}))
    return demand


def _with_demand(stage: Stage, demand: float) -> Stage:
    return replace(stage, demand_rps=demand)


def _with_batching(
    stage: Stage,
    batching: Batching | None,
    reading: Reading,
    stages: Mapping[str, Stage],
    callers: Mapping[str, tuple[str, ...]],
) -> Stage:
    """The stage with the most requests a batch of it holds, and the calls its callers can
    have out to it: where it has a dynamic batcher, a caller (each measured, its calls to it
    known) and a known number of rows per request."""
    rows = reading.rows_per_request
    parents = callers.get(stage.model, ())
    if batching is None or not batching.batches or rows is None:
        return stage
    most = max(1.0, math.floor(batching.max_batch_size / rows + 1e-9))
    if not parents:
        return replace(stage, max_batch=most)  # its clients' requests in flight are not known
    in_flight = {}
    for parent in parents:
        caller = stages.get(parent)
        calls = caller.calls.get(stage.model) if caller is not None else None
        if caller is None or calls is None or calls.windows == 0:
            return stage
        # Calls go out per execution: per request they are today's calls over today's batch.
        in_flight[parent] = (caller.instances, calls.value * caller.mean_batch)
    return replace(stage, max_batch=most, callers_in_flight=in_flight)
