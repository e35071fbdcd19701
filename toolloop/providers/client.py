"""The HTTP client a provider sends its model calls with: one object, handed to the provider
(`http_client=`), or the provider's own.

`HttpxClient` (the default): a fresh httpx client per call, so it works on any event loop (a script's
`asyncio.run`, a test's loop); the SSL context is built once per client object (~10 ms of CPU).
`KeepAliveClient`: one aiohttp session for a long-lived event loop (a worker's), sharing keep-alive
connections between every call made on the loop that first used it; a call from another loop goes
through a fresh httpx client instead. Measured at 500 calls in flight on one loop
(docs/operations.md): about a fifth of the CPU of a fresh httpx client per call. `client_from_env()`
picks it when aiohttp is installed and `TOOLLOOP_HTTP` is not `httpx`.

Both answer through `send(url, content, headers, timeout)`, an async context manager giving an
`Answer` whose body is read whole (`read`) or as it arrives (`chunks`, for a stream); aiohttp's
errors come out as the httpx errors the same failure gives, so classification (retry.py) is one.
Timeouts: `timeout.read` bounds each wait for bytes (for a stream, the wait between two events).

Stale connections (KeepAliveClient): a server closes keep-alive connections that sat idle, and a
request sent on one as it closes finds it reset or closed before any response. Such a failure, on a
REUSED connection and before the response began, is the connection's, not the provider's: the request
is sent once more on a fresh connection. Any other failure is a transport error (retry.py).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import errno
import importlib.util
import logging
import os
import ssl
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import httpx

log = logging.getLogger("toolloop.providers")


class Answer:
    """An HTTP answer being read: `status`, `headers`, and the body (`read()` or `chunks()`)."""

    __slots__ = ("_chunks", "headers", "status")

    def __init__(self, status: int, headers: httpx.Headers, chunks: Callable[[], AsyncIterator[bytes]]):
        self.status = status
        self.headers = headers
        self._chunks = chunks

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
    through instead of the network (a test's `MockTransport`)."""

    def __init__(self, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.transport = transport
        self._ssl: ssl.SSLContext | None = None

    def verify(self) -> ssl.SSLContext:
        if self._ssl is None:
            import certifi

            self._ssl = ssl.create_default_context(cafile=certifi.where())
        return self._ssl

    @contextlib.asynccontextmanager
    async def send(
        self, url: str, content: bytes, headers: dict[str, str], timeout: httpx.Timeout
    ) -> AsyncIterator[Answer]:
        async with (
            httpx.AsyncClient(transport=self.transport, verify=self.verify(), trust_env=False) as client,
            client.stream("POST", url, content=content, headers=headers, timeout=timeout) as response,
        ):
            yield Answer(response.status_code, response.headers, response.aiter_bytes)

    async def aclose(self) -> None:
        return None


class KeepAliveClient:
    """One aiohttp session, with keep-alive connections, for the event loop that first uses it."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self._session: Any = None
        self._fresh: Any = None
        """A session whose every request opens a new connection: the one retry of a stale one."""
        self._other = HttpxClient()
        """For a call made on another loop than the session's."""

    @property
    def used(self) -> bool:
        """True once a call went through the keep-alive session."""
        return self._session is not None

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
        import aiohttp

        limits = aiohttp.ClientTimeout(
            total=None, connect=timeout.pool, sock_connect=timeout.connect, sock_read=timeout.read
        )
        async with contextlib.AsyncExitStack() as stack:
            response = await self._open(stack, url, content, headers, limits)
            log.info('HTTP Request: POST %s "HTTP/1.1 %d"', url, response.status)  # as httpx logs it
            # aiohttp decodes the body: drop the headers that describe the encoded one
            kept = [(k, v) for k, v in response.raw_headers if k.lower() not in _ENCODED_BODY_HEADERS]

            async def chunks() -> AsyncIterator[bytes]:
                try:
                    async for chunk in response.content.iter_any():
                        yield chunk
                except (aiohttp.ClientError, TimeoutError) as error:
                    raise _as_httpx(error) from error

            yield Answer(response.status, httpx.Headers(kept), chunks)

    async def _open(
        self, stack: contextlib.AsyncExitStack, url: str, content: bytes, headers: dict[str, str], limits: Any
    ) -> Any:
        """The response of a POST (its headers read), once more on a fresh connection when a reused
        one was closed under the request."""
        import aiohttp

        if self._session is None:
            atexit.register(_close_at_exit, weakref.ref(self))
            traces = aiohttp.TraceConfig()
            traces.on_connection_reuseconn.append(_reused)
            connector = aiohttp.TCPConnector(limit=0, ssl=self._other.verify(), keepalive_timeout=30)
            self._session = aiohttp.ClientSession(
                connector=connector, trust_env=False, trace_configs=[traces]
            )
        attempt = _Attempt()
        try:
            return await stack.enter_async_context(
                self._session.post(
                    url,
                    data=content,
                    headers=headers,
                    timeout=limits,
                    allow_redirects=False,
                    trace_request_ctx=attempt,
                )
            )
        except (aiohttp.ClientError, TimeoutError) as error:
            if not (attempt.reused and _stale(error)):
                raise _as_httpx(error) from error
            log.info("POST %s: a kept-alive connection was closed under the request (%s: %s); "
                     "sending it again on a fresh connection", url, type(error).__name__, error)  # fmt: skip
        if self._fresh is None:
            connector = aiohttp.TCPConnector(limit=0, ssl=self._other.verify(), force_close=True)
            self._fresh = aiohttp.ClientSession(connector=connector, trust_env=False)
        try:
            return await stack.enter_async_context(
                self._fresh.post(url, data=content, headers=headers, timeout=limits, allow_redirects=False)
            )
        except (aiohttp.ClientError, TimeoutError) as error:
            raise _as_httpx(error) from error

    async def aclose(self) -> None:
        """Close the keep-alive connections (call it on the session's loop). A client still open when
        the process exits is closed then, on its loop if that still runs (a worker's, in its thread):
        an aiohttp session left to the garbage collector at exit reports itself unclosed."""
        for session in (self._session, self._fresh):
            if session is not None:
                await session.close()
        self._session = self._fresh = None


def _close_at_exit(ref: weakref.ReferenceType[KeepAliveClient]) -> None:
    client = ref()
    loop = None if client is None else client.loop
    if client is None or client._session is None or loop is None or loop.is_closed() or not loop.is_running():
        return
    with contextlib.suppress(Exception):  # at exit: the connections close with the process anyway
        asyncio.run_coroutine_threadsafe(client.aclose(), loop).result(timeout=2.0)


def client_from_env() -> HttpClient:
    """A `KeepAliveClient` for a long-lived loop when aiohttp is installed and TOOLLOOP_HTTP is not
    `httpx`; else an `HttpxClient`."""
    if os.environ.get("TOOLLOOP_HTTP", "").strip() == "httpx" or importlib.util.find_spec("aiohttp") is None:
        return HttpxClient()
    return KeepAliveClient()


class _Attempt:
    """One request on the keep-alive session: did it get a pooled connection."""

    __slots__ = ("reused",)

    def __init__(self) -> None:
        self.reused = False


async def _reused(session: Any, context: Any, params: Any) -> None:
    """aiohttp's trace hook: the request got a pooled (kept-alive) connection."""
    context.trace_request_ctx.reused = True


def _stale(error: BaseException) -> bool:
    """A failure that a connection the server had closed gives: reset, broken pipe, or closed before
    any response."""
    import aiohttp

    if isinstance(error, aiohttp.ServerDisconnectedError):
        return True
    return isinstance(error, ConnectionResetError | BrokenPipeError) or (
        isinstance(error, aiohttp.ClientOSError) and error.errno in (errno.ECONNRESET, errno.EPIPE)
    )


_ENCODED_BODY_HEADERS = frozenset({b"content-encoding", b"content-length", b"transfer-encoding"})


def _as_httpx(error: BaseException) -> httpx.TransportError:
    """aiohttp's error as the httpx error the per-call path would raise for the same failure."""
    import aiohttp

    text = f"{type(error).__name__}: {error}"
    if isinstance(error, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout(text)
    if isinstance(error, TimeoutError):  # aiohttp's read timeouts are TimeoutErrors too
        return httpx.ReadTimeout(text)
    if isinstance(error, aiohttp.ClientConnectorError):
        return httpx.ConnectError(text)
    if isinstance(error, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return httpx.RemoteProtocolError(text)
    return httpx.ReadError(text)
