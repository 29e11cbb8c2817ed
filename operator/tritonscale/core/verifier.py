"""Did a step deliver what the allocator predicted? If not, revert it and correct the model.

The allocator assumes that each instance serves as much as the ones before it: a stage's
capacity is its count times what one instance serves. Where every instance shares one
resource (a GPU, a lock, the CPU cores) that is false: new instances wait, busy in Triton's
eyes, and serve nothing more. So after a step up (`start`), the first snapshot at which the
models it stepped are measured at their new counts (a window wholly after the change) is
compared with the prediction (`judge`) by two measures that do not depend on how much load is offered, so that a load
change between the windows passes neither for a gain nor for a loss (raw throughput would):

- per model stepped up: the instance seconds per request it was sized by (its hold per
  request: batching undone, a parent's wait on its children's queue taken out). The step fell
  short when that grew by more than the estimate's noise (`Estimate.noise`: two standard
  deviations of its windows, at least 3 %; 25 % when one window was all there was);
- the set's served fraction at its roots (successes over requests finished): the step fell
  short when it dropped by more than `SERVED_FRACTION_NOISE`.

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

from tritonscale.core import gain
from tritonscale.core.pipeline_model import PipelineModel
from tritonscale.core.signals import MetricSnapshot

STEP_FELL_SHORT = "StepFellShort"

SETTLE_S = gain.SETTLE_S  # a load takes up to about 1.5 s to apply; the window starts after it
CORRECTION_TTL_S = 600.0
# A step whose models are still not measured at their new counts this long after it is let go.
MAX_WAIT_S = 600.0
# The served fraction a step may lose by chance alone (a failure here and there).
SERVED_FRACTION_NOISE = 0.02


@dataclass(frozen=True)
class Expectation:
    """What one model stepped up was predicted to keep: its hold per request."""

    model: str
    before: int
    after: int
    hold_per_request_s: float
    noise: float  # relative

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "before": self.before,
            "after": self.after,
            "holdPerRequestS": self.hold_per_request_s,
            "noise": self.noise,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Expectation:
        return cls(
            str(d["model"]),
            int(d["before"]),
            int(d["after"]),
            float(d["holdPerRequestS"]),
            float(d["noise"]),
        )


@dataclass(frozen=True)
class StepCheck:
    """A step waiting for its verdict."""

    since: float  # unix seconds of the tick that decided the first step
    expectations: tuple[Expectation, ...]
    served_fraction: float  # the roots' served fraction before the first step
    last_step_at: float  # the tick of the latest step judged with it

    def due(self, snapshot: MetricSnapshot) -> bool:
        return snapshot.taken_at - snapshot.window_s >= self.last_step_at + SETTLE_S

    def to_dict(self) -> dict[str, Any]:
        return {
            "since": self.since,
            "expectations": [e.to_dict() for e in self.expectations],
            "servedFraction": self.served_fraction,
            "lastStepAt": self.last_step_at,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StepCheck:
        return cls(
            float(d["since"]),
            tuple(Expectation.from_dict(e) for e in d["expectations"]),
            float(d["servedFraction"]),
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
            hold = stage.hold_per_request_s
            expectations[model] = Expectation(model, current[model], count, hold.value, hold.noise)
    if expectations == known:
        return state
    if check is None:
        check = StepCheck(now, (), _served_fraction(pipeline), now)
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
        after = stage.hold_per_request_s.value
        bar = expectation.hold_per_request_s * (1 + expectation.noise)
        said = (
            f"{expectation.model} {expectation.before} -> {current[expectation.model]}: "
            f"{1000 * expectation.hold_per_request_s:.1f} -> {1000 * after:.1f} ms of an "
            f"instance per request (noise {100 * expectation.noise:.0f} %)"
        )
        judged.append(said)
        if round(after, 12) > round(bar, 12):
            shortfalls[expectation.model] = said
    served = _served_fraction(pipeline)
    served_fell = landed and served < check.served_fraction - SERVED_FRACTION_NOISE
    if served_fell:
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


def _served_fraction(pipeline: PipelineModel) -> float:
    roots = [pipeline.stages[m] for m in pipeline.roots if not pipeline.stages[m].quiet]
    finished = sum(stage.arrival_rps.value for stage in roots)
    if finished <= 0:
        return 1.0
    return sum(stage.arrival_rps.value * stage.served_fraction for stage in roots) / finished
