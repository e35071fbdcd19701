"""`HttpxClient`: a fresh httpx client per call, so it works on any event loop (a script's
`asyncio.run`, a test's loop); the SSL context is built once per client object (~10 ms of CPU).

`open_httpx` is the one way toolloop builds an `httpx.AsyncClient` for a provider: the network's
SSL context, the proxy `Network.proxy_for` chose, nothing read from the environment by httpx itself
(the `Network` read it). The keep-alive client's proxied calls and fal's image uploads use it too.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator

import httpx

from toolloop.http.client import Answer
from toolloop.http.network import Network

HTTPX_TIMEOUT = httpx.Timeout(5.0)
"""httpx's own default timeout (5 s), which a request's `timeout=` overrides."""


def open_httpx(
    network: Network,
    *,
    proxy: str | None,
    transport: httpx.AsyncBaseTransport | None = None,
    timeout: float | httpx.Timeout = HTTPX_TIMEOUT,
) -> httpx.AsyncClient:
    """An httpx client trusting `network`'s certificates, through `proxy` (None: direct) or over
    `transport` (a test's `MockTransport`); `timeout`: its default for every request (httpx's 5 s),
    which a request's own `timeout=` overrides."""
    return httpx.AsyncClient(
        transport=transport,
        verify=network.ssl_context(),
        trust_env=False,
        proxy=proxy,
        timeout=timeout,
    )


class HttpxClient:
    """A fresh httpx client per call (any event loop). `transport`: an httpx transport to send
    through instead of the network (a test's `MockTransport`; then no proxy). `network`: the proxy
    and certificates (default: the environment's)."""

    def __init__(
        self,
        transport: httpx.AsyncBaseTransport | None = None,
        *,
        network: Network | None = None,
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
            open_httpx(self.network, proxy=proxy, transport=self.transport) as client,
            client.stream(
                "POST", url, content=content, headers=headers, timeout=timeout
            ) as response,
        ):
            yield Answer(response.status_code, response.headers, response.aiter_bytes)

    async def aclose(self) -> None:
        return None
