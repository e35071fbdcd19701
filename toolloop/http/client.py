"""What a provider needs of its HTTP client (`HttpClient`), and the answer it reads (`Answer`).

Every client answers through `send(url, content, headers, timeout)`, an async context manager
giving an `Answer` whose body is read whole (`read`) or as it arrives (`chunks`, for a stream) and
whose headers are a mapping of lower-case names. A client's errors are the httpx errors the same
failure gives (the keep-alive client maps its own to them), so classification
(toolloop/providers/retry.py) is one. Timeouts: `timeout.read` bounds each wait for bytes (for a
stream, the wait between two events).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Protocol

import httpx


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
