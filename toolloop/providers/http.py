"""The one HTTP path of every provider: POST a JSON body, classify the answer, retry within bounds.

Classification (SPEC 3.3; `classify`, a pure function of the answer), in this order:
    transport timeout            -> retried (backoff), then PromptGenError(retryable=True)
    other transport failure      -> PromptGenError(retryable=True) at once (network failures are errors)
    provider's `flag(detail)`    -> that error (e.g. fal's content-policy refusals)
    429 spend limit              -> SpendLimitError at once (`error.details.error_code` is
                                    contract_/enforced_spend_limit_reached): no retry, no fallback
    401, 403                     -> PromptGenUnavailableError("auth") at once
    404 not_found_error "model:" -> PromptGenError at once (the model is unknown or retired: no
                                    fallback, the same id would fail everywhere)
    other 404                    -> PromptGenUnavailableError("missing") at once (no such endpoint)
    402, 429                     -> waits a short `retry-after` (<= policy.short_retry_after_s) and
                                    retries; else PromptGenUnavailableError("limit")
    408, 409, 5xx (529 included) -> retried with exponential backoff and jitter, a longer
                                    `retry-after` honoured; then PromptGenError(retryable=True),
                                    on which the facade moves to its next provider
    other 4xx                    -> PromptGenError(retryable=False) at once
`x-should-retry` (`should_retry`, as the SDK's `_should_retry`) overrides the status: "false" raises
at once (a 5xx then with retryable=False), "true" retries what would be raised (a 4xx too).
Attempts are bounded by `RetryPolicy.attempts` and by `RetryPolicy.total_s` of wall time. The
caller's abort is checked before each attempt and races every request and every backoff sleep: it
is raised unchanged (the signal's own `AbortError`) the moment it fires.
Keys: headers are built by the caller and never logged; every message is passed through `redact`.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import errno
import importlib.util
import inspect
import json
import logging
import os
import random
import re
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

import httpx

from toolloop.abort import AbortSignal
from toolloop.errors import PromptGenError, PromptGenUnavailableError, SpendLimitError
from toolloop.fastjson import dumps
from toolloop.providers.base import Secret, redact

log = logging.getLogger("toolloop.providers")

T = TypeVar("T")

_RETRIED = frozenset({408, 409})

ResponseObserver = Callable[[int, httpx.Headers], None]
observe_responses: ContextVar[ResponseObserver | None] = ContextVar("observe_responses", default=None)
"""Called with the status and headers of every HTTP answer of the model calls made in this context
(a worker's rate limiter learns `anthropic-ratelimit-*` and `retry-after` from them; workers/ratelimit.py)."""


@dataclass(frozen=True)
class RetryPolicy:
    """Bounds of the retries of one model call."""

    attempts: int = 4
    """Most HTTP attempts, the first included."""
    base_delay_s: float = 1.0
    """Backoff before retry n is base * 2**(n-1), plus up to `jitter` of it, capped at max_delay_s."""
    max_delay_s: float = 16.0
    jitter: float = 0.25
    total_s: float = 300.0
    """No retry starts once this much wall time has passed since the first attempt."""
    short_retry_after_s: float = 10.0
    """A 402/429 asking to wait at most this long is waited for and retried; longer is `limit`."""

    def backoff(self, attempt: int) -> float:
        delay = min(self.base_delay_s * 2.0 ** (attempt - 1), self.max_delay_s)
        return delay + random.uniform(0, delay * self.jitter)


@dataclass(frozen=True)
class Endpoint:
    """Where and how one provider is called. `key_env` names the key in error messages."""

    provider: str
    url: str
    key_env: str
    timeout_s: float
    policy: RetryPolicy
    transport: httpx.AsyncBaseTransport | None = None


Flag = Callable[[str], PromptGenError | None]

_ssl_context: ssl.SSLContext | None = None


def _verify() -> ssl.SSLContext:
    # One SSL context for every client: building one per call costs ~10 ms of CPU.
    global _ssl_context
    if _ssl_context is None:
        import certifi

        _ssl_context = ssl.create_default_context(cafile=certifi.where())
    return _ssl_context


class KeepAlive:
    """One keep-alive HTTP client for a long-lived asyncio loop (a worker's), used by every model call
    made on that loop once `keep_alive(loop)` registered it; elsewhere each call opens its own client.

    It is an aiohttp session (the client the Anthropic and OpenAI SDKs offer for high concurrency),
    called directly: the answer comes back as an `httpx.Response` and aiohttp's errors as httpx's,
    so the classification below is the same on both paths. Measured at 500 calls in flight on one
    loop (docs/operations.md): about a fifth of the CPU of a fresh httpx client per call, and less
    than one shared httpx pool, whose httpcore scans every connection on each request. It also keeps
    connections open across calls: no TCP connect, and no TLS handshake with a real provider, per call.

    Stale connections: a server (a provider's load balancer) closes keep-alive connections that sat
    idle, and a request sent on one as it closes finds it reset or closed before any response. Such
    a failure, on a REUSED connection and before the response began, is the connection's, not the
    provider's (the request never reached it): the request is sent once more on a fresh connection.
    Any other failure (a fresh connection, or once the response began) is the documented transport
    error of the module docstring, since the provider may have started the work.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._session: Any = None
        self._fresh: Any = None
        """A session whose every request opens a new connection: the one retry of a stale one."""

    async def post(
        self, url: str, content: bytes, headers: dict[str, str], timeout: httpx.Timeout
    ) -> httpx.Response:
        import aiohttp

        if self._session is None:
            traces = aiohttp.TraceConfig()
            traces.on_connection_reuseconn.append(_reused)
            connector = aiohttp.TCPConnector(limit=0, ssl=_verify(), keepalive_timeout=30)
            self._session = aiohttp.ClientSession(
                connector=connector, trust_env=False, trace_configs=[traces]
            )
        limits = aiohttp.ClientTimeout(
            total=None, connect=timeout.pool, sock_connect=timeout.connect, sock_read=timeout.read
        )
        attempt = _Attempt()
        try:
            return await self._send(self._session, url, content, headers, limits, attempt)
        except (aiohttp.ClientError, TimeoutError) as error:
            if not (attempt.reused and not attempt.answered and _stale(error)):
                raise _as_httpx(error) from error
            log.info("POST %s: a kept-alive connection was closed under the request (%s: %s); "
                     "sending it again on a fresh connection", url, type(error).__name__, error)  # fmt: skip
        if self._fresh is None:
            connector = aiohttp.TCPConnector(limit=0, ssl=_verify(), force_close=True)
            self._fresh = aiohttp.ClientSession(connector=connector, trust_env=False)
        try:
            return await self._send(self._fresh, url, content, headers, limits, _Attempt())
        except (aiohttp.ClientError, TimeoutError) as error:
            raise _as_httpx(error) from error

    async def _send(
        self, session: Any, url: str, content: bytes, headers: dict[str, str], limits: Any, attempt: _Attempt
    ) -> httpx.Response:
        async with session.post(
            url,
            data=content,
            headers=headers,
            timeout=limits,
            allow_redirects=False,
            trace_request_ctx=attempt,
        ) as answer:
            attempt.answered = True
            body = await answer.read()
        log.info('HTTP Request: POST %s "HTTP/1.1 %d"', url, answer.status)  # as httpx logs it
        # aiohttp decoded the body: drop the headers that describe the encoded one
        kept = [(k, v) for k, v in answer.raw_headers if k.lower() not in _ENCODED_BODY_HEADERS]
        return httpx.Response(answer.status, headers=kept, content=body)

    async def aclose(self) -> None:
        for session in (self._session, self._fresh):
            if session is not None:
                await session.close()
        self._session = self._fresh = None


class _Attempt:
    """One request on the keep-alive session: did it get a pooled connection, did its answer begin."""

    __slots__ = ("answered", "reused")

    def __init__(self) -> None:
        self.reused = False
        self.answered = False


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


_keep_alive: KeepAlive | None = None


def keep_alive(loop: asyncio.AbstractEventLoop) -> bool:
    """Let model calls on `loop` share keep-alive connections (for a loop that lives as long as its
    process). False, and nothing changes, when aiohttp is not installed or TOOLLOOP_HTTP=httpx."""
    global _keep_alive
    if os.environ.get("TOOLLOOP_HTTP", "").strip() == "httpx":
        return False
    if importlib.util.find_spec("aiohttp") is None:
        return False
    _keep_alive = KeepAlive(loop)
    return True


def keep_alive_used() -> bool:
    """True when a model call went through the registered keep-alive transport."""
    return _keep_alive is not None and _keep_alive._session is not None


async def close_keep_alive() -> None:
    """Close the keep-alive connections and go back to a client per call (call it on their loop)."""
    global _keep_alive
    shared, _keep_alive = _keep_alive, None
    if shared is not None:
        await shared.aclose()


async def race(awaitable: Awaitable[T], signal: AbortSignal) -> T:
    """Await `awaitable`, or raise the signal's `AbortError` as soon as it aborts (the work is
    cancelled then). One task for the work and a callback on the signal: no second task waiting."""
    if signal.aborted:
        if inspect.iscoroutine(awaitable):
            awaitable.close()  # never started: close it so it is not reported as never awaited
        signal.throw_if_aborted()
    work = asyncio.ensure_future(awaitable)
    loop = asyncio.get_running_loop()

    def cancel() -> None:  # the signal may abort from another thread
        loop.call_soon_threadsafe(work.cancel)

    signal.add_callback(cancel)
    try:
        return await work
    except asyncio.CancelledError:
        if signal.aborted and not _cancelling():
            signal.throw_if_aborted()
        raise
    finally:
        signal.remove_callback(cancel)
        if not work.done():
            work.cancel()


def _cancelling() -> bool:
    """True when the task running this is being cancelled itself (not only the work it awaited)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def post_json(
    endpoint: Endpoint,
    body: Mapping[str, Any],
    headers: Mapping[str, str],
    signal: AbortSignal,
    *,
    secret: Secret,
    flag: Flag | None = None,
) -> Any:
    """POST `body`, return the parsed JSON of a 2xx answer; raise as the module docstring says."""
    policy = endpoint.policy
    started = time.monotonic()
    content = dumps(body)
    all_headers = {"content-type": "application/json", **headers}
    timeout = httpx.Timeout(endpoint.timeout_s, connect=min(endpoint.timeout_s, 10.0))
    shared = _keep_alive
    async with contextlib.AsyncExitStack() as stack:
        client: httpx.AsyncClient | KeepAlive
        if shared is not None and endpoint.transport is None and shared.loop is asyncio.get_running_loop():
            client = shared
        else:
            client = httpx.AsyncClient(transport=endpoint.transport, verify=_verify(), trust_env=False)
            await stack.enter_async_context(client)
        attempt = 0
        while True:
            attempt += 1
            signal.throw_if_aborted()
            error, wait_s = await _attempt(
                client, endpoint, content, all_headers, timeout, signal, secret, flag, attempt
            )
            if error is None:
                return wait_s  # the parsed body
            elapsed = time.monotonic() - started
            if wait_s is None or attempt >= policy.attempts or elapsed + wait_s > policy.total_s:
                raise _final(error, attempt)
            log.warning(
                "%s: retrying after %s (attempt %d of %d, waiting %.2f s)",
                endpoint.provider,
                error.status or "timeout",
                attempt,
                policy.attempts,
                wait_s,
            )
            await race(asyncio.sleep(wait_s), signal)


async def _attempt(
    client: httpx.AsyncClient | KeepAlive,
    endpoint: Endpoint,
    content: bytes,
    headers: dict[str, str],
    timeout: httpx.Timeout,
    signal: AbortSignal,
    secret: Secret,
    flag: Flag | None,
    attempt: int,
) -> tuple[PromptGenError | None, Any]:
    """One POST. Returns (None, parsed body), or (error, seconds to wait before a retry); raises
    what is not retried."""
    name, policy = endpoint.provider, endpoint.policy
    try:
        if isinstance(client, KeepAlive):
            sent = client.post(endpoint.url, content, headers, timeout)
        else:
            sent = client.post(endpoint.url, content=content, headers=headers, timeout=timeout)
        response = await race(sent, signal)
    except httpx.TimeoutException:
        error = PromptGenError(
            f"{name} did not answer within {endpoint.timeout_s:g} s.\n"
            "  Try again later, raise the timeout, or use another prompt-gen provider.",
            retryable=True,
        )
        return error, policy.backoff(attempt)
    except httpx.TransportError as exc:
        return _unreachable(name, endpoint, exc, secret)
    status = response.status_code
    observer = observe_responses.get()
    if observer is not None:
        observer(status, response.headers)
    if 200 <= status < 300:
        try:
            return None, valid_text(response.json())
        except ValueError:
            raise PromptGenError(
                f"{name} answered HTTP {status} with a body that is not JSON.\n"
                "  Check the base URL points at the provider's API.",
                status=status,
            ) from None
    detail = redact(error_detail(response), secret)
    if flag is not None and (flagged := flag(detail)) is not None:
        raise flagged
    fields = error_fields(response)
    error, wait_s = classify(
        name, endpoint, status, response.headers, detail, fields, policy.backoff(attempt)
    )
    if wait_s is None:
        raise error
    return error, wait_s


SPEND_LIMIT_CODES = frozenset({"contract_spend_limit_reached", "enforced_spend_limit_reached"})


def should_retry(status: int, headers: Mapping[str, str]) -> bool:
    """Whether an answer with `status` may be retried, as the anthropic SDK's `_should_retry`:
    an `x-should-retry: true|false` header decides; else 408, 409, 429 and every 5xx (529 too)."""
    header = headers.get("x-should-retry")
    if header == "true":
        return True
    if header == "false":
        return False
    return status in _RETRIED or status == 429 or status >= 500


def classify(
    name: str,
    endpoint: Endpoint,
    status: int,
    headers: Mapping[str, str],
    detail: str,
    fields: Mapping[str, str],
    backoff_s: float,
) -> tuple[PromptGenError, float | None]:
    """The error of a non-2xx answer and the seconds to wait before retrying it (None: raise it
    now): a pure function of the answer (module docstring; `fields` is `error_fields`) and of the
    backoff the caller drew for this attempt."""
    policy = endpoint.policy
    retry_after = parse_retry_after(headers)
    retry = should_retry(status, headers)
    backoff = max(backoff_s, retry_after or 0.0)
    code = fields.get("error_code")
    if status == 429 and code in SPEND_LIMIT_CODES:
        return SpendLimitError(
            f"{name} refused the request: the organisation's spend limit is reached "
            f"(HTTP 429 {code}): {detail}\n"
            "  Raise the spend limit in the provider's console, or wait for the next billing period.",
            code,
        ), None
    if status in (401, 403):
        error: PromptGenError = PromptGenUnavailableError(
            f"{name} refused the request (HTTP {status}): {detail}\n"
            f"  Check {endpoint.key_env}, or use another prompt-gen provider.",
            "auth",
            status,
        )
        return error, (backoff if headers.get("x-should-retry") == "true" else None)
    if (
        status == 404
        and fields.get("type") == "not_found_error"
        and fields.get("message", "").startswith("model:")
    ):
        return PromptGenError(
            f"{name} does not serve this model (HTTP 404): {detail}\n"
            "  Use a current model id (docs/providers.md lists them); a retired model is not coming back.",
            status=status,
        ), None
    if status == 404:
        error = PromptGenUnavailableError(
            f"{name} has no such endpoint (HTTP 404 at {endpoint.url!r}): {detail}\n"
            "  Check the base URL, or use another prompt-gen provider.",
            "missing",
            status,
        )
        return error, (backoff if headers.get("x-should-retry") == "true" else None)
    if status in (402, 429):
        limit = PromptGenUnavailableError(
            f"{name} limited the request (HTTP {status}): {detail}\n"
            "  Wait, or use another prompt-gen provider.",
            "limit",
            status,
        )
        if not retry or retry_after is None or retry_after > policy.short_retry_after_s:
            return limit, (backoff if headers.get("x-should-retry") == "true" else None)
        return limit, retry_after
    if status in _RETRIED or status >= 500:
        error = PromptGenError(
            f"{name} failed with HTTP {status}: {detail}\n"
            "  Try again later, or use another prompt-gen provider.",
            status=status,
            retryable=retry,
            retry_after=retry_after,
        )
        return error, (backoff if retry else None)
    error = PromptGenError(
        f"{name} rejected the request (HTTP {status}): {detail}\n"
        "  Fix the request; sending it again will fail the same way.",
        status=status,
    )
    return error, (backoff if retry else None)


def _unreachable(name: str, endpoint: Endpoint, exc: Exception, secret: Secret) -> NoReturn:
    detail = redact(f"{type(exc).__name__}: {exc}", secret)
    raise PromptGenError(
        f"{name} could not be reached at {endpoint.url!r} ({detail}).\n"
        "  Check the base URL and the network, then try again.",
        retryable=True,
    ) from None


def _final(error: PromptGenError, attempts: int) -> PromptGenError:
    """The error to raise after the last attempt, saying how many were made."""
    if attempts == 1:
        return error
    head, _, tail = str(error).partition("\n")
    stop = "." if head.endswith(".") else ""
    message = f"{head.removesuffix('.')} ({attempts} attempts){stop}\n{tail}"
    if isinstance(error, PromptGenUnavailableError):
        return PromptGenUnavailableError(message, error.reason, error.status)
    return PromptGenError(message, error.status, error.retryable, error.retry_after)


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_text(data: Any) -> Any:
    """`data` (parsed JSON) with every lone surrogate replaced by U+FFFD. JSON may carry one as an
    unpaired `\\ud800` escape; such a str cannot be encoded to UTF-8, so a model answer holding one
    could not be journaled (Redis), dumped by pydantic, or sent back to the provider."""
    if isinstance(data, str):
        return _LONE_SURROGATE.sub("\ufffd", data)
    if isinstance(data, list):
        return [valid_text(item) for item in data]
    if isinstance(data, dict):
        return {valid_text(key): valid_text(value) for key, value in data.items()}
    return data


def error_fields(response: httpx.Response) -> dict[str, str]:
    """`type`, `message` and `error_code` (`error.details.error_code`) of a JSON error body, each
    present only when it is a string."""
    try:
        data = json.loads(response.text)
    except ValueError:
        return {}
    err = data.get("error") if isinstance(data, dict) else None
    if not isinstance(err, dict):
        return {}
    details = err.get("details")
    found = {"type": err.get("type"), "message": err.get("message"),
             "error_code": details.get("error_code") if isinstance(details, dict) else None}  # fmt: skip
    return {key: value for key, value in found.items() if isinstance(value, str)}


def error_detail(response: httpx.Response) -> str:
    """The provider's own error text: `error.message` of a JSON body, else the body, cut to 300."""
    text = response.text
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            kind = err.get("type")
            text = f"{kind}: {err['message']}" if isinstance(kind, str) else err["message"]
        elif isinstance(err, str):
            text = err
        elif isinstance(data.get("detail"), str):
            text = data["detail"]
    text = " ".join(text.split()) or "(empty body)"
    return text if len(text) <= 300 else text[:300] + "..."


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds asked by `retry-after-ms` or `retry-after` (seconds or an HTTP date); None when absent."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        try:
            return max(float(raw_ms) / 1000, 0.0)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if raw is None:
        return None
    try:
        return max(float(raw), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)
