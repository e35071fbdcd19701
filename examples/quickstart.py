"""The README's quickstart: a tool-calling run in-process and offline (scripted model, memory journal)."""

import asyncio

from pydantic import BaseModel

from toolloop import (
    Budget,
    MemoryJournal,
    RunToolLoopOptions,
    TextPart,
    ToolOutput,
    ToolSpec,
    run_tool_loop,
)
from toolloop.testing import ScriptedModel, call, reply


class Shot(BaseModel):
    shot: int


def read_note(input: Shot, signal: object) -> ToolOutput:
    return ToolOutput(
        content=[TextPart(text=f"Shot {input.shot} runs 2.0 s over the board.")]
    )


model = ScriptedModel(
    [
        reply(tool_calls=[call("read_note", {"shot": 3})], cost_usd=0.01),
        reply("Trim 2 s."),
    ]
)
# RedisJournal in a durable run: every step stored once, replayed after a crash
journal = MemoryJournal()
options = RunToolLoopOptions(
    generate=model,
    model="claude-sonnet-5-5",
    system="You review storyboards.",
    messages=[{"role": "user", "content": "Review shot 3."}],
    tools=[
        ToolSpec(
            name="read_note",
            description="The note on a shot.",
            schema=Shot,
            run=read_note,
        )
    ],
    budget=Budget(usd=1.0),
    max_steps=5,
    step=journal.step,
)
result = asyncio.run(run_tool_loop(options))
print(
    result.stopped_by,
    repr(result.final_text),
    f"${result.spent_usd:.2f}",
    journal.keys(),
)
# a replay: every step comes from the journal
again = asyncio.run(run_tool_loop(options))
print("replayed:", again.final_text == result.final_text, "model calls:", model.calls)
