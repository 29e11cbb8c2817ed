"""The queues in virtual time: a discrete-event simulation of one pod serving a pipeline.

Each model is `count` instances (servers) behind one FIFO queue. A free instance takes the
queue's head and, with a dynamic batcher, the requests behind it up to `max_batch_rows`; the
execution takes the shape's time for those rows. A BLS parent keeps its instance until the
calls it made have answered (pipeline.py), so its busy time includes the wait, as Triton
measures it; a called model may itself be such a parent, so a call tree holds an instance at
every level down to the model that answers. A conditional call goes out with the rows of the
requests that make it, drawn per request from the simulation's seeded generator. Requests come open-loop (arrival times given in advance, `offer`) or closed-loop
(`closed_loop`: each client sends again as soon as it is answered).

Counters follow Triton's (tritonscale.metrics.queries): on completion, a request adds one
success, its rows to the inference count, its queue time (arrival to the start of its
execution) and its execution's whole duration (Triton charges a batch's compute to each
request in it); an execution adds one to the execution count. `pending` is what waits in the
queue, not what executes. A request older than the client's timeout when an instance would
take it is dropped as a failure (its client gave up; pipeline_async answers it CANCELLED
without work).

Where asked (`record`), an entry model keeps each request's arrival and latency (arrival to
the end of its execution, its calls answered; None for a request dropped), so that a window's
quantiles can be measured.

A change of count takes effect when its load completes (`set_count(..., at=...)`): an added
instance takes work at once; a removed one finishes what it executes first.

Nothing sleeps: `run_until(t)` processes the events up to virtual time `t`.
"""

from __future__ import annotations

import heapq
import itertools
import random
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from loadtests.sim.pipeline import ModelShape, Pipeline

CLIENT_TIMEOUT_S = 30.0  # tritonscale.local.loadgen's default request deadline


@dataclass
class Counters:
    """One model's cumulative counters, as Triton exports them."""

    success: float = 0.0
    failure: float = 0.0
    executions: float = 0.0
    compute_s: float = 0.0
    queue_s: float = 0.0
    inferences: float = 0.0  # rows of the requests that succeeded (nv_inference_count)

    def copy(self) -> Counters:
        return replace(self)


def _service(shape: ModelShape, rng: random.Random) -> Callable[[int], float]:
    """Seconds an execution of so many rows takes: fixed, or drawn around that mean."""
    if shape.service == "exponential":
        return lambda rows: rng.expovariate(1.0 / shape.execute_s(rows))
    known: dict[int, float] = {}  # the few batch sizes a run sees, computed once each

    def fixed(rows: int) -> float:
        seconds = known.get(rows)
        if seconds is None:
            seconds = known[rows] = shape.execute_s(rows)
        return seconds

    return fixed


class _Model:
    """A model's instances, queue and counters inside one simulation."""

    # Slots: the events read these attributes millions of times a run.
    __slots__ = (
        "shape",
        "count",
        "busy",
        "queue",
        "counters",
        "rows_per_request",
        "service_s",
        "arrivals",
        "next_arrival",
        "wake_at",
        "closed_loop",
        "called",
        "unconditional",
        "entry",
        "call_limit",
        "answered",
    )

    def __init__(self, shape: ModelShape, count: int, rng: random.Random) -> None:
        self.shape = shape
        self.count = count  # instances that take new work
        self.busy = 0  # instances executing
        self.queue: deque = deque()
        self.counters = Counters()
        self.rows_per_request = 1
        self.service_s = _service(shape, rng)
        # Open-loop arrivals not yet queued (sorted), and the index of the next one.
        self.arrivals: list[float] = []
        self.next_arrival = 0
        self.wake_at: float | None = None
        self.closed_loop = False
        # (child, share of requests that call it): one per BLS call of an execution, in order
        self.called: list[tuple[_Model, float]] = []
        self.unconditional = True  # every request makes every call
        self.entry = False  # takes the clients' requests (else: the calls of BLS parents)
        # The rows of calls a dynamic batcher joins (0: one call an execution).
        self.call_limit = shape.max_batch_rows if shape.batcher else 0
        # (arrival, latency or None when dropped) per request, where recorded (`record`)
        self.answered: list[tuple[float, float | None]] | None = None


class Simulation:
    """One pod serving `pipeline` with `counts` instances, from virtual time 0."""

    def __init__(
        self,
        pipeline: Pipeline,
        counts: Mapping[str, int],
        *,
        rows_per_request: int = 8,
        seed: int = 0,
        client_timeout_s: float = CLIENT_TIMEOUT_S,
    ) -> None:
        self.pipeline = pipeline
        self.now = 0.0
        self.client_timeout_s = client_timeout_s
        self._rng = random.Random(seed)
        self._models = {
            name: _Model(shape, counts[name], self._rng) for name, shape in pipeline.models.items()
        }
        for state in self._models.values():
            shape = state.shape
            state.called = [
                (self._models[child], shape.call_share.get(child, 1.0))
                for child, times in shape.calls.items()
                for _ in range(times)
            ]
            state.unconditional = all(share >= 1.0 for _, share in state.called)
        for entry in pipeline.entries:
            self._models[entry].rows_per_request = rows_per_request
            self._models[entry].entry = True
        self._events: list = []
        self._sequence = itertools.count()

    # ---- what a driver does ------------------------------------------------------------

    def offer(self, model: str, arrival_times: Sequence[float]) -> None:
        """Open-loop requests to an entry model at these (sorted) virtual times."""
        state = self._models[model]
        state.arrivals = list(arrival_times)
        state.next_arrival = 0
        self._wake(state)

    def closed_loop(self, model: str, clients: int) -> None:
        """`clients` requests in flight from now on: each answer sends the next at once."""
        state = self._models[model]
        state.closed_loop = True
        state.queue.extend([self.now] * clients)
        self._start(state)

    def record(self, model: str) -> list[tuple[float, float | None]]:
        """From now on, each request of the entry `model` that ends (answered or dropped) adds
        (its arrival, its latency or None) to the list returned, in the order they end."""
        state = self._models[model]
        if not state.entry:
            raise ValueError(f"{model} is not an entry model: its requests come from callers")
        state.answered = []
        return state.answered

    def set_count(self, model: str, count: int, at: float | None = None) -> None:
        """The model's count becomes `count` at `at` (default now), when its load completes."""
        if count < 1:
            raise ValueError(f"{model}: a count below 1 ({count}) cannot serve")
        if at is None or at <= self.now:
            self._apply_count(self._models[model], count)
        else:
            self._push(at, self._count_event, (model, count))

    def set_shape(self, shape: ModelShape) -> None:
        """The model's cost changes now (executions already under way keep theirs)."""
        state = self._models[shape.name]
        state.shape = replace(shape, calls=state.shape.calls, call_share=state.shape.call_share)
        state.service_s = _service(state.shape, self._rng)
        state.call_limit = state.shape.max_batch_rows if state.shape.batcher else 0

    def run_until(self, t: float) -> None:
        """Process every event up to virtual time `t`."""
        events = self._events
        pop = heapq.heappop
        while events and events[0][0] <= t:
            when, _, handler, argument = pop(events)
            self.now = when
            handler(argument)
        self.now = t
        for state in self._models.values():
            self._feed(state)

    def count(self, model: str) -> int:
        return self._models[model].count

    def counts(self) -> dict[str, int]:
        return {name: state.count for name, state in self._models.items()}

    def counters(self) -> dict[str, Counters]:
        """Every model's cumulative counters now (copies)."""
        return {name: state.counters.copy() for name, state in self._models.items()}

    def pending(self, model: str) -> int:
        """Requests queued for an instance now (nv_inference_pending_request_count)."""
        state = self._models[model]
        self._feed(state)
        return len(state.queue)

    # ---- the machinery -----------------------------------------------------------------

    def _push(self, when: float, handler: Callable, argument: object) -> None:
        heapq.heappush(self._events, (when, next(self._sequence), handler, argument))

    def _count_event(self, argument: tuple[str, int]) -> None:
        model, count = argument
        self._apply_count(self._models[model], count)

    def _apply_count(self, state: _Model, count: int) -> None:
        state.count = count
        self._feed(state)
        self._start(state)

    def _feed(self, state: _Model) -> None:
        """Queue the open-loop arrivals that have come by now."""
        arrivals = state.arrivals
        if state.next_arrival < len(arrivals) and arrivals[state.next_arrival] <= self.now:
            upto = bisect_right(arrivals, self.now, state.next_arrival)
            state.queue.extend(arrivals[state.next_arrival : upto])
            state.next_arrival = upto

    def _wake(self, state: _Model) -> None:
        """With an instance idle and nothing queued, be back at the next arrival."""
        if state.next_arrival >= len(state.arrivals):
            return
        when = state.arrivals[state.next_arrival]
        if state.wake_at is not None and state.wake_at <= when:
            return
        state.wake_at = when
        self._push(when, self._woken, state)

    def _woken(self, state: _Model) -> None:
        if state.wake_at == self.now:
            state.wake_at = None
        self._feed(state)
        self._start(state)

    def _start(self, state: _Model) -> None:
        """Free instances take work from the queue."""
        if state.entry:
            self._start_requests(state)
        else:
            self._start_calls(state)

    def _start_requests(self, state: _Model) -> None:
        """An entry model: batches of client requests (arrival times)."""
        queue = state.queue
        shape = state.shape
        per_batch = max(1, shape.max_batch_rows // state.rows_per_request) if shape.batcher else 1
        now = self.now
        oldest = now - self.client_timeout_s
        while state.busy < state.count:
            while queue and queue[0] < oldest:
                dropped = queue.popleft()
                state.counters.failure += 1
                if state.answered is not None:
                    state.answered.append((dropped, None))
                if state.closed_loop:
                    queue.append(now)
            if not queue:
                self._wake(state)
                return
            taken = min(per_batch, len(queue))
            arrivals = [queue.popleft() for _ in range(taken)]
            rows = taken * state.rows_per_request
            state.busy += 1
            # [model, started, its requests, calls awaited, rows, calls still to make in turn]
            execution = [state, now, arrivals, 0, rows, None]
            then = self._calls_out if state.called else self._finish_execution
            heapq.heappush(
                self._events, (now + state.service_s(rows), next(self._sequence), then, execution)
            )

    def _calls_out(self, execution: list) -> None:
        """An execution's own work is done: its BLS calls go out (together, or the first one),
        each with the rows of the requests that make it."""
        state = execution[0]
        rows = execution[4]
        if state.unconditional:
            calls = [(child, rows) for child, _ in state.called]
        else:
            # The rows of each of the execution's requests: a request makes a conditional
            # call with its share's probability, each of its calls to that child drawn alone.
            each = (
                [state.rows_per_request] * len(execution[2])
                if state.entry
                else [call[1] for call in execution[2]]
            )
            random = self._rng.random
            calls = []
            for child, share in state.called:
                if share >= 1.0:
                    calls.append((child, rows))
                    continue
                chosen = sum(r for r in each if random() < share)
                if chosen:
                    calls.append((child, chosen))
            if not calls:
                self._done(execution)
                return
        if state.shape.sequential:
            calls.reverse()  # made from the end: the first call last
            execution[5] = calls
            execution[3] = 1
            child, call_rows = calls.pop()
            self._call(child, call_rows, execution)
            return
        execution[3] = len(calls)
        for child, call_rows in calls:
            self._call(child, call_rows, execution)

    def _call(self, child: _Model, rows: int, execution: list) -> None:
        child.queue.append((self.now, rows, execution))
        if child.busy < child.count:
            self._start_calls(child)

    def _start_calls(self, state: _Model) -> None:
        """A called model: batches of calls (arrival, rows, the caller's execution)."""
        queue = state.queue
        limit = state.call_limit
        now = self.now
        then = self._calls_out if state.called else self._calls_done
        events, sequence, service_s = self._events, self._sequence, state.service_s
        while state.busy < state.count and queue:
            first = queue.popleft()
            batch = [first]
            rows = first[1]
            while queue and rows + queue[0][1] <= limit:
                call = queue.popleft()
                batch.append(call)
                rows += call[1]
            state.busy += 1
            heapq.heappush(
                events,
                (now + service_s(rows), next(sequence), then, [state, now, batch, 0, rows, None]),
            )

    def _done(self, execution: list) -> None:
        if execution[0].entry:
            self._finish_execution(execution)
        else:
            self._calls_done(execution)

    def _calls_done(self, execution: list) -> None:
        """A called model's execution is done: its callers hear back."""
        state, started, batch = execution[0], execution[1], execution[2]
        now = self.now
        counters = state.counters
        duration = now - started
        counters.executions += 1
        counters.success += len(batch)
        counters.compute_s += duration * len(batch)
        for arrived, rows, _ in batch:
            counters.queue_s += started - arrived
            counters.inferences += rows
        state.busy -= 1
        if state.queue:
            self._start_calls(state)
        for _, _, caller in batch:
            # One of the caller's calls answered: the next in turn goes out, or it is done.
            caller[3] -= 1
            if caller[3] == 0:
                order = caller[5]
                if order:
                    caller[3] = 1
                    child, rows = order.pop()
                    self._call(child, rows, caller)
                elif caller[0].entry:
                    self._finish_execution(caller)
                else:
                    self._calls_done(caller)

    def _finish_execution(self, execution: list) -> None:
        state, started, arrivals = execution[0], execution[1], execution[2]
        now = self.now
        counters = state.counters
        taken = len(arrivals)
        counters.executions += 1
        counters.success += taken
        counters.inferences += taken * state.rows_per_request
        counters.compute_s += (now - started) * taken
        counters.queue_s += started * taken - sum(arrivals)
        if state.answered is not None:
            state.answered.extend((arrival, now - arrival) for arrival in arrivals)
        state.busy -= 1
        if state.closed_loop:
            state.queue.extend([now] * taken)
        self._feed(state)
        self._start_requests(state)
