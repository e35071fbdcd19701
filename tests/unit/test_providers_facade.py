"""`PromptGen` (SPEC 3.1): the fallback chain, what moves it on, what stops it; `from_env`."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from toolloop import (
    AbortController,
    AbortError,
    AbortSignal,
    PromptGen,
    PromptGenError,
    PromptGenHandler,
    PromptGenRequest,
    PromptGenResult,
    PromptGenUnavailableError,
    SpendLimitError,
    ToolArgumentsError,
    from_env,
)
from toolloop.providers import (
    AnthropicHandler,
    ClaudeHandler,
    CodexHandler,
    FalHandler,
    OpenAIHandler,
)
from toolloop.providers.facade import AROUND_ATTEMPT, Send

REQUEST = PromptGenRequest(prompt="Hi")


class Fake:
    """A handler that raises `error` (when set) or answers `text`; it counts its calls."""

    def __init__(
        self, text: str = "", error: BaseException | None = None, cost: float = 0.5
    ) -> None:
        self.text, self.error, self.cost, self.calls = text, error, cost, 0

    def estimate(self, request: PromptGenRequest) -> float:
        return self.cost

    async def execute(
        self, request: PromptGenRequest, signal: AbortSignal
    ) -> PromptGenResult:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return PromptGenResult(
            text=self.text, meta={"provider": "self-named", "model": "m"}
        )


def auth() -> PromptGenUnavailableError:
    return PromptGenUnavailableError("refused\n  Check the key.", "auth", 401)


async def test_the_head_answers_and_meta_names_it() -> None:
    gen = PromptGen({"a": Fake("from a"), "b": Fake("from b")}, "a", ["b"])
    result = await gen.generate(REQUEST)
    assert result.text == "from a" and result.meta == {"provider": "a", "model": "m"}
    assert (await gen.generate(REQUEST, provider="b")).meta["provider"] == "b"  # type: ignore[index]


@pytest.mark.parametrize(
    "error",
    [
        auth(),
        PromptGenUnavailableError("no\n  x", "unsupported"),
        PromptGenUnavailableError("no\n  x", "missing"),
        PromptGenError("limited\n  x", status=429),
        PromptGenError("billing\n  x", status=402),
        PromptGenError("overloaded (4 attempts)\n  x", status=529, retryable=True),
        PromptGenError("boom (4 attempts)\n  x", status=500, retryable=True),
        PromptGenError("x-should-retry: false\n  x", status=503),
    ],
)
async def test_unavailable_and_capacity_errors_move_to_the_next_provider(
    error: PromptGenError, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = Fake(error=error), Fake("from b")
    gen = PromptGen({"a": a, "b": b}, "a", ["b"])
    with caplog.at_level(logging.WARNING, "toolloop.providers"):
        result = await gen.generate(REQUEST)
    assert (
        result.text == "from b"
        and result.meta is not None
        and result.meta["provider"] == "b"
    )
    (record,) = caplog.records
    assert (record.__dict__["from"], record.__dict__["to"]) == ("a", "b")
    reason = getattr(error, "reason", None)
    expected = f"HTTP {error.status}" if reason is None else reason
    if reason is not None and error.status is not None:
        expected = f"{reason} (HTTP {error.status})"
    assert record.__dict__["reason"] == expected
    assert record.getMessage() == f"prompt-gen falls back from a to b: {expected}"
    assert result.meta["fallback_from"] == [{"provider": "a", "reason": expected}]


@pytest.mark.parametrize(
    "error",
    [
        SpendLimitError("spend limit\n  x", "contract_spend_limit_reached"),
        PromptGenError("model: claude-sonnet-4-5\n  x", status=404),
        PromptGenError("bad request\n  x", status=400),
        PromptGenError("no answer\n  x", retryable=True),
        ToolArgumentsError("trim", "{"),
        ValueError("bug"),
    ],
)
async def test_other_errors_are_raised_at_once(error: Exception) -> None:
    """A spend limit, a model the API does not serve, a bad request, a timeout: no fallback."""
    b = Fake("from b")
    gen = PromptGen({"a": Fake(error=error), "b": b}, "a", ["b"])
    with pytest.raises(type(error)):
        await gen.generate(REQUEST)
    assert b.calls == 0


async def test_an_aborted_caller_never_falls_back() -> None:
    controller = AbortController()

    class AbortsThenRefuses(Fake):
        async def execute(
            self, request: PromptGenRequest, signal: AbortSignal
        ) -> PromptGenResult:
            controller.abort("stop")
            raise auth()

    b = Fake("from b")
    gen = PromptGen({"a": AbortsThenRefuses(), "b": b}, "a", ["b"])
    with pytest.raises(PromptGenUnavailableError):
        await gen.generate(REQUEST, signal=controller.signal)
    assert b.calls == 0


async def test_the_callers_abort_error_is_raised_unchanged() -> None:
    abort = AbortError("The operation was aborted: stop.", "stop")
    gen = PromptGen({"a": Fake(error=abort), "b": Fake("b")}, "a", ["b"])
    with pytest.raises(AbortError) as caught:
        await gen.generate(REQUEST)
    assert caught.value is abort


async def test_when_every_provider_is_unavailable_the_last_error_is_raised() -> None:
    last = PromptGenUnavailableError("limited\n  x", "limit", 429)
    a, b = Fake(error=auth()), Fake(error=last)
    gen = PromptGen({"a": a, "b": b}, "a", ["b", "a", "b"])
    with pytest.raises(PromptGenUnavailableError) as caught:
        await gen.generate(REQUEST)
    # a name listed twice is tried once
    assert caught.value is last and (a.calls, b.calls) == (
        1,
        1,
    )


async def test_an_unregistered_head_names_the_registered_providers() -> None:
    gen = PromptGen({"a": Fake(), "b": Fake()}, "zed")
    with pytest.raises(
        PromptGenError, match="'zed' is not registered; registered: 'a', 'b'"
    ):
        await gen.generate(REQUEST)
    with pytest.raises(PromptGenError, match="'c' is not registered"):
        gen.estimate(REQUEST, provider="c")


async def test_an_unregistered_fallback_is_skipped_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gen = PromptGen({"a": Fake(error=auth()), "b": Fake("from b")}, "a", ["ghost", "b"])
    with caplog.at_level(logging.WARNING, "toolloop.providers"):
        assert (await gen.generate(REQUEST)).text == "from b"
    assert any(
        "'ghost' is not registered; skipped" in r.getMessage() for r in caplog.records
    )


async def test_estimate_uses_the_head_only_and_as_generate_is_the_loops_callable() -> (
    None
):
    a, b = Fake(cost=0.25), Fake("from b", cost=9.0)
    gen = PromptGen({"a": a, "b": b}, "a", ["b"])
    assert gen.estimate(REQUEST) == 0.25 and gen.estimate(REQUEST, provider="b") == 9.0
    assert gen.providers() == ["a", "b"]
    generate = gen.as_generate("b")
    result = await generate(REQUEST, AbortController().signal)
    assert result.text == "from b" and a.calls == 0


def test_every_handler_is_a_prompt_gen_handler() -> None:
    for handler in [
        AnthropicHandler(),
        FalHandler(),
        OpenAIHandler(),
        CodexHandler(),
        ClaudeHandler(),
        Fake(),
    ]:
        assert isinstance(handler, PromptGenHandler)


def test_from_env_registers_every_provider_with_its_settings() -> None:
    env: dict[str, Any] = {
        "ANTHROPIC_API_KEY": "sk-ant-FAKE",
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:9/",
        "FAL_RUN_URL": "http://127.0.0.1:8",
        "TOOLLOOP_PROVIDER": "fal",
        "TOOLLOOP_FALLBACK": " anthropic , openai,",
    }
    gen = from_env(env)
    assert gen.providers() == ["anthropic", "fal", "openai", "codex", "claude"]
    assert gen.default_provider == "fal" and gen.fallback == ["anthropic", "openai"]
    anthropic = gen.handler("anthropic")
    assert isinstance(anthropic, AnthropicHandler)
    assert anthropic.endpoint.url == "http://127.0.0.1:9/v1/messages"
    assert "sk-ant-FAKE" not in repr(anthropic) and "key=set" in repr(anthropic)
    fal = gen.handler("fal")
    assert isinstance(fal, FalHandler) and "key=missing" in repr(fal)
    defaults = from_env({})
    assert defaults.default_provider == "anthropic" and defaults.fallback == []


async def test_from_env_without_keys_is_unavailable_auth_at_call_time() -> None:
    gen = from_env({"TOOLLOOP_FALLBACK": "fal"})
    with pytest.raises(PromptGenUnavailableError) as caught:
        await gen.generate(REQUEST)
    assert caught.value.reason == "auth" and "FAL_KEY" in str(caught.value)


async def test_each_provider_attempt_goes_through_the_around_attempt_hook() -> None:
    a, b = Fake(error=PromptGenError("overloaded\n  x", status=529)), Fake("from b")
    gen = PromptGen({"a": a, "b": b}, "a", ["b"])
    seen: list[tuple[str, str | None]] = []

    async def around(
        provider: str, request: PromptGenRequest, send: Send
    ) -> PromptGenResult:
        seen.append((provider, request.prompt))
        return await send(
            request.model_copy(update={"prompt": f"{request.prompt} via {provider}"})
        )

    token = AROUND_ATTEMPT.set(around)
    try:
        result = await gen.generate(REQUEST)
    finally:
        AROUND_ATTEMPT.reset(token)
    # each attempt, the caller's request each time
    assert seen == [
        ("a", "Hi"),
        ("b", "Hi"),
    ]
    assert result.meta is not None and result.meta["provider"] == "b"
    assert result.meta["fallback_from"] == [{"provider": "a", "reason": "HTTP 529"}]
    assert (a.calls, b.calls) == (1, 1)
    await gen.generate(REQUEST)  # no hook: the handlers are called as they are
    assert len(seen) == 2 and (a.calls, b.calls) == (2, 2)


async def test_an_error_of_the_hook_that_is_not_unavailable_stops_the_walk() -> None:
    a, b = Fake(error=PromptGenError("overloaded\n  x", status=529)), Fake("from b")
    gen = PromptGen({"a": a, "b": b}, "a", ["b"])

    async def around(
        provider: str, request: PromptGenRequest, send: Send
    ) -> PromptGenResult:
        if provider == "b":
            raise RuntimeError("budget stop")
        return await send(request)

    token = AROUND_ATTEMPT.set(around)
    try:
        with pytest.raises(RuntimeError, match="budget stop"):
            await gen.generate(REQUEST)
    finally:
        AROUND_ATTEMPT.reset(token)
    assert b.calls == 0
