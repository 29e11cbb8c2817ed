"""One model's signals and a snapshot of them, as a metrics source reports them, for the
planner's unit tests that drive a single model."""

from __future__ import annotations

from tritonscale.core.signals import GpuSignals, MetricSnapshot, ModelSignals

MODEL = "pipeline_async"
NOW = 1_000_000.0


def signals(
    model: str = MODEL,
    compute: float = 1.4,
    queue: float = 0.0,
    pending: float = 0.0,
    pods: int = 1,
    requests: float = 100.0,
    executions: float | None = None,
) -> ModelSignals:
    """`compute` and `queue` in seconds per second (all instances), `requests` per second."""
    return ModelSignals(
        model=model,
        request_rate=requests,
        failure_rate=0.0,
        execution_rate=requests if executions is None else executions,
        compute_seconds_per_second=compute,
        queue_seconds_per_second=queue,
        pending_requests=pending,
        pods_reporting=pods,
    )


def snapshot(
    *models: ModelSignals,
    taken_at: float = NOW,
    gpu: GpuSignals | None = None,
    complete: bool = True,
) -> MetricSnapshot:
    return MetricSnapshot(
        taken_at=taken_at,
        window_s=60.0,
        models={m.model: m for m in models},
        gpu=gpu,
        complete=complete,
    )
