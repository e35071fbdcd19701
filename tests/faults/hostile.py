"""Hostile tools and their scripted model, loaded by the fault suite's workers (PYTHONPATH=tests):
the toolset "hostile" (TOOLLOOP_TOOLSETS="hostile=faults.hostile:TOOLS") and
TOOLLOOP_PROMPT_GEN="faults.hostile:make_generate".

Tools: `parse` parses the model's arguments with argparse (a bad argument: `SystemExit(2)`),
`interrupt` raises KeyboardInterrupt on the worker's event loop (an async tool), `crash` calls
`os.abort()` (a native crash: the process dies of SIGABRT), `work` sleeps a while and logs one effect
line with the worker's pid (faults.toolset.record).

The model: a run whose user text is `call <tool> <argument...>` calls that tool once, then answers
`Read: <the tool's answer>`; a run whose user text is `work <tag> <seconds> <turns>` calls `work`
that many turns, then answers `Worked.`.
"""

from __future__ import annotations

import argparse
import os
import resource
import time
import uuid
from typing import Any

from pydantic import BaseModel

from faults.toolset import record
from toolloop import (
    AbortSignal,
    PromptGenRequest,
    PromptGenResult,
    TextPart,
    ToolOutput,
    ToolSpec,
)
from toolloop.contract import AssistantMessage, ToolCall, ToolMessage, UserMessage
from toolloop.testing import reply


class Args(BaseModel):
    args: list[str]


class Work(BaseModel):
    tag: str
    seconds: float


def parse(item: Args, _signal: Any) -> ToolOutput:
    parser = argparse.ArgumentParser(prog="frames")
    parser.add_argument("--count", type=int, required=True)
    parsed = parser.parse_args(item.args)
    return ToolOutput(
        value=parsed.count, content=[TextPart(text=f"count={parsed.count}")]
    )


async def interrupt(item: Args, _signal: Any) -> ToolOutput:
    raise KeyboardInterrupt


def crash(item: Args, _signal: Any) -> ToolOutput:
    record("crash", "crash")
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file in the working tree
    os.abort()


def work(item: Work, _signal: Any) -> ToolOutput:
    time.sleep(item.seconds)
    record("work", item.tag)
    return ToolOutput(value=item.tag, content=[TextPart(text=f"worked {item.tag}")])


TOOLS = [
    ToolSpec(
        name="parse", description="Count frames (argparse).", schema=Args, run=parse
    ),
    ToolSpec(name="interrupt", description="Interrupt.", schema=Args, run=interrupt),
    ToolSpec(name="crash", description="Crash natively.", schema=Args, run=crash),
    ToolSpec(name="work", description="Work a while.", schema=Work, run=work),
]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.text for part in content if isinstance(part, TextPart))


def answer(request: PromptGenRequest) -> PromptGenResult:
    messages = request.messages or []
    user = next(_text(m.content) for m in messages if isinstance(m, UserMessage))
    turn = 1 + sum(isinstance(m, AssistantMessage) for m in messages)
    words = user.split()
    if words[0] == "call":
        if turn == 1:
            return reply(tool_calls=[_call(words[1], {"args": words[2:]})])
        last = next(
            _text(m.content) for m in reversed(messages) if isinstance(m, ToolMessage)
        )
        return reply(f"Read: {last}")
    tag, seconds, turns = words[1], float(words[2]), int(words[3])
    if turn <= turns:
        return reply(
            tool_calls=[_call("work", {"tag": f"{tag}.{turn}", "seconds": seconds})]
        )
    return reply("Worked.")


def _call(name: str, input: dict[str, Any]) -> ToolCall:
    return ToolCall(id=f"toolu_{uuid.uuid4().hex[:20]}", name=name, input=input)


def make_generate() -> Any:
    async def generate(
        request: PromptGenRequest, signal: AbortSignal
    ) -> PromptGenResult:
        signal.throw_if_aborted()
        return answer(request)

    return generate
