"""What both wires share: the parse result, input errors, and the deterministic ids.

Ids are pure functions of the request, so a retried request (a durable run replaying a step) gets
the same answer: `conversation_id` hashes the wire, the system text and the first message,
`history_hash` the wire, the system text and every message (cache marks left out, as they move
between turns), and a tool-call id hashes the history plus the call's position in the turn.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from toolloop.contract import TextPart
from toolloop.sim.cache import Block, CacheUsage, Ttl
from toolloop.sim.script import SimRequest, SimTurn
from toolloop.sim.tokens import json_tokens, text_tokens


class Wire(Protocol):
    """What a wire module (`anthropic_wire`, `fal_wire`) provides to the app."""

    def api_key(self, headers: Any) -> str: ...
    def header_problem(self, headers: Any) -> str | None: ...
    def parse(self, body: Any) -> Parsed: ...
    def render(
        self, turn: SimTurn, request: SimRequest, usage: CacheUsage, refusal: bool
    ) -> dict[str, Any]: ...
    def error_body(
        self, status: int, message: str, request_id: str
    ) -> dict[str, Any]: ...


class WireInputError(ValueError):
    """The request body is not valid for the wire (answered 400 in the wire's error format)."""


@dataclass(frozen=True)
class Parsed:
    request: SimRequest
    blocks: list[Block]


def canonical(value: Any) -> str:
    """Stable JSON text of a value (sorted keys), for hashing."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()


def conversation_ids(
    wire: str, system: str | None, blocks: Sequence[Block], first: int
) -> tuple[str, str]:
    """(conversation_id, history_hash) of a request from its message blocks (their keys carry no
    cache marks); `blocks[:first]` are the first message's."""
    keys = [block.key for block in blocks]
    return _digest(wire, system or "", *keys[:first])[:16], _digest(
        wire, system or "", *keys
    )


def call_id(history_hash: str, position: int, prefix: str) -> str:
    """The id of the `position`-th tool call of the answer to a history: `<prefix><24 hex>`."""
    return prefix + _digest(history_hash, str(position))[:24]


def message_id(history_hash: str, prefix: str) -> str:
    return prefix + _digest(history_hash, "message")[:24]


def parse_mark(cache_control: Any) -> Ttl | None:
    """The TTL of a `cache_control` value: None when absent, "5m" or "1h"."""
    if cache_control is None:
        return None
    if not isinstance(cache_control, dict) or cache_control.get("type") != "ephemeral":
        raise WireInputError(
            f'cache_control must be {{"type": "ephemeral"}}, got {cache_control!r}.'
        )
    ttl = cache_control.get("ttl", "5m")
    if ttl not in ("5m", "1h"):
        raise WireInputError(f"cache_control.ttl must be '5m' or '1h', got {ttl!r}.")
    return "1h" if ttl == "1h" else "5m"


def text_block(context: str, text: str, mark: Ttl | None = None) -> Block:
    """The cache block of a text: a string content and a one-text-block list give the same key, as
    they are the same tokens to the model."""
    return Block(f"{context}text\x01{text}", text_tokens(text), mark)


def fit_max_tokens(turn: SimTurn, max_tokens: Any) -> SimTurn:
    """The turn as the API would end it under `max_tokens`: when its output estimate (text plus each
    call's name and input JSON) is over the limit, the text is cut to fit, the tool calls are
    dropped and the stop reason is `max_tokens` (fal: `length`)."""
    if (
        not isinstance(max_tokens, int)
        or isinstance(max_tokens, bool)
        or max_tokens <= 0
    ):
        return turn
    if turn.cut_by(max_tokens):  # scripted: the wire cuts its last tool call (render)
        return turn
    calls = sum(
        json_tokens({"name": call.name, "input": call.input})
        for call in turn.tool_calls
    )
    if text_tokens(turn.text) + calls <= max_tokens:
        return turn
    text = turn.text[: max_tokens * 4]
    while text_tokens(text) > max_tokens:
        text = text[: len(text) - (text_tokens(text) - max_tokens)]
    return turn.model_copy(
        update={"text": text, "tool_calls": [], "stop_reason": "max_tokens"}
    )


def text_part(text: str, marked: bool) -> TextPart:
    return TextPart(text=text, cache=marked)


def require(condition: bool, message: str) -> None:
    if not condition:
        raise WireInputError(message)
