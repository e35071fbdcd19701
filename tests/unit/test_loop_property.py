"""Property: random model answers never crash the loop, and it always leaves a history that resumes.

The model answers with unknown tools, hostile inputs, asks, empty turns, costs and two-phase tools,
under random budgets, step limits, finish notes, image and cache options. Every run must end with a
`stopped_by`, every tool call answered once (except a held ask), at most 4 cache breakpoints per
request, and a rerun over the same journal must replay without a call and return the same result
and events.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from loop_kit import Exploding, Recorder, ask_tool, options, read_frame, render

from toolloop import (
    AbortController,
    AssistantMessage,
    Budget,
    MemoryJournal,
    PromptGenRequest,
    PromptGenResult,
    ToolCall,
    ToolMessage,
    run_tool_loop,
)
from toolloop.testing import reply

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
shot_inputs = st.one_of(
    st.fixed_dictionaries({"shot": st.integers(0, 9)}),
    st.fixed_dictionaries({"shot": st.floats(0, 9), "take": st.integers(0, 3)}),
    json_values,
)
ask_inputs = st.one_of(
    st.fixed_dictionaries({"question": st.text(max_size=10)}), json_values
)
calls = st.one_of(
    st.tuples(st.sampled_from(["read_frame", "render"]), shot_inputs),
    st.tuples(st.just("ask"), ask_inputs),
    st.tuples(st.sampled_from(["zoom", "", "ASK"]), json_values),
)
turns = st.lists(
    st.tuples(
        st.sampled_from(["", "Looking.", "Done."]),
        st.sampled_from([0.0, 0.01, 0.2, 0.5]),
        st.lists(calls, max_size=3),
    ),
    max_size=8,
)
settings_ = st.fixed_dictionaries(
    {
        "budget": st.builds(
            Budget,
            usd=st.sampled_from([0.0, 0.3, 1.0, 5.0]),
            finish_at=st.sampled_from([0.0, 0.5, 1.0]),
            spent_usd=st.sampled_from([0.0, 0.1]),
        ),
        "max_steps": st.integers(0, 9),
        "finish_note": st.sampled_from([None, "Finish now."]),
        "keep_images": st.sampled_from([None, -1, 0, 1, 2]),
        "cache": st.sampled_from(["off", "system", "conversation"]),
    }
)
abort_after = st.one_of(st.none(), st.integers(1, 5))
"""Abort the run's signal right after this many events (None: never)."""


class AbortingRecorder(Recorder):
    def __init__(self, after: int | None) -> None:
        super().__init__()
        self.after = after
        self.controller = AbortController()

    def __call__(self, event: Any) -> None:
        super().__call__(event)
        if len(self.events) == self.after:
            self.controller.abort("test")


class RandomModel:
    """Answers from the drawn turns (unique call ids), then with text only."""

    def __init__(self, drawn: list[tuple[str, float, list[tuple[str, Any]]]]) -> None:
        self.turns = [
            PromptGenResult(
                text=text,
                cost_usd=cost,
                tool_calls=[
                    ToolCall(id=f"t{t}c{i}", name=name, input=value)
                    for i, (name, value) in enumerate(cs)
                ],
            )
            for t, (text, cost, cs) in enumerate(drawn)
        ]
        self.requests: list[PromptGenRequest] = []

    async def __call__(self, request: PromptGenRequest, signal: Any) -> PromptGenResult:
        self.requests.append(request)
        index = len(self.requests) - 1
        return self.turns[index] if index < len(self.turns) else reply("The end.")


def breakpoints(request: PromptGenRequest) -> int:
    parts = [
        p
        for m in request.messages or []
        if isinstance(m.content, list)
        for p in m.content
    ]
    return sum(1 for p in parts if getattr(p, "cache", False)) + (
        1 if request.cache_system else 0
    )


def check_history(messages: list[Any], stopped_by: str, asked_open: int) -> None:
    open_ids: list[str] = []
    answered: set[str] = set()
    for message in messages:
        if isinstance(message, AssistantMessage):
            assert not open_ids, (
                f"calls {open_ids} left open before the next model turn"
            )
            open_ids = [c.id for c in message.tool_calls or []]
        elif isinstance(message, ToolMessage):
            assert message.tool_call_id in open_ids, (
                "an answer to a call that is not open"
            )
            assert message.tool_call_id not in answered, "a call answered twice"
            open_ids.remove(message.tool_call_id)
            answered.add(message.tool_call_id)
    assert len(open_ids) == asked_open, (stopped_by, open_ids)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=turns, opts=settings_, after=abort_after)
def test_random_answers_never_crash_and_always_resume(
    drawn: Any, opts: dict[str, Any], after: int | None
) -> None:
    asyncio.run(_check(drawn, opts, after))


async def _check(drawn: Any, opts: dict[str, Any], after: int | None = None) -> None:
    journal = MemoryJournal()
    model = RandomModel(drawn)
    tools = [
        read_frame(cost=0.05, image=True),
        render(cost=0.1, estimate=0.2),
        ask_tool(),
    ]
    recorder = AbortingRecorder(after)
    result = await run_tool_loop(
        options(
            model,
            journal,
            tools=tools,
            on_step=recorder,
            signal=recorder.controller.signal,
            **opts,
        )
    )
    assert result.stopped_by in {"done", "budget", "steps", "cancel", "asked"}
    event(f"stopped by {result.stopped_by}")
    assert result.steps == len(model.requests) <= opts["max_steps"]
    assert (result.asked is not None) == (result.stopped_by == "asked")
    check_history(
        result.messages, result.stopped_by, 1 if result.stopped_by == "asked" else 0
    )
    assert all(breakpoints(r) <= 4 for r in model.requests)
    assert result.spent_usd >= opts["budget"].spent_usd

    # The rerun replays every journaled step; a budget stop journaled nothing, so its check (a pure
    # estimate) runs again and stops at the same place.
    exploding = Exploding()
    quiet = [
        t.model_copy(
            update={k: exploding for k in ("run", "start", "wait") if getattr(t, k)}
        )
        for t in tools
    ]
    # a cancel at the same point replays to the same stop
    replayed_events = AbortingRecorder(after)
    replayed = await run_tool_loop(
        options(
            exploding,
            journal,
            tools=quiet,
            on_step=replayed_events,
            signal=replayed_events.controller.signal,
            **opts,
        )
    )
    assert exploding.calls == 0
    assert replayed == result
    assert replayed_events.events == recorder.events
