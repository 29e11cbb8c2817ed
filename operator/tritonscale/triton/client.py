"""One Triton pod's HTTP API, over the official client (`tritonclient.http`, and its asyncio
twin `tritonclient.http.aio` for the control loop).

    async with AsyncTritonClient(endpoint, repository_key) as triton:
        config = await triton.model_config("add_sub")
        await triton.load("add_sub", {**config, "instance_group": [{"kind": "KIND_CPU", "count": 2}]})
        assert await triton.is_model_ready("add_sub")

The control loop (actuator, healer, metrics) talks to Triton through `AsyncTritonClient`, on
the event loop of its driver: a pod that does not answer costs the task that asked it, and no
thread. The local tools and the benchmarks use `TritonClient`, the same calls blocking. Every
call has a timeout, and every failure is a `TritonError`: one line that names the pod and the
reason, with `TritonUnreachable` when Triton did not answer at all (refused, reset, or no
answer within the timeout). The repository key (tritonscale.REPOSITORY_KEY_HEADER) goes with
the repository calls only (index, load) and never appears in a message: Triton's own answers
are scrubbed of it too.

A client holds its connections open: close it (the `with` block does). Triton waits for open
connections when it stops, up to its exit timeout. The operator's async clients go over the
driver's `Connections` instead (tritonscale.triton.connections): one kept-open client per pod,
shared by every call, which closing an `AsyncTritonClient` leaves open.

The metrics text (`/metrics` on the metrics port) is not part of tritonclient: one plain
HTTP GET.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager, nullcontext
from http.client import HTTPException
from typing import Any, TypeVar
from urllib.parse import urlsplit

import aiohttp
import requests
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient
from tritonclient.utils import InferenceServerException

from tritonscale import REPOSITORY_KEY_HEADER
from tritonscale.triton.connections import Connections
from tritonscale.triton.endpoints import Endpoint

DEFAULT_TIMEOUT_S = 5.0
T = TypeVar("T")


class TritonError(Exception):
    """Triton could not be read or refused a call; one line naming the pod and the reason."""

    def __init__(
        self, pod: str, reason: str, status: str | None = None, answer: str | None = None
    ) -> None:
        super().__init__(f"{pod}: {reason}")
        self.pod = pod
        self.reason = reason
        self.status = status  # Triton's HTTP status ("400", "403"...) when it answered
        self.answer = answer  # Triton's own message (its first line) when it answered


class TritonUnreachable(TritonError):
    """No answer at all: the connection was refused or reset, or the timeout passed."""

    def __init__(self, pod: str, reason: str, timed_out: bool = False) -> None:
        super().__init__(pod, reason)
        self.timed_out = timed_out


def one_line(text: str, limit: int = 300) -> str:
    """The first line of a message, spaces collapsed (Python backend errors carry tracebacks)."""
    first = " ".join(text.strip().split("\n")[0].split())
    return first[:limit].rstrip(".") if first else "no reason given"


class _PodClient:
    """What both clients share: the pod, the key, and the wording of every failure."""

    def __init__(
        self,
        endpoint: Endpoint,
        repository_key: str | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self._key = repository_key or ""
        self._address = urlsplit(endpoint.base_url).netloc  # tritonclient wants host:port
        self._http: Any = None  # tritonclient's connection, opened by the first call

    def __repr__(self) -> str:  # the key stays out of reprs, hence out of tracebacks
        key = "set" if self._key else "unset"
        return f"{type(self).__name__}({self.endpoint.name!r}, repository_key={key})"

    def _headers(self) -> dict[str, str]:
        return {REPOSITORY_KEY_HEADER: self._key} if self._key else {}

    def _refusal(
        self, error: InferenceServerException, what: str, refused: str | None
    ) -> TritonError:
        """Triton's answer as one line: "{what}: HTTP {status}: {Triton's answer}", or
        "{refused}: {Triton's answer}" when given."""
        # Python backend errors carry a traceback after their first line.
        answer = self._scrub(one_line(error.message() or str(error)))
        status = error.status()
        if refused:
            reason = f"{refused}: {answer}"
        else:
            reason = f"{what}: HTTP {status}: {answer}" if status else f"{what}: {answer}"
        return TritonError(self.endpoint.name, reason, status, answer)

    def _no_answer(self, what: str, wait_s: float) -> TritonUnreachable:
        base = self.endpoint.base_url
        return TritonUnreachable(
            self.endpoint.name,
            f"{what}: no answer from Triton at {base} within {wait_s:g} s",
            timed_out=True,
        )

    def _unreachable(self, what: str, error: BaseException) -> TritonUnreachable:
        base = self.endpoint.base_url
        return TritonUnreachable(
            self.endpoint.name, f"cannot reach Triton at {base} ({what}): {type(error).__name__}"
        )

    def _scrub(self, text: str) -> str:
        """Whatever a server says, the key never leaves in a message."""
        return text.replace(self._key, "***") if self._key else text


class TritonClient(_PodClient):
    """The calls Tritonscale makes to one Triton pod; use it as a context manager.

    `timeout_s` bounds every call (connecting, and waiting for the answer); `load` and
    `infer` take their own. `repository_key` unlocks the model-repository API.
    """

    def __enter__(self) -> TritonClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None

    # ---- reading -----------------------------------------------------------------------
    def model_config(self, model: str) -> dict[str, Any]:
        """The model's live config (`GET v2/models/{model}/config`)."""
        with self._call(f"reading {model}'s config") as http:
            return http.get_model_config(model)

    def is_model_ready(self, model: str, version: str = "") -> bool:
        """Whether the model (or one version of it) is READY (`GET v2/models/{model}/ready`)."""
        with self._call(f"reading {model}'s readiness") as http:
            return http.is_model_ready(model, version)

    def repository_index(self) -> list[dict[str, Any]]:
        """Every model of the repository with its state (`POST v2/repository/index`)."""
        with self._call("reading the repository index") as http:
            return list(http.get_model_repository_index(headers=self._headers()))

    def model_state(self, model: str) -> str | None:
        """The model's state in the repository index (READY, LOADING, UNAVAILABLE...).

        None when the index does not list it or lists it without a state. During a reload
        Triton keeps the state of the version that serves: an in-place change of
        instance_group that hangs still reads READY.
        """
        for row in self.repository_index():
            if row.get("name") == model:
                return row.get("state")
        return None

    def metrics_text(self) -> str:
        """Triton's Prometheus metrics (`GET /metrics` on the metrics port)."""
        url = self.endpoint.metrics_url
        if not url:
            raise TritonError(self.endpoint.name, "no metrics URL is known for this pod")
        try:
            with requests.get(url, timeout=self.timeout_s) as response:
                if response.status_code != 200:
                    raise TritonError(
                        self.endpoint.name,
                        f"reading metrics at {url}: HTTP {response.status_code}",
                        str(response.status_code),
                    )
                return response.text
        except requests.Timeout:
            raise TritonUnreachable(
                self.endpoint.name,
                f"no answer from Triton's metrics at {url} within {self.timeout_s:g} s",
                timed_out=True,
            ) from None
        except requests.RequestException as error:
            raise TritonUnreachable(
                self.endpoint.name,
                f"cannot reach Triton's metrics at {url}: {type(error).__name__}",
            ) from None

    # ---- acting ------------------------------------------------------------------------
    def load(
        self, model: str, config: Mapping[str, Any] | None = None, *, timeout_s: float = 120.0
    ) -> None:
        """Load (or reload) the model, with `config` as a JSON override when given.

        Triton answers once the model is READY with the new config, or failed. It goes on
        loading when the caller stops waiting: `timeout_s` ends the wait, not the load.
        """
        override = None if config is None else json.dumps(config)
        with self._call(f"loading {model}", timeout_s, f"Triton refused to load {model}") as http:
            http.load_model(model, headers=self._headers(), config=override)

    def infer(
        self,
        model: str,
        inputs: Sequence[httpclient.InferInput],
        *,
        timeout_s: float | None = None,
    ) -> httpclient.InferResult:
        """One inference request (`POST v2/models/{model}/infer`)."""
        with self._call(f"an inference of {model}", timeout_s) as http:
            return http.infer(model, list(inputs))

    # ---- the connection ----------------------------------------------------------------
    def _connection(self) -> httpclient.InferenceServerClient:
        if self._http is None:
            self._http = httpclient.InferenceServerClient(
                self._address, connection_timeout=self.timeout_s, network_timeout=self.timeout_s
            )
        return self._http

    @contextmanager
    def _call(
        self, what: str, timeout_s: float | None = None, refused: str | None = None
    ) -> Iterator[httpclient.InferenceServerClient]:
        """The connection for one call (its own when the call has its own timeout), with every
        failure turned into one TritonError line: "{what}: HTTP {status}: {Triton's answer}",
        or "{refused}: {Triton's answer}" when given."""
        own_timeout = timeout_s is not None and timeout_s != self.timeout_s
        wait_s = timeout_s if timeout_s is not None else self.timeout_s
        try:
            if own_timeout:
                with httpclient.InferenceServerClient(
                    self._address,
                    connection_timeout=min(wait_s, self.timeout_s),
                    network_timeout=wait_s,
                ) as http:
                    yield http
            else:
                yield self._connection()
        except InferenceServerException as error:
            raise self._refusal(error, what, refused) from None
        except TimeoutError:
            self.close()  # an answer may still come on that connection: drop it
            raise self._no_answer(what, wait_s) from None
        except (OSError, HTTPException) as error:
            self.close()
            raise self._unreachable(what, error) from None


class AsyncTritonClient(_PodClient):
    """`TritonClient`'s calls as coroutines, over `tritonclient.http.aio`; use it as an async
    context manager. Each call's timeout is an `asyncio.wait_for` around it.

    With `connections` (tritonscale.triton.connections) the calls go over the driver's
    kept-open client of this pod, which closing this one leaves open; without, over a client
    of its own, opened by the first call and closed with this one.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        repository_key: str | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        connections: Connections | None = None,
    ) -> None:
        super().__init__(endpoint, repository_key, timeout_s=timeout_s)
        self._connections = connections

    async def __aenter__(self) -> AsyncTritonClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        http, self._http = self._http, None
        if http is not None:
            await http.close()

    # ---- reading -----------------------------------------------------------------------
    async def model_config(self, model: str) -> dict[str, Any]:
        """The model's live config (`GET v2/models/{model}/config`)."""
        return await self._call(
            f"reading {model}'s config", lambda http: http.get_model_config(model)
        )

    async def is_live(self) -> bool:
        """Whether the server answers at all (`GET v2/health/live`)."""
        return await self._call(
            "asking whether the server is live", lambda http: http.is_server_live()
        )

    async def is_model_ready(self, model: str, version: str = "") -> bool:
        """Whether the model (or one version of it) is READY (`GET v2/models/{model}/ready`)."""
        return await self._call(
            f"reading {model}'s readiness", lambda http: http.is_model_ready(model, version)
        )

    async def repository_index(self) -> list[dict[str, Any]]:
        """Every model of the repository with its state (`POST v2/repository/index`)."""
        index = await self._call(
            "reading the repository index",
            lambda http: http.get_model_repository_index(headers=self._headers()),
        )
        return list(index)

    async def model_state(self, model: str) -> str | None:
        """`TritonClient.model_state`: the model's state in the repository index."""
        for row in await self.repository_index():
            if row.get("name") == model:
                return row.get("state")
        return None

    async def metrics_text(self) -> str:
        """Triton's Prometheus metrics (`GET /metrics` on the metrics port)."""
        url = self.endpoint.metrics_url
        if not url:
            raise TritonError(self.endpoint.name, "no metrics URL is known for this pod")
        if self._connections is not None:
            session = self._connections.session()
            return await fetch_metrics_text(session, self.endpoint.name, url, self.timeout_s)
        async with aiohttp.ClientSession() as session:
            return await fetch_metrics_text(session, self.endpoint.name, url, self.timeout_s)

    # ---- acting ------------------------------------------------------------------------
    async def load(
        self, model: str, config: Mapping[str, Any] | None = None, *, timeout_s: float = 120.0
    ) -> None:
        """`TritonClient.load`: Triton answers once the model is READY with the new config, or
        failed; it goes on loading when the caller stops waiting."""
        override = None if config is None else json.dumps(config)
        loading = self._connections.loading(self._address) if self._connections else nullcontext()
        with loading:  # the pod's other calls take new connections meanwhile (connections.py)
            await self._call(
                f"loading {model}",
                lambda http: http.load_model(model, headers=self._headers(), config=override),
                timeout_s,
                f"Triton refused to load {model}",
            )

    async def infer(
        self,
        model: str,
        inputs: Sequence[httpclient.InferInput],
        *,
        timeout_s: float | None = None,
    ) -> Any:
        """One inference request (`POST v2/models/{model}/infer`)."""
        return await self._call(
            f"an inference of {model}", lambda http: http.infer(model, list(inputs)), timeout_s
        )

    # ---- the connection ----------------------------------------------------------------
    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[aiohttpclient.InferenceServerClient]:
        if self._connections is not None:
            async with self._connections.triton(self._address) as shared:
                yield shared
            return
        if self._http is None:
            # The session's own total timeout stays out of the way: each call has its own.
            self._http = aiohttpclient.InferenceServerClient(self._address, conn_timeout=None)
        yield self._http

    async def _call(
        self,
        what: str,
        call: Callable[[aiohttpclient.InferenceServerClient], Awaitable[T]],
        timeout_s: float | None = None,
        refused: str | None = None,
    ) -> T:
        """`call` within its timeout, every failure turned into one TritonError line (as
        `TritonClient._call` words them)."""
        wait_s = timeout_s if timeout_s is not None else self.timeout_s
        try:
            async with self._connection() as http:
                return await asyncio.wait_for(call(http), wait_s)
        except InferenceServerException as error:
            raise self._refusal(error, what, refused) from None
        except asyncio.TimeoutError:
            # An answer may still come on that connection: drop it. (A shared client loses
            # only the cancelled request's connection; aiohttp closes it.)
            await self.close()
            raise self._no_answer(what, wait_s) from None
        except (OSError, aiohttp.ClientError) as error:
            await self.close()
            raise self._unreachable(what, error) from None


async def fetch_metrics_text(
    session: aiohttp.ClientSession, pod: str, url: str, timeout_s: float
) -> str:
    """Triton's metrics text at `url` (one GET within `timeout_s`); failures as TritonError."""

    async def get() -> str:
        async with session.get(url) as response:
            if response.status != 200:
                raise TritonError(
                    pod, f"reading metrics at {url}: HTTP {response.status}", str(response.status)
                )
            return await response.text()

    try:
        return await asyncio.wait_for(get(), timeout_s)
    except asyncio.TimeoutError:
        raise TritonUnreachable(
            pod, f"no answer from Triton's metrics at {url} within {timeout_s:g} s", timed_out=True
        ) from None
    except (OSError, aiohttp.ClientError) as error:
        raise TritonUnreachable(
            pod, f"cannot reach Triton's metrics at {url}: {type(error).__name__}"
        ) from None
