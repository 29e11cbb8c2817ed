"""Did a step deliver what the allocator predicted? If not, revert it and correct the model.

The allocator assumes that each instance serves as much as the ones before it: a stage's
capacity is its count times what one instance serves. Where every instance shares one
resource (a GPU, a lock, the CPU cores) that is false: new instances wait, busy in Triton's
eyes, and serve nothing more. So after a step up (`start`), the first snapshot at which the
models it stepped are measured at their new counts (a window wholly after the change) is
compared with the prediction (`judge`), by measures that a change of the offered load between
the windows does not pass off as a gain or a loss (raw throughput would):

- per model stepped up: the instance seconds it holds per execution and per request (its
  own work and its calls answered without a queue, `Stage.hold_per_execution_s`: a parent's
  wait on every queue below it taken out, a sync parent's several and a chain's). The
  step fell short when both grew by more than the estimate's noise (`Estimate.noise`: two standard deviations of its
  windows; 25 % when one window was all there was), and by at least `MIN_SHORTFALL`, so far
  that the capacity the step bought is under `USEFUL_SHARE` of its prediction. Both,
  because batching moves them apart: batches shrink after a step and grow with the load;
- the set's served fraction at its roots (successes over requests finished), where the
  offered load moved by at most `OFFERED_CHANGE` (failures grow with the load too): the step
  fell short when it dropped by more than its windows' noise (at least `SERVED_FRACTION_NOISE`).

A step that fell short is reverted: the models it stepped up go back to their counts before
it, at once (a verdict, not a reading of the load), and the model is corrected: each of them
is held at most at that count (`Correction`, which the allocator takes as a ceiling) for
`CORRECTION_TTL_S`, after which an increase is tried again.

Pure: the caller passes the clock and keeps `VerifierState`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tritonscale.core.pipeline_model import NOISE_SIGMAS, PipelineModel, Stage
from tritonscale.core.signals import MetricSnapshot

STEP_FELL_SHORT = "StepFellShort"

SETTLE_S = 2.0  # a load takes up to about 1.5 s to apply; the window starts after it
CORRECTION_TTL_S = 600.0
# A step whose models are still not measured at their new counts this long after it is let go.
MAX_WAIT_S = 600.0
# The least shortfall that counts: a step moves the batches and the children's timings by a
# few percent (seen in the simulator: a parent's 22.0 -> 22.7 ms per execution as its child
# began to batch), while one more instance waiting on a shared resource adds at least 1/n
# (12 % at 8 instances).
MIN_SHORTFALL = 0.1
# The least the served fraction may lose by chance alone (a failure here and there; more where
# its windows spread more), and how far the offered load may move for the served fractions
# before and after to be compared.
SERVED_FRACTION_NOISE = 0.02
OFFERED_CHANGE = 0.1
# A step that bought at least this share of the capacity it was predicted to (2 -> 3
# instances: +50 % predicted, +12.5 % bought) stands, however much longer each instance holds:
# measured on two CPU cores, pipeline_async 2 -> 3 held 22 % longer per execution and still
# served 20 % more, and 3 was the best count in the sweep.
USEFUL_SHARE = 0.25


@dataclass(frozen=True)
class Expectation:
    """What one model stepped up was predicted to keep: the instance seconds it holds per
    execution and per request (its own work and its calls answered without a queue below it),
    each with its relative noise."""

    model: str
    before: int
    after: int
    hold_per_execution_s: float
    execution_noise: float
    hold_per_request_s: float
    request_noise: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "before": self.before,
            "after": self.after,
            "holdPerExecutionS": self.hold_per_execution_s,
            "executionNoise": self.execution_noise,
            "holdPerRequestS": self.hold_per_request_s,
            "requestNoise": self.request_noise,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Expectation:
        return cls(
            str(d["model"]),
            int(d["before"]),
            int(d["after"]),
            float(d["holdPerExecutionS"]),
            float(d["executionNoise"]),
            float(d["holdPerRequestS"]),
            float(d["requestNoise"]),
        )

    @classmethod
    def of(cls, stage: Stage, before: int, after: int) -> Expectation:
        execution, request = stage.hold_per_execution_s, stage.hold_per_request_s
        return cls(
            stage.model,
            before,
            after,
            execution.value,
            max(MIN_SHORTFALL, execution.noise),
            request.value,
            max(MIN_SHORTFALL, request.noise),
        )

    def shortfall(self, stage: Stage, now_instances: int) -> tuple[bool, str]:
        """Whether the stage now holds its instances longer than predicted, per execution
        and per request alike, by more than the noise; and the numbers in words.

        Both, because batching moves them apart: after a step batches shrink (more time per
        request, not per execution); under more load they grow (the other way round).
        Instances that wait on a shared resource hold longer by both. And only where the
        capacity the step bought (its instances over the longer hold) is under USEFUL_SHARE of
        what it was predicted to buy.
        """
        execution = stage.hold_per_execution_s.value
        request = stage.hold_per_request_s.value
        longer = round(execution, 12) > round(
            self.hold_per_execution_s * (1 + self.execution_noise), 12
        ) and round(request, 12) > round(self.hold_per_request_s * (1 + self.request_noise), 12)
        # Longer holds are a shortfall only where they ate most of the step: instances that
        # share a resource with others (CPU cores) each serve a little less, and together
        # still more; instances that only wait serve nothing more at all.
        grown = max(
            execution / self.hold_per_execution_s if self.hold_per_execution_s > 0 else 1.0,
            request / self.hold_per_request_s if self.hold_per_request_s > 0 else 1.0,
        )
        predicted = now_instances / self.before - 1
        bought = now_instances / self.before / grown - 1
        longer = longer and bought < USEFUL_SHARE * predicted
        said = (
            f"{self.model} {self.before} -> {now_instances}: instance time per execution "
            f"{1000 * self.hold_per_execution_s:.1f} -> {1000 * execution:.1f} ms (noise "
            f"{100 * self.execution_noise:.0f} %), per request {1000 * self.hold_per_request_s:.1f}"
            f" -> {1000 * request:.1f} ms (noise {100 * self.request_noise:.0f} %)"
        )
        return longer, said


@dataclass(frozen=True)
class StepCheck:
    """A step waiting for its verdict."""

    since: float  # unix seconds of the tick that decided the first step
    expectations: tuple[Expectation, ...]
    offered_rps: float  # requests finished per second at the set's roots before the first step
    served_fraction: float  # successes among them
    served_noise: float  # how far the served fraction strays by chance (absolute)
    last_step_at: float  # the tick of the latest step judged with it

    def due(self, snapshot: MetricSnapshot) -> bool:
        return snapshot.taken_at - snapshot.window_s >= self.last_step_at + SETTLE_S

    def to_dict(self) -> dict[str, Any]:
        return {
            "since": self.since,
            "expectations": [e.to_dict() for e in self.expectations],
            "offeredRps": self.offered_rps,
            "servedFraction": self.served_fraction,
            "servedNoise": self.served_noise,
            "lastStepAt": self.last_step_at,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StepCheck:
        return cls(
            float(d["since"]),
            tuple(Expectation.from_dict(e) for e in d["expectations"]),
            float(d["offeredRps"]),
            float(d["servedFraction"]),
            float(d["servedNoise"]),
            float(d["lastStepAt"]),
        )


@dataclass(frozen=True)
class Correction:
    """More than `useful_instances` of `model` did not help, as measured at `since`."""

    model: str
    useful_instances: int
    since: float

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "usefulInstances": self.useful_instances, "since": self.since}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Correction:
        return cls(str(d["model"]), int(d["usefulInstances"]), float(d["since"]))


@dataclass(frozen=True)
class VerifierState:
    check: StepCheck | None = None
    corrections: tuple[Correction, ...] = ()

    def ceilings(self, now: float) -> dict[str, int]:
        """The corrections in force: model -> the most instances that help it."""
        return {
            c.model: c.useful_instances
            for c in self.corrections
            if now - c.since < CORRECTION_TTL_S
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.check.to_dict() if self.check else None,
            "corrections": [c.to_dict() for c in self.corrections],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> VerifierState:
        if not d:
            return cls()
        check = d.get("check")
        return cls(
            StepCheck.from_dict(check) if check else None,
            tuple(Correction.from_dict(c) for c in d.get("corrections", [])),
        )


@dataclass(frozen=True)
class Verdict:
    """`reverts`: model -> (count, message) for a step that fell short; empty otherwise."""

    state: VerifierState
    reverts: Mapping[str, tuple[int, str]] = field(default_factory=dict)
    message: str = ""  # what was judged, with the numbers ("" when nothing was)


def start(
    state: VerifierState,
    pipeline: PipelineModel,
    current: Mapping[str, int],
    desired: Mapping[str, int],
    now: float,
) -> VerifierState:
    """Keep what a step up predicts. A step made while another waits for its verdict is judged
    with it, against the same baseline, once a window lies wholly after the later step."""
    check = state.check
    known = {e.model: e for e in check.expectations} if check is not None else {}
    expectations = dict(known)
    for model, count in desired.items():
        stage = pipeline.stages.get(model)
        if count <= current[model]:
            continue
        if model in known:
            expectations[model] = replace(known[model], after=count)
        elif stage is not None and not stage.quiet:
            expectations[model] = Expectation.of(stage, current[model], count)
    if expectations == known:
        return state
    if check is None:
        offered, served, noise = _roots(pipeline)
        check = StepCheck(now, (), offered, served, noise, now)
    check = replace(check, expectations=tuple(expectations.values()), last_step_at=now)
    return VerifierState(check, state.corrections)


def judge(
    state: VerifierState,
    pipeline: PipelineModel,
    current: Mapping[str, int],
    snapshot: MetricSnapshot,
    now: float,
) -> Verdict:
    """The verdict on the waiting step, once the models it stepped are measured at their new
    counts (a window wholly after the change: the tick at which the allocator would first see
    them); corrections past their time are dropped."""
    corrections = tuple(c for c in state.corrections if now - c.since < CORRECTION_TTL_S)
    check = state.check
    if check is None:
        return Verdict(VerifierState(None, corrections))
    landed = [e for e in check.expectations if current.get(e.model, 0) > e.before]
    if not landed:
        # Not live yet (a load in flight) or never (a dry run, a failed load, undone): let go
        # once a window lies wholly after the step.
        return Verdict(VerifierState(None if check.due(snapshot) else check, corrections))
    waiting = [
        e
        for e in landed
        if e.model in pipeline.stages
        and not pipeline.stages[e.model].quiet
        and not pipeline.stages[e.model].measured_at_counts
    ]
    if waiting and now - check.last_step_at < MAX_WAIT_S:
        return Verdict(VerifierState(check, corrections))
    shortfalls: dict[str, str] = {}
    judged = []
    for expectation in landed:
        stage = pipeline.stages.get(expectation.model)
        if stage is None or stage.quiet or not stage.measured_at_counts:
            continue  # nothing to compare: no evidence of waste either (the safe side)
        longer, said = expectation.shortfall(stage, current[expectation.model])
        judged.append(said)
        if longer:
            shortfalls[expectation.model] = said
    offered, served, _ = _roots(pipeline)
    same_load = check.offered_rps > 0 and abs(offered / check.offered_rps - 1) <= OFFERED_CHANGE
    if same_load and served < check.served_fraction - check.served_noise:
        # Failures depend on the load too: compared only at about the same offered load.
        said = f"served fraction {check.served_fraction:.3f} -> {served:.3f}"
        judged.append(said)
        shortfalls.update({e.model: said for e in landed if e.model not in shortfalls})
    message = "; ".join(judged)
    if not shortfalls:
        return Verdict(VerifierState(None, corrections), {}, message)
    reverts = {}
    learnt = {c.model: c for c in corrections}
    for expectation in landed:
        if expectation.model in shortfalls:
            why = f"the step fell short of its prediction ({shortfalls[expectation.model]})"
            reverts[expectation.model] = (expectation.before, why)
            learnt[expectation.model] = Correction(expectation.model, expectation.before, now)
    return Verdict(VerifierState(None, tuple(learnt.values())), reverts, message)


def _roots(pipeline: PipelineModel) -> tuple[float, float, float]:
    """Requests finished per second at the set's roots, the fraction that succeeded, and how
    far that strays by chance: two standard deviations of the noisiest root's windows, at
    least SERVED_FRACTION_NOISE (failures come in bursts, more so under overload)."""
    roots = [pipeline.stages[m] for m in pipeline.roots if not pipeline.stages[m].quiet]
    finished = sum(stage.arrival_rps.value for stage in roots)
    if finished <= 0:
        return 0.0, 1.0, SERVED_FRACTION_NOISE
    succeeded = sum(stage.arrival_rps.value * stage.served_fraction.value for stage in roots)
    spread = max((stage.served_fraction.spread for stage in roots), default=0.0)
    return finished, succeeded / finished, max(SERVED_FRACTION_NOISE, NOISE_SIGMAS * spread)
