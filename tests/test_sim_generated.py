"""The simulator on generated pipelines (loadtests/sim/generated.py): the shapes the generator
covers, the queues of call trees, the bounded static search against the exhaustive one, the
operator's decision path as the controller runs it, and runs that repeat per seed."""

from __future__ import annotations

import random
from types import MappingProxyType

import pytest

from loadtests.sim import scenarios, summary
from loadtests.sim.allocator_controller import AllocatorController
from loadtests.sim.generated import MAX_MODELS, generate_pipeline
from loadtests.sim.pipeline import ModelShape, Pipeline
from loadtests.sim.queueing import Simulation
from loadtests.sim.runner import run_scenario
from loadtests.sim.static import MEASURE_S, Bounds, StaticSearch, configurations

pytestmark = pytest.mark.unit

GENERATED = [
    make(random.Random(seed), seed, scenarios.real_pipeline())
    for name, (make, count) in scenarios.FAMILIES.items()
    if name.startswith(scenarios.GENERATED)
    for seed in range(count)
]


def test_the_generated_families_hold_at_least_400_scenarios_of_every_shape() -> None:
    assert len(GENERATED) >= 400
    seen: dict[str, set[object]] = {}
    for scenario in GENERATED:
        for trait, value in scenario.shape.items():
            seen.setdefault(trait, set()).add(value)
        assert len(scenario.pipeline.models) <= MAX_MODELS
    assert seen["depth"] == {1, 2, 3}
    assert seen["fan_out"] == {1, 2, 3, 4}
    assert seen["calls_per_execution"] >= {1, 2, 3, 4, 5, 6}
    for trait in ("conditional", "no_batcher", "max_batch_size_0", "sequential", "shared_child"):
        assert seen[trait] == {True, False}, trait
    loops = {
        "closed" if phase.clients else "open"
        for s in GENERATED
        for phase in s.phases
        if phase.loads
    }
    assert loops == {"open", "closed"}
    # Two roots loaded at once, and one after the other.
    shared = [s for s in GENERATED if s.shape["shared_child"]]
    assert any(len(phase.loads) == 2 for s in shared for phase in s.phases)
    assert any(s.family == f"{scenarios.GENERATED}shift" for s in shared)
    # Service times of 1 to 50 ms an execution of 16 rows.
    for scenario in GENERATED[:60]:
        for shape in scenario.pipeline.models.values():
            assert 0.9 <= shape.execute_s(16) * 1000 <= 50.1, shape


def test_a_pipeline_and_a_scenario_are_the_same_for_the_same_seed() -> None:
    first = generate_pipeline(random.Random(7), "g", shared=True, depth=3)
    again = generate_pipeline(random.Random(7), "g", shared=True, depth=3)
    assert first == again
    assert first.pipeline.key() != generate_pipeline(random.Random(8), "g").pipeline.key()
    names = [s.name for s in GENERATED]
    assert len(set(names)) == len(names)
    steady = scenarios.FAMILIES[f"{scenarios.GENERATED}steady"][0]
    base = scenarios.real_pipeline()
    assert steady(random.Random(3), 3, base) == steady(random.Random(3), 3, base)


def test_a_generated_scenario_runs_the_same_twice() -> None:
    scenario = next(s for s in GENERATED if s.family.endswith("closed") and len(s.phases) == 1)
    one = run_scenario(scenario, AllocatorController, StaticSearch())
    two = run_scenario(scenario, AllocatorController, StaticSearch())
    assert one == two
    assert one["shape"] == dict(scenario.shape)


def chain(*, sequential: bool = False, share: float = 1.0, times: int = 1) -> Pipeline:
    """root -> mid -> leaf (and mid -> other), one row a request, no batching."""
    return Pipeline(
        "chain",
        {
            "root": ModelShape("root", 1.0, calls=MappingProxyType({"mid": 1})),
            "mid": ModelShape(
                "mid",
                2.0,
                calls=MappingProxyType({"leaf": times, "other": 1}),
                sequential=sequential,
                call_share=MappingProxyType({"leaf": share} if share < 1 else {}),
            ),
            "leaf": ModelShape("leaf", 10.0),
            "other": ModelShape("other", 4.0),
        },
        ("root",),
    )


def one_client_rps(pipeline: Pipeline, counts: dict[str, int] | None = None) -> float:
    sim = Simulation(pipeline, counts or dict.fromkeys(pipeline.names, 4), rows_per_request=1)
    sim.closed_loop("root", 1)
    sim.run_until(1.0)
    before = sim.counters()["root"].success
    sim.run_until(11.0)
    return (sim.counters()["root"].success - before) / 10.0


def test_a_call_tree_holds_each_caller_until_its_calls_answer() -> None:
    # One request at a time: root 1 ms, mid 2 ms, then leaf (10 ms) and other (4 ms).
    assert one_client_rps(chain()) == pytest.approx(1 / 0.013, rel=0.01)  # together
    assert one_client_rps(chain(sequential=True)) == pytest.approx(1 / 0.017, rel=0.01)
    assert one_client_rps(chain(sequential=True, times=3)) == pytest.approx(1 / 0.037, rel=0.01)
    # One mid instance held for all of it: more roots do not help.
    two_roots = {"root": 2, "mid": 1, "leaf": 4, "other": 4}
    sim = Simulation(chain(), two_roots, rows_per_request=1)
    sim.closed_loop("root", 8)
    sim.run_until(10.0)
    busy = sim.counters()["mid"].compute_s / 10.0
    assert busy == pytest.approx(1.0, rel=0.01)  # mid's compute includes its wait


def test_a_conditional_call_is_made_for_its_share_of_the_requests() -> None:
    sim = Simulation(chain(share=0.3), dict.fromkeys(chain().names, 4), rows_per_request=1)
    sim.closed_loop("root", 4)
    sim.run_until(20.0)
    counters = sim.counters()
    assert counters["leaf"].success / counters["mid"].success == pytest.approx(0.3, abs=0.03)
    # Every mid execution calls other (up to the 4 still waiting for leaf at the end).
    assert 0 <= counters["other"].success - counters["mid"].success <= 4


def test_a_model_without_a_dynamic_batcher_executes_one_call_at_a_time() -> None:
    def pipeline(batcher: bool) -> Pipeline:
        leaf = ModelShape("leaf", 5.0, overhead_ms=1.0, max_batch_rows=32, batcher=batcher)
        root = ModelShape("root", 0.5, calls=MappingProxyType({"leaf": 1}))
        return Pipeline("p", {"root": root, "leaf": leaf}, ("root",))

    for batcher in (True, False):
        sim = Simulation(pipeline(batcher), {"root": 8, "leaf": 1}, rows_per_request=4)
        sim.closed_loop("root", 8)
        sim.run_until(5.0)
        leaf = sim.counters()["leaf"]
        assert (leaf.executions < leaf.success) is batcher
    assert pipeline(False).configs()["leaf"] == {"name": "leaf", "max_batch_size": 32}


def test_a_cycle_of_calls_is_refused() -> None:
    a = ModelShape("a", 1.0, calls=MappingProxyType({"b": 1}))
    b = ModelShape("b", 1.0, calls=MappingProxyType({"a": 1}))
    with pytest.raises(ValueError, match="calls itself"):
        Pipeline("loop", {"a": a, "b": b}, ("a",))


@pytest.mark.parametrize("index", [0, 1, 2, 3, 4, 5, 12, 13])
def test_the_bounded_search_finds_what_trying_every_configuration_finds(index: int) -> None:
    scenario = GENERATED[index * 7]
    specs = scenario.specs()
    candidates = configurations(
        scenario.pipeline.names,
        scenario.budget,
        {m: s.min_instances for m, s in specs.items()},
        {m: s.max_instances for m, s in specs.items()},
    )
    bounded, every = StaticSearch(), StaticSearch()
    for i, phase in enumerate(scenario.phases):
        pipeline = scenario.pipeline_in(i)
        offered = {e: phase.offered_per_second(e) for e in pipeline.entries}
        found = bounded.best(pipeline, candidates, offered, phase.clients)
        assert found == every.exhaustive(pipeline, candidates, offered, phase.clients)
    # Every capacity simulated lies under its bound.
    for entry in scenario.pipeline.entries:
        bounds = Bounds(scenario.pipeline, entry, 8, MEASURE_S)
        for counts in candidates:
            capacity = every.capacity(scenario.pipeline, counts, entry)
            assert capacity <= bounds.rps(counts), counts
    assert bounded.simulated <= every.simulated


def test_the_controller_drives_the_set_planner_and_the_budget_ledger() -> None:
    scenario = next(s for s in GENERATED if s.family.endswith("step") and s.shape["depth"] == 3)
    made: list[AllocatorController] = []

    def controller() -> AllocatorController:
        made.append(AllocatorController())
        return made[-1]

    row = run_scenario(scenario, controller, StaticSearch())
    planner = made[0].planner
    assert planner.last is not None and planner.last.state.history is not None
    assert set(made[0].states) == set(scenario.pipeline.names)
    held = made[0].ledger.held(("sim", scenarios.BUDGET_NAME))
    assert sum(held.values()) <= scenario.budget
    assert all(phase["budget_overruns"] == 0 for phase in row["phases"])


def test_the_summary_counts_the_generated_scenarios_apart() -> None:
    def row(family: str, at: bool, shape: dict[str, object] | None = None) -> dict:
        phase = {
            "at_098_of_best": at,
            "seconds_to_098": 0.0,
            "started_at_098": True,
            "seconds_to_best": 0.0,
            "served_ratio": 1.0,
            "instance_seconds": 1.0,
            "best_instance_seconds": 1.0,
            "budget_overruns": 0,
            "reversals": 0,
            "reversal_reasons": {},
            "steady": True,
        }
        return {"family": family, "phases": [phase], **({"shape": shape} if shape else {})}

    rows = [
        row("step", True),
        row("generated_step", False, {"depth": 2}),
        row("generated_spike", True, {"depth": 2}),
    ]
    result = summary.summarize(rows, "allocator", 1.0)
    assert result["generated_scenarios"] == 2
    assert result["generated_share_of_phases_at_098_of_best"] == 0.5
    assert result["ours_share_of_phases_at_098_of_best"] == 1.0
    assert result["generated_by_shape"] == {
        "depth=2": {"phases": 2, "share_of_phases_at_098_of_best": 0.5}
    }
    assert result["share_of_phases_at_098_of_best"] == pytest.approx(0.6667)
