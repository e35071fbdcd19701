"""Hostile tool inputs never crash the loop (property-based), over MemoryJournal and RedisJournal.

The model is the adversary here: it calls known and unknown tools with any value a JSON parser can
produce (json.loads also yields NaN, Infinity and huge integers), huge and nested inputs, NUL bytes,
several asks in one turn. (Lone surrogates, which `\\ud800` escapes also produce, are the providers'
job to turn into valid text: see test_bad_input_provider.py.) Whatever it sends, the loop must
answer every call (the held ask excepted), stop normally, store only what survives the journal, and
replay to the same result.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from toolloop import (
    AssistantMessage,
    Budget,
    MemoryJournal,
    RunToolLoopOptions,
    Started,
    TextPart,
    ToolCall,
    ToolMessage,
    ToolOutput,
    ToolSpec,
    UserMessage,
)
from toolloop.journal.redis import RedisJournal
from toolloop.loop.run import run_tool_loop
from toolloop.testing import ScriptedModel, reply

pytestmark = pytest.mark.faults


class Frame(BaseModel):
    shot: int
    note: str = ""


class Render(BaseModel):
    frames: list[int]
    label: str = "preview"


class Anything(BaseModel):
    data: dict[str, Any]


class Ask(BaseModel):
    question: str


def _frame(item: Frame, _signal: Any) -> ToolOutput:
    return ToolOutput(
        value=item.model_dump(mode="json"),
        content=[TextPart(text=f"shot {item.shot}: {item.note}")],
    )


def _anything(item: Anything, _signal: Any) -> ToolOutput:
    return ToolOutput(
        value=item.data, content=[TextPart(text=json.dumps(item.data)[:300])]
    )


def _start(item: Render, _signal: Any) -> Started:
    return Started(started={"frames": item.frames, "label": item.label})


def _wait(handle: Any, _signal: Any) -> ToolOutput:
    return ToolOutput(
        value=handle, content=[TextPart(text=f"rendered {handle['label']}")]
    )


def _never(*_: Any) -> ToolOutput:
    raise AssertionError("the ask tool is never run")


TOOLS = [
    ToolSpec(name="frame", description="Read a frame.", schema=Frame, run=_frame),
    ToolSpec(
        name="render",
        description="Render a preview.",
        schema=Render,
        start=_start,
        wait=_wait,
    ),
    ToolSpec(
        name="anything", description="Store any data.", schema=Anything, run=_anything
    ),
    ToolSpec(name="ask", description="Ask the person.", schema=Ask, run=_never),
]

# What a JSON parser can hand the loop as a tool input.
hostile_text = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["\x00", "💥" * 50, "x" * 5000, "{", "null", "'; DROP TABLE"]),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    hostile_text,
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(hostile_text, inner, max_size=4)
    ),
    max_leaves=16,
)
shaped_inputs = st.one_of(
    st.fixed_dictionaries({"shot": json_values}, optional={"note": json_values}),
    st.fixed_dictionaries({"frames": json_values}, optional={"label": json_values}),
    st.fixed_dictionaries({"data": json_values}),
    st.fixed_dictionaries({"question": json_values}),
)
tool_names = st.sampled_from(
    ["frame", "render", "anything", "ask", "ask", "Frame", "", "tool:x", "💥"]
)
calls = st.lists(
    st.tuples(tool_names, st.one_of(json_values, shaped_inputs)), min_size=1, max_size=5
)


def _options(turns: list[Any], step: Any) -> RunToolLoopOptions:
    return RunToolLoopOptions(
        generate=ScriptedModel(turns),
        model="sim",
        system="You review storyboards.",
        messages=[UserMessage(content="Review the storyboard.")],
        tools=TOOLS,
        budget=Budget(usd=100.0),
        max_steps=5,
        step=step,
    )


def _script(drawn: list[tuple[str, Any]]) -> list[Any]:
    prefix = uuid.uuid4().hex[:8]
    tool_calls = [
        ToolCall(id=f"call_{prefix}_{i}", name=name, input=value)
        for i, (name, value) in enumerate(drawn)
    ]
    return [reply("Looking.", tool_calls=tool_calls), reply("Done.")]


async def _check(turns: list[Any], make_journal: Any) -> None:
    journal = make_journal()
    result = await run_tool_loop(_options(turns, journal.step))
    assert result.stopped_by in ("done", "asked")
    answered = {m.tool_call_id for m in result.messages if isinstance(m, ToolMessage)}
    opened = [
        c
        for m in result.messages
        if isinstance(m, AssistantMessage)
        for c in m.tool_calls or []
    ]
    unanswered = [c for c in opened if c.id not in answered]
    if result.stopped_by == "asked":
        assert [c.name for c in unanswered] == ["ask"]
    else:
        assert unanswered == []

    # A rerun over the same journal replays: no model call, no tool run, an equal result.
    def boom(*_: Any) -> Any:
        raise AssertionError("a replay must not call the model")

    replay = _options([boom], journal.step)
    again = await run_tool_loop(replay)
    assert again == result


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=calls)
async def test_hostile_inputs_never_crash_the_loop_memory(
    drawn: list[tuple[str, Any]],
) -> None:
    await _check(_script(drawn), MemoryJournal)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(drawn=calls)
async def test_hostile_inputs_never_crash_the_loop_redis(
    drawn: list[tuple[str, Any]], redis_client: redis.Redis
) -> None:
    run_id = f"hostile-{uuid.uuid4().hex[:10]}"
    await _check(_script(drawn), lambda: RedisJournal(redis_client, run_id))
