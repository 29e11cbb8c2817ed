"""Locust load tests for the Tritonscale models, over gRPC and HTTP.

    locust -f loadtests/bls.py                                   # web UI on :8089
    locust -f loadtests/bls.py --headless -u 8 -r 4 -t 1m \\
        --workload pipeline_async --protocol grpc --payload 4 \\
        --max-p95-ms 250 --max-failure-ratio 0.01 --csv reports/locust/run
    locust --config loadtests/locust.conf                        # the defaults written down

One user class per workload; `--workload` picks which run (a comma-separated list mixes
them). Targets default to a local server: HTTP at `--host` (http://127.0.0.1:8000) and gRPC
at `--grpc-host` (the host's name, port 8001). `--shape steady|step|spike` picks the load
over time; steady is plain Locust (-u, -r, -t). Gates (`--max-p95-ms`, `--max-p99-ms`,
`--max-failure-ratio`) decide the exit code when the run ends, with one line naming the
gate that broke. Before any user starts, the server and each workload's model must be
ready, or the run stops with one line and exit code 2.
"""

# ruff: noqa: E402 - the import order below is load-bearing; see the comment.
from __future__ import annotations

# isort: off
# Locust first: importing it monkey-patches the standard library for gevent. grpc's gevent
# integration must be switched on after that and before any channel exists; in any other
# order a gRPC run hangs without a word.
import locust  # noqa: F401
from grpc.experimental import gevent as grpc_gevent

grpc_gevent.init_gevent()
# isort: on

import json
import logging
import queue
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import urlparse

import numpy as np
import tritonclient.grpc
import tritonclient.http
from locust import LoadTestShape, User, events, task
from locust.env import Environment
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

DEFAULT_HOST = "http://127.0.0.1:8000"
DEFAULT_GRPC_PORT = 8001
# One entry per stream request for the first answer, one for the last (see StreamUser).
FIRST_RESPONSE = "first response"
FINAL_RESPONSE = "final response"
FAILURE_PAUSE_S = 0.05


class ResponseError(Exception):
    """The server answered, but not what the model promises."""


# ---- workloads: what to send and how to check the answer ----------------------------------


@dataclass(frozen=True)
class Workload:
    """A model, the inputs one request carries, and the check of its outputs."""

    model: str
    outputs: tuple[str, ...]
    make_inputs: Callable[[int, np.random.Generator], dict[str, np.ndarray]]
    check: Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], str | None]
    grpc_only: bool = False


def _pair(payload: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "INPUT0": rng.random(4, dtype=np.float32),
        "INPUT1": rng.random(4, dtype=np.float32),
    }


def _check_sum_difference(sent: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> str | None:
    if not np.allclose(got["OUTPUT0"], sent["INPUT0"] + sent["INPUT1"], atol=1e-5):
        return f"OUTPUT0 {got['OUTPUT0'].tolist()} is not INPUT0 + INPUT1"
    if not np.allclose(got["OUTPUT1"], sent["INPUT0"] - sent["INPUT1"], atol=1e-5):
        return f"OUTPUT1 {got['OUTPUT1'].tolist()} is not INPUT0 - INPUT1"
    return None


def _forward_to_add_sub(payload: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {**_pair(payload, rng), "MODEL_NAME": np.array(["add_sub"], dtype=object)}


def _features(payload: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"FEATURES": rng.standard_normal((max(payload, 1), 64), dtype=np.float32)}


def _check_pipeline(sent: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> str | None:
    rows = sent["FEATURES"].shape[0]
    for name, width in (("EMBEDDING", 16), ("LABEL_PROBS", 8), ("SCORE", 1)):
        if got[name].shape != (rows, width):
            return f"{name} has shape {list(got[name].shape)}, expected [{rows}, {width}]"
    if not np.allclose(got["LABEL_PROBS"].sum(axis=1), 1.0, atol=1e-4):
        return "LABEL_PROBS rows do not sum to 1"
    if not np.all((got["SCORE"] > 0) & (got["SCORE"] < 1)):
        return "SCORE outside (0, 1)"
    return None


def _stream_count(payload: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    # square_int32 answers IN times: the payload is the number of streamed responses.
    return {"IN": np.array([max(payload, 1)], dtype=np.int32)}


def _check_square(
    factor: int,
) -> Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], str | None]:
    def check(sent: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> str | None:
        n = int(sent["IN"][0])
        if int(got["SUM"][0]) != factor * n * n:
            return f"SUM {int(got['SUM'][0])} is not {factor} * IN * IN = {factor * n * n}"
        return None

    return check


WORKLOADS: dict[str, Workload] = {
    "add_sub": Workload("add_sub", ("OUTPUT0", "OUTPUT1"), _pair, _check_sum_difference),
    "bls_async": Workload("bls_async", ("OUTPUT0", "OUTPUT1"), _pair, _check_sum_difference),
    "bls_sync": Workload(
        "bls_sync", ("OUTPUT0", "OUTPUT1"), _forward_to_add_sub, _check_sum_difference
    ),
    "pipeline_async": Workload(
        "pipeline_async", ("EMBEDDING", "LABEL_PROBS", "SCORE"), _features, _check_pipeline
    ),
    "pipeline_sync": Workload(
        "pipeline_sync", ("EMBEDDING", "LABEL_PROBS", "SCORE"), _features, _check_pipeline
    ),
    "bls_decoupled_async": Workload(
        "bls_decoupled_async", ("SUM",), _stream_count, _check_square(2)
    ),
    "bls_decoupled_sync": Workload("bls_decoupled_sync", ("SUM",), _stream_count, _check_square(1)),
    # Decoupled models: answered over a gRPC stream (see the users below).
    "pipeline_gateway": Workload(
        "pipeline_gateway", ("EMBEDDING", "LABEL_PROBS", "SCORE"), _features, _check_pipeline, True
    ),
    "square_int32": Workload("square_int32", ("OUT",), _stream_count, lambda s, g: None, True),
}
PROTOCOLS = ("grpc", "http")
SHAPES = ("steady", "step", "spike")


# ---- options ----------------------------------------------------------------------------


@events.init_command_line_parser.add_listener
def _add_options(parser: Any) -> None:
    parser.add_argument(
        "--workload",
        default="bls_async",
        include_in_web_ui=False,
        help=f"Workload(s) to run, comma-separated: {', '.join(WORKLOADS)}",
    )
    parser.add_argument(
        "--protocol", choices=PROTOCOLS, default="grpc", help="Triton client protocol"
    )
    parser.add_argument(
        "--grpc-host",
        default="",
        help="gRPC address host:port; default: the --host name, port 8001",
    )
    parser.add_argument(
        "--payload",
        type=int,
        default=4,
        help="Rows per request (pipelines), responses per request (decoupled workloads)",
    )
    parser.add_argument(
        "--think-time-ms", type=float, default=0.0, help="Pause of each user between requests"
    )
    parser.add_argument(
        "--user-rate",
        type=float,
        default=0.0,
        help="Each user's pace in requests/s, from a random phase (-u x this is the offered "
        "rate while answers come faster than the pace); 0: off, --think-time-ms applies",
    )
    parser.add_argument(
        "--shape",
        choices=SHAPES,
        default="steady",
        include_in_web_ui=False,
        help="Load over time: steady (-u/-r/-t), step (ramp in steps), spike (a burst)",
    )
    parser.add_argument("--step-users", type=int, default=2, help="step: users added at each step")
    parser.add_argument("--step-time", type=float, default=10.0, help="step: seconds per step")
    parser.add_argument(
        "--spike-at", type=float, default=10.0, help="spike: seconds of base load before it"
    )
    parser.add_argument("--spike-time", type=float, default=10.0, help="spike: its length in s")
    parser.add_argument(
        "--spike-factor", type=float, default=4.0, help="spike: users during it, x -u"
    )
    parser.add_argument("--max-p95-ms", type=float, default=0.0, help="Gate; 0: off")
    parser.add_argument("--max-p99-ms", type=float, default=0.0, help="Gate; 0: off")
    parser.add_argument(
        "--max-failure-ratio", type=float, default=-1.0, help="Gate, 0 to 1; negative: off"
    )
    parser.add_argument(
        "--request-timeout-s", type=float, default=30.0, help="Client timeout of one request"
    )
    parser.add_argument(
        "--request-log",
        default="",
        include_in_web_ui=False,
        help="Append one JSON line per request here (start time, ms, name, error): "
        "every request of a run, to line up with what happened meanwhile",
    )


def _workload_names(options: Any) -> list[str]:
    return [name.strip() for name in str(options.workload).split(",") if name.strip()]


def http_address(host: str | None) -> str:
    """'http://h:p' (Locust's --host) as the 'h:p' that tritonclient.http wants."""
    parsed = urlparse(host or DEFAULT_HOST)
    if not parsed.hostname:  # a bare 'h:p'
        parsed = urlparse(f"http://{host}")
    return f"{parsed.hostname}:{parsed.port or 80}"


def grpc_address(host: str | None, grpc_host: str) -> str:
    if grpc_host:
        return grpc_host
    return f"{http_address(host).rsplit(':', 1)[0]}:{DEFAULT_GRPC_PORT}"


# Inference waits for a ready connection (gRPC's wait-for-ready,
# https://github.com/grpc/grpc/blob/master/doc/wait-for-ready.md): while the channel cannot
# connect (a pod that died, and kube-proxy still sending new connections to it until its
# EndpointSlice marks it not ready), a request is held until a connection is READY or its
# deadline passes, instead of failing at once with UNAVAILABLE. Only the inference methods:
# health and readiness calls still fail fast, so an unreachable server is reported at once.
# No retryPolicy: gRPC retries a status in `retryableStatusCodes` until the server has sent
# response headers (gRFC A6, "When Retries are Valid"), and Triton sends them with the
# answer, so retrying UNAVAILABLE would silently send again a request that a pod was working
# on when it died. What never reached Triton's application code (never sent, or refused by
# the server's HTTP/2 layer, e.g. after a GOAWAY) gRPC retries by itself whatever the
# configuration (gRFC A6, "Transparent Retries"; `grpc.enable_retries`, on by default).
INFERENCE_SERVICE_CONFIG = {
    "methodConfig": [
        {
            "name": [
                {"service": "inference.GRPCInferenceService", "method": "ModelInfer"},
                {"service": "inference.GRPCInferenceService", "method": "ModelStreamInfer"},
            ],
            "waitForReady": True,
        }
    ]
}
# A Service's endpoints change within seconds: try to connect again within 2 s at most,
# not after grpc's default back-off (1 s, then x1.6 up to 120 s).
RECONNECT_BACKOFF_MS = (250, 2000)


def grpc_channel_args() -> list[tuple[str, int | str]]:
    """tritonclient's own channel options, a subchannel pool per channel, inference that
    waits for a ready connection (INFERENCE_SERVICE_CONFIG) and a short reconnect back-off.

    grpcio shares one connection among a process's channels to the same target (its global
    subchannel pool): every user of a Locust worker would send on one TCP connection, and a
    Kubernetes Service balances connections, not requests, so a worker's whole load would
    land on one Triton pod. With a pool per channel each user has its own connection, as
    independent clients do, and the Service spreads them.
    """
    keepalive = tritonclient.grpc.KeepAliveOptions()
    largest = 2**31 - 1  # Triton's MAX_GRPC_MESSAGE_SIZE, as tritonclient sets it
    initial_backoff_ms, max_backoff_ms = RECONNECT_BACKOFF_MS
    return [
        ("grpc.max_send_message_length", largest),
        ("grpc.max_receive_message_length", largest),
        ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", keepalive.keepalive_permit_without_calls),
        ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.service_config", json.dumps(INFERENCE_SERVICE_CONFIG)),
        ("grpc.initial_reconnect_backoff_ms", initial_backoff_ms),
        ("grpc.max_reconnect_backoff_ms", max_backoff_ms),
    ]


def _client(protocol: str, address: str, timeout_s: float) -> Any:
    if protocol == "http":
        return tritonclient.http.InferenceServerClient(
            address, connection_timeout=timeout_s, network_timeout=timeout_s
        )
    return tritonclient.grpc.InferenceServerClient(address, channel_args=grpc_channel_args())


# Clients not yet closed. tritonclient.grpc closes its channel again in __del__, and a
# second close under gevent decrements grpc's gevent channel count twice: at exit the
# process then blocks forever after the run has ended. So every client is closed once,
# while the hub still runs (on_stop, else the quitting listener), and its close is then
# made a no-op for the garbage collector.
_OPEN_CLIENTS: set[Any] = set()


def _close(client: Any) -> None:
    _OPEN_CLIENTS.discard(client)
    client.close()
    client.close = lambda: None


def _module(protocol: str) -> Any:
    return tritonclient.http if protocol == "http" else tritonclient.grpc


# ---- users ------------------------------------------------------------------------------


class TritonUser(User):
    """Shared set-up: one Triton client per user, inputs from the workload, checked answers."""

    abstract = True
    host = DEFAULT_HOST
    workload_name: ClassVar[str] = ""

    def wait_time(self) -> float:
        options = self.environment.parsed_options
        if options.user_rate > 0:
            return self._next_slot_in(1.0 / options.user_rate)
        return options.think_time_ms / 1000.0

    def _next_slot_in(self, period_s: float) -> float:
        """Seconds to this user's next slot, `period_s` after the last one. A late answer
        moves the schedule and is not made up for, as with Locust's constant_throughput."""
        now = time.monotonic()
        self._slot = max(self._slot + period_s, now)
        return self._slot - now

    def on_start(self) -> None:
        options = self.environment.parsed_options
        self.options = options
        self.workload = WORKLOADS[self.workload_name]
        self.protocol = "grpc" if self.workload.grpc_only else options.protocol
        self.module = _module(self.protocol)
        address = (
            grpc_address(self.host, options.grpc_host)
            if self.protocol == "grpc"
            else http_address(self.host)
        )
        self.client = _client(self.protocol, address, options.request_timeout_s)
        _OPEN_CLIENTS.add(self.client)
        self.rng = np.random.default_rng()
        self.requested = [self.module.InferRequestedOutput(n) for n in self.workload.outputs]
        self._slot = time.monotonic()
        if options.user_rate > 0:
            # Locust starts users in batches (as many at once as the spawn rate per second):
            # paced from their start, a batch would send in step, in bursts. A random phase
            # within the period spreads them, as independent clients are.
            phase_s = random.random() / options.user_rate
            time.sleep(phase_s)
            self._slot += phase_s

    def on_stop(self) -> None:
        if self.client in _OPEN_CLIENTS:
            _close(self.client)

    def make_inputs(self, arrays: dict[str, np.ndarray]) -> list[Any]:
        inputs = []
        for name, array in arrays.items():
            infer_input = self.module.InferInput(
                name, list(array.shape), np_to_triton_dtype(array.dtype)
            )
            infer_input.set_data_from_numpy(array)
            inputs.append(infer_input)
        return inputs

    @task
    def request(self) -> None:
        self.send()

    def send(self) -> None:
        """One request, timed and checked; subclasses with other exchanges override it."""
        arrays = self.workload.make_inputs(self.options.payload, self.rng)
        inputs = self.make_inputs(arrays)
        timeout = self.options.request_timeout_s
        with self.environment.events.request.measure(self.protocol, self.workload_name) as meta:
            try:
                if self.protocol == "grpc":
                    result = self.client.infer(
                        self.workload.model, inputs, outputs=self.requested, client_timeout=timeout
                    )
                else:
                    result = self.client.infer(self.workload.model, inputs, outputs=self.requested)
            except InferenceServerException as error:
                # Locust's error table shows repr(exception), which for tritonclient's
                # exception is a bare "InferenceServerException()": carry Triton's message.
                raise ResponseError(error.message() or str(error)) from None
            got = {name: result.as_numpy(name) for name in self.workload.outputs}
            missing = [name for name, value in got.items() if value is None]
            if missing:
                raise ResponseError(f"response lacks {', '.join(missing)}")
            meta["response_length"] = sum(value.nbytes for value in got.values())
            problem = self.workload.check(arrays, got)
            if problem:
                raise ResponseError(problem)
        if meta["exception"] is not None:
            # A request that fails at once (server gone, deadline too short) never yields to
            # gevent: without a pause the user spins and starves Locust's own timers.
            time.sleep(FAILURE_PAUSE_S)


class AddSubUser(TritonUser):
    """add_sub directly: the baseline a BLS hop is measured against."""

    workload_name = "add_sub"


class BlsAsyncUser(TritonUser):
    """bls_async: an async BLS fan-out to two models."""

    workload_name = "bls_async"


class BlsSyncUser(TritonUser):
    """bls_sync forwarding to add_sub with a blocking exec()."""

    workload_name = "bls_sync"


class PipelineAsyncUser(TritonUser):
    """pipeline_async: FEATURES [payload, 64] through three branches at once."""

    workload_name = "pipeline_async"


class PipelineSyncUser(TritonUser):
    """pipeline_sync: the same pipeline, branches one after another."""

    workload_name = "pipeline_sync"


class BlsDecoupledAsyncUser(TritonUser):
    """bls_decoupled_async: two decoupled BLS streams at once; IN = payload."""

    workload_name = "bls_decoupled_async"


class BlsDecoupledSyncUser(TritonUser):
    """bls_decoupled_sync: one decoupled BLS stream; IN = payload."""

    workload_name = "bls_decoupled_sync"


class PipelineGatewayUser(TritonUser):
    """pipeline_gateway over a gRPC stream: one request at a time, exactly one response each.

    The gateway is decoupled, so it answers on a stream; it sends one final response per
    request (a result or an error). The response must carry this request's id and pass the
    pipeline's checks; a second response, or none within --request-timeout-s, is a failure.
    """

    workload_name = "pipeline_gateway"

    def on_start(self) -> None:
        super().on_start()
        self.answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.answers.put((result, error)))
        self.sent = 0

    def on_stop(self) -> None:
        self.client.stop_stream(cancel_requests=False)
        super().on_stop()

    def send(self) -> None:
        arrays = self.workload.make_inputs(self.options.payload, self.rng)
        self.sent += 1
        request_id = str(self.sent)
        timeout = self.options.request_timeout_s
        with self.environment.events.request.measure("grpc-stream", self.workload_name) as meta:
            self.client.async_stream_infer(
                self.workload.model,
                self.make_inputs(arrays),
                request_id=request_id,
                outputs=self.requested,
            )
            try:
                result, error = self.answers.get(timeout=timeout)
            except queue.Empty:
                raise ResponseError(f"no response within {timeout:g} s") from None
            if error is not None:
                raise ResponseError(error.message() or str(error))
            response = result.get_response()
            if response.id != request_id:
                raise ResponseError(f"response for request {response.id!r}, sent {request_id!r}")
            if not response.parameters["triton_final_response"].bool_param:
                raise ResponseError("the response is not flagged final")
            got = {name: result.as_numpy(name) for name in self.workload.outputs}
            missing = [name for name, value in got.items() if value is None]
            if missing:
                raise ResponseError(f"response lacks {', '.join(missing)}")
            meta["response_length"] = sum(value.nbytes for value in got.values())
            problem = self.workload.check(arrays, got)
            if problem:
                raise ResponseError(problem)
        if meta["exception"] is not None:
            # After a timeout a late answer may still come: drop it, and pause (see send()).
            while not self.answers.empty():
                self.answers.get_nowait()
            time.sleep(FAILURE_PAUSE_S)


class SquareStreamUser(TritonUser):
    """square_int32 over a gRPC stream: time to the first response and to the final one.

    Each request asks for IN = payload responses. Locust gets two entries per request,
    "square_int32 first response" and "square_int32 final response".
    """

    workload_name = "square_int32"

    def on_start(self) -> None:
        super().on_start()
        self.answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.answers.put((result, error)))

    def on_stop(self) -> None:
        # Ending the request stream (no cancel) lets gRPC close it; a cancel left the
        # stream handler blocked under gevent and the run never exited.
        self.client.stop_stream(cancel_requests=False)
        super().on_stop()

    def _report(self, name: str, started: float, error: Exception | None) -> None:
        self.environment.events.request.fire(
            request_type="grpc-stream",
            name=f"{self.workload_name} {name}",
            response_time=(time.perf_counter() - started) * 1000.0,
            response_length=0,
            exception=error,
            context={},
        )

    def send(self) -> None:
        count = max(self.options.payload, 1)
        arrays = {"IN": np.array([count], dtype=np.int32)}
        started = time.perf_counter()
        self.client.async_stream_infer(
            self.workload.model, self.make_inputs(arrays), enable_empty_final_response=True
        )
        outs: list[int] = []
        deadline = started + self.options.request_timeout_s
        while True:
            try:
                result, error = self.answers.get(timeout=max(deadline - time.perf_counter(), 0))
            except queue.Empty:
                failure = ResponseError(
                    f"no final response within {self.options.request_timeout_s:g} s "
                    f"({len(outs)} of {count} responses)"
                )
                if not outs:
                    self._report(FIRST_RESPONSE, started, failure)
                self._report(FINAL_RESPONSE, started, failure)
                return
            if error is not None:
                if not outs:
                    self._report(FIRST_RESPONSE, started, error)
                self._report(FINAL_RESPONSE, started, error)
                return
            response = result.get_response()
            out = result.as_numpy("OUT")
            if out is not None:
                if not outs:
                    self._report(FIRST_RESPONSE, started, None)
                outs.append(int(out[0]))
            if response.parameters["triton_final_response"].bool_param:
                break
        problem = None
        if len(outs) != count or any(value != count for value in outs):
            problem = ResponseError(
                f"expected {count} responses of OUT={count}, got {len(outs)}: {outs[:8]}"
            )
        self._report(FINAL_RESPONSE, started, problem)


USER_CLASSES: dict[str, type[TritonUser]] = {
    cls.workload_name: cls
    for cls in (
        AddSubUser,
        BlsAsyncUser,
        BlsSyncUser,
        PipelineAsyncUser,
        PipelineSyncUser,
        PipelineGatewayUser,
        BlsDecoupledAsyncUser,
        BlsDecoupledSyncUser,
        SquareStreamUser,
    )
}


# ---- load shapes ------------------------------------------------------------------------


class LoadShape(LoadTestShape):
    """--shape step: start at --step-users and add as many every --step-time s, up to -u.
    --shape spike: -u users, then -u x --spike-factor for --spike-time s after --spike-at s,
    then -u again. Both stop at -t when it is given. (--shape steady removes this class at
    start-up, so a steady run is plain Locust.)
    """

    use_common_options = True

    def tick(self) -> tuple[int, float] | None:
        options = self.runner.environment.parsed_options
        elapsed = self.get_run_time()
        if options.run_time and elapsed >= options.run_time:
            return None
        users = max(options.num_users or 1, 1)
        spawn_rate = options.spawn_rate or users
        if options.shape == "step":
            steps = int(elapsed // max(options.step_time, 0.1)) + 1
            return min(users, steps * max(options.step_users, 1)), spawn_rate
        if options.spike_at <= elapsed < options.spike_at + options.spike_time:
            peak = max(round(users * options.spike_factor), 1)
            return peak, max(spawn_rate, peak)
        return users, max(spawn_rate, users)


# ---- start-up: options, readiness -----------------------------------------------------


def _stop(message: str) -> None:
    """One line for a person, then exit 2 (before any user starts)."""
    sys.stderr.write(f"bls.py: {message}\n")
    sys.stderr.flush()
    sys.exit(2)


def check_ready(
    protocol: str, address: str, models: list[str], timeout_s: float = 10.0
) -> str | None:
    """None when the server and every model are ready; else one line saying what is not."""
    try:
        client = _client(protocol, address, timeout_s)
    except Exception as error:  # bad address syntax
        return f"cannot reach Triton at {address} ({protocol}): {error}"
    # A silent address (a firewall dropping packets) must not hang the start: gRPC takes a
    # deadline per call; the HTTP client got its timeouts above.
    deadline = {"client_timeout": timeout_s} if protocol == "grpc" else {}
    try:
        if not client.is_server_live(**deadline) or not client.is_server_ready(**deadline):
            return f"Triton at {address} ({protocol}) is up but not ready"
        for model in models:
            if not client.is_model_ready(model, **deadline):
                return f"model '{model}' is not ready on Triton at {address} ({protocol})"
    except InferenceServerException as error:
        return f"cannot reach Triton at {address} ({protocol}): {error.message() or error}"
    except Exception as error:  # socket errors from geventhttpclient
        return f"cannot reach Triton at {address} ({protocol}): {error}"
    finally:
        _close(client)
    return None


@events.init.add_listener
def _on_init(environment: Environment, **_: Any) -> None:
    options = environment.parsed_options
    if options is None:  # run as a library (run_single_user): nothing to set up
        return
    names = _workload_names(options)
    unknown = [name for name in names if name not in USER_CLASSES]
    if not names or unknown:
        _stop(
            f"unknown workload '{','.join(unknown) or options.workload}'; "
            f"choose from {', '.join(USER_CLASSES)}"
        )
    if options.payload < 1:
        _stop(f"--payload must be at least 1, got {options.payload}")
    if options.shape == "steady":
        # Locust picks up every shape class of a locustfile; steady means none.
        environment.shape_class = None
    if options.request_log:
        _log_requests(environment, options.request_log)
    if getattr(options, "worker", False):
        return  # the master chose the users, checked the server and judges the gates
    # Only the chosen workloads run: the master hands these classes to its workers.
    environment.user_classes = [USER_CLASSES[name] for name in names]
    host = options.host or DEFAULT_HOST
    by_protocol: dict[str, list[str]] = {}
    for name in names:
        workload = WORKLOADS[name]
        protocol = "grpc" if workload.grpc_only else options.protocol
        by_protocol.setdefault(protocol, []).append(workload.model)
    for protocol, models in by_protocol.items():
        address = (
            http_address(host) if protocol == "http" else grpc_address(host, options.grpc_host)
        )
        problem = check_ready(protocol, address, models)
        if problem:
            _stop(problem)


def _log_requests(environment: Environment, path: str) -> None:
    """Write every request the users of this process make to `path`, one JSON line each."""
    log = open(path, "a", buffering=1)  # noqa: SIM115 - open for the whole run

    def write(
        request_type: str,
        name: str,
        response_time: float,
        exception: BaseException | None = None,
        start_time: float | None = None,
        **_: Any,
    ) -> None:
        started = start_time if start_time is not None else time.time() - response_time / 1000
        error = None if exception is None else f"{type(exception).__name__}: {exception}"[:300]
        line = {"start": round(started, 4), "ms": round(response_time, 2), "name": name}
        log.write(json.dumps({**line, "type": request_type, "error": error}) + "\n")

    environment.events.request.add_listener(write)
    environment.events.quitting.add_listener(lambda **_: log.close())


# ---- service-level gates ----------------------------------------------------------------


def broken_gates(stats: Any, options: Any) -> list[str]:
    """One sentence per gate the run's totals break (an empty list: all hold)."""
    total = stats.total
    broken = []
    if total.num_requests == 0:
        return ["no request completed"]
    for quantile, limit in ((0.95, options.max_p95_ms), (0.99, options.max_p99_ms)):
        if limit > 0:
            observed = total.get_response_time_percentile(quantile)
            if observed > limit:
                broken.append(f"p{round(quantile * 100)} {observed:.0f} ms > {limit:g} ms")
    if options.max_failure_ratio >= 0 and total.fail_ratio > options.max_failure_ratio:
        broken.append(
            f"failure ratio {total.fail_ratio:.3f} > {options.max_failure_ratio:g} "
            f"({total.num_failures} of {total.num_requests} requests)"
        )
    return broken


def _gates_on(options: Any) -> bool:
    return options.max_p95_ms > 0 or options.max_p99_ms > 0 or options.max_failure_ratio >= 0


@events.quitting.add_listener
def _close_clients(**_: Any) -> None:
    for client in list(_OPEN_CLIENTS):
        _close(client)


@events.quitting.add_listener
def _judge(environment: Environment, **_: Any) -> None:
    options = environment.parsed_options
    if options is None or getattr(options, "worker", False) or not _gates_on(options):
        return
    broken = broken_gates(environment.stats, options)
    logger = logging.getLogger("bls.py")
    if broken:
        logger.error("service-level gate broken: %s", "; ".join(broken))
        environment.process_exit_code = 1
    else:
        # The gates decide: failures within --max-failure-ratio do not fail the run.
        logger.info("service-level gates hold")
        environment.process_exit_code = 0
