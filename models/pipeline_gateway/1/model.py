"""pipeline_gateway: the async pipeline as a decoupled model with its own micro-batcher.

The interface and outputs of pipeline_async and pipeline_sync (FEATURES [n, 64]
-> EMBEDDING [n, 16], LABEL_PROBS [n, 8], SCORE [n, 1]), bit for bit: this
file loads pipeline_async's model.py and reuses its steps. What differs is how
requests meet:

- Decoupled. python_backend runs a decoupled model's `async def execute` in
  the background on the stub's event loop and hands the instance its next
  requests at once, so one instance works on many requests at the same time
  (a non-decoupled model runs one execute to its end before the next). Each
  request is answered through its response sender: exactly one response, a
  result or an error, flagged final.
- Micro-batched. Left alone, each of those overlapping requests would make its
  own three small branch calls, and small BLS calls cost CPU that batching
  saves. So each admitted request joins a pending batch, which is sent to the
  branches as one batch when its first request has waited `batch_window_us`,
  or as soon as it holds `max_batch_rows` rows. `max_batch_rows` 1 turns
  batching off (the plain decoupled gateway, kept as a benchmark variant).
- Counted by itself. Triton counts each request done as soon as execute has
  started, so its counters see this model as idle at any load. The model
  exports the requests it holds, admitted and not yet answered, as the gauge
  `tritonscale_model_streams_in_flight{model, version}` (python_backend's
  custom metrics); the operator sizes it by that gauge.

What happens to one request:

1. Admit (pipeline_async's `check`): a cancelled or invalid request is
   answered at once with CANCELLED or INVALID_ARG, and never joins a batch.
2. Wait in the pending batch (at most `batch_window_us`).
3. When the batch goes: cancellation is checked again, and a request whose
   client gave up in the meantime is answered CANCELLED and sends no branch
   work. The others are pre-processed and fanned out to the three branches at
   once (pipeline_async's `fan_out`: each BLS request with `branch_timeout_us`,
   every failure, exception or missing output turned into one error naming the
   branch), and the whole wait is bounded by `answer_deadline_us`.
4. Before answering, cancellation is checked once more. A branch failure
   answers every request of that batch (they shared its calls) with the
   branch's error; other batches, and requests still waiting, are untouched.

Nothing escapes a request's coroutine: whatever goes wrong, its client gets
an error response instead of waiting for ever.
"""

import asyncio
import importlib.util
import json
import os
from concurrent.futures import ThreadPoolExecutor

import triton_python_backend_utils as pb_utils

# models/pipeline_gateway/1/model.py -> models/pipeline_async/1/model.py. No
# realpath: a repository mounted from ConfigMaps is made of symlinks.
_ASYNC_MODEL = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "pipeline_async",
    "1",
    "model.py",
)
if not os.path.isfile(_ASYNC_MODEL):
    raise pb_utils.TritonModelException(
        f"pipeline_gateway reuses pipeline_async's steps, but {_ASYNC_MODEL} is missing: "
        "keep both models in the same model repository"
    )
_spec = importlib.util.spec_from_file_location("pipeline_async_model", _ASYNC_MODEL)
pipeline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pipeline)

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# The gauge the operator sizes decoupled models by (tritonscale.metrics.queries).
STREAMS_IN_FLIGHT = "tritonscale_model_streams_in_flight"


class Pending:
    """A request waiting in the micro-batcher, and the future its outputs arrive on."""

    def __init__(self, request, features, future):
        self.request = request
        self.features = features
        self.future = future


class MicroBatcher:
    """Gathers the rows of concurrent requests into batches for `run_batch`.

    A pending batch goes to the branches:
    - at once when it holds `max_rows` rows (a request that would take it past
      `max_rows` starts the next batch), whatever else is in flight;
    - when no batch is at the branches (nothing to wait for): at the end of
      this turn of the event loop, so that the other requests Triton handed
      over with this one, in the same execute call, go with it;
    - otherwise when its first request has waited `window_s`, provided fewer
      than `max_in_flight` batches are at the branches; when that many are,
      it goes as soon as one of them is answered.
    So a lone request never waits, and under load rows pile up while the
    branches work and leave in large batches. `max_rows` 1 turns batching off.
    Runs on the event loop only, so it needs no lock.
    """

    def __init__(self, run_batch, window_s, max_rows, max_in_flight):
        self.run_batch = run_batch
        self.window_s = window_s
        self.max_rows = max_rows
        self.max_in_flight = max_in_flight
        self.pending = []
        self.rows = 0
        self.first_at = 0.0
        self.timer = None  # the send to come: at a batch's due time, or this loop turn's end
        self.soon = False  # the timer is this turn's end (nothing at the branches)
        self.running = set()  # tasks of batches sent and not yet answered

    def submit(self, request, features):
        """A future for this request's outputs (None: cancelled before its batch went)."""
        if self.pending and self.rows + len(features) > self.max_rows:
            self.send()
        loop = asyncio.get_running_loop()
        if not self.pending:
            self.first_at = loop.time()
        item = Pending(request, features, loop.create_future())
        self.pending.append(item)
        self.rows += len(features)
        if self.rows >= self.max_rows:
            self.send()
        else:
            self.consider()
        return item.future

    def consider(self):
        """Send the pending batch if its time has come (see the class's rules)."""
        if not self.pending or len(self.running) >= self.max_in_flight:
            return  # nothing to send, or a batch being answered calls again
        loop = asyncio.get_running_loop()
        due = self.first_at + self.window_s
        if not self.running:
            # The requests of one execute call are admitted one after another, each
            # in its own task: the first must not leave before the others joined.
            if not self.soon:
                if self.timer is not None:
                    self.timer.cancel()
                self.timer = loop.call_soon(self.on_timer)
                self.soon = True
        elif loop.time() >= due:
            self.send()
        elif self.timer is None:
            self.timer = loop.call_at(due, self.on_timer)

    def on_timer(self):
        self.timer = None
        if self.soon:
            self.soon = False
            if self.pending and len(self.running) < self.max_in_flight:
                self.send()
        else:
            self.consider()

    def send(self):
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.soon = False
        batch, self.pending, self.rows = self.pending, [], 0
        task = asyncio.ensure_future(self.run_batch(batch))
        self.running.add(task)
        task.add_done_callback(self.done)

    def done(self, task):
        self.running.discard(task)
        self.consider()


class TritonPythonModel:
    def initialize(self, args):
        self.model_name = args["model_name"]
        model_config = json.loads(args["model_config"])
        # The family must outlive its metric: both stay on the model.
        self.streams_family = pb_utils.MetricFamily(
            name=STREAMS_IN_FLIGHT,
            description="Decoupled requests whose final response is not sent yet",
            kind=pb_utils.MetricFamily.GAUGE,
        )
        self.streams = self.streams_family.Metric(
            labels={"model": self.model_name, "version": args["model_version"]}
        )
        self.held = 0  # requests admitted and not yet answered, counted here
        self.published = 0  # what this instance has added to the gauge so far
        self.publish_due = False
        if not pb_utils.using_decoupled_model_transaction_policy(model_config):
            raise pb_utils.TritonModelException(
                f"{self.model_name} answers through response senders: set "
                "model_transaction_policy { decoupled: True } in its config.pbtxt"
            )

        def number(key, default):
            value = int(pipeline.parameter(model_config, key, default))
            if value < 0:
                raise pb_utils.TritonModelException(
                    f"{self.model_name}: {key} must be 0 or more, got {value}"
                )
            return value

        self.branch_timeout_us = number("branch_timeout_us", "1000000")
        self.answer_deadline_s = max(number("answer_deadline_us", "10000000"), 1) / 1e6
        self.pool = pipeline.preprocess_pool(model_config, self.model_name)
        self.batcher = MicroBatcher(
            self.run_batch,
            window_s=number("batch_window_us", "500") / 1e6,
            max_rows=max(number("max_batch_rows", "32"), 1),
            max_in_flight=max(number("max_batches_in_flight", "4"), 1),
        )
        self.logger = pb_utils.Logger
        # async_exec() blocks a thread of the event loop's default executor for
        # each BLS call, and that executor has only min(32, CPUs + 4) threads:
        # size it for the calls this model makes at once.
        self.bls_executor = ThreadPoolExecutor(
            max_workers=max(number("bls_threads", "12"), 1),
            thread_name_prefix=f"{self.model_name}-bls",
        )
        self.executor_set = False

    async def execute(self, requests):
        if not self.executor_set:
            asyncio.get_running_loop().set_default_executor(self.bls_executor)
            self.executor_set = True
        # Counted in as they arrive; each `serve` counts its request out once its
        # final response is sent (or could not be).
        self.count(len(requests))
        # Runs in the background: python_backend does not wait for it before
        # handing this instance more requests.
        await asyncio.gather(*(self.serve(request) for request in requests))
        # Decoupled: the responses went out through the senders.
        return None

    async def serve(self, request):
        """Answer one request with exactly one final response, whatever happens."""
        try:
            try:
                response = await self.respond(request)
            except Exception as error:  # a bug here must never leave a client waiting for ever
                message = f"{self.model_name}: {pipeline.describe(error)}"
                response = pipeline.error_response(message)
            try:
                request.get_response_sender().send(response, flags=FINAL)
            except Exception as error:  # the client is gone; nobody is left to tell
                self.logger.log_warn(
                    f"{self.model_name}: could not send a response: {pipeline.describe(error)}"
                )
        finally:  # also when the coroutine itself is cancelled (the model unloading)
            self.count(-1)

    def count(self, change):
        """Change the number of requests held; the gauge follows once per loop turn.

        Each change of a custom metric is a round trip to the server, so the changes
        of one turn of the event loop (a batch answered, a burst admitted) go as one.
        Several instances add to the same gauge (same labels): only increments, never
        a set, so that none overwrites another's share.
        """
        self.held += change
        if self.publish_due:
            return
        try:
            asyncio.get_running_loop().call_soon(self.publish)
            self.publish_due = True
        except RuntimeError:  # no running loop: the model is unloading
            self.publish()

    def publish(self):
        self.publish_due = False
        change, self.published = self.held - self.published, self.held
        if change:
            self.streams.increment(change)

    async def respond(self, request):
        # Cancellation is checked when the batch goes, a moment later.
        refusal, features = pipeline.checked_features(self.model_name, request)
        if refusal is not None:
            return refusal
        try:
            outputs = await self.batcher.submit(request, features)
        except pipeline.BranchError as error:
            return pipeline.error_response(f"{self.model_name}: {error}")
        # None: cancelled before the fan-out. Else check once more before answering.
        if outputs is None or request.is_cancelled():
            return pipeline.cancelled_response(self.model_name)
        return pipeline.result_response(outputs)

    async def run_batch(self, batch):
        """Send one batch to the branches and resolve each request's future."""
        # A client that gave up while its request waited sends no branch work.
        live = []
        for item in batch:
            if item.request.is_cancelled():
                item.future.set_result(None)
            else:
                live.append(item)
        if not live:
            return
        try:
            hidden = await pipeline.preprocess_on(
                self.pool, pipeline.stack([(None, item.features) for item in live])
            )
            results = await asyncio.wait_for(
                pipeline.fan_out(hidden, self.branch_timeout_us), self.answer_deadline_s
            )
            parts = pipeline.split(pipeline.merge(*results), [len(item.features) for item in live])
        except asyncio.TimeoutError:
            failure = pipeline.BranchError(
                f"the branches did not answer within {self.answer_deadline_s:g} s"
            )
        except pipeline.BranchError as error:
            failure = error
        except Exception as error:  # anything else fails this batch, and only this batch
            failure = pipeline.BranchError(pipeline.describe(error))
        else:
            for item, part in zip(live, parts, strict=True):
                item.future.set_result(part)
            return
        for item in live:
            item.future.set_exception(failure)

    def finalize(self):
        if self.pool is not None:
            self.pool.shutdown(wait=True)
        self.bls_executor.shutdown(wait=False)
