"""A toolset and a scripted model for the integration tests, imported by the worker process.

The worker builds its model with TOOLLOOP_PROMPT_GEN="tests.integration.agents:make_generate"; the
scenario is chosen by the run's system text. Tools and model calls append a line to the files named
by TOOLLOOP_TEST_TOOL_LOG / TOOLLOOP_TEST_MODEL_LOG, so a test can count what ran.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
import uuid
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from toolloop import (
    AbortSignal,
    PromptGenRequest,
    PromptGenResult,
    Started,
    ToolOutput,
    ToolSpec,
)
from toolloop.contract import (
    AssistantMessage,
    TextPart,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from toolloop.testing import reply


def call(name: str, input: dict[str, Any]) -> ToolCall:
    """A tool call with an id unique across processes (as a provider's): replayed steps keep theirs."""
    return ToolCall(id=f"toolu_{uuid.uuid4().hex[:20]}", name=name, input=input)


def _log(variable: str, **fields: Any) -> None:
    path = os.environ.get(variable)
    if path:
        with open(path, "a", encoding="utf-8") as file:
            file.write(json.dumps(fields) + "\n")


class AddInput(BaseModel):
    a: float
    b: float


class AskInput(BaseModel):
    question: str


class SlowInput(BaseModel):
    seconds: float


class FlakyInput(BaseModel):
    path: str


def publish(input: AddInput, signal: AbortSignal) -> ToolOutput:
    """A tool that needs a person's approval: it logs the input it ran with."""
    _log(
        "TOOLLOOP_TEST_TOOL_LOG", tool="publish", ran_with={"a": input.a, "b": input.b}
    )
    return ToolOutput(
        value=input.a, content=[TextPart(text=f"published {input.a:g}+{input.b:g}")]
    )


def transcode_start(input: AddInput, signal: AbortSignal) -> Started:
    """A two-phase tool (a paid job: $0.10 each, estimated at $0.15): start logs, wait bills."""
    _log("TOOLLOOP_TEST_TOOL_LOG", tool="transcode", event="start", a=input.a)
    return Started(started={"job": input.a})


def transcode_wait(started: dict[str, Any], signal: AbortSignal) -> ToolOutput:
    return ToolOutput(
        value=started["job"], content=[TextPart(text="transcoded")], cost_usd=0.1
    )


def add(input: AddInput, signal: AbortSignal) -> ToolOutput:
    _log("TOOLLOOP_TEST_TOOL_LOG", tool="add", a=input.a, b=input.b)
    total = input.a + input.b
    return ToolOutput(value=total, content=[TextPart(text=f"{total:g}")], cost_usd=0.0)


async def slow(input: SlowInput, signal: AbortSignal) -> ToolOutput:
    _log("TOOLLOOP_TEST_TOOL_LOG", tool="slow", event="start")
    waiter = asyncio.ensure_future(signal.wait())
    try:
        done, _ = await asyncio.wait({waiter}, timeout=input.seconds)
    finally:  # also when the step itself is cancelled (a shutdown): no task left pending
        waiter.cancel()
    aborted = bool(done)
    _log(
        "TOOLLOOP_TEST_TOOL_LOG",
        tool="slow",
        event="aborted" if aborted else "finished",
    )
    return ToolOutput(
        value=aborted, content=[TextPart(text="stopped early" if aborted else "slept")]
    )


def flaky(input: FlakyInput, signal: AbortSignal) -> ToolOutput:
    _log("TOOLLOOP_TEST_TOOL_LOG", tool="flaky", path=input.path)
    if not Path(input.path).exists():
        raise RuntimeError(f"flaky: {input.path} does not exist yet")
    return ToolOutput(value="ok", content=[TextPart(text="the file is there")])


class GateInput(BaseModel):
    path: str


async def gate(input: GateInput, signal: AbortSignal) -> ToolOutput:
    """Wait until the test opens the gate (creates the file at `path`), up to 60 s: the run holds
    here, before its park, for as long as the test needs, whatever the machine's load."""
    deadline = time.monotonic() + 60
    while (
        not Path(input.path).exists()
        and time.monotonic() < deadline
        and not signal.aborted
    ):
        await asyncio.sleep(0.02)
    opened = Path(input.path).exists()
    return ToolOutput(
        value=opened, content=[TextPart(text="opened" if opened else "still shut")]
    )


class MeetInput(BaseModel):
    me: str
    partner: str


def meet(input: MeetInput, signal: AbortSignal) -> ToolOutput:
    """A blocking sync tool: leaves a mark, then waits (sleeping) up to 10 s for its partner's mark."""
    directory = Path(os.environ.get("TOOLLOOP_TEST_TOOL_LOG", "/tmp/x")).parent
    (directory / f"meet-{input.me}").touch()
    deadline = time.monotonic() + 10
    while (
        not (directory / f"meet-{input.partner}").exists()
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    met = (directory / f"meet-{input.partner}").exists()
    return ToolOutput(value=met, content=[TextPart(text="met" if met else "alone")])


TOOLS = [
    ToolSpec(name="add", description="Add two numbers.", schema=AddInput, run=add),
    ToolSpec(
        name="ask",
        description="Ask the person a question.",
        schema=AskInput,
        run=lambda _input, _signal: None,
    ),
    ToolSpec(
        name="slow",
        description="Wait a while.",
        schema=SlowInput,
        run=slow,
        queue="tools",
    ),
    ToolSpec(name="flaky", description="Check a file.", schema=FlakyInput, run=flaky),
    ToolSpec(
        name="render",
        description="Render on a GPU.",
        schema=AddInput,
        run=add,
        queue="gpu",
    ),
    ToolSpec(
        name="meet", description="Wait for a partner.", schema=MeetInput, run=meet
    ),
    ToolSpec(
        name="gate",
        description="Wait for the gate to open.",
        schema=GateInput,
        run=gate,
    ),
    ToolSpec(
        name="transcode",
        description="Transcode a clip (a paid job).",
        schema=AddInput,
        start=transcode_start,
        wait=transcode_wait,
        estimate_usd=lambda _input: 0.15,
    ),
    ToolSpec(
        name="publish",
        description="Publish a sum.",
        schema=AddInput,
        run=publish,
        needs_approval=True,
        estimate_usd=lambda _input: 0.5,
    ),
    ToolSpec(
        name="publish_gpu",
        description="Publish on a GPU.",
        schema=AddInput,
        run=publish,
        needs_approval=True,
        queue="gpu",
    ),
    ToolSpec(
        name="publish_yes",
        description="Publish a sum.",
        schema=AddInput,
        run=publish,
        needs_approval=True,
        approval_timeout_s=2,
        approval_default="approve",
    ),
]


def _text(content: str | list[Any]) -> str:
    return (
        content
        if isinstance(content, str)
        else "".join(p.text for p in content if isinstance(p, TextPart))
    )


def _user_text(request: PromptGenRequest) -> str:
    for message in request.messages:
        if isinstance(message, UserMessage):
            return _text(message.content)
    return ""


def _last_tool_text(request: PromptGenRequest) -> str:
    for message in reversed(request.messages):
        if isinstance(message, ToolMessage):
            return _text(message.content)
    return ""


def _turn(request: PromptGenRequest) -> int:
    return 1 + sum(isinstance(m, AssistantMessage) for m in request.messages)


def answer(request: PromptGenRequest) -> PromptGenResult:
    """The scripted model: the scenario is the system text, the turn the number of answers so far."""
    turn, scenario = _turn(request), request.system
    if scenario == "tools":  # adds the first two numbers of the user's text
        if turn == 1:
            a, b = (float(word) for word in re.findall(r"\d+", _user_text(request))[:2])
            return reply(
                "Adding.", tool_calls=[call("add", {"a": a, "b": b})], cost_usd=0.01
            )
        return reply(f"The sum is {_last_tool_text(request)}.", cost_usd=0.01)
    if scenario == "ask":
        if turn == 1:
            return reply(
                tool_calls=[call("ask", {"question": "Which shot?"})], cost_usd=0.01
            )
        return reply(f"You said: {_last_tool_text(request)}", cost_usd=0.01)
    if scenario == "ask2":  # two questions, one after the other
        if turn <= 2:
            return reply(tool_calls=[call("ask", {"question": f"Question {turn}?"})])
        answers = [
            _text(m.content) for m in request.messages if isinstance(m, ToolMessage)
        ]
        return reply(f"You said: {', then '.join(answers)}")
    if scenario == "slow":
        if turn == 1:
            return reply(
                tool_calls=[
                    call("slow", {"seconds": 30}),
                    call("add", {"a": 1, "b": 1}),
                ]
            )
        return reply("Slept.")
    if scenario == "budget":
        return reply(tool_calls=[call("slow", {"seconds": 0.3})], cost_usd=0.4)
    if scenario == "gated_ask":  # the user text is the gate's path
        if turn == 1:
            return reply(tool_calls=[call("gate", {"path": _user_text(request)})])
        if turn == 2:
            return reply(tool_calls=[call("ask", {"question": "Which shot?"})])
        return reply(f"You said: {_last_tool_text(request)}")
    if (
        scenario == "ask_gated"
    ):  # the question, then a gate (the user text is its path), then the answer
        if turn == 1:
            return reply(tool_calls=[call("ask", {"question": "Which shot?"})])
        if turn == 2:
            return reply(tool_calls=[call("gate", {"path": _user_text(request)})])
        answers = [
            _text(m.content) for m in request.messages if isinstance(m, ToolMessage)
        ]
        return reply(f"You said: {answers[0]}")
    if scenario == "count":  # eleven tool turns, then an answer
        if turn <= 11:
            return reply(
                tool_calls=[call("add", {"a": turn, "b": 1000})], cost_usd=0.001
            )
        return reply("Counted.", cost_usd=0.001)
    if scenario == "meet":  # the user text is "<me> <partner>"
        if turn == 1:
            me, partner = _user_text(request).split()
            return reply(tool_calls=[call("meet", {"me": me, "partner": partner})])
        return reply(_last_tool_text(request))
    if scenario == "gpu":
        if turn == 1:
            return reply(tool_calls=[call("render", {"a": 4, "b": 5})])
        return reply(f"Rendered {_last_tool_text(request)}.")
    if scenario == "approve2":  # two held calls in one turn
        if turn == 1:
            return reply(
                tool_calls=[
                    call("publish", {"a": 1, "b": 2}),
                    call("publish", {"a": 3, "b": 4}),
                ]
            )
        return reply(f"Model read: {_last_tool_text(request)}")
    if scenario in (
        "approve",
        "approve_gated",
        "approve_yes",
        "approve_gpu",
    ):  # a held call, then what the model read
        if turn == 1:
            first = (  # approve_gated: the user text is the gate's path
                [call("gate", {"path": _user_text(request)})]
                if scenario == "approve_gated"
                else [call("add", {"a": 1, "b": 1})]
            )
            name = {"approve_yes": "publish_yes", "approve_gpu": "publish_gpu"}.get(
                scenario, "publish"
            )
            return reply(
                tool_calls=[*first, call(name, {"a": 2, "b": 3})], cost_usd=0.01
            )
        return reply(f"Model read: {_last_tool_text(request)}", cost_usd=0.01)
    if scenario == "refuse":  # one addition, then a refusal with its details
        if turn == 1:
            return reply(
                "Adding.", tool_calls=[call("add", {"a": 2, "b": 3})], cost_usd=0.01
            )
        details = {"category": "cyber", "explanation": "Exploit development."}
        return reply("", finish_reason="refusal", meta=details, cost_usd=0.01)
    if scenario == "flaky":
        if turn == 1:
            return reply(
                tool_calls=[call("flaky", {"path": _user_text(request)})], cost_usd=0.01
            )
        return reply("Found it.", cost_usd=0.01)
    raise AssertionError(f"No scripted scenario {scenario!r}.")


def make_generate() -> Any:
    async def generate(
        request: PromptGenRequest, signal: AbortSignal
    ) -> PromptGenResult:
        signal.throw_if_aborted()
        _log("TOOLLOOP_TEST_MODEL_LOG", system=request.system, user=_user_text(request))
        if (
            request.system == "slow_model_ask"
        ):  # a model call that takes a while, deaf to aborts
            await asyncio.sleep(1.5)
            return reply(tool_calls=[call("ask", {"question": "Which shot?"})])
        return answer(request)

    return generate
