"""The Anthropic body as the handler sends it (`encode_body`: each message encoded once per run, the
bytes of the last request reused) is byte for byte the body built from nothing
(`dumps(build_body(...))`), at every turn of long conversations through the real loop: images kept
and trimmed, moving cache marks and the caller's own, thinking blocks of this provider and of
another, tool results, blank texts, 1-hour marks, streamed or not; and where orjson refuses a value."""

from __future__ import annotations

import base64
import contextvars
from typing import Any

import pytest
from loop_kit import options, read_frame
from providers_kit import validate_anthropic_body

from toolloop import (
    AssistantMessage,
    ImagePart,
    MemoryJournal,
    PromptGenRequest,
    ReasoningBlock,
    TextPart,
    ToolCall,
    ToolMessage,
    UserMessage,
    run_tool_loop,
)
from toolloop.fastjson import dumps, loads
from toolloop.memo import RunMemo, run_memo
from toolloop.providers.anthropic import encode
from toolloop.providers.anthropic.encode import encode_body
from toolloop.providers.anthropic.request import body_frame, build_body
from toolloop.providers.common import image_parts
from toolloop.testing import ScriptedModel, call, reply

MODEL = "claude-sonnet-5-5"
THINKING = {
    "type": "thinking",
    "thinking": "Shot 3 first — “quoted”.\n",
    "signature": "EqQBCkgIARAB" * 4,
}
REDACTED = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"}


def image_bytes(request: PromptGenRequest, call_number: int) -> dict[str, str]:
    """Each image's base64 text; it changes from call to call, as a file rewritten in place would."""
    return {
        part.path: base64.b64encode(f"{part.path}#{call_number}".encode()).decode()
        for part in image_parts(request)
    }


class Checking(ScriptedModel):
    """Compares, at each call, the body the handler would send with the body built from nothing."""

    def __init__(self, turns: list[Any], reasoning: Any = None) -> None:
        super().__init__(turns)
        self.reasoning = reasoning
        self.sent: list[bytes] = []

    def answer(self, request: PromptGenRequest, signal: Any) -> Any:
        images = image_bytes(request, len(self.requests))
        stream = len(self.requests) % 2 == 1
        assert run_memo.get() is not None
        frame = body_frame(request, model=MODEL, reasoning=self.reasoning)
        if stream:
            frame["stream"] = True
        got = encode_body(request, frame, images)
        bare = contextvars.copy_context()
        bare.run(run_memo.set, None)
        want = build_body(request, model=MODEL, reasoning=self.reasoning, images=images)
        if stream:
            want["stream"] = True
        assert got == dumps(want), f"call {len(self.requests) + 1}"
        frame = body_frame(request, model=MODEL, reasoning=self.reasoning) | (
            {"stream": True} if stream else {}
        )
        # without a memo too
        assert got == bare.run(encode_body, request, frame, images)
        validate_anthropic_body(loads(got))
        memo = run_memo.get()
        assert memo is not None and memo.wire is not None
        kept = bytes(memo.wire.body)
        # no image bytes between calls
        assert not any(data.encode() in kept for data in images.values())
        self.sent.append(got)
        return super().answer(request, signal)


def turn_script(turns: int) -> list[Any]:
    """Answers that vary what a turn holds: thinking (this provider's and another's), text or none,
    one or two calls, an input holding floats and unicode."""
    script: list[Any] = []
    for n in range(1, turns + 1):
        reasoning = None
        if n % 3 == 1:
            reasoning = [
                ReasoningBlock(provider="anthropic", type="thinking", data=THINKING)
            ]
        elif n % 3 == 2:
            reasoning = [
                ReasoningBlock(
                    provider="anthropic", type="redacted_thinking", data=REDACTED
                ),
                ReasoningBlock(
                    provider="fal", type="reasoning", data={"text": "theirs"}
                ),
            ]
        calls = [
            call(
                "read_frame",
                {"shot": n, "take": 1e16 if n % 4 == 0 else 0.5},
                id=f"c{n}",
            )
        ]
        if n % 5 == 0:
            calls.append(call("read_frame", {"shot": n + 100}, id=f"d{n}"))
        text = "" if n % 4 == 3 else f"Shot {n} — “next”."
        script.append(reply(text, tool_calls=calls, reasoning=reasoning))
    script.append(reply("All reviewed."))
    return script


def given_history() -> list[Any]:
    """A resumed conversation: every kind of message and part the body maps, before the loop's turns."""
    image = ImagePart(path="/boards/board.png", mime_type="image/png", hash="cd")
    return [
        UserMessage(content="Review the cut."),
        UserMessage(
            content=[
                TextPart(text="Mind the door.", cache=True),
                image,
                TextPart(text="  "),
            ]
        ),
        AssistantMessage(
            content="Reading shot 1.",
            tool_calls=[ToolCall(id="g1", name="read_frame", input={"shot": 1})],
            reasoning=[
                ReasoningBlock(provider="anthropic", type="thinking", data=THINKING)
            ],
        ),
        ToolMessage(
            tool_call_id="g1",
            content=[
                TextPart(text="frame 1"),
                ImagePart(path="/frames/g1.png", mime_type="image/png", hash="ab"),
            ],
        ),
        UserMessage(content="   "),
        AssistantMessage(
            content=None, tool_calls=[ToolCall(id="g2", name="read_frame", input=None)]
        ),
        ToolMessage(tool_call_id="g2", content=""),
        UserMessage(content=[TextPart(text="Keep going.")]),
    ]


@pytest.mark.parametrize(
    ("cache", "keep_images", "ttl", "given"),
    [
        ("conversation", 2, "5m", False),
        ("conversation", 2, "1h", True),
        ("conversation", None, "5m", True),
        ("conversation", 0, "1h", False),
        ("system", 2, "5m", True),
        ("off", 1, "5m", True),
    ],
)
async def test_the_sent_body_is_the_body_built_from_nothing_at_every_turn(
    cache: str, keep_images: int | None, ttl: str, given: bool
) -> None:
    turns = 24
    model = Checking(turn_script(turns), reasoning="low")
    extra: dict[str, Any] = {"messages": given_history()} if given else {}
    result = await run_tool_loop(
        options(
            model,
            MemoryJournal(),
            tools=[read_frame(image=True)],
            cache=cache,
            keep_images=keep_images,
            cache_ttl=ttl,
            max_steps=turns + 1,
            **extra,
        )
    )
    assert result.stopped_by == "done"
    assert len(model.sent) == turns + 1
    if ttl == "1h" and cache != "off":
        assert b'"ttl":"1h"' in model.sent[-1]
    if keep_images is not None:
        assert b"[image dropped: shot1.png]" in model.sent[-1]


async def test_each_call_encodes_only_what_the_last_request_did_not_send(
    monkeypatch: Any,
) -> None:
    encoded: list[int] = []
    real = encode.message_blocks

    def counting(message: Any, images: Any, ttl: Any) -> Any:
        # not the checks' builds without the memo
        encoded[-1] += run_memo.get() is not None
        return real(message, images, ttl)

    monkeypatch.setattr(encode, "message_blocks", counting)

    class Counting(Checking):
        def answer(self, request: PromptGenRequest, signal: Any) -> Any:
            encoded.append(0)
            return super().answer(request, signal)

    script = [
        reply(tool_calls=[call("read_frame", {"shot": t}, id=f"c{t}")])
        for t in range(1, 13)
    ]
    model = Counting([*script, reply("done")])
    await run_tool_loop(
        options(model, MemoryJournal(), tools=[read_frame()], max_steps=14)
    )
    # each call after the first: the new assistant and tool message, and the message whose mark was
    # taken off (the mark's copy is the new tool message), not the 2 + 2 t messages of the request
    assert encoded[0] == 1 and max(encoded[1:]) <= 3, encoded


async def test_the_memo_is_the_runs_own_and_ends_with_it() -> None:
    memos: list[RunMemo | None] = []

    class Keeping(Checking):
        def answer(self, request: PromptGenRequest, signal: Any) -> Any:
            memos.append(run_memo.get())
            return super().answer(request, signal)

    for _ in range(2):
        model = Keeping(
            [
                reply(tool_calls=[call("read_frame", {"shot": 1}, id="c1")]),
                reply("done"),
            ]
        )
        await run_tool_loop(options(model, MemoryJournal(), tools=[read_frame()]))
    assert memos[0] is memos[1] and memos[2] is memos[3] and memos[0] is not memos[2]
    assert run_memo.get() is None


def request_of(messages: list[Any], **fields: Any) -> PromptGenRequest:
    return PromptGenRequest(
        model=MODEL, system="You review storyboards.", messages=messages, **fields
    )


def both(request: PromptGenRequest, memo: RunMemo | None = None) -> tuple[bytes, bytes]:
    """The bytes encode_body gives (with `memo` as the run's) and those of the body built from nothing."""
    token = run_memo.set(memo)
    try:
        got = encode_body(request, body_frame(request, model=MODEL, reasoning=None), {})
    finally:
        run_memo.reset(token)
    return got, dumps(build_body(request, model=MODEL, reasoning=None, images={}))


def nested(depth: int) -> Any:
    value: Any = 1.5e-7
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    "input", [{"big": 2**70, "f": 1e16}, {"nan": float("nan"), "f": 1e-7}]
)
def test_values_orjson_refuses_or_writes_its_own_way_give_the_same_bytes(
    input: Any,
) -> None:
    memo = RunMemo(replays=False)
    history = [
        UserMessage(content="Review."),
        AssistantMessage(
            content="A.",
            tool_calls=[ToolCall(id="c1", name="read_frame", input={"f": 1e16})],
        ),
        ToolMessage(tool_call_id="c1", content="frame 1"),
    ]
    got, want = both(request_of(history), memo)
    assert got == want
    history += [
        AssistantMessage(
            content="B.", tool_calls=[ToolCall(id="c2", name="read_frame", input=input)]
        ),
        ToolMessage(tool_call_id="c2", content="frame 2"),
    ]
    got, want = both(request_of(history), memo)
    assert got == want
    if (
        "big" in input
    ):  # the whole body written by the exact fallback, the earlier turn's float too
        assert b"1e+16" in got and str(2**70).encode() in got


def test_nesting_around_orjsons_depth_limit_gives_the_same_bytes() -> None:
    outcomes = set()
    for depth in range(240, 256):
        history = [
            UserMessage(content="Review."),
            AssistantMessage(
                tool_calls=[ToolCall(id="c1", name="read_frame", input=nested(depth))]
            ),
            ToolMessage(tool_call_id="c1", content="frame 1"),
        ]
        got, want = both(request_of(history), RunMemo(replays=False))
        assert got == want, depth
        # the exact fallback writes the float the standard library's way
        outcomes.add(b"1.5e-07" in got)
    # the range holds depths orjson takes and depths it refuses
    assert outcomes == {
        True,
        False,
    }


def test_a_new_ttl_or_a_list_changed_in_place_reuses_nothing_stale() -> None:
    memo = RunMemo(replays=False)
    messages: list[Any] = [
        UserMessage(content=[TextPart(text="Review.", cache=True)]),
        AssistantMessage(
            content="A.", tool_calls=[ToolCall(id="c1", name="read_frame", input={})]
        ),
        ToolMessage(tool_call_id="c1", content=[TextPart(text="frame 1", cache=True)]),
    ]
    for params in (None, {"cache_ttl": "1h"}, None):
        got, want = both(request_of(messages, params=params), memo)
        assert got == want
    # a request made without validation holds the caller's own list, which the caller then changes
    held = request_of(messages).model_copy(update={"messages": messages})
    assert both(held, memo)[0] == both(held)[1]
    messages[2] = ToolMessage(tool_call_id="c1", content="frame 1, again")
    got, want = both(held, memo)
    assert got == want and b"again" in got
    messages.insert(1, UserMessage(content="Also shot 2."))
    got, want = both(held, memo)
    assert got == want


def test_a_prompt_and_no_messages() -> None:
    got, want = both(
        PromptGenRequest(model=MODEL, prompt="Name the shot."), RunMemo(replays=False)
    )
    assert got == want
