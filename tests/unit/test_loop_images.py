"""Tool images older than the last `keep_images` assistant turns are dropped from requests (SPEC 2.8)."""

from __future__ import annotations

from typing import Any

from loop_kit import read_frame, run

from toolloop import ImagePart, PromptGenRequest, TextPart, ToolMessage, UserMessage
from toolloop.testing import ScriptedModel, call, reply


def turns(count: int) -> list[Any]:
    return [
        *(
            reply(tool_calls=[call("read_frame", {"shot": t}, id=f"c{t}")])
            for t in range(1, count + 1)
        ),
        reply("done"),
    ]


def tool_images(request: PromptGenRequest) -> list[str]:
    """The call ids whose tool message still sends an image."""
    return [
        m.tool_call_id
        for m in request.messages or []
        if isinstance(m, ToolMessage)
        and any(isinstance(p, ImagePart) for p in m.content)
    ]


async def test_keep_two_drops_older_tool_images_in_requests_only() -> None:
    model = ScriptedModel(turns(4))
    result, _ = await run(model, tools=[read_frame(image=True)], cache="off")
    assert [tool_images(r) for r in model.requests] == [
        [],
        ["c1"],
        ["c1", "c2"],
        ["c2", "c3"],
        ["c3", "c4"],
    ]
    dropped = (model.requests[4].messages or [])[2]
    assert dropped == ToolMessage(
        tool_call_id="c1",
        content=[TextPart(text="frame 1"), TextPart(text="[image dropped: shot1.png]")],
    )
    assert (model.requests[3].messages or [])[
        2
    ] == dropped  # the replaced form never changes
    kept = [m for m in result.messages if isinstance(m, ToolMessage)]
    assert all(isinstance(m.content[1], ImagePart) for m in kept)


async def test_keep_none_keeps_every_image_and_zero_drops_every_one() -> None:
    model = ScriptedModel(turns(3))
    await run(model, tools=[read_frame(image=True)], keep_images=None)
    assert tool_images(model.requests[-1]) == ["c1", "c2", "c3"]
    model = ScriptedModel(turns(3))
    await run(model, tools=[read_frame(image=True)], keep_images=0)
    assert [tool_images(r) for r in model.requests] == [[], [], [], []]
    model = ScriptedModel(turns(3))
    await run(model, tools=[read_frame(image=True)], keep_images=-1)
    assert [tool_images(r) for r in model.requests] == [[], [], [], []]


async def test_user_images_are_never_dropped() -> None:
    image = ImagePart(path="C:/boards/board.png", mime_type="image/png", hash="cd")
    given = [UserMessage(content=[TextPart(text="Review this."), image])]
    model = ScriptedModel(turns(3))
    await run(
        model,
        tools=[read_frame(image=True)],
        keep_images=0,
        messages=given,
        cache="off",
    )
    assert (model.requests[-1].messages or [])[0].content == [
        TextPart(text="Review this."),
        image,
    ]
