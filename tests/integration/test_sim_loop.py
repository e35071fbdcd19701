"""run_tool_loop through the real provider adapters to the simulator over HTTP: a 30-turn tool
conversation finishes with the loop's default cache marks reading >= 90 % of each prompt from the
cache from turn 3 on, on both wires; run again, it gets the same answers and tool-call ids."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from toolloop import (
    Budget,
    LoopEvent,
    MemoryJournal,
    ModelEvent,
    RunToolLoopOptions,
    RunToolLoopResult,
    TextPart,
    ToolOutput,
    ToolSpec,
    UserMessage,
    run_tool_loop,
)
from toolloop.abort import AbortSignal
from toolloop.contract import PromptGenRequest, PromptGenResult
from toolloop.providers.anthropic import AnthropicHandler
from toolloop.providers.fal import FalHandler
from toolloop.sim import SimServer

TURNS = 30


class Shot(BaseModel):
    shot: int


def read_frame(input: Shot, signal: AbortSignal) -> ToolOutput:
    return ToolOutput(
        value=input.shot,
        content=[TextPart(text=f"Frame {input.shot}: a wide shot. " * 20)],
    )


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    script: list[Any] = [
        {"tool_calls": [{"name": "read_frame", "input": {"shot": n}}]}
        for n in range(TURNS - 1)
    ]
    with SimServer([*script, {"text": "Every frame is fine."}]) as server:
        yield server


async def run(sim: SimServer, wire: str) -> tuple[RunToolLoopResult, list[LoopEvent]]:
    if wire == "anthropic":
        handler: AnthropicHandler | FalHandler = AnthropicHandler(
            "k", base_url=sim.base_url
        )
    else:
        handler = FalHandler("k", run_url=sim.base_url)
    model = "claude-sonnet-5-5" if wire == "anthropic" else "anthropic/claude-opus-5.5"
    events: list[LoopEvent] = []

    async def generate(
        request: PromptGenRequest, signal: AbortSignal
    ) -> PromptGenResult:
        return await handler.execute(request, signal)

    result = await run_tool_loop(
        RunToolLoopOptions(
            generate=generate,
            model=model,
            system="You review storyboards, one frame at a time. " * 200,
            messages=[UserMessage(content=f"Review the board ({wire}).")],
            tools=[
                ToolSpec(
                    name="read_frame",
                    description="Read one frame.",
                    schema=Shot,
                    run=read_frame,
                )
            ],
            budget=Budget(usd=10.0, finish_at=0.9),
            max_steps=TURNS + 5,
            step=MemoryJournal().step,
            on_step=events.append,
        )
    )
    return result, events


@pytest.mark.parametrize("wire", ["anthropic", "fal"])
async def test_a_30_turn_run_reads_90_percent_from_the_cache_from_turn_3(
    sim: SimServer, wire: str
) -> None:
    result, events = await run(sim, wire)
    assert (result.stopped_by, result.steps, result.final_text) == (
        "done",
        TURNS,
        "Every frame is fine.",
    )
    usages = [event.usage for event in events if isinstance(event, ModelEvent)]
    ratios = [usage.cached_tokens / usage.prompt_tokens for usage in usages]
    assert ratios[0] == 0.0 and usages[0].cache_write_tokens > 0
    assert min(ratios[2:]) >= 0.9, [round(ratio, 3) for ratio in ratios]
    assert result.spent_usd > 0
    again, _ = await run(sim, wire)  # a fresh journal: every request is sent again
    assert again.messages == result.messages  # same answers, same tool-call ids
