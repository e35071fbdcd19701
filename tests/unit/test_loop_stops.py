"""Stops, cancel, the request shape, callables, errors (SPEC 2.1, 2.2, 2.4, 2.10, 2.11)."""

from __future__ import annotations

import asyncio
from typing import Any

import pydantic
import pytest
from loop_kit import Counter, options, read_frame, run

from toolloop import (
    AbortController,
    AbortError,
    AssistantMessage,
    MemoryJournal,
    PromptGenResult,
    TextPart,
    ToolMessage,
    ToolOutput,
    UserMessage,
    run_tool_loop,
)
from toolloop.testing import ScriptedModel, call, reply


def frames(*ids: str) -> Any:
    return reply(tool_calls=[call("read_frame", {"shot": 1}, id=i) for i in ids])


async def test_steps_limit_stops_before_the_next_call() -> None:
    model = ScriptedModel([frames("c1"), frames("c2"), reply("never")])
    result, events = await run(model, max_steps=2)
    assert (result.stopped_by, result.steps, model.calls) == ("steps", 2, 2)
    # every call answered: nothing "Not run"
    assert isinstance(result.messages[-1], ToolMessage)
    assert events.kinds() == ["model", "tool", "model", "tool"]


async def test_steps_is_checked_before_the_budget() -> None:
    from toolloop import Budget

    result, events = await run(ScriptedModel([]), max_steps=0, budget=Budget(usd=0.0))
    assert result.stopped_by == "steps"
    assert events.events == []


async def test_already_aborted_signal_makes_no_model_call() -> None:
    controller = AbortController()
    controller.abort()
    model = ScriptedModel([reply("never")])
    given = [
        UserMessage(content="Review."),
        AssistantMessage(tool_calls=[call("read_frame", {"shot": 1}, id="open")]),
    ]
    result, _ = await run(model, signal=controller.signal, messages=given)
    assert (result.stopped_by, model.calls, result.steps, result.final_text) == (
        "cancel",
        0,
        0,
        None,
    )
    assert result.messages == [
        *given,
        ToolMessage(tool_call_id="open", content="Not run: cancel."),
    ]


async def test_cancel_during_the_model_step_stops_after_it_settles() -> None:
    controller = AbortController()

    def answer(request: Any) -> PromptGenResult:
        controller.abort()
        return frames("c1", "c2")

    counter = Counter()
    result, events = await run(
        ScriptedModel([answer]), signal=controller.signal, tools=[read_frame(counter)]
    )
    assert result.stopped_by == "cancel"
    assert counter.calls == {}
    assert result.steps == 1
    assert [m.content for m in result.messages[-2:]] == [
        "Not run: cancel.",
        "Not run: cancel.",
    ]
    assert events.kinds() == ["model"]


async def test_cancel_after_a_tool_answers_the_rest() -> None:
    controller = AbortController()

    def run_then_cancel(input: Any, signal: Any) -> ToolOutput:
        controller.abort()
        return ToolOutput(content=[])

    tool = read_frame().model_copy(update={"run": run_then_cancel})
    result, events = await run(
        ScriptedModel([frames("c1", "c2")]), signal=controller.signal, tools=[tool]
    )
    assert result.stopped_by == "cancel"
    assert result.messages[-2:] == [
        ToolMessage(tool_call_id="c1", content="(no output)"),
        ToolMessage(tool_call_id="c2", content="Not run: cancel."),
    ]
    assert events.kinds() == ["model", "tool"]


async def test_tool_error_ends_the_loop_unjournaled() -> None:
    journal = MemoryJournal()

    def broken(input: Any, signal: Any) -> ToolOutput:
        raise ValueError("disk full")

    tool = read_frame().model_copy(update={"run": broken})
    with pytest.raises(ValueError, match="disk full"):
        await run(ScriptedModel([frames("c1")]), journal, tools=[tool])
    assert journal.keys() == ["model:1"]


async def test_error_while_aborted_is_a_cancel() -> None:
    controller = AbortController()

    async def generate(request: Any, signal: Any) -> PromptGenResult:
        controller.abort("stop")
        signal.throw_if_aborted()
        raise AssertionError("unreachable")

    result, _ = await run(generate, signal=controller.signal)
    assert (result.stopped_by, result.steps) == ("cancel", 0)


async def test_generate_error_propagates_and_is_not_journaled() -> None:
    journal = MemoryJournal()

    async def generate(request: Any, signal: Any) -> PromptGenResult:
        raise AbortError("provider gave up")

    with pytest.raises(AbortError):
        await run(generate, journal)
    assert journal.keys() == []


async def test_generate_and_tools_receive_the_journal_signal() -> None:
    controller = AbortController()
    seen: list[Any] = []

    async def generate(request: Any, signal: Any) -> PromptGenResult:
        seen.append(signal)
        return reply("ok")

    await run(generate, MemoryJournal(signal=controller.signal))
    assert seen == [controller.signal]


async def test_request_shape() -> None:
    model = ScriptedModel([reply("ok")])
    await run(model, reasoning="off")
    request = model.requests[0]
    assert (request.prompt, request.system, request.model) == (
        "",
        "You review storyboards.",
        "test-model",
    )
    assert request.params == {"reasoning": "off"}
    assert request.temperature is None and request.tool_choice is None
    assert [t.name for t in request.tools or []] == ["read_frame"]
    plain = ScriptedModel([reply("ok")])
    await run(plain)
    assert plain.requests[0].params is None


async def test_options_and_messages_may_be_dicts_and_are_validated_first() -> None:
    model = ScriptedModel([reply("ok")])
    values = dict(options(model))
    values["messages"] = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    result = await run_tool_loop(values)
    assert result.messages[0] == UserMessage(content=[TextPart(text="Hi")])
    values["messages"] = [{"role": "user", "content": 3}]
    with pytest.raises(pydantic.ValidationError):
        await run_tool_loop(values)
    values["messages"] = [{"role": "robot", "content": "Hi"}]
    with pytest.raises(pydantic.ValidationError):
        await run_tool_loop(values)
    assert model.calls == 1


async def test_given_messages_are_never_mutated() -> None:
    given = [UserMessage(content="Review shot 3.")]
    opts = options(ScriptedModel([frames("c1"), reply("ok")]), messages=given)
    before = list(opts.messages)
    await run_tool_loop(opts)
    assert opts.messages == before and len(opts.messages) == 1


async def test_async_and_sync_callables() -> None:
    async def async_run(input: Any, signal: Any) -> ToolOutput:
        await asyncio.sleep(0)
        return ToolOutput(value=1, content=[TextPart(text="async")])

    def sync_generate(request: Any, signal: Any) -> PromptGenResult:
        return reply("sync") if len(request.messages) > 1 else frames("c1")

    tool = read_frame().model_copy(update={"run": async_run})
    result, _ = await run(sync_generate, tools=[tool])
    assert result.final_text == "sync"
    assert result.messages[2] == ToolMessage(
        tool_call_id="c1", content=[TextPart(text="async")]
    )


async def test_final_text_is_none_for_an_empty_turn() -> None:
    result, events = await run(ScriptedModel([reply("")]))
    assert result.stopped_by == "done" and result.final_text is None
    assert result.messages[-1] == AssistantMessage(content=None, tool_calls=None)
    assert events.events[0].text is None  # type: ignore[union-attr]


async def test_tool_summary_and_rows() -> None:
    def long(input: Any, signal: Any) -> ToolOutput:
        return ToolOutput(content=[TextPart(text="x" * 300)], rows=["r9"])

    tool = read_frame().model_copy(update={"run": long})
    _, events = await run(ScriptedModel([frames("c1"), reply("ok")]), tools=[tool])
    event = events.events[1]
    assert event.summary == "x" * 200  # type: ignore[union-attr]
    assert event.rows == ["r9"]  # type: ignore[union-attr]


def test_a_tool_needs_run_or_both_halves() -> None:
    from loop_kit import Shot

    from toolloop import ToolSpec

    with pytest.raises(pydantic.ValidationError, match="has no run"):
        ToolSpec(name="t", description="d", schema=Shot, start=lambda i, s: None)


async def test_steps_stop_answers_calls_left_open_in_the_given_messages() -> None:
    given = [
        UserMessage(content="Review."),
        AssistantMessage(
            content="Two reads.", tool_calls=[call("read_frame", {"shot": 1}, id="o1")]
        ),
    ]
    result, events = await run(ScriptedModel([]), max_steps=0, messages=given)
    assert result.stopped_by == "steps"
    assert result.messages == [
        *given,
        ToolMessage(tool_call_id="o1", content="Not run: steps."),
    ]
    assert events.events == []
