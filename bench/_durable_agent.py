"""The agent of bench/durable.py, imported by the bench worker (bench/ on PYTHONPATH).

- `TOOLS`: one tool, `note`, that answers at once (a tool step with no latency of its own).
- `PARK_TOOLS`: `note` and `ask` (the question that parks a run), for bench/scale.py's parked runs.
- `make_generate`: a zero-latency scripted model (TOOLLOOP_PROMPT_GEN="_durable_agent:make_generate"):
  the system text "turns=N" makes it call `note` on each of its first N-1 turns and answer on turn N,
  so a run is N model steps and N-1 tool steps (bench/_replay.py replays the same conversation);
  "turns=N ask" calls `ask` on turn N instead, which parks the run.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel

from toolloop import (
    AbortSignal,
    PromptGenRequest,
    PromptGenResult,
    TextPart,
    ToolOutput,
    ToolSpec,
)
from toolloop.contract import AssistantMessage, PromptGenUsage
from toolloop.testing import call, reply

PARAGRAPH = (
    "Shot 3 holds on the door a beat too long; the cut to the hallway lands late. " * 3
)


class NoteInput(BaseModel):
    shot: int
    text: str


def note(input: NoteInput, signal: AbortSignal) -> ToolOutput:
    text = f"Noted for shot {input.shot}: {input.text[:60]}. " + PARAGRAPH
    return ToolOutput(
        value={"shot": input.shot}, content=[TextPart(text=text)], cost_usd=0.0
    )


class AskInput(BaseModel):
    question: str


TOOLS = [
    ToolSpec(
        name="note",
        description="Write a review note on a shot.",
        schema=NoteInput,
        run=note,
    )
]
PARK_TOOLS = [
    *TOOLS,
    ToolSpec(name="ask", description="Ask the person.", schema=AskInput, run=None),
]


def answer(request: PromptGenRequest) -> PromptGenResult:
    turns = int(re.findall(r"turns=(\d+)", request.system or "turns=2")[0])
    turn = 1 + sum(isinstance(m, AssistantMessage) for m in request.messages)
    usage = PromptGenUsage(prompt_tokens=1200 + 150 * turn, completion_tokens=80)
    if turn < turns:
        calls = [
            call("note", {"shot": turn, "text": PARAGRAPH[:120]}, id=f"call_{turn}")
        ]
        return reply(
            f"Turn {turn}: looking at shot {turn}. {PARAGRAPH[:160]}",
            tool_calls=calls,
            cost_usd=0.0001,
            usage=usage,
        )
    if " ask" in (request.system or ""):
        asked = [call("ask", {"question": f"Keep shot {turn}?"}, id=f"call_{turn}")]
        return reply(
            f"Turn {turn}: one question.",
            tool_calls=asked,
            cost_usd=0.0001,
            usage=usage,
        )
    return reply(f"Reviewed {turns} turns. {PARAGRAPH}", cost_usd=0.0001, usage=usage)


def make_generate() -> Any:
    async def generate(
        request: PromptGenRequest, signal: AbortSignal
    ) -> PromptGenResult:
        signal.throw_if_aborted()
        return answer(request)

    return generate
