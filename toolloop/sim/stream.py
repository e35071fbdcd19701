"""Streamed answers (`"stream": true`): the answer the wire renders, sent as Server-Sent Events at a
token rate, so a client that accumulates the stream gets exactly the non-streamed answer.

Anthropic (the SDK's `RawMessageStreamEvent` order): `message_start` (the message with empty content
and its input usage, output_tokens 1), a `ping`, per block `content_block_start` / deltas /
`content_block_stop` (text -> text_delta; thinking -> thinking_delta, then one signature_delta;
redacted_thinking whole in its start; tool_use -> input_json_delta pieces of its compact JSON),
`message_delta` (stop_reason, stop_sequence, stop_details, cumulative usage), `message_stop`.
fal (OpenAI chat-completion chunks, OpenRouter style): a first chunk with the role, content,
reasoning and reasoning_details pieces, tool_calls by index (id, type and name first, then argument
pieces), a chunk with the finish reason, a usage chunk with empty choices, then `data: [DONE]`.

Text is cut into pieces of `PIECE_CHARS` characters, one "token" each: at `tokens_per_s` (None: no
pause) each piece waits its turn. Mid-stream faults (`SimFault` kinds, after `after` pieces):
`stream_drop` closes the connection, `stream_error` sends the wire's error event (Anthropic
`event: error` with the error type of `status`, e.g. 529 -> overloaded_error; fal a chunk with
`error: {code, message}`) and ends the stream, `stall` pauses `seconds` and goes on.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

from toolloop.sim.script import SimFault

PIECE_CHARS = 4
_DELTA_USAGE = (
    "input_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
    "output_tokens",
)
Event = tuple[str | None, Any, bool]
"""(SSE event name or None, data (JSON value or raw text), whether it carries one token)."""

ERROR_TYPES = {
    529: "overloaded_error",
    500: "api_error",
    429: "rate_limit_error",
    504: "timeout_error",
    401: "authentication_error",
    403: "permission_error",
    402: "billing_error",
}


def pieces(text: str) -> list[str]:
    return [text[i : i + PIECE_CHARS] for i in range(0, len(text), PIECE_CHARS)]


def anthropic_events(body: dict[str, Any]) -> Iterator[Event]:
    usage = dict(body.get("usage") or {})
    start_usage = {**usage, "output_tokens": 1}
    message = {
        **body,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "stop_details": None,
        "usage": start_usage,
    }
    yield "message_start", {"type": "message_start", "message": message}, False
    yield "ping", {"type": "ping"}, False
    for index, block in enumerate(body.get("content") or []):
        yield from _anthropic_block(index, block)
    delta = {
        key: body.get(key) for key in ("stop_reason", "stop_sequence", "stop_details")
    }
    end_usage = {key: usage[key] for key in _DELTA_USAGE if key in usage}
    yield (
        "message_delta",
        {"type": "message_delta", "delta": delta, "usage": end_usage},
        False,
    )
    yield "message_stop", {"type": "message_stop"}, False


def _anthropic_block(index: int, block: dict[str, Any]) -> Iterator[Event]:
    kind = block.get("type")
    if kind == "text":
        yield _start(index, {"type": "text", "text": ""})
        for piece in pieces(block["text"]):
            yield _delta(index, {"type": "text_delta", "text": piece})
    elif kind == "thinking":
        yield _start(index, {"type": "thinking", "thinking": "", "signature": ""})
        for piece in pieces(block["thinking"]):
            yield _delta(index, {"type": "thinking_delta", "thinking": piece})
        signature = {"type": "signature_delta", "signature": block["signature"]}
        yield (
            "content_block_delta",
            {"type": "content_block_delta", "index": index, "delta": signature},
            False,
        )
    elif kind == "tool_use":
        yield _start(index, {**block, "input": {}})
        raw = block["input"]
        text = (
            raw
            if isinstance(raw, str)
            else json.dumps(raw, separators=(",", ":"), ensure_ascii=False)
        )
        for piece in pieces("" if text == "{}" else text):
            yield _delta(index, {"type": "input_json_delta", "partial_json": piece})
    elif (
        kind == "compaction"
    ):  # as the SDK's streaming fixture: an empty start, then one whole delta
        # the signature travels in the start (unconfirmed: the SDK's delta has no field for it)
        start = {"type": "compaction", "content": None, "encrypted_content": None}
        if "signature" in block:
            start["signature"] = block["signature"]
        yield _start(index, start)
        whole = {
            "type": "compaction_delta",
            "content": block.get("content"),
            "encrypted_content": block.get("encrypted_content"),
        }
        yield (
            "content_block_delta",
            {"type": "content_block_delta", "index": index, "delta": whole},
            False,
        )
    else:  # redacted_thinking and anything else: whole in its start
        yield _start(index, block)
    yield "content_block_stop", {"type": "content_block_stop", "index": index}, False


def _start(index: int, block: dict[str, Any]) -> Event:
    return (
        "content_block_start",
        {"type": "content_block_start", "index": index, "content_block": block},
        False,
    )


def _delta(index: int, delta: dict[str, Any]) -> Event:
    return (
        "content_block_delta",
        {"type": "content_block_delta", "index": index, "delta": delta},
        True,
    )


def fal_chunks(body: dict[str, Any]) -> Iterator[Event]:
    top: dict[str, Any] = {
        key: body[key] for key in ("id", "created", "model", "provider") if key in body
    }
    top["object"] = "chat.completion.chunk"
    choice = (body.get("choices") or [{}])[0]
    message = choice.get("message") or {}

    def chunk(delta: dict[str, Any], **finish: Any) -> dict[str, Any]:
        ends = {"finish_reason": None, "native_finish_reason": None, **finish}
        return {**top, "choices": [{"index": 0, "delta": delta, **ends}]}

    content = message.get("content")
    yield (
        None,
        chunk(
            {"role": "assistant", "content": "" if isinstance(content, str) else None}
        ),
        False,
    )
    yield from _fal_reasoning(message, chunk)
    for piece in pieces(content if isinstance(content, str) else ""):
        yield None, chunk({"content": piece}), True
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call["function"]
        first = {
            "index": index,
            "id": call["id"],
            "type": call["type"],
            "function": {"name": function["name"], "arguments": ""},
        }
        yield None, chunk({"tool_calls": [first]}), False
        for piece in pieces(function.get("arguments") or ""):
            yield (
                None,
                chunk(
                    {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}
                ),
                True,
            )
    ends = {
        "finish_reason": choice.get("finish_reason"),
        "native_finish_reason": choice.get("native_finish_reason"),
    }
    yield None, chunk({}, **ends), False
    yield None, {**top, "choices": [], "usage": body.get("usage")}, False
    yield None, "[DONE]", False


def _fal_reasoning(message: dict[str, Any], chunk: Any) -> Iterator[Event]:
    details = message.get("reasoning_details") or []
    text_entry: dict[str, Any] | None = next(
        (e for e in details if e.get("type") == "reasoning.text"), None
    )
    for number, piece in enumerate(pieces(message.get("reasoning") or "")):
        delta: dict[str, Any] = {"reasoning": piece}
        if text_entry is not None:
            first = (
                {**text_entry, "text": piece, "signature": None}
                if number == 0
                else None
            )
            delta["reasoning_details"] = [
                first
                or {
                    "type": "reasoning.text",
                    "text": piece,
                    "index": text_entry.get("index", 0),
                }
            ]
        yield None, chunk(delta), True
    for entry in details:
        if text_entry is not None and entry is text_entry:
            ending = {
                "type": entry["type"],
                "text": "",
                "signature": entry.get("signature"),
                "index": entry.get("index", 0),
            }
            yield None, chunk({"reasoning_details": [ending]}), False
        else:
            yield None, chunk({"reasoning_details": [entry]}), False


def error_event(wire: str, fault: SimFault) -> Event:
    status = fault.status or 529
    message = fault.message or (
        "Overloaded" if status == 529 else f"Simulated error {status} mid-stream."
    )
    if wire == "anthropic":
        kind = ERROR_TYPES.get(status, "api_error")
        return (
            "error",
            {"type": "error", "error": {"type": kind, "message": message}},
            False,
        )
    choices = [{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}]
    return (
        None,
        {"error": {"code": status, "message": message}, "choices": choices},
        False,
    )


def encode(name: str | None, data: Any) -> bytes:
    text = (
        data
        if isinstance(data, str)
        else json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    )
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {text}\n\n".encode()


@dataclass(frozen=True)
class Pace:
    """When a streamed answer's pieces go out: at `tokens_per_s` (None: no pause), or spread over
    `generation_s` when it is above 0; every wait times `time_scale`; the body ends `end_delay_s`
    (real seconds) after the last event."""

    tokens_per_s: float | None = None
    generation_s: float = 0.0
    time_scale: float = 1.0
    end_delay_s: float = 0.0

    def rate(self, tokens: int) -> float | None:
        """Token pieces per real second for an answer of `tokens` pieces (None: no pause)."""
        if self.generation_s > 0:
            return max(tokens, 1) / (self.generation_s * self.time_scale)
        return None if not self.tokens_per_s else self.tokens_per_s / self.time_scale


async def paced(
    events: Iterator[Event], wire: str, pace: Pace, fault: SimFault | None, drop: Any
) -> AsyncIterator[bytes]:
    """The encoded events, each token piece at its time; `fault` served after `fault.after` pieces
    (`drop()` closes the connection)."""
    listed = list(events)
    tokens_per_s = pace.rate(sum(1 for _, _, token in listed if token))
    started = time.monotonic()
    sent = 0
    for name, data, token in listed:
        if token:
            if fault is not None and sent == fault.after:
                if fault.kind == "stream_drop":
                    drop()
                    return
                if fault.kind == "stream_error":
                    yield encode(*error_event(wire, fault)[:2])
                    return
                stall = fault.seconds * pace.time_scale
                await asyncio.sleep(stall)
                started += stall
                fault = None
            sent += 1
            if tokens_per_s:
                wait = started + sent / tokens_per_s - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
        yield encode(name, data)
    if pace.end_delay_s > 0:
        await asyncio.sleep(pace.end_delay_s)  # the body's end comes in a later segment
