"""A streamed Messages API answer (`"stream": true`), read event by event into the message the
non-streamed answer would have been, so `parse_message` maps both the same way.

Events (the SDK's `RawMessageStreamEvent`; its `accumulate_event` is what this follows):
    message_start        the message with empty `content` and the input usage
    content_block_start  a block at `index`: text (""), thinking ("", signature ""), redacted_thinking
                         (whole), tool_use (`input` {})
    content_block_delta  text_delta -> the block's text (and to `on_delta`); thinking_delta ->
                         its thinking (a thinking delta); signature_delta -> its signature;
                         input_json_delta -> the tool input's JSON text, parsed at the block's stop
                         (kept as text when it is not JSON: a cut call, or ToolArgumentsError);
                         citations_delta -> the block's citations
    content_block_stop   the block is complete
    message_delta        stop_reason, stop_sequence, stop_details; usage counts are cumulative:
                         output_tokens overwrites, the input and cache counts overwrite when given
    message_stop         the end (`done`)
    ping                 ignored
    error                `StreamFailure` with the status its type stands for (overloaded -> 529)

CPU: `feed` takes the bytes of one read; a run of text (thinking) deltas of one block is read with
one regex match, not event by event (`_RUNS`), and `flush` passes the read's text on as one
`DeltaEvent` (bench/stream_parse.py: ~0.5 µs an event).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, ClassVar

from toolloop.contract import OnDelta
from toolloop.errors import PromptGenError
from toolloop.fastjson import event_json, valid_text
from toolloop.providers.call import stream_failure
from toolloop.providers.cutcost import Partial
from toolloop.providers.sse import DeltaOut, SseParser

NON_STREAMING_MAX_TOKENS = 21_333
"""Above this `max_tokens` the answer is streamed even without `on_delta`: the SDK refuses a
non-streamed call that may take longer than 10 minutes (3600 s x max_tokens / 128,000 > 600 s)."""


def _run_of(kind: bytes, field: bytes) -> tuple[re.Pattern[bytes], re.Pattern[bytes]]:
    """A run of `kind` deltas of one block, each `event: content_block_delta` with the compact JSON
    Anthropic sends (its key order; a string with no escape, quote or control character), and
    the pattern of one delta's string in such a run."""
    head = rb'event: content_block_delta\ndata: \{"type":"content_block_delta","index":'
    tail = (
        rb',"delta":\{"type":"'
        + kind
        + rb'","'
        + field
        + rb'":"[^"\\\x00-\x1f]*"\}\}\n\n'
    )
    run = re.compile(head + rb"(\d+)" + tail + rb"(?:" + head + rb"\1" + tail + rb")*")
    return run, re.compile(rb'"' + field + rb'":"([^"\\\x00-\x1f]*)"\}\}\n\n')


_RUNS = (
    (*_run_of(b"text_delta", b"text"), "text", False),
    (*_run_of(b"thinking_delta", b"thinking"), "thinking", True),
)
"""The fast path of `MessageStream.feed`: such runs are read without a JSON parse; the strings
are the bytes between the quotes (what the JSON parse of that event gives)."""

_USAGE_OVERWRITTEN = (
    "input_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
    "server_tool_use",
    "output_tokens_details",
)


class MessageStream(DeltaOut):
    """The `StreamReader` of one streamed attempt (toolloop/providers/call.py)."""

    _handlers: ClassVar[dict[str, Callable[[MessageStream, dict[str, Any]], None]]]

    __slots__ = ("_done", "inputs", "message", "pieces", "sse")

    def __init__(self, on_delta: OnDelta | None) -> None:
        super().__init__(on_delta)
        self.sse = SseParser()
        self.message: dict[str, Any] | None = None
        self.inputs: dict[int, list[str]] = {}
        """The input_json_delta pieces of each tool_use block not yet stopped, by index."""
        self.pieces: dict[tuple[int, str], list[str]] = {}
        """The text / thinking pieces of each block not yet joined, by (index, field): joined at
        the block's stop (a str grown piece by piece would be copied whole at every piece)."""
        self._done = False

    @property
    def done(self) -> bool:
        return self._done

    def feed(self, chunk: bytes) -> None:
        """The events a read brought: runs of text (thinking) deltas of one block in one regex
        match each, without a JSON parse (`_RUNS`), every other event through `event`."""
        raw = self.sse.complete(chunk)
        if raw is None:
            for name, data in self.sse.feed(chunk):
                self.event(name, data)
            return
        at, end = 0, len(raw)
        while at < end:
            if self.message is not None and raw.startswith(
                b"event: content_block_delta\n", at
            ):
                ran = self._run(raw, at)
                if ran:
                    at = ran
                    continue
            stop = raw.index(b"\n\n", at) + 2
            for name, data in self.sse.events(raw[at:stop]):
                self.event(name, data)
            at = stop

    def _run(self, raw: bytes, at: int) -> int:
        """The end of the run of deltas of one block at `at`, read; 0 when there is none."""
        assert self.message is not None
        content = self.message["content"]
        for run, string, field, thinking in _RUNS:
            found = run.match(raw, at)
            if found is None:
                continue
            index = int(found[1])
            if index >= len(content) or content[index].get("type") != field:
                return 0
            parts = string.findall(raw, at, found.end())
            # each piece decoded alone unless ASCII, as one event's data is
            joined = b"".join(parts)
            text = (
                joined.decode()
                if joined.isascii()
                else "".join(_utf8(part) for part in parts)
            )
            self._piece({"index": index}, field, text, thinking=thinking)
            return found.end()
        return 0

    def event(self, name: str, data: str) -> None:
        if name == "ping":
            return
        if name == "error":
            self.flush()  # the text read before the error goes out, so its discard marker follows
            raise stream_failure(data)
        try:
            payload = event_json(data)
        except ValueError:
            raise _broken(f"an event that is not JSON ({data[:80]!r})") from None
        kind = payload.get("type") if isinstance(payload, dict) else None
        if kind == "content_block_delta" and self.message is not None:
            self._delta(payload)
            return
        if kind == "error":
            self.flush()
            raise stream_failure(data)
        if kind == "message_start":
            message = payload.get("message")
            if not isinstance(message, dict):
                raise _broken("a message_start without a message")
            self.message = {**message, "content": list(message.get("content") or [])}
            return
        if self.message is None:
            raise _broken(f"{kind!r} before message_start")
        handle = self._handlers.get(str(kind))
        if handle is not None:  # other (newer) event types are skipped, as the SDK does
            handle(self, payload)

    def result(self) -> Any:
        """The message (every string in it came through `event_json`: no lone surrogate)."""
        assert self.message is not None
        return self.message

    def partial(self) -> Partial | None:
        """What this attempt received, for the cost of a cut (toolloop/providers/cutcost.py): the
        usage of message_start (merged with any message_delta) and the text, thinking and tool
        input of every block, joined or still in pieces; None before message_start."""
        if self.message is None:
            return None
        texts: list[str] = []
        for block in self.message["content"]:
            texts += [
                block[field]
                for field in ("text", "thinking")
                if isinstance(block.get(field), str)
            ]
            value = block.get("input") if block.get("type") == "tool_use" else None
            if (
                value
            ):  # a stopped block's input (parsed, or its text when it was not JSON)
                texts.append(value if isinstance(value, str) else _compact(value))
        texts += [
            "".join(parts) for parts in (*self.pieces.values(), *self.inputs.values())
        ]
        usage = self.message.get("usage")
        return Partial(usage if isinstance(usage, dict) else None, "".join(texts))

    def _block(self, payload: dict[str, Any]) -> dict[str, Any]:
        assert self.message is not None
        index = payload.get("index")
        content = self.message["content"]
        if not isinstance(index, int) or not 0 <= index < len(content):
            raise _broken(
                f"a {payload.get('type')} for block {index!r}, of {len(content)}"
            )
        block: dict[str, Any] = content[index]
        return block

    def _start(self, payload: dict[str, Any]) -> None:
        assert self.message is not None
        block = payload.get("content_block")
        if not isinstance(block, dict):
            raise _broken("a content_block_start without a block")
        self.message["content"].append(dict(block))

    def _delta(self, payload: dict[str, Any]) -> None:
        block = self._block(payload)
        raw = payload.get("delta")
        delta: dict[str, Any] = raw if isinstance(raw, dict) else {}
        kind = delta.get("type")
        if kind == "text_delta" and block.get("type") == "text":
            self._piece(payload, "text", delta["text"], thinking=False)
        elif kind == "thinking_delta" and block.get("type") == "thinking":
            self._piece(payload, "thinking", delta["thinking"], thinking=True)
        elif kind == "signature_delta" and block.get("type") in (
            "thinking",
            "compaction",
        ):
            block["signature"] = delta["signature"]
        elif kind == "input_json_delta":
            self.inputs.setdefault(int(payload["index"]), []).append(
                str(delta.get("partial_json", ""))
            )
        elif kind == "citations_delta" and block.get("type") == "text":
            block.setdefault("citations", []).append(delta.get("citation"))
        elif kind == "compaction_delta" and block.get("type") == "compaction":
            # the SDK's BetaCompactionContentBlockDelta: the summary and its opaque metadata, whole
            for field in ("content", "encrypted_content"):
                if isinstance(delta.get(field), str):
                    block[field] = delta[field]

    def _piece(
        self, payload: dict[str, Any], field: str, text: Any, *, thinking: bool
    ) -> None:
        if not isinstance(text, str):
            return
        self.pieces.setdefault((payload["index"], field), []).append(text)
        self.emit(text, thinking=thinking)

    def _stop(self, index: Any) -> None:
        """A block complete: its text pieces joined; a tool_use block's input from its JSON text,
        parsed, or the text itself when it is not JSON (parse_message then treats it as a cut call
        or raises ToolArgumentsError)."""
        if not isinstance(index, int):
            return
        block = self._block({"type": "content_block_stop", "index": index})
        for field in ("text", "thinking"):
            parts = self.pieces.pop((index, field), None)
            if parts is not None:
                block[field] = str(block.get(field, "")) + "".join(parts)
        pieces = self.inputs.pop(index, None)
        raw = "".join(pieces) if pieces is not None else ""
        if not raw.strip():
            return
        try:
            block["input"] = valid_text(json.loads(raw))
        except ValueError:
            block["input"] = raw

    def _block_stop(self, payload: dict[str, Any]) -> None:
        self._stop(payload.get("index"))

    def _message_stop(self, payload: dict[str, Any]) -> None:
        self.flush()
        for index in {*self.inputs, *(index for index, _ in self.pieces)}:
            self._stop(index)
        self._done = True

    def _message_delta(self, payload: dict[str, Any]) -> None:
        assert self.message is not None
        delta = payload.get("delta")
        if isinstance(delta, dict):
            for key in ("stop_reason", "stop_sequence", "stop_details"):
                if key in delta:
                    self.message[key] = delta[key]
            if delta.get("container") is not None:
                self.message["container"] = delta["container"]
        usage = payload.get("usage")
        if isinstance(usage, dict):
            merged = dict(self.message.get("usage") or {})
            if "output_tokens" in usage:
                merged["output_tokens"] = usage["output_tokens"]
            for key in _USAGE_OVERWRITTEN:
                if usage.get(key) is not None:
                    merged[key] = usage[key]
            self.message["usage"] = merged


MessageStream._handlers = {
    "content_block_start": MessageStream._start,
    "content_block_delta": MessageStream._delta,
    "content_block_stop": MessageStream._block_stop,
    "message_delta": MessageStream._message_delta,
    "message_stop": MessageStream._message_stop,
}


def _compact(value: Any) -> str:
    """The compact JSON text of a tool input, as the stream sent it."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _utf8(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _broken(what: str) -> PromptGenError:
    return PromptGenError(
        f"anthropic sent a stream that cannot be read: {what}.\n"
        "  Check the base URL points at the Messages API; try again or use another prompt-gen provider.",
        status=502,
        retryable=True,
    )
