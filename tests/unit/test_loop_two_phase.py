"""Two-phase tools (SPEC 2.4): start, abort check, wait; a restart after start only waits."""

from __future__ import annotations

import json
from typing import Any

import pytest
from loop_kit import Counter, render, run

from toolloop import (
    AbortController,
    Budget,
    MemoryJournal,
    TextPart,
    ToolEvent,
    ToolMessage,
)
from toolloop.testing import ScriptedModel, call, reply


def render_turn(*ids: str) -> Any:
    return reply(tool_calls=[call("render", {"shot": 2}, id=i) for i in ids])


async def test_start_and_wait_are_two_steps_with_their_values() -> None:
    journal = MemoryJournal()
    counter = Counter()
    model = ScriptedModel([render_turn("r1"), reply("Rendered.")])
    result, events = await run(model, journal, tools=[render(counter, cost=0.3)])
    assert result.stopped_by == "done"
    assert counter.calls == {"start": 1, "wait": 1}
    assert journal.keys() == ["model:1", "tool:r1:start", "tool:r1:wait", "model:2"]
    assert json.loads(journal.entries["tool:r1:start"]) == {
        "value": {"started": {"job": "job-2"}, "rows": ["row-2"]},
        "cost_usd": 0.0,
    }
    wait = json.loads(journal.entries["tool:r1:wait"])
    assert wait["cost_usd"] == 0.3
    assert wait["value"]["value"] == {"job": "job-2"}
    assert result.messages[2] == ToolMessage(
        tool_call_id="r1", content=[TextPart(text="rendered job-2")]
    )
    assert result.spent_usd == pytest.approx(0.3)
    tool_events = [e for e in events.events if isinstance(e, ToolEvent)]
    assert tool_events == [
        ToolEvent(
            step=1,
            name="render",
            call_id="r1",
            cost_usd=0.3,
            summary="rendered job-2",
            rows=["row-2"],
        )
    ]


async def test_restart_after_start_only_waits() -> None:
    journal = MemoryJournal()
    counter = Counter()
    tool = render(counter)

    async def crash(started: Any, signal: Any) -> Any:
        raise ConnectionError("lost the render farm")

    with pytest.raises(ConnectionError):
        await run(
            ScriptedModel([render_turn("r1")]),
            journal,
            tools=[tool.model_copy(update={"wait": crash})],
        )
    assert journal.keys() == ["model:1", "tool:r1:start"]
    result, _ = await run(ScriptedModel([reply("Rendered.")]), journal, tools=[tool])
    assert result.stopped_by == "done"
    assert counter.calls == {"start": 1, "wait": 1}


async def test_cancel_between_the_halves_answers_not_run() -> None:
    controller = AbortController()
    counter = Counter()
    tool = render(counter)
    original_start = tool.start
    assert original_start is not None

    async def start_then_cancel(input: Any, signal: Any) -> Any:
        started = await original_start(input, signal)
        controller.abort("user pressed stop")
        return started

    model = ScriptedModel([render_turn("r1", "r2")])
    journal = MemoryJournal()
    result, events = await run(
        model,
        journal,
        tools=[tool.model_copy(update={"start": start_then_cancel})],
        signal=controller.signal,
    )
    assert result.stopped_by == "cancel"
    assert counter.calls == {"start": 1}
    assert journal.keys() == ["model:1", "tool:r1:start"]
    assert result.messages[-2:] == [
        ToolMessage(tool_call_id="r1", content="Not run: cancel."),
        ToolMessage(tool_call_id="r2", content="Not run: cancel."),
    ]
    assert events.kinds() == ["model"]


async def test_wait_half_never_checks_the_budget() -> None:
    journal = MemoryJournal()
    outside = {"usd": 0.0}
    counter = Counter()
    tool = render(counter, estimate=0.5)
    budget = Budget(usd=1.0, spent=lambda: outside["usd"])

    def start_then_spend(input: Any, signal: Any) -> Any:
        outside["usd"] = 0.9  # other work spends while ours runs
        return {"started": "h1"}

    async def wait(started: Any, signal: Any) -> Any:
        counter.hit("wait")
        return {"content": [{"type": "text", "text": f"got {started}"}]}

    model = ScriptedModel([render_turn("r1"), reply("Rendered.")])
    result, _ = await run(
        model,
        journal,
        budget=budget,
        tools=[tool.model_copy(update={"start": start_then_spend, "wait": wait})],
    )
    assert counter.calls == {"wait": 1}
    assert result.messages[2] == ToolMessage(
        tool_call_id="r1", content=[TextPart(text="got h1")]
    )
    # 0.9 + the estimate 0.5 would have stopped a checked wait
    assert result.stopped_by == "done"


async def test_start_over_the_estimate_never_starts() -> None:
    counter = Counter()
    model = ScriptedModel([render_turn("r1")])
    result, events = await run(
        model, tools=[render(counter, estimate=2.0)], budget=Budget(usd=1.0)
    )
    assert result.stopped_by == "budget"
    assert counter.calls == {}
    assert result.messages[-1] == ToolMessage(
        tool_call_id="r1", content="Not run: budget."
    )
    assert events.kinds() == ["model", "budget"]
