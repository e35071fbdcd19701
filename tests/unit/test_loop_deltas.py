"""Streaming deltas through the loop and the facade (SPEC 4.3): deltas reach on_step in order and
stamped with their step, the step's ModelEvent follows them, a replay emits none, a generate without
`on_delta` is called as before, and a failed or fallen-back answer's deltas are discarded."""

from __future__ import annotations

from typing import Any

import pytest
from loop_kit import options, read_frame, run

from toolloop import (
    AbortSignal,
    DeltaEvent,
    MemoryJournal,
    ModelEvent,
    PromptGen,
    PromptGenError,
    PromptGenRequest,
    PromptGenResult,
    ReasoningBlock,
    run_tool_loop,
)
from toolloop.contract import OnDelta
from toolloop.testing import ScriptedModel, call, reply


def script() -> ScriptedModel:
    thought = ReasoningBlock(
        provider="anthropic",
        type="thinking",
        data={"type": "thinking", "thinking": "Look at it first.", "signature": "sig"},
    )
    return ScriptedModel(
        [
            reply(
                "Reading the frame.",
                tool_calls=[call("read_frame", {"shot": 3}, id="c1")],
            ),
            reply("Shot 3 is fine.", reasoning=[thought]),
        ],
        stream=True,
    )


async def test_deltas_reach_on_step_in_order_before_their_model_event() -> None:
    result, events = await run(script(), tools=[read_frame()])
    assert result.final_text == "Shot 3 is fine."
    kinds = [(e.kind, getattr(e, "step", None)) for e in events.events]
    assert kinds == [
        ("delta", 1),
        ("delta", 1),
        ("delta", 1),
        ("model", 1),
        ("tool", 1),
        *[("delta", 2)] * 8,
        ("model", 2),
    ]
    deltas = [e for e in events.events if isinstance(e, DeltaEvent)]
    assert "".join(d.text for d in deltas if d.step == 1) == "Reading the frame."
    assert (
        "".join(d.text for d in deltas if d.step == 2 and d.thinking)
        == "Look at it first."
    )
    assert (
        "".join(d.text for d in deltas if d.step == 2 and not d.thinking)
        == "Shot 3 is fine."
    )
    models = [e for e in events.events if isinstance(e, ModelEvent)]
    assert [m.text for m in models] == ["Reading the frame.", "Shot 3 is fine."]


async def test_a_replayed_step_emits_no_deltas() -> None:
    journal = MemoryJournal()
    await run(script(), journal, tools=[read_frame()])
    result, events = await run(script(), journal, tools=[read_frame()])
    assert result.final_text == "Shot 3 is fine."
    assert events.kinds() == ["model", "tool", "model"]
    assert not any('"delta"' in stored for stored in journal.entries.values())


async def test_a_generate_without_on_delta_is_called_as_before() -> None:
    seen: list[tuple[Any, ...]] = []

    async def generate(
        request: PromptGenRequest, signal: AbortSignal
    ) -> PromptGenResult:
        seen.append((request, signal))
        return reply("Done.")

    result, events = await run(generate)
    assert (
        result.final_text == "Done." and len(seen) == 1 and events.kinds() == ["model"]
    )


async def test_without_on_step_no_on_delta_is_passed() -> None:
    passed: list[object] = []

    async def generate(
        request: PromptGenRequest, signal: AbortSignal, on_delta: OnDelta | None = None
    ) -> Any:
        passed.append(on_delta)
        return reply("Done.")

    await run_tool_loop(options(generate))
    assert passed == [None]


async def test_a_failed_call_after_deltas_is_followed_by_a_discard() -> None:
    async def generate(
        request: PromptGenRequest, signal: AbortSignal, on_delta: OnDelta | None = None
    ) -> Any:
        assert on_delta is not None
        on_delta(DeltaEvent(text="Half an ans"))
        raise PromptGenError("the stream broke\n  Try again.")

    events: list[Any] = []
    with pytest.raises(PromptGenError):
        await run_tool_loop(options(generate, on_step=events.append))
    assert events == [
        DeltaEvent(step=1, text="Half an ans"),
        DeltaEvent(step=1, discard=True),
    ]


class Streaming:
    """A handler that streams `text` word by word, then fails with `error` (when set)."""

    def __init__(self, text: str, error: BaseException | None = None) -> None:
        self.text, self.error = text, error

    def estimate(self, request: PromptGenRequest) -> float:
        return 0.0

    async def execute(
        self,
        request: PromptGenRequest,
        signal: AbortSignal,
        on_delta: OnDelta | None = None,
    ) -> PromptGenResult:
        if on_delta is not None:
            for word in self.text.split(" "):
                on_delta(DeltaEvent(text=word))
        if self.error is not None:
            raise self.error
        return PromptGenResult(text=self.text.replace(" ", ""))


class Whole:
    """A handler written before streaming: `execute(request, signal)` only."""

    def estimate(self, request: PromptGenRequest) -> float:
        return 0.0

    async def execute(
        self, request: PromptGenRequest, signal: AbortSignal
    ) -> PromptGenResult:
        return PromptGenResult(text="whole")


async def test_the_facade_discards_the_deltas_of_a_provider_it_falls_back_from() -> (
    None
):
    overloaded = PromptGenError(
        "overloaded\n  Try again later.", status=529, retryable=True
    )
    gen = PromptGen(
        {"a": Streaming("x y", overloaded), "b": Streaming("b c")}, "a", ["b"]
    )
    got: list[DeltaEvent] = []
    result = await gen.generate(PromptGenRequest(prompt="Hi"), on_delta=got.append)
    assert result.text == "bc" and result.meta == {
        "provider": "b",
        "fallback_from": [{"provider": "a", "reason": "HTTP 529"}],
    }
    assert got == [
        DeltaEvent(text="x"),
        DeltaEvent(text="y"),
        DeltaEvent(discard=True),
        DeltaEvent(text="b"),
        DeltaEvent(text="c"),
    ]


async def test_the_facade_calls_a_handler_without_on_delta_as_before() -> None:
    gen = PromptGen({"w": Whole()}, "w")
    got: list[DeltaEvent] = []
    result = await gen.as_generate()(
        PromptGenRequest(prompt="Hi"), AbortSignal(), on_delta=got.append
    )
    assert result.text == "whole" and got == []
