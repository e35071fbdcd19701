"""Reasoning blocks and the model's own stops on the provider wires (SPEC 4.1, 4.2), on
httpx.MockTransport: parsed from answers built with the SDK's response models, sent back verbatim
and first, and the Anthropic bodies validate against the SDK's request types."""

from __future__ import annotations

import json
from typing import Any

import anthropic.types as sdk
import pytest
from providers_kit import FAKE_KEY, FAST, Recorder, sdk_message, validate_anthropic_body

from toolloop import (
    AbortController,
    AssistantMessage,
    PromptGenError,
    PromptGenRequest,
    ReasoningBlock,
    ToolCall,
    ToolDefinition,
    ToolMessage,
    UserMessage,
)
from toolloop.providers import AnthropicHandler, FalHandler

TOOL = ToolDefinition(
    name="read_frame", description="Read one frame.", input_schema={"type": "object"}
)
SIGNATURE = "EqQBCkgIARABGAIiQL5H+8t/ZA==" * 3
THINKING = {
    "type": "thinking",
    "thinking": "Shot 3 first.\n\n  Then 4 — “quoted”.",
    "signature": SIGNATURE,
}
REDACTED = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT"}
DETAILS = [
    {
        "type": "reasoning.text",
        "text": "Look at shot 3.",
        "signature": "sig-1",
        "format": "anthropic-claude-v1",
        "index": 0,
    },
    {
        "type": "reasoning.encrypted",
        "data": "ZW5jcnlwdGVk",
        "format": "anthropic-claude-v1",
        "index": 1,
    },
]


def anthropic(recorder: Recorder) -> AnthropicHandler:
    return AnthropicHandler(
        FAKE_KEY, base_url="http://sim.test", retry=FAST, transport=recorder.transport
    )


def fal(recorder: Recorder) -> FalHandler:
    return FalHandler(
        FAKE_KEY, run_url="http://fal.test", retry=FAST, transport=recorder.transport
    )


async def execute(handler: Any, request: PromptGenRequest) -> Any:
    return await handler.execute(request, AbortController().signal)


def history(reasoning: list[ReasoningBlock]) -> list[Any]:
    return [
        UserMessage(content="Review shot 3."),
        AssistantMessage(
            content="Reading it.",
            tool_calls=[ToolCall(id="toolu_1", name="read_frame", input={"shot": 3})],
            reasoning=reasoning,
        ),
        ToolMessage(tool_call_id="toolu_1", content="frame 3"),
    ]


def blocks(provider: str, kind: str, *data: dict[str, Any]) -> list[ReasoningBlock]:
    return [ReasoningBlock(provider=provider, type=kind, data=item) for item in data]


# -- anthropic ------------------------------------------------------------------------------------


async def test_anthropic_thinking_and_redacted_blocks_are_kept_verbatim_in_order() -> (
    None
):
    answer = sdk_message(
        [
            sdk.ThinkingBlock(**THINKING),
            sdk.RedactedThinkingBlock(**REDACTED),
            sdk.TextBlock(type="text", text="Reading shot 3.", citations=None),
            sdk.ToolUseBlock(
                type="tool_use", id="toolu_1", name="read_frame", input={"shot": 3}
            ),
        ],
        stop_reason="tool_use",
    )
    result = await execute(anthropic(Recorder(answer)), PromptGenRequest(prompt="Go"))
    assert result.reasoning == [
        ReasoningBlock(provider="anthropic", type="thinking", data=THINKING),
        ReasoningBlock(provider="anthropic", type="redacted_thinking", data=REDACTED),
    ]
    assert result.text == "Reading shot 3." and [c.id for c in result.tool_calls] == [
        "toolu_1"
    ]


async def test_an_answer_without_thinking_has_reasoning_none() -> None:
    answer = sdk_message([sdk.TextBlock(type="text", text="ok", citations=None)])
    assert (
        await execute(anthropic(Recorder(answer)), PromptGenRequest(prompt="Go"))
    ).reasoning is None


async def test_anthropic_sends_its_own_blocks_back_first_and_unchanged_and_leaves_out_others() -> (
    None
):
    reasoning = [
        *blocks("anthropic", "thinking", THINKING),
        *blocks("fal", "reasoning_details", DETAILS[0]),
    ]
    reasoning += blocks("anthropic", "redacted_thinking", REDACTED)
    recorder = Recorder(
        sdk_message([sdk.TextBlock(type="text", text="ok", citations=None)])
    )
    await execute(
        anthropic(recorder), PromptGenRequest(messages=history(reasoning), tools=[TOOL])
    )
    (body,) = recorder.bodies
    validate_anthropic_body(body)
    turn = body["messages"][1]
    assert turn["role"] == "assistant"
    assert [block["type"] for block in turn["content"]] == [
        "thinking",
        "redacted_thinking",
        "text",
        "tool_use",
    ]
    assert turn["content"][:2] == [THINKING, REDACTED]
    sent = recorder.requests[0].content.decode()
    text = json.dumps(THINKING["thinking"], ensure_ascii=False)
    # the same characters on the wire
    assert json.dumps(THINKING["signature"]) in sent and text in sent


async def test_anthropic_refusal_maps_with_its_stop_details() -> None:
    answer = sdk_message([], stop_reason="refusal")
    details = sdk.RefusalStopDetails(
        type="refusal", category="cyber", explanation="Exploit development."
    )
    answer["stop_details"] = details.model_dump(mode="json")
    result = await execute(anthropic(Recorder(answer)), PromptGenRequest(prompt="Go"))
    assert result.finish_reason == "refusal"
    assert (
        result.meta["category"] == "cyber"
        and result.meta["explanation"] == "Exploit development."
    )


async def test_anthropic_refusal_without_details_has_none_for_both() -> None:
    result = await execute(
        anthropic(Recorder(sdk_message([], stop_reason="refusal"))),
        PromptGenRequest(prompt="Go"),
    )
    assert result.finish_reason == "refusal"
    assert (result.meta["category"], result.meta["explanation"]) == (None, None)


async def test_anthropic_pause_turn_is_paused() -> None:
    answer = sdk_message(
        [sdk.TextBlock(type="text", text="Searching…", citations=None)],
        stop_reason="pause_turn",
    )
    result = await execute(anthropic(Recorder(answer)), PromptGenRequest(prompt="Go"))
    assert (result.finish_reason, result.text) == ("paused", "Searching…")


async def test_a_context_window_overflow_is_a_clear_error() -> None:
    answer = sdk_message(
        [sdk.TextBlock(type="text", text="Half", citations=None)],
        stop_reason="model_context_window_exceeded",
    )
    with pytest.raises(
        PromptGenError,
        match=r"no longer fits the context window of 'claude-sonnet-4-6'",
    ) as caught:
        await execute(
            anthropic(Recorder(answer)),
            PromptGenRequest(prompt="Go", model="claude-sonnet-4-6"),
        )
    assert "\n  Shorten the history" in str(caught.value)


async def test_anthropic_max_tokens_ending_in_tool_use_names_that_call_cut_off() -> (
    None
):
    answer = sdk_message(
        [
            sdk.ToolUseBlock(
                type="tool_use", id="toolu_whole", name="read_frame", input={"shot": 1}
            ),
            sdk.ToolUseBlock(
                type="tool_use", id="toolu_cut", name="read_frame", input={}
            ),
        ],
        stop_reason="max_tokens",
    )
    result = await execute(
        anthropic(Recorder(answer)),
        PromptGenRequest(prompt="Go", params={"max_tokens": 600}),
    )
    assert result.finish_reason == "length"
    assert result.meta["cut_off"] == ["toolu_cut"] and result.meta["max_tokens"] == 600


async def test_anthropic_max_tokens_in_text_after_the_calls_cuts_no_call() -> None:
    answer = sdk_message(
        [
            sdk.ToolUseBlock(
                type="tool_use", id="toolu_1", name="read_frame", input={"shot": 1}
            ),
            sdk.TextBlock(type="text", text="And then I", citations=None),
        ],
        stop_reason="max_tokens",
    )
    result = await execute(anthropic(Recorder(answer)), PromptGenRequest(prompt="Go"))
    assert result.meta["cut_off"] == [] and result.meta["max_tokens"] == 8192


async def test_a_cut_off_tool_use_with_half_written_input_is_no_arguments_error() -> (
    None
):
    answer = sdk_message([], stop_reason="max_tokens")
    answer["content"] = [
        {
            "type": "tool_use",
            "id": "toolu_cut",
            "name": "read_frame",
            "input": '{"shot": 3',
        }
    ]
    result = await execute(anthropic(Recorder(answer)), PromptGenRequest(prompt="Go"))
    assert result.tool_calls == [ToolCall(id="toolu_cut", name="read_frame", input={})]
    assert result.meta["cut_off"] == ["toolu_cut"]


# -- fal ------------------------------------------------------------------------------------------


def completion(
    message: dict[str, Any], finish: str = "stop", native: str | None = None
) -> dict[str, Any]:
    choice = {
        "index": 0,
        "message": {"role": "assistant", **message},
        "finish_reason": finish,
    }
    if native is not None:
        choice["native_finish_reason"] = native
    usage = {"prompt_tokens": 10, "completion_tokens": 5}
    return {
        "id": "gen-1",
        "model": "anthropic/claude-opus-5.5",
        "choices": [choice],
        "usage": usage,
    }


async def test_fal_reasoning_details_become_one_block_per_entry_verbatim() -> None:
    answer = completion(
        {"content": "ok", "reasoning": "Look at shot 3.", "reasoning_details": DETAILS}
    )
    result = await execute(fal(Recorder(answer)), PromptGenRequest(prompt="Go"))
    assert result.reasoning == blocks("fal", "reasoning_details", *DETAILS)


async def test_fal_reasoning_text_alone_is_one_reasoning_block() -> None:
    result = await execute(
        fal(Recorder(completion({"content": "ok", "reasoning": "Hmm."}))),
        PromptGenRequest(prompt="Go"),
    )
    assert result.reasoning == blocks("fal", "reasoning", {"reasoning": "Hmm."})


async def test_fal_sends_reasoning_details_back_on_the_assistant_message_and_leaves_out_others() -> (
    None
):
    reasoning = [
        *blocks("anthropic", "thinking", THINKING),
        *blocks("fal", "reasoning_details", *DETAILS),
    ]
    recorder = Recorder(completion({"content": "ok"}))
    await execute(
        fal(recorder), PromptGenRequest(messages=history(reasoning), tools=[TOOL])
    )
    (body,) = recorder.bodies
    assistant = body["messages"][1]
    assert (
        assistant["role"] == "assistant" and assistant["reasoning_details"] == DETAILS
    )
    assert (
        "reasoning" not in assistant
        and SIGNATURE not in recorder.requests[0].content.decode()
    )


async def test_fal_sends_a_reasoning_text_back_as_reasoning() -> None:
    recorder = Recorder(completion({"content": "ok"}))
    reasoning = blocks("fal", "reasoning", {"reasoning": "Hmm."})
    await execute(
        fal(recorder), PromptGenRequest(messages=history(reasoning), tools=[TOOL])
    )
    assistant = recorder.bodies[0]["messages"][1]
    assert assistant["reasoning"] == "Hmm." and "reasoning_details" not in assistant


async def test_fal_content_filter_is_a_refusal() -> None:
    answer = completion({"content": ""}, finish="content_filter", native="refusal")
    result = await execute(fal(Recorder(answer)), PromptGenRequest(prompt="Go"))
    assert result.finish_reason == "refusal" and result.meta["category"] is None
    assert (
        "content_filter" in result.meta["explanation"]
        and "refusal" in result.meta["explanation"]
    )


async def test_fal_length_with_tool_calls_takes_the_last_call_as_cut_off() -> None:
    calls = [
        {
            "id": "c1",
            "type": "function",
            "function": {"name": "read_frame", "arguments": '{"shot":1}'},
        },
        {
            "id": "c2",
            "type": "function",
            "function": {"name": "read_frame", "arguments": '{"sh'},
        },
    ]
    answer = completion({"content": None, "tool_calls": calls}, finish="length")
    result = await execute(fal(Recorder(answer)), PromptGenRequest(prompt="Go"))
    assert result.finish_reason == "length" and result.meta["cut_off"] == ["c2"]
    assert result.tool_calls[1] == ToolCall(id="c2", name="read_frame", input={})
    assert result.meta["max_tokens"] == 32000
