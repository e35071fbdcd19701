"""Approvals in the loop (SPEC 4.4): held calls, the approval stop, and the resume with decisions."""

from __future__ import annotations

from typing import Any

import pytest
from loop_kit import Counter, Shot, ask_tool, read_frame, run

from toolloop import (
    ApprovalError,
    Decision,
    MemoryJournal,
    TextPart,
    ToolMessage,
    ToolOutput,
    ToolSpec,
    input_digest,
)
from toolloop.testing import ScriptedModel, call, reply


def publish(counter: Counter, needs: Any = True) -> ToolSpec:
    def run_it(input: Shot, signal: Any) -> ToolOutput:
        counter.hit("publish")
        counter.inputs.append(input.shot)
        return ToolOutput(
            value=input.shot, content=[TextPart(text=f"published shot {input.shot:g}")]
        )

    return ToolSpec(
        name="publish",
        description="Publish a shot.",
        schema=Shot,
        run=run_it,
        needs_approval=needs,
        estimate_usd=lambda input: 0.25,
    )


def counter() -> Counter:
    made = Counter()
    made.inputs = []  # type: ignore[attr-defined]
    return made


def texts(message: Any) -> list[str]:
    return [part.text for part in message.content]


async def held(tools: list[ToolSpec], journal: MemoryJournal) -> Any:
    model = ScriptedModel(
        [
            reply(
                tool_calls=[
                    call("publish", {"shot": 3}, id="p1"),
                    call("read_frame", {"shot": 1}, id="r1"),
                ]
            ),
        ]
    )
    result, events = await run(model, journal, tools=tools)
    return result, events


async def test_a_held_call_waits_after_the_other_calls_of_the_turn() -> None:
    c = counter()
    result, events = await held([publish(c), read_frame(c)], MemoryJournal())
    assert result.stopped_by == "approval"
    assert c.calls == {"read_frame": 1}
    [approval] = result.approvals
    assert (approval.call_id, approval.name, approval.input) == (
        "p1",
        "publish",
        {"shot": 3, "take": 1},
    )
    assert (
        approval.input_digest == input_digest({"take": 1.0, "shot": 3.0})
        and approval.estimate_usd == 0.25
    )
    assert [m.tool_call_id for m in result.messages if isinstance(m, ToolMessage)] == [
        "r1"
    ]
    assert events.kinds() == ["model", "tool"]


async def test_a_callable_decides_which_calls_wait() -> None:
    c = counter()
    model = ScriptedModel(
        [
            reply(tool_calls=[call("publish", {"shot": 3}, id="p1")]),
            reply(tool_calls=[call("publish", {"shot": 8}, id="p2")]),
        ]
    )
    result, _ = await run(model, tools=[publish(c, needs=lambda input: input.shot > 5)])
    assert result.stopped_by == "approval" and [
        a.call_id for a in result.approvals
    ] == ["p2"]
    assert c.inputs == [3]  # type: ignore[attr-defined]


async def resume(
    first: Any, decision: Decision, c: Counter, journal: MemoryJournal
) -> Any:
    model = ScriptedModel([reply("ok")])
    result, events = await run(
        model,
        journal,
        tools=[publish(c), read_frame(c)],
        messages=first.messages,
        decisions={"p1": decision},
    )
    return result, events, model


@pytest.mark.parametrize(
    ("decision", "runs", "answer"),
    [
        (Decision(action="approve"), [3], ["published shot 3"]),
        (
            Decision(action="reject", reason="not now"),
            [],
            ["Rejected by the person: not now."],
        ),
        (
            Decision(action="edit", input={"shot": 4}),
            [4],
            [
                'The person edited the input before the tool ran; it ran with: {"shot":4.0,"take":1.0}',
                "published shot 4",
            ],
        ),
    ],
)
async def test_each_decision_reaches_the_model_as_documented(
    decision: Decision, runs: list[float], answer: list[str]
) -> None:
    c = counter()
    first, _ = await held([publish(c), read_frame(c)], MemoryJournal())
    journal = MemoryJournal()
    result, events, model = await resume(first, decision, c, journal)
    assert result.stopped_by == "done"
    assert c.inputs == runs  # type: ignore[attr-defined]
    sent = model.requests[0].messages[-1]
    assert (
        isinstance(sent, ToolMessage)
        and sent.tool_call_id == "p1"
        and texts(sent) == answer
    )
    assert events.kinds() == ["tool", "model"]
    # a replay: the decided step is journaled
    again, _, _ = await resume(first, decision, c, journal)
    assert c.inputs == runs and again.messages == result.messages  # type: ignore[attr-defined]


async def test_a_stale_digest_or_a_bad_edit_is_refused_before_any_work() -> None:
    c = counter()
    first, _ = await held([publish(c), read_frame(c)], MemoryJournal())
    with pytest.raises(ApprovalError, match="another input"):
        await resume(
            first,
            Decision(action="approve", input_digest=input_digest({"shot": 9})),
            c,
            MemoryJournal(),
        )
    with pytest.raises(ApprovalError, match="Input should be a valid number"):
        await resume(
            first, Decision(action="edit", input={"shot": "x"}), c, MemoryJournal()
        )
    assert c.calls == {"read_frame": 1}


async def test_an_ask_in_the_same_turn_wins_over_a_held_approval() -> None:
    c = counter()
    model = ScriptedModel(
        [
            reply(
                tool_calls=[
                    call("publish", {"shot": 3}, id="p1"),
                    call("ask", {"question": "Sure?"}, id="a1"),
                ]
            )
        ]
    )
    result, _ = await run(model, tools=[publish(c), ask_tool()])
    assert result.stopped_by == "asked" and result.approvals is None
    assert result.messages[-1] == ToolMessage(
        tool_call_id="p1", content="Not run: asked."
    )
