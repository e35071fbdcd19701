"""The simulator's Anthropic Messages endpoint over real HTTP, read with the official SDK."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from toolloop.contract import AssistantMessage, ToolMessage, UserMessage
from toolloop.sim import AFTER_SCRIPT, SimRequest, SimServer, SimTurn

TOOLS = [
    {
        "name": "read_frame",
        "description": "Read one frame of the storyboard.",
        "input_schema": {
            "type": "object",
            "properties": {"shot": {"type": "number"}},
            "required": ["shot"],
        },
    }
]
SCRIPT = [
    {
        "text": "Let me look.",
        "tool_calls": [
            {"name": "read_frame", "input": {"shot": 3}},
            {"name": "read_frame", "input": {"shot": 5}},
        ],
    },
    {"tool_calls": [{"name": "read_frame", "input": {"shot": 7}}]},
    {"text": "Shot 3 is fine."},
]
# 2400 tokens by the simulator's estimate
LONG_SYSTEM = "You review storyboards. " * 400


@pytest.fixture
def sim() -> Iterator[SimServer]:
    with SimServer(SCRIPT) as server:
        yield server


def client(sim: SimServer, key: str = "test-key") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=sim.base_url, api_key=key, max_retries=0)


def create(
    sim: SimServer, messages: list[dict[str, Any]], **extra: Any
) -> anthropic.types.Message:
    system = extra.pop(
        "system",
        [{"type": "text", "text": LONG_SYSTEM, "cache_control": {"type": "ephemeral"}}],
    )
    with client(sim) as sdk:
        return sdk.messages.create(
            model="claude-sonnet-5-5",
            max_tokens=1000,
            system=system,
            tools=TOOLS,
            messages=messages,
            **extra,
        )


def follow(
    history: list[dict[str, Any]], answer: anthropic.types.Message
) -> list[dict[str, Any]]:
    """The history plus the answer and a tool result for each of its calls."""
    results = [
        {
            "type": "tool_result",
            "tool_use_id": block.id,
            "content": f"frame {block.input}",
        }
        for block in answer.content
        if block.type == "tool_use"
    ]
    turn = {
        "role": "assistant",
        "content": [block.model_dump(exclude_none=True) for block in answer.content],
    }
    return [*history, turn, {"role": "user", "content": results}]


def test_a_script_plays_turn_by_turn_with_tool_calls(sim: SimServer) -> None:
    history: list[dict[str, Any]] = [{"role": "user", "content": "Review the board."}]
    first = create(sim, history)
    assert first.stop_reason == "tool_use"
    assert first.content[0].type == "text" and first.content[0].text == "Let me look."
    calls = [block for block in first.content if block.type == "tool_use"]
    assert [(call.name, call.input) for call in calls] == [
        ("read_frame", {"shot": 3}),
        ("read_frame", {"shot": 5}),
    ]
    history = follow(history, first)
    second = create(sim, history)
    history = follow(history, second)
    third = create(sim, history)
    assert third.stop_reason == "end_turn" and third.content[0].type == "text"
    assert third.content[0].text == "Shot 3 is fine."
    final = {"role": "assistant", "content": "Shot 3 is fine."}
    after = create(sim, [*history, final, {"role": "user", "content": "And shot 9?"}])
    assert (
        after.content[0].type == "text" and after.content[0].text == AFTER_SCRIPT.text
    )
    stats = sim.stats()
    assert stats["endpoints"] == {"anthropic": 4} and stats["statuses"] == {"200": 4}
    assert list(stats["conversations"].values()) == [4]


def test_the_same_request_gets_the_same_ids_and_ids_are_unique_across_turns(
    sim: SimServer,
) -> None:
    history: list[dict[str, Any]] = [{"role": "user", "content": "Review the board."}]
    first = create(sim, history)
    again = create(sim, history)
    assert first.model_dump() == again.model_dump() | {
        "usage": first.usage.model_dump()
    }
    second = create(sim, follow(history, first))
    ids = [
        block.id
        for message in (first, second)
        for block in message.content
        if block.type == "tool_use"
    ]
    assert len(ids) == len(set(ids)) == 3
    assert all(id.startswith("toolu_") and len(id) == 6 + 24 for id in ids)
    other = create(sim, [{"role": "user", "content": "Another board."}])
    assert {block.id for block in other.content if block.type == "tool_use"}.isdisjoint(
        ids
    )


def test_a_policy_sees_the_request_parsed_back_to_contract_types() -> None:
    seen: list[SimRequest] = []

    def policy(request: SimRequest) -> SimTurn:
        seen.append(request)
        return SimTurn(
            text=f"{request.assistant_turns} turns, tools {request.tool_names}"
        )

    with SimServer(policy) as sim:
        history: list[dict[str, Any]] = [
            {"role": "user", "content": "Look."},
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "toolu_a",
                        "name": "read_frame",
                        "input": {"shot": 1},
                    }
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_a", "content": "ok"},
                    {"type": "text", "text": "Now decide."},
                ],
            },
        ]
        answer = create(sim, history, system="Be brief.")
    assert (
        answer.content[0].type == "text"
        and answer.content[0].text == "1 turns, tools ['read_frame']"
    )
    request = seen[0]
    assert (request.wire, request.model, request.system) == (
        "anthropic",
        "claude-sonnet-5-5",
        "Be brief.",
    )
    assert [type(message) for message in request.messages] == [
        UserMessage,
        AssistantMessage,
        ToolMessage,
        UserMessage,
    ]
    assistant = request.messages[1]
    assert isinstance(assistant, AssistantMessage) and assistant.tool_calls
    assert assistant.tool_calls[0].input == {"shot": 1}


def test_usage_reports_a_cache_write_then_a_read(sim: SimServer) -> None:
    history: list[dict[str, Any]] = [{"role": "user", "content": "Review the board."}]
    first = create(sim, history)
    second = create(sim, history)
    assert (
        first.usage.cache_creation_input_tokens
        == second.usage.cache_read_input_tokens
        > 2400
    )
    assert (
        first.usage.cache_read_input_tokens
        == second.usage.cache_creation_input_tokens
        == 0
    )
    # "Review the board." = 17 chars
    assert first.usage.input_tokens == second.usage.input_tokens == 5


def test_more_than_four_cache_breakpoints_is_a_400_invalid_request_error(
    sim: SimServer,
) -> None:
    marked = [
        {"type": "text", "text": f"part {n}", "cache_control": {"type": "ephemeral"}}
        for n in range(5)
    ]
    with pytest.raises(anthropic.BadRequestError) as raised:
        create(sim, [{"role": "user", "content": marked}])
    assert raised.value.status_code == 400
    assert raised.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "Found 6" in raised.value.body["error"]["message"]  # type: ignore[index]


def test_a_required_key_refuses_others_with_401_authentication_error() -> None:
    with SimServer(SCRIPT, require_key="right") as sim:
        hello: Any = [{"role": "user", "content": "Hi"}]
        with (
            pytest.raises(anthropic.AuthenticationError) as raised,
            client(sim, "wrong") as wrong,
        ):
            wrong.messages.create(
                model="claude-sonnet-5-5", max_tokens=10, messages=hello
            )
        assert raised.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
        with client(sim, "right") as right:
            ok = right.messages.create(
                model="claude-sonnet-5-5", max_tokens=1000, messages=hello
            )
        assert ok.stop_reason == "tool_use"
        bare = httpx.post(
            f"{sim.base_url}/v1/messages",
            json={"model": "m"},
            headers={"anthropic-version": "x"},
        )
        assert bare.status_code == 401


def test_a_bad_body_is_a_400_in_the_anthropic_error_format(sim: SimServer) -> None:
    response = httpx.post(
        f"{sim.base_url}/v1/messages",
        headers={"x-api-key": "k", "anthropic-version": "2023-06-01"},
        json={
            "model": "claude-sonnet-5-5",
            "messages": [{"role": "user", "content": "Hi"}],
        },
    )
    assert response.status_code == 400
    assert response.json()["type"] == "error"
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("max_tokens: Field required")


def test_ids_ignore_cache_marks_and_the_string_or_block_form_of_a_text(
    sim: SimServer,
) -> None:
    plain = create(sim, [{"role": "user", "content": "Review the board."}])
    marked = create(
        sim,
        [
            {
                "role": "user",
                "content": [
                    {
                        "type": "text",
                        "text": "Review the board.",
                        "cache_control": {"type": "ephemeral"},
                    }
                ],
            }
        ],
    )
    assert [block.model_dump() for block in plain.content] == [
        block.model_dump() for block in marked.content
    ]
    assert plain.id == marked.id


@pytest.mark.parametrize("thinking", [None, {"type": "adaptive"}])
def test_a_streamed_answer_read_by_the_sdk_is_the_non_streamed_message(
    sim: SimServer, thinking: Any
) -> None:
    """The SDK's own stream accumulator (`messages.stream(...).get_final_message()`) rebuilds from
    the simulator's events exactly the message the non-streamed call returns (toolloop/sim/stream.py)."""
    extra: dict[str, Any] = {"thinking": thinking} if thinking else {}
    messages = [{"role": "user", "content": "Review shots 3 and 5."}]
    whole = create(sim, messages, **extra)
    sim.reset()
    with (
        client(sim) as sdk,
        sdk.messages.stream(
            model="claude-sonnet-5-5",
            max_tokens=1000,
            tools=TOOLS,
            messages=messages,
            system=[
                {
                    "type": "text",
                    "text": LONG_SYSTEM,
                    "cache_control": {"type": "ephemeral"},
                }
            ],
            **extra,
        ) as stream,
    ):
        texts = list(stream.text_stream)
        streamed = stream.get_final_message()
    assert streamed.to_dict() == whole.to_dict()
    assert (
        "".join(texts) == "Let me look."
        and [b.type for b in whole.content][-2:] == ["tool_use"] * 2
    )
