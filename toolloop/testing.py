"""A scripted model for tests and examples: a `generate` that answers from a list of turns.

    model = ScriptedModel([
        reply(tool_calls=[call("read_frame", {"shot": 3})], cost_usd=0.01),
        reply("Shot 3 is fine."),
    ])
    await run_tool_loop(RunToolLoopOptions(generate=model, ...))
    assert model.calls == 2 and model.requests[1].messages[-1].role == "tool"

`reply` also takes `finish_reason`, `meta` and `reasoning`, to script the stops of SPEC 4.2:
`reply(finish_reason="refusal", meta={"category": "cyber"})`, a `paused` turn, or a `length` answer
whose last tool call was cut off.

A turn is a `PromptGenResult`, a dict in its shape, or a callable `(request) -> turn` (to answer from
what the request holds). Running past the script raises `AssertionError` unless `repeat_last=True`.
With `stream=True` it streams as a provider does (SPEC 4.3): each answer's thinking text (reasoning
blocks of type `thinking`), then its text, go to `on_delta` word by word before it returns.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

from toolloop.abort import AbortSignal
from toolloop.contract import (
    DeltaEvent,
    FinishReason,
    OnDelta,
    PromptGenRequest,
    PromptGenResult,
    PromptGenUsage,
    ReasoningBlock,
    ToolCall,
)

Turn = (
    PromptGenResult
    | dict[str, Any]
    | Callable[[PromptGenRequest], "PromptGenResult | dict[str, Any]"]
)

_ids = itertools.count(1)


def call(name: str, input: Any = None, id: str | None = None) -> ToolCall:
    """A tool call; the id is unique in this process when not given."""
    return ToolCall(
        id=id or f"call_{next(_ids)}", name=name, input={} if input is None else input
    )


def reply(
    text: str = "",
    *,
    tool_calls: Sequence[ToolCall] = (),
    cost_usd: float = 0.0,
    usage: PromptGenUsage | None = None,
    finish_reason: FinishReason | None = None,
    meta: dict[str, Any] | None = None,
    reasoning: Sequence[ReasoningBlock] | None = None,
) -> PromptGenResult:
    """A model answer: text and/or tool calls, with its cost. `finish_reason` defaults to
    `tool_calls` when there are calls, else `stop`."""
    return PromptGenResult(
        text=text,
        tool_calls=list(tool_calls),
        cost_usd=cost_usd,
        finish_reason=finish_reason or ("tool_calls" if tool_calls else "stop"),
        usage=usage or PromptGenUsage(),
        meta=meta,
        reasoning=list(reasoning) if reasoning is not None else None,
    )


class ScriptedModel:
    """A `generate` callable. `requests` holds every request it received; `calls` counts them."""

    def __init__(
        self, turns: Sequence[Turn], *, repeat_last: bool = False, stream: bool = False
    ) -> None:
        self.turns = list(turns)
        self.repeat_last = repeat_last
        self.stream = stream
        self.requests: list[PromptGenRequest] = []

    @property
    def calls(self) -> int:
        return len(self.requests)

    async def __call__(
        self,
        request: PromptGenRequest,
        signal: AbortSignal,
        on_delta: OnDelta | None = None,
    ) -> PromptGenResult:
        result = self.answer(request, signal)
        if self.stream and on_delta is not None:
            for block in result.reasoning or []:
                if block.type == "thinking" and isinstance(
                    block.data.get("thinking"), str
                ):
                    for piece in words(block.data["thinking"]):
                        on_delta(DeltaEvent(text=piece, thinking=True))
            for piece in words(result.text):
                on_delta(DeltaEvent(text=piece))
        return result

    def answer(self, request: PromptGenRequest, signal: AbortSignal) -> PromptGenResult:
        signal.throw_if_aborted()
        index = len(self.requests)
        self.requests.append(request)
        if index >= len(self.turns):
            if not (self.repeat_last and self.turns):
                raise AssertionError(
                    f"ScriptedModel was called {index + 1} times but has {len(self.turns)} turns.\n"
                    "  Add turns to the script, or pass repeat_last=True."
                )
            index = len(self.turns) - 1
        turn = self.turns[index]
        if callable(turn):
            turn = turn(request)
        if isinstance(turn, PromptGenResult):
            return turn
        return PromptGenResult.model_validate(turn)


def words(text: str) -> list[str]:
    """`text` in pieces that join back to it: each word with the spaces before it."""
    pieces: list[str] = []
    for index, word in enumerate(text.split(" ")):
        pieces.append(word if index == 0 else " " + word)
    return [piece for piece in pieces if piece]
