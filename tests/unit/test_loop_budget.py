"""Budget checks, finish mode and the note (SPEC 2.7)."""

from __future__ import annotations

import pytest
from loop_kit import Counter, read_frame, render, run

from toolloop import (
    AssistantMessage,
    Budget,
    BudgetEvent,
    MemoryJournal,
    TextPart,
    ToolMessage,
    UserMessage,
)
from toolloop.testing import ScriptedModel, call, reply

NOTE = "Budget is nearly spent: finish now."


def calls_turn(*ids: str, cost: float = 0.0, name: str = "read_frame") -> object:
    return reply(tool_calls=[call(name, {"shot": 1}, id=i) for i in ids], cost_usd=cost)


async def test_model_check_stops_before_the_call_and_journals_nothing() -> None:
    journal = MemoryJournal()
    model = ScriptedModel([calls_turn("c1", cost=0.6), reply("never")])
    result, events = await run(
        model, journal, budget=Budget(usd=1.0), tools=[read_frame(cost=0.5)]
    )
    assert result.stopped_by == "budget"
    assert model.calls == 1
    assert journal.keys() == ["model:1", "tool:c1"]
    stop = events.events[-1]
    assert isinstance(stop, BudgetEvent) and stop.mode == "stop"
    assert stop.spent_usd == pytest.approx(1.1)
    assert result.spent_usd == pytest.approx(1.1)
    assert result.final_text is None


async def test_spent_usd_carried_over_counts() -> None:
    model = ScriptedModel([reply("never")])
    result, events = await run(model, budget=Budget(usd=1.0, spent_usd=1.0))
    assert (result.stopped_by, model.calls, result.steps) == ("budget", 0, 0)
    assert events.events == [BudgetEvent(spent_usd=1.0, limit_usd=1.0, mode="stop")]


@pytest.mark.parametrize("is_async", [False, True])
async def test_outside_spend_is_read_at_every_check_and_for_the_result(
    is_async: bool,
) -> None:
    reads: list[float] = []
    outside = [0.0, 0.2, 0.9, 0.9]

    def value() -> float:
        reads.append(outside[len(reads)])
        return reads[-1]

    async def async_value() -> float:
        return value()

    model = ScriptedModel([calls_turn("c1"), calls_turn("c2"), reply("never")])
    result, events = await run(
        model,
        budget=Budget(usd=1.0, spent=async_value if is_async else value),
        tools=[read_frame(cost=0.05)],
    )
    assert result.stopped_by == "budget"
    assert len(reads) == 4  # three model checks, then the result
    stop = events.events[-1]
    assert isinstance(stop, BudgetEvent) and stop.mode == "stop"
    assert stop.spent_usd == pytest.approx(1.0)
    assert result.spent_usd == pytest.approx(1.0)


async def test_estimate_stops_before_the_tool_and_answers_open_calls() -> None:
    counter = Counter()
    tool = read_frame(counter, cost=0.45)
    tool = tool.model_copy(update={"estimate_usd": lambda input: 0.5})
    model = ScriptedModel([calls_turn("c1", "c2", "c3", cost=0.1)])
    result, events = await run(model, budget=Budget(usd=1.0), tools=[tool])
    assert result.stopped_by == "budget"
    assert counter.calls == {"read_frame": 1}  # 0.1 + 0.5 runs; 0.55 + 0.5 > 1 does not
    assert result.messages[-2:] == [
        ToolMessage(tool_call_id="c2", content="Not run: budget."),
        ToolMessage(tool_call_id="c3", content="Not run: budget."),
    ]
    assert events.kinds() == ["model", "tool", "budget"]
    stop = events.events[-1]
    assert isinstance(stop, BudgetEvent) and (stop.mode, stop.limit_usd) == (
        "stop",
        1.0,
    )
    assert stop.spent_usd == pytest.approx(0.55)  # the estimate is not included


async def test_estimate_equal_to_the_rest_of_the_budget_runs() -> None:
    counter = Counter()
    tool = read_frame(counter).model_copy(update={"estimate_usd": lambda input: 0.5})
    model = ScriptedModel([calls_turn("c1", cost=0.5), reply("done")])
    result, _ = await run(model, budget=Budget(usd=1.0), tools=[tool])
    assert counter.calls == {"read_frame": 1}
    assert result.stopped_by == "done"


async def test_replayed_step_is_never_checked_again() -> None:
    journal = MemoryJournal()
    outside = {"usd": 0.0}
    counter = Counter()
    tools = [render(counter, estimate=0.1)]
    budget = Budget(usd=1.0, spent=lambda: outside["usd"])

    async def crash(started: object, signal: object) -> object:
        raise RuntimeError("worker died")

    crashing = tools[0].model_copy(update={"wait": crash})
    model = ScriptedModel([calls_turn("c1", name="render"), reply("done")])
    with pytest.raises(RuntimeError):
        await run(model, journal, budget=budget, tools=[crashing])
    assert counter.calls == {"start": 1}
    outside["usd"] = (
        5.0  # the outside spend grew: replayed model:1 and start are not checked again
    )
    result, _ = await run(
        ScriptedModel([reply("never")]), journal, budget=budget, tools=tools
    )
    assert counter.calls == {"start": 1, "wait": 1}
    assert result.stopped_by == "budget"  # model:2 is live and checked
    assert result.messages[-1] == ToolMessage(
        tool_call_id="c1", content=[TextPart(text="rendered job-1")]
    )


async def test_finish_mode_note_is_last_in_request_and_joins_history_before_answer() -> (
    None
):
    model = ScriptedModel(
        [calls_turn("c1", cost=0.5), calls_turn("c2"), reply("Final.")]
    )
    result, events = await run(
        model,
        budget=Budget(usd=1.0, finish_at=0.5),
        finish_note=NOTE,
        tools=[read_frame()],
        cache="off",
    )
    assert model.requests[0].messages[-1] == UserMessage(content="Review shot 3.")
    assert (model.requests[1].messages or [])[-1] == UserMessage(content=NOTE)
    assert (model.requests[2].messages or [])[3] == UserMessage(content=NOTE)
    notes = [i for i, m in enumerate(result.messages) if m == UserMessage(content=NOTE)]
    assert notes == [3]
    assert isinstance(result.messages[4], AssistantMessage)
    assert events.kinds() == ["model", "tool", "budget", "model", "tool", "model"]
    assert events.events[2] == BudgetEvent(spent_usd=0.5, limit_usd=1.0, mode="finish")


async def test_finish_mode_starts_once_and_without_note_still_emits() -> None:
    model = ScriptedModel(
        [calls_turn("c1", cost=0.5), calls_turn("c2"), reply("Final.")]
    )
    result, events = await run(
        model, budget=Budget(usd=1.0, finish_at=0.5), tools=[read_frame()]
    )
    assert events.kinds().count("budget") == 1
    assert all(
        not (isinstance(m, UserMessage) and m.content == NOTE) for m in result.messages
    )


async def test_note_already_in_history_is_not_added_again() -> None:
    given = [UserMessage(content="Review shot 3."), UserMessage(content=NOTE)]
    model = ScriptedModel([reply("Final.")])
    result, events = await run(
        model, budget=Budget(usd=1.0, finish_at=0.0), finish_note=NOTE, messages=given
    )
    assert len(model.requests[0].messages or []) == 2
    assert result.messages == [*given, AssistantMessage(content="Final.")]
    assert events.kinds() == ["budget", "model"]


async def test_finish_note_keeps_its_place_on_replay() -> None:
    journal = MemoryJournal()
    spend = {"usd": 0.0}
    budget = Budget(usd=1.0, finish_at=0.5, spent=lambda: spend["usd"])
    model = ScriptedModel([calls_turn("c1"), calls_turn("c2"), reply("Final.")])

    def grow(input: object, signal: object) -> object:
        spend["usd"] += 0.3
        return {"content": [{"type": "text", "text": "ok"}]}

    tool = read_frame().model_copy(update={"run": grow})
    first, first_events = await run(
        model, journal, budget=budget, finish_note=NOTE, tools=[tool]
    )
    # at the third call (spent 0.6)
    assert first.messages.index(UserMessage(content=NOTE)) == 5
    spend["usd"] = (
        0.0  # replay sees a different outside spend: the note stays where it was
    )
    second, second_events = await run(
        ScriptedModel([]), journal, budget=budget, finish_note=NOTE, tools=[tool]
    )
    assert second.messages == first.messages
    assert second_events.events == first_events.events


async def test_run_that_ends_before_another_call_never_enters_finish_mode() -> None:
    model = ScriptedModel([calls_turn("c1", cost=0.9)])
    result, events = await run(
        model, budget=Budget(usd=1.0, finish_at=0.5), finish_note=NOTE, max_steps=1
    )
    assert result.stopped_by == "steps"
    assert "budget" not in events.kinds()
    assert UserMessage(content=NOTE) not in result.messages
