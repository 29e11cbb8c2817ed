"""Keep-alive connections to the Triton pods, shared by every call of one driver.

A client opened per call pays for an HTTP session and a TCP connection each time. At a
fleet's size (1,000 pods, a few calls per pod and model every tick) that was a quarter of the
operator's CPU (loadtests/README.md, "The operator on a fleet"). A driver keeps one
`Connections` instead: one `tritonclient.http.aio` client per pod address, whose connection
pool keeps its connections open between calls, and one aiohttp session for the metrics text
and Prometheus's API.

A call that its timeout cancels loses only its own connection (aiohttp closes a connection
whose answer was not read to the end), so a pod that hangs never breaks another call. A
pod's client unused for `idle_s` (the pod is gone, or nothing asks it any more) is closed;
one with a call in flight (a load may take minutes) never is.

While a load is in flight to a pod, calls to that pod go over new connections instead.
Triton's HTTP server keeps each connection on one of its threads and runs a load on the
thread of the load's connection until the load ends (measured with a reload that hangs: two
of six kept-open connections answered nothing until the load ended, while every new
connection answered at once). A kept-open connection may sit on that thread.

Everything here belongs to the event loop that first used it: the driver closes it on that
loop (`await connections.close()`) when it stops.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass

import aiohttp
import tritonclient.http.aio as aiohttpclient

DEFAULT_IDLE_S = 300.0
# The plain HTTP session's connections (Triton's /metrics, Prometheus's API): each pod's kept
# open from one read to the next. aiohttp's defaults (100 connections in all, closed after 15 s
# idle) reopened one for nearly every read: a fleet has more pods than that, and a tick comes
# once an interval (15 s by default).
SESSION_KEEPALIVE_S = 120.0


@dataclass
class _Pooled:
    client: aiohttpclient.InferenceServerClient
    used_at: float
    calls: int = 0  # in flight


class Connections:
    """One Triton client per pod address and one HTTP session, kept open between calls."""

    def __init__(
        self, *, idle_s: float = DEFAULT_IDLE_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.idle_s = idle_s
        self._clock = clock
        self._pods: dict[str, _Pooled] = {}
        self._session: aiohttp.ClientSession | None = None
        self._swept_at = clock()
        self._closing: set[asyncio.Future[None]] = set()
        self._loading: dict[str, int] = {}  # pod address -> loads in flight

    def __len__(self) -> int:
        """How many pods' clients are open."""
        return len(self._pods)

    @asynccontextmanager
    async def triton(self, address: str) -> AsyncIterator[aiohttpclient.InferenceServerClient]:
        """The client of one pod (`host:port`) for the calls made inside the block: the kept
        one, or a new one while a load is in flight to the pod (`loading`)."""
        if self._loading.get(address):
            fresh = aiohttpclient.InferenceServerClient(address, conn_timeout=None)
            try:
                yield fresh
            finally:
                await fresh.close()
            return
        now = self._clock()
        self._sweep(now)
        pooled = self._pods.get(address)
        if pooled is None:
            # The session's own total timeout stays out of the way: each call has its own.
            client = aiohttpclient.InferenceServerClient(address, conn_timeout=None)
            pooled = self._pods[address] = _Pooled(client, now)
        pooled.calls += 1
        try:
            yield pooled.client
        finally:
            pooled.calls -= 1
            pooled.used_at = self._clock()

    @contextmanager
    def loading(self, address: str) -> Iterator[None]:
        """Marks a load in flight to the pod for as long as the block runs."""
        self._loading[address] = self._loading.get(address, 0) + 1
        try:
            yield
        finally:
            self._loading[address] -= 1
            if not self._loading[address]:
                del self._loading[address]

    def session(self) -> aiohttp.ClientSession:
        """The session for plain HTTP GETs (Triton's /metrics, Prometheus's API)."""
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=SESSION_KEEPALIVE_S)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    def _sweep(self, now: float) -> None:
        """Close the clients of pods nobody asked for `idle_s` (looked at every idle_s / 4)."""
        if now - self._swept_at < self.idle_s / 4:
            return
        self._swept_at = now
        for address, pooled in list(self._pods.items()):
            if pooled.calls == 0 and now - pooled.used_at > self.idle_s:
                del self._pods[address]
                closing = asyncio.ensure_future(pooled.client.close())
                self._closing.add(closing)
                closing.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        """Close every client and the session (on the loop that used them)."""
        pooled, self._pods = list(self._pods.values()), {}
        session, self._session = self._session, None
        for each in pooled:
            await each.client.close()
        if session is not None:
            await session.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
