"""A performance model of a pod set from first principles: a layered queueing network.

Each model is a station of `instances` servers per pod (its instances; every pod runs the
same counts, and the load balancer spreads requests evenly over the pods, so one pod is
solved with its share and the throughput multiplied back). A BLS parent holds its instance
for its own work and for the calls it makes (Triton's compute time of a BLS model is the
wall time of `execute`): a layered queueing network in the sense of Woodside and Franks, the
parent a software server whose clients are the requests above it and which is itself a
client of the models it calls.

What a station is made of (each measured, `from_history`):

- the execution time of a batch of `rows` rows, `fixed_s + per_row_s * rows`: least squares
  over windows that saw different batch sizes. Where every window saw the same batch size
  (within the windows' noise) the per-row part cannot be told from the fixed one; it is then
  taken as fixed per execution (an execution of more rows costs no more: true of the
  emulated branches, and the side on which the model overstates what batching buys);
- how it batches, as its config says (`BatchPolicy`: `max_batch_size`, the dynamic batcher,
  its queue delay and preferred sizes): a request carries `rows_per_request` rows, a batch at
  most `max_batch_size` rows;
- the calls one execution makes to each child (a mean: a call made for some requests only
  counts as its share), and the rows of a call over the rows of the execution that made it.
  Calls go out per execution (a BLS parent sends one call per child with the batch's rows);
  with one batch size seen, calls per request and per execution cannot be told apart, and
  per execution is what `execute` does;
- how a parent waits: async calls (`asyncio.gather`) end with the slowest, and the parent
  waits the expected maximum of its calls' response times; sync calls one after another, and
  it waits their sum.

How the batch forms. A free instance takes what waits, up to the largest batch (the
config's `max_batch_size` over the rows of a request). With `j` requests at a station of `c`
instances: at most `c` run alone at once. Beyond, the batches in service match the queue they
were taken from: each holds `b`, and when one leaves the next is what waits,
`b = j - c*b + s*b`, with `s` the share of the leaving batch back in time to join it (its
clients return after their think time, here taken as exponential, and the dynamic batcher
waits up to its queue delay for company: `s = 1 - exp(-delay / think)`; 1 for clients that
do not think, 0 for open arrivals); so `b = j / (c + 1 - s)`. A batch that comes back whole
is taken whole by the first free instance: `b` is at least `s * min(j, largest)`. Then it is
rounded down to a preferred size where the config names one that fits. A station with `j`
requests therefore serves `min(j, c*b) / S(b)` requests per second, `S(b)` the hold of a
batch of `b`: a load-dependent server. The queue delay also adds to the wait of a request
that finds an instance free (it waits up to the delay for company; under a queue it waits
anyway).

How it is solved. Layer by layer, iterated to a fixed point (the Method of Layers of Rolia
and Sevcik, in the SRVN form of Franks' LQNS: a parent's hold = its own work + its calls'
response times):

- the root's layer: closed (`closed_loop`: a fixed number of clients, each sending again
  `think_s` after its answer) by mean-value analysis with a load-dependent server (Reiser and
  Lavenberg's MVA on marginal probabilities, exact for exponential holds); open (`open_loop`:
  Poisson arrivals) by the birth-death chain of the same server, which is Erlang-C's M/M/c
  where nothing batches, with the Allen-Cunneen correction of the wait for the hold's
  variability, `(1 + cs^2) / 2`;
- a child's layer: its clients are the callers' busy instances (each busy async caller has
  all its calls out at once, a sync one one call), a closed population that thinks for the
  rest of the caller's hold between two calls; solved by the same MVA (a mean population
  between two integers is interpolated between them);
- clients that think arrive at a random moment of the executions under way and wait for what
  is left of the first: `(1 + cs^2) / 2` of an interval between departures instead of the
  exponential's whole one (the residual-time correction of approximate MVA for FCFS stations
  with general service), never beyond what the instances serve with that many present (two
  callers in step with one deterministic instance take turns); clients that do not think
  come back the moment their batch leaves, in step with it: the product form's whole
  intervals;
- the expected maximum of a parent's async calls: each call's response time is taken as
  independent of the others and as a shifted exponential with the call's mean and variance
  (a constant part and an exponential part; one whose variance exceeds its squared mean is
  taken as exponential); `E[max] = integral of 1 - prod F_i(t) dt`, in closed form (the
  product expanded, between two shifts, into a sum of exponentials).
  The calls of one execution to one child arrive together and are not independent: as a
  batch forms (above), at most `c` of them run alone at once and the rest wait and go in
  batches of at most the largest, `k = 1 + ceil((calls - c) / (c * largest))` of its
  executions one after another, the last ending `(k - 1) / 2` holds after their mean.
- the rounds: each parent's wait for its calls moves a share of the way to what its callees'
  responses give (half a step; the first round the whole). Where the residuals turn back
  against the last round's, the step is halved (under-relaxation), and doubled again, up to
  half, while they keep their direction: a steep feedback (a parent slower, its children
  less loaded, their answers quicker) converges instead of taking turns between two states,
  and where the map jumps (calls that take one execution more of a child) the rounds end at
  the jump. They stop when a round moves no wait by more than `TOLERANCE`.

Spreads and tails. Triton's counters give means only: an execution's time at a given batch is
taken as its mean (`EXECUTION_SCV`, no spread; the spread of a parent's hold is that of its
calls). A request that finds `j` requests at a station waits for the batches ahead to leave;
departures are taken as a renewal process with the hold's variability (one interval per batch
over the instances), so the wait's spread comes from the queue found on arrival (the MVA's
arrival theorem in a closed loop, PASTA in an open one) and its mean is the solver's. p95 of
a root's response: a gamma distribution with the response's mean and variance (its quantile
by Wilson and Hilferty's cube-root normal approximation).

What it leaves out: the client's own time and the network between it and the pod (a closed
loop's `think_s` stands for them where they are measured); other roots' traffic at a shared
child (one root per network); CPU shared between models (each instance is a server of its
own); the time a count change takes.

Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from statistics import NormalDist
from typing import Any

from tritonscale.core.pipeline_model import NOISE_FLOOR, PipelineHistory, Reading, Window

# The standard normal quantile of 0.95 (p95 of a response).
P95_Z = 1.6448536269514722
# An execution's squared coefficient of variation at a given batch: Triton's counters give
# means only, and the same code on the same batch shape takes about the same time.
EXECUTION_SCV = 0.0
# The fixed point stops when no parent's wait for its calls moves by more than this share
# in a round: 1e-8, so that two splits a model's idle instance apart come out equal to well
# within a millionth (tests/test_lqn.py holds them to ten of it), where the contraction is
# slow and the residual overstates how close the iterate is by up to a hundredfold.
TOLERANCE = 1e-8
MAX_ROUNDS = 500


@dataclass(frozen=True)
class ServiceTime:
    """Seconds an execution of `rows` rows takes: `fixed_s + per_row_s * rows`."""

    fixed_s: float
    per_row_s: float = 0.0

    def at(self, rows: float) -> float:
        return self.fixed_s + self.per_row_s * rows


@dataclass(frozen=True)
class BatchPolicy:
    """How a model forms batches, from its config (rows, as Triton counts them)."""

    max_rows: int = 0  # max_batch_size; 0: the model does not batch
    dynamic: bool = False  # a dynamic batcher joins queued requests
    queue_delay_s: float = 0.0  # max_queue_delay_microseconds
    preferred_rows: tuple[int, ...] = ()  # preferred_batch_size

    @classmethod
    def of_config(cls, config: Mapping[str, Any]) -> BatchPolicy:
        """The policy of a model config as Triton returns it (JSON; some integers as
        strings)."""
        batcher = config.get("dynamic_batching")
        dynamic = isinstance(batcher, Mapping)
        batcher = batcher if isinstance(batcher, Mapping) else {}
        return cls(
            max(0, int(config.get("max_batch_size", 0) or 0)),
            dynamic,
            int(batcher.get("max_queue_delay_microseconds", 0) or 0) / 1e6,
            tuple(sorted(int(size) for size in batcher.get("preferred_batch_size", ()) or ())),
        )

    def most_requests(self, rows_per_request: float) -> float:
        """The most requests one execution takes."""
        if not self.dynamic or self.max_rows <= 0:
            return 1.0
        return max(1.0, math.floor(self.max_rows / max(rows_per_request, 1e-9) + 1e-9))

    def formed(self, waiting: float, rows_per_request: float) -> float:
        """The batch (requests) taken when `waiting` requests wait: at most the largest,
        rounded down to a preferred size that fits (where the config names one)."""
        batch = min(max(1.0, waiting), self.most_requests(rows_per_request))
        fitting = [
            size / rows_per_request
            for size in self.preferred_rows
            if 1.0 <= size / rows_per_request <= batch
        ]
        return max(fitting) if fitting else batch


@dataclass(frozen=True)
class Call:
    """The calls one execution of a parent makes to `child` (a mean), and the rows of one
    call over the rows of the execution that made it."""

    child: str
    per_execution: float = 1.0
    rows_share: float = 1.0


@dataclass(frozen=True)
class Station:
    """One model: its instances per pod, its own work per execution, how it batches, what it
    calls. `rows_per_request` counts for a root; a child's calls carry its callers' rows."""

    name: str
    instances: int
    service: ServiceTime
    batching: BatchPolicy = BatchPolicy()
    rows_per_request: float = 1.0
    calls: tuple[Call, ...] = ()
    sequential: bool = False  # sync BLS: one call after another
    scv: float = EXECUTION_SCV  # of its own work at a given batch


@dataclass(frozen=True)
class Network:
    """The stations of one root's pipeline on `pods` pods (the same counts on each)."""

    stations: Mapping[str, Station] = field(hash=False)
    root: str
    pods: int = 1

    def __post_init__(self) -> None:
        if self.root not in self.stations:
            raise ValueError(f"the root {self.root} is not a station of the network")
        for station in self.stations.values():
            if station.instances < 1:
                raise ValueError(f"{station.name}: {station.instances} instances cannot serve")
            for call in station.calls:
                if call.child not in self.stations:
                    raise ValueError(f"{station.name} calls {call.child}, not in the network")
        self.order()  # raises on a cycle

    @property
    def counts(self) -> dict[str, int]:
        return {name: s.instances for name, s in self.stations.items()}

    def with_counts(self, counts: Mapping[str, int]) -> Network:
        """The same network with these instances per pod (stations left out keep theirs)."""
        return replace(
            self,
            stations={
                name: replace(s, instances=counts.get(name, s.instances))
                for name, s in self.stations.items()
            },
        )

    def callers(self, name: str) -> list[tuple[Station, Call]]:
        return [(s, c) for s in self.stations.values() for c in s.calls if c.child == name]

    def order(self) -> list[str]:
        """The stations reachable from the root, every caller before its callees."""
        seen: dict[str, bool] = {}
        done: list[str] = []

        def visit(name: str) -> None:
            if seen.get(name) is False:
                raise ValueError(f"the calls of {self.root}'s pipeline cycle through {name}")
            if name in seen:
                return
            seen[name] = False
            for call in self.stations[name].calls:
                visit(call.child)
            seen[name] = True
            done.append(name)

        visit(self.root)
        return done[::-1]


@dataclass(frozen=True)
class StationResult:
    """One station in the solution, over all pods."""

    requests_per_s: float  # requests (a child's: calls) served per second
    executions_per_s: float
    mean_batch: float  # requests per execution
    hold_s: float  # instance seconds per execution (own work plus the calls' time)
    response_s: float  # what a request spends at the station: wait plus its batch's hold
    wait_s: float
    utilization: float  # busy share of its instances
    visits: float  # requests per root request


@dataclass(frozen=True)
class Prediction:
    """What a split serves: the root's throughput and response time, and every station."""

    throughput_rps: float
    mean_latency_s: float
    p95_latency_s: float
    stations: Mapping[str, StationResult] = field(hash=False)
    rounds: int = 0  # of the layered fixed point
    converged: bool = True
    latency_var_s2: float = 0.0  # the variance of the root's response (its p95's gamma)

    def latency_quantile_s(self, quantile: float) -> float:
        """The root's response at `quantile` (0.95: p95): the gamma distribution with the
        response's mean and variance, as `p95_latency_s` is; infinite where the arrivals
        exceed what the split serves."""
        if not math.isfinite(self.mean_latency_s):
            return math.inf
        return gamma_quantile(
            self.mean_latency_s, self.latency_var_s2, NormalDist().inv_cdf(quantile)
        )


# ---- one load-dependent station --------------------------------------------------------


@dataclass(frozen=True)
class _Server:
    """A station as a load-dependent server: with `j` requests present its instances serve
    `rate[j]` requests per second in batches of `batch[j]` held `hold[j]` seconds each."""

    instances: int
    rate: tuple[float, ...]  # index j >= 1 (index 0 unused)
    batch: tuple[float, ...]
    hold: tuple[float, ...]
    hold_scv: float
    most_batch: float  # the most requests one execution takes

    @classmethod
    def of(
        cls,
        station: Station,
        rows_per_request: float,
        calls_s: float,
        calls_var: float,
        most: int,
        back: float,
    ) -> _Server:
        """The server's table up to `most` present; `back`: the share of a leaving batch that
        is back in time to join the next one (`_back_in_time`)."""
        c = station.instances
        most_batch = station.batching.most_requests(rows_per_request)
        rate, batch, hold = [0.0], [1.0], [0.0]
        for j in range(1, most + 1):
            # Batches in service match the queue they were taken from (b = j / (c + 1)), the
            # leaving batch's share back in time counted in it; a batch that comes back whole
            # is taken whole by the first free instance (it stays one batch).
            waiting = max(j / (c + 1.0 - back), back * min(j, most_batch))
            b = 1.0 if j <= c else station.batching.formed(waiting, rows_per_request)
            own = station.service.at(b * rows_per_request)
            h = own + calls_s
            rate.append(min(j, c * b) / h)
            batch.append(b)
            hold.append(h)
        mean_hold = hold[-1] if most else station.service.at(rows_per_request) + calls_s
        own = mean_hold - calls_s
        scv = (station.scv * own * own + calls_var) / (mean_hold * mean_hold)
        return cls(c, tuple(rate), tuple(batch), tuple(hold), scv, most_batch)

    def at(self, j: int) -> int:
        return min(j, len(self.rate) - 1)


@dataclass(frozen=True)
class _Response:
    """A callee as its callers see it: the mean and variance of a call's response, the hold
    of its executions, its instances and the most calls one execution takes."""

    mean: float
    var: float
    hold: float
    instances: float
    most_batch: float = 1.0


@dataclass(frozen=True)
class _Layer:
    """A station solved: per pod, its throughput, response, and what an arrival found."""

    requests_per_s: float
    executions_per_s: float
    busy_instances: float
    response_s: float
    wait_s: float
    wait_var: float
    hold_s: float


def _found_moments(
    server: _Server, found: Sequence[float], random_arrivals: bool
) -> tuple[float, float]:
    """Mean and second moment of the wait, from the distribution of the requests an arrival
    finds: the batches ahead of it leave one per interval of hold / instances (renewal
    departures with the hold's variability).

    An arrival at a random moment (Poisson, or clients that think) waits for what is left of
    the execution under way before the whole intervals after it: the renewal residual, its
    moments those of a gamma-distributed interval (for a fixed hold uniform over the interval:
    a twelfth of its square as variance; for an exponential one the whole interval again).
    Without it, a batch server that every arrival finds busy would wait a fixed time: its
    p95 would fall as its load rises. Clients in step with the executions (a closed loop
    that does not think) come back as a batch leaves and wait whole intervals."""
    cs2 = server.hold_scv
    first_mean, first_var = 1.0, cs2
    if random_arrivals:
        first_mean = (1.0 + cs2) / 2.0
        first_var = (1.0 + cs2) * (1.0 + 2.0 * cs2) / 3.0 - first_mean * first_mean
    mean = second = 0.0
    for j, p in enumerate(found):
        if p <= 0 or j < server.instances:
            continue
        k = server.at(j + 1)
        ahead = max(0.0, j - server.instances * server.batch[k])  # waiting before it
        # It leaves with the first batch that has room for it: the full batches ahead of its
        # own are whole intervals after the first departure (one per request ahead where
        # nothing batches).
        whole = max(0.0, (ahead + 1.0) / server.most_batch - 1.0)
        interval = server.hold[k] / server.instances
        m = (first_mean + whole) * interval
        v = (first_var + whole * cs2) * interval * interval
        mean += p * m
        second += p * (v + m * m)
    return mean, second


def _closed(server: _Server, station: Station, population: float, think_s: float) -> _Layer:
    """Load-dependent MVA (Reiser and Lavenberg) of the server and a delay of `think_s`, at a
    mean population (interpolated between the integers around it).

    Exact for exponential holds. Clients that think between two visits arrive at a random
    moment of the executions under way, and wait for what is left of the first one to end:
    its mean residual, `(1 + cs^2) / 2` of an interval between departures instead of the
    exponential's whole one (the residual-time correction of approximate MVA for FCFS
    stations with general service). Clients that do not think come back the moment their
    batch leaves, in step with the executions: they wait whole intervals, the product form's.
    """
    if population <= 0:
        return _Layer(0.0, 0.0, 0.0, server.hold[1], 0.0, 0.0, server.hold[1])
    residual = (1.0 + server.hold_scv) / 2.0 if think_s > 0 else 1.0
    top = math.ceil(population)
    residence = [0.0, *(_residence(server, j, residual) for j in range(1, top + 1))]
    most = 0.0
    probabilities = [1.0]  # p(j | n), j = 0..n
    results = []
    for n in range(1, top + 1):
        previous = probabilities
        response = sum(residence[j] * previous[j - 1] for j in range(1, n + 1))
        throughput = n / (think_s + response)
        # The residual's correction shortens the response, never beyond what the instances
        # serve with `n` present: a few clients in step with deterministic executions find
        # one under way as often as not (two callers of one instance take turns).
        most = max(most, server.rate[server.at(n)])
        if throughput > most:
            throughput = most
            response = n / most - think_s
        tail = [throughput / server.rate[server.at(j)] * previous[j - 1] for j in range(1, n + 1)]
        total = sum(tail)
        if total > 1.0:  # rounding at a saturated server: renormalise
            tail = [p / total for p in tail]
            total = 1.0
        probabilities = [1.0 - total, *tail]
        if n >= top - 1:  # the populations around the mean asked for
            results.append(
                _layer_at(
                    server, station, throughput, response, previous, probabilities, think_s > 0
                )
            )
    upper = results[-1]
    if top == population or top == 1:
        if top != population:  # a population under one: a share of one client
            return _scaled(upper, population)
        return upper
    lower = results[-2]
    share = population - math.floor(population)
    return _mix(lower, upper, share)


def _residence(server: _Server, j: int, residual: float) -> float:
    """Response of a request with `j` present (itself included): its batch's hold, and the
    departures ahead of it (product form: `j / rate - hold`, in intervals of hold /
    instances), the first of them a `residual` share of an interval."""
    k = server.at(j)
    hold = server.hold[k]
    if j <= server.instances:
        return hold
    interval = hold / server.instances
    departures = max(0.0, j / server.rate[k] - hold) / interval
    return hold + interval * (departures - (1.0 - residual) * min(1.0, departures))


def _layer_at(
    server: _Server,
    station: Station,
    throughput: float,
    response: float,
    found: Sequence[float],
    present: Sequence[float],
    random_arrivals: bool,
) -> _Layer:
    # Requests leave state j at rate[j] in batches of batch[j]: the mean batch and hold are
    # those of the executions that finish.
    requests = sum(p * server.rate[server.at(j)] for j, p in enumerate(present) if j > 0)
    per_execution = [
        (p * server.rate[server.at(j)] / server.batch[server.at(j)], server.hold[server.at(j)])
        for j, p in enumerate(present)
        if j > 0
    ]
    finished = sum(e for e, _ in per_execution)
    batch = requests / finished if finished > 0 else 1.0
    hold = sum(e * h for e, h in per_execution) / finished if finished > 0 else server.hold[1]
    # The marginals are the product form's; where the residual's correction makes the
    # throughput more than their batches carry, the batch is what it takes to carry it.
    batch = max(batch, throughput * hold / server.instances)
    executions = throughput / batch
    busy = executions * hold
    wait_mean, wait_second = _found_moments(server, found, random_arrivals)
    delay = _batcher_delay(station, server, found)
    # The hold of the batch a request runs in is what it spends served; the rest of its
    # response is its wait.
    wait = max(0.0, response - _request_hold(server, found)) + delay
    wait_var = _wait_var(wait - delay, wait_mean, wait_second)
    served = _request_hold(server, found)
    return _Layer(throughput, executions, busy, wait + served, wait, wait_var, hold)


def _batcher_delay(station: Station, server: _Server, found: Sequence[float]) -> float:
    """The dynamic batcher's queue delay, waited by a request that finds an instance free."""
    if not station.batching.dynamic:
        return 0.0
    free = sum(p for j, p in enumerate(found) if j < server.instances)
    return station.batching.queue_delay_s * free


def _request_hold(server: _Server, found: Sequence[float]) -> float:
    """The hold of the batch a request runs in, over what arrivals find."""
    return sum(p * server.hold[server.at(j + 1)] for j, p in enumerate(found))


def _wait_var(mean: float, model_mean: float, model_second: float) -> float:
    """The wait's variance: the shape (squared coefficient of variation) of the departures
    model, the mean of the solver."""
    if model_mean <= 0 or mean <= 0:
        return 0.0
    scv = max(0.0, model_second / (model_mean * model_mean) - 1.0)
    return scv * mean * mean


def _mix(a: _Layer, b: _Layer, share: float) -> _Layer:
    def between(x: float, y: float) -> float:
        return x + (y - x) * share

    return _Layer(*(between(x, y) for x, y in zip(_fields(a), _fields(b), strict=True)))


def _scaled(layer: _Layer, share: float) -> _Layer:
    """One client present a `share` of the time: the rates and the busy instances scale."""
    return replace(
        layer,
        requests_per_s=layer.requests_per_s * share,
        executions_per_s=layer.executions_per_s * share,
        busy_instances=layer.busy_instances * share,
    )


def _fields(layer: _Layer) -> tuple[float, ...]:
    return (
        layer.requests_per_s,
        layer.executions_per_s,
        layer.busy_instances,
        layer.response_s,
        layer.wait_s,
        layer.wait_var,
        layer.hold_s,
    )


def _open(server: _Server, station: Station, arrival_rps: float) -> _Layer | None:
    """The birth-death chain of the server under Poisson arrivals (M/M/c where nothing
    batches), its queueing wait corrected for the hold's variability (Allen-Cunneen, Poisson
    arrivals: `(1 + cs^2) / 2`); None where the arrivals reach what it serves."""
    last = len(server.rate) - 1
    rho = arrival_rps / server.rate[last]
    if rho >= 1.0:
        return None
    weights = [1.0]
    for j in range(1, last + 1):
        weights.append(weights[-1] * arrival_rps / server.rate[j])
    # Beyond the last state the rate stands: a geometric tail, summed in closed form.
    tail_mass = weights[-1] * rho / (1 - rho)
    tail_in_system = weights[-1] * (rho * (last + 1) - rho * rho * last) / (1 - rho) ** 2
    total = sum(weights) + tail_mass
    probabilities = [w / total for w in weights]
    in_system = sum(j * p for j, p in enumerate(probabilities)) + tail_in_system / total
    # The tail's states behave as the last one: folded into it (PASTA: what arrivals find).
    found = [*probabilities[:-1], probabilities[-1] + tail_mass / total]
    layer = _layer_at(
        server, station, arrival_rps, in_system / arrival_rps, found, found, random_arrivals=True
    )
    factor = (1.0 + server.hold_scv) / 2.0
    hold = layer.response_s - layer.wait_s
    delay = _batcher_delay(station, server, found)
    queue_wait = (layer.wait_s - delay) * factor
    return replace(
        layer,
        wait_s=queue_wait + delay,
        wait_var=layer.wait_var * factor * factor,
        response_s=queue_wait + delay + hold,
    )


# ---- the expected maximum of async calls -----------------------------------------------


def _shifted_exponential(mean: float, var: float) -> tuple[float, float]:
    """(shift, exponential mean) with this mean and variance (an exponential where the
    variance reaches the squared mean)."""
    spread = math.sqrt(max(0.0, var))
    if spread >= mean:
        return 0.0, mean
    return mean - spread, spread


def expected_max(calls: Sequence[tuple[float, float, float]]) -> tuple[float, float]:
    """Mean and variance of the slowest of independent calls, each (probability it is
    made, mean response, variance), each a shifted exponential; a call not made takes 0.

    Exact: between two shifts the distribution of the slowest is a product of terms
    `1 - q e^(-(t - shift) / scale)` (a call under way), `1 - q` (one not begun) and 1 (a
    fixed one that has ended); expanded, a sum of exponentials of t over the subsets of the
    calls under way, whose integrals `E[max] = integral of (1 - F(t)) dt` and
    `E[max^2] = integral of 2t (1 - F(t)) dt` have closed forms. Its cost grows as 2^n in the
    n calls with a spread (a parent's distinct children, about 16 terms for 4)."""
    shapes = [(q, *_shifted_exponential(m, v)) for q, m, v in calls if q > 0 and m > 0]
    if not shapes:
        return 0.0, 0.0
    points = sorted({0.0, *(shift for _, shift, _ in shapes)})
    first = second = 0.0
    for index, low in enumerate(points):
        high = points[index + 1] if index + 1 < len(points) else math.inf
        # On [low, high): the calls not begun and those under way (their terms at `low`).
        constant = 1.0
        terms = [(1.0, 0.0)]  # (coefficient, rate): F(t) = constant * sum c e^(-rate (t - low))
        for q, shift, scale in shapes:
            if shift > low:
                constant *= 1.0 - q
            elif scale > 0:
                factor = q * math.exp(-(low - shift) / scale)
                terms += [(-c * factor, rate + 1.0 / scale) for c, rate in terms]
        first_piece, second_piece = _survival_moments(low, high, constant, terms)
        first += first_piece
        second += second_piece
    return first, max(0.0, second - first * first)


def _survival_moments(
    low: float, high: float, constant: float, terms: Sequence[tuple[float, float]]
) -> tuple[float, float]:
    """The integrals of `1 - F(t)` and `2t (1 - F(t))` over [low, high), where
    `F(t) = constant * sum of c e^(-rate (t - low))` (`high` infinite: F reaches 1 there)."""
    length = high - low
    first = second = 0.0
    if math.isfinite(length):
        first = length
        second = high * high - low * low
    for c, rate in terms:
        weight = -constant * c
        if rate == 0.0:
            if math.isfinite(length):
                first += weight * length
                second += weight * (high * high - low * low)
            continue
        decayed = math.exp(-rate * length) if math.isfinite(length) else 0.0
        # integral of e^(-rate u) and of (low + u) e^(-rate u), u from 0 to the length.
        plain = (1.0 - decayed) / rate
        tail = 0.0 if not math.isfinite(length) else length * decayed
        moment = low * plain + (plain - tail) / rate
        first += weight * plain
        second += weight * 2.0 * moment
    return first, second


# ---- the layered fixed point ----------------------------------------------------------


def closed_loop(network: Network, clients: float, think_s: float = 0.0) -> Prediction:
    """`clients` requests in flight at the root over all pods, each sent again `think_s`
    after its answer."""
    prediction = _solve(network, clients / network.pods, think_s, None)
    assert prediction is not None  # a closed loop always has a solution
    return prediction


def open_loop(network: Network, arrival_rps: float) -> Prediction:
    """Poisson arrivals at the root, `arrival_rps` over all pods. Where they exceed what the
    split serves, the throughput is its capacity (the most a closed loop would serve) and the
    latencies are infinite."""
    prediction = _solve(network, None, 0.0, arrival_rps / network.pods)
    if prediction is not None:
        return prediction
    saturated = capacity(network)
    return replace(saturated, mean_latency_s=math.inf, p95_latency_s=math.inf)


def capacity(network: Network) -> Prediction:
    """The most the split serves: a closed loop with as many clients as keep every instance
    of the root on its largest batch with as many waiting (`b = j / (c + 1)` at its largest);
    more would only wait."""
    root = network.stations[network.root]
    most = root.batching.most_requests(root.rows_per_request)
    return closed_loop(network, (root.instances + 1) * most * network.pods)


def _solve(
    network: Network, clients: float | None, think_s: float, arrival_rps: float | None
) -> Prediction | None:
    """The layered fixed point: each round solves the layers top down (a callee's clients
    are its callers as the round found them), then sets each parent's wait for its calls
    from its callees' responses, bottom up. None: open arrivals the root cannot serve."""
    order = network.order()
    stations = network.stations
    # Per station: its calls' mean and variance per execution (0 for a leaf); start from
    # the callees' own work without a queue.
    calls_s = dict.fromkeys(order, 0.0)
    calls_var = dict.fromkeys(order, 0.0)
    responses: dict[str, _Response] = {}
    for name in reversed(order):
        calls_s[name], calls_var[name] = _wait_for_calls(stations[name], responses)
        hold = stations[name].service.at(1.0) + calls_s[name]
        responses[name] = _Response(hold, calls_var[name], hold, stations[name].instances)
    layers: dict[str, _Layer] = {}
    servers: dict[str, _Server] = {}
    rows: dict[str, float] = {}
    rounds = 0
    converged = False
    # The share of a step the waits move by (the first round's whole) and the last round's
    # residuals.
    step, last = 1.0, {}
    for rounds in range(1, MAX_ROUNDS + 1):
        for name in order:
            station = stations[name]
            if name == network.root:
                rows[name] = station.rows_per_request
                most = _states(station, rows[name], clients)
                back = _back_in_time(station, think_s) if clients is not None else 0.0
                server = _Server.of(station, rows[name], calls_s[name], calls_var[name], most, back)
                if clients is None:
                    layer = _open(server, station, arrival_rps or 0.0)
                    if layer is None:
                        return None
                else:
                    layer = _closed(server, station, clients, think_s)
            else:
                layer, server, rows[name] = _child(
                    network, station, layers, rows, responses, calls_s[name], calls_var[name]
                )
            layers[name], servers[name] = layer, server
            hold = _request_hold_of(layer)
            responses[name] = _Response(
                layer.response_s,
                layer.wait_var + server.hold_scv * hold * hold,
                hold,
                station.instances,
                server.most_batch,
            )
        moved = 0.0  # the largest residual: how far a parent's wait is from its calls'
        residuals = {}
        for name in reversed(order):
            mean, var = _wait_for_calls(stations[name], responses)
            if calls_s[name] > 0:
                residuals[name] = (mean - calls_s[name]) / calls_s[name]
                moved = max(moved, abs(residuals[name]))
            calls_s[name] += step * (mean - calls_s[name])
            calls_var[name] += step * (var - calls_var[name])
        if rounds > 2 and step * moved < TOLERANCE / 2:
            converged = True
            break
        # A child's queue and its callers' holds feed each other. Half a step from the second
        # round on; where the residuals turn back against the last round's (two states take
        # turns: a steep feedback, or a jump of the map between them) the step is halved, and
        # doubled again, up to half, while they keep their direction: under-relaxation that
        # ends at the fixed point, or at the jump where there is none.
        turned = sum(r * last.get(name, 0.0) for name, r in residuals.items()) < 0
        step = 0.5 if rounds == 1 else (step / 2 if turned else min(0.5, 2 * step))
        last = residuals
    return _prediction(network, order, layers, servers, rounds, converged)


def _request_hold_of(layer: _Layer) -> float:
    return layer.response_s - layer.wait_s


def _states(station: Station, rows_per_request: float, population: float | None) -> int:
    """How many requests the server's rates are tabled for: its whole population, or (open)
    until its rate stands (every instance at the largest batch)."""
    most = station.batching.most_requests(rows_per_request)
    standing = math.ceil(most * (station.instances + 1)) + 1
    if population is None:
        return standing
    return max(1, math.ceil(population))


def _child(
    network: Network,
    station: Station,
    layers: Mapping[str, _Layer],
    rows: Mapping[str, float],
    responses: Mapping[str, _Response],
    calls_s: float,
    calls_var: float,
) -> tuple[_Layer, _Server, float]:
    """A callee's layer: its clients are its callers' busy instances, each with its calls
    out (async: all at once; sync: one), thinking between two calls for the rest of its
    caller's hold."""
    population = 0.0
    calls_per_s = 0.0
    rows_weighted = 0.0
    for caller, call in network.callers(station.name):
        layer = layers.get(caller.name)
        if layer is None or layer.executions_per_s <= 0:
            continue
        per_s = layer.executions_per_s * call.per_execution
        batch = layer.requests_per_s / layer.executions_per_s
        out = call.per_execution if not caller.sequential else min(1.0, call.per_execution)
        population += layer.busy_instances * out
        calls_per_s += per_s
        rows_weighted += per_s * batch * rows[caller.name] * call.rows_share
    rows_per_call = rows_weighted / calls_per_s if calls_per_s > 0 else 1.0
    if calls_per_s <= 0:
        server = _Server.of(station, rows_per_call, calls_s, calls_var, 1, 0.0)
        idle = _Layer(0.0, 0.0, 0.0, server.hold[1], 0.0, 0.0, server.hold[1])
        return idle, server, rows_per_call
    think = max(0.0, population / calls_per_s - responses[station.name].mean)
    server = _Server.of(
        station,
        rows_per_call,
        calls_s,
        calls_var,
        max(1, math.ceil(population)),
        _back_in_time(station, think),
    )
    return _closed(server, station, population, think), server, rows_per_call


def _back_in_time(station: Station, think_s: float) -> float:
    """The share of a batch that leaves and is back before the instance it left takes its
    next batch: the dynamic batcher waits up to its queue delay for company, and a client
    thinks `think_s` (taken as exponential) before it sends again."""
    if think_s <= 0:
        return 1.0
    if not station.batching.dynamic:
        return 0.0
    return 1.0 - math.exp(-station.batching.queue_delay_s / think_s)


def _wait_for_calls(station: Station, responses: Mapping[str, _Response]) -> tuple[float, float]:
    """Mean and variance of the time an execution waits for its calls."""
    if not station.calls:
        return 0.0, 0.0
    if station.sequential:
        mean = sum(c.per_execution * responses[c.child].mean for c in station.calls)
        var = sum(c.per_execution * responses[c.child].var for c in station.calls)
        return mean, var
    made: list[tuple[float, float, float]] = []
    for call in station.calls:
        r = responses[call.child]
        made += _siblings(call.per_execution, r.mean, r.var, r.hold, r.instances, r.most_batch)
    return expected_max(made)


def _siblings(
    per_execution: float,
    mean: float,
    var: float,
    hold: float,
    instances: float,
    most_batch: float,
) -> list[tuple[float, float, float]]:
    """The calls of one execution to one child as (probability, mean, variance) for
    `expected_max`. They arrive together, so they are not independent: as the batch forms
    (the module's docstring), at most `instances` of them run alone at once and the rest wait
    for an instance and go in batches of at most `most_batch`: 1 + ceil((calls - instances) /
    (instances x most_batch)) of the child's executions one after another, the last ending
    (that - 1) / 2 holds after their mean. A share of a call left over is a call of its own,
    made for that share of the executions."""
    whole = math.floor(per_execution + 1e-9)
    share = per_execution - whole
    made = []
    if whole >= 1:
        alone = max(1.0, instances)
        rounds = 1 + math.ceil(max(0.0, whole - alone) / (alone * max(1.0, most_batch)) - 1e-9)
        made.append((1.0, mean + (rounds - 1) * hold / 2, var))
    if share > 1e-9:
        made.append((share, mean, var))
    return made


def _prediction(
    network: Network,
    order: Sequence[str],
    layers: Mapping[str, _Layer],
    servers: Mapping[str, _Server],
    rounds: int,
    converged: bool,
) -> Prediction:
    pods = network.pods
    root = layers[network.root]
    throughput = root.requests_per_s * pods
    results = {}
    for name in order:
        layer = layers[name]
        instances = network.stations[name].instances
        results[name] = StationResult(
            requests_per_s=layer.requests_per_s * pods,
            executions_per_s=layer.executions_per_s * pods,
            mean_batch=(
                layer.requests_per_s / layer.executions_per_s if layer.executions_per_s else 1.0
            ),
            hold_s=layer.hold_s,
            response_s=layer.response_s,
            wait_s=layer.wait_s,
            utilization=min(1.0, layer.busy_instances / instances),
            visits=layer.requests_per_s / root.requests_per_s if root.requests_per_s else 0.0,
        )
    mean = root.response_s
    hold = _request_hold_of(root)
    var = root.wait_var + servers[network.root].hold_scv * hold * hold
    return Prediction(throughput, mean, gamma_quantile(mean, var), results, rounds, converged, var)


def gamma_quantile(mean: float, var: float, z: float = P95_Z) -> float:
    """The quantile of a gamma distribution with this mean and variance (Wilson and
    Hilferty: its cube root is near normal); the mean where there is no spread."""
    if mean <= 0 or var <= 0:
        return mean
    shape = mean * mean / var
    scale = var / mean
    term = 1.0 - 1.0 / (9.0 * shape) + z * math.sqrt(1.0 / (9.0 * shape))
    return shape * scale * max(0.0, term) ** 3


# ---- the inputs, from what the pipeline model measures ---------------------------------


def fit_service(points: Sequence[tuple[float, float]]) -> ServiceTime:
    """`fixed_s + per_row_s * rows` by least squares over (rows, seconds) per window, both
    parts at least 0. Windows whose rows differ by less than the noise (NOISE_FLOOR) saw one
    batch size: the time is then all fixed (see the module's docstring)."""
    if not points:
        return ServiceTime(0.0)
    rows = [x for x, _ in points]
    seconds = [y for _, y in points]
    mean_x = math.fsum(rows) / len(rows)
    mean_y = math.fsum(seconds) / len(seconds)
    if max(rows) - min(rows) <= NOISE_FLOOR * mean_x:
        return ServiceTime(max(0.0, mean_y))
    sxx = math.fsum((x - mean_x) ** 2 for x in rows)
    sxy = math.fsum((x - mean_x) * (y - mean_y) for x, y in points)
    slope = sxy / sxx
    intercept = mean_y - slope * mean_x
    if slope < 0:
        return ServiceTime(max(0.0, mean_y))
    if intercept < 0:  # through the origin
        return ServiceTime(
            0.0, math.fsum(x * y for x, y in points) / math.fsum(x * x for x in rows)
        )
    return ServiceTime(intercept, slope)


def from_history(
    history: PipelineHistory,
    calls: Mapping[str, Sequence[str]],
    root: str,
    configs: Mapping[str, Mapping[str, Any]] | None = None,
    sequential: Collection[str] = (),
    execution_scv: float = EXECUTION_SCV,
) -> Network:
    """The network of `root`'s pipeline from the windows the operator keeps (pipeline_model's
    `PipelineHistory`), at the counts of its latest window.

    `calls`: each BLS model's callees (its spec's `calls`); `configs`: each model's config as
    Triton serves it (its batching; a model left out batches as one request a batch);
    `sequential`: the parents that call one after another (sync BLS; async otherwise);
    `execution_scv`: the executions' variability where something else is known of it.
    Raises ValueError where a model of the pipeline has no window that served it.
    """
    configs = configs or {}
    if not history.windows:
        raise ValueError("no window measured yet")
    latest = history.windows[-1]
    names = _reachable(root, calls)
    stations: dict[str, Station] = {}
    for name in names:
        served = [
            w
            for w in history.windows
            if _serves(w.readings.get(name)) and w.counts.get(name) is not None
        ]
        if not served:
            raise ValueError(f"no window measured {name} serving")
        children = [c for c in calls.get(name, ()) if c in names]
        points = []
        for w in served:
            reading = w.readings[name]
            rows = reading.mean_batch * (reading.rows_per_request or 1.0)
            waited = _measured_wait(w, name, children, name in sequential, execution_scv, configs)
            points.append((rows, max(0.0, reading.execution_s - waited)))
        made = tuple(_call(history, name, child, calls) for child in children)
        rows_per_request = _mean([w.readings[name].rows_per_request or 1.0 for w in served])
        stations[name] = Station(
            name=name,
            instances=latest.counts.get(name, served[-1].counts[name]),
            service=fit_service(points),
            batching=BatchPolicy.of_config(configs.get(name, {})),
            rows_per_request=rows_per_request,
            calls=made,
            sequential=name in sequential,
            scv=execution_scv,
        )
    pods = max(1, latest.readings[root].pods if root in latest.readings else 1)
    return Network(stations, root, pods)


def _reachable(root: str, calls: Mapping[str, Sequence[str]]) -> list[str]:
    found: list[str] = []
    stack = [root]
    while stack:
        name = stack.pop()
        if name not in found:
            found.append(name)
            stack.extend(calls.get(name, ()))
    return found


def _serves(reading: Reading | None) -> bool:
    return reading is not None and reading.request_rate > 0 and reading.execution_rate > 0


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else 0.0


def _measured_wait(
    window: Window,
    name: str,
    children: Sequence[str],
    sequential: bool,
    execution_scv: float,
    configs: Mapping[str, Mapping[str, Any]],
) -> float:
    """What an execution of `name` waited for its calls in the window, from each child's time
    in model (queue and execution per request): their sum for a sync parent; for an async one
    the expected max, each call's response with its queue's spread (as an exponential's) and
    its execution's (`execution_scv`), as the model takes a response (the calls to one child
    as `_siblings` has them, its batches as its config in `configs` forms them)."""
    parent = window.readings[name]
    made: list[tuple[float, float, float]] = []
    waited = 0.0
    for child in children:
        reading = window.readings.get(child)
        if reading is None or not _serves(reading) or parent.execution_rate <= 0:
            continue
        per_execution = reading.arrival_rate / parent.execution_rate
        queue = reading.queue_seconds_per_second / reading.request_rate
        waited += per_execution * reading.time_in_model_s
        most_batch = BatchPolicy.of_config(configs.get(child, {})).most_requests(
            reading.rows_per_request or 1.0
        )
        var = queue * queue + execution_scv * reading.execution_s**2
        made += _siblings(
            per_execution,
            reading.time_in_model_s,
            var,
            reading.execution_s,
            window.counts.get(child, 1),
            most_batch,
        )
    return waited if sequential else expected_max(made)[0]


def _call(
    history: PipelineHistory, caller: str, child: str, calls: Mapping[str, Sequence[str]]
) -> Call:
    """The calls per execution of `caller` to `child` and the rows they carry, over the
    windows where both served. A child of several callers: its calls over all their
    executions (one mix cannot tell the callers apart)."""
    per_execution, shares = [], []
    for w in history.windows:
        reading = w.readings.get(child)
        parents = [p for p, cs in calls.items() if child in cs and _serves(w.readings.get(p))]
        if not _serves(reading) or caller not in parents:
            continue
        executions = sum(w.readings[p].execution_rate for p in parents)
        per_execution.append(reading.arrival_rate / executions)
        caller_reading = w.readings[caller]
        caller_rows = caller_reading.mean_batch * (caller_reading.rows_per_request or 1.0)
        child_rows = reading.rows_per_request
        if child_rows is not None and caller_rows > 0:
            shares.append(child_rows / caller_rows)
    return Call(child, _mean(per_execution) or 1.0, _mean(shares) or 1.0)
