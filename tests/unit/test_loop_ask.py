"""The ask tool (SPEC 2.6) and resuming after it (2.12)."""

from __future__ import annotations

from loop_kit import Counter, ask_tool, read_frame, run

from toolloop import (
    Asked,
    Budget,
    MemoryJournal,
    TextPart,
    ToolMessage,
)
from toolloop.testing import ScriptedModel, call, reply


def ask(id: str, question: object = "Keep shot 3?") -> object:
    return call("ask", {"question": question}, id=id)


async def test_ask_holds_after_the_other_calls_run() -> None:
    counter = Counter()
    model = ScriptedModel(
        [
            reply(
                tool_calls=[ask("a1"), call("read_frame", {"shot": 3}, id="c1")],
                cost_usd=0.1,
            )
        ]
    )
    result, events = await run(model, tools=[read_frame(counter), ask_tool()])
    assert result.stopped_by == "asked"
    assert result.asked == Asked(input={"question": "Keep shot 3?"})
    assert counter.calls == {"read_frame": 1}
    answered = [m.tool_call_id for m in result.messages if isinstance(m, ToolMessage)]
    assert answered == ["c1"]  # the ask stays open
    assert events.kinds() == ["model", "tool"]


async def test_second_ask_of_a_turn_is_answered() -> None:
    model = ScriptedModel([reply(tool_calls=[ask("a1"), ask("a2", "And shot 5?")])])
    result, events = await run(model, tools=[ask_tool()])
    assert result.stopped_by == "asked"
    assert result.asked == Asked(input={"question": "Keep shot 3?"})
    assert result.messages[-1] == ToolMessage(
        tool_call_id="a2", content=[TextPart(text="Ask one question at a time.")]
    )
    assert events.events[-1].kind == "tool"


async def test_invalid_ask_is_answered_and_the_loop_goes_on() -> None:
    model = ScriptedModel([reply(tool_calls=[ask("a1", 3.5)]), reply("fine")])
    result, _ = await run(model, tools=[ask_tool()])
    assert result.stopped_by == "done"
    message = result.messages[2]
    assert isinstance(message, ToolMessage)
    assert message.content == [
        TextPart(
            text="Invalid input for ask: ✖ Input should be a valid string\n  → at question"
        )
    ]


async def test_ask_without_an_ask_tool_is_unknown() -> None:
    model = ScriptedModel([reply(tool_calls=[ask("a1")]), reply("fine")])
    result, _ = await run(model)
    assert result.stopped_by == "done"
    assert result.messages[2] == ToolMessage(
        tool_call_id="a1", content=[TextPart(text='Unknown tool "ask".')], is_error=True
    )


async def test_budget_stop_later_in_the_turn_wins_over_the_held_ask() -> None:
    tool = read_frame().model_copy(update={"estimate_usd": lambda input: 2.0})
    model = ScriptedModel(
        [reply(tool_calls=[ask("a1"), call("read_frame", {"shot": 1}, id="c1")])]
    )
    result, events = await run(model, tools=[tool, ask_tool()], budget=Budget(usd=1.0))
    assert result.stopped_by == "budget"
    assert result.asked is None
    assert result.messages[-2:] == [
        ToolMessage(tool_call_id="a1", content="Not run: budget."),
        ToolMessage(tool_call_id="c1", content="Not run: budget."),
    ]
    assert events.kinds() == ["model", "budget"]


async def test_answer_and_continue_under_a_new_prefix() -> None:
    journal = MemoryJournal("s0/")
    model = ScriptedModel(
        [reply(tool_calls=[ask("a1")], cost_usd=0.25), reply("Kept.", cost_usd=0.25)]
    )
    first, _ = await run(model, journal, tools=[ask_tool()])
    assert first.stopped_by == "asked"
    answered = [
        *first.messages,
        ToolMessage(tool_call_id="a1", content="Yes, keep it."),
    ]
    second, _ = await run(
        model,
        journal.segment("s1/"),
        tools=[ask_tool()],
        messages=answered,
        budget=Budget(usd=10.0, spent_usd=first.spent_usd),
    )
    assert second.stopped_by == "done"
    assert second.final_text == "Kept."
    assert second.spent_usd == 0.5
    assert journal.keys() == ["s0/model:1", "s1/model:1"]
    assert (model.requests[1].messages or [])[-1].role == "tool"


async def test_an_ask_tool_needs_no_run() -> None:
    from loop_kit import Question

    from toolloop import ToolSpec

    bare = ToolSpec(name="ask", description="Ask the person.", schema=Question)
    result, _ = await run(ScriptedModel([reply(tool_calls=[ask("a1")])]), tools=[bare])
    assert result.asked == Asked(input={"question": "Keep shot 3?"})
