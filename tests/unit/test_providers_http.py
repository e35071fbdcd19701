"""The one HTTP path (toolloop/providers/call.py), seen through the Anthropic handler: status
mapping, bounded retries with backoff, retry-after, the caller's abort, and keys kept out of sight."""

from __future__ import annotations

import asyncio
import logging
import pickle
import time

import anthropic.types as sdk
import httpx
import pytest
from providers_kit import FAKE_KEY, FAST, Recorder, sdk_message

from toolloop import (
    AbortController,
    AbortError,
    PromptGenError,
    PromptGenRequest,
    PromptGenUnavailableError,
)
from toolloop.errors import PromptGenTimeoutError
from toolloop.providers import AnthropicHandler, PromptGen, RetryPolicy, Secret
from toolloop.providers.retry import classify, parse_retry_after

REQUEST = PromptGenRequest(prompt="Go")
OK = sdk_message([sdk.TextBlock(type="text", text="ok", citations=None)])


def error(status: int, message: str = "boom", **headers: str) -> httpx.Response:
    body = {"type": "error", "error": {"type": "api_error", "message": message}}
    return httpx.Response(status, json=body, headers=headers)


def handler(recorder: Recorder, retry: RetryPolicy = FAST) -> AnthropicHandler:
    return AnthropicHandler(
        FAKE_KEY, base_url="http://sim.test", retry=retry, transport=recorder.transport
    )


async def run(recorder: Recorder, retry: RetryPolicy = FAST) -> str:
    result = await handler(recorder, retry).execute(REQUEST, AbortController().signal)
    return result.text


async def test_5xx_and_529_are_retried_then_succeed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    recorder = Recorder(error(500), error(529), OK)
    with caplog.at_level(logging.WARNING, "toolloop.providers"):
        assert await run(recorder) == "ok"
    assert len(recorder.requests) == 3
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "anthropic: retrying after 500",
        "anthropic: retrying after 529",
    ]


async def test_retries_are_bounded_in_count() -> None:
    recorder = Recorder(error(503, "down"))
    with pytest.raises(PromptGenError) as caught:
        await run(recorder)
    assert len(recorder.requests) == FAST.attempts == 3
    assert caught.value.status == 503 and caught.value.retryable
    assert not isinstance(caught.value, PromptGenUnavailableError)
    first, second = str(caught.value).split("\n")
    assert first == "anthropic failed with HTTP 503: api_error: down (3 attempts)"
    assert second.startswith("  Try again later")


async def test_retries_are_bounded_in_total_time() -> None:
    policy = RetryPolicy(attempts=10, base_delay_s=0.2, jitter=0, total_s=0.5)
    recorder = Recorder(error(500))
    started = time.monotonic()
    with pytest.raises(PromptGenError):
        await run(recorder, policy)
    # waits 0.2 then 0.4 would pass 0.5 s: two attempts, then the error
    assert len(recorder.requests) == 2
    assert time.monotonic() - started < 1.0


async def test_a_longer_retry_after_is_honoured_between_retries() -> None:
    policy = RetryPolicy(attempts=2, base_delay_s=0.01, jitter=0, total_s=5)
    recorder = Recorder(error(500, **{"retry-after": "0.3"}), OK)
    started = time.monotonic()
    assert await run(recorder, policy) == "ok"
    assert time.monotonic() - started >= 0.3


async def test_a_timed_out_attempt_is_retried_once_then_reported_as_a_timeout() -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    recorder = Recorder(slow)
    with pytest.raises(
        PromptGenTimeoutError, match=r"did not answer within 600 s \(2 attempts\)\.\n"
    ) as caught:
        await run(recorder)
    # FAST allows 3: a timeout is paid
    assert len(recorder.requests) == 2 and caught.value.retryable


@pytest.mark.parametrize(
    "failure",
    [
        httpx.ConnectError("connection refused"),
        httpx.ConnectTimeout("no connection"),
        httpx.RemoteProtocolError("Server disconnected without sending a response."),
    ],
)
async def test_connection_errors_before_any_response_are_retried_with_backoff(
    failure: Exception,
) -> None:
    def refused(request: httpx.Request) -> httpx.Response:
        raise failure

    recorder = Recorder(refused, refused, OK)
    assert await run(recorder) == "ok"
    assert len(recorder.requests) == 3


async def test_connection_errors_that_outlast_the_retries_are_errors_without_fallback() -> (
    None
):
    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    recorder = Recorder(refused)
    with pytest.raises(
        PromptGenError, match=r"could not be reached .* \(3 attempts\)"
    ) as caught:
        await run(recorder)
    assert len(recorder.requests) == FAST.attempts and caught.value.status is None
    assert not isinstance(caught.value, PromptGenTimeoutError)


@pytest.mark.parametrize(
    ("status", "reason"),
    [(401, "auth"), (403, "auth"), (402, "limit"), (404, "missing")],
)
async def test_auth_and_limit_statuses_are_unavailable_at_once(
    status: int, reason: str
) -> None:
    recorder = Recorder(error(status, "no"))
    with pytest.raises(PromptGenUnavailableError) as caught:
        await run(recorder)
    assert caught.value.reason == reason and caught.value.status == status
    assert len(recorder.requests) == 1


async def test_a_429_without_retry_after_is_retried_with_backoff_as_the_sdk_does() -> (
    None
):
    recorder = Recorder(error(429, "slow down"), OK)
    assert await run(recorder) == "ok"
    assert len(recorder.requests) == 2
    recorder = Recorder(error(429, "slow down"))
    with pytest.raises(PromptGenUnavailableError) as caught:
        await run(recorder)
    assert caught.value.reason == "limit" and len(recorder.requests) == FAST.attempts


async def test_a_429_with_a_long_retry_after_is_unavailable_at_once() -> None:
    recorder = Recorder(error(429, "no", **{"retry-after": "60"}))
    with pytest.raises(PromptGenUnavailableError) as caught:
        await run(recorder)
    assert caught.value.reason == "limit" and len(recorder.requests) == 1


async def test_a_short_retry_after_on_429_is_waited_for_then_retried() -> None:
    recorder = Recorder(error(429, "slow down", **{"retry-after": "0.1"}), OK)
    started = time.monotonic()
    assert await run(recorder) == "ok"
    assert len(recorder.requests) == 2 and time.monotonic() - started >= 0.1


async def test_a_long_retry_after_on_429_is_limit_at_once() -> None:
    recorder = Recorder(error(429, "slow down", **{"retry-after": "60"}))
    with pytest.raises(PromptGenUnavailableError) as caught:
        await run(recorder)
    assert caught.value.reason == "limit" and len(recorder.requests) == 1


async def test_other_4xx_fail_at_once_with_the_providers_message() -> None:
    recorder = Recorder(error(400, "more than 4 cache_control blocks"))
    with pytest.raises(PromptGenError) as caught:
        await run(recorder)
    assert (
        len(recorder.requests) == 1
        and not caught.value.retryable
        and caught.value.status == 400
    )
    assert "more than 4 cache_control blocks" in str(caught.value)


async def test_the_callers_abort_during_a_request_is_raised_unchanged_at_once() -> None:
    async def hang(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(10)
        return httpx.Response(200, json=OK)

    recorder = Recorder(hang)
    controller = AbortController()
    asyncio.get_running_loop().call_later(0.05, controller.abort, "user cancelled")
    started = time.monotonic()
    with pytest.raises(AbortError) as caught:
        await handler(recorder).execute(REQUEST, controller.signal)
    assert time.monotonic() - started < 1.0
    assert caught.value.reason == "user cancelled"


async def test_the_callers_abort_during_a_backoff_is_raised_at_once() -> None:
    recorder = Recorder(error(500, **{"retry-after": "5"}))
    controller = AbortController()
    asyncio.get_running_loop().call_later(0.05, controller.abort)
    started = time.monotonic()
    policy = RetryPolicy(attempts=3, total_s=60)
    with pytest.raises(AbortError):
        await handler(recorder, policy).execute(REQUEST, controller.signal)
    assert time.monotonic() - started < 1.0 and len(recorder.requests) == 1


async def test_an_aborted_signal_makes_no_request() -> None:
    recorder = Recorder(OK)
    controller = AbortController()
    controller.abort()
    with pytest.raises(AbortError):
        await handler(recorder).execute(REQUEST, controller.signal)
    assert recorder.requests == []


async def test_the_key_never_shows_in_errors_logs_or_reprs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    echo = error(401, f"invalid x-api-key {FAKE_KEY}")
    recorder = Recorder(error(500, f"key {FAKE_KEY} overloaded"), echo)
    anthropic = handler(recorder)
    with (
        caplog.at_level(logging.DEBUG),
        pytest.raises(PromptGenUnavailableError) as caught,
    ):
        await anthropic.execute(REQUEST, AbortController().signal)
    assert recorder.requests[0].headers["x-api-key"] == FAKE_KEY  # it was sent...
    seen = [
        str(caught.value),
        repr(caught.value),
        repr(pickle.loads(pickle.dumps(caught.value))),
        caplog.text,
        repr(anthropic),
        repr(PromptGen({"anthropic": anthropic}, "anthropic")),
        repr(Secret(FAKE_KEY)),
        str(pickle.loads(pickle.dumps(Secret(FAKE_KEY))).reveal()),
    ]
    for text in seen:  # ...and shows nowhere else
        assert FAKE_KEY not in text
    assert "***" in str(caught.value)


def test_retry_after_reads_seconds_milliseconds_and_dates() -> None:
    assert parse_retry_after(httpx.Headers({"retry-after": "2"})) == 2.0
    assert (
        parse_retry_after(httpx.Headers({"retry-after-ms": "250", "retry-after": "9"}))
        == 0.25
    )
    assert (
        parse_retry_after(
            httpx.Headers({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"})
        )
        == 0.0
    )
    assert parse_retry_after(httpx.Headers({"retry-after": "soon"})) is None
    assert parse_retry_after(httpx.Headers({})) is None


async def test_race_on_an_aborted_signal_closes_the_work_it_never_started() -> None:
    import inspect

    from toolloop.abort import race

    controller = AbortController()
    controller.abort("gone")
    work = asyncio.sleep(1)
    with pytest.raises(AbortError):
        await race(work, controller.signal)
    assert inspect.getcoroutinestate(work) == inspect.CORO_CLOSED


ENDPOINT = handler(Recorder(OK)).endpoint


@pytest.mark.parametrize(
    ("status", "headers", "fields", "kind", "wait"),
    [
        (
            429,
            {},
            {"error_code": "contract_spend_limit_reached"},
            "SpendLimitError",
            None,
        ),
        (
            429,
            {"retry-after": "0.5"},
            {"error_code": "enforced_spend_limit_reached"},
            "SpendLimitError",
            None,
        ),
        (429, {"retry-after": "0.5"}, {}, "PromptGenUnavailableError", 0.5),
        (
            404,
            {},
            {"type": "not_found_error", "message": "model: claude-x"},
            "PromptGenError",
            None,
        ),
        (
            404,
            {},
            {"type": "not_found_error", "message": "Not Found"},
            "PromptGenUnavailableError",
            None,
        ),
        (503, {"x-should-retry": "false"}, {}, "PromptGenError", None),
        (503, {}, {}, "PromptGenError", 0.25),
        (400, {"x-should-retry": "true"}, {}, "PromptGenError", 0.25),
        (401, {}, {}, "PromptGenUnavailableError", None),
    ],
)
def test_classify_is_a_pure_function_of_the_answer(
    status: int,
    headers: dict[str, str],
    fields: dict[str, str],
    kind: str,
    wait: float | None,
) -> None:
    error, wait_s = classify(
        "anthropic", ENDPOINT, status, headers, "detail", fields, 0.25
    )
    assert (type(error).__name__, wait_s) == (kind, wait)
    assert error.status == status
    assert (
        classify("anthropic", ENDPOINT, status, headers, "detail", fields, 0.25)[1]
        == wait_s
    )
