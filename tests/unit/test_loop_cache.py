"""Prompt-cache marks of each request (SPEC 2.9)."""

from __future__ import annotations

from typing import Any

import pytest
from loop_kit import options, read_frame, run

from toolloop import (
    AssistantMessage,
    MemoryJournal,
    PromptGenRequest,
    TextPart,
    ToolMessage,
    UserMessage,
    run_tool_loop,
)
from toolloop.testing import ScriptedModel, call, reply


def turns(count: int) -> list[Any]:
    return [
        *(
            reply(tool_calls=[call("read_frame", {"shot": t}, id=f"c{t}")])
            for t in range(1, count + 1)
        ),
        reply("done"),
    ]


def marks(request: PromptGenRequest) -> list[int]:
    """Indices of the messages that carry a mark."""
    return [
        i
        for i, m in enumerate(request.messages or [])
        if not isinstance(m.content, str)
        and m.content
        and any(getattr(p, "cache", False) for p in m.content)
    ]


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


async def test_rolling_marks_of_every_request_without_images() -> None:
    model = ScriptedModel(turns(5))
    result, _ = await run(model, keep_images=None)
    assert all(r.cache_system is True for r in model.requests)
    # request n marks the newest tool message and the one the request before marked
    assert [marks(r) for r in model.requests] == [
        [0],
        [0, 2],
        [2, 4],
        [4, 6],
        [6, 8],
        [8, 10],
    ]
    first = (model.requests[0].messages or [])[0]
    assert first == UserMessage(content=[TextPart(text="Review shot 3.", cache=True)])
    # marks only on copies
    assert result.messages[0] == UserMessage(content="Review shot 3.")
    assert all(
        not getattr(p, "cache", False)
        for m in result.messages
        if isinstance(m.content, list)
        for p in m.content
    )


async def test_rolling_marks_skip_tool_images_this_run_may_still_drop() -> None:
    # max_steps 6, no assistant given: max_assistants 5; with keep_images 2 a tool message with at
    # most 3 assistant messages before it may lose its image, so it is not stable while it has one.
    model = ScriptedModel(turns(5))
    await run(model, tools=[read_frame(image=True)], max_steps=6)
    assert [marks(r) for r in model.requests] == [
        [0],
        [0],
        [0],
        [0, 2],
        [2, 4],
        [4, 10],
    ]
    fourth = (model.requests[3].messages or [])[2]
    assert fourth == ToolMessage(
        tool_call_id="c1",
        content=[
            TextPart(text="frame 1"),
            TextPart(text="[image dropped: shot1.png]", cache=True),
        ],
    )


async def test_rolling_marks_in_a_long_run_with_images() -> None:
    # max_steps 12: max_assistants 11, so tool messages with at most 9 assistant messages before them
    # are unstable while they keep their image; the last request sees T10 and T11 stable.
    model = ScriptedModel(turns(11))
    await run(model, tools=[read_frame(image=True)], max_steps=12)
    assert [marks(r) for r in model.requests] == [
        [0],
        [0],
        [0],
        [0, 2],
        [2, 4],
        [4, 6],
        [6, 8],
        [8, 10],
        [10, 12],
        [12, 14],
        [14, 16],
        [16, 22],
    ]
    assert all(breakpoints(r) <= 3 for r in model.requests)


async def test_marks_are_the_same_on_a_resumed_run() -> None:
    journal = MemoryJournal()
    crashing = ScriptedModel(turns(2)[:2])
    with pytest.raises(AssertionError):
        await run(crashing, journal, tools=[read_frame(image=True)], max_steps=6)
    resumed = ScriptedModel(turns(2)[2:])
    await run(resumed, journal, tools=[read_frame(image=True)], max_steps=6)
    whole = ScriptedModel(turns(2))
    await run(whole, tools=[read_frame(image=True)], max_steps=6)
    assert resumed.requests[0] == whole.requests[2]


def caller_marked(count: int) -> list[Any]:
    parts = [TextPart(text=f"part {i}", cache=True) for i in range(count)]
    return [UserMessage(content=[*parts, TextPart(text="Review.")])]


@pytest.mark.parametrize(
    ("caller", "system", "first", "second"),
    [
        (0, True, [0], [0, 2]),  # system + two rolling marks
        (1, True, [0], [0, 2]),  # 1 + system + 2 = 4
        (
            2,
            True,
            [0],
            [0, 2],
        ),  # 2 + system + the newer rolling mark (on message 2), older dropped
        (3, True, [0], [0]),  # 3 + system: no room for rolling marks
        (4, None, [0], [0]),  # 4 caller marks: not even the system mark
        (5, None, [0], [0]),  # more than 4: the caller's choice, all kept
    ],
)
async def test_four_breakpoint_limit(
    caller: int, system: bool | None, first: list[int], second: list[int]
) -> None:
    model = ScriptedModel(turns(1))
    await run(model, messages=caller_marked(caller))
    assert [r.cache_system for r in model.requests] == [system, system]
    assert [marks(r) for r in model.requests] == [first, second]
    assert [breakpoints(r) for r in model.requests] == [
        max(caller, min(4, caller + 2)),
        max(caller, min(4, caller + 3)),
    ]
    if caller == 2:
        tool = (model.requests[1].messages or [])[2]
        assert tool.content == [TextPart(text="frame 1", cache=True)]


async def test_rolling_target_the_caller_marked_takes_no_slot() -> None:
    given = [
        UserMessage(
            content=[TextPart(text="a", cache=True), TextPart(text="b", cache=True)]
        )
    ]
    model = ScriptedModel(turns(1))
    await run(model, messages=given)
    # the older target (message 0) ends on a caller mark: system + newer mark + 2 caller = 4
    assert breakpoints(model.requests[1]) == 4
    assert marks(model.requests[1]) == [0, 2]


async def test_blank_and_assistant_messages_are_never_marked() -> None:
    given = [
        UserMessage(content="Review shot 3."),
        AssistantMessage(content="Looking."),
        UserMessage(content=[TextPart(text="  ")]),
    ]
    model = ScriptedModel([reply("ok")])
    await run(model, messages=given)
    assert marks(model.requests[0]) == [0]


async def test_system_and_off_modes() -> None:
    model = ScriptedModel(turns(2))
    await run(model, cache="system", messages=caller_marked(5))
    assert [r.cache_system for r in model.requests] == [True, True, True]
    assert [breakpoints(r) for r in model.requests] == [6, 6, 6]
    model = ScriptedModel(turns(2))
    await run(model, cache="off", messages=caller_marked(1))
    assert [r.cache_system for r in model.requests] == [None, None, None]
    assert [marks(r) for r in model.requests] == [[0], [0], [0]]


async def test_options_messages_keep_no_marks() -> None:
    opts = options(ScriptedModel(turns(2)))
    await run_tool_loop(opts)
    assert opts.messages == [UserMessage(content="Review shot 3.")]
