"""Prompt-cache accounting over the Anthropic wire: a 30-turn tool conversation with rolling marks
(the system mark, one on the newest tool result, one where the previous request put its own) reads
at least 90 % of its prompt from the cache from turn 3 on; a turn that adds more than 20 blocks
after the only mark misses; the marks inside a tool result count."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from toolloop.sim import SimServer

HEADERS = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
SYSTEM = "You review storyboards one frame at a time. " * 150  # 1650 tokens
TOOLS = [
    {
        "name": "read_frame",
        "description": "Read a frame.",
        "input_schema": {"type": "object"},
    }
]
MARK = {"type": "ephemeral"}


class Sim(SimServer):
    client: httpx.Client


@pytest.fixture
def sim() -> Iterator[Sim]:
    turns = [
        {"tool_calls": [{"name": "read_frame", "input": {"shot": n}}]}
        for n in range(40)
    ]
    with (
        Sim(turns) as server,
        httpx.Client(base_url=server.base_url, headers=HEADERS) as client,
    ):
        server.client = client
        yield server


def send(sim: Sim, messages: list[dict[str, Any]]) -> dict[str, Any]:
    body = {
        "model": "claude-sonnet-5-5",
        "max_tokens": 100,
        "system": [{"type": "text", "text": SYSTEM, "cache_control": MARK}],
        "tools": TOOLS,
        "messages": messages,
    }
    response = sim.client.post("/v1/messages", json=body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def marked(history: list[dict[str, Any]], positions: list[int]) -> list[dict[str, Any]]:
    """A copy of the history with a cache mark on the last block of each user turn at `positions`."""
    out = []
    for index, message in enumerate(history):
        if index in positions and isinstance(message["content"], list):
            blocks = [dict(block) for block in message["content"]]
            blocks[-1] = {**blocks[-1], "cache_control": MARK}
            message = {**message, "content": blocks}
        out.append(message)
    return out


def test_rolling_marks_read_90_percent_of_the_prompt_from_turn_3(sim: Sim) -> None:
    history: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "Review the board."}]}
    ]
    previous_mark = 0
    ratios = []
    for _ in range(30):
        answer = send(sim, marked(history, sorted({previous_mark, len(history) - 1})))
        usage = answer["usage"]
        prompt = (
            usage["input_tokens"]
            + usage["cache_read_input_tokens"]
            + usage["cache_creation_input_tokens"]
        )
        ratios.append(usage["cache_read_input_tokens"] / prompt)
        previous_mark = len(history) - 1
        call = answer["content"][0]
        text = f"Frame {call['input']['shot']}: " + "a wide shot. " * 30
        result = {
            "type": "tool_result",
            "tool_use_id": call["id"],
            "content": [{"type": "text", "text": text}],
        }
        history += [
            {"role": "assistant", "content": answer["content"]},
            {"role": "user", "content": [result]},
        ]
    assert ratios[0] == 0.0
    print("cache read ratio per turn:", [round(ratio, 3) for ratio in ratios])
    assert min(ratios[2:]) >= 0.9


def test_a_turn_of_more_than_20_blocks_after_the_only_mark_misses_the_conversation_entry(
    sim: SimServer,
) -> None:
    first = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Look. " * 10, "cache_control": MARK}],
        }
    ]
    write = send(sim, first)["usage"]
    assert write["cache_creation_input_tokens"] > 0
    many = [{"type": "text", "text": f"note {n}"} for n in range(21)]
    later = [
        {"role": "user", "content": [{"type": "text", "text": "Look. " * 10}, *many]}
    ]
    later[0]["content"][-1] = {**later[0]["content"][-1], "cache_control": MARK}
    usage = send(sim, later)["usage"]
    # 'Look. ' * 10 = 60 chars = 15 tokens
    system_prefix = write["cache_creation_input_tokens"] - 15
    # only the system entry, by its own mark
    assert usage["cache_read_input_tokens"] == system_prefix
    within = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Look. " * 10}, *many[:20]],
        }
    ]
    within[0]["content"][-1] = {**within[0]["content"][-1], "cache_control": MARK}
    assert send(sim, within)["usage"]["cache_read_input_tokens"] == system_prefix + 15


def test_a_mark_inside_a_tool_result_is_a_breakpoint(sim: Sim) -> None:
    result = {
        "type": "tool_result",
        "tool_use_id": "toolu_x",
        "content": [
            {"type": "text", "text": "frame", "cache_control": MARK},
            {"type": "text", "text": "trailing note"},
        ],
    }
    history = [
        {"role": "user", "content": "Look."},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "toolu_x", "name": "read_frame", "input": {}}
            ],
        },
        {"role": "user", "content": [result]},
    ]
    first = send(sim, history)["usage"]
    second = send(sim, history)["usage"]
    assert (
        second["cache_read_input_tokens"]
        == first["cache_read_input_tokens"] + first["cache_creation_input_tokens"]
    )
    # "trailing note": only it is after the mark
    assert second["input_tokens"] == first["input_tokens"] == 4
