"""The catalogue end to end, over real HTTP to a strict simulator (which refuses, as the real API
does, what each model refuses): request shapes per model and reasoning level, the same thinking
on every step, retired and unknown ids, capacity fallback, x-should-retry, spend limits, cache_ttl."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest
from pydantic import BaseModel

from tests.support.sim import Recording
from tests.unit.providers_kit import FAKE_KEY
from toolloop import (
    AbortController,
    Budget,
    MemoryJournal,
    ModelEvent,
    PromptGen,
    PromptGenError,
    PromptGenRequest,
    RunToolLoopOptions,
    SpendLimitError,
    TextPart,
    ToolOutput,
    ToolSpec,
    UserMessage,
    run_tool_loop,
)
from toolloop.providers import (
    AnthropicHandler,
    FalHandler,
    ModelInfo,
    ModelPrice,
    RetryPolicy,
    default_catalog,
)
from toolloop.providers.retry import should_retry
from toolloop.sim import SimFault, SimRequest, SimServer, SimTurn
from toolloop.sim.sdk_check import SdkValidationError, sdk_validator

FAST = RetryPolicy(
    attempts=3,
    base_delay_s=0.01,
    max_delay_s=0.05,
    total_s=10.0,
    short_retry_after_s=1.0,
)
# > 1,024 tokens
SYSTEM = "You review storyboards shot by shot and report what to change. " * 80
THREE_TURNS = [
    {"text": "", "tool_calls": [{"name": "read_frame", "input": {"shot": 1}}]},
    {"text": "", "tool_calls": [{"name": "read_frame", "input": {"shot": 2}}]},
    "Both frames are fine.",
]


class Shot(BaseModel):
    shot: int


def read_frame() -> ToolSpec:
    def run(input: Shot, signal: Any) -> ToolOutput:
        return ToolOutput(content=[TextPart(text=f"frame {input.shot}: a wide shot")])

    return ToolSpec(
        name="read_frame", description="Read one frame of a shot.", schema=Shot, run=run
    )


def anthropic(sim: SimServer, **options: Any) -> AnthropicHandler:
    return AnthropicHandler(
        FAKE_KEY, base_url=sim.base_url, retry=options.pop("retry", FAST), **options
    )


def fal(sim: SimServer, **options: Any) -> FalHandler:
    return FalHandler(
        FAKE_KEY, run_url=sim.base_url, retry=options.pop("retry", FAST), **options
    )


def options(
    prompt_gen: PromptGen, model: str, events: list[Any], **extra: Any
) -> RunToolLoopOptions:
    return RunToolLoopOptions(
        generate=prompt_gen.as_generate(),
        model=model,
        system=SYSTEM,
        messages=[UserMessage(content="Review shots 1 and 2.")],
        tools=[read_frame()],
        budget=Budget(usd=10.0),
        max_steps=6,
        step=MemoryJournal().step,
        on_step=events.append,
        **extra,
    )


# -- request shapes per model -------------------------------------------------------------------

EXPECTED_THINKING: dict[tuple[str, str], Any] = {
    **{
        ("claude-opus-5-5", r): {"type": "adaptive"}
        for r in ("off", "low", "medium", "high")
    },
    **{
        ("claude-fable-5-1", r): {"type": "adaptive"}
        for r in ("off", "low", "medium", "high")
    },
    ("claude-sonnet-5-5", "off"): {"type": "disabled"},
    **{
        ("claude-sonnet-5-5", r): {"type": "adaptive"}
        for r in ("low", "medium", "high")
    },
    **{
        (m, "off"): {"type": "disabled"}
        for m in ("claude-haiku-4-5", "claude-opus-4-5")
    },
    **{
        (m, r): {"type": "enabled", "budget_tokens": b}
        for m in ("claude-haiku-4-5", "claude-opus-4-5")
        for r, b in (("low", 2048), ("medium", 8192), ("high", 24576))
    },
}


@pytest.mark.parametrize("reasoning", ["off", "low", "medium", "high"])
@pytest.mark.parametrize(
    "model",
    [
        "claude-opus-5-5",
        "claude-sonnet-5-5",
        "claude-haiku-4-5",
        "claude-fable-5-1",
        "claude-opus-4-5",
    ],
)
async def test_every_step_sends_the_same_thinking_the_model_accepts(
    model: str, reasoning: str
) -> None:
    policy = Recording(THREE_TURNS)
    events: list[Any] = []
    with SimServer(policy) as sim:
        gen = PromptGen({"anthropic": anthropic(sim)}, "anthropic")
        result = await run_tool_loop(options(gen, model, events, reasoning=reasoning))
        statuses = sim.stats()["statuses"]
    assert result.stopped_by == "done" and result.final_text == "Both frames are fine."
    # the strict simulator would answer 400 to a refused shape
    assert statuses == {"200": 3}
    sent = [
        (r.body.get("thinking"), r.body.get("output_config"), r.body["max_tokens"])
        for r in policy.requests
    ]
    # the same on every step of the run
    assert len(sent) == 3 and sent[0] == sent[1] == sent[2]
    assert sent[0][0] == EXPECTED_THINKING[(model, reasoning)]


@pytest.mark.parametrize(
    "model",
    ["claude-opus-5-5", "claude-sonnet-5-5", "claude-haiku-4-5", "claude-fable-5-1"],
)
async def test_a_three_turn_run_finishes_through_fal_too(model: str) -> None:
    policy = Recording(THREE_TURNS)
    with SimServer(policy) as sim:
        gen = PromptGen({"fal": fal(sim)}, "fal")
        result = await run_tool_loop(options(gen, model, [], reasoning="medium"))
    assert result.stopped_by == "done"
    slug = default_catalog().find(model).fal_slug  # type: ignore[union-attr]
    assert {r.body["model"] for r in policy.requests} == {slug}
    assert {str(r.body.get("reasoning")) for r in policy.requests} == {
        str({"effort": "medium"})
    }


async def test_a_forced_tool_choice_becomes_auto_where_the_model_refuses_it() -> None:
    with SimServer(Recording(["Done."])) as sim:
        request = PromptGenRequest(
            model="claude-opus-5-5",
            messages=[UserMessage(content="Read shot 1.")],
            tools=[read_frame_definition()],
            tool_choice={"name": "read_frame"},
        )
        result = await anthropic(sim).execute(request, AbortController().signal)
    assert result.meta is not None
    assert result.meta["request_notes"] == [
        "claude-opus-5-5 refuses a forced tool_choice: sent 'auto'"
    ]


def read_frame_definition() -> Any:
    from toolloop.loop.tools import tool_definitions

    return tool_definitions([read_frame()])[0]


# -- retired and unknown ids ---------------------------------------------------------------------


async def test_a_retired_id_fails_at_once_naming_the_replacement_and_sends_nothing() -> (
    None
):
    with SimServer(Recording(["Hi."])) as sim:
        gen = PromptGen(
            {"anthropic": anthropic(sim), "fal": fal(sim)}, "anthropic", ["fal"]
        )
        with pytest.raises(PromptGenError) as caught:
            await gen.generate(PromptGenRequest(prompt="Hi", model="claude-sonnet-4-5"))
        assert sim.stats()["requests"] == 0  # no call, and no silent fallback to fal
    assert "retired on 2026-11-30" in str(
        caught.value
    ) and "'claude-sonnet-5-5'" in str(caught.value)


async def test_a_404_for_the_model_is_a_clear_error_without_fallback() -> None:
    # The client knows a model the server does not serve: the API's 404 not_found_error.
    mine = default_catalog().with_models(
        ModelInfo(id="claude-next", price=ModelPrice(3, 15, 0.3, 3.75))
    )
    with SimServer(Recording(["Hi."])) as sim:
        gen = PromptGen(
            {"anthropic": anthropic(sim, catalog=mine), "fal": fal(sim)},
            "anthropic",
            ["fal"],
        )
        with pytest.raises(PromptGenError) as caught:
            await gen.generate(PromptGenRequest(prompt="Hi", model="claude-next"))
        assert sim.stats()["endpoints"] == {"anthropic": 1}  # fal was never asked
    assert caught.value.status == 404 and "model: claude-next" in str(caught.value)
    assert caught.value.retryable is False


def test_the_simulator_answers_a_retired_id_with_the_real_404_envelope() -> None:
    with SimServer(["Hi."]) as sim:
        response = httpx.post(
            f"{sim.base_url}/v1/messages",
            headers={"x-api-key": "k", "anthropic-version": "2023-06-01"},
            json={
                "model": "claude-sonnet-4-5",
                "max_tokens": 10,
                "messages": [{"role": "user", "content": "Hi"}],
            },
        )
    assert response.status_code == 404
    body = response.json()
    assert body["type"] == "error"
    assert body["error"] == {
        "type": "not_found_error",
        "message": "model: claude-sonnet-4-5",
    }


# -- capacity fallback, x-should-retry, spend limits -------------------------------------------


def anthropic_overloaded(request: SimRequest) -> SimTurn:
    """Every Anthropic request is a 529 (a storm); fal answers from the script."""
    turn = Recording(THREE_TURNS).script(request)
    if request.wire == "anthropic":
        return turn.model_copy(
            update={"fault": SimFault(kind="error", status=529, times=None)}
        )
    return turn


async def test_an_anthropic_529_storm_is_answered_by_fal_and_the_switch_shows(
    caplog: pytest.LogCaptureFixture,
) -> None:
    events: list[Any] = []
    with SimServer(anthropic_overloaded) as sim:
        gen = PromptGen(
            {"anthropic": anthropic(sim), "fal": fal(sim)}, "anthropic", ["fal"]
        )
        with caplog.at_level(logging.WARNING, "toolloop.providers"):
            result = await run_tool_loop(options(gen, "claude-sonnet-5-5", events))
        stats = sim.stats()
    assert result.stopped_by == "done" and result.final_text == "Both frames are fine."
    assert stats["statuses"] == {"529": 9, "200": 3}  # 3 attempts per step, then fal
    model_events = [e for e in events if isinstance(e, ModelEvent)]
    assert [e.provider for e in model_events] == ["fal", "fal", "fal"]
    assert all(
        e.fallback_from == [{"provider": "anthropic", "reason": "HTTP 529"}]
        for e in model_events
    )
    switches = [
        r for r in caplog.records if r.getMessage().startswith("prompt-gen falls back")
    ]
    assert [r.getMessage() for r in switches] == [
        "prompt-gen falls back from anthropic to fal: HTTP 529"
    ] * 3
    assert model_events[0].model_dump(mode="json")["fallback_from"] == [
        {"provider": "anthropic", "reason": "HTTP 529"}
    ]


@pytest.mark.parametrize(
    ("status", "header", "requests"),
    [(503, "false", 1), (503, None, 3), (400, "true", 3), (400, None, 1)],
)
async def test_x_should_retry_overrides_the_status(
    status: int, header: str | None, requests: int
) -> None:
    headers = {"x-should-retry": header} if header else None
    fault = {"kind": "error", "status": status, "times": None, "headers": headers}
    with SimServer([{"text": "Hi.", "fault": fault}]) as sim:
        with pytest.raises(PromptGenError) as caught:
            await anthropic(sim).execute(
                PromptGenRequest(prompt="Hi"), AbortController().signal
            )
        assert sim.stats()["requests"] == requests
    assert caught.value.status == status
    assert caught.value.retryable is (status == 503 and header is None)


def test_should_retry_is_the_sdks_rule() -> None:
    assert should_retry(503, {"x-should-retry": "false"}) is False
    assert should_retry(400, {"x-should-retry": "true"}) is True
    assert [should_retry(s, {}) for s in (400, 404, 408, 409, 429, 500, 529)] == [
        False,
        False,
        True,
        True,
        True,
        True,
        True,
    ]


@pytest.mark.parametrize(
    "code", ["contract_spend_limit_reached", "enforced_spend_limit_reached"]
)
async def test_a_spend_limit_429_is_not_retried_and_does_not_fall_back(
    code: str,
) -> None:
    fault = {
        "kind": "error",
        "status": 429,
        "times": None,
        "retry_after": 0,
        "error_code": code,
    }
    with SimServer([{"text": "Hi.", "fault": fault}]) as sim:
        gen = PromptGen(
            {"anthropic": anthropic(sim), "fal": fal(sim)}, "anthropic", ["fal"]
        )
        with pytest.raises(SpendLimitError) as caught:
            await gen.generate(PromptGenRequest(prompt="Hi"))
        assert sim.stats()["endpoints"] == {"anthropic": 1}
    assert caught.value.error_code == code and caught.value.retryable is False
    assert "spend limit" in str(caught.value)


# -- cache_ttl -------------------------------------------------------------------------------------


async def test_cache_ttl_1h_marks_every_breakpoint_and_prices_the_1h_writes() -> None:
    policy = Recording(THREE_TURNS)
    events: list[Any] = []
    with SimServer(policy) as sim:
        gen = PromptGen({"anthropic": anthropic(sim)}, "anthropic")
        result = await run_tool_loop(
            options(gen, "claude-sonnet-5-5", events, cache_ttl="1h")
        )
    assert result.stopped_by == "done"
    marks = [
        block["cache_control"]
        for r in policy.requests
        for block in _blocks(r.body)
        if "cache_control" in block
    ]
    assert marks and all(mark == {"type": "ephemeral", "ttl": "1h"} for mark in marks)
    usage = [e.usage for e in events if isinstance(e, ModelEvent)]
    assert usage[0].cache_write_1h_tokens == usage[0].cache_write_tokens > 1024
    assert usage[0].cache_write_5m_tokens == 0
    price = default_catalog().price("claude-sonnet-5-5")
    assert price is not None
    for event in (e for e in events if isinstance(e, ModelEvent)):
        u = event.usage
        uncached = u.prompt_tokens - u.cached_tokens - u.cache_write_tokens
        expected = (
            uncached * 2
            + u.cached_tokens * 0.1
            + u.cache_write_tokens * 4.0
            + u.completion_tokens * 10
        ) / 1e6
        assert event.cost_usd == pytest.approx(expected)


def _blocks(body: dict[str, Any]) -> list[dict[str, Any]]:
    found = [b for b in body.get("system", []) if isinstance(b, dict)] + list(
        body.get("tools", [])
    )
    for turn in body["messages"]:
        for block in turn["content"] if isinstance(turn["content"], list) else []:
            found.append(block)
            found += (
                [b for b in block.get("content", []) if isinstance(b, dict)]
                if block["type"] == "tool_result"
                else []
            )
    return found


# -- what the simulator refuses --------------------------------------------------------------------


def post(sim: SimServer, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{sim.base_url}/v1/messages",
        headers={"x-api-key": "k", "anthropic-version": "2023-06-01"},
        json=body,
    )


HI = [{"role": "user", "content": "Hi"}]
TOOL = {
    "name": "read_frame",
    "description": "Read.",
    "input_schema": {"type": "object"},
}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"model": "claude-opus-5-5", "thinking": {"type": "disabled"}},
            "'disabled' is not supported",
        ),
        (
            {"model": "claude-fable-5-1", "thinking": {"type": "disabled"}},
            "thinking is always on",
        ),
        (
            {"model": "claude-haiku-4-5", "thinking": {"type": "adaptive"}},
            "adaptive thinking is not",
        ),
        (
            {"model": "claude-opus-4-5", "thinking": {"type": "adaptive"}},
            "adaptive thinking is not",
        ),
        (
            {"model": "claude-haiku-4-5", "output_config": {"effort": "low"}},
            "effort is not supported",
        ),
        (
            {
                "model": "claude-opus-5-5",
                "thinking": {"type": "enabled", "budget_tokens": 2048},
            },
            "thinking.type.enabled is not supported",
        ),
        (
            {
                "model": "claude-haiku-4-5",
                "max_tokens": 2000,
                "thinking": {"type": "enabled", "budget_tokens": 4096},
            },
            "must be greater than `thinking.budget_tokens`",
        ),
        (
            {
                "model": "claude-sonnet-5-5",
                "tools": [TOOL],
                "tool_choice": {"type": "any"},
            },
            "forced tool use",
        ),
        (
            {
                "model": "claude-haiku-4-5",
                "tools": [TOOL],
                "tool_choice": {"type": "any"},
                "thinking": {"type": "enabled", "budget_tokens": 1024},
            },
            "Thinking may not be enabled",
        ),
        (
            {"model": "claude-opus-5-5", "temperature": 0.5},
            "temperature: is not supported",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}]},
            "must be non-empty",
        ),
        (
            {"messages": [{"role": "user", "content": ""}]},
            "must have non-empty content",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "toolu_x"}],
                    }
                ]
            },
            "unexpected `tool_use_id`",
        ),
        (
            {
                "system": [
                    {
                        "type": "text",
                        "text": "a",
                        "cache_control": {"type": "ephemeral"},
                    },
                    {
                        "type": "text",
                        "text": "b",
                        "cache_control": {"type": "ephemeral", "ttl": "1h"},
                    },
                ]
            },
            "ttl '1h' may not come after one with ttl '5m'",
        ),
    ],
)
def test_the_simulator_refuses_what_each_model_refuses(
    body: dict[str, Any], message: str
) -> None:
    full = {"model": "claude-sonnet-5-5", "max_tokens": 10_000, "messages": HI, **body}
    with SimServer(
        ["Hi."], strict=False
    ) as sim:  # the catalogue's own messages, not the SDK check's
        response = post(sim, full)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert message in response.json()["error"]["message"]


def test_strict_mode_refuses_a_body_the_sdk_types_refuse() -> None:
    validate = sdk_validator()
    assert validate is not None
    good = {"model": "claude-sonnet-5-5", "max_tokens": 10, "messages": HI}
    validate(good)
    with pytest.raises(
        SdkValidationError, match="temprature: Extra inputs are not permitted"
    ):
        validate({**good, "temprature": 0.2})
    with pytest.raises(
        SdkValidationError, match=r"messages\.0\.content\.0\.cache: Extra inputs"
    ):
        validate(
            {
                **good,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "text", "text": "x", "cache": True}],
                    }
                ],
            }
        )
    with SimServer(["Hi."], strict=True) as sim:
        assert sim.stats()["strict"] is True
        response = post(sim, {**good, "tool_choice": {"type": "auto", "force": True}})
    assert (
        response.status_code == 400
        and "tool_choice.force: Extra inputs" in response.json()["error"]["message"]
    )


def test_the_minimum_cacheable_length_is_the_models() -> None:
    # ~2,000 tokens of system text: cached on Sonnet 5.5 (1,024), not on Haiku 4.5 (4,096, 3rd party)
    system = [
        {"type": "text", "text": "word " * 2000, "cache_control": {"type": "ephemeral"}}
    ]
    with SimServer(["Hi."]) as sim:
        sonnet = post(
            sim,
            {
                "model": "claude-sonnet-5-5",
                "max_tokens": 10,
                "system": system,
                "messages": HI,
            },
        )
        haiku = post(
            sim,
            {
                "model": "claude-haiku-4-5",
                "max_tokens": 10,
                "system": system,
                "messages": HI,
            },
        )
    assert sonnet.json()["usage"]["cache_creation_input_tokens"] > 1024
    assert haiku.json()["usage"]["cache_creation_input_tokens"] == 0
