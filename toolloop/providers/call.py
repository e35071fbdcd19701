"""One model call, the one HTTP path of every provider: POST a JSON body through the provider's
`HttpClient` (toolloop/http/), read the answer whole or as a stream of Server-Sent Events, classify
it (retry.py, pure functions), retry within bounds.

`call_json` makes one model call of up to `RetryPolicy.attempts` attempts, bounded by
`RetryPolicy.total_s` of wall time. Without `stream` it returns the parsed JSON of a 2xx answer;
with `stream` (a factory of the provider's `StreamReader`, one per attempt) the 2xx answer is read as
events, each handed to the reader as it arrives, and the reader's `result()` is returned.

Streaming, what differs:
- the timeout is an idle timeout: it bounds each wait for the next bytes, not the whole answer, so
  a long answer that keeps arriving is never cut;
- an `error` event in the stream (the reader raises `StreamFailure`) is classified as the HTTP
  status it stands for (an `overloaded_error` as a 529: retried with backoff);
- a stream cut after its answer began (the connection dropped, or the body ended before the
  reader's last event) is retried like a 5xx;
- each read's bytes go to the reader (`feed`), then its text goes to `on_delta` as one delta
  (`flush`): a delta per read, not per event (SPEC 4.3 lets a delta carry any amount of text);
  with `toolloop.deltas.READ_HOLD` set (a durable worker sets it to its delta interval), a read
  that passed text on is followed by that long without reading (`Answer.hold`), so what the
  server sends meanwhile comes as one read and one delta, not one per TCP segment;
- a 2xx answer that is not `text/event-stream` is read as the whole answer (a server or proxy
  that ignored `stream`);
- before a retry of an attempt that passed deltas on, `on_delta` gets a discard delta
  (`DeltaEvent(discard=True)`): what it showed of the answer is void, the answer starts again.
The caller's abort is checked before each attempt and races (`toolloop.abort.race`) every request,
every read and every backoff sleep: it is raised unchanged (the signal's own `AbortError`) the
moment it fires.
Keys: headers are built by the caller and never logged; every message is passed through `redact`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextvars import ContextVar
from typing import Any, Protocol

import httpx

from toolloop.abort import AbortSignal, race
from toolloop.contract import OnDelta
from toolloop.deltas import READ_HOLD
from toolloop.deltas import relay as as_relay
from toolloop.errors import PromptGenError, PromptGenTimeoutError
from toolloop.fastjson import dumps, loads_exact, valid_text
from toolloop.http import Answer, HttpClient
from toolloop.providers.base import Secret, redact
from toolloop.providers.retry import (
    STREAM_ERROR_STATUS,
    Endpoint,
    classify,
    error_detail,
    error_fields,
    final_error,
)

log = logging.getLogger("toolloop.providers")

ResponseObserver = Callable[[int, Mapping[str, str]], None]
observe_responses: ContextVar[ResponseObserver | None] = ContextVar(
    "observe_responses", default=None
)
"""Called with the status and headers of every HTTP answer of the model calls made in this context
(a worker's rate limiter learns `anthropic-ratelimit-*` and `retry-after` from them;
workers/config/ratelimit.py)."""

before_retry: ContextVar[Callable[[], Awaitable[None]] | None] = ContextVar(
    "before_retry", default=None
)
"""Awaited before each retry of a model call made in this context, once its backoff is over (a
worker's rate limiter books the retry as one more request: workers/flow/limiter.py)."""

Flag = Callable[[str], PromptGenError | None]


class StreamFailure(Exception):
    """An `error` event in a stream: `body` is its JSON text, `status` the HTTP status it stands for."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(status, body)
        self.status = status
        self.body = body


def stream_failure(body: str) -> StreamFailure:
    """The failure of an `error` event whose data is `body` (`{"type": "error", "error": {"type"}}`)."""
    kind = error_fields(body).get("type", "")
    return StreamFailure(STREAM_ERROR_STATUS.get(kind, 500), body)


class StreamReader(Protocol):
    """A provider's reader of one streamed answer: `event` gets each SSE event as it arrives (it may
    raise `StreamFailure`, `PromptGenError`); `done` says the last event came; `result` is the
    answer, in the shape the provider's non-streamed answer has."""

    def feed(self, chunk: bytes) -> None:
        """The bytes one read brought: parsed into events, each handled as it comes."""

    def event(self, name: str, data: str) -> None: ...

    def flush(self) -> bool:
        """Pass on, as one delta per kind, the text of the events given since the last flush
        (called after each read's events); True when it passed any."""

    @property
    def done(self) -> bool: ...

    def result(self) -> Any: ...


DRAIN_S = 5.0
"""After a stream's last event, how long its HTTP body's end (the last chunk) is waited for, so the
connection goes back to the pool (the SDK reads the rest of the stream too); past it the connection
is closed and the answer stands."""


async def _drain(chunks: AsyncIterator[bytes], within_s: float) -> None:
    """Read the rest of a streamed body (what follows the last event is not an event: dropped)."""
    try:
        async with asyncio.timeout(within_s):
            async for _ in chunks:
                pass
    except (TimeoutError, httpx.TransportError):
        pass  # the answer is whole; only the connection is lost (not reused)


async def _close(chunks: Any) -> None:
    close = getattr(chunks, "aclose", None)
    if close is not None:
        await close()


class _Cut(Exception):
    """The stream broke after its answer began: retried like a 5xx."""


class Tally:
    """What the attempts of one call did that the caller prices (toolloop/providers/cutcost.py):
    `unanswered` counts those that timed out after the request went out and before any answer
    began (a non-streamed call's whole wait; a stream's wait for its status line): the provider
    may have generated, and billed, the whole answer."""

    __slots__ = ("unanswered",)

    def __init__(self) -> None:
        self.unanswered = 0


async def call_json(
    endpoint: Endpoint,
    body: Mapping[str, Any] | bytes,
    headers: Mapping[str, str],
    signal: AbortSignal,
    *,
    client: HttpClient,
    secret: Secret,
    flag: Flag | None = None,
    stream: Callable[[OnDelta | None], StreamReader] | None = None,
    on_delta: OnDelta | None = None,
    wait_s: float | None = None,
    connect_s: float | None = None,
    tally: Tally | None = None,
) -> Any:
    """One model call (module docstring): the parsed 2xx body, or the stream reader's result.
    `body`: the JSON body, or its bytes (a caller that drops its dict tree before the wait).
    `wait_s`: the read timeout of each attempt (default `endpoint.timeout_s`): for a non-streamed
    call the wait for the whole answer (toolloop/providers/timeouts.py), streamed the idle timeout;
    `connect_s` the connect timeout (default min(wait, 10 s)); `tally` counts what the caller prices."""
    policy = endpoint.policy
    started = time.monotonic()
    content = body if isinstance(body, bytes) else dumps(body)
    del body  # not kept across the wait for the answer
    read_s = endpoint.timeout_s if wait_s is None else wait_s
    timeout = httpx.Timeout(
        read_s, connect=min(read_s, 10.0) if connect_s is None else connect_s
    )
    head = {"content-type": "application/json", **headers}
    call = _Call(endpoint, content, head, client, secret, flag, read_s, timeout, tally)
    relay = None if on_delta is None else as_relay(on_delta)
    attempt = billed = 0
    while True:
        attempt += 1
        signal.throw_if_aborted()
        if relay is not None:
            relay.discard()  # an earlier attempt's deltas, if any, are void
        reader = None if stream is None else stream(relay)
        booking = before_retry.get() if attempt > 1 else None
        if booking is not None:
            await booking()
        error, wait, paid = await race(call.attempt(attempt, reader), signal)
        if error is None:
            return wait  # the parsed body / the reader's result
        billed += paid
        elapsed = time.monotonic() - started
        if (
            wait is None
            or attempt >= policy.attempts
            or billed >= policy.billed_attempts
            or elapsed + wait > policy.total_s
        ):
            if relay is not None:
                relay.discard()
            raise final_error(error, attempt)
        log.warning(
            "%s: retrying after %s (attempt %d of %d, waiting %.2f s)",
            endpoint.provider,
            error.status
            or (
                "timeout"
                if isinstance(error, PromptGenTimeoutError)
                else "a connection error"
            ),
            attempt,
            policy.attempts,
            wait,
        )
        await race(asyncio.sleep(wait), signal)


class _Call:
    """The parts of one model call that every attempt shares."""

    def __init__(
        self,
        endpoint: Endpoint,
        content: bytes,
        headers: dict[str, str],
        client: HttpClient,
        secret: Secret,
        flag: Flag | None,
        read_s: float,
        timeout: httpx.Timeout,
        tally: Tally | None,
    ) -> None:
        self.endpoint, self.content, self.headers = endpoint, content, headers
        self.client, self.secret, self.flag = client, secret, flag
        self.read_s, self.timeout, self.tally = read_s, timeout, tally

    async def attempt(
        self, attempt: int, reader: StreamReader | None
    ) -> tuple[PromptGenError | None, Any, bool]:
        """One POST. Returns (None, the answer, False), or (error, seconds to wait before a retry,
        whether the attempt may have been billed); raises what is not retried."""
        endpoint = self.endpoint
        name, backoff = endpoint.provider, endpoint.policy.backoff(attempt)
        answered = began = False
        try:
            async with self.client.send(
                endpoint.url, self.content, self.headers, self.timeout
            ) as answer:
                answered = True
                observer = observe_responses.get()
                if observer is not None:
                    observer(answer.status, answer.headers)
                if 200 <= answer.status < 300:
                    if reader is None or not _is_stream(answer):
                        return None, await self.whole(answer), False
                    began = True
                    return None, await self.streamed(answer, reader), False
                text = (await answer.read()).decode("utf-8", errors="replace")
        except (httpx.ConnectTimeout, httpx.PoolTimeout, httpx.WriteTimeout) as exc:
            if answered:
                raise self.unreachable(exc) from None
            # the request did not go out whole
            return (
                self.unreachable(exc),
                backoff,
                False,
            )
        except httpx.TimeoutException:
            if not began and self.tally is not None:
                self.tally.unanswered += (
                    1  # it may have been generated, and billed, whole
                )
            late = (
                f"sent nothing for {self.read_s:g} s in the middle of its streamed answer"
                if began
                else f"did not answer within {self.read_s:g} s"
            )
            return (
                PromptGenTimeoutError(
                    f"{name} {late}.\n"
                    "  Try again later, raise the timeout, or use another prompt-gen provider."
                ),
                backoff,
                not began or _begun(reader),
            )
        except _Cut as cut:
            return (
                PromptGenError(
                    f"{name} broke off its streamed answer ({redact(str(cut), self.secret)}).\n"
                    "  Try again later, or use another prompt-gen provider.",
                    status=502,
                    retryable=True,
                ),
                backoff,
                _begun(reader),
            )
        except httpx.TransportError as exc:
            if answered:  # the answer began: as before, not retried
                raise self.unreachable(exc) from None
            # before any response: retried (the SDK does)
            return (
                self.unreachable(exc),
                backoff,
                False,
            )
        except StreamFailure as failure:
            error, wait = self.failed(failure.status, {}, failure.body, backoff)
            return error, wait, _begun(reader)
        error, wait = self.failed(answer.status, answer.headers, text, backoff)
        return error, wait, False

    async def whole(self, answer: Answer) -> Any:
        body = await answer.read()
        try:
            data = loads_exact(body)
        except ValueError:
            raise PromptGenError(
                f"{self.endpoint.provider} answered HTTP {answer.status} with a body that is not JSON.\n"
                "  Check the base URL points at the provider's API.",
                status=answer.status,
            ) from None
        # only a `\ud...` escape can give a lone surrogate: an answer without one needs no walk
        return valid_text(data) if b"\\ud" in body or b"\\uD" in body else data

    async def streamed(self, answer: Answer, reader: StreamReader) -> Any:
        """The reader's result of a streamed answer: each chunk (what one read brought) parsed into
        events, then the reader's deltas of them passed on as one (`flush`)."""
        chunks = answer.chunks()
        hold_s = min(READ_HOLD.get(), self.read_s / 2)
        hold = answer.hold if hold_s > 0 else None
        try:
            async for chunk in chunks:
                reader.feed(chunk)
                if reader.flush() and hold is not None and not reader.done:
                    hold(hold_s)  # what arrives meanwhile comes as one read, one delta
                if reader.done:
                    await _drain(chunks, min(DRAIN_S, self.read_s))
                    return reader.result()
        except httpx.TimeoutException:
            raise
        except httpx.TransportError as exc:
            raise _Cut(f"{type(exc).__name__}: {exc}") from None
        finally:
            # closed here, not left to the garbage collector: asyncio would close an abandoned
            # async generator through call_soon_threadsafe and a task of its own (a loop wake-up)
            await _close(chunks)
        raise _Cut("the stream ended before its last event")

    def failed(
        self, status: int, headers: Mapping[str, str], text: str, backoff: float
    ) -> tuple[PromptGenError, float | None]:
        detail = redact(error_detail(text), self.secret)
        if self.flag is not None and (flagged := self.flag(detail)) is not None:
            raise flagged
        name = self.endpoint.provider
        error, wait_s = classify(
            name, self.endpoint, status, headers, detail, error_fields(text), backoff
        )
        if wait_s is None:
            raise error
        return error, wait_s

    def unreachable(self, exc: Exception) -> PromptGenError:
        detail = redact(f"{type(exc).__name__}: {exc}", self.secret)
        return PromptGenError(
            f"{self.endpoint.provider} could not be reached at {self.endpoint.url!r} ({detail}).\n"
            "  Check the base URL and the network, then try again.",
            retryable=True,
        )


def _begun(reader: StreamReader | None) -> bool:
    """The streamed attempt's answer began (Anthropic's `message_start`, fal's first chunk): what
    it generated may be billed (a reader that cannot say is taken to have begun)."""
    partial = getattr(reader, "partial", None)
    return reader is not None and (not callable(partial) or partial() is not None)


def _is_stream(answer: Answer) -> bool:
    """The answer is an event stream (a server that ignored `stream` answers one JSON body)."""
    return str(answer.headers.get("content-type", "")).startswith("text/event-stream")
