"""A pipeline sized to its latency objective: the fewest instances whose predicted latency meets it.

A root that carries `spec.targets.latency` (a quantile q and a bound B in milliseconds) is
sized on the layered queueing model of its pipeline (tritonscale.core.lqn): the network is
measured from the windows the planner keeps (`lqn.from_history`; a parent's calls taken as
made one after another where its execution reads so, `Stage.calls_in_turn`, else together),
and a split's latency at quantile q is the model's prediction under Poisson arrivals
(`lqn.open_loop`) at the rate the split must hold (`sizing_rate`). The search
(`LatencySearch.choose`) returns the fewest instances within the bounds and the budget whose
prediction meets B at every root with an objective, the larger predicted margin
`(B - predicted) / B` breaking ties; where none does, the caller serves the most it can (the
allocator's throughput split) and reports what the objective would take.

The rate a split must hold (`sizing_rate`). The split chosen now serves until the next
decision's change is live: one interval until the next tick, and the time its loads take
(`horizon_s`, measured: the end of the last load the driver reported, less the tick that
sent it; `verifier.SETTLE_S` until one is measured). Over that time:

- the rate may keep moving the way it moved: the least-squares slope of the root's arrival
  rate over the windows the history keeps that do not overlap (each at its middle), where it
  rises, carried from the latest window's middle to the horizon's end (a rate that falls is
  not counted on: a split sized for today's rate holds a lower one);
- the next window's rate strays from the latest by chance: the latest window is one draw
  of the rate, the next another, so their difference has sqrt(2) times the spread of one
  window's. That spread is the residuals' standard deviation around the slope (three
  windows or more), at least a Poisson stream's over one window, sqrt(rate / window_s) (the
  counts of a window of `window_s` seconds at `rate` spread by sqrt(rate x window_s)); the
  bound is `NOISE_SIGMAS` of them above (pipeline_model's: 2 standard deviations, a one-sided
  97.7 % bound for a normal spread).

So `rate = offered + max(0, slope) x (window_s / 2 + horizon_s) + NOISE_SIGMAS x sqrt(2) x
spread`, `offered` the root's offered rate over the latest window (its arrivals, plus the
growth of its queue where it is saturated: `Stage.offered_rps`).

The search. Every split of each total that fits the budget is predicted, from the lower
bounds' total upward; the first total with a split that meets gives the answer, the largest
margin among its splits. A total none of whose splits fits ends the search: the budget then
holds no more (fewer instances of any model never break a budget that more fit in).
Exhaustive within each total, because a split's latency does not always fall as a model
gains an instance (the model says so of a parent in front of a child that batches nothing: a
second parent instance sends the child more calls at once, and the child's queue grows), so
no model's count can be bounded alone. Its cost grows with how far the answer lies above the
lower bounds (the splits of a total of k models d above them: (d + k - 1)! / (d! (k - 1)!)),
10 to 40 ms a split on a 2-core machine (lqn's fixed point): the current counts'
neighbourhood at steady load, more on a start from the minimums under a high load.

Where no split within the budget meets, what the objective would take (`Choice.wanted`, a
figure for the status and the HPA's demand ratio, never applied) is walked up from the
budget's best split: one instance a step, to the model whose instance raises the margin the
most, until it meets (the models' highest counts do, or nothing is wanted). k predictions a
step rather than every split of every total up to the models' bounds: on a generated
pipeline of three models (budget 7) the most splits a tick predicts fell from 101 to 51 and
its longest search from 3.6 to 2.9 s of CPU (the higher counts' fixed points cost more);
not always the fewest, for the reason above.

Assumptions beside lqn's own (its docstring): the arrivals at a root are Poisson within a
window (a request's time is its own; open clients, not a closed loop: a root whose clients
wait on it is sized for throughput, as today); the quantile is the gamma distribution's with
the predicted mean and variance (lqn's p95 at another quantile); the loads of one tick run
one after another (Triton runs one load at a time), so the time until the last is live is
what the change takes.

Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tritonscale.core import lqn
from tritonscale.core.pipeline_model import (
    NOISE_SIGMAS,
    Batching,
    PipelineHistory,
    PipelineModel,
    windows_apart,
)
from tritonscale.core.spec import AutoscalerSpec, LatencyObjective, latency_objectives_off_root
from tritonscale.core.verifier import SETTLE_S

Counts = Mapping[str, int]

# The windows' spread of one rate and the next window's are independent draws: their
# difference spreads sqrt(2) times one window's.
_TWO_DRAWS = math.sqrt(2.0)


@dataclass(frozen=True)
class LatencyPrediction:
    """One root's objective against what the model predicts of the chosen split."""

    root: str
    quantile: float
    objective_ms: float
    predicted_ms: float | None  # at the split chosen, at `rate_rps`; None: it cannot serve it
    rate_rps: float  # the rate the split is sized for (`sizing_rate`)
    offered_rps: float  # the root's offered rate over the latest window
    met: bool

    @property
    def describe(self) -> str:
        """One clause with the numbers: the objective, the prediction, the rate."""
        goal = f"p{_percent(self.quantile)} <= {self.objective_ms:g} ms"
        if self.predicted_ms is None:
            return (
                f"{self.root}'s objective {goal}: the split cannot serve "
                f"{self.rate_rps:.1f} req/s ({self.offered_rps:.1f} offered, with headroom)"
            )
        return (
            f"{self.root}'s objective {goal}: predicted {self.predicted_ms:.1f} ms at "
            f"{self.rate_rps:.1f} req/s ({self.offered_rps:.1f} offered, with headroom)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "quantile": self.quantile,
            "objectiveMilliseconds": self.objective_ms,
            "predictedMilliseconds": self.predicted_ms,
            "rateRps": self.rate_rps,
            "offeredRps": self.offered_rps,
            "met": self.met,
        }


@dataclass(frozen=True)
class RootObjective:
    """One root's objective, its pipeline's network and the rate it is sized for."""

    root: str
    objective: LatencyObjective
    network: lqn.Network
    offered_rps: float
    rate_rps: float

    @property
    def bound_s(self) -> float:
        return self.objective.milliseconds / 1000.0

    def predicted_s(self, counts: Counts) -> float:
        """The objective's quantile at `counts` (its stations' counts taken from them)."""
        split = self.network.with_counts(
            {m: counts[m] for m in self.network.stations if m in counts}
        )
        try:
            prediction = lqn.open_loop(split, self.rate_rps)
        except (ArithmeticError, ValueError):
            # Windows the model cannot be solved on (a station measured at no time at all):
            # no prediction, so no split is taken to meet the objective on it.
            return math.inf
        return prediction.latency_quantile_s(self.objective.quantile)

    def prediction(self, counts: Counts) -> LatencyPrediction:
        predicted = self.predicted_s(counts)
        finite = math.isfinite(predicted)
        return LatencyPrediction(
            self.root,
            self.objective.quantile,
            self.objective.milliseconds,
            1000.0 * predicted if finite else None,
            self.rate_rps,
            self.offered_rps,
            finite and predicted <= self.bound_s,
        )


@dataclass(frozen=True)
class Choice:
    """What the search found: `counts` (None: no split within the budget meets every
    objective), and what the objectives would take were there room (`wanted`: the fewest
    that meet within the models' bounds alone; the highest counts where not even they do)."""

    counts: dict[str, int] | None
    wanted: dict[str, int]
    margin: float  # of `counts` (of `wanted` where counts is None): least (B - predicted) / B


@dataclass(frozen=True)
class LatencySearch:
    """The roots with an objective in one pod set, and the search over their splits."""

    roots: tuple[RootObjective, ...]
    _margins: dict[tuple[tuple[str, int], ...], float] = field(
        default_factory=dict, compare=False, hash=False
    )

    @property
    def models(self) -> frozenset[str]:
        """The models of the pipelines sized here."""
        return frozenset(m for root in self.roots for m in root.network.stations)

    def margin(self, counts: Counts) -> float:
        """The least `(B - predicted) / B` over the roots at `counts` (-inf where a root's
        arrivals exceed what the split serves); at or above 0, every objective is met."""
        key = tuple(sorted((m, counts[m]) for m in self.models))
        if key not in self._margins:
            self._margins[key] = min(
                (root.bound_s - root.predicted_s(counts)) / root.bound_s for root in self.roots
            )
        return self._margins[key]

    def predictions(self, counts: Counts) -> tuple[LatencyPrediction, ...]:
        return tuple(root.prediction(counts) for root in self.roots)

    def choose(self, lower: Counts, upper: Counts, fits: Callable[[Counts], bool]) -> Choice:
        """The fewest instances within [lower, upper] (per model of `models`) that fit and
        meet every objective, the larger margin among equals (see the module's docstring)."""
        lower = {m: lower[m] for m in sorted(self.models)}
        upper = {m: max(lower[m], upper[m]) for m in lower}
        if self.margin(upper) < 0:
            return Choice(None, dict(upper), self.margin(upper))
        best = dict(lower)  # the fitting split of the largest margin at the last total
        for total in range(sum(lower.values()), sum(upper.values()) + 1):
            fitting = [split for split in _splits(lower, upper, total) if fits(split)]
            if not fitting:
                break  # the budget holds no more
            level, best = _largest([(self.margin(split), split) for split in fitting])
            if level >= 0:
                return Choice(best, best, level)
        wanted = self._walk_up(best, upper)
        return Choice(None, wanted, self.margin(wanted))

    def _walk_up(self, counts: Counts, upper: Counts) -> dict[str, int]:
        """From `counts`, one instance a step to the model whose instance raises the margin
        the most (the first in name order among equals), until the margin is at least 0; the
        highest counts meet (`choose` checked), so the walk ends there at the latest."""
        walked = dict(counts)
        while self.margin(walked) < 0:
            steps = [{**walked, m: walked[m] + 1} for m in walked if walked[m] < upper[m]]
            _, walked = _largest([(self.margin(step), step) for step in steps])
        return walked


def _largest(found: Sequence[tuple[float, dict[str, int]]]) -> tuple[float, dict[str, int]]:
    """The largest margin; among equals, the first (the splits come in a fixed order)."""
    top = max(level for level, _ in found)
    return next((level, s) for level, s in found if level == top)


def _splits(lower: Counts, upper: Counts, total: int) -> Iterator[dict[str, int]]:
    """Every split within [lower, upper] whose counts add up to `total`, in a fixed order."""
    models = list(lower)

    def fill(index: int, left: int) -> Iterator[dict[str, int]]:
        if index == len(models):
            if left == 0:
                yield {}
            return
        model = models[index]
        rest_low = sum(lower[m] for m in models[index + 1 :])
        rest_high = sum(upper[m] for m in models[index + 1 :])
        for count in range(lower[model], upper[model] + 1):
            if rest_low <= left - count <= rest_high:
                for tail in fill(index + 1, left - count):
                    yield {model: count, **tail}

    yield from fill(0, total)


def sizing_rate(history: PipelineHistory, root: str, offered_rps: float, horizon_s: float) -> float:
    """The rate the split chosen now must hold until the next change is live (see the
    module's docstring): today's offered rate, the rise the windows show carried to the
    horizon, and `NOISE_SIGMAS` of the next window's spread against the latest."""
    windows = windows_apart([w for w in history.windows if root in w.readings])
    if not windows:
        return offered_rps
    window_s = windows[-1].window_s
    points = [(w.taken_at - w.window_s / 2, w.readings[root].arrival_rate) for w in windows]
    slope, residual = _line(points)
    poisson = math.sqrt(max(offered_rps, 0.0) / window_s) if window_s > 0 else 0.0
    spread = max(residual, poisson)
    rise = max(0.0, slope) * (window_s / 2 + horizon_s)
    return offered_rps + rise + NOISE_SIGMAS * _TWO_DRAWS * spread


def _line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares slope of (time, rate) and the residuals' standard deviation (0 with
    fewer than two points, and the spread 0 with fewer than three: a line fits two)."""
    if len(points) < 2:
        return 0.0, 0.0
    n = len(points)
    mean_t = math.fsum(t for t, _ in points) / n
    mean_r = math.fsum(r for _, r in points) / n
    stt = math.fsum((t - mean_t) ** 2 for t, _ in points)
    if stt <= 0:
        return 0.0, 0.0
    slope = math.fsum((t - mean_t) * (r - mean_r) for t, r in points) / stt
    if n < 3:
        return slope, 0.0
    squares = math.fsum((r - mean_r - slope * (t - mean_t)) ** 2 for t, r in points)
    return slope, math.sqrt(squares / (n - 2))


def horizon_s(specs: Mapping[str, AutoscalerSpec], load_s: Mapping[str, float]) -> float:
    """How long the split chosen now serves: one interval until the next tick, and the time
    the next tick's loads take until the last is live (measured, `load_s`; `SETTLE_S` where
    none is)."""
    interval = min(spec.interval_seconds for spec in specs.values())
    loads = [load_s[model] for model in specs if model in load_s]
    return interval + (max(loads) if loads else SETTLE_S)


def search_of(
    specs: Mapping[str, AutoscalerSpec],
    pipeline: PipelineModel,
    history: PipelineHistory,
    batching: Mapping[str, Batching] | None = None,
    load_s: Mapping[str, float] | None = None,
) -> tuple[LatencySearch | None, dict[str, str]]:
    """The search over the set's roots that carry an objective (None where none does), and
    per such root why it is left to today's sizing (a closed loop; too quiet to measure; a
    model of its pipeline not measured yet, or its batching not known)."""
    calls = {model: spec.calls for model, spec in specs.items()}
    off_root = latency_objectives_off_root(specs.values())
    horizon = horizon_s(specs, load_s or {})
    configs = {model: _config(b) for model, b in (batching or {}).items()}
    # A sync parent is told by its execution, as the pipeline model reads it.
    sequential = {model for model, stage in pipeline.stages.items() if stage.calls_in_turn}
    roots: list[RootObjective] = []
    left: dict[str, str] = {}
    for model, spec in sorted(specs.items()):
        objective = spec.targets.latency
        if objective is None or model in off_root:
            continue
        stage = pipeline.active.get(model)
        if stage is None:
            left[model] = f"{model} is not sized to its latency objective: too little traffic"
            continue
        if stage.closed_loop:
            left[model] = (
                f"{model} is not sized to its latency objective: its clients wait on it (a"
                " closed loop), so it is sized for throughput"
            )
            continue
        try:
            network = lqn.from_history(history, calls, model, configs, sequential)
        except ValueError as error:
            left[model] = f"{model} is not sized to its latency objective yet: {error}"
            continue
        unknown = sorted(m for m in network.stations if m not in configs)
        if unknown:
            # The model's batching decides what an instance serves: not guessed.
            left[model] = (
                f"{model} is not sized to its latency objective: the batching of"
                f" {', '.join(unknown)} is not known (no config was read)"
            )
            continue
        rate = sizing_rate(history, model, stage.offered_rps, horizon)
        roots.append(RootObjective(model, objective, network, stage.offered_rps, rate))
    return (LatencySearch(tuple(roots)) if roots else None), left


def _config(batching: Batching) -> dict[str, Any]:
    """A model's batching in the form of Triton's config, as lqn.BatchPolicy reads it."""
    config: dict[str, Any] = {"max_batch_size": batching.max_batch_size}
    if batching.dynamic:
        config["dynamic_batching"] = {
            "max_queue_delay_microseconds": round(batching.queue_delay_s * 1e6),
            "preferred_batch_size": list(batching.preferred_sizes),
        }
    return config


def _percent(quantile: float) -> str:
    return f"{100 * quantile:g}"
