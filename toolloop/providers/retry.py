"""What an HTTP answer of a model call means, as pure functions: `classify` (the error and whether
to retry), `should_retry`, `parse_retry_after` (capped at `MAX_RETRY_AFTER_S`), and the bounds of
the retries (`RetryPolicy`).

Classification (SPEC 3.3), in this order:
    connection failure before    -> retried with backoff (as the SDK retries `APIConnectionError`):
    any response                    refused, reset, closed before the status line, a connect
                                    timeout; then PromptGenError(retryable=True), no fallback
    timeout after the request    -> a whole-answer wait (toolloop/providers/timeouts.py) or, when
    went out                        streaming, the idle timeout between two reads: retried once
                                    (`RetryPolicy.billed_attempts`), then PromptGenTimeoutError, on
                                    which the facade moves to its next provider
    stream cut after its answer  -> retried like a 5xx, at most once too (the provider did answer
    began                           and may bill it; the rest is lost)
    other transport failure      -> PromptGenError(retryable=True) at once (a failure after the
                                    response began: network failures are errors)
    provider's `flag(detail)`    -> that error (e.g. fal's content-policy refusals)
    429 spend limit              -> SpendLimitError at once (`error.details.error_code` is
                                    contract_/enforced_spend_limit_reached): no retry, no fallback
    401, 403                     -> PromptGenUnavailableError("auth") at once
    404 not_found_error "model:" -> PromptGenError at once (the model is unknown or retired: no
                                    fallback, the same id would fail everywhere)
    other 404                    -> PromptGenUnavailableError("missing") at once (no such endpoint)
    429 without `retry-after`    -> retried with backoff (as the SDK); then
                                    PromptGenUnavailableError("limit")
    402, 429                     -> waits a short `retry-after` (<= policy.short_retry_after_s) and
                                    retries; else PromptGenUnavailableError("limit")
    408, 409, 5xx (529 included) -> retried with exponential backoff and jitter, a longer
                                    `retry-after` honoured; then PromptGenError(retryable=True),
                                    on which the facade moves to its next provider
    other 4xx                    -> PromptGenError(retryable=False) at once
An `error` event in a stream (Anthropic `overloaded_error`, ...) is classified as the HTTP status
its type stands for (`STREAM_ERROR_STATUS`: overloaded 529, api 500, rate limit 429, ...); once the
stream's answer began it counts as an attempt that may have been billed (retried at most once).
`x-should-retry` (`should_retry`, as the SDK's `_should_retry`) overrides the status: "false" raises
at once (a 5xx then with retryable=False), "true" retries what would be raised (a 4xx too).
"""

from __future__ import annotations

import email.utils
import json
import logging
import math
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from toolloop.errors import (
    PromptGenError,
    PromptGenTimeoutError,
    PromptGenUnavailableError,
    SpendLimitError,
)

log = logging.getLogger("toolloop.providers")

MAX_RETRY_AFTER_S = 300.0
"""The longest wait a provider's header may set (`retry-after`, `retry-after-ms`; in a worker also
`anthropic-ratelimit-*-reset` and the shared rate-limit key, TOOLLOOP_MAX_RETRY_AFTER): a longer
ask is logged and capped. A per-minute limit resets within a minute; a provider that still refuses
after the cap answers another 429 with a fresh wait."""

_RETRIED = frozenset({408, 409})
SPEND_LIMIT_CODES = frozenset(
    {"contract_spend_limit_reached", "enforced_spend_limit_reached"}
)
STREAM_ERROR_STATUS = {
    "overloaded_error": 529,
    "api_error": 500,
    "rate_limit_error": 429,
    "timeout_error": 504,
    "authentication_error": 401,
    "permission_error": 403,
    "billing_error": 402,
    "not_found_error": 404,
    "request_too_large": 413,
    "invalid_request_error": 400,
}
"""The HTTP status of a non-streamed answer that an `error` event of this type stands for (the
Messages API's error types; "overloaded_error ... would normally correspond to an HTTP 529")."""


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
    billed_attempts: int = 2
    """Most attempts that may have been billed: one that timed out after its request went out, or
    a stream cut (or ended by an error event) after its answer began. Past it the error is raised
    and the facade moves on to its fallback, rather than pay for the same slow answer again."""
    max_retry_after_s: float = MAX_RETRY_AFTER_S
    """The longest wait a provider's header may ask for (`parse_retry_after`); longer is capped."""

    def backoff(self, attempt: int) -> float:
        delay = min(self.base_delay_s * 2.0 ** (attempt - 1), self.max_delay_s)
        return delay + random.uniform(0, delay * self.jitter)


@dataclass(frozen=True)
class Endpoint:
    """Where and how one provider is called. `key_env` names the key in error messages;
    `timeout_s` bounds the wait for an answer, and when streaming the wait between two events."""

    provider: str
    url: str
    key_env: str
    timeout_s: float
    policy: RetryPolicy


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
    retry_after = parse_retry_after(headers, endpoint.policy.max_retry_after_s)
    backoff = max(backoff_s, retry_after or 0.0)
    forced = backoff if headers.get("x-should-retry") == "true" else None
    code = fields.get("error_code")
    if status == 429 and code in SPEND_LIMIT_CODES:
        return SpendLimitError(
            f"{name} refused the request: the organisation's spend limit is reached "
            f"(HTTP 429 {code}): {detail}\n"
            "  Raise the spend limit in the provider's console, or wait for the next billing period.",
            code,
        ), None
    if status in (401, 403):
        return PromptGenUnavailableError(
            f"{name} refused the request (HTTP {status}): {detail}\n"
            f"  Check {endpoint.key_env}, or use another prompt-gen provider.",
            "auth",
            status,
        ), forced
    if status == 404:
        return _not_found(name, endpoint, detail, fields), forced
    if status in (402, 429):
        return _limited(
            name, endpoint, status, headers, detail, retry_after, forced, backoff_s
        )
    retry = should_retry(status, headers)
    if status in _RETRIED or status >= 500:
        return PromptGenError(
            f"{name} failed with HTTP {status}: {detail}\n"
            "  Try again later, or use another prompt-gen provider.",
            status=status,
            retryable=retry,
            retry_after=retry_after,
        ), (backoff if retry else None)
    return PromptGenError(
        f"{name} rejected the request (HTTP {status}): {detail}\n"
        "  Fix the request; sending it again will fail the same way.",
        status=status,
    ), (backoff if retry else None)


def _not_found(
    name: str, endpoint: Endpoint, detail: str, fields: Mapping[str, str]
) -> PromptGenError:
    if fields.get("type") == "not_found_error" and fields.get("message", "").startswith(
        "model:"
    ):
        return PromptGenError(
            f"{name} does not serve this model (HTTP 404): {detail}\n"
            "  Use a current model id (docs/providers.md lists them); a retired model is not coming back.",
            status=404,
        )
    return PromptGenUnavailableError(
        f"{name} has no such endpoint (HTTP 404 at {endpoint.url!r}): {detail}\n"
        "  Check the base URL, or use another prompt-gen provider.",
        "missing",
        404,
    )


def _limited(
    name: str,
    endpoint: Endpoint,
    status: int,
    headers: Mapping[str, str],
    detail: str,
    retry_after: float | None,
    forced: float | None,
    backoff_s: float,
) -> tuple[PromptGenError, float | None]:
    limit = PromptGenUnavailableError(
        f"{name} limited the request (HTTP {status}): {detail}\n  Wait, or use another prompt-gen provider.",
        "limit",
        status,
    )
    retry = should_retry(status, headers)
    if retry and retry_after is None and status == 429:
        # the SDK retries a 429 that names no wait, with its backoff
        return (
            limit,
            backoff_s,
        )
    if (
        not retry
        or retry_after is None
        or retry_after > endpoint.policy.short_retry_after_s
    ):
        return limit, forced
    return limit, retry_after


def final_error(error: PromptGenError, attempts: int) -> PromptGenError:
    """The error to raise after the last attempt, saying how many were made."""
    if attempts == 1:
        return error
    head, _, tail = str(error).partition("\n")
    stop = "." if head.endswith(".") else ""
    message = f"{head.removesuffix('.')} ({attempts} attempts){stop}\n{tail}"
    if isinstance(error, PromptGenUnavailableError):
        return PromptGenUnavailableError(message, error.reason, error.status)
    if isinstance(error, PromptGenTimeoutError):
        return PromptGenTimeoutError(message)
    return PromptGenError(message, error.status, error.retryable, error.retry_after)


def error_fields(text: str) -> dict[str, str]:
    """`type`, `message` and `error_code` (`error.details.error_code`) of a JSON error body, each
    present only when it is a string."""
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    err = data.get("error") if isinstance(data, dict) else None
    if not isinstance(err, dict):
        return {}
    details = err.get("details")
    found = {
        "type": err.get("type"),
        "message": err.get("message"),
        "error_code": details.get("error_code") if isinstance(details, dict) else None,
    }
    return {key: value for key, value in found.items() if isinstance(value, str)}


def error_detail(text: str) -> str:
    """The provider's own error text: `error.message` of a JSON body, else the body, cut to 300."""
    try:
        data: Any = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            kind = err.get("type")
            text = (
                f"{kind}: {err['message']}" if isinstance(kind, str) else err["message"]
            )
        elif isinstance(err, str):
            text = err
        elif isinstance(data.get("detail"), str):
            text = data["detail"]
    text = " ".join(text.split()) or "(empty body)"
    return text if len(text) <= 300 else text[:300] + "..."


def parse_retry_after(
    headers: Mapping[str, str], cap_s: float = MAX_RETRY_AFTER_S
) -> float | None:
    """Seconds asked by `retry-after-ms` or `retry-after` (seconds or an HTTP date), at most `cap_s`
    (a longer ask is logged and capped); None when absent or not a number (NaN included)."""
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        seconds = _number(raw_ms)
        if seconds is not None:
            return capped_wait(seconds / 1000, cap_s, "retry-after-ms", raw_ms)
    raw = headers.get("retry-after")
    if raw is None:
        return None
    seconds = _number(raw)
    if seconds is None:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError, OverflowError):
            return None
        seconds = when.timestamp() - time.time()
    return capped_wait(seconds, cap_s, "retry-after", raw)


def capped_wait(seconds: float, cap_s: float, header: str, raw: str) -> float:
    """`seconds` (a provider's wait, from `header` = `raw`) within [0, cap_s]; over it is logged."""
    if seconds > cap_s:
        log.warning(
            "the provider's %s header %r asks for a wait of %.6g s, longer than the cap of %g s "
            "(MAX_RETRY_AFTER_S; a worker's TOOLLOOP_MAX_RETRY_AFTER): waiting %g s",
            header,
            raw[:64],
            seconds,
            cap_s,
            cap_s,
        )
        return cap_s
    return max(seconds, 0.0)


def _number(raw: str) -> float | None:
    """A header's number of seconds; None when it is not one (or NaN); infinity is a number."""
    try:
        value = float(raw)
    except ValueError:
        return None
    return None if math.isnan(value) else value
