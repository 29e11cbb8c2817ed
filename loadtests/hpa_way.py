"""The HPA way: each model by itself to a utilization target, as an HPA (or KEDA) per model
would scale it; one model's tick, pure, so that the trace benchmark (on the real server) and
the simulator (in virtual time) run the same controller.

Every `intervalSeconds`: `ceil(count x utilization / target)` outside HPA's tolerance, with
utilization the busy fraction per instance (tritonscale.core.sizing) over the spec's
`metricsWindowSeconds`, bounded by the spec's min and max, then the behavior windows
(tritonscale.core.behavior: the stabilization windows and the rate policies). No joint
budget. Without metrics (or with a window not yet full) the count holds, as the HPA's does.
A controller of the benchmarks, not of the product.
"""

from __future__ import annotations

import math

from tritonscale.core import behavior, sizing
from tritonscale.core.behavior import PolicyState
from tritonscale.core.signals import ModelSignals
from tritonscale.core.spec import AutoscalerSpec

# HPA's default tolerance (--horizontal-pod-autoscaler-tolerance).
HPA_TOLERANCE = 0.1


def hpa_desired(spec: AutoscalerSpec, current: int, utilization: float) -> int:
    """HPA's replica formula on one model: ceil(count x utilization / target) outside the
    tolerance, bounded by min and max."""
    ratio = utilization / spec.targets.utilization
    desired = current if abs(1.0 - ratio) <= HPA_TOLERANCE else math.ceil(current * ratio)
    return max(spec.min_instances, min(spec.max_instances, desired))


def hpa_tick(
    spec: AutoscalerSpec,
    state: PolicyState,
    current: int,
    signals: ModelSignals | None,
    now: float,
) -> tuple[int, PolicyState]:
    """One model's tick: its formula (the count held where `signals` is None: no metrics or a
    window not yet full), then the stabilization windows and the rate policies; the count to
    run and the state for the next tick."""
    state = state.seeded(current, now, spec).observe(current, now, spec)
    if signals is None:
        desired = current
    else:
        desired = hpa_desired(spec, current, sizing.busy_per_instance(signals, current))
    count, _ = behavior.stabilize(spec, state.recommendations, current, desired, now)
    count, _ = behavior.limit_rate(spec, state.scale_events, current, count, now)
    return count, state.recommend(desired, now, spec).ticked(current, count, now)
