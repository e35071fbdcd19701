"""Stops the model asks for and reasoning blocks (SPEC 4.1, 4.2): refusal, pause, a cut-off tool
call, each live and replayed from the journal with nothing called."""

from __future__ import annotations

import json
from typing import Any

import pytest
from loop_kit import Counter, read_frame, run

from toolloop import (
    AssistantMessage,
    MemoryJournal,
    ModelEvent,
    PromptGenError,
    ReasoningBlock,
    Refusal,
    ToolMessage,
)
from toolloop.testing import ScriptedModel, call, reply

THINKING = ReasoningBlock(
    provider="anthropic",
    type="thinking",
    data={
        "type": "thinking",
        "thinking": "Shot 3 first.\n  (spaces kept)",
        "signature": "c2lnbmVk==",
    },
)
REDACTED = ReasoningBlock(
    provider="anthropic",
    type="redacted_thinking",
    data={"type": "redacted_thinking", "data": "ZW5j"},
)


class Exploding:
    """A model and tool that fail the test when a replay calls them."""

    calls = 0

    async def __call__(self, *args: Any) -> Any:
        self.calls += 1
        raise AssertionError("a replay called the model")


async def replayed(journal: MemoryJournal, counter: Counter, **overrides: Any) -> Any:
    explode = Exploding()
    result, events = await run(
        explode, journal, tools=[read_frame(counter)], **overrides
    )
    assert explode.calls == 0
    return result, events


def refusal_turn(*calls: Any) -> Any:
    meta = {"category": "cyber", "explanation": "This looks like exploit development."}
    return reply("", tool_calls=calls, finish_reason="refusal", meta=meta)


async def test_a_refusal_stops_refused_with_its_details_and_answers_open_calls() -> (
    None
):
    counter = Counter()
    journal = MemoryJournal()
    model = ScriptedModel(
        [
            reply(tool_calls=[call("read_frame", {"shot": 1}, id="c1")]),
            refusal_turn(call("read_frame", {"shot": 2}, id="c2")),
        ]
    )
    result, events = await run(model, journal, tools=[read_frame(counter)])
    assert result.stopped_by == "refused"
    assert result.refusal == Refusal(
        category="cyber", explanation="This looks like exploit development."
    )
    assert counter.calls == {"read_frame": 1}  # the refused turn's call never ran
    assert result.messages[-1] == ToolMessage(
        tool_call_id="c2", content="Not run: refused."
    )
    last = events.events[-1]
    assert isinstance(last, ModelEvent) and last.finish_reason == "refusal"
    assert last.refusal == result.refusal
    again, replay_events = await replayed(journal, counter)
    assert again == result and replay_events.events == events.events
    assert counter.calls == {"read_frame": 1}


async def test_a_refusal_without_calls_keeps_its_text() -> None:
    model = ScriptedModel(
        [
            reply(
                "I can't help with that.",
                finish_reason="refusal",
                meta={"category": None},
            )
        ]
    )
    result, _ = await run(model)
    assert (result.stopped_by, result.final_text) == (
        "refused",
        "I can't help with that.",
    )
    assert result.refusal == Refusal()


async def test_a_paused_turn_is_sent_back_as_the_next_call_with_no_tool_between() -> (
    None
):
    counter = Counter()
    journal = MemoryJournal()
    paused = reply(
        "Searching the archive…", finish_reason="paused", reasoning=[THINKING]
    )
    model = ScriptedModel(
        [
            paused,
            reply(tool_calls=[call("read_frame", {"shot": 3}, id="c1")]),
            reply("Shot 3 is fine."),
        ]
    )
    result, events = await run(model, journal, tools=[read_frame(counter)])
    assert (result.stopped_by, result.steps, result.final_text) == (
        "done",
        3,
        "Shot 3 is fine.",
    )
    second = model.requests[1].messages or []
    assert second[-1] == AssistantMessage(
        content="Searching the archive…", reasoning=[THINKING]
    )
    assert events.kinds() == ["model", "model", "tool", "model"]
    assert [key for key in journal.entries if key.startswith("model:")] == [
        "model:1",
        "model:2",
        "model:3",
    ]
    again, _ = await replayed(journal, counter)
    assert again == result and counter.calls == {"read_frame": 1}


async def test_a_cut_off_call_never_runs_and_the_turn_is_asked_again_with_twice_the_room() -> (
    None
):
    counter = Counter()
    journal = MemoryJournal()
    cut = reply(
        tool_calls=[
            call("read_frame", {"shot": 1}, id="whole"),
            call("read_frame", {}, id="cut"),
        ],
        finish_reason="length",
        meta={"max_tokens": 3000, "cut_off": ["cut"]},
    )
    model = ScriptedModel(
        [
            cut,
            reply(tool_calls=[call("read_frame", {"shot": 2}, id="c2")]),
            reply("Done."),
        ]
    )
    result, events = await run(
        model, journal, tools=[read_frame(counter)], reasoning="medium"
    )
    assert result.stopped_by == "done"
    assert counter.calls == {"read_frame": 1}  # only the retry's call ran
    assert model.requests[1].params == {"reasoning": "medium", "max_tokens": 6000}
    # the room is for the repeated turn only
    assert model.requests[2].params == {"reasoning": "medium"}
    # the cut answer is not history
    assert model.requests[1].messages == model.requests[0].messages
    ids = [m.tool_call_id for m in result.messages if isinstance(m, ToolMessage)]
    assert ids == ["c2"]
    first = events.events[0]
    assert isinstance(first, ModelEvent) and first.finish_reason == "length"
    assert result.steps == 3
    again, _ = await replayed(journal, counter, reasoning="medium")
    assert again == result and counter.calls == {"read_frame": 1}


async def test_without_a_cut_off_list_the_last_call_of_a_length_answer_is_the_cut_one() -> (
    None
):
    counter = Counter()
    cut = reply(
        tool_calls=[call("read_frame", {"shot": 1}, id="a")], finish_reason="length"
    )
    model = ScriptedModel([cut, reply("Done.")])
    result, _ = await run(model, tools=[read_frame(counter)])
    assert result.stopped_by == "done" and counter.calls == {}
    # no room reported: the floor
    assert model.requests[1].params == {"max_tokens": 1024}


async def test_a_length_answer_whose_calls_are_whole_runs_them() -> None:
    counter = Counter()
    whole = reply(
        tool_calls=[call("read_frame", {"shot": 1}, id="a")],
        finish_reason="length",
        meta={"cut_off": []},
    )
    result, _ = await run(
        ScriptedModel([whole, reply("Done.")]), tools=[read_frame(counter)]
    )
    assert result.stopped_by == "done" and counter.calls == {"read_frame": 1}


async def test_cut_off_twice_raises_that_the_answer_did_not_fit_and_replays_the_same() -> (
    None
):
    counter = Counter()
    journal = MemoryJournal()
    cut = reply(
        tool_calls=[call("read_frame", {}, id="x")],
        finish_reason="length",
        meta={"max_tokens": 500},
    )
    cut_again = reply(
        tool_calls=[call("read_frame", {}, id="y")],
        finish_reason="length",
        meta={"max_tokens": 1024},
    )
    model = ScriptedModel([cut, cut_again])
    with pytest.raises(
        PromptGenError, match=r"did not fit in 1024 output tokens"
    ) as raised:
        await run(model, journal, tools=[read_frame(counter)])
    assert "\n  " in str(raised.value)  # what happened, then what to do
    assert counter.calls == {} and model.calls == 2
    with pytest.raises(PromptGenError, match=r"did not fit"):
        await replayed(journal, counter)
    assert counter.calls == {}


async def test_a_length_answer_without_calls_is_done_as_before() -> None:
    result, _ = await run(ScriptedModel([reply("Half an ans", finish_reason="length")]))
    assert (result.stopped_by, result.final_text) == ("done", "Half an ans")


async def test_reasoning_blocks_join_the_history_the_next_request_and_replay_unchanged() -> (
    None
):
    counter = Counter()
    journal = MemoryJournal()
    model = ScriptedModel(
        [
            reply(
                tool_calls=[call("read_frame", {"shot": 3}, id="c1")],
                reasoning=[THINKING, REDACTED],
            ),
            reply("Fine.", reasoning=[THINKING]),
        ]
    )
    result, _ = await run(model, journal, tools=[read_frame(counter)])
    first = result.messages[1]
    assert isinstance(first, AssistantMessage) and first.reasoning == [
        THINKING,
        REDACTED,
    ]
    sent = (model.requests[1].messages or [])[1]
    assert isinstance(sent, AssistantMessage) and sent.reasoning == [THINKING, REDACTED]
    stored = json.loads(journal.entries["model:1"])["value"]["result"]["reasoning"]
    assert stored == [
        THINKING.model_dump(mode="json"),
        REDACTED.model_dump(mode="json"),
    ]
    again, _ = await replayed(journal, counter)
    assert again == result
    assert again.messages[1].model_dump_json() == result.messages[1].model_dump_json()


async def test_a_journal_written_before_reasoning_existed_replays_with_reasoning_none() -> (
    None
):
    old_result = {
        "text": "Old.",
        "cost_usd": 0.01,
        "tool_calls": [],
        "finish_reason": "stop",
        "usage": {"prompt_tokens": 1, "completion_tokens": 1},
        "meta": None,
    }
    journal = MemoryJournal(
        entries={
            "model:1": json.dumps({"value": {"result": old_result}, "cost_usd": 0.01})
        }
    )
    result, events = await replayed(journal, Counter())
    assert result.stopped_by == "done" and result.refusal is None
    assert result.messages[-1] == AssistantMessage(content="Old.")
    assert (
        isinstance(result.messages[-1], AssistantMessage)
        and result.messages[-1].reasoning is None
    )
    first = events.events[0]
    assert isinstance(first, ModelEvent) and first.finish_reason == "stop"
