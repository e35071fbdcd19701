"""What the simulator knows of a run's client-side compaction (toolloop/loop/context.py).

- A request whose last message is a user message ending in the loop's documented summary prompt
  (`COMPACT_PROMPT`) is a summary call: the simulator answers it itself, without asking the policy,
  with a deterministic summary (`summary_text`): about one token per 50 of the request's message
  tokens, at least 40 and at most 1,500, made from the request's history hash. A run with its own
  `summary_prompt` gets its policy's answer instead.
- A request whose first message has a text part that starts with the loop's summary head
  (`SUMMARY_HEADER`, "Summary of the first N model turns ...") continues a compacted conversation:
  its `assistant_turns` counts the N covered turns too, so a script answers the turn it would have
  answered without the compaction.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re

from toolloop.contract import TextPart, UserMessage
from toolloop.loop.context import COMPACT_PROMPT, message_tokens
from toolloop.sim.script import SimRequest, SimTurn

_HEAD = re.compile(r"Summary of the first (\d+) model turns of this conversation")
MIN_SUMMARY_TOKENS = 40
MAX_SUMMARY_TOKENS = 1500


def _last_text(message: object) -> str | None:
    if not isinstance(message, UserMessage):
        return None
    content = message.content
    if isinstance(content, str):
        return content
    texts = [part.text for part in content if isinstance(part, TextPart)]
    return texts[-1] if texts else None


def is_summary_request(request: SimRequest) -> bool:
    return bool(request.messages) and _last_text(request.messages[-1]) == COMPACT_PROMPT


def covered_turns(request: SimRequest) -> int:
    """The turns a compacted request's summary head says it covers (0 for any other request)."""
    if not request.messages or not isinstance(request.messages[0], UserMessage):
        return 0
    content = request.messages[0].content
    texts = (
        [content]
        if isinstance(content, str)
        else [p.text for p in content if isinstance(p, TextPart)]
    )
    for text in texts:
        match = _HEAD.match(text)
        if match:
            return int(match.group(1))
    return 0


def counted(request: SimRequest) -> SimRequest:
    """The request with the covered turns counted in `assistant_turns`."""
    covered = covered_turns(request)
    if not covered:
        return request
    return dataclasses.replace(
        request, assistant_turns=request.assistant_turns + covered
    )


def summary_text(request: SimRequest) -> str:
    tokens = sum(message_tokens(m) for m in request.messages[:-1]) // 50
    tokens = max(MIN_SUMMARY_TOKENS, min(MAX_SUMMARY_TOKENS, tokens))
    seed = hashlib.sha256(request.history_hash.encode()).hexdigest()
    words = [seed[i : i + 7] for i in range(0, 56, 7)]
    body = " ".join(words[i % len(words)] for i in range(tokens * 4 // 8))
    return f"Done so far ({request.assistant_turns} turns): {body}"


def summary_turn(request: SimRequest) -> SimTurn:
    return SimTurn(text=summary_text(request))
