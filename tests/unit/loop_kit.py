"""Helpers for the loop's unit tests: a few tools, an options builder, an event recorder."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from toolloop import (
    AbortSignal,
    Budget,
    ImagePart,
    LoopEvent,
    MemoryJournal,
    RunToolLoopOptions,
    RunToolLoopResult,
    Started,
    TextPart,
    ToolOutput,
    ToolSpec,
    run_tool_loop,
)
from toolloop.testing import ScriptedModel


class Shot(BaseModel):
    shot: float
    take: float = 1


class Question(BaseModel):
    question: str


class Counter:
    """Counts the calls of each tool callable."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def hit(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1


def read_frame(
    counter: Counter | None = None, cost: float = 0.0, image: bool = False
) -> ToolSpec:
    def run(input: Shot, signal: AbortSignal) -> ToolOutput:
        if counter is not None:
            counter.hit("read_frame")
        content: list[Any] = [TextPart(text=f"frame {input.shot:g}")]
        if image:
            content.append(
                ImagePart(
                    path=f"/frames/shot{input.shot:g}.png",
                    mime_type="image/png",
                    hash="ab",
                )
            )
        return ToolOutput(value={"shot": input.shot}, content=content, cost_usd=cost)

    return ToolSpec(
        name="read_frame", description="Read one frame.", schema=Shot, run=run
    )


def render(
    counter: Counter | None = None, cost: float = 0.0, estimate: float | None = None
) -> ToolSpec:
    async def start(input: Shot, signal: AbortSignal) -> Started:
        if counter is not None:
            counter.hit("start")
        return Started(
            started={"job": f"job-{input.shot:g}"}, rows=[f"row-{input.shot:g}"]
        )

    async def wait(started: Any, signal: AbortSignal) -> ToolOutput:
        if counter is not None:
            counter.hit("wait")
        return ToolOutput(
            value=started,
            content=[TextPart(text=f"rendered {started['job']}")],
            cost_usd=cost,
        )

    return ToolSpec(
        name="render",
        description="Render a shot.",
        schema=Shot,
        start=start,
        wait=wait,
        estimate_usd=None if estimate is None else (lambda input: estimate),
    )


def ask_tool() -> ToolSpec:
    def run(input: Question, signal: AbortSignal) -> ToolOutput:
        raise AssertionError("ask is never run")

    return ToolSpec(name="ask", description="Ask the person.", schema=Question, run=run)


def options(
    model: Any, journal: MemoryJournal | None = None, **overrides: Any
) -> RunToolLoopOptions:
    values: dict[str, Any] = {
        "generate": model,
        "model": "test-model",
        "system": "You review storyboards.",
        "messages": [{"role": "user", "content": "Review shot 3."}],
        "tools": [read_frame()],
        "budget": Budget(usd=10.0),
        "max_steps": 10,
        "step": (journal or MemoryJournal()).step,
    }
    values.update(overrides)
    return RunToolLoopOptions(**values)


class Recorder:
    def __init__(self) -> None:
        self.events: list[LoopEvent] = []

    def __call__(self, event: LoopEvent) -> None:
        self.events.append(event)

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events]


async def run(
    model: Any, journal: MemoryJournal | None = None, **overrides: Any
) -> tuple[RunToolLoopResult, Recorder]:
    recorder = Recorder()
    result = await run_tool_loop(options(model, journal, on_step=recorder, **overrides))
    return result, recorder


class Exploding:
    """A generate / tool that fails the test if called (for replay)."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, *args: Any) -> Any:
        self.calls += 1
        raise AssertionError("called during replay")


__all__ = ["ScriptedModel"]
