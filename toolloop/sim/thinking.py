"""Simulated thinking: the signed blocks the simulator emits and the rules it checks on the way back.

When thinking is on (`thinking_on`), every answer begins with a `thinking` block whose `signature`
is an HMAC of its text under the simulator's key, and, for some histories, a `redacted_thinking`
block whose opaque `data` carries its own MAC. On the fal wire the same thinking comes as
OpenRouter's `reasoning` text and `reasoning_details` entries.

On the way back, as the Anthropic API does:
- a thinking block whose text or signature was changed, or a redacted block whose data was, is a
  400 (`Invalid \\`signature\\` in \\`thinking\\` block`);
- inside a tool loop (the last user turn holds tool results) with thinking on, the assistant turn
  before it (consecutive assistant messages count as one turn) must begin with a thinking or
  redacted block, else the API's 400 ("Expected `thinking` or `redacted_thinking`, but found
  `tool_use`..."). On fal, `reasoning_details` sent back are checked the same way (a changed
  `reasoning.text` or `reasoning.encrypted` entry is a 400); a history without them is accepted.
Everything is a pure function of the request, so a retried request gets the same blocks.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Iterator
from typing import Any

from toolloop.providers.models import default_catalog
from toolloop.sim.script import SimRequest, SimTurn

KEY = b"toolloop-simulator-thinking-key"
"""The simulator's signing key: a constant, so every simulator process verifies every other's."""

FORMAT = "anthropic-claude-v1"

FOUND_INSTEAD = (
    "messages.{index}.content.0.type: Expected `thinking` or `redacted_thinking`, but found `{found}`. "
    "When `thinking` is enabled, a final `assistant` message must start with a thinking block "
    "(preceeding the lastmost set of `tool_use` and `tool_result` blocks). We recommend you include "
    "thinking blocks from previous turns. To avoid this requirement, disable `thinking`. Please "
    "consult our documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
)


def always_on(model: str) -> bool:
    """The model thinks whatever the request says (its catalogue row refuses `disabled`)."""
    info = default_catalog().find(model)
    return info is not None and info.always_thinks


def thinking_on(body: dict[str, Any]) -> bool:
    """Thinking is on for this request: `thinking.type` enabled or adaptive (Anthropic), a
    `reasoning` setting (fal), or a model that always thinks and was not told otherwise."""
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive"):
        return True
    if isinstance(thinking, dict) and thinking.get("type") == "disabled":
        return False
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort") not in (None, "none"):
        return True
    return always_on(str(body.get("model") or ""))


def sign(text: str) -> str:
    return base64.b64encode(
        hmac.new(KEY, text.encode(), hashlib.sha256).digest()
    ).decode()


def _redacted_data(history_hash: str) -> str:
    payload = f"redacted:{history_hash[:24]}".encode()
    return base64.b64encode(
        payload + hmac.new(KEY, payload, hashlib.sha256).digest()[:16]
    ).decode()


def _redacted_ok(data: Any) -> bool:
    try:
        raw = base64.b64decode(str(data), validate=True)
    except ValueError:
        return False
    payload, mac = raw[:-16], raw[-16:]
    return hmac.compare_digest(
        mac, hmac.new(KEY, payload, hashlib.sha256).digest()[:16]
    )


def thinking_text(turn: SimTurn, request: SimRequest) -> str:
    """The thinking of this answer: the turn's own, else one made from the history (with a line
    break, spaces and characters beyond ASCII, so that a client that re-encodes it shows)."""
    if turn.thinking is not None:
        return turn.thinking
    return (
        f"Turn {request.assistant_turns + 1}: read what the tools said…\n"
        f"  then answer — “step by step” ({request.history_hash[:8]})."
    )


def redacts(turn: SimTurn, request: SimRequest) -> bool:
    """Whether this answer carries a redacted block too: the turn says so, else one history in four."""
    if turn.redacted_thinking is not None:
        return turn.redacted_thinking
    return int(request.history_hash[0], 16) % 4 == 0


def anthropic_blocks(turn: SimTurn, request: SimRequest) -> list[dict[str, Any]]:
    """The blocks an answer begins with (none when thinking is off)."""
    if not thinking_on(request.body):
        return []
    text = thinking_text(turn, request)
    blocks: list[dict[str, Any]] = [
        {"type": "thinking", "thinking": text, "signature": sign(text)}
    ]
    if redacts(turn, request):
        blocks.append(
            {"type": "redacted_thinking", "data": _redacted_data(request.history_hash)}
        )
    return blocks


def fal_fields(turn: SimTurn, request: SimRequest) -> dict[str, Any]:
    """`reasoning` and `reasoning_details` of a fal answer (none when reasoning is off)."""
    if not thinking_on(request.body):
        return {}
    text = thinking_text(turn, request)
    details: list[dict[str, Any]] = [
        {
            "type": "reasoning.text",
            "text": text,
            "signature": sign(text),
            "format": FORMAT,
            "index": 0,
        }
    ]
    if redacts(turn, request):
        details.append(
            {
                "type": "reasoning.encrypted",
                "data": _redacted_data(request.history_hash),
                "format": FORMAT,
                "index": 1,
            }
        )
    return {"reasoning": text, "reasoning_details": details}


def check_anthropic(body: dict[str, Any]) -> str | None:
    """The 400 message for a history whose thinking did not come back as it must, else None."""
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    for index, content in _assistant_lists(messages, "content"):
        for position, block in enumerate(content):
            problem = _block_problem(block, f"messages.{index}.content.{position}")
            if problem:
                return problem
    if not thinking_on(body) or not _in_tool_loop(messages):
        return None
    start = len(messages) - 1
    while start > 0 and messages[start - 1].get("role") == "assistant":
        start -= 1  # consecutive assistant messages are one turn: it starts at the first of them
    if start == len(messages) - 1:
        return None
    first = _first_block(messages[start])
    if first is None or first.get("type") not in ("thinking", "redacted_thinking"):
        found = "text" if first is None else str(first.get("type"))
        return FOUND_INSTEAD.format(index=start, found=found)
    return None


def _assistant_lists(
    messages: list[dict[str, Any]], field: str
) -> Iterator[tuple[int, list[Any]]]:
    """(index, value) of each assistant message whose `field` is a list."""
    for index, message in enumerate(messages):
        value = message.get(field)
        if message.get("role") == "assistant" and isinstance(value, list):
            yield index, value


def _in_tool_loop(messages: list[dict[str, Any]]) -> bool:
    """The last message is a user turn of tool results after an assistant turn."""
    if len(messages) < 2 or messages[-1].get("role") != "user":
        return False
    content = messages[-1].get("content")
    if not isinstance(content, list):
        return False
    results = any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content
    )
    return results and messages[-2].get("role") == "assistant"


def _first_block(message: dict[str, Any]) -> dict[str, Any] | None:
    content = message.get("content")
    if isinstance(content, list) and content and isinstance(content[0], dict):
        return content[0]
    return None


def _block_problem(block: Any, where: str) -> str | None:
    if not isinstance(block, dict):
        return None
    if block.get("type") == "thinking":
        text, signature = block.get("thinking"), block.get("signature")
        if not isinstance(text, str) or not isinstance(signature, str):
            return f"{where}.thinking: thinking blocks need `thinking` and `signature` strings"
        if not hmac.compare_digest(signature, sign(text)):
            return f"{where}: Invalid `signature` in `thinking` block"
    if block.get("type") == "redacted_thinking" and not _redacted_ok(block.get("data")):
        return f"{where}: Invalid `data` in `redacted_thinking` block"
    return None


def check_fal(body: dict[str, Any]) -> str | None:
    """The 400 message for `reasoning_details` that came back changed, else None."""
    messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
    for index, details in _assistant_lists(messages, "reasoning_details"):
        for position, entry in enumerate(details):
            where = f"messages[{index}].reasoning_details[{position}]"
            if isinstance(entry, dict) and entry.get("type") == "reasoning.text":
                text, signature = entry.get("text"), entry.get("signature")
                if not isinstance(text, str) or not isinstance(signature, str):
                    return f"{where}: reasoning.text needs text and signature strings"
                if not hmac.compare_digest(signature, sign(text)):
                    return f"{where}: Invalid `signature` in `thinking` block"
            encrypted = (
                isinstance(entry, dict) and entry.get("type") == "reasoning.encrypted"
            )
            if encrypted and not _redacted_ok(entry.get("data")):
                return f"{where}: Invalid `data` in `redacted_thinking` block"
    return None
