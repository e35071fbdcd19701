"""The fal provider's mapping (its OpenAI-compatible router), on httpx.MockTransport."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from providers_kit import FAKE_KEY, FAST, Recorder

from toolloop import (
    AbortController,
    AssistantMessage,
    ImagePart,
    PromptGenError,
    PromptGenRequest,
    PromptGenUnavailableError,
    TextPart,
    ToolArgumentsError,
    ToolCall,
    ToolDefinition,
    ToolMessage,
    UserMessage,
)
from toolloop.providers import FalHandler

EPHEMERAL = {"type": "ephemeral"}
TOOL = ToolDefinition(
    name="read_frame", description="Read one frame.", input_schema={"type": "object"}
)


def completion(
    content: str | None = "ok",
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    finish: str | None = "stop",
    usage: dict[str, Any] | None = None,
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    body: dict[str, Any] = {
        "id": "gen-1",
        "model": "anthropic/claude-opus-5.5",
        "provider": "Anthropic",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }
    if usage is not None:
        body["usage"] = usage
    return body


def handler(recorder: Recorder, key: str | None = FAKE_KEY) -> FalHandler:
    return FalHandler(
        key,
        run_url="http://fal.test",
        retry=FAST,
        transport=recorder.transport,
        upload_images=False,
    )


async def call(
    request: PromptGenRequest, answer: Any = None
) -> tuple[Any, dict[str, Any]]:
    recorder = Recorder(
        answer
        if answer is not None
        else completion(usage={"prompt_tokens": 1, "completion_tokens": 1})
    )
    result = await handler(recorder).execute(request, AbortController().signal)
    return result, recorder.bodies[0]


async def test_a_tool_conversation_maps_to_the_router_body(tmp_path: Path) -> None:
    png = tmp_path / "f.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\npng-bytes")
    image = ImagePart(path=str(png), mime_type="image/png", hash="h")
    request = PromptGenRequest(
        system="Review.",
        model="claude-haiku-4-5",  # accepts temperature and a forced tool_choice (the catalogue)
        cache_system=True,
        tools=[TOOL],
        tool_choice={"name": "read_frame"},
        temperature=3.0,
        messages=[
            UserMessage(content="Look at shot 3."),
            AssistantMessage(
                tool_calls=[
                    ToolCall(id="c1", name="read_frame", input={"shot": 3}),
                    ToolCall(id="c2", name="read_frame", input=None),
                ]
            ),
            ToolMessage(
                tool_call_id="c1", content=[TextPart(text="frame 3", cache=True), image]
            ),
            ToolMessage(tool_call_id="c2", content="frame 4"),
        ],
    )
    recorder = Recorder(completion(usage={"prompt_tokens": 1, "completion_tokens": 1}))
    await handler(recorder).execute(request, AbortController().signal)
    sent = recorder.requests[0]
    assert (
        str(sent.url) == "http://fal.test/openrouter/router/openai/v1/chat/completions"
    )
    assert sent.headers["authorization"] == f"Key {FAKE_KEY}"
    body = recorder.bodies[0]
    assert (
        list(body)
        == [
            "model",
            "messages",
            "max_tokens",
            "temperature",
            "reasoning",
            "tools",
            "tool_choice",
            "stream",  # fal's default max_tokens of 32,000 may take 900 s: streamed (timeouts.py)
            "stream_options",
        ]
    )
    assert body["model"] == "anthropic/claude-haiku-4.5" and body["max_tokens"] == 32000
    assert body["temperature"] == 2.0 and body["reasoning"] == {"effort": "medium"}
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "read_frame",
                "description": "Read one frame.",
                "parameters": {"type": "object"},
            },
        }
    ]
    assert body["tool_choice"] == {
        "type": "function",
        "function": {"name": "read_frame"},
    }
    uri = (
        "data:image/png;base64,"
        + base64.b64encode(b"\x89PNG\r\n\x1a\npng-bytes").decode()
    )
    assert body["messages"] == [
        {
            "role": "system",
            "content": [
                {"type": "text", "text": "Review.", "cache_control": EPHEMERAL}
            ],
        },
        {"role": "user", "content": "Look at shot 3."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "read_frame", "arguments": '{"shot":3}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "read_frame", "arguments": "{}"},
                },
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "c1",
            "content": [
                {"type": "text", "text": "frame 3", "cache_control": EPHEMERAL},
                {"type": "text", "text": "[image 1 of this result follows]"},
            ],
        },
        {"role": "tool", "tool_call_id": "c2", "content": "frame 4"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "[images of the result of c1]"},
                {"type": "image_url", "image_url": {"url": uri}},
            ],
        },
    ]


@pytest.mark.parametrize(
    ("model", "sent"),
    [
        ("claude-sonnet-5-5", "anthropic/claude-sonnet-5.5"),  # the row's fal slug
        (
            "anthropic/claude-opus-5-5",
            "anthropic/claude-opus-5-5",
        ),  # a slug is sent as given
        ("google/gemini-3.8-flash", "google/gemini-3.8-flash"),
        ("gpt-5-mini", "gpt-5-mini"),  # not an Anthropic model: never prefixed
    ],
)
async def test_model_ids_are_sent_as_the_router_names_them(
    model: str, sent: str
) -> None:
    _, body = await call(PromptGenRequest(prompt="Hi", model=model))
    assert body["model"] == sent


async def test_what_opus_5_5_refuses_is_left_out_and_noted() -> None:
    request = PromptGenRequest(
        messages=[UserMessage(content="Hi")],
        tools=[TOOL],
        tool_choice="required",
        temperature=0.5,
    )
    result, body = await call(request)
    assert body["model"] == "anthropic/claude-opus-5.5"
    assert "temperature" not in body and body["tool_choice"] == "auto"
    assert result.meta["request_notes"] == [
        "claude-opus-5-5 refuses temperature: not sent",
        "claude-opus-5-5 refuses a forced tool_choice: sent 'auto'",
    ]


async def test_a_prompt_request_sends_system_and_user_strings_and_reasoning_off_is_left_out() -> (
    None
):
    _, body = await call(
        PromptGenRequest(prompt="Hi", system="Be brief.", params={"reasoning": "off"})
    )
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]
    assert "reasoning" not in body and "tools" not in body and "temperature" not in body


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (PromptGenRequest(messages=[]), "messages must not be empty"),
        (PromptGenRequest(prompt="  "), "needs a non-empty prompt"),
        (
            PromptGenRequest(prompt="Hi", params={"reasoning": "max"}),
            "params.reasoning must be",
        ),
        (
            PromptGenRequest(prompt="Hi", model="acme/unknown"),
            "'acme/unknown' is not in the model catalogue",
        ),
        (
            PromptGenRequest(prompt="Hi", model="claude-sonnet-4-5"),
            "was retired on 2026-11-30",
        ),
        (
            PromptGenRequest(
                messages=[UserMessage(content="Hi")], params={"images": [{"path": "x"}]}
            ),
            "takes no params.images with messages",
        ),
    ],
)
async def test_bad_requests_fail_before_any_call(
    request_: PromptGenRequest, message: str
) -> None:
    recorder = Recorder(completion())
    with pytest.raises(PromptGenError) as caught:
        await handler(recorder).execute(request_, AbortController().signal)
    assert message in str(caught.value) and recorder.requests == []


async def test_text_tool_calls_usage_and_cost_with_cache_rates() -> None:
    answer = completion(
        None,
        tool_calls=[
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "read_frame", "arguments": '{"shot": 3}'},
            },
            {
                "id": "c2",
                "type": "function",
                "function": {"name": "read_frame", "arguments": ""},
            },
            {
                "id": "c3",
                "type": "function",
                "function": {"name": "read_frame", "arguments": {"shot": 5}},
            },
        ],
        finish="tool_calls",
        usage={
            "prompt_tokens": 2000,
            "completion_tokens": 100,
            "prompt_tokens_details": {"cached_tokens": 1500, "cache_write_tokens": 300},
        },
    )
    result, _ = await call(PromptGenRequest(prompt="Go"), answer)
    assert result.text == "" and result.finish_reason == "tool_calls"
    assert [c.input for c in result.tool_calls] == [{"shot": 3}, {}, {"shot": 5}]
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (2000, 100)
    assert (result.usage.cached_tokens, result.usage.cache_write_tokens) == (1500, 300)
    # claude-opus-5.5: $4/M in, $20/M out, read $0.20/M (0.05x), write $5/M; 200 uncached input
    assert result.cost_usd == pytest.approx(
        (200 * 4 + 100 * 20 + 1500 * 0.2 + 300 * 5) / 1e6
    )
    assert result.meta is not None and result.meta["cost_source"] == "tokens"
    assert (
        result.meta["upstream_provider"] == "Anthropic"
        and result.meta["reasoning"] == "medium"
    )


async def test_a_reported_cost_wins_and_top_level_cache_fields_are_read() -> None:
    usage = {
        "prompt_tokens": 2000,
        "completion_tokens": 100,
        "cost": 0.0123,
        "cache_read_input_tokens": 1200,
        "cache_creation_input_tokens": 50,
    }
    result, _ = await call(PromptGenRequest(prompt="Go"), completion(usage=usage))
    assert (
        result.cost_usd == 0.0123
        and result.meta is not None
        and result.meta["cost_source"] == "usage"
    )
    assert (result.usage.cached_read_tokens, result.usage.cached_write_tokens) == (
        1200,
        50,
    )


async def test_without_usage_the_cost_comes_from_characters() -> None:
    result, _ = await call(PromptGenRequest(prompt="x" * 400), completion("y" * 40))
    assert result.meta is not None and result.meta["cost_source"] == "chars"
    assert result.cost_usd == pytest.approx((100 * 4 + 10 * 20) / 1e6)
    assert result.usage.cached_read_tokens is None


@pytest.mark.parametrize(
    ("raw", "finish"),
    [
        ("stop", "stop"),
        ("length", "length"),
        ("content_filter", "refusal"),
        (None, "other"),
    ],
)
async def test_finish_reasons(raw: str | None, finish: str) -> None:
    result, _ = await call(PromptGenRequest(prompt="Go"), completion(finish=raw))
    assert result.finish_reason == finish


async def test_arguments_that_are_not_json_raise_tool_arguments_error() -> None:
    bad = [
        {
            "id": "c1",
            "type": "function",
            "function": {"name": "trim", "arguments": "{shot: 3"},
        }
    ]
    with pytest.raises(ToolArgumentsError) as caught:
        await call(
            PromptGenRequest(prompt="Go"),
            completion(None, tool_calls=bad, finish="tool_calls"),
        )
    assert caught.value.raw == "{shot: 3" and caught.value.tool_name == "trim"


async def test_incomplete_answers_and_body_errors_are_clear_errors() -> None:
    with pytest.raises(PromptGenError, match="incomplete LLM result"):
        await call(PromptGenRequest(prompt="Go"), completion(None))
    with pytest.raises(PromptGenError, match="incomplete tool call"):
        await call(
            PromptGenRequest(prompt="Go"),
            completion(None, tool_calls=[{"function": {}}]),
        )
    with pytest.raises(
        PromptGenError, match="fal LLM returned an error: upstream broke"
    ):
        await call(
            PromptGenRequest(prompt="Go"), {"error": {"message": "upstream   broke"}}
        )
    with pytest.raises(PromptGenError, match="flagged"):
        await call(
            PromptGenRequest(prompt="Go"),
            {"error": {"message": "content_policy violation"}},
        )


async def test_a_content_policy_refusal_in_an_error_status_is_flagged_not_retried() -> (
    None
):
    recorder = Recorder(
        httpx.Response(500, json={"error": {"message": "Flagged by moderation"}})
    )
    with pytest.raises(PromptGenError, match="flagged the LLM request") as caught:
        await handler(recorder).execute(
            PromptGenRequest(prompt="Go"), AbortController().signal
        )
    assert len(recorder.requests) == 1 and not caught.value.retryable


async def test_no_key_is_unavailable_auth_and_names_fal_key() -> None:
    recorder = Recorder(completion())
    with pytest.raises(PromptGenUnavailableError, match="FAL_KEY") as caught:
        await handler(recorder, key=None).execute(
            PromptGenRequest(prompt="Go"), AbortController().signal
        )
    assert caught.value.reason == "auth" and recorder.requests == []


def test_estimate_prices_input_and_max_tokens_without_network() -> None:
    recorder = Recorder(completion())
    fal = handler(recorder, key=None)
    cost = fal.estimate(PromptGenRequest(prompt="x" * 400, params={"max_tokens": 1000}))
    assert cost == pytest.approx((100 * 4 + 1000 * 20) / 1e6)
    assert "fal.test" in repr(fal) and FAKE_KEY not in repr(handler(recorder))


async def test_tool_result_images_go_in_one_user_turn_and_the_body_is_byte_stable(
    tmp_path: Path,
) -> None:
    frames = []
    for n in (1, 2, 3):
        (tmp_path / f"{n}.png").write_bytes(b"\x89PNG\r\n\x1a\n" + f"png-{n}".encode())
        frames.append(
            ImagePart(
                path=str(tmp_path / f"{n}.png"), mime_type="image/png", hash=str(n)
            )
        )
    calls = [ToolCall(id=f"c{n}", name="read_frame", input={"shot": n}) for n in (1, 2)]
    step1 = [
        UserMessage(content="Look."),
        AssistantMessage(tool_calls=calls),
        ToolMessage(
            tool_call_id="c1",
            content=[frames[0], TextPart(text="shot 1", cache=True), frames[1]],
        ),
        ToolMessage(tool_call_id="c2", content=[frames[2]]),
    ]
    step2 = [*step1, AssistantMessage(content="Seen."), UserMessage(content="And now?")]
    _, first = await call(PromptGenRequest(messages=step1))
    _, again = await call(PromptGenRequest(messages=step1))
    _, second = await call(PromptGenRequest(messages=step2))

    def uri(n: int) -> dict[str, Any]:
        data = base64.b64encode(b"\x89PNG\r\n\x1a\n" + f"png-{n}".encode()).decode()
        return {
            "type": "image_url",
            "image_url": {"url": f"data:image/png;base64,{data}"},
        }

    tool1, tool2, images = first["messages"][2:]
    assert tool1 == {
        "role": "tool",
        "tool_call_id": "c1",
        "content": [
            {"type": "text", "text": "[image 1 of this result follows]"},
            {"type": "text", "text": "shot 1", "cache_control": EPHEMERAL},
            {"type": "text", "text": "[image 2 of this result follows]"},
        ],
    }
    assert tool2["content"] == [
        {"type": "text", "text": "[image 1 of this result follows]"}
    ]
    assert images == {
        "role": "user",
        "content": [
            {"type": "text", "text": "[images of the result of c1]"},
            uri(1),
            uri(2),
            {"type": "text", "text": "[images of the result of c2]"},
            uri(3),
        ],
    }
    dump = json.dumps(first["messages"])
    assert json.dumps(again["messages"]) == dump  # the same history, the same bytes
    # the prefix still matches
    assert json.dumps(second["messages"][: len(first["messages"])]) == dump
    assert [m["role"] for m in second["messages"][5:]] == ["assistant", "user"]


def test_the_url_cache_is_per_handler_and_bounded() -> None:
    from toolloop.providers.fal.storage import UrlCache

    one, two = FalHandler("k"), FalHandler("k")
    one.urls.put("storage:image/png:aa", "https://x/aa")
    assert two.urls.get("storage:image/png:aa") is None  # no module-level state
    cache = UrlCache(size=2)
    cache.put("a", "A")
    cache.put("b", "B")
    assert cache.get("a") == "A"  # a is now the most recent
    cache.put("c", "C")
    assert (cache.get("a"), cache.get("b"), cache.get("c"), len(cache)) == (
        "A",
        None,
        "C",
        2,
    )


@pytest.mark.parametrize(
    ("max_tokens", "streams"),
    [(8192, False), (21333, False), (21334, True), (None, True)],
)
async def test_a_call_streams_when_the_sdk_would_require_it(
    max_tokens: int | None, streams: bool
) -> None:
    """The anthropic SDK refuses a non-streamed call whose expected time (3,600 s x max_tokens /
    128,000) is over 10 minutes; fal follows the same rule (its default max_tokens is 32,000)."""
    params = None if max_tokens is None else {"max_tokens": max_tokens}
    _, body = await call(PromptGenRequest(prompt="Go", params=params))
    assert ("stream" in body) is streams
