"""The simulator's fal endpoint (OpenAI-compatible router) over real HTTP."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from toolloop.contract import (
    AssistantMessage,
    ImagePart,
    TextPart,
    ToolMessage,
    UserMessage,
)
from toolloop.sim import SimRequest, SimServer, SimTurn
from toolloop.sim.tokens import IMAGE_TOKENS, text_tokens

PATH = "/openrouter/router/openai/v1/chat/completions"
MODEL = "anthropic/claude-opus-5.5"  # $4 / $20 per million tokens
SYSTEM = "You review storyboards. " * 400  # 2400 tokens
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_frame",
            "description": "Read a frame.",
            "parameters": {"type": "object"},
        },
    }
]
SCRIPT = [
    {"tool_calls": [{"name": "read_frame", "input": {"shot": 3}}]},
    {"text": "Shot 3 is fine."},
]


@pytest.fixture
def sim() -> Iterator[SimServer]:
    with SimServer(SCRIPT) as server:
        yield server


def post(
    sim: SimServer, messages: list[dict[str, Any]], key: str | None = "Key k"
) -> httpx.Response:
    system = {
        "role": "system",
        "content": [
            {"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}
        ],
    }
    body = {
        "model": MODEL,
        "messages": [system, *messages],
        "max_tokens": 100,
        "tools": TOOLS,
    }
    headers = {"Authorization": key} if key else {}
    return httpx.post(sim.base_url + PATH, json=body, headers=headers)


def test_a_tool_call_turn_then_a_final_text(sim: SimServer) -> None:
    history: list[dict[str, Any]] = [{"role": "user", "content": "Review the board."}]
    first = post(sim, history).json()["choices"][0]
    assert first["finish_reason"] == "tool_calls"
    assert first["message"]["content"] is None
    (call,) = first["message"]["tool_calls"]
    assert call["type"] == "function" and call["function"] == {
        "name": "read_frame",
        "arguments": '{"shot":3}',
    }
    again = post(sim, history).json()["choices"][0]["message"]["tool_calls"][0]
    assert call["id"].startswith("call_") and call["id"] == again["id"]
    history += [
        first["message"],
        {"role": "tool", "tool_call_id": call["id"], "content": "frame 3"},
    ]
    second = post(sim, history).json()["choices"][0]
    assert (second["finish_reason"], second["message"]["content"]) == (
        "stop",
        "Shot 3 is fine.",
    )
    assert "tool_calls" not in second["message"]


def test_usage_reports_cache_write_then_read_with_the_cost_at_cache_rates(
    sim: SimServer,
) -> None:
    history = [{"role": "user", "content": "Review the board."}]
    first, second = (post(sim, history).json()["usage"] for _ in range(2))
    tool_tokens = text_tokens(
        '{"name":"read_frame","description":"Read a frame.","parameters":{"type":"object"}}'
    )
    prefix = tool_tokens + 2400
    user = text_tokens("Review the board.")
    assert first["prompt_tokens"] == second["prompt_tokens"] == prefix + user
    assert first["prompt_tokens_details"] == {
        "cached_tokens": 0,
        "cache_write_tokens": prefix,
    }
    assert first["cache_creation_input_tokens"] == prefix
    assert second["prompt_tokens_details"] == {
        "cached_tokens": prefix,
        "cache_write_tokens": 0,
    }
    completion = first["completion_tokens"]
    assert first["cost"] == round(
        (user * 4 + prefix * 1.25 * 4 + completion * 20) / 1e6, 6
    )
    # Opus 5.5 reads at $0.20/MTok (0.05x input; the catalogue), not 0.1x
    assert second["cost"] == round((user * 4 + prefix * 0.2 + completion * 20) / 1e6, 6)


def test_a_policy_sees_fal_messages_as_contract_types() -> None:
    seen: list[SimRequest] = []

    def policy(request: SimRequest) -> SimTurn:
        seen.append(request)
        return SimTurn(text="ok")

    image = "data:image/png;base64," + base64.b64encode(b"png bytes").decode()
    look = [
        {"type": "text", "text": "Look.", "cache_control": {"type": "ephemeral"}},
        {"type": "image_url", "image_url": {"url": image}},
    ]
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "read_frame", "arguments": '{"shot":3}'},
    }
    messages = [
        {"role": "user", "content": look},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "frame 3"},
    ]
    with SimServer(policy) as sim:
        response = post(sim, messages)
    assert response.status_code == 200
    request = seen[0]
    assert (request.wire, request.model, request.system, request.assistant_turns) == (
        "fal",
        MODEL,
        SYSTEM,
        1,
    )
    user, assistant, tool = request.messages
    assert isinstance(user, UserMessage) and isinstance(user.content, list)
    assert user.content[0] == TextPart(text="Look.", cache=True)
    assert (
        isinstance(user.content[1], ImagePart)
        and user.content[1].mime_type == "image/png"
    )
    assert isinstance(assistant, AssistantMessage) and assistant.tool_calls
    assert assistant.tool_calls[0].input == {"shot": 3}
    assert isinstance(tool, ToolMessage) and (tool.tool_call_id, tool.content) == (
        "call_1",
        "frame 3",
    )
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] > IMAGE_TOKENS + 2400


def test_a_missing_or_wrong_scheme_key_is_a_401_in_fal_format(sim: SimServer) -> None:
    for key in (None, "Bearer k", "Key"):
        response = post(sim, [{"role": "user", "content": "Hi"}], key=key)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == 401


def test_an_empty_message_list_is_a_400(sim: SimServer) -> None:
    response = httpx.post(
        sim.base_url + PATH,
        json={"model": MODEL, "messages": []},
        headers={"Authorization": "Key k"},
    )
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "messages must not be empty"


def test_a_string_content_and_its_one_part_form_share_the_cache(sim: SimServer) -> None:
    marked = [
        {
            "type": "text",
            "text": "Review the board.",
            "cache_control": {"type": "ephemeral"},
        }
    ]
    first = post(sim, [{"role": "user", "content": marked}]).json()["usage"]
    later = [
        {
            "role": "user",
            "content": "Review the board.",
        },  # the mark moved on: now a plain string
        {"role": "assistant", "content": "Looking."},
        {
            "role": "user",
            "content": [
                {
                    "type": "text",
                    "text": "Go on.",
                    "cache_control": {"type": "ephemeral"},
                }
            ],
        },
    ]
    second = post(sim, later).json()["usage"]
    assert second["prompt_tokens_details"]["cached_tokens"] == first["prompt_tokens"]


def test_an_image_in_a_tool_message_is_a_400_and_in_a_user_turn_it_counts(
    sim: SimServer,
) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,cG5n"}}
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "read_frame", "arguments": "{}"},
    }
    head = [
        {"role": "user", "content": "Look."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
    ]
    refused = post(
        sim, [*head, {"role": "tool", "tool_call_id": "call_1", "content": [image]}]
    )
    assert refused.status_code == 400
    assert (
        "tool message's content parts must be of type 'text'"
        in refused.json()["error"]["message"]
    )
    placeholder = [{"type": "text", "text": "[image 1 of this result follows]"}]
    tool = {"role": "tool", "tool_call_id": "call_1", "content": placeholder}
    plain = post(sim, [*head, tool])
    shown = post(sim, [*head, tool, {"role": "user", "content": [image]}])
    assert shown.status_code == plain.status_code == 200
    assert (
        shown.json()["usage"]["prompt_tokens"] - plain.json()["usage"]["prompt_tokens"]
        >= IMAGE_TOKENS
    )
