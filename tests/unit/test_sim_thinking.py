"""The simulator's thinking rules (toolloop/sim/thinking.py) on request bodies, without a server."""

from __future__ import annotations

from typing import Any

import pytest

from toolloop.sim import SimRequest, SimTurn, thinking


def request(body: dict[str, Any], history_hash: str = "0" * 64) -> SimRequest:
    return SimRequest(
        "anthropic",
        str(body.get("model", "m")),
        None,
        [],
        [],
        1,
        "c",
        history_hash,
        body,
    )


@pytest.mark.parametrize(
    ("body", "on"),
    [
        ({"model": "claude-sonnet-5-5", "thinking": {"type": "adaptive"}}, True),
        (
            {
                "model": "claude-haiku-4-5",
                "thinking": {"type": "enabled", "budget_tokens": 2048},
            },
            True,
        ),
        ({"model": "claude-sonnet-5-5"}, False),
        ({"model": "claude-opus-5-5"}, True),  # always on
        ({"model": "claude-opus-5-5", "thinking": {"type": "disabled"}}, False),
        ({"model": "anthropic/claude-haiku-4.5", "reasoning": {"effort": "low"}}, True),
    ],
)
def test_thinking_on(body: dict[str, Any], on: bool) -> None:
    assert thinking.thinking_on(body) is on


def test_answers_begin_with_a_signed_block_and_sometimes_a_redacted_one() -> None:
    body = {"model": "claude-sonnet-5-5", "thinking": {"type": "adaptive"}}
    plain = thinking.anthropic_blocks(SimTurn(thinking="Hmm."), request(body, "1" * 64))
    assert plain == [
        {"type": "thinking", "thinking": "Hmm.", "signature": thinking.sign("Hmm.")}
    ]
    both = thinking.anthropic_blocks(SimTurn(), request(body, "0" * 64))
    assert [b["type"] for b in both] == ["thinking", "redacted_thinking"]
    assert (
        thinking.anthropic_blocks(SimTurn(), request({"model": "claude-sonnet-5-5"}))
        == []
    )


def loop_body(assistants: list[list[dict[str, Any]]]) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Go."}]
    messages += [{"role": "assistant", "content": content} for content in assistants]
    result = {"type": "tool_result", "tool_use_id": "t1", "content": "3"}
    messages.append({"role": "user", "content": [result]})
    return {"model": "claude-opus-5-5", "messages": messages}


TOOL_USE = {"type": "tool_use", "id": "t1", "name": "add", "input": {}}
SIGNED = {"type": "thinking", "thinking": "Add.", "signature": thinking.sign("Add.")}


def test_a_tool_loop_turn_must_start_with_its_thinking() -> None:
    assert thinking.check_anthropic(loop_body([[SIGNED, TOOL_USE]])) is None
    problem = thinking.check_anthropic(loop_body([[TOOL_USE, SIGNED]]))
    assert problem is not None and problem.startswith(
        "messages.1.content.0.type: Expected `thinking`"
    )
    # a paused answer and its continuation are one turn: it starts at the first of them
    assert (
        thinking.check_anthropic(
            loop_body([[SIGNED, {"type": "text", "text": "…"}], [TOOL_USE]])
        )
        is None
    )


def test_changed_blocks_are_refused_anywhere_in_the_history() -> None:
    changed = {**SIGNED, "thinking": "Add!"}
    assert thinking.check_anthropic(loop_body([[changed, TOOL_USE]])) == (
        "messages.1.content.0: Invalid `signature` in `thinking` block"
    )
    bad = {"type": "redacted_thinking", "data": "bm90IG91cnM="}
    assert "Invalid `data`" in str(
        thinking.check_anthropic(loop_body([[SIGNED, bad, TOOL_USE]]))
    )


def test_fal_reasoning_details_are_checked_when_they_come_back() -> None:
    body = {"model": "anthropic/claude-opus-5.5", "reasoning": {"effort": "medium"}}
    details = thinking.fal_fields(SimTurn(), request(body))["reasoning_details"]
    sent = {
        "messages": [
            {"role": "user", "content": "Go."},
            {"role": "assistant", "content": None, "reasoning_details": details},
        ]
    }
    assert thinking.check_fal(sent) is None
    sent["messages"][1]["reasoning_details"] = [
        {**details[0], "text": details[0]["text"] + "."}
    ]
    assert "Invalid `signature`" in str(thinking.check_fal(sent))
