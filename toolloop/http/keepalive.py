"""`KeepAliveClient`: keep-alive HTTP/1.1 connections for one long-lived event loop (a worker's),
on `asyncio.Protocol` and `httptools` (llhttp, toolloop/http/pool.py), with no per-request session,
trace or header objects beyond one dict.

One pool of idle connections per (host, port, TLS), shared by every call made on the loop that
first used the client; a call from another loop goes through a fresh httpx client instead
(`HttpxClient`). CPU per call at 500 in flight: bench/http_clients.py, bench/PROFILE-19.md.

Proxies and certificates (`network=`, toolloop/http/network.py; default from the environment:
HTTPS_PROXY / HTTP_PROXY / NO_PROXY, SSL_CERT_FILE / SSL_CERT_DIR): the pool's TLS trusts the same
SSL context as `HttpxClient`; a request whose host goes through a proxy is sent by httpx (its proxy
support: CONNECT tunnels for https), one httpx client per proxy kept on the pool's loop.

Stale connections: a server closes keep-alive connections that sat idle, and a request sent on one
as it closes finds it reset or closed before any response. Such a failure, on a REUSED connection
and before the response began, is the connection's, not the provider's: the request is sent once
more on a fresh connection (pool.py). Any other failure is the httpx error the same failure gives
(toolloop/providers/retry.py classifies it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import httpx

from toolloop.http.client import Answer
from toolloop.http.httpx_client import HttpxClient, open_httpx
from toolloop.http.network import Network
from toolloop.http.pool import Pool, decoded_headers

log = logging.getLogger("toolloop.providers")


class KeepAliveClient:
    """Keep-alive HTTP/1.1 connections (toolloop/http/pool.py) for the event loop that first uses
    it; a call from another loop goes through a fresh httpx client. `network`: the proxy and
    certificates (default: the environment's); a host reached through a proxy is sent by one httpx
    client per proxy, kept on the pool's loop (CONNECT tunnels kept alive by httpx)."""

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
        # as httpx logs it
        log.info('HTTP Request: POST %s "HTTP/1.1 %d"', url, conn.status)
        try:
            yield Answer(
                conn.status,
                decoded_headers(conn.headers or {}),
                lambda: pool.chunks(conn, timeout),
                conn.hold,
            )
        finally:
            pool.release(conn)

    @contextlib.asynccontextmanager
    async def _through(
        self,
        proxy: str,
        url: str,
        content: bytes,
        headers: dict[str, str],
        timeout: httpx.Timeout,
    ) -> AsyncIterator[Answer]:
        client = self._proxied.get(proxy)
        if client is None:
            client = self._proxied[proxy] = open_httpx(self.network, proxy=proxy)
        async with client.stream(
            "POST", url, content=content, headers=headers, timeout=timeout
        ) as response:
            yield Answer(response.status_code, response.headers, response.aiter_bytes)

    async def aclose(self) -> None:
        """Close the idle keep-alive connections (on the pool's loop)."""
        if self._pool is not None:
            await self._pool.aclose()
        self._pool = None
        proxied, self._proxied = self._proxied, {}
        for client in proxied.values():
            await client.aclose()
