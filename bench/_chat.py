"""A simulator policy for conversations (follow-ups and steers, docs/conversations.md), and the
toolset its runs use (`TOOLS`: `slow`, `ask`): the policy answers from the last message of each
request and keeps every request, so a test or a benchmark counts at the simulator which requests
carried a message and where (bench/conversations.py, tests/integration/test_conversations.py,
tests/faults/test_steer_kill.py).

- a user message `slow <seconds>` (or `slow <seconds> x<k>`): a call to the `slow` tool, k times in
  a row (each tool result is answered with the next call until k calls ran);
- a user message `think <seconds>`: the answer `thought`, that long in coming;
- a user message `ask`: a call to the `ask` tool; `fail`: a call of `flaky` that raises (the run fails);
- any other user message `<text>`: the answer `echo: <text>`;
- a tool result after the last call: `tool done`;
- a user message `steer <...>` (a steer of the benchmarks): as a tool result (the chain goes on).
"""

from __future__ import annotations

import asyncio
import threading

from pydantic import BaseModel

from toolloop import AbortSignal, ToolOutput, ToolSpec
from toolloop.contract import (
    AssistantMessage,
    ChatMessage,
    TextPart,
    ToolMessage,
    UserMessage,
)
from toolloop.sim import SimRequest, SimTurn


class SlowInput(BaseModel):
    seconds: float


class AskInput(BaseModel):
    question: str


async def slow(input: SlowInput, signal: AbortSignal) -> ToolOutput:
    """Wait `seconds` (less when the step is aborted)."""
    waiter = asyncio.ensure_future(signal.wait())
    try:
        done, _ = await asyncio.wait({waiter}, timeout=input.seconds)
    finally:
        waiter.cancel()
    return ToolOutput(
        value=bool(done), content=[TextPart(text="stopped early" if done else "slept")]
    )


TOOLS = [
    ToolSpec(name="slow", description="Wait a while.", schema=SlowInput, run=slow),
    ToolSpec(
        name="ask",
        description="Ask the person.",
        schema=AskInput,
        run=lambda _input, _signal: None,
    ),
]
"""The toolset of the conversation benchmarks' workers (`chat=_chat:TOOLS`, bench/ on PYTHONPATH)."""


def text_of(message: ChatMessage) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    return "".join(part.text for part in content or [] if isinstance(part, TextPart))


def last_text(message: ChatMessage) -> str:
    """The last text part of a message (a user turn may carry several messages' texts)."""
    content = message.content
    if isinstance(content, str):
        return content
    texts = [part.text for part in content or [] if isinstance(part, TextPart)]
    return texts[-1] if texts else ""


STEER = "steer "
"""A user message beginning with this is a steer of the chain (the policy goes on with the chain)."""


def _steer(message: ChatMessage) -> bool:
    """A steer alone: its first text is one (a turn that begins with the person's own text is not)."""
    texts = user_texts(message)
    return bool(texts) and texts[0].startswith(STEER)


def user_texts(message: ChatMessage) -> list[str]:
    """The texts of a user message: its string, or each of its text parts."""
    if not isinstance(message, UserMessage):
        return []
    if isinstance(message.content, str):
        return [message.content]
    return [part.text for part in message.content if isinstance(part, TextPart)]


def has_text(message: ChatMessage, text: str) -> bool:
    """Whether `message` is a user message with `text` as its text or as one of its text parts
    (consecutive user messages reach the Anthropic wire as one turn, and come back as one)."""
    if not isinstance(message, UserMessage):
        return False
    if isinstance(message.content, str):
        return message.content == text
    return any(
        isinstance(part, TextPart) and part.text == text for part in message.content
    )


class Chat:
    """The policy (see the module docstring); `requests` holds each request it answered."""

    def __init__(self, *, generation_s: float = 0.0) -> None:
        self.generation_s = generation_s
        self.lock = threading.Lock()
        self.requests: list[SimRequest] = []

    def __call__(self, request: SimRequest) -> SimTurn:
        with self.lock:
            self.requests.append(request)
        return SimTurn.model_validate(
            {"generation_s": self.generation_s, **self.turn(request.messages)}
        )

    def turn(self, messages: list[ChatMessage]) -> dict[str, object]:
        last = messages[-1]
        if isinstance(last, UserMessage) and not last_text(last).startswith(STEER):
            text = last_text(last)
            words = text.split()
            if (
                words[:1] == ["think"] and len(words) >= 2
            ):  # a model call that takes that long
                return {"text": "thought", "generation_s": float(words[1])}
            if words[:1] == ["slow"] and len(words) >= 2:
                return {
                    "tool_calls": [
                        {"name": "slow", "input": {"seconds": float(words[1])}}
                    ]
                }
            if words[:1] == [
                "fail"
            ]:  # the `flaky` tool raises for a file that is not there
                return {
                    "tool_calls": [
                        {"name": "flaky", "input": {"path": "/nonexistent/toolloop"}}
                    ]
                }
            if words == ["ask"]:
                return {
                    "tool_calls": [{"name": "ask", "input": {"question": "Which one?"}}]
                }
            return {"text": f"echo: {text}"}
        # a tool result or a `steer ...` message: another slow call while the request that began
        # the chain asks for more
        starts = [
            i
            for i, m in enumerate(messages)
            if isinstance(m, UserMessage) and not _steer(m)
        ]
        start = starts[-1] if starts else 0
        words = (user_texts(messages[start]) or [""])[0].split()
        calls = sum(
            1
            for m in messages[start:]
            if isinstance(m, AssistantMessage) and m.tool_calls
        )
        wanted = (
            int(words[2][1:])
            if len(words) >= 3 and words[0] == "slow" and words[2][:1] == "x"
            else 1
        )
        if words[:1] == ["slow"] and calls < wanted:
            return {
                "tool_calls": [{"name": "slow", "input": {"seconds": float(words[1])}}]
            }
        return {"text": "tool done"}

    def index(self) -> dict[str, tuple[set[str], set[int], int, int]]:
        """For every user text of every request: (the distinct requests in which it is new, after
        the last assistant message, by history hash; the model turns of those requests, by the
        assistant messages before them: a turn asked again after a kill is the same turn, even when
        its request carries a later steer beside; how many requests carried it; how many of those had
        a user message between a tool call and its result), in one pass over the requests."""
        found: dict[str, tuple[set[str], set[int], int, int]] = {}
        with self.lock:
            requests = list(self.requests)
        for request in requests:
            answers = [
                i
                for i, m in enumerate(request.messages)
                if isinstance(m, AssistantMessage)
            ]
            last_assistant = answers[-1] if answers else -1
            bad = between_call_and_result(request.messages)
            for i, message in enumerate(request.messages):
                for text in user_texts(message):
                    first, turns, carried, wrong = found.get(text, (set(), set(), 0, 0))
                    if i > last_assistant:
                        first.add(request.history_hash)
                        turns.add(len(answers))
                    found[text] = (first, turns, carried + 1, wrong + bad)
        return found

    def carrying(self, text: str) -> list[SimRequest]:
        """The requests with a user message whose text is `text`."""
        with self.lock:
            return [
                r for r in self.requests if any(has_text(m, text) for m in r.messages)
            ]

    def first_seen(self, text: str) -> set[str]:
        """The distinct requests (by history, without cache marks: a request made again after a
        worker died is the same request) in which the user message `text` is new: after the last
        assistant message."""
        found = set()
        for request in self.carrying(text):
            answers = [
                i
                for i, m in enumerate(request.messages)
                if isinstance(m, AssistantMessage)
            ]
            last_assistant = answers[-1] if answers else -1
            newer = request.messages[last_assistant + 1 :]
            if any(has_text(m, text) for m in newer):
                found.add(request.history_hash)
        return found


def between_call_and_result(messages: list[ChatMessage]) -> bool:
    """True when a user message sits between a tool call and its result (what a steer must never do)."""
    open_calls: set[str] = set()
    for message in messages:
        if isinstance(message, AssistantMessage):
            open_calls = {call.id for call in message.tool_calls or []}
        elif isinstance(message, ToolMessage):
            open_calls.discard(message.tool_call_id)
        elif isinstance(message, UserMessage) and open_calls:
            return True
    return False
