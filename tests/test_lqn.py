"""The performance model of a pod set (tritonscale.core.lqn): textbook queues, a two-layer
pipeline by hand, its properties over every split, its inputs from the operator's windows,
and its throughput against the simulator's."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from loadtests.sim import model_check
from tritonscale.core import lqn
from tritonscale.core.lqn import (
    BatchPolicy,
    Call,
    Network,
    ServiceTime,
    Station,
    closed_loop,
    expected_max,
    gamma_quantile,
    open_loop,
)
from tritonscale.core.pipeline_model import PipelineHistory, Reading, Window

pytestmark = pytest.mark.unit


def one_station(servers: int, service_s: float, scv: float = 1.0, **batching: object) -> Network:
    station = Station("m", servers, ServiceTime(service_s), BatchPolicy(**batching), scv=scv)  # type: ignore[arg-type]
    return Network({"m": station}, "m")


def erlang_c_wait_s(arrival_rps: float, service_s: float, servers: int) -> float:
    """Mean time in queue of M/M/c (Erlang's C formula)."""
    load = arrival_rps * service_s
    rho = load / servers
    below = sum(load**k / math.factorial(k) for k in range(servers))
    top = load**servers / math.factorial(servers) / (1 - rho)
    return top / (below + top) * service_s / (servers - load)


def finite_source_throughput(clients: int, think_s: float, service_s: float, servers: int) -> float:
    """The machine-repairman model (clients that think, then queue for `servers` exponential
    servers), from its stationary distribution: the exact answer MVA must reproduce."""
    weights = []
    for j in range(clients + 1):
        w = math.factorial(clients) / math.factorial(clients - j) * (service_s / think_s) ** j
        weights.append(w / math.prod(min(i, servers) for i in range(1, j + 1)))
    total = sum(weights)
    return sum(w * min(j, servers) / service_s for j, w in enumerate(weights)) / total


def pipeline(counts: tuple[int, int, int, int] = (1, 1, 1, 1)) -> Network:
    """pipeline_async's shape: a parent batching 4 requests of 8 rows, 5.7 ms of its own,
    three branches of 16, 11 and 5.7 ms that join two parents' calls of 32 rows."""
    parent = Station(
        "parent",
        counts[0],
        ServiceTime(0.0057),
        BatchPolicy(32, True),
        rows_per_request=8,
        calls=(Call("embed"), Call("classify"), Call("rank")),
    )
    branches = {
        name: Station(name, count, ServiceTime(ms / 1000), BatchPolicy(64, True))
        for name, count, ms in zip(
            ("embed", "classify", "rank"), counts[1:], (16.4, 11.0, 5.7), strict=True
        )
    }
    return Network({"parent": parent, **branches}, "parent")


def splits(budget: int, models: int = 4) -> list[tuple[int, ...]]:
    found: list[tuple[int, ...]] = [()]
    for _ in range(models):
        found = [(*s, c) for s in found for c in range(1, budget + 1)]
    return [s for s in found if sum(s) <= budget]


class TestTextbookQueues:
    @pytest.mark.parametrize("rho", [0.1, 0.5, 0.9])
    def test_an_open_single_server_waits_as_m_m_1(self, rho: float) -> None:
        service = 0.01
        prediction = open_loop(one_station(1, service), rho / service)
        assert prediction.mean_latency_s == pytest.approx(service / (1 - rho), rel=1e-9)
        assert prediction.stations["m"].utilization == pytest.approx(rho, rel=1e-9)

    @pytest.mark.parametrize(("servers", "rho"), [(2, 0.5), (3, 0.8), (8, 0.95)])
    def test_open_servers_wait_as_erlang_c(self, servers: int, rho: float) -> None:
        service = 0.02
        arrival = rho * servers / service
        prediction = open_loop(one_station(servers, service), arrival)
        expected = erlang_c_wait_s(arrival, service, servers) + service
        assert prediction.mean_latency_s == pytest.approx(expected, rel=1e-9)

    def test_fixed_executions_wait_half_as_long_as_exponential_ones(self) -> None:
        # Allen-Cunneen at one server is Pollaczek-Khinchine's exact M/D/1: rho S / 2(1 - rho).
        service, rho = 0.01, 0.7
        prediction = open_loop(one_station(1, service, scv=0.0), rho / service)
        assert prediction.stations["m"].wait_s == pytest.approx(
            rho * service / (2 * (1 - rho)), rel=1e-9
        )

    def test_open_arrivals_beyond_capacity_serve_the_capacity_at_infinite_latency(self) -> None:
        prediction = open_loop(one_station(2, 0.01), 500.0)
        assert prediction.throughput_rps == pytest.approx(200.0, rel=1e-9)
        assert math.isinf(prediction.mean_latency_s)

    @pytest.mark.parametrize("clients", [1, 2, 5, 12])
    def test_a_closed_loop_at_one_server_is_exact_mva(self, clients: int) -> None:
        service, think = 0.01, 0.05
        queue = 0.0
        for n in range(1, clients + 1):  # the textbook recursion
            response = service * (1 + queue)
            throughput = n / (think + response)
            queue = throughput * response
        prediction = closed_loop(one_station(1, service), clients, think_s=think)
        assert prediction.throughput_rps == pytest.approx(throughput, rel=1e-9)
        assert prediction.mean_latency_s == pytest.approx(response, rel=1e-9)

    @pytest.mark.parametrize(("clients", "servers"), [(3, 2), (10, 3), (20, 4)])
    def test_a_closed_loop_at_several_servers_is_the_finite_source_queue(
        self, clients: int, servers: int
    ) -> None:
        service, think = 0.02, 0.03
        prediction = closed_loop(one_station(servers, service), clients, think_s=think)
        assert prediction.throughput_rps == pytest.approx(
            finite_source_throughput(clients, think, service, servers), rel=1e-9
        )

    def test_clients_that_never_think_keep_a_batching_server_on_full_batches(self) -> None:
        # 32 clients, one instance, batches of at most 4: it serves 4 per execution.
        network = one_station(1, 0.02, scv=0.0, max_rows=4, dynamic=True)
        prediction = closed_loop(network, 32)
        assert prediction.throughput_rps == pytest.approx(4 / 0.02, rel=1e-9)
        assert prediction.stations["m"].mean_batch == pytest.approx(4.0, rel=1e-9)
        assert prediction.mean_latency_s == pytest.approx(32 / 200, rel=1e-9)


class TestTheSlowestCall:
    def test_fixed_calls_end_with_the_longest(self) -> None:
        assert expected_max([(1, 0.01, 0), (1, 0.004, 0)]) == pytest.approx((0.01, 0), abs=1e-12)

    def test_two_exponential_calls_end_as_the_closed_form_says(self) -> None:
        a, b = 0.01, 0.03
        mean, _ = expected_max([(1, a, a * a), (1, b, b * b)])
        assert mean == pytest.approx(a + b - 1 / (1 / a + 1 / b), rel=1e-4)

    def test_two_exponential_calls_spread_as_the_closed_form_says(self) -> None:
        # E[max^2] = E[X^2] + E[Y^2] - E[min^2], min exponential with rate 1/a + 1/b.
        a, b = 0.01, 0.03
        mean, var = expected_max([(1, a, a * a), (1, b, b * b)])
        smallest = 1 / (1 / a + 1 / b)
        assert mean == pytest.approx(a + b - smallest, rel=1e-9)
        assert var == pytest.approx(2 * a * a + 2 * b * b - 2 * smallest**2 - mean**2, rel=1e-9)

    def test_a_call_made_for_half_the_executions_counts_half(self) -> None:
        # max(10 ms fixed, a 30 ms call made half the time) = 0.5 * 10 + 0.5 * 30.
        mean, _ = expected_max([(1, 0.01, 0), (0.5, 0.03, 0)])
        assert mean == pytest.approx(0.02, rel=1e-9)


class TestLayers:
    def parent_and_children(
        self, *, sequential: bool, parents: int = 1, child_instances: int = 1
    ) -> Network:
        parent = Station(
            "p",
            parents,
            ServiceTime(0.002),
            calls=(Call("a"), Call("b")),
            sequential=sequential,
        )
        a = Station("a", child_instances, ServiceTime(0.010))
        b = Station("b", 1, ServiceTime(0.004))
        return Network({"p": parent, "a": a, "b": b}, "p")

    @pytest.mark.parametrize(
        ("sequential", "hold_s"), [(False, 0.002 + 0.010), (True, 0.002 + 0.010 + 0.004)]
    )
    def test_one_client_waits_own_work_and_the_longest_or_the_sum(
        self, sequential: bool, hold_s: float
    ) -> None:
        prediction = closed_loop(self.parent_and_children(sequential=sequential), 1)
        assert prediction.mean_latency_s == pytest.approx(hold_s, rel=1e-9)
        assert prediction.throughput_rps == pytest.approx(1 / hold_s, rel=1e-9)

    def test_a_parent_in_front_of_free_children_serves_one_per_hold(self) -> None:
        # One parent instance never has two calls out: nothing queues at the children.
        prediction = closed_loop(self.parent_and_children(sequential=False), 20)
        assert prediction.throughput_rps == pytest.approx(1 / 0.012, rel=1e-9)
        assert prediction.stations["p"].utilization == pytest.approx(1.0)

    def test_parents_in_front_of_a_saturated_child_serve_what_it_serves(self) -> None:
        # Four parents keep the 10 ms child busy: 100 calls a second, one per request.
        network = self.parent_and_children(sequential=False, parents=4)
        prediction = closed_loop(network, 20)
        assert prediction.throughput_rps == pytest.approx(100.0, rel=0.01)
        assert prediction.stations["a"].utilization == pytest.approx(1.0, abs=0.01)
        # A parent's hold includes its wait: four parents hold 4 / 100 s per request.
        assert prediction.stations["p"].hold_s == pytest.approx(0.04, rel=0.01)

    def test_calls_of_one_execution_to_one_child_take_turns_on_its_instance(self) -> None:
        # Three calls at once to a 20 ms child of one instance: the last ends after 60 ms.
        parent = Station("p", 1, ServiceTime(0.0015), calls=(Call("leaf", 3.0),))
        leaf = Station("leaf", 1, ServiceTime(0.020))
        prediction = closed_loop(Network({"p": parent, "leaf": leaf}, "p"), 1)
        assert prediction.mean_latency_s == pytest.approx(0.0015 + 0.060, rel=0.05)

    def test_calls_beyond_a_batching_childs_instances_wait_one_execution_and_go_together(
        self,
    ) -> None:
        # Three calls at once to a 28 ms child of one instance that batches up to 8: the
        # first finds it free and runs alone (a free instance takes what waits), the other two
        # wait for it and go together: two executions, the last ending after 56 ms (counted as
        # the calls' capacity of one instance times 8 would make it one; one each, three).
        parent = Station("p", 1, ServiceTime(0.002), calls=(Call("leaf", 3.0),))
        leaf = Station("leaf", 1, ServiceTime(0.028), BatchPolicy(8, True))
        prediction = closed_loop(Network({"p": parent, "leaf": leaf}, "p"), 1)
        assert prediction.mean_latency_s == pytest.approx(0.002 + 0.056, rel=0.02)


class TestTheFixedPoint:
    def test_a_steep_feedback_converges_instead_of_taking_turns(self) -> None:
        # Two parents, each execution three calls to a 28 ms child of two instances: a parent
        # that holds longer sends the child fewer calls, which then answer sooner. At half a
        # step the waits took turns between two states until the last round.
        root = Station(
            "root",
            2,
            ServiceTime(0.0),
            BatchPolicy(32, False),
            rows_per_request=8,
            calls=(Call("fast", 1.0), Call("slow", 3.01)),
        )
        fast = Station("fast", 1, ServiceTime(0.00078), BatchPolicy(64, True), rows_per_request=8)
        slow = Station("slow", 2, ServiceTime(0.0284), BatchPolicy(64, True), rows_per_request=8)
        prediction = closed_loop(Network({"root": root, "fast": fast, "slow": slow}, "root"), 32)
        assert prediction.converged, prediction.rounds
        assert prediction.rounds < lqn.MAX_ROUNDS / 5


class TestProperties:
    def test_more_instances_never_predict_less_throughput(self) -> None:
        served = {split: closed_loop(pipeline(split), 32).throughput_rps for split in splits(7)}  # type: ignore[arg-type]
        for split, before in served.items():
            for index in range(4):
                more = tuple(c + (i == index) for i, c in enumerate(split))
                if more in served:
                    # Equal within the fixed point's tolerance where the instance is idle.
                    after = served[more]
                    assert after >= before * (1 - 10 * lqn.TOLERANCE), (split, more, before, after)

    @pytest.mark.parametrize("split", [(1, 1, 1, 1), (2, 2, 1, 1), (4, 1, 1, 1), (3, 2, 1, 1)])
    def test_utilization_is_throughput_times_visits_times_service_over_servers(
        self, split: tuple[int, int, int, int]
    ) -> None:
        prediction = closed_loop(pipeline(split), 32)
        for name, station in prediction.stations.items():
            servers = pipeline(split).stations[name].instances
            demand = prediction.throughput_rps * station.visits * station.hold_s
            assert station.utilization == pytest.approx(
                demand / station.mean_batch / servers, rel=1e-6
            ), name

    def test_without_batching_utilization_is_throughput_times_the_service_given(self) -> None:
        network = one_station(3, 0.02)
        prediction = open_loop(network, 100.0)
        assert prediction.stations["m"].utilization == pytest.approx(100 * 0.02 / 3, rel=1e-9)

    def test_p95_is_a_gamma_quantile_of_the_response(self) -> None:
        # Shape 1 is the exponential: its p95 is -ln(0.05) of its mean (Wilson-Hilferty: 1 %).
        assert gamma_quantile(1.0, 1.0) == pytest.approx(-math.log(0.05), rel=0.01)
        assert gamma_quantile(0.1, 0.0) == 0.1
        prediction = closed_loop(pipeline((2, 2, 1, 1)), 32)
        assert prediction.mean_latency_s < prediction.p95_latency_s < 2 * prediction.mean_latency_s

    def test_pods_share_the_load_evenly(self) -> None:
        one = closed_loop(pipeline((2, 2, 1, 1)), 32)
        two = closed_loop(replace(pipeline((2, 2, 1, 1)), pods=2), 64)
        assert two.throughput_rps == pytest.approx(2 * one.throughput_rps, rel=1e-9)
        assert two.mean_latency_s == pytest.approx(one.mean_latency_s, rel=1e-9)

    def test_a_lone_request_waits_the_batchers_delay_for_company(self) -> None:
        # One client: every request finds the instance free and waits the 1 ms delay.
        network = one_station(1, 0.01, scv=0.0, max_rows=8, dynamic=True, queue_delay_s=0.001)
        assert closed_loop(network, 1).mean_latency_s == pytest.approx(0.011, rel=1e-9)

    def test_a_cycle_of_calls_is_refused(self) -> None:
        a = Station("a", 1, ServiceTime(0.01), calls=(Call("b"),))
        b = Station("b", 1, ServiceTime(0.01), calls=(Call("a"),))
        with pytest.raises(ValueError, match="cycle"):
            Network({"a": a, "b": b}, "a")


class TestBatching:
    def test_the_config_says_how_a_model_batches(self) -> None:
        policy = BatchPolicy.of_config(
            {
                "max_batch_size": "32",
                "dynamic_batching": {
                    "max_queue_delay_microseconds": "1000",
                    "preferred_batch_size": [8, 16],
                },
            }
        )
        assert policy == BatchPolicy(32, True, 0.001, (8, 16))
        assert BatchPolicy.of_config({"max_batch_size": 8}).most_requests(1) == 1  # no batcher

    def test_a_batch_is_what_waits_down_to_a_preferred_size(self) -> None:
        policy = BatchPolicy(32, True, 0.0, (16,))
        assert policy.formed(3.0, 8) == 2.0  # 16 rows of 8: two requests fit a preferred size
        assert policy.formed(1.5, 8) == 1.5  # none fits: what waits
        assert policy.formed(10.0, 8) == 2.0
        assert BatchPolicy(32, True).formed(10.0, 8) == 4.0  # the largest: 32 rows


def reading(rps: float, batch: float, execution_s: float, rows: float, queue_s: float = 0.0):
    return Reading(
        request_rate=rps,
        failure_rate=0.0,
        execution_rate=rps / batch,
        compute_seconds_per_second=rps * execution_s,
        queue_seconds_per_second=rps * queue_s,
        pods=1,
        inference_rate=rps * rows,
    )


class TestInputs:
    def test_two_batch_sizes_separate_the_fixed_and_the_per_row_parts(self) -> None:
        fitted = lqn.fit_service([(8, 0.002 + 8 * 0.0001), (32, 0.002 + 32 * 0.0001)])
        assert fitted.fixed_s == pytest.approx(0.002) and fitted.per_row_s == pytest.approx(1e-4)

    def test_one_batch_size_is_all_fixed(self) -> None:
        fitted = lqn.fit_service([(32, 0.010), (32.2, 0.011)])
        assert fitted.fixed_s == pytest.approx(0.0105) and fitted.per_row_s == 0.0

    def test_the_network_comes_from_the_windows_the_operator_keeps(self) -> None:
        counts = {"parent": 1, "leaf": 2}
        history = PipelineHistory()
        for i in range(3):
            window = Window(
                1000.0 + 2 * i,
                2.0,
                counts,
                {
                    # 4 requests of 8 rows an execution, 25 ms each, 20 of them its call.
                    "parent": reading(160, 4, 0.025, 8, queue_s=0.1),
                    "leaf": reading(40, 1, 0.016, 32, queue_s=0.004),
                },
            )
            history = PipelineHistory((*history.windows, window))
        network = lqn.from_history(
            history,
            {"parent": ("leaf",)},
            "parent",
            {
                "parent": {"max_batch_size": 32, "dynamic_batching": {}},
                "leaf": {"max_batch_size": 64, "dynamic_batching": {}},
            },
        )
        parent, leaf = network.stations["parent"], network.stations["leaf"]
        assert network.counts == counts
        assert parent.rows_per_request == 8 and parent.calls == (Call("leaf", 1.0, 1.0),)
        assert parent.service.fixed_s == pytest.approx(0.005, rel=1e-6)  # 25 - (16 + 4)
        assert leaf.service == ServiceTime(0.016) and leaf.batching.most_requests(32) == 2
        # One parent instance has one call out at a time: the model queues nothing at the
        # leaf (the windows measured 4 ms there), so batches of 4 are held 5 + 16 ms.
        assert closed_loop(network, 32).throughput_rps == pytest.approx(4 / 0.021, rel=1e-6)

    def test_a_model_never_seen_serving_cannot_be_modelled(self) -> None:
        window = Window(1000.0, 2.0, {"parent": 1}, {"parent": reading(10, 1, 0.01, 1)})
        with pytest.raises(ValueError, match="leaf"):
            lqn.from_history(PipelineHistory((window,)), {"parent": ("leaf",)}, "parent")


def test_it_predicts_the_simulators_throughput_within_ten_percent() -> None:
    case = model_check.cases()[0]
    result = model_check.check(replace(case, budget=6))
    assert result["within_10pct_share"] == 1.0, result
