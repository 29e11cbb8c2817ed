"""The chart's InstanceGroupAutoscalers as it renders them (values.yaml's `autoscalers`: the
defaults merged into each model's entry), for the benchmarks and the simulator, which run them
outside a cluster: one reading of the chart, so that they all run what a user installs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

VALUES = Path(__file__).resolve().parents[1] / "charts" / "tritonscale" / "values.yaml"
# The chart's entries that stand for a pipeline's root and for a model it calls, for the
# models the chart does not name.
ROOT_ENTRY = "pipeline_async"
CALLEE_ENTRY = "branch_embed"


def chart_autoscalers() -> dict[str, dict[str, Any]]:
    """model -> spec, as the chart renders its InstanceGroupAutoscalers (selector aside)."""
    autoscalers = yaml.safe_load(VALUES.read_text())["autoscalers"]
    specs = {}
    for model, entry in autoscalers["models"].items():
        spec = {**autoscalers["defaults"], **(entry or {})}
        if spec.pop("enabled", True):
            specs[model] = {**spec, "model": model}
    return specs


def chart_spec(
    chart: dict[str, dict[str, Any]], model: str, calls: tuple[str, ...], root: bool
) -> dict[str, Any]:
    """The chart's autoscaler of `model` (or, for a model it does not name, its pipeline_async
    entry for a root and its branch_embed entry for a callee), calling `calls`."""
    entry = chart.get(model) or chart[ROOT_ENTRY if root else CALLEE_ENTRY]
    spec = {**entry, "model": model}
    spec.pop("calls", None)
    if calls:
        spec["calls"] = list(calls)
    return spec
