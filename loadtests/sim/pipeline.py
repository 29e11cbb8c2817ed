"""What the simulator serves: models as sets of instances, and the BLS calls between them.

A model's execution takes `overhead_ms + execute_ms * rows ** batch_exponent`: a branch model
that holds each batch for its `emulated_compute_ms` whatever its size has an exponent near 0;
a parent's pre-processing grows with the rows it batches (0.2 ms for one row and 3 ms for 32
on the development machine: an exponent of 0.78), and its BLS calls, tensor moves and
responses cost a few milliseconds per execution besides. A BLS parent (`calls`: child -> calls
per execution) holds its instance from the start of its execution until the last of its calls
has answered: with `sequential=False` (`async def execute` and `asyncio.gather`) the calls go
out together after its own work, so it waits for the slowest; with `sequential=True` (the sync
twin, blocking `exec()`) one after another. Each call carries the rows of the execution's
requests that make it: all of them, or for a conditional call (`call_share` below 1) each
request with that probability (no call when none does). A called model may call others in
turn (a pipeline up to three deep); a cycle is refused.

How a model batches is its config's: with a dynamic batcher (`batcher`, the default) queued
requests join one execution up to `max_batch_rows` rows; without one each request is one
execution (`max_batch_size` still bounds its rows); `max_batch_rows` 1 stands for
`max_batch_size: 0`.

`real_pipeline()` reads the branch times from models/*/config.pbtxt, so the simulator follows
the repository when they change.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Literal

MODELS_DIR = Path(__file__).resolve().parents[2] / "models"

PIPELINE = "pipeline_async"
PIPELINE_SYNC = "pipeline_sync"
BRANCHES = ("branch_embed", "branch_classify", "branch_rank")

# pipeline_async's pre-processing: 0.2 ms for one row, 3 ms for 32 (models/README.md). The rest
# of an execution (three BLS calls, tensors through shared memory, the responses) is fitted to
# the measured 2/2/2/1 configuration: 8 rows a request, 367 req/s from two parents, about
# 21.8 ms an execution of 32 rows of which the slowest branch takes 16.
PARENT_EXECUTE_MS = 0.2
PARENT_BATCH_EXPONENT = 0.78
PARENT_OVERHEAD_MS = 2.7
# A branch holds each batch for its emulated time; its numpy work grows a little with rows, and
# the BLS hop costs a fraction of a millisecond.
BRANCH_BATCH_EXPONENT = 0.02
BRANCH_OVERHEAD_MS = 0.3


@dataclass(frozen=True)
class ModelShape:
    """One model: how long an execution takes, how it batches, what it calls."""

    name: str
    execute_ms: float  # one row's execution; a parent's own work, its calls excluded
    batch_exponent: float = 0.0  # execution time grows as rows ** this (0: per batch)
    overhead_ms: float = 0.0  # per execution, whatever its rows
    max_batch_rows: int = 1  # the dynamic batcher joins requests up to this many rows
    calls: Mapping[str, int] = field(default_factory=dict)  # child -> calls per execution
    sequential: bool = False  # calls one after another (sync BLS) instead of together
    service: Literal["deterministic", "exponential"] = "deterministic"
    # child -> the share of requests that call it (a child left out: every request)
    call_share: Mapping[str, float] = field(default_factory=dict)
    batcher: bool = True  # a dynamic batcher joins queued requests (else one per execution)

    def execute_s(self, rows: int) -> float:
        """Seconds one execution of `rows` rows takes (its calls excluded)."""
        return (self.overhead_ms + self.execute_ms * rows**self.batch_exponent) / 1000.0


@dataclass(frozen=True)
class Pipeline:
    """A set of models served by one set of pods; `entries` receive the clients' requests."""

    name: str
    models: Mapping[str, ModelShape]
    entries: tuple[str, ...]

    def __post_init__(self) -> None:
        for shape in self.models.values():
            unknown = [child for child in shape.calls if child not in self.models]
            if unknown:
                raise ValueError(f"{shape.name} calls {unknown[0]}, which {self.name} lacks")
        for name in self.models:
            if name in self._below(name, frozenset()):
                raise ValueError(f"{name} calls itself through its children in {self.name}")
        missing = [entry for entry in self.entries if entry not in self.models]
        if missing:
            raise ValueError(f"entry {missing[0]} is not a model of {self.name}")

    def _below(self, model: str, seen: frozenset[str]) -> frozenset[str]:
        """The models `model` reaches through its calls (stopping where a path repeats)."""
        found = set()
        for child in self.models[model].calls:
            found.add(child)
            if child not in seen:
                found |= self._below(child, seen | {model})
        return frozenset(found)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.models)

    def calls_of(self, model: str) -> tuple[str, ...]:
        return tuple(self.models[model].calls)

    def with_cost(self, model: str, execute_ms: float) -> Pipeline:
        """The same pipeline with one model's execution time changed."""
        models = dict(self.models)
        models[model] = replace(models[model], execute_ms=execute_ms)
        return replace(self, name=f"{self.name}+{model}@{execute_ms:g}ms", models=models)

    def configs(self) -> dict[str, dict[str, object]]:
        """Each model's config as Triton serves it (its JSON), the fields of batching only:
        a shape that batches more than one row has `max_batch_size` its rows, and a dynamic
        batcher where it has one; a shape of one row has `max_batch_size: 0`."""
        configs: dict[str, dict[str, object]] = {}
        for name, s in self.models.items():
            config: dict[str, object] = {"name": name, "max_batch_size": 0}
            if s.max_batch_rows > 1:
                config["max_batch_size"] = s.max_batch_rows
                if s.batcher:
                    config["dynamic_batching"] = {}
            configs[name] = config
        return configs

    def key(self) -> tuple[object, ...]:
        """What identifies the pipeline's behaviour (the static search caches by it)."""
        return tuple(
            (
                s.name,
                s.execute_ms,
                s.batch_exponent,
                s.overhead_ms,
                s.max_batch_rows,
                tuple(sorted(s.calls.items())),
                s.sequential,
                s.service,
                tuple(sorted(s.call_share.items())),
                s.batcher,
            )
            for s in self.models.values()
        ) + (self.entries,)


def emulated_compute_ms(model: str, models_dir: Path = MODELS_DIR) -> float:
    """A branch's `emulated_compute_ms` parameter from its config.pbtxt."""
    text = (models_dir / model / "config.pbtxt").read_text()
    found = re.search(
        r'key:\s*"emulated_compute_ms"\s*value:\s*{\s*string_value:\s*"([0-9.]+)"', text
    )
    if found is None:
        raise ValueError(f"{model}/config.pbtxt has no emulated_compute_ms parameter")
    return float(found.group(1))


def max_batch_size(model: str, models_dir: Path = MODELS_DIR) -> int:
    text = (models_dir / model / "config.pbtxt").read_text()
    found = re.search(r"^max_batch_size:\s*(\d+)", text, re.MULTILINE)
    return int(found.group(1)) if found else 1


def branch(name: str, execute_ms: float, max_batch_rows: int = 64) -> ModelShape:
    return ModelShape(name, execute_ms, BRANCH_BATCH_EXPONENT, BRANCH_OVERHEAD_MS, max_batch_rows)


def parent(name: str, calls: Mapping[str, int], *, sequential: bool = False) -> ModelShape:
    return ModelShape(
        name,
        PARENT_EXECUTE_MS,
        PARENT_BATCH_EXPONENT,
        PARENT_OVERHEAD_MS,
        max_batch_rows=32,
        calls=MappingProxyType(dict(calls)),
        sequential=sequential,
    )


def real_pipeline(models_dir: Path = MODELS_DIR, *, with_sync: bool = False) -> Pipeline:
    """pipeline_async and its three branches as models/ configures them (and, with
    `with_sync`, its sync twin pipeline_sync beside it, calling the same branches)."""
    branches = {
        name: branch(name, emulated_compute_ms(name, models_dir), max_batch_size(name, models_dir))
        for name in BRANCHES
    }
    parents = {PIPELINE: parent(PIPELINE, dict.fromkeys(BRANCHES, 1))}
    if with_sync:
        parents[PIPELINE_SYNC] = parent(PIPELINE_SYNC, dict.fromkeys(BRANCHES, 1), sequential=True)
    return Pipeline(
        "pipeline" + ("+sync" if with_sync else ""),
        {**parents, **branches},
        tuple(parents),
    )


# The fan-out parent's own work per request: one parent alone served 45 to 47 req/s against
# a 20 ms branch (measured on a real tritonserver), about 1.5 ms besides the wait.
FAN_OUT_PARENT_MS = 1.5


def fan_out(branch_ms: float = 20.0, calls: int = 3, *, sequential: bool = False) -> Pipeline:
    """The measured fan-out (loadtests/sim/validation.py): a parent without batching that sends `calls`
    requests to one branch model (at once, or one after another when `sequential`), which
    holds each for `branch_ms`."""
    return Pipeline(
        "fan-out" + ("-sync" if sequential else ""),
        {
            "bls": ModelShape(
                "bls",
                FAN_OUT_PARENT_MS,
                calls=MappingProxyType({"leaf": calls}),
                sequential=sequential,
            ),
            "leaf": ModelShape("leaf", branch_ms),
        },
        ("bls",),
    )
