"""The core turn of run_tool_loop (SPEC 2.1, 2.2, 2.4, 2.10, 2.11)."""

from __future__ import annotations

import pytest
from loop_kit import Counter, read_frame, run

from toolloop import (
    AssistantMessage,
    MemoryJournal,
    ModelEvent,
    PromptGenUsage,
    TextPart,
    ToolCall,
    ToolEvent,
    ToolMessage,
    UserMessage,
)
from toolloop.testing import ScriptedModel, call, reply


async def test_a_turn_without_calls_is_done() -> None:
    model = ScriptedModel([reply("All good.", cost_usd=0.02)])
    result, events = await run(model)
    assert result.stopped_by == "done"
    assert result.final_text == "All good."
    assert result.steps == 1
    assert result.spent_usd == pytest.approx(0.02)
    assert result.messages == [
        UserMessage(content="Review shot 3."),
        AssistantMessage(content="All good."),
    ]
    assert [e.kind for e in events.events] == ["model"]


async def test_tool_call_result_joins_history_and_next_request() -> None:
    counter = Counter()
    model = ScriptedModel(
        [
            reply(tool_calls=[call("read_frame", {"shot": 3}, id="c1")], cost_usd=0.01),
            reply("Shot 3 is fine.", cost_usd=0.01),
        ]
    )
    result, events = await run(model, tools=[read_frame(counter, cost=0.5)])
    assert result.stopped_by == "done"
    assert counter.calls == {"read_frame": 1}
    assert result.messages[1] == AssistantMessage(
        content=None, tool_calls=[call("read_frame", {"shot": 3}, id="c1")]
    )
    assert result.messages[2] == ToolMessage(
        tool_call_id="c1", content=[TextPart(text="frame 3")]
    )
    assert result.spent_usd == pytest.approx(0.52)
    second = model.requests[1]
    assert [m.role for m in second.messages or []] == ["user", "assistant", "tool"]
    assert events.events == [
        ModelEvent(
            step=1,
            text=None,
            tool_calls=[call("read_frame", {"shot": 3}, id="c1")],
            cost_usd=0.01,
            usage=PromptGenUsage(),
            finish_reason="tool_calls",
        ),
        ToolEvent(
            step=1,
            name="read_frame",
            call_id="c1",
            cost_usd=0.5,
            summary="frame 3",
            rows=[],
        ),
        ModelEvent(
            step=2,
            text="Shot 3 is fine.",
            tool_calls=[],
            cost_usd=0.01,
            usage=PromptGenUsage(),
        ),
    ]


async def test_replay_makes_no_call_and_returns_equal_result() -> None:
    journal = MemoryJournal()
    counter = Counter()
    model = ScriptedModel(
        [
            reply(tool_calls=[call("read_frame", {"shot": 3}, id="c1")], cost_usd=0.01),
            reply(
                tool_calls=[
                    call("nope", {}, id="c2"),
                    call("read_frame", {"shot": "x"}, id="c3"),
                ]
            ),
            reply("Done.", cost_usd=0.01),
        ]
    )
    first, first_events = await run(
        model, journal, tools=[read_frame(counter, cost=0.5)]
    )
    replay_counter = Counter()
    replay_model = ScriptedModel([])
    second, second_events = await run(
        replay_model, journal, tools=[read_frame(replay_counter)]
    )
    assert replay_model.calls == 0 and replay_counter.calls == {}
    assert second == first
    assert second_events.events == first_events.events
    assert counter.calls == {"read_frame": 1}


async def test_unknown_tool_and_invalid_input_answers() -> None:
    model = ScriptedModel(
        [
            reply(
                tool_calls=[
                    call("zoom", {}, id="c1"),
                    call("read_frame", {"shot": "three", "take": None}, id="c2"),
                    ToolCall(id="c3", name="read_frame", input=[3]),
                ]
            ),
            reply("ok"),
        ]
    )
    result, _ = await run(model)
    answers = {
        m.tool_call_id: m.content for m in result.messages if isinstance(m, ToolMessage)
    }
    assert answers["c1"] == [TextPart(text='Unknown tool "zoom".')]
    assert answers["c2"] == [
        TextPart(
            text="Invalid input for read_frame: "
            "✖ Input should be a valid number, unable to parse string as a number\n"
            "  → at shot\n"
            "✖ Input should be a valid number\n"
            "  → at take"
        )
    ]
    assert answers["c3"] == [
        TextPart(
            text="Invalid input for read_frame: ✖ Input should be a valid dictionary or instance of Shot"
        )
    ]
