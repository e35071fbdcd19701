"""The HTTP client a provider sends its model calls with: one object, handed to the provider
(`http_client=`), or the provider's own.

`HttpxClient` (the default): a fresh httpx client per call, so it works on any event loop (a script's
`asyncio.run`, a test's loop); the SSL context is built once per client object (~10 ms of CPU).
`KeepAliveClient`: keep-alive HTTP/1.1 connections for a long-lived event loop (a worker's), shared
by every call made on the loop that first used it (asyncio.Protocol + httptools, keepalive.py); a
call from another loop goes through a fresh httpx client instead. `client_from_env()` picks it unless
`TOOLLOOP_HTTP` is `httpx`. CPU per call at 500 in flight: bench/http_clients.py, bench/PROFILE-19.md.

Proxies and certificates (`network=`, toolloop/providers/network.py; default from the environment:
HTTPS_PROXY / HTTP_PROXY / NO_PROXY, SSL_CERT_FILE / SSL_CERT_DIR): both clients trust the same SSL
context; a request whose host goes through a proxy is sent by httpx (its proxy support: CONNECT
tunnels for https), the keep-alive client keeping one httpx client per proxy on its loop.

Both answer through `send(url, content, headers, timeout)`, an async context manager giving an
`Answer` whose body is read whole (`read`) or as it arrives (`chunks`, for a stream) and whose
headers are a mapping of lower-case names; the keep-alive client's errors come out as the httpx
errors the same failure gives, so classification (retry.py) is one. Timeouts: `timeout.read`
bounds each wait for bytes (for a stream, the wait between two events).

Stale connections (KeepAliveClient): a server closes keep-alive connections that sat idle, and a
request sent on one as it closes finds it reset or closed before any response. Such a failure, on a
REUSED connection and before the response began, is the connection's, not the provider's: the request
is sent once more on a fresh connection. Any other failure is a transport error (retry.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Protocol

import httpx

from toolloop.providers.keepalive import Pool, decoded_headers
from toolloop.providers.network import Network

log = logging.getLogger("toolloop.providers")


class Answer:
    """An HTTP answer being read: `status`, `headers`, and the body (`read()` or `chunks()`)."""

    __slots__ = ("_chunks", "headers", "hold", "status")

    def __init__(
        self,
        status: int,
        headers: Mapping[str, str],
        chunks: Callable[[], AsyncIterator[bytes]],
        hold: Callable[[float], None] | None = None,
    ):
        self.status = status
        self.headers = headers
        self._chunks = chunks
        self.hold = hold
        """`hold(s)`: read nothing more for `s` seconds, so what arrives meanwhile comes as one
        chunk (None: the client cannot; each chunk comes as it arrives)."""

    def chunks(self) -> AsyncIterator[bytes]:
        return self._chunks()

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self._chunks()])


class HttpClient(Protocol):
    """What a provider needs of its HTTP client."""

    def send(
        self, url: str, content: bytes, headers: dict[str, str], timeout: httpx.Timeout
    ) -> contextlib.AbstractAsyncContextManager[Answer]: ...

    async def aclose(self) -> None: ...


class HttpxClient:
    """A fresh httpx client per call (any event loop). `transport`: an httpx transport to send
    through instead of the network (a test's `MockTransport`; then no proxy). `network`: the proxy
    and certificates (default: the environment's)."""

    def __init__(
        self, transport: httpx.AsyncBaseTransport | None = None, *, network: Network | None = None
    ) -> None:
        self.transport = transport
        self.network = network or Network()

    def verify(self) -> ssl.SSLContext:
        return self.network.ssl_context()

    @contextlib.asynccontextmanager
    async def send(
        self, url: str, content: bytes, headers: dict[str, str], timeout: httpx.Timeout
    ) -> AsyncIterator[Answer]:
        proxy = None if self.transport is not None else self.network.proxy_for(url)
        async with (
            httpx.AsyncClient(
                transport=self.transport, verify=self.verify(), trust_env=False, proxy=proxy
            ) as client,
            client.stream("POST", url, content=content, headers=headers, timeout=timeout) as response,
        ):
            yield Answer(response.status_code, response.headers, response.aiter_bytes)

    async def aclose(self) -> None:
        return None


class KeepAliveClient:
    """Keep-alive HTTP/1.1 connections (toolloop/providers/keepalive.py) for the event loop that
    first uses it; a call from another loop goes through a fresh httpx client. `network`: the proxy
    and certificates (default: the environment's); a host reached through a proxy is sent by one
    httpx client per proxy, kept on the pool's loop (CONNECT tunnels kept alive by httpx)."""

    def __init__(self, *, network: Network | None = None) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self._pool: Pool | None = None
        self.network = network or Network()
        self._other = HttpxClient(network=self.network)
        """For a call made on another loop than the pool's."""
        self._proxied: dict[str, httpx.AsyncClient] = {}
        """An httpx client per proxy URL, on the pool's loop."""

    @property
    def used(self) -> bool:
        """True once a call went through the keep-alive pool."""
        return self._pool is not None

    @contextlib.asynccontextmanager
    async def send(
        self, url: str, content: bytes, headers: dict[str, str], timeout: httpx.Timeout
    ) -> AsyncIterator[Answer]:
        running = asyncio.get_running_loop()
        if self.loop is None:
            self.loop = running
        if self.loop is not running:
            async with self._other.send(url, content, headers, timeout) as answer:
                yield answer
            return
        proxy = self.network.proxy_for(url)
        if proxy is not None:
            async with self._through(proxy, url, content, headers, timeout) as answer:
                yield answer
            return
        pool = self._pool
        if pool is None:
            pool = self._pool = Pool(running, self._other.verify)
        conn = await pool.post(url, content, headers, timeout)
        log.info('HTTP Request: POST %s "HTTP/1.1 %d"', url, conn.status)  # as httpx logs it
        try:
            yield Answer(conn.status, decoded_headers(conn.headers or {}), lambda: pool.chunks(conn, timeout),
                         conn.hold)  # fmt: skip
        finally:
            pool.release(conn)

    @contextlib.asynccontextmanager
    async def _through(
        self, proxy: str, url: str, content: bytes, headers: dict[str, str], timeout: httpx.Timeout
    ) -> AsyncIterator[Answer]:
        client = self._proxied.get(proxy)
        if client is None:
            client = httpx.AsyncClient(verify=self.network.ssl_context(), trust_env=False, proxy=proxy)
            self._proxied[proxy] = client
        async with client.stream("POST", url, content=content, headers=headers, timeout=timeout) as response:
            yield Answer(response.status_code, response.headers, response.aiter_bytes)

    async def aclose(self) -> None:
        """Close the idle keep-alive connections (on the pool's loop)."""
        if self._pool is not None:
            await self._pool.aclose()
        self._pool = None
        proxied, self._proxied = self._proxied, {}
        for client in proxied.values():
            await client.aclose()


def client_from_env(network: Network | None = None) -> HttpClient:
    """A `KeepAliveClient` for a long-lived loop unless TOOLLOOP_HTTP is `httpx` (then an
    `HttpxClient`); `network` (default: the environment's proxy and certificates)."""
    if os.environ.get("TOOLLOOP_HTTP", "").strip() == "httpx":
        return HttpxClient(network=network)
    return KeepAliveClient(network=network)
