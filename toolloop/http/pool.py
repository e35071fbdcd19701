"""The keep-alive client's connections (`KeepAliveClient`, keepalive.py): HTTP/1.1 on
`asyncio.Protocol` and `httptools` (llhttp), one parser per connection, one dict of headers per
answer.

`Pool` keeps the idle connections of one event loop by (host, port, TLS). A connection goes back
to the pool only when its answer was read to the end and the server keeps it alive; an idle one is
closed after `IDLE_S` (30 s). Measured at 500 calls in flight on one loop (`bench/http_clients.py`):
see bench/PROFILE-19.md.

Stale connections: a server closes keep-alive connections that sat idle, and a request sent on one
as it closes finds it reset or closed before any response. Such a failure, on a REUSED connection
and before the first byte of the response, is the connection's, not the provider's: the request is
sent once more on a fresh connection. Every other failure comes out as the httpx error the per-call
path gives for it (connect timeout `ConnectTimeout`, no connection `ConnectError`, a wait for bytes
past `timeout.read` `ReadTimeout`, a connection closed or a malformed answer mid-way
`RemoteProtocolError`, else `ReadError`), so classification (toolloop/providers/retry.py) is one.

A streamed answer's reads can be held (`_Connection.hold`, `Answer.hold`: `pause_reading`, then a
timer resumes): what the server sends meanwhile comes in one `data_received`, one chunk.

TLS through `loop.create_connection(ssl=...)` with the SSL context of `HttpxClient.verify`.
The request asks for no content encoding; a gzip or deflate answer is decoded all the same.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
import zlib
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlsplit

import httptools
import httpx

log = logging.getLogger("toolloop.providers")

IDLE_S = 30.0
"""An idle pooled connection older than this is closed, not reused."""

_Key = tuple[str, int, bool]


class _Stale(Exception):
    """A reused connection failed before any byte of its answer: send once more on a fresh one."""


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: a request written, its answer parsed as the bytes arrive."""

    __slots__ = (
        "_held",
        "_waiter",
        "body",
        "closed",
        "complete",
        "error",
        "gone",
        "headers",
        "idle_since",
        "keep_alive",
        "key",
        "loop",
        "parser",
        "raw_headers",
        "reused",
        "status",
        "transport",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, key: _Key) -> None:
        self.loop = loop
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.parser: Any = None
        self.status = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.headers: dict[str, str] | None = (
            None  # set when the status line and headers are in
        )
        self.body: list[bytes] = []
        self.complete = False
        self.closed = False
        self.error: BaseException | None = None
        self.reused = False
        self.keep_alive = False
        self.idle_since = 0.0
        self._waiter: asyncio.Future[None] | None = None
        self._held: asyncio.TimerHandle | None = None
        """While the reads are held (`hold`): the timer that resumes them."""
        self.gone: asyncio.Future[None] | None = None
        """Set by `Pool.aclose`: done once the transport is closed (`connection_lost`)."""

    # -- asyncio.Protocol -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # one per connection: it reads answer after answer
        self.parser = httptools.HttpResponseParser(self)
        self.transport = transport  # type: ignore[assignment]  # (uvloop's is no asyncio.Transport)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as error:
            self.error = httpx.RemoteProtocolError(f"malformed HTTP answer: {error}")
            self._abort()
        self._wake()

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if (
            exc is None
            and self.headers is not None
            and not self.complete
            and _to_close(self.headers)
        ):
            self.complete = (
                True  # an answer without a length or chunks ends with the connection
            )
        if self.error is None and not self.complete:
            self.error = exc or EOFError("the server closed the connection")
        self._wake()
        if self.gone is not None and not self.gone.done():
            self.gone.set_result(None)

    # -- httptools callbacks ---------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        headers: dict[str, str] = {}
        for raw_name, raw_value in self.raw_headers:
            name, value = (
                raw_name.decode("latin-1").lower(),
                raw_value.decode("latin-1"),
            )
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        self.headers = headers

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True
        # (llhttp forgets it once past the message)
        self.keep_alive = self.parser.should_keep_alive()

    # -- the caller's side -----------------------------------------------------------------------

    def start(self, request: bytes) -> None:
        """Send `request` (a whole HTTP/1.1 request) and get ready to parse its answer."""
        assert self.transport is not None
        self.status, self.raw_headers, self.headers, self.body = 0, [], None, []
        self.complete = self.keep_alive = False
        self.transport.write(request)

    async def wait(self, timeout_s: float | None) -> None:
        """Until more of the answer arrived, the connection closed, or `timeout_s` passed."""
        if self.error is not None:
            raise self.error
        waiter = self._waiter = self.loop.create_future()
        timer = (
            None
            if timeout_s is None
            else self.loop.call_later(timeout_s, _expire, waiter)
        )
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    def hold(self, seconds: float) -> None:
        """Read nothing for `seconds`: what the server sends meanwhile waits in the socket's buffer
        and comes as one piece when reading resumes (one wake-up, not one per TCP segment). Not
        while the answer is complete or the connection closed; a hold in force stays as it is."""
        if (
            self._held is not None
            or self.complete
            or self.closed
            or self.transport is None
        ):
            return
        self.transport.pause_reading()
        self._held = self.loop.call_later(seconds, self._resume)

    def _resume(self) -> None:
        self._held = None
        if not self.closed and self.transport is not None:
            self.transport.resume_reading()

    def _unhold(self) -> None:
        if self._held is not None:
            self._held.cancel()
            self._held = None

    def reusable(self) -> bool:
        return (
            self.complete and self.keep_alive and not self.closed and self.error is None
        )

    def close(self) -> None:
        self.closed = True
        self._unhold()
        if self.transport is not None:
            self.transport.close()

    def _abort(self) -> None:
        self.closed = True
        self._unhold()
        if self.transport is not None:
            self.transport.abort()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class Pool:
    """Idle keep-alive connections by (host, port, TLS), for one event loop (module docstring).
    `tls`: the SSL context for https, made when first needed."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, tls: Callable[[], ssl.SSLContext]
    ) -> None:
        self.loop = loop
        self._tls = tls
        self._idle: dict[_Key, list[_Connection]] = {}
        self._swept = 0.0

    async def post(
        self, url: str, content: bytes, headers: dict[str, str], timeout: httpx.Timeout
    ) -> _Connection:
        """A connection whose answer to the POST has its status and headers in (`status`,
        `headers`); read the body with `chunks`, then hand it back with `release`."""
        parts = urlsplit(url)
        tls = parts.scheme == "https"
        host = parts.hostname or ""
        port = parts.port or (443 if tls else 80)
        request = _request(parts, host, port, tls, content, headers)
        key = (host, port, tls)
        try:
            return await self._answer(key, request, timeout, pooled=True)
        except _Stale as stale:
            log.info(
                "POST %s: a kept-alive connection was closed under the request (%s); "
                "sending it again on a fresh connection",
                url,
                stale,
            )
        return await self._answer(key, request, timeout, pooled=False)

    def release(self, conn: _Connection) -> None:
        """Back to the pool when its answer was read to the end and the server keeps it open."""
        if conn.reusable():
            conn.idle_since = time.monotonic()
            self._idle.setdefault(conn.key, []).append(conn)
        else:
            conn.close()

    async def _answer(
        self, key: _Key, request: bytes, timeout: httpx.Timeout, *, pooled: bool
    ) -> _Connection:
        """A connection whose answer's status and headers are in: a pooled one when `pooled` and
        one is idle, else a fresh one. Raises `_Stale` for a reused one closed before answering."""
        conn = self._pooled(key) if pooled else None
        if conn is None:
            conn = await self._connect(key, timeout)
        conn.start(request)
        try:
            while conn.headers is None:
                await conn.wait(timeout.read)
        except TimeoutError as error:
            conn.close()
            raise httpx.ReadTimeout(f"no answer within {timeout.read} s") from error
        except httpx.TransportError:
            conn.close()
            raise
        except BaseException as error:  # closed, reset, cancelled
            conn.close()
            if (
                conn.reused
                and isinstance(error, OSError | EOFError)
                and not conn.raw_headers
            ):
                raise _Stale(f"{type(error).__name__}: {error}") from error
            if isinstance(error, OSError | EOFError):
                raise _transport_error(error) from error
            raise
        return conn

    def _pooled(self, key: _Key) -> _Connection | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < IDLE_S:
                conn.reused = True
                return conn
            conn.close()
        if now - self._swept > IDLE_S:
            self._sweep(now)
        return None

    def _sweep(self, now: float) -> None:
        """Close the idle connections past `IDLE_S` (the ones below the top of each pool)."""
        self._swept = now
        for key, idle in self._idle.items():
            keep = [
                conn
                for conn in idle
                if not conn.closed and now - conn.idle_since < IDLE_S
            ]
            for conn in idle:
                if conn not in keep:
                    conn.close()
            self._idle[key] = keep

    async def _connect(self, key: _Key, timeout: httpx.Timeout) -> _Connection:
        host, port, tls = key
        loop = self.loop
        options: dict[str, Any] = (
            {"ssl": self._tls(), "server_hostname": host} if tls else {}
        )
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Connection(loop, key), host, port, **options
                ),
                timeout.connect,
            )
        except TimeoutError as error:
            raise httpx.ConnectTimeout(
                f"no connection to {host}:{port} within {timeout.connect} s"
            ) from error
        except OSError as error:  # refused, unresolved, TLS
            raise httpx.ConnectError(f"{type(error).__name__}: {error}") from error
        return conn

    async def chunks(
        self, conn: _Connection, timeout: httpx.Timeout
    ) -> AsyncIterator[bytes]:
        """The body as it arrives (decoded when the server encoded it)."""
        assert conn.headers is not None
        decoder = _decoder(conn.headers.get("content-encoding", ""))
        while True:
            if (
                conn.body
            ):  # what arrived since the last read, as one piece: a stream reader
                # then passes its text on as one delta
                chunks, conn.body = (
                    conn.body,
                    [],
                )
                data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                yield data if decoder is None else decoder.decompress(data)
                continue
            if conn.complete:
                if decoder is not None:
                    yield decoder.flush()
                return
            try:
                await conn.wait(timeout.read)
            except TimeoutError as error:
                conn.close()
                raise httpx.ReadTimeout(f"sent nothing for {timeout.read} s") from error
            except (OSError, EOFError) as error:
                raise _transport_error(error) from error

    def close(self) -> None:
        """Close the idle connections."""
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()

    async def aclose(self, within_s: float = 1.0) -> None:
        """Close the idle connections and wait (at most `within_s`) until their sockets are closed,
        so none is left to the garbage collector when the loop ends (a TLS close needs the loop)."""
        idle = [conn for conns in self._idle.values() for conn in conns]
        self._idle.clear()
        waits = []
        for conn in idle:
            if conn.transport is not None and not conn.transport.is_closing():
                conn.gone = self.loop.create_future()
                waits.append(conn.gone)
            conn._abort()
        if waits:
            await asyncio.wait(waits, timeout=within_s)


def _request(
    parts: Any, host: str, port: int, tls: bool, content: bytes, headers: dict[str, str]
) -> bytes:
    path = parts.path or "/"
    if parts.query:
        path = f"{path}?{parts.query}"
    authority = host if port == (443 if tls else 80) else f"{host}:{port}"
    lines = [
        f"POST {path} HTTP/1.1\r\nhost: {authority}\r\naccept-encoding: identity\r\n"
    ]
    lines.extend(f"{name}: {value}\r\n" for name, value in headers.items())
    lines.append(f"content-length: {len(content)}\r\n\r\n")
    return "".join(lines).encode("latin-1") + content


_ENCODED_BODY_HEADERS = frozenset(
    {"content-encoding", "content-length", "transfer-encoding"}
)


def _to_close(headers: dict[str, str]) -> bool:
    """The answer's body runs to the connection's close: it has no length and no chunks."""
    return "content-length" not in headers and "transfer-encoding" not in headers


def decoded_headers(headers: dict[str, str]) -> dict[str, str]:
    """The answer's headers, without those that describe an encoded body (the body is handed over
    decoded and whole or as chunks, as httpx and aiohttp hand it)."""
    if "content-encoding" in headers or "transfer-encoding" in headers:
        return {k: v for k, v in headers.items() if k not in _ENCODED_BODY_HEADERS}
    return headers


def _decoder(encoding: str) -> Any:
    encoding = encoding.strip().lower()
    if encoding == "gzip":
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if encoding == "deflate":
        return zlib.decompressobj()
    return None


def _transport_error(error: BaseException) -> httpx.TransportError:
    text = f"{type(error).__name__}: {error}"
    if isinstance(error, EOFError | ConnectionResetError | BrokenPipeError):
        return httpx.RemoteProtocolError(text)
    return httpx.ReadError(text)
