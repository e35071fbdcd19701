"""The simulated model of a chat with the storyboard reviewer (README, "Conversations"; the toolset
is tools.py's REVIEW_TOOLS): a policy for `toolloop.sim` that answers the person's last message.

- "... frame by frame ...": `read_frame` of each shot in turn, one a turn, each turn taking 4 s
  (long enough to steer or interrupt the run while it reads);
- any other message from the person (a follow-up, a steer): an answer that quotes it.

It answers from the request alone (the history), so a replayed or retried request gets the same
turn, as the simulator requires.
"""

from __future__ import annotations

from toolloop import AssistantMessage, ToolMessage, UserMessage
from toolloop.contract import ChatMessage, TextPart
from toolloop.sim.script import SimRequest, SimToolCall, SimTurn

SHOTS = 6
READ_S = 4.0


def said(message: ChatMessage) -> str:
    """The last text the person wrote in `message` (a turn may carry several messages)."""
    if isinstance(message.content, str):
        return message.content
    texts = [part.text for part in message.content or [] if isinstance(part, TextPart)]
    return texts[-1] if texts else ""


def chat_policy(request: SimRequest) -> SimTurn:
    messages = request.messages
    last = messages[-1]
    if isinstance(last, UserMessage):
        text = said(last)
        if "frame by frame" in text:
            return SimTurn(
                text="Reading shot 1.",
                tool_calls=[SimToolCall(name="read_frame", input={"shot": 1})],
                generation_s=READ_S,
            )
        return SimTurn(
            text=f"You said: “{text}”. Shot 3 runs 1.2 s past the board; trim it to 4.0 s."
        )
    if isinstance(last, ToolMessage):
        read = sum(
            1 for m in messages if isinstance(m, AssistantMessage) and m.tool_calls
        )
        if read < SHOTS:
            call = SimToolCall(name="read_frame", input={"shot": read + 1})
            return SimTurn(
                text=f"Reading shot {read + 1}.", tool_calls=[call], generation_s=READ_S
            )
        return SimTurn(text=f"Read all {SHOTS} frames: shot 3 runs long.")
    return SimTurn(text="Go on.")
