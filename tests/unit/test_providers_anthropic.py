"""The Anthropic provider's mapping, on httpx.MockTransport: our requests validate against the
official SDK's request types, and answers built with the SDK's response models map back."""

from __future__ import annotations

import base64
import logging
from pathlib import Path
from typing import Any

import anthropic.types as sdk
import httpx
import pytest
from providers_kit import FAKE_KEY, FAST, Recorder, sdk_message, validate_anthropic_body

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
from toolloop.providers import AnthropicHandler

EPHEMERAL = {"type": "ephemeral"}
TOOL = ToolDefinition(
    name="read_frame",
    description="Read one frame.",
    input_schema={
        "type": "object",
        "properties": {"shot": {"type": "number"}},
        "required": ["shot"],
    },
)


MODEL = "claude-sonnet-4-6"  # $3 / $15 per MTok, read $0.30, 5-minute write $3.75; accepts every shape


def handler(recorder: Recorder, key: str | None = FAKE_KEY) -> AnthropicHandler:
    return AnthropicHandler(
        key,
        base_url="http://sim.test",
        retry=FAST,
        transport=recorder.transport,
        default_model=MODEL,
    )


def text_answer(text: str = "ok", **kw: Any) -> dict[str, Any]:
    return sdk_message([sdk.TextBlock(type="text", text=text, citations=None)], **kw)


async def send(
    request: PromptGenRequest, answer: dict[str, Any] | None = None
) -> dict[str, Any]:
    recorder = Recorder(answer or text_answer())
    await handler(recorder).execute(request, AbortController().signal)
    (body,) = recorder.bodies
    validate_anthropic_body(body)
    return body


@pytest.fixture
def png(tmp_path: Path) -> Path:
    path = tmp_path / "frame-3.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n-frame-3-bytes")
    return path


async def test_a_tool_conversation_maps_to_a_valid_messages_body(png: Path) -> None:
    image = ImagePart(path=str(png), mime_type="image/png", hash="h3")
    request = PromptGenRequest(
        system="You review storyboards.",
        model=MODEL,
        cache_system=True,
        tools=[TOOL],
        tool_choice={"name": "read_frame"},
        messages=[
            UserMessage(content=[TextPart(text="Review shot 3.", cache=True), image]),
            AssistantMessage(
                content="Reading two frames.",
                tool_calls=[
                    ToolCall(id="c1", name="read_frame", input={"shot": 3}),
                    ToolCall(id="c2", name="read_frame", input=None),
                ],
            ),
            ToolMessage(
                tool_call_id="c1", content=[TextPart(text="frame 3", cache=True), image]
            ),
            ToolMessage(tool_call_id="c2", content="frame 4"),
            UserMessage(content="Also check the pacing."),
        ],
    )
    recorder = Recorder(text_answer())
    await handler(recorder).execute(request, AbortController().signal)
    (sent,) = recorder.requests
    assert sent.url == "http://sim.test/v1/messages"
    assert sent.headers["x-api-key"] == FAKE_KEY
    # docs/providers.md, "API version"
    assert sent.headers["anthropic-version"] == "2026-10-21"
    body = recorder.bodies[0]
    validate_anthropic_body(body)
    data = base64.b64encode(png.read_bytes()).decode()
    assert body["system"] == [
        {"type": "text", "text": "You review storyboards.", "cache_control": EPHEMERAL}
    ]
    assert body["tools"] == [TOOL.model_dump()]
    assert body["tool_choice"] == {"type": "tool", "name": "read_frame"}
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Review shot 3.", "cache_control": EPHEMERAL},
                {
                    "type": "image",
                    "source": {
                        "type": "base64",
                        "media_type": "image/png",
                        "data": data,
                    },
                },
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Reading two frames."},
                {
                    "type": "tool_use",
                    "id": "c1",
                    "name": "read_frame",
                    "input": {"shot": 3},
                },
                {"type": "tool_use", "id": "c2", "name": "read_frame", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "c1",
                    "content": [
                        {"type": "text", "text": "frame 3", "cache_control": EPHEMERAL},
                        {
                            "type": "image",
                            "source": {
                                "type": "base64",
                                "media_type": "image/png",
                                "data": data,
                            },
                        },
                    ],
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "c2",
                    "content": [{"type": "text", "text": "frame 4"}],
                },
                {"type": "text", "text": "Also check the pacing."},
            ],
        },
    ]
    assert "thinking" not in body and "temperature" not in body


@pytest.mark.parametrize(
    ("choice", "wire"),
    [
        ("auto", {"type": "auto"}),
        ("none", {"type": "none"}),
        ("required", {"type": "any"}),
        ({"name": "read_frame"}, {"type": "tool", "name": "read_frame"}),
    ],
)
async def test_tool_choice_maps_to_the_sdk_shapes(
    choice: Any, wire: dict[str, Any]
) -> None:
    body = await send(
        PromptGenRequest(
            messages=[UserMessage(content="Hi")], tools=[TOOL], tool_choice=choice
        )
    )
    assert body["tool_choice"] == wire


async def test_a_one_turn_prompt_is_one_user_message_and_a_plain_system() -> None:
    body = await send(
        PromptGenRequest(prompt="Say hi.", system="Be brief.", temperature=0.7)
    )
    assert body["system"] == "Be brief."
    assert body["messages"] == [{"role": "user", "content": "Say hi."}]
    assert "temperature" not in body  # the SDK's MessageCreateParams has no such field
    assert body["model"] == MODEL and body["max_tokens"] == 8192


async def test_cache_system_without_system_text_marks_the_last_tool() -> None:
    other = TOOL.model_copy(update={"name": "trim"})
    body = await send(
        PromptGenRequest(
            messages=[UserMessage(content="Hi")], tools=[TOOL, other], cache_system=True
        )
    )
    assert "system" not in body
    assert "cache_control" not in body["tools"][0]
    assert body["tools"][1]["cache_control"] == EPHEMERAL


@pytest.mark.parametrize(
    ("level", "room"), [("low", 2048), ("medium", 8192), ("high", 24576)]
)
async def test_reasoning_levels_map_to_effort_and_adaptive_thinking(
    level: str, room: int
) -> None:
    body = await send(
        PromptGenRequest(
            messages=[UserMessage(content="Hi")], params={"reasoning": level}
        )
    )
    assert body["output_config"] == {"effort": level}
    assert body["thinking"] == {"type": "adaptive"}
    assert body["max_tokens"] == 8192 + room


async def test_reasoning_off_disables_thinking_and_none_sends_nothing() -> None:
    off = await send(
        PromptGenRequest(
            messages=[UserMessage(content="Hi")], params={"reasoning": "off"}
        )
    )
    assert off["thinking"] == {"type": "disabled"} and "output_config" not in off
    unset = await send(PromptGenRequest(messages=[UserMessage(content="Hi")]))
    assert "thinking" not in unset and "output_config" not in unset


@pytest.mark.parametrize(
    "request_",
    [
        PromptGenRequest(
            messages=[UserMessage(content="Hi")],
            tools=[TOOL],
            tool_choice="required",
            params={"reasoning": "high"},
        ),
        PromptGenRequest(
            messages=[
                UserMessage(content="Hi"),
                AssistantMessage(
                    tool_calls=[ToolCall(id="c1", name="read_frame", input={"shot": 1})]
                ),
                ToolMessage(tool_call_id="c1", content="frame"),
            ],
            tools=[TOOL],
            params={"reasoning": "high"},
        ),
    ],
    ids=["forced-tool", "inside-a-tool-turn"],
)
async def test_thinking_stays_the_same_in_a_tool_turn_and_a_forced_choice_becomes_auto(
    request_: PromptGenRequest,
) -> None:
    # Was: thinking disabled inside a tool turn and with a forced choice. That flipped thinking
    # between the steps of one run (a 400 on always-thinking models, a lost messages cache).
    body = await send(request_)
    assert body["thinking"] == {"type": "adaptive"} and body["output_config"] == {
        "effort": "high"
    }
    assert body["max_tokens"] == 8192 + 24576
    assert body.get("tool_choice", {"type": "auto"}) == {"type": "auto"}


async def test_a_bad_reasoning_level_fails_before_any_call() -> None:
    recorder = Recorder(text_answer())
    request = PromptGenRequest(prompt="Hi", params={"reasoning": "max"})
    with pytest.raises(PromptGenError, match=r"params\.reasoning must be"):
        await handler(recorder).execute(request, AbortController().signal)
    assert recorder.requests == []


async def test_an_sdk_message_maps_text_tool_calls_usage_and_cost_with_cache_rates() -> (
    None
):
    answer = sdk_message(
        [
            sdk.ThinkingBlock(type="thinking", thinking="hmm", signature="sig"),
            sdk.TextBlock(type="text", text="Reading shot 3.", citations=None),
            sdk.ToolUseBlock(
                type="tool_use", id="toolu_1", name="read_frame", input={"shot": 3}
            ),
        ],
        stop_reason="tool_use",
        input_tokens=100,
        output_tokens=20,
        cache_read=1000,
        cache_write=200,
    )
    recorder = Recorder(answer)
    result = await handler(recorder).execute(
        PromptGenRequest(prompt="Go"), AbortController().signal
    )
    assert result.text == "Reading shot 3."
    assert result.tool_calls == [
        ToolCall(id="toolu_1", name="read_frame", input={"shot": 3})
    ]
    assert result.finish_reason == "tool_calls"
    usage = result.usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (1300, 20)
    assert (usage.cached_tokens, usage.cache_write_tokens) == (1000, 200)
    assert (usage.cached_read_tokens, usage.cached_write_tokens) == (1000, 200)
    # $3/M input, $15/M output, read 0.1x = $0.30/M, 5-minute write 1.25x = $3.75/M
    assert result.cost_usd == pytest.approx(
        (100 * 3 + 20 * 15 + 1000 * 0.3 + 200 * 3.75) / 1e6
    )
    assert result.meta is not None and result.meta["cost_source"] == "tokens"
    assert result.meta["model"] == MODEL


@pytest.mark.parametrize(
    ("stop", "finish"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("tool_use", "tool_calls"),
        ("max_tokens", "length"),
        ("refusal", "refusal"),
        ("pause_turn", "paused"),
    ],
)
async def test_stop_reasons_map_to_finish_reasons(stop: str, finish: str) -> None:
    recorder = Recorder(text_answer(stop_reason=stop))
    result = await handler(recorder).execute(
        PromptGenRequest(prompt="Go"), AbortController().signal
    )
    assert result.finish_reason == finish


async def test_usage_without_cache_fields_reports_none_for_the_optional_counts() -> (
    None
):
    recorder = Recorder(text_answer(input_tokens=50, output_tokens=5))
    result = await handler(recorder).execute(
        PromptGenRequest(prompt="Go"), AbortController().signal
    )
    assert result.usage.prompt_tokens == 50 and result.usage.cached_tokens == 0
    assert (
        result.usage.cached_read_tokens is None
        and result.usage.cached_write_tokens is None
    )
    assert result.cost_usd == pytest.approx((50 * 3 + 5 * 15) / 1e6)


async def test_tool_arguments_that_are_not_json_raise_tool_arguments_error() -> None:
    answer = text_answer(stop_reason="tool_use")
    answer["content"] = [
        {"type": "tool_use", "id": "t1", "name": "read_frame", "input": '{"shot": 3'}
    ]
    with pytest.raises(ToolArgumentsError) as caught:
        await handler(Recorder(answer)).execute(
            PromptGenRequest(prompt="Go"), AbortController().signal
        )
    assert caught.value.tool_name == "read_frame" and caught.value.raw == '{"shot": 3'
    assert str(caught.value).startswith(
        'Tool call "read_frame" has arguments that are not JSON.'
    )


async def test_no_key_is_unavailable_auth_without_a_call() -> None:
    recorder = Recorder(text_answer())
    with pytest.raises(PromptGenUnavailableError) as caught:
        await handler(recorder, key=None).execute(
            PromptGenRequest(prompt="Go"), AbortController().signal
        )
    assert caught.value.reason == "auth" and "ANTHROPIC_API_KEY" in str(caught.value)
    assert recorder.requests == []


async def test_an_unknown_model_fails_before_the_call_and_dated_ids_find_their_row() -> (
    None
):
    recorder = Recorder(text_answer())
    with pytest.raises(
        PromptGenError, match="'claude-unknown' is not in the model catalogue"
    ) as caught:
        await handler(recorder).execute(
            PromptGenRequest(prompt="Go", model="claude-unknown"),
            AbortController().signal,
        )
    # says how to add it
    assert "with_models(ModelInfo(id='claude-unknown'" in str(caught.value)
    assert recorder.requests == []
    result = await handler(recorder).execute(
        PromptGenRequest(prompt="Go", model="claude-haiku-4-5-20251001"),
        AbortController().signal,
    )
    assert result.cost_usd == pytest.approx((100 * 1 + 20 * 5) / 1e6)


async def test_images_are_read_when_the_request_is_sent(png: Path) -> None:
    request = PromptGenRequest(
        messages=[
            UserMessage(
                content=[ImagePart(path=str(png), mime_type="image/png", hash="h")]
            )
        ]
    )
    first = await send(request)
    png.write_bytes(b"\x89PNG\r\n\x1a\nother bytes")
    second = await send(request)
    data = [b["messages"][0]["content"][0]["source"]["data"] for b in (first, second)]
    assert (
        base64.b64decode(data[1]) == b"\x89PNG\r\n\x1a\nother bytes"
        and data[0] != data[1]
    )
    # a file a spec names that is not an image
    png.write_text("ANTHROPIC_API_KEY=sk-secret\n")
    with pytest.raises(PromptGenError, match="not a PNG, JPEG, GIF or WebP image"):
        await send(request)
    png.unlink()
    with pytest.raises(PromptGenError, match="cannot read the image"):
        await send(request)


def test_estimate_needs_no_key_and_no_network() -> None:
    recorder = Recorder(httpx.Response(500))
    anthropic = handler(recorder, key=None)
    cost = anthropic.estimate(
        PromptGenRequest(prompt="x" * 400, params={"max_tokens": 1000})
    )
    assert cost == pytest.approx((100 * 3 + 1000 * 15) / 1e6)
    assert recorder.requests == []


async def test_each_answer_logs_one_debug_line_and_a_cut_answer_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    recorder = Recorder(text_answer(stop_reason="max_tokens"))
    with caplog.at_level(logging.DEBUG, "toolloop.providers"):
        await handler(recorder).execute(
            PromptGenRequest(prompt="Go"), AbortController().signal
        )
    lines = [
        (r.levelname, r.getMessage())
        for r in caplog.records
        if r.name == "toolloop.providers"
    ]
    assert lines == [
        (
            "DEBUG",
            "anthropic: claude-sonnet-4-6 answered length "
            "(100 prompt tokens, 0 cached, 0 written; 20 out) $0.000600 from tokens",
        ),
        (
            "WARNING",
            "anthropic: the answer of claude-sonnet-4-6 was cut at max_tokens (partial)",
        ),
    ]


async def test_a_failed_tool_result_carries_is_error_and_a_good_one_does_not() -> None:
    request = PromptGenRequest(
        model=MODEL,
        tools=[TOOL],
        messages=[
            UserMessage(content="Read two frames."),
            AssistantMessage(
                tool_calls=[
                    ToolCall(id="c1", name="read_frame", input={"shot": "x"}),
                    ToolCall(id="c2", name="read_frame", input={"shot": 4}),
                ]
            ),
            ToolMessage(
                tool_call_id="c1",
                content="Invalid input for read_frame: ✖ bad",
                is_error=True,
            ),
            ToolMessage(tool_call_id="c2", content="frame 4"),
        ],
    )
    body = await send(request)
    failed, good = body["messages"][2]["content"]
    assert failed == {
        "type": "tool_result",
        "tool_use_id": "c1",
        "content": [{"type": "text", "text": "Invalid input for read_frame: ✖ bad"}],
        "is_error": True,
    }
    assert "is_error" not in good


async def test_a_server_compaction_answer_costs_every_usage_iteration_and_keeps_its_block() -> (
    None
):
    """An answer built with the SDK's beta models (`BetaMessage`, `BetaCompactionBlock`,
    `usage.iterations`): the summary pass is billed in its own iteration, outside the top level, so
    the cost sums the iterations; the compaction block is kept verbatim with the answer (SPEC 5.3,
    docs/context.md). Sending it back needs the beta header, which this provider does not send yet."""
    from anthropic.types import beta

    block = beta.BetaCompactionBlock(
        type="compaction", content="Turns 1-40: read logs.", encrypted_content="EpwB"
    )
    message = beta.BetaMessage.model_validate(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": MODEL,
            "content": [
                block.model_dump(),
                {"type": "text", "text": "Going on.", "citations": None},
            ],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "context_management": None,
            "container": None,
            "usage": {
                "input_tokens": 23_000,
                "output_tokens": 500,
                "cache_read_input_tokens": 0,
                "cache_creation_input_tokens": 0,
                "iterations": [
                    {
                        "type": "compaction",
                        "input_tokens": 180_000,
                        "output_tokens": 3_000,
                        "cache_read_input_tokens": 0,
                        "cache_creation_input_tokens": 0,
                    },
                    {
                        "type": "message",
                        "model": MODEL,
                        "input_tokens": 23_000,
                        "output_tokens": 500,
                        "cache_read_input_tokens": 0,
                        "cache_creation_input_tokens": 0,
                    },
                ],
            },
        }
    )
    recorder = Recorder(message.model_dump(mode="json", exclude_none=True))
    result = await handler(recorder).execute(
        PromptGenRequest(prompt="Go"), AbortController().signal
    )

    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (
        203_000,
        3_500,
    )
    # not 23K + 500 alone
    assert result.cost_usd == pytest.approx((203_000 * 3 + 3_500 * 15) / 1e6)
    assert result.reasoning is not None
    (kept,) = result.reasoning
    assert kept.type == "compaction" and kept.data == block.model_dump(
        exclude_none=True
    )
